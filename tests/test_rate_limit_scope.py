"""What a 429 pauses: the pure rule, the scheduler on the virtual clock, the lab evidence for the default."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from aiqsim import (
    ExponentialBackoff,
    QuotaLimits,
    RetryPolicy,
    Scheduler,
    SimPyRuntime,
)
from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import RateLimitError
from aiqsim.scheduler.events import AttemptRecord, LanePaused
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse
from aiqsim.scheduler.rate_limit_scope import (
    DEFAULT_RATE_LIMIT_SCOPE,
    AdaptiveScopeRule,
    RateLimitHistory,
    RateLimitScope,
    pauses_lane,
    rate_limit_scope,
)
from aiqsim.sim.config import RetryConfig
from aiqsim.sim.scenario import ScenarioError, load_scenario
from aiqsim.sim.simulate import retry_policy
from aiqsim.validation.rate_limit_scope_study import random_429_throughput, server_quota_overrun
from tests.fakes import ScriptedProvider
from tests.runtimes import ASYNCIO_LATENESS_S, RUNTIMES, run_on

# ------------------------------------------------------------------ the rule


@pytest.mark.parametrize(
    ("scope", "quota_spent", "looks_spent", "expected"),
    [
        ("lane", None, False, True),
        ("lane", False, False, True),
        ("task", True, True, False),
        ("adaptive", True, False, True),  # the provider said so: its word wins
        ("adaptive", False, True, False),  # quota remains, whatever the recent 429s look like
        ("adaptive", None, True, True),
        ("adaptive", None, False, False),
    ],
)
def test_pauses_lane_follows_scope_then_the_providers_word_then_the_history(
    scope: str, quota_spent: bool | None, looks_spent: bool, expected: bool
) -> None:
    assert pauses_lane(RateLimitScope(scope), quota_spent, looks_spent) is expected


def test_the_history_needs_a_large_share_of_429s_from_several_tasks() -> None:
    rule = AdaptiveScopeRule(min_share=0.3, min_tasks=3, window_s=1.0)
    history = RateLimitHistory()
    # one task retrying into its own 429s proves nothing
    assert not any(history.record_rate_limit("a", t, rule) for t in (0.0, 0.01, 0.02, 0.03))
    assert not history.record_rate_limit("b", 0.04, rule)
    assert history.record_rate_limit("c", 0.05, rule)  # third task, 100% 429s


def test_random_429s_among_many_successes_do_not_look_spent() -> None:
    rule = AdaptiveScopeRule()
    history = RateLimitHistory()
    verdicts = []
    for i in range(2000):  # 100 attempts/s, every 20th a 429 from a different task (5%)
        now = i * 0.01
        if i % 20 == 19:
            verdicts.append(history.record_rate_limit(f"t{i}", now, rule))
        else:
            history.record_success(now, rule)
    assert verdicts and not any(verdicts)


def test_the_history_forgets_after_its_window() -> None:
    rule = AdaptiveScopeRule(min_share=0.3, min_tasks=3, window_s=1.0)
    history = RateLimitHistory()
    history.record_rate_limit("a", 0.0, rule)
    history.record_rate_limit("b", 0.5, rule)
    for i in range(100):
        history.record_success(0.5 + i * 0.001, rule)
    # 10 s later the old successes have decayed away, but so have the old tasks: one task is not enough
    assert not history.record_rate_limit("c", 10.5, rule)
    assert history.attempts == pytest.approx(1.0 + 102 * math.exp(-10.0), rel=0.2)


def test_scope_names_are_checked() -> None:
    assert rate_limit_scope("task") is RateLimitScope.TASK
    with pytest.raises(ConfigurationError, match="'lane', 'task', 'adaptive'"):
        rate_limit_scope("provider")
    with pytest.raises(ValueError):  # ConfigurationError keeps its builtin base
        RetryPolicy(rate_limit_scope="everyone")
    with pytest.raises(ConfigurationError, match="min_share"):
        AdaptiveScopeRule(min_share=0.0)
    with pytest.raises(ConfigurationError, match="min_tasks"):
        AdaptiveScopeRule(min_tasks=0)
    assert RetryPolicy(rate_limit_scope="lane").rate_limit_scope is RateLimitScope.LANE


def test_the_default_is_the_same_in_the_policy_and_the_scenario_format() -> None:
    assert RetryPolicy().rate_limit_scope is DEFAULT_RATE_LIMIT_SCOPE
    assert RetryConfig().rate_limit_scope == DEFAULT_RATE_LIMIT_SCOPE


def test_the_scenario_key_is_validated_and_reaches_the_policy(tmp_path: Any) -> None:
    path = tmp_path / "s.toml"
    path.write_text(
        '[scenario]\nname = "s"\n[[providers]]\nname = "llm"\n'
        '[[workloads]]\ntype = "poisson"\nprovider = "llm"\n'
    )
    scenario = load_scenario(path, overrides={"retry.rate_limit_scope": "task"})
    assert retry_policy(scenario).rate_limit_scope is RateLimitScope.TASK
    with pytest.raises(ScenarioError, match=r"retry\.rate_limit_scope: expected one of"):
        load_scenario(path, overrides={"retry.rate_limit_scope": "provider"})


# ------------------------------------------------------------------ the scheduler


@dataclass
class _QuotaProvider:
    """Answers after ``latency_s``; ``rate_limits[input]`` is the 429 its first attempt gets:
    ``(retry_after_s, quota_spent)``."""

    runtime: Any
    rate_limits: dict[str, tuple[float, bool | None]]
    name: str = "llm"
    latency_s: float = 1.0
    starts: dict[str, list[float]] = field(default_factory=dict)

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        name = request.payload["input"]
        self.starts.setdefault(name, []).append(self.runtime.now())
        await self.runtime.sleep(self.latency_s)
        if name in self.rate_limits and len(self.starts[name]) == 1:
            retry_after, spent = self.rate_limits[name]
            raise RateLimitError("slow down", retry_after_s=retry_after, quota_spent=spent)
        return ProviderResponse(result=name)


def _run_pair(scope: str, quota_spent: bool | None) -> tuple[_QuotaProvider, list[Any]]:
    """Task x sees a 429 (Retry-After 10 s) at t=1; task y arrives at t=1.5."""
    runtime = SimPyRuntime()
    provider = _QuotaProvider(runtime, {"x": (10.0, quota_spent)})
    events: list[Any] = []

    async def main() -> None:
        retry = RetryPolicy(backoff=ExponentialBackoff(0.5, 4.0), rate_limit_scope=scope)
        scheduler = Scheduler(runtime, [provider], retry=retry, events=events.append)
        first = scheduler.submit("llm", {"input": "x"}, task_id="t-x")
        await runtime.sleep(1.5)
        other = scheduler.submit("llm", {"input": "y"}, task_id="t-y")
        await first.wait()
        await other.wait()

    runtime.run(main())
    return provider, events


@pytest.mark.parametrize(
    ("scope", "quota_spent", "y_starts", "reason"),
    [
        ("lane", None, 11.0, "scope=lane"),
        ("lane", False, 11.0, "scope=lane"),
        ("task", True, 1.5, None),
        ("adaptive", True, 11.0, "quota_spent"),
        ("adaptive", False, 1.5, None),
        ("adaptive", None, 1.5, None),  # one 429 from one task: only that task waits
    ],
)
def test_a_429_pauses_what_the_scope_says(
    scope: str, quota_spent: bool | None, y_starts: float, reason: str | None
) -> None:
    provider, events = _run_pair(scope, quota_spent)
    assert provider.starts["y"] == [y_starts]
    assert provider.starts["x"] == [0.0, 11.0]  # the task that saw the 429 waits it out in every scope
    pauses = [e for e in events if isinstance(e, LanePaused)]
    if reason is None:
        assert pauses == []
    else:
        assert pauses == [LanePaused(1.0, "llm", 11.0, "t-x", reason)]


def test_adaptive_pauses_the_lane_when_several_tasks_get_429s_without_a_quota_signal() -> None:
    runtime = SimPyRuntime()
    provider = _QuotaProvider(runtime, {name: (10.0, None) for name in ("a", "b", "c")})
    events: list[Any] = []

    async def main() -> None:
        scheduler = Scheduler(runtime, [provider], events=events.append)
        handles = [scheduler.submit("llm", {"input": name}) for name in ("a", "b", "c")]
        await runtime.sleep(1.5)
        handles.append(scheduler.submit("llm", {"input": "late"}))
        for handle in handles:
            await handle.wait()

    runtime.run(main())
    pauses = [e for e in events if isinstance(e, LanePaused)]
    assert [(p.time, p.until, p.reason) for p in pauses] == [(1.0, 11.0, "repeated_429s")]
    assert provider.starts["late"] == [11.0]


# ------------------------------------------------------------------ the lab evidence


def test_default_scope_keeps_80_percent_of_throughput_under_5_percent_random_429s() -> None:
    baseline = random_429_throughput(DEFAULT_RATE_LIMIT_SCOPE, rate_limit_prob=0.0, seed=0)
    default = random_429_throughput(DEFAULT_RATE_LIMIT_SCOPE, seed=0)
    lane = random_429_throughput("lane", seed=0)
    print(
        f"\nrandom 5% 429s, Retry-After 1 s: no 429s {baseline.tasks_per_s:.1f}/s, "
        f"{default.scope} {default.tasks_per_s:.1f}/s ({default.lane_pauses} lane pauses), "
        f"lane {lane.tasks_per_s:.1f}/s"
    )
    assert default.rate_limited > 50  # the 429s did happen
    assert default.tasks_per_s >= 0.8 * baseline.tasks_per_s
    assert lane.tasks_per_s < 0.5 * baseline.tasks_per_s  # the experiment can tell the scopes apart


@pytest.mark.parametrize("reports_quota", [True, False])
def test_default_scope_stops_sending_into_a_spent_server_quota(reports_quota: bool) -> None:
    default = server_quota_overrun(DEFAULT_RATE_LIMIT_SCOPE, reports_quota=reports_quota, seed=0)
    task = server_quota_overrun("task", reports_quota=reports_quota, seed=0)
    lane = server_quota_overrun("lane", reports_quota=reports_quota, seed=0)
    print(
        f"\nclient quota 2x the server's (reports_quota={reports_quota}), 429s after the first per "
        f"{default.accepted} accepted: {default.scope} {default.rate_limited_after_first}, "
        f"lane {lane.rate_limited_after_first}, task {task.rate_limited_after_first}"
    )
    assert default.tasks_failed == 0 and default.accepted == default.tasks
    if reports_quota:  # the provider says its quota is spent: as few 429s as pausing on every one
        assert default.rate_limited_after_first <= lane.rate_limited_after_first
        assert default.rate_limited_after_first <= 0.02 * default.accepted
    else:  # only the share of 429s to go by: well below task scope, above lane scope
        assert default.rate_limited_after_first <= 0.25 * task.rate_limited_after_first
    assert task.rate_limited_after_first >= 0.3 * task.accepted  # task scope does overrun


# ------------------------------------------------------------------ the retry line through a lane pause


@pytest.mark.parametrize("rt_name", RUNTIMES)
def test_a_retry_held_by_the_lane_pause_goes_before_queued_work_when_the_lane_reopens(rt_name: str) -> None:
    """a's 429 (Retry-After 2 s) pauses the lane until t=3, exactly when a's retry is due (its backoff,
    0.1 s, is floored by the Retry-After). q1 and q2 queued meanwhile. Retries go before queued work:
    a's retry must take the one slot at t=3 on both runtimes. (On asyncio, a retry that slept through
    the pause instead raced the lane's own wake-up at that instant, and the queued task could win.)"""

    async def body(rt: Any) -> list[tuple[str, int]]:
        provider = ScriptedProvider(rt, latency_s=1.0, script={"a": ["429:2", "ok"]})
        scheduler = Scheduler(
            rt,
            [provider],
            quotas={"llm": QuotaLimits(concurrency=1)},
            retry=RetryPolicy(
                backoff=ExponentialBackoff(base_s=0.1, cap_s=0.1), max_attempts=3, rate_limit_scope="lane"
            ),
        )
        handles = [scheduler.submit("llm", {"input": "a"}, cost_estimate=1)]
        await rt.sleep(0.5)
        handles += [scheduler.submit("llm", {"input": name}, cost_estimate=1) for name in ("q1", "q2")]
        for handle in handles:
            await handle.wait()
        await scheduler.close()
        return [(name, attempt) for _, name, attempt in provider.calls]

    assert run_on(rt_name, body) == [("a", 1), ("a", 2), ("q1", 1), ("q2", 1)]


