"""A call's final write lost to a PostgreSQL outage is written again once the store is back.

Before: the task stayed ``running`` in the store for as long as its worker lived (its lease renewed,
so nobody adopted it), and a duplicate of its key submitted in another worker waited on it for ever.
Now the scheduler writes the lost outcome again, with a bounded backoff and a ``StoreWriteFailed``
event for each try that fails, until the store takes it.

The outage is real: the worker reaches PostgreSQL through a TCP link the test cuts (every
connection closed, new ones refused, as a server restart looks to a client) and restores; the other
worker and the test's own reads go to the server directly, so the shared server is never stopped.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from aiqsim.core.task import TaskStatus
from aiqsim.scheduler.events import StoreWriteFailed
from aiqsim.scheduler.outcomes import REWRITE_MAX_S
from aiqsim.scheduler.provider import ProviderResponse
from tests.test_postgres_store import _link_to, _store_behind_a_link

DUPLICATE_BOUND_S = 30.0
"""How long after the store's return the duplicate may take: REWRITE_MAX_S (2 s) plus a poll (0.1 s)
is the design; the rest is room for a loaded 2-core machine (a hang, the failure this rules out, is
for ever)."""


@pytest.fixture
def schema(postgres_dsn: str) -> Any:
    import psycopg

    name = f"rewrite_{random.Random().getrandbits(40):010x}"
    yield name
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


class AnswersWhenTold:
    """Answers a call only when the test opens the gate (after cutting the worker's store link)."""

    name = "llm"

    def __init__(self) -> None:
        self.gate: asyncio.Future[None] | None = None
        self.calls = 0

    async def call(self, request: Any) -> ProviderResponse:
        self.calls += 1
        self.gate = asyncio.get_running_loop().create_future()
        await self.gate
        return ProviderResponse(result={"answer": request.payload["input"]})


def test_a_final_write_lost_to_an_outage_is_written_when_the_store_returns(
    postgres_dsn: str, schema: str
) -> None:
    from aiqsim.runtime import AsyncioRuntime
    from aiqsim.scheduler import Scheduler
    from aiqsim.stores.postgres import PostgresStore
    from tests.fakes import ScriptedProvider

    async def body(store: Any, link: Any, direct: Any) -> dict[str, Any]:
        runtime = AsyncioRuntime()
        events: list[Any] = []
        provider = AnswersWhenTold()
        worker = Scheduler(runtime, [provider], store=store, worker_id="w1", events=events.append)
        other_provider = ScriptedProvider(runtime, "llm")
        other = Scheduler(runtime, [other_provider], store=direct, worker_id="w2", duplicate_poll_s=0.1)
        owner = worker.submit("llm", {"input": "x"}, key="k")
        while provider.gate is None:
            await asyncio.sleep(0.01)
        duplicate = other.submit("llm", {"input": "x"}, key="k")  # waits on w1's running task
        link.cut()  # PostgreSQL goes away while the call is at the provider ...
        provider.gate.set_result(None)  # ... and the answer comes: its final write fails
        with pytest.raises(Exception, match="store write failed"):
            await runtime.wait_for(owner.wait(), 30)
        await asyncio.sleep(3 * REWRITE_MAX_S)  # the outage lasts: the write is tried, and fails, again
        during = direct.get(owner.id).status
        failed_tries = sum(isinstance(e, StoreWriteFailed) for e in events)
        link.restore()
        back = runtime.now()
        record = await runtime.wait_for(duplicate.wait(), DUPLICATE_BOUND_S)
        waited_s = runtime.now() - back
        await other.close()
        await worker.close()
        return {
            "during": during,
            "failed_tries": failed_tries,
            "stored": direct.get(owner.id),
            "duplicate": record,
            "waited_s": waited_s,
            "other_calls": len(other_provider.calls),
        }

    with (
        _link_to(postgres_dsn) as link,
        _store_behind_a_link(postgres_dsn, schema, link) as store,
        PostgresStore(postgres_dsn, schema=schema) as direct,
    ):
        seen = asyncio.run(body(store, link, direct))
    assert seen["during"] is TaskStatus.RUNNING  # the outage really held the write back
    assert seen["failed_tries"] >= 3, seen  # the first loss, then each retry that failed, reported
    stored = seen["stored"]
    assert (stored.status, stored.result) == (TaskStatus.SUCCEEDED, {"answer": "x"})
    duplicate = seen["duplicate"]
    assert (duplicate.status, duplicate.deduped_from) == (TaskStatus.DEDUPED, stored.id)
    assert seen["other_calls"] == 0  # never sent twice
    print(f"duplicate returned {seen['waited_s']:.2f} s after the store came back")
