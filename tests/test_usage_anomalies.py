"""Hostile or buggy usage numbers: clamped, recorded, never fatal, never a frozen lane."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiqsim import QuotaLimits, Scheduler, TaskStatus
from aiqsim.core.usage import sane_usage
from aiqsim.scheduler.events import AttemptRecord, UsageAnomaly
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse
from tests.runtimes import ASYNCIO_LATENESS_S, RUNTIMES, run_on

# ------------------------------------------------------------------------------ the pure rule


@pytest.mark.parametrize(
    ("reported", "charged", "anomalous"),
    [
        (None, 50.0, False),  # not reported: the estimate, and nothing odd about it
        (70, 70.0, False),
        (0, 0.0, False),
        (1000.0, 1000.0, False),  # exactly one full bucket is still believed
        (1e30, 1000.0, True),
        (10**400, 50.0, True),  # beyond any float: not a finite count
        (-5, 50.0, True),
        (math.nan, 50.0, True),
        (math.inf, 50.0, True),
        (-math.inf, 50.0, True),
        ("120", 50.0, True),
        (True, 50.0, True),
    ],
)
def test_sane_usage_rule(reported, charged: float, anomalous: bool) -> None:
    verdict = sane_usage(reported, 50.0, 1000.0)
    assert verdict.usage == charged
    assert (verdict.anomaly is not None) is anomalous


def test_without_a_token_limit_there_is_no_upper_bound_but_nonsense_is_still_refused() -> None:
    assert sane_usage(1e30, 50.0, None).usage == 1e30
    assert sane_usage(-1, 50.0, None).usage == 50.0


def test_an_estimate_above_the_capacity_bound_is_itself_the_bound() -> None:
    assert sane_usage(1e9, 300.0, 200.0).usage == 300.0


@given(
    reported=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers()),
    estimate=st.floats(min_value=0, max_value=1e6),
    capacity=st.floats(min_value=1e-3, max_value=1e7),
)
def test_the_charge_is_always_a_finite_number_within_the_bounds(reported, estimate, capacity) -> None:
    usage = sane_usage(reported, estimate, capacity).usage
    assert math.isfinite(usage)
    assert 0 <= usage <= max(capacity, estimate)


# --------------------------------------------------------------------------- in the scheduler


class UsageProvider:
    """Answers after 1 s, reporting the usage given for the input (``None``: the estimate)."""

    name = "llm"

    def __init__(self, runtime, usages: dict[str, object]) -> None:
        self.runtime = runtime
        self.usages = usages
        self.calls: list[tuple[float, str]] = []

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        name = request.payload["input"]
        self.calls.append((self.runtime.now(), name))
        await self.runtime.sleep(1.0)
        return ProviderResponse(result=f"done:{name}", usage=self.usages.get(name))


@pytest.mark.parametrize("rt_name", RUNTIMES)
@pytest.mark.parametrize("hostile", [1e30, -5, math.nan, math.inf, "lots"])
def test_a_hostile_usage_keeps_the_success_and_does_not_freeze_the_lane(rt_name: str, hostile) -> None:
    async def body(rt):
        events: list = []
        provider = UsageProvider(rt, {"hostile": hostile})
        scheduler = Scheduler(
            rt,
            [provider],
            # 10 tokens/s, a 100-token burst: the worst debt one call may leave is one burst (10 s)
            quotas={"llm": QuotaLimits(tokens_per_min=600, token_burst=100)},
            events=events.append,
        )
        first = scheduler.submit("llm", {"input": "hostile"}, cost_estimate=10)
        result = await rt.wait_for(first.result(), 200)
        second = scheduler.submit("llm", {"input": "next"}, cost_estimate=10)
        await rt.wait_for(second.result(), 200)  # before the fix: never (bucket at -1e30)
        anomalies = [e for e in events if isinstance(e, UsageAnomaly)]
        charged = [e.usage for e in events if isinstance(e, AttemptRecord) and e.task_id == first.id]
        started_next = provider.calls[1][0]
        return result, dict(scheduler.anomalies), len(anomalies), anomalies[0].reported, charged, started_next

    result, counts, events, reported, charged, started_next = run_on(rt_name, body)
    assert result == "done:hostile"  # the billed call still counts as a success
    assert counts == {"usage": 1}
    assert events == 1
    assert reported == repr(hostile)
    assert charged in ([100.0], [10.0])  # clamped to the bound, or the estimate for nonsense
    # The next call waits at most one burst's refill (10 s) after the first ended at t=1 (plus the
    # refill of its own 10-token estimate); asyncio timers may fire late on a loaded machine.
    lateness = ASYNCIO_LATENESS_S if rt_name == "asyncio" else 0.0
    assert started_next <= 1.0 + 10.0 + 1.0 + lateness


@pytest.mark.parametrize("rt_name", RUNTIMES)
def test_a_normal_usage_is_not_an_anomaly(rt_name: str) -> None:
    async def body(rt):
        events: list = []
        scheduler = Scheduler(
            rt,
            [UsageProvider(rt, {"a": 42})],
            quotas={"llm": QuotaLimits(tokens_per_min=600, token_burst=100)},
            events=events.append,
        )
        record = await scheduler.submit("llm", {"input": "a"}, cost_estimate=10).wait()
        return (
            record.status,
            sum(scheduler.anomalies.values()),
            [e for e in events if isinstance(e, UsageAnomaly)],
        )

    assert run_on(rt_name, body) == (TaskStatus.SUCCEEDED, 0, [])