def test_a_success_decays_the_counts_exactly_as_a_429_does() -> None:
    # a success and a 429 decay the counts by the one rule (_decay): the same counts to the last
    # bit, whatever the gaps
    rule = AdaptiveScopeRule(window_s=0.7)
    inline, reference = RateLimitHistory(), RateLimitHistory()
    for now in (0.0, 0.0, 0.3, 1.9, 1.9, 2.0, 40.0, 40.25):
        inline.record_success(now, rule)
        reference._decay(now, rule)
        reference.attempts += 1.0
        assert (inline.attempts, inline.rate_limited, inline.updated_at) == (
            reference.attempts,
            reference.rate_limited,
            reference.updated_at,
        )
        inline.record_rate_limit("t", now + 0.1, rule)
        reference.record_rate_limit("t", now + 0.1, rule)


class _FirstCallOfA429s:
    """Answers after 0.1 s; the first call of payload "a" is a 429 with Retry-After 100 s, and says
    when (``limited``: a future resolved with the time)."""

    name = "llm"

    def __init__(self, runtime) -> None:
        self.runtime = runtime
        self.limited = runtime.create_future()

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        await self.runtime.sleep(0.1)
        if request.payload == "a" and request.attempt == 1:
            self.limited.set_result(self.runtime.now())
            raise RateLimitError("slow down", retry_after_s=100.0)
        return ProviderResponse(result="ok", usage=0)


