"""Bad numbers from user objects into the scheduler's waits (rule: no lane may stall on a bad
number; a failure must surface).

A quota answering a wait that is no number of seconds >= 0 (NaN, negative, -inf, text) fails the
task it was asked for, with the quota and the value named, and the lanes go on. NaN passed
``max(wait, 0.0)`` into the lane's timer: the lane stalled, its tasks queued for ever, and nothing
was said. ``inf`` keeps its meaning ("until a release frees a slot"). A backoff strategy's delay
that is no finite number >= 0 fails the task the same way.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from aiqsim import QuotaLimits, RetryPolicy, Scheduler, TaskStatus
from aiqsim.core.backoff import ExponentialBackoff
from aiqsim.core.numeric import is_wait
from aiqsim.core.token_bucket import MultiQuota
from aiqsim.scheduler.events import AttemptRecord, QuotaUnavailable, TaskTransition
from tests.fakes import ScriptedProvider
from tests.runtimes import RUNTIMES, run_on


class BadWaitQuota(MultiQuota):
    """One request a minute (burst 1), whose ``time_until`` answers ``bad`` instead of the wait."""

    def __init__(self, bad: object, now: float = 0.0) -> None:
        super().__init__(QuotaLimits(requests_per_min=1, request_burst=1), now=now)
        self.bad = bad

    def time_until(self, tokens: float, now: float) -> float:
        return self.bad  # type: ignore[return-value]


@pytest.mark.parametrize("rt_name", RUNTIMES)
@pytest.mark.parametrize("bad", [math.nan, -1.0, -math.inf, "soon", 10**400])
def test_a_bad_wait_from_a_quota_fails_the_task_naming_it_and_the_lanes_go_on(
    rt_name: str, bad: object
) -> None:
    async def body(rt: Any) -> Any:
        events: list[Any] = []
        scheduler = Scheduler(
            rt,
            [ScriptedProvider(rt), ScriptedProvider(rt, name="other")],
            quotas={"llm": BadWaitQuota(bad, rt.now())},
            events=events.append,
        )
        first = scheduler.submit("llm", {"input": "a"})
        second = scheduler.submit("llm", {"input": "b"})  # refused by the bucket: its wait is asked
        other = scheduler.submit("other", {"input": "c"})
        records = [await h.wait() for h in (first, second, other)]
        third = await scheduler.submit("llm", {"input": "d"}).wait()  # the lane still dispatches
        await scheduler.close()
        return records, third, events

    (first, second, other), third, events = run_on(rt_name, body)
    assert first.status is TaskStatus.SUCCEEDED and other.status is TaskStatus.SUCCEEDED
    for refused in (second, third):
        assert refused.status is TaskStatus.FAILED
        assert "QuotaConfigError" in refused.error and "BadWaitQuota.time_until" in refused.error
        assert repr(bad) in refused.error and "'llm'" in refused.error
    failed = [e for e in events if isinstance(e, TaskTransition) and e.new == TaskStatus.FAILED]
    assert {e.task_id for e in failed} == {second.id, third.id}
    told = [e for e in events if isinstance(e, QuotaUnavailable)]  # the sink hears what was wrong
    assert [e.provider for e in told] == ["llm", "llm"] and all(repr(bad) in e.error for e in told)


@pytest.mark.parametrize("rt_name", RUNTIMES)
def test_a_retry_told_a_bad_wait_fails_with_the_quotas_error(rt_name: str) -> None:
    """A retry asks for quota on a ticket: the bad wait fails the task through its attempt loop."""
    retry = RetryPolicy(max_attempts=3, backoff=ExponentialBackoff(base_s=0.01, cap_s=0.01))

    async def body(rt: Any) -> Any:
        provider = ScriptedProvider(rt, script={"a": ["500", "ok"]})
        scheduler = Scheduler(rt, [provider], quotas={"llm": BadWaitQuota(math.nan, rt.now())}, retry=retry)
        record = await scheduler.submit("llm", {"input": "a"}).wait()
        await scheduler.close()
        return record, provider.calls_for("a")

    record, calls = run_on(rt_name, body)
    assert record.status is TaskStatus.FAILED and calls == 1
    assert "returned nan" in record.error


@pytest.mark.parametrize("rt_name", RUNTIMES)
def test_an_infinite_wait_still_means_until_a_release(rt_name: str) -> None:
    """inf is a quota's "every slot is taken": the lane waits for the release, as before."""

    async def body(rt: Any) -> Any:
        scheduler = Scheduler(rt, [ScriptedProvider(rt)], quotas={"llm": QuotaLimits(concurrency=1)})
        handles = [scheduler.submit("llm", {"input": str(i)}) for i in range(3)]
        records = [await h.wait() for h in handles]
        await scheduler.close()
        return records

    records = run_on(rt_name, body)
    assert [r.status for r in records] == [TaskStatus.SUCCEEDED] * 3
    starts = sorted(r.started_at for r in records)
    assert starts[1] >= starts[0] + 1.0 and starts[2] >= starts[1] + 1.0


def test_what_counts_as_a_wait() -> None:
    assert all(is_wait(v) for v in (0, 0.0, 1.5, math.inf))
    assert not any(is_wait(v) for v in (math.nan, -1e-9, -math.inf, "1", True, None))


