"""Starting a fleet worker: ``LeaseKeeper.recover_and_start`` leaves no moment for an adoption.

A worker restarted under its id while its previous process's lease has expired: if it recovers
its tasks *before* taking its lease, another worker can adopt that expired lease at any ``await``
in between, and both run the recovered tasks (a call billed twice). ``recover_and_start`` takes the
lease first (no ``await`` between the two) and beats while recovery runs. Real PostgreSQL; the
other worker's adoption is made to happen exactly at the hazardous moment.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import Any

import pytest

from aiqsim.core.states import transition
from aiqsim.core.task import TaskRecord, TaskStatus
from aiqsim.scheduler.provider import ProviderResponse


@pytest.fixture
def schema(postgres_dsn: str) -> Any:
    import psycopg

    name = f"start_{random.Random().getrandbits(40):010x}"
    yield name
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


class Billing:
    """A provider that bills every call it is sent (no idempotency), and looks keys up."""

    name = "llm"

    def __init__(self, bills: Counter[str], release: asyncio.Event) -> None:
        self.bills = bills
        self.release = release
        self.lookups_blocked: asyncio.Event | None = None
        self.lookups_started = asyncio.Event()

    async def call(self, request: Any) -> ProviderResponse:
        self.bills[request.idempotency_key] += 1
        await self.release.wait()
        return ProviderResponse(result="done")

    async def lookup(self, key: str) -> ProviderResponse | None:
        self.lookups_started.set()
        if self.lookups_blocked is not None:
            await self.lookups_blocked.wait()
        return None  # nothing finished for the key (a call may still be in flight)


def _a_dead_worker(store: Any) -> None:
    """Worker "a" died with a task queued and one running; its lease has expired."""
    store.insert_and_claim(TaskRecord(id="queued", key="k-queued", kind="llm", provider="llm", worker="a"))
    running = TaskRecord(id="running", key="k-running", kind="llm", provider="llm", worker="a")
    store.insert_and_claim(running)
    store.update(transition(running, TaskStatus.RUNNING, 0.0))
    assert store.acquire_lease("a", 0.2)
    time.sleep(0.4)


async def _restart_a_while_b_adopts(store: Any, peer: Any, *, new_way: bool) -> tuple[Counter[str], Any]:
    from aiqsim.fleet import LeaseKeeper
    from aiqsim.runtime import AsyncioRuntime
    from aiqsim.scheduler import Scheduler

    runtime = AsyncioRuntime()
    bills: Counter[str] = Counter()
    release = asyncio.Event()
    a = Scheduler(runtime, [Billing(bills, release)], store=store, worker_id="a")
    b = Scheduler(runtime, [Billing(bills, release)], store=peer, worker_id="b")
    a_keeper = LeaseKeeper(a, ttl_s=30.0, requeue_interrupted=True)
    b_keeper = LeaseKeeper(b, ttl_s=30.0, requeue_interrupted=True)
    if new_way:
        await a_keeper.recover_and_start()
    else:
        await a.recover(requeue_interrupted=True)
    while sum(bills.values()) < 2:  # a has sent both of its tasks (they are in flight) ...
        await asyncio.sleep(0.01)
    adopted = await b_keeper.adopt()  # ... and b looks for expired leases: the await in between
    if not new_way:
        a_keeper.start()  # the old order: the lease only now (b's adoption is finished: it may)
    release.set()
    await runtime.wait_for(a.join(), 30)
    await runtime.wait_for(b.join(), 30)
    await a_keeper.stop()
    await a.close()
    await b.close()
    return bills, adopted


def test_recovering_before_taking_the_lease_lets_another_worker_run_the_same_tasks(
    postgres_dsn: str, schema: str
) -> None:
    """The hazard the new call removes, shown with the old calls in the old order."""
    from aiqsim.stores.postgres import PostgresStore

    with (
        PostgresStore(postgres_dsn, schema=schema) as store,
        PostgresStore(postgres_dsn, schema=schema) as peer,
    ):
        _a_dead_worker(store)
        bills, adopted = asyncio.run(_restart_a_while_b_adopts(store, peer, new_way=False))
    assert [adoption.worker for adoption in adopted] == ["a"]  # b adopted a's lease meanwhile ...
    assert bills == {"k-queued": 2, "k-running": 2}  # ... and both ran a's tasks: billed twice


def test_recover_and_start_leaves_no_moment_for_an_adoption(postgres_dsn: str, schema: str) -> None:
    from aiqsim.stores.postgres import PostgresStore

    with (
        PostgresStore(postgres_dsn, schema=schema) as store,
        PostgresStore(postgres_dsn, schema=schema) as peer,
    ):
        _a_dead_worker(store)
        bills, adopted = asyncio.run(_restart_a_while_b_adopts(store, peer, new_way=True))
        records = {r.id: r for r in peer.list_by_status()}
    assert adopted == []  # a's lease was taken before anything was recovered: not adoptable
    assert bills == {"k-queued": 1, "k-running": 1}
    assert {(r.status, r.worker) for r in records.values()} == {(TaskStatus.SUCCEEDED, "a")}


def test_no_adoption_is_possible_while_recover_and_start_recovers(postgres_dsn: str, schema: str) -> None:
    """Inside recovery too (its lookups may take long): the lease is held and beaten meanwhile."""
    from aiqsim.fleet import LeaseKeeper
    from aiqsim.runtime import AsyncioRuntime
    from aiqsim.scheduler import Scheduler
    from aiqsim.stores.postgres import PostgresStore

    async def body(store: Any, peer: Any) -> tuple[list[Any], dict[str, Any], Counter[str]]:
        runtime = AsyncioRuntime()
        bills: Counter[str] = Counter()
        release = asyncio.Event()
        release.set()
        provider = Billing(bills, release)
        provider.lookups_blocked = asyncio.Event()
        a = Scheduler(runtime, [provider], store=store, worker_id="a")
        b = Scheduler(runtime, [Billing(bills, release)], store=peer, worker_id="b")
        a_keeper = LeaseKeeper(a, ttl_s=0.6, renew_every_s=0.1, requeue_interrupted=True)
        starting = asyncio.ensure_future(a_keeper.recover_and_start())
        await provider.lookups_started.wait()
        await asyncio.sleep(1.0)  # recovery waits on its lookup longer than a's lease lasts ...
        adopted = await LeaseKeeper(b, ttl_s=30.0).adopt()  # ... yet it cannot be adopted
        leases = peer.leases()
        provider.lookups_blocked.set()
        report = await runtime.wait_for(starting, 30)
        await runtime.wait_for(a.join(), 30)
        await a_keeper.stop()
        await a.close()
        await b.close()
        assert report.orphans_requeued == 1 and report.queued_resumed == 1
        return adopted, leases, bills

    with (
        PostgresStore(postgres_dsn, schema=schema) as store,
        PostgresStore(postgres_dsn, schema=schema) as peer,
    ):
        _a_dead_worker(store)
        adopted, leases, bills = asyncio.run(body(store, peer))
    assert adopted == [] and leases["a"][1] is None and leases["a"][0] > 0
    assert bills == {"k-queued": 1, "k-running": 1}


def test_recover_and_start_refuses_while_another_worker_is_taking_over(
    postgres_dsn: str, schema: str
) -> None:
    from aiqsim.fleet import LeaseKeeper, LeaseLostError
    from aiqsim.runtime import AsyncioRuntime
    from aiqsim.scheduler import Scheduler
    from aiqsim.stores.postgres import PostgresStore

    async def body(store: Any) -> Counter[str]:
        runtime = AsyncioRuntime()
        bills: Counter[str] = Counter()
        a = Scheduler(runtime, [Billing(bills, asyncio.Event())], store=store, worker_id="a")
        with pytest.raises(LeaseLostError):
            await LeaseKeeper(a, ttl_s=30.0).recover_and_start()
        await a.close()
        return bills

    with (
        PostgresStore(postgres_dsn, schema=schema) as store,
        PostgresStore(postgres_dsn, schema=schema) as peer,
    ):
        _a_dead_worker(store)
        assert peer.adopt_expired("b") == ["a"]  # b's takeover is under way
        bills = asyncio.run(body(store))
        records = {r.id: r for r in peer.list_by_status()}
    assert bills == Counter()  # nothing recovered, nothing sent
    assert {(r.status, r.worker) for r in records.values()} == {
        (TaskStatus.QUEUED, "a"),
        (TaskStatus.RUNNING, "a"),
    }
