"""Backpressure: a bounded background queue by default, its depth in the event stream."""

from __future__ import annotations

from typing import Any

import pytest

from aiqsim import Priority, QueueFullError, QuotaLimits, Scheduler, SimPyRuntime
from aiqsim.core.errors import SchedulingError
from aiqsim.scheduler.events import QueueRejected, QuotaSample
from aiqsim.scheduler.scheduler import DEFAULT_BACKGROUND_LIMIT
from aiqsim.sim.config import DispatchConfig
from aiqsim.sim.scenario import parse_scenario
from aiqsim.sim.simulate import simulate
from tests.fakes import ScriptedProvider


def test_the_background_queue_is_bounded_by_default_and_the_refusal_says_what_to_do() -> None:
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0)
    events: list[Any] = []

    async def main() -> None:
        scheduler = Scheduler(
            runtime, [provider], quotas={"llm": QuotaLimits(concurrency=1)}, events=events.append
        )
        scheduler.submit("llm", {"input": "running"})
        await runtime.sleep(0)
        for i in range(DEFAULT_BACKGROUND_LIMIT):
            scheduler.submit("llm", {"input": f"b{i}"})
        stored = len(scheduler.store.list_by_status())
        with pytest.raises(QueueFullError) as refusal:
            scheduler.submit("llm", {"input": "one too many"})
        assert len(scheduler.store.list_by_status()) == stored  # nothing was written
        message = str(refusal.value)
        assert f"{DEFAULT_BACKGROUND_LIMIT} already queued (limit {DEFAULT_BACKGROUND_LIMIT})" in message
        for advice in ("Retry later", "raise background_limit", "add quota"):
            assert advice in message
        scheduler.submit("llm", {"input": "urgent"}, priority=Priority.INTERACTIVE)  # its own limit
        assert scheduler.queued(Priority.BACKGROUND) == DEFAULT_BACKGROUND_LIMIT
        await scheduler.close()  # cancel the backlog

    runtime.run(main())
    rejected = [e for e in events if isinstance(e, QueueRejected)]
    assert rejected == [
        QueueRejected(
            time=0.0,
            provider="llm",
            priority=int(Priority.BACKGROUND),
            queued=DEFAULT_BACKGROUND_LIMIT,
            limit=DEFAULT_BACKGROUND_LIMIT,
            queued_in_lane=DEFAULT_BACKGROUND_LIMIT,
        )
    ]


def test_queue_full_belongs_to_the_scheduling_family_and_keeps_its_builtin_base() -> None:
    assert issubclass(QueueFullError, SchedulingError) and issubclass(QueueFullError, RuntimeError)


def test_the_scenario_default_is_the_schedulers() -> None:
    assert DispatchConfig().background_limit == DEFAULT_BACKGROUND_LIMIT
    assert Scheduler.__init__.__kwdefaults__["background_limit"] == DEFAULT_BACKGROUND_LIMIT


def _overload(background_limit: Any) -> Any:
    """30 background arrivals/s for 120 s against a client quota of 3 requests/s: 10x the quota."""
    scenario = parse_scenario(
        {
            "scenario": {"name": "overload_10x", "seed": 5, "duration_s": 120, "drain_s": 3600},
            "providers": [{"name": "llm", "latency_base_s": 0.2, "latency_per_unit_s": 0.0}],
            "quotas": {"llm": {"requests_per_min": 180, "request_burst": 1}},
            "dispatch": {"background_limit": background_limit},
            "workloads": [
                {
                    "type": "poisson",
                    "provider": "llm",
                    "rate_per_s": 30,
                    "cost": {"dist": "fixed", "mean": 10},
                }
            ],
        },
        source="<overload_10x>",
    )
    return simulate(scenario)


def test_at_10x_the_quota_the_default_limit_holds_the_backlog_and_reports_it() -> None:
    default = _overload(DEFAULT_BACKGROUND_LIMIT)
    unbounded = _overload("none")

    def deepest(result: Any) -> int:
        return max(e.queued_background for e in result.events if isinstance(e, QuotaSample))

    rejections = [e for e in default.events if isinstance(e, QueueRejected)]
    print(
        f"\n10x overload, 2 min: deepest background queue {deepest(default)} with the default limit "
        f"({len(rejections)} refusals), {deepest(unbounded)} unbounded"
    )
    assert deepest(unbounded) > 1.5 * DEFAULT_BACKGROUND_LIMIT  # the overload does outgrow the limit
    assert deepest(default) == DEFAULT_BACKGROUND_LIMIT
    assert len(rejections) == default.summary["tasks_rejected"] > 0
    assert all(e.queued == e.limit == DEFAULT_BACKGROUND_LIMIT for e in rejections)
    # the periodic samples show the queue filling up to the limit and staying there
    timeline = default.timeline
    assert timeline["queued_background"].max() == DEFAULT_BACKGROUND_LIMIT