class BadBackoff:
    """A custom backoff strategy whose delay is ``bad``."""

    name = "bad"

    def __init__(self, bad: object) -> None:
        self.bad = bad

    def delay(self, retry: int, rng: Any, previous: float | None = None) -> float:
        return self.bad  # type: ignore[return-value]


@pytest.mark.parametrize("rt_name", RUNTIMES)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, 10**400])
def test_a_bad_delay_from_a_backoff_strategy_fails_the_task_naming_it(rt_name: str, bad: float) -> None:
    """NaN slept as 0 (an immediate retry, said nowhere), inf held the task running for ever."""
    retry = RetryPolicy(max_attempts=3, backoff=BadBackoff(bad))  # type: ignore[arg-type]

    async def body(rt: Any) -> Any:
        provider = ScriptedProvider(rt, script={"a": ["500", "ok"]})
        scheduler = Scheduler(rt, [provider], retry=retry)
        record = await scheduler.submit("llm", {"input": "a"}).wait()
        other = await scheduler.submit("llm", {"input": "b"}).wait()
        await scheduler.close()
        return record, other, provider.calls_for("a")

    record, other, calls = run_on(rt_name, body)
    assert record.status is TaskStatus.FAILED and calls == 1
    assert f"BadBackoff.delay(retry=0) returned {bad!r}" in record.error
    assert other.status is TaskStatus.SUCCEEDED


@pytest.mark.parametrize("rt_name", RUNTIMES)
def test_the_attempt_a_bad_backoff_delay_ended_is_reported(rt_name: str) -> None:
    """The call that failed before the bad delay was asked is an attempt like any other: its
    :class:`AttemptRecord` (the provider's error, decision ``fatal``: no retry follows) comes before
    the task's failure. Before, the task failed with ``attempts=1`` and no attempt was ever reported
    (a trace without the call, metrics one attempt short)."""
    retry = RetryPolicy(max_attempts=3, backoff=BadBackoff(math.nan))  # type: ignore[arg-type]

    async def body(rt: Any) -> Any:
        events: list[Any] = []
        provider = ScriptedProvider(rt, script={"a": ["500", "ok"]})
        scheduler = Scheduler(rt, [provider], retry=retry, events=events.append)
        record = await scheduler.submit("llm", {"input": "a"}).wait()
        await scheduler.close()
        return record, events

    record, events = run_on(rt_name, body)
    assert record.status is TaskStatus.FAILED and record.attempts == 1
    assert "BadBackoff.delay(retry=0) returned nan" in record.error
    attempts = [e for e in events if isinstance(e, AttemptRecord)]
    assert [(e.attempt, e.outcome, e.decision, e.delay_s) for e in attempts] == [
        (1, "ServerError", "fatal", None)
    ]
    ended = [i for i, e in enumerate(events) if isinstance(e, TaskTransition) and e.new == TaskStatus.FAILED]
    assert events.index(attempts[0]) < ended[0]


class RaisingQuota(MultiQuota):
    """One request a minute (burst 1), whose ``method`` raises (a quota's bug) once it refuses."""

    def __init__(self, method: str, now: float = 0.0) -> None:
        super().__init__(QuotaLimits(requests_per_min=1, request_burst=1), now=now)
        self.method = method
        self.granted = 0

    def try_reserve(self, tokens: float, now: float) -> Any:
        if self.method == "try_reserve" and self.granted:
            raise ValueError("broken bucket")
        reservation = super().try_reserve(tokens, now)
        self.granted += reservation is not None
        return reservation

    def time_until(self, tokens: float, now: float) -> float:
        if self.method == "time_until":
            raise ValueError("broken bucket")
        return super().time_until(tokens, now)


@pytest.mark.parametrize("rt_name", RUNTIMES)
@pytest.mark.parametrize("method", ["try_reserve", "time_until"])
def test_a_quota_that_raises_fails_the_task_naming_it_and_the_lane_goes_on(rt_name: str, method: str) -> None:
    """A quota whose ``try_reserve`` or ``time_until`` raises (not a QuotaConfigError): the task it was
    asked for fails naming the quota and the error, and the lane dispatches its next task. Before,
    the exception left the lane's dispatcher (a callback: logged at best) with no timer set, and the
    lane's queued tasks waited for ever."""

    async def body(rt: Any) -> Any:
        scheduler = Scheduler(
            rt,
            [ScriptedProvider(rt), ScriptedProvider(rt, name="other")],
            quotas={"llm": RaisingQuota(method)},
        )
        handles = [scheduler.submit("llm", {"input": n}) for n in ("a", "b", "c")]
        other = scheduler.submit("other", {"input": "d"})
        records = [await rt.wait_for(h.wait(), 120) for h in (*handles, other)]
        await scheduler.close()
        return records

    first, second, third, other = run_on(rt_name, body)
    assert first.status is TaskStatus.SUCCEEDED and other.status is TaskStatus.SUCCEEDED
    for refused in (second, third):
        assert refused.status is TaskStatus.FAILED
        assert "QuotaConfigError" in refused.error and f"RaisingQuota.{method}" in refused.error
        assert "ValueError: broken bucket" in refused.error and "'llm'" in refused.error
