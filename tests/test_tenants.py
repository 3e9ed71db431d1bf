"""Tenants: weighted fair sharing of a lane, per-tenant depth limits, the tenant kept with the task."""

from __future__ import annotations

import math
import random

import pytest

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.token_bucket import QuotaLimits
from aiqsim.runtime import SimPyRuntime
from aiqsim.scheduler import (
    AgingShortestJobFirstPolicy,
    QueueFullError,
    Scheduler,
    ShortestJobFirstPolicy,
    Tenant,
)
from aiqsim.scheduler.dispatch import FifoPolicy, QueueItem
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse
from aiqsim.scheduler.tenants import TenantQueue
from aiqsim.stores.memory import MemoryStore
from aiqsim.validation.fairness import isolation_check, measure_quiet_wait, measure_shares, share_check
from tests.runtimes import RUNTIMES, run_on


class Recorder:
    """Serves each call in ``service_s`` and notes (tenant, payload) in call order."""

    name = "llm"

    def __init__(self, runtime, service_s: float = 1.0) -> None:
        self.runtime = runtime
        self.service_s = service_s
        self.calls: list[tuple[str | None, object]] = []

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        self.calls.append((request.tenant, request.payload))
        await self.runtime.sleep(self.service_s)
        return ProviderResponse(result=request.payload)


# ------------------------------------------------------------------ the theory


@pytest.mark.parametrize("rt_name", RUNTIMES)
def test_two_backlogged_tenants_of_weights_1_to_3_get_25_and_75_percent(rt_name: str) -> None:
    result = run_on(rt_name, lambda rt: measure_shares(rt, {"light": 1.0, "heavy": 3.0}))
    assert result.expected == {"light": 0.25, "heavy": 0.75}
    assert result.worst_error < 0.02, result.measured


def test_shares_follow_weights_for_three_tenants_on_the_virtual_clock() -> None:
    result = share_check((1.0, 2.0, 5.0), window=800)
    assert result.worst_error < 0.02, result.measured


def test_a_noisy_tenant_at_10x_its_share_does_not_raise_the_quiet_tenants_wait() -> None:
    result = isolation_check()
    # fair: the quiet tenant waits at most for the next slot to free (one service time, 1 s),
    # whatever the noisy tenant offers
    assert result.fair_at_share < 1.0 and result.fair_at_10x < 1.0
    # first come, first served: it waits behind the noisy backlog, which grows without bound
    assert result.fifo_at_10x > 50 * result.fair_at_10x
    assert result.fifo_at_share < 1.0


@pytest.mark.parametrize("rt_name", RUNTIMES)
def test_isolation_holds_on_both_runtimes(rt_name: str) -> None:
    async def body(rt):
        fair = await measure_quiet_wait(rt, fair=True, noisy_load=10.0, duration_s=60.0)
        fifo = await measure_quiet_wait(rt, fair=False, noisy_load=10.0, duration_s=60.0)
        return fair, fifo

    fair, fifo = run_on(rt_name, body)
    assert fair < 1.5  # one service time, plus room for asyncio's timer lateness at 10 ms a second
    assert fifo > 10 * fair


# ------------------------------------------------------------------ the rule in the queue


def item(seq: int, tenant: str | None, cost: float = 1.0) -> QueueItem:
    return QueueItem(f"t{seq}", cost, 0.0, seq, tenant=tenant)


def drain(queue: TenantQueue) -> list[str]:
    taken = []
    while (head := queue.peek(0.0)) is not None:
        queue.pop(head)
        taken.append(head.task_id)
    return taken


def test_the_policy_order_holds_within_a_tenant_and_weights_between_them() -> None:
    queue = TenantQueue(ShortestJobFirstPolicy(), {"a": Tenant(weight=1), "b": Tenant(weight=2)})
    for seq, (tenant, cost) in enumerate([("a", 5), ("a", 1), ("b", 3), ("b", 2), ("b", 1), ("b", 4)]):
        queue.push(item(seq, tenant, cost))
    assert len(queue) == 6 and queue.queued("b") == 4
    expected = list(item.task_id for item in queue.ordered(0.0))
    # a's cheapest first (SJF within a), b twice as often as a (each call charged max(cost, 1))
    assert drain(queue) == expected
    assert expected == ["t1", "t4", "t3", "t0", "t2", "t5"]


def test_a_tenant_that_was_idle_rejoins_at_the_virtual_time_without_credit() -> None:
    queue = TenantQueue(FifoPolicy(), {"noisy": Tenant(), "quiet": Tenant()})
    for seq in range(10):
        queue.push(item(seq, "noisy"))
    for _ in range(6):
        queue.pop(queue.peek(0.0))
    for seq in range(10, 13):
        queue.push(item(seq, "quiet"))
    # quiet was idle for six calls: it goes next, then the two alternate (no burst of three)
    assert drain(queue)[:6] == ["t10", "t6", "t11", "t7", "t12", "t8"]