@pytest.mark.parametrize("rt_name", RUNTIMES)
@pytest.mark.parametrize(
    ("scheduler_scope", "task_scope", "b_waits"), [("lane", "task", False), ("task", "lane", True)]
)
def test_a_tasks_own_retry_policy_decides_whether_its_429_pauses_the_lane(
    rt_name: str, scheduler_scope: str, task_scope: str, b_waits: bool
) -> None:
    """submit(retry=...) "replaces the scheduler's retry policy for this task", but the lane pause
    read the scheduler's rate_limit_scope: a task that said only it should wait froze the lane
    (found by a review that fuzzed the scheduler). b is submitted once a's 429 has been seen; the
    outcome ruled out is kept beyond ASYNCIO_LATENESS_S (timers never fire early)."""

    async def body(rt):
        provider = _FirstCallOfA429s(rt)
        handled = rt.create_future()  # the scheduler has dealt with a's 429 (asyncio hears of it later)

        def sink(event: object) -> None:
            if isinstance(event, AttemptRecord) and event.outcome == "RateLimitError" and not handled.done():
                handled.set_result(None)

        scheduler = Scheduler(
            rt, [provider], retry=RetryPolicy(rate_limit_scope=scheduler_scope), events=sink
        )
        a = scheduler.submit("llm", "a", retry=RetryPolicy(rate_limit_scope=task_scope))
        await handled
        limited_at = await provider.limited
        b = await scheduler.submit("llm", "b").wait()
        await a.wait()
        await scheduler.close()
        return b.started_at - limited_at

    after_the_429 = run_on(rt_name, body)
    if b_waits:  # the lane reopens 100 s after the 429
        assert after_the_429 >= 100.0
    else:  # at once
        assert 0.0 <= after_the_429 < 100.0 - ASYNCIO_LATENESS_S
