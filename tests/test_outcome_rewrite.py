"""A call's final write lost to a PostgreSQL outage is written again once the store is back.

Before: the task stayed ``running`` in the store for as long as its worker lived (its lease renewed,
so nobody adopted it), and a duplicate of its key submitted in another worker waited on it for ever.
Now the scheduler writes the lost outcome again, with a bounded backoff and a ``StoreWriteFailed``
event for each try that fails, until the store takes it.

Two outages, both real: a TCP link to the shared server that the test cuts (every connection
closed, new ones refused, as a server restart looks to a client) and restores, for the worker alone;
and a throwaway PostgreSQL cluster of the test's own, stopped and started again under both workers.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path
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


class OwnCluster:
    """A throwaway PostgreSQL cluster on a free loopback port that a test may stop and start again
    (as ``tests/servers.py`` starts one, trust auth, database ``aiqsim``): the shared server of the
    other tests is never stopped."""

    def __init__(self, root: Path) -> None:
        from tests.servers import ServerUnavailable, _pg_tool, free_port

        initdb, pg_ctl = _pg_tool("initdb"), _pg_tool("pg_ctl")
        if initdb is None or pg_ctl is None:
            raise ServerUnavailable("PostgreSQL's initdb/pg_ctl are not installed")
        self.prefix: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            runuser = shutil.which("runuser")
            if runuser is None:
                raise ServerUnavailable("running as root, and no runuser to start PostgreSQL as 'postgres'")
            self.prefix = [runuser, "-u", "postgres", "--"]
            shutil.chown(root, "postgres")
        self.pg_ctl = pg_ctl
        self.data = root / "data"
        self.port = free_port()
        self.log = root / "server.log"
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/aiqsim"
        subprocess.run(
            [*self.prefix, initdb, "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        self.start()
        createdb = _pg_tool("createdb") or "createdb"
        subprocess.run(
            [*self.prefix, createdb, "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "aiqsim"],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c fsync=off"
        subprocess.run(
            [
                *self.prefix,
                self.pg_ctl,
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-o",
                options,
                "-w",
                "start",
            ],
            check=True,
            capture_output=True,
            timeout=90,
        )

    def stop(self) -> None:
        """A fast shutdown: every connection is ended, as at a database restart."""
        subprocess.run(
            [*self.prefix, self.pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "stop"],
            check=True,
            capture_output=True,
            timeout=90,
        )


@pytest.fixture
def own_cluster() -> Any:
    from tests.servers import ServerUnavailable, in_ci

    root = Path(tempfile.mkdtemp(prefix="aiqsim-pg-"))  # not pytest's tmp_path: 'postgres' must reach it
    try:
        try:
            cluster = OwnCluster(root)
        except (ServerUnavailable, subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
            detail = getattr(error, "stderr", b"") or b""
            message = f"no throwaway PostgreSQL cluster here: {error} {detail.decode(errors='replace')}"
            if in_ci():
                pytest.fail(message)
            pytest.skip(message)
        yield cluster
        subprocess.run(
            [*cluster.prefix, cluster.pg_ctl, "-D", str(cluster.data), "-m", "immediate", "-w", "stop"],
            capture_output=True,
            timeout=60,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_final_write_lost_to_a_database_restart_is_written_when_it_is_back(own_cluster: Any) -> None:
    """The database itself stops (both workers lose it) while the call is at the provider, and
    starts again some seconds later: the outcome reaches the store and the other worker's duplicate
    learns it, within a bound of the database's return."""
    from aiqsim.runtime import AsyncioRuntime
    from aiqsim.scheduler import Scheduler
    from aiqsim.stores.postgres import PostgresStore
    from tests.fakes import ScriptedProvider

    async def body(store: Any, other_store: Any) -> dict[str, Any]:
        runtime = AsyncioRuntime()
        events: list[Any] = []
        provider = AnswersWhenTold()
        worker = Scheduler(runtime, [provider], store=store, worker_id="w1", events=events.append)
        other_provider = ScriptedProvider(runtime, "llm")
        other = Scheduler(runtime, [other_provider], store=other_store, worker_id="w2", duplicate_poll_s=0.1)
        owner = worker.submit("llm", {"input": "x"}, key="k")
        while provider.gate is None:
            await asyncio.sleep(0.01)
        duplicate = other.submit("llm", {"input": "x"}, key="k")
        own_cluster.stop()  # the database goes down while the call is at the provider ...
        provider.gate.set_result(None)  # ... and the answer comes: its final write fails
        with pytest.raises(Exception, match="store write failed"):
            await runtime.wait_for(owner.wait(), 30)
        await asyncio.sleep(3 * REWRITE_MAX_S)
        failed_tries = sum(isinstance(e, StoreWriteFailed) for e in events)
        own_cluster.start()
        back = runtime.now()
        record = await runtime.wait_for(duplicate.wait(), DUPLICATE_BOUND_S)
        waited_s = runtime.now() - back
        await other.close()
        await worker.close()
        return {"failed_tries": failed_tries, "duplicate": record, "waited_s": waited_s, "owner": owner.id}

    with (
        PostgresStore(own_cluster.dsn, connect_timeout_s=2) as store,
        PostgresStore(own_cluster.dsn, connect_timeout_s=2) as other_store,
    ):
        seen = asyncio.run(body(store, other_store))
        stored = other_store.get(seen["owner"])
    assert seen["failed_tries"] >= 3, seen
    assert (stored.status, stored.result) == (TaskStatus.SUCCEEDED, {"answer": "x"})
    assert (seen["duplicate"].status, seen["duplicate"].deduped_from) == (TaskStatus.DEDUPED, stored.id)
    print(f"duplicate returned {seen['waited_s']:.2f} s after the database came back")