def test_aging_within_a_tenant_is_seen_through_the_tenant_queue() -> None:
    queue = TenantQueue(AgingShortestJobFirstPolicy(max_wait_s=5.0), {"a": Tenant(), "b": Tenant()})
    queue.push(item(1, "a", cost=50.0))
    queue.push(item(2, "a", cost=1.0))
    assert queue.peek(0.0).task_id == "t2" and queue.next_change(0.0) == 5.0
    assert queue.peek(5.0).task_id == "t1"  # overdue: the oldest goes first within its tenant


def test_a_tenant_whose_last_item_was_taken_out_rejoins_without_credit_later() -> None:
    queue = TenantQueue(FifoPolicy(), {"noisy": Tenant(), "quiet": Tenant()})
    for seq in range(10):
        queue.push(item(seq, "noisy"))
    early = item(100, "quiet")
    queue.push(early)
    queue.pop(queue.peek(0.0))  # noisy's first (equal passes: the order given)
    queue.pop(early)  # quiet's only task is cancelled
    for _ in range(5):
        queue.pop(queue.peek(0.0))
    for seq in range(101, 104):
        queue.push(item(seq, "quiet"))
    # quiet rejoins at the virtual time, not at the pass it had when its item was cancelled
    assert drain(queue)[:6] == ["t101", "t6", "t102", "t7", "t103", "t8"]


def test_a_task_of_an_unknown_tenant_is_queued_as_the_default_tenants() -> None:
    queue = TenantQueue(FifoPolicy(), {"a": Tenant()})
    queue.push(item(1, "gone"))
    queue.push(item(2, None))
    assert queue.queued(None) == 2 and drain(queue) == ["t1", "t2"]


def test_cancelling_a_queued_item_removes_it_without_a_trace() -> None:
    queue = TenantQueue(FifoPolicy(), {"a": Tenant(), "b": Tenant()})
    items = [item(seq, "ab"[seq % 2]) for seq in range(4)]
    for one in items:
        queue.push(one)
    queue.pop(items[2])  # not the head: cancelled
    assert len(queue) == 3 and drain(queue) == ["t0", "t1", "t3"]


# ------------------------------------------------------------------ the scheduler


def test_the_depth_limits_trial_dispatch_puts_the_request_in_its_tenants_place() -> None:
    async def body(rt):
        provider = Recorder(rt)
        scheduler = Scheduler(
            rt,
            [provider],
            quotas={"llm": QuotaLimits(concurrency=2)},
            tenants={"a": Tenant(), "b": Tenant(), "c": Tenant()},
            interactive_limit=0,  # start at once or be refused
        )
        async with scheduler:
            handles = [scheduler.submit("llm", n, priority="interactive", tenant="b") for n in range(2)]
            # b's two fill both slots; an a request goes before b's second (a's pass equals b's,
            # a comes first): accepted, and b's second waits (an accepted request can be overtaken)
            handles.append(scheduler.submit("llm", 2, priority="interactive", tenant="a"))
            # c's place is after a's and b's first: nothing of it would start now, refused
            with pytest.raises(QueueFullError):
                scheduler.submit("llm", 3, priority="interactive", tenant="c")
            for handle in handles:
                await handle
        return provider.calls

    assert run_on("simpy", body) == [("a", 2), ("b", 0), ("b", 1)]


@pytest.mark.parametrize("rt_name", RUNTIMES)
def test_the_scheduler_alternates_weighted_tenants_and_sends_the_tenant(rt_name: str) -> None:
    async def body(rt):
        provider = Recorder(rt)
        scheduler = Scheduler(
            rt,
            [provider],
            quotas={"llm": QuotaLimits(concurrency=1)},
            tenants={"a": Tenant(weight=1), "b": Tenant(weight=2)},
        )
        handles = [scheduler.submit("llm", f"a{n}", tenant="a") for n in range(4)]
        handles += [scheduler.submit("llm", f"b{n}", tenant="b") for n in range(8)]
        async with scheduler:
            for handle in handles:
                await handle
        return provider.calls, [scheduler.store.get(h.id).tenant for h in handles]

    calls, stored = run_on(rt_name, body)
    assert [tenant for tenant, _ in calls[:9]] == ["a", "b", "b", "a", "b", "b", "a", "b", "b"]
    assert stored == ["a"] * 4 + ["b"] * 8


def test_max_queued_refuses_the_tenant_by_name_and_spares_the_others() -> None:
    async def body(rt):
        provider = Recorder(rt)
        scheduler = Scheduler(
            rt,
            [provider],
            quotas={"llm": QuotaLimits(concurrency=1)},
            tenants={"acme": Tenant(max_queued=2), "globex": Tenant()},
        )
        for n in range(2):
            scheduler.submit("llm", n, tenant="acme")
        with pytest.raises(QueueFullError, match=r"tenant 'acme'.*max_queued is 2"):
            scheduler.submit("llm", 9, tenant="acme")
        scheduler.submit("llm", 10, tenant="globex")
        duplicate = scheduler.submit("llm", 1, tenant="acme")  # queues nothing: not refused
        assert scheduler.queued_for("acme") == 2 and scheduler.queued_for("globex") == 1
        assert duplicate.key == scheduler.submit("llm", 1, tenant="globex").key
        await scheduler.close(cancel_pending=True)

    run_on("simpy", body)


