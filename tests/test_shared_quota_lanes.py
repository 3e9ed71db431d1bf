"""Providers given one quota object draw on one account, and are dispatched as one.

Each lane's dispatcher waits for a wake-up when every slot is taken. A release used to wake only the
releasing lane, so a call waiting on another lane of the same plain ``MultiQuota`` waited for ever
(``SharedMultiQuota`` hid it by polling every ``slot_poll_s``); then, with lanes waking each other,
the lane woken first took the slot, whatever the class of the work waiting on the other
(interactive waited behind background). Now the lanes of one quota object share their queues and
one dispatcher (``aiqsim.scheduler.lanes.share_quota_objects``): the policy's order and the class
order hold across them, and the depth limit's trial sees the same order.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from aiqsim import Priority, QueueFullError, QuotaLimits, Scheduler, SimPyRuntime
from aiqsim.core.fleet_quota import SharedMultiQuota
from aiqsim.core.token_bucket import MultiQuota
from aiqsim.scheduler.dispatch import ShortestJobFirstPolicy
from tests.fakes import ScriptedProvider
from tests.runtimes import ASYNCIO_LATENESS_S, RUNTIMES, run_on
from tests.scheduler_probes import count_dispatch_runs


def _providers(runtime: Any, *names: str) -> dict[str, ScriptedProvider]:
    return {name: ScriptedProvider(runtime, name=name, latency_s=1.0) for name in names}


def _on_one_account(
    runtime: Any, providers: dict[str, ScriptedProvider], account: Any, **options: Any
) -> Scheduler:
    """A scheduler whose providers all draw on the one quota object ``account``."""
    return Scheduler(
        runtime,
        list(providers.values()),
        quotas=dict.fromkeys(providers, account),
        rng=random.Random(0),
        **options,
    )


def _starts(*providers: ScriptedProvider, since: float = 0.0) -> list[tuple[float, str]]:
    return sorted((t - since, name) for p in providers for t, name, _ in p.calls)


def _fifo_starts(runtime_name: str, quota_type: type) -> list[tuple[float, str]]:
    async def body(runtime: Any) -> list[tuple[float, str]]:
        providers = _providers(runtime, "a", "b")
        account = quota_type(QuotaLimits(concurrency=1), now=runtime.now())
        scheduler = _on_one_account(runtime, providers, account)
        start = runtime.now()
        for lane, name in (("a", "a1"), ("b", "b1"), ("a", "a2"), ("b", "b2")):
            scheduler.submit(lane, {"input": name})
        await scheduler.join()
        return _starts(*providers.values(), since=start)

    return run_on(runtime_name, body)


@pytest.mark.parametrize("runtime_name", RUNTIMES)
@pytest.mark.parametrize("quota_type", [MultiQuota, SharedMultiQuota])
def test_a_slot_freed_on_one_lane_starts_the_next_call_in_fifo_order_whichever_lane_it_is_on(
    runtime_name: str, quota_type: type
) -> None:
    starts = _fifo_starts(runtime_name, quota_type)
    # every call ran (none waits for a wake-up that never comes), first come first served across
    # the two providers of the one account
    assert [name for _, name in starts] == ["a1", "b1", "a2", "b2"]
    times = [t for t, _ in starts]
    if runtime_name == "simpy":  # one slot: back to back, each as soon as the last one ends
        assert times == [0.0, 1.0, 2.0, 3.0]
    else:
        for index, t in enumerate(times):
            assert index <= t < index + ASYNCIO_LATENESS_S


def test_interactive_work_on_one_provider_goes_before_background_work_on_another_of_the_account() -> None:
    runtime = SimPyRuntime()
    providers = _providers(runtime, "a", "b")

    async def main() -> None:
        account = MultiQuota(QuotaLimits(concurrency=1))
        scheduler = _on_one_account(runtime, providers, account)
        scheduler.submit("b", {"input": "b-running"})
        await runtime.sleep(0.1)
        scheduler.submit("b", {"input": "b-background"})
        scheduler.submit("a", {"input": "a-interactive"}, priority=Priority.INTERACTIVE)
        await scheduler.join()

    runtime.run(main())
    assert _starts(*providers.values()) == [(0.0, "b-running"), (1.0, "a-interactive"), (2.0, "b-background")]


def test_sjf_takes_the_cheapest_call_of_the_account_first() -> None:
    runtime = SimPyRuntime()
    providers = _providers(runtime, "a", "b")

    async def main() -> None:
        account = MultiQuota(QuotaLimits(concurrency=1))
        scheduler = _on_one_account(runtime, providers, account, dispatch=ShortestJobFirstPolicy())
        scheduler.submit("a", {"input": "first"}, cost_estimate=5.0)
        await runtime.sleep(0.1)
        scheduler.submit("a", {"input": "a-large"}, cost_estimate=100.0)
        scheduler.submit("b", {"input": "b-small"}, cost_estimate=1.0)
        await scheduler.join()

    runtime.run(main())
    assert [name for _, name in _starts(*providers.values())] == ["first", "b-small", "a-large"]


@pytest.mark.parametrize("quota_type", [MultiQuota, SharedMultiQuota])
@pytest.mark.parametrize("order", [("a", "b", "a"), ("b", "a", "a"), ("a", "a", "b")])
def test_at_limit_zero_a_call_accepted_on_one_provider_is_not_pushed_out_by_one_on_another(
    order: tuple[str, ...], quota_type: type
) -> None:
    # two slots on the account, FIFO, one class: of three calls in one instant the first two are
    # accepted and start, the third would wait and is refused, whichever providers they are for
    runtime = SimPyRuntime()
    providers = _providers(runtime, "a", "b")

    async def main() -> tuple[list[str], int, list[tuple[float, str]]]:
        account = quota_type(QuotaLimits(concurrency=2))
        scheduler = _on_one_account(runtime, providers, account, interactive_limit=0)
        outcome = []
        start = runtime.now()
        for index, lane in enumerate(order):
            try:
                scheduler.submit(lane, {"input": f"{lane}{index}"}, priority=Priority.INTERACTIVE)
                outcome.append("accepted")
            except QueueFullError:
                outcome.append("refused")
        await runtime.sleep(0.5)
        waiting = scheduler.queued(Priority.INTERACTIVE)
        await scheduler.join()
        return outcome, waiting, _starts(*providers.values(), since=start)

    outcome, waiting, starts = runtime.run(main())
    assert outcome == ["accepted", "accepted", "refused"]
    assert waiting == 0  # nothing accepted at limit 0 waits
    assert starts == sorted([(0.0, f"{order[0]}0"), (0.0, f"{order[1]}1")])


def test_a_release_runs_one_dispatch_for_the_account_not_one_per_provider(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runtime = SimPyRuntime()
    names = [f"p{index}" for index in range(16)]
    providers = _providers(runtime, *names)
    dispatched = count_dispatch_runs(monkeypatch)

    async def main() -> None:
        account = MultiQuota(QuotaLimits(concurrency=2))
        scheduler = _on_one_account(runtime, providers, account)
        for index in range(64):
            scheduler.submit(names[index % 16], {"input": str(index)})
        await scheduler.join()

    runtime.run(main())
    assert sum(len(p.calls) for p in providers.values()) == 64
    assert set(dispatched) == {"p0"}  # the account's one dispatcher (its first provider's lane)
    # one run for the submissions' instant, then one per instant in which calls end (each pair of
    # calls ends together: 32 instants), and the last run finding nothing queued
    assert len(dispatched) <= 1 + 32 + 1


@pytest.mark.parametrize("lanes", ["aaa", "aab"])
def test_the_accounts_429s_count_together_for_the_adaptive_pause(lanes: str) -> None:
    # three tasks see a 429 with Retry-After 5 s on one account of three slots: the adaptive scope
    # reads that as a spent quota and pauses it, whichever providers of the account the 429s came
    # from (split over two providers they counted apart, and the late call went into the window)
    runtime = SimPyRuntime()
    script = {f"t{index}": ["429:5", "ok"] for index in range(3)}
    providers = {n: ScriptedProvider(runtime, name=n, latency_s=1.0, script=script) for n in ("a", "b")}
    events: list[Any] = []

    async def main() -> None:
        account = MultiQuota(QuotaLimits(concurrency=3))
        scheduler = _on_one_account(runtime, providers, account, events=events.append)
        for index, lane in enumerate(lanes):
            scheduler.submit(lane, {"input": f"t{index}"})
        scheduler.submit("a", {"input": "late"})
        await scheduler.join()

    runtime.run(main())
    pauses = [e.reason for e in events if type(e).__name__ == "LanePaused"]
    late = [t for p in providers.values() for t, name, _ in p.calls if name == "late"]
    assert (pauses, late) == (["repeated_429s"], [7.0])
