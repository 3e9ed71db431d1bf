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
import itertools
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


@pytest.mark.parametrize("rt_name", ["simpy", "asyncio"])
def test_the_retries_back_off_to_a_bound_and_report_each_failure(rt_name: str) -> None:
    """On both runtimes: retries after 0.1, 0.2, 0.4, ... s, never more than REWRITE_MAX_S apart,
    a StoreWriteFailed for each that fails, and the outcome in the store once writes work again."""
    from aiqsim import MemoryStore, Scheduler
    from aiqsim.scheduler.events import TaskTransition
    from aiqsim.scheduler.outcomes import REWRITE_FIRST_S
    from tests.failing_stores import FailingWrites
    from tests.fakes import ScriptedProvider
    from tests.runtimes import ASYNCIO_LATENESS_S, run_on

    outage_s = 10.0

    async def body(rt: Any) -> tuple[list[float], Any, list[Any], Any]:
        store = FailingWrites(MemoryStore(), fail_from=3)  # insert, running; then the outcome fails
        events: list[Any] = []
        scheduler = Scheduler(
            rt, [ScriptedProvider(rt, "llm", latency_s=1.0)], store=store, events=events.append
        )
        submission = scheduler.submit("llm", {"input": "x"})
        with pytest.raises(Exception, match="store write failed"):
            await submission.wait()
        lost_at = rt.now()
        await rt.sleep(outage_s)
        store.heal()
        await rt.sleep(REWRITE_MAX_S + 1.0)
        failures = [e.time - lost_at for e in events if isinstance(e, StoreWriteFailed)]
        written = [e for e in events if isinstance(e, TaskTransition) and e.new == "succeeded"]
        stored = store.get(submission.id)
        await scheduler.close()
        return failures, stored, written, scheduler.store_write_failures

    failures, stored, written, lost = run_on(rt_name, body)
    gaps = [b - a for a, b in itertools.pairwise(failures)]
    assert len(failures) >= 2 and gaps[0] >= REWRITE_FIRST_S  # the loss, then a retry that failed
    if rt_name == "simpy":  # exact on the virtual clock: 0.1, 0.2, 0.4, 0.8, 1.6, then 2 s apart
        assert failures[0] == 0.0
        assert gaps == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6] + [2.0] * (len(gaps) - 5))
        assert len(failures) >= 1 + 5 + 3  # each failed retry reported, not only the loss
    else:  # timers fire late on a loaded machine, never early: bounded by that lateness
        assert max(gaps) <= REWRITE_MAX_S + ASYNCIO_LATENESS_S
    assert stored.status is TaskStatus.SUCCEEDED  # written once the store took writes again
    assert [(e.old, e.new) for e in written] == [("running", "succeeded")]
    assert lost == 1  # one submission lost its outcome: the retries are not counted as more losses