def test_unknown_tenants_and_bad_tenant_configuration_are_refused_naming_the_key() -> None:
    rt = SimPyRuntime()
    provider = Recorder(rt)
    scheduler = Scheduler(rt, [provider], tenants={"acme": Tenant()})
    with pytest.raises(ConfigurationError, match="tenant: no tenant named 'initech'"):
        scheduler.submit("llm", 1, tenant="initech")
    with pytest.raises(ConfigurationError, match="tenant: expected"):
        scheduler.submit("llm", 1, tenant=7)
    assert scheduler.in_flight == 0
    plain = Scheduler(rt, [provider])
    with pytest.raises(ConfigurationError, match="this scheduler has no tenants"):
        plain.submit("llm", 1, tenant="acme")
    for bad in (0, -1, math.nan, math.inf, "2", True):
        with pytest.raises(ConfigurationError, match="weight"):
            Tenant(weight=bad)
    for bad in (-1, 1.5, "3"):
        with pytest.raises(ConfigurationError, match="max_queued"):
            Tenant(max_queued=bad)
    with pytest.raises(ConfigurationError, match=r"tenants\['x'\]"):
        Scheduler(rt, [provider], tenants={"x": 3})
    with pytest.raises(ConfigurationError, match="tenants"):
        Scheduler(rt, [provider], tenants={"": Tenant()})


def test_tasks_without_a_tenant_go_to_the_default_tenant() -> None:
    async def body(rt):
        provider = Recorder(rt)
        scheduler = Scheduler(
            rt, [provider], quotas={"llm": QuotaLimits(concurrency=1)}, tenants={"a": Tenant(weight=1)}
        )
        handles = [scheduler.submit("llm", n) for n in range(2)] + [scheduler.submit("llm", 5, tenant="a")]
        async with scheduler:
            for handle in handles:
                await handle
        return provider.calls

    # all three queued at once: equal passes, ties go in the tenants' order, the default tenant last
    assert [tenant for tenant, _ in run_on("simpy", body)] == ["a", None, None]


@pytest.mark.parametrize("rt_name", RUNTIMES)
def test_recovery_and_duplicates_keep_the_tenant(rt_name: str) -> None:
    async def body(rt):
        store = MemoryStore()
        tenants = {"acme": Tenant(), "globex": Tenant(weight=2)}
        first = Scheduler(
            rt, [Recorder(rt)], store=store, quotas={"llm": QuotaLimits(concurrency=1)}, tenants=tenants
        )
        ids = [first.submit("llm", n, tenant="acme" if n % 2 else "globex").id for n in range(6)]
        first.crash()  # nothing ran: every task is queued in the store
        provider = Recorder(rt)
        second = Scheduler(
            rt,
            [provider],
            store=store,
            quotas={"llm": QuotaLimits(concurrency=1)},
            tenants=tenants,
            rng=random.Random(3),
        )
        await second.recover()
        duplicate = second.submit("llm", 1, tenant="globex")  # same key as task 1, acme's
        async with second:
            assert await duplicate == 1
            await second.join()
        return [store.get(task_id).tenant for task_id in ids], provider.calls

    stored, calls = run_on(rt_name, body)
    assert stored == ["globex", "acme"] * 3
    assert sorted(calls, key=str) == sorted(
        [("acme", 1), ("acme", 3), ("acme", 5), ("globex", 0), ("globex", 2), ("globex", 4)], key=str
    )


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_a_restarted_process_on_a_file_store_queues_each_task_in_its_tenant(kind: str, tmp_path) -> None:
    from aiqsim.stores import open_store

    path = tmp_path / f"tasks.{kind}"
    tenants = {"acme": Tenant(), "globex": Tenant(weight=3)}

    async def first(rt):
        store = open_store(kind, path)
        scheduler = Scheduler(rt, [Recorder(rt)], store=store, tenants=tenants)
        for n in range(8):
            scheduler.submit("llm", n, tenant="acme" if n < 4 else "globex")
        scheduler.crash()  # nothing ran
        store.close()

    async def second(rt):
        store = open_store(kind, path)
        provider = Recorder(rt)
        scheduler = Scheduler(
            rt, [provider], store=store, quotas={"llm": QuotaLimits(concurrency=1)}, tenants=tenants
        )
        await scheduler.recover()
        async with scheduler:
            await scheduler.join()
        store.close()
        return provider.calls

    run_on("simpy", first)
    calls = run_on("simpy", second)
    # the stored tenants, shared 1:3 once the restarted process runs them
    assert [tenant for tenant, _ in calls[:4]] == ["acme", "globex", "globex", "globex"]
    assert sorted(payload for _, payload in calls) == list(range(8))