@pytest.mark.parametrize("rt_name", ["simpy", "asyncio"])
def test_a_rewriter_started_while_the_cancelled_one_winds_down_is_not_forgotten(rt_name: str) -> None:
    """The interleaving, step by step in one instant: the close's last try cancels the rewriter (it
    ends only at its next step), a queued task's cancellation loses its outcome and starts a new
    rewriter, then the old one's ``finally`` ran and forgot the new one. Forgotten, the new one was
    never cancelled by the close: it went on retrying (and reporting) after the scheduler closed."""
    from aiqsim import MemoryStore, Scheduler
    from tests.failing_stores import FailingWrites
    from tests.fakes import ScriptedProvider
    from tests.runtimes import run_on

    async def body(rt: Any) -> tuple[bool, bool, list[float], float]:
        store = FailingWrites(MemoryStore(), fail_at={3})  # insert, running; then the outcome fails
        events: list[Any] = []
        scheduler = Scheduler(
            rt, [ScriptedProvider(rt, "llm", latency_s=1.0)], store=store, events=events.append
        )
        with pytest.raises(Exception, match="store write failed"):
            await scheduler.submit("llm", {"input": "a"}).wait()  # its outcome is lost: a rewriter starts
        first = scheduler._rewriter
        queued = scheduler.submit("llm", {"input": "b"})  # not dispatched before this instant ends
        store.fail_from = store.writes + 1  # from now on every write fails
        await scheduler._last_rewrite()  # what close() does: cancels the rewriter, one last try
        scheduler.cancel(queued.id)  # its outcome is lost too: a second rewriter starts
        second = scheduler._rewriter
        await rt.sleep(0.01)  # the first ends (cancelled) and runs its finally
        kept = scheduler._rewriter is second and second is not first
        await scheduler.close()
        closed_at = rt.now()
        await rt.sleep(3 * REWRITE_MAX_S)
        reports = [e.time - closed_at for e in events if isinstance(e, StoreWriteFailed)]
        return kept, second.done(), reports, closed_at

    kept, stopped, reports, _ = run_on(rt_name, body)
    assert kept
    assert stopped  # the close cancelled it
    assert not [t for t in reports if t > 0]  # nothing retried (nor reported) after the close
