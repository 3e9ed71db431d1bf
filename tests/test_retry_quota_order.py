"""The AWS retry-quota rule and Retry-After on any provider error.

AWS SDKs ask their retry quota when a retry is decided and, when it cannot pay, give up at once
with no delay. aiqsim used to charge it only after the backoff sleep, so a refused retry failed
a whole backoff late. Exact times on the SimPy clock.
"""

from __future__ import annotations

import random

import pytest

from aiqsim import ConstantBackoff, ExponentialBackoff, RetryPolicy, Scheduler, SimPyRuntime, TaskStatus
from aiqsim.core.failures import ServerError
from aiqsim.overload import CircuitBreaker, GateChain, RetryTokenBucket
from aiqsim.scheduler.events import AttemptRecord
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse
from tests.runtimes import ASYNCIO_LATENESS_S, RUNTIMES, run_on


class AlwaysFailing:
    """Every call fails at once with a 500 (or with the error given)."""

    name = "llm"

    def __init__(self, runtime, error: Exception | None = None, succeed_after: int | None = None) -> None:
        self.runtime = runtime
        self.error = error
        self.succeed_after = succeed_after
        self.calls: list[float] = []

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        self.calls.append(self.runtime.now())
        if self.succeed_after is not None and len(self.calls) > self.succeed_after:
            return ProviderResponse(result="ok")
        raise self.error if self.error is not None else ServerError("boom", status=500)


def failure_time(capacity: float, gates_of=lambda bucket: [bucket]):
    runtime = SimPyRuntime()
    bucket = RetryTokenBucket(capacity=capacity, retry_cost=5)
    provider = AlwaysFailing(runtime)
    events: list = []
    scheduler = Scheduler(
        runtime,
        [provider],
        retry=RetryPolicy(backoff=ExponentialBackoff(base_s=1.0, cap_s=60.0), max_attempts=10),
        gates=gates_of(bucket),
        events=events.append,
    )

    async def body():
        return await scheduler.submit("llm", {"input": "a"}).wait()

    record = runtime.run(body())
    rejected = [e for e in events if isinstance(e, AttemptRecord) and e.decision == "rejected"]
    return record, provider.calls, rejected, bucket.level("llm")


@pytest.mark.parametrize("chained", [False, True])
def test_a_retry_the_quota_refuses_fails_at_once_not_after_its_backoff(chained: bool) -> None:
    gates_of = (lambda bucket: [GateChain([CircuitBreaker(), bucket])]) if chained else (lambda b: [b])
    # quota 5 pays one retry: attempt 1 at t=0, retry at t=1 (backoff 1 s), refused at t=1 (was t=3)
    record, calls, rejected, level = failure_time(5, gates_of)
    assert calls == [0.0, 1.0]
    assert record.status is TaskStatus.FAILED and record.updated_at == 1.0
    assert [e.start for e in rejected] == [1.0]
    assert "retry budget exhausted" in record.error
    assert level == 0
    # quota below one retry's cost: refused at t=0 (was t=1)
    record, calls, rejected, level = failure_time(4, gates_of)
    assert calls == [0.0]
    assert record.updated_at == 0.0 and [e.start for e in rejected] == [0.0]
    assert level == 4


@pytest.mark.parametrize("rt_name", RUNTIMES)
def test_a_retry_cancelled_during_its_backoff_gets_its_quota_back(rt_name: str) -> None:
    async def body(rt):
        bucket = RetryTokenBucket(capacity=20, retry_cost=5)
        scheduler = Scheduler(
            rt,
            [AlwaysFailing(rt)],
            # a backoff longer than an asyncio timer may be late: the cancel lands inside it on a
            # loaded machine too (10 s was 90 ms of wall time at the suite's asyncio scale)
            retry=RetryPolicy(backoff=ConstantBackoff(delay_s=ASYNCIO_LATENESS_S + 10.0), max_attempts=5),
            gates=[bucket],
        )
        handle = scheduler.submit("llm", {"input": "a"})
        # failed at t=0, retry charged, sleeping its backoff: on asyncio the first attempt itself may
        # end later than t=1 on a loaded machine (10 ms of wall time), so wait for the charge,
        # for at most a timer's tolerated lateness (then the check below fails, as it should)
        waited = 0.0
        while bucket.level("llm") == 20 and waited < ASYNCIO_LATENESS_S:
            await rt.sleep(1.0)
            waited += 1.0
        charged = bucket.level("llm")
        scheduler.cancel(handle.id)
        record = await handle.wait()
        return charged, bucket.level("llm"), record.status

    assert run_on(rt_name, body) == (15, 20, TaskStatus.CANCELLED)


def test_a_retry_refused_by_a_later_gate_after_its_backoff_gets_its_quota_back() -> None:
    runtime = SimPyRuntime()
    bucket = RetryTokenBucket(capacity=20, retry_cost=5)
    breaker = CircuitBreaker(failure_threshold=1, window_s=60, cooldown_s=100)
    scheduler = Scheduler(
        runtime,
        [AlwaysFailing(runtime)],
        retry=RetryPolicy(backoff=ConstantBackoff(delay_s=1.0), max_attempts=5),
        gates=[GateChain([breaker, bucket])],
        rng=random.Random(0),
    )

    async def body():
        return await scheduler.submit("llm", {"input": "a"}).wait()

    record = runtime.run(body())
    assert record.status is TaskStatus.FAILED and "circuit" in record.error.lower()
    assert record.updated_at == 1.0  # the breaker (opened by the failure) judged it after the backoff
    assert bucket.level("llm") == 20  # the retry was never sent: its charge came back


# ------------------------------------------------------------------------------ Retry-After on a 503


def test_a_503_retry_after_floors_that_tasks_backoff_without_pausing_the_lane() -> None:
    runtime = SimPyRuntime()
    provider = AlwaysFailing(
        runtime, ServerError("unavailable", status=503, retry_after_s=7.0), succeed_after=1
    )
    scheduler = Scheduler(
        runtime, [provider], retry=RetryPolicy(backoff=ConstantBackoff(delay_s=0.1), max_attempts=3)
    )

    async def body():
        handle = scheduler.submit("llm", {"input": "a"})
        await runtime.sleep(0.5)
        other = scheduler.submit("llm", {"input": "b"})  # another task is not held up by the 503
        return await handle.wait(), await other.wait()

    first, other = runtime.run(body())
    assert provider.calls == [0.0, 0.5, 7.0]
    assert first.status is TaskStatus.SUCCEEDED and first.updated_at == 7.0
    assert other.status is TaskStatus.SUCCEEDED


def test_a_503_retry_after_beyond_the_ceiling_fails_that_task_at_once() -> None:
    runtime = SimPyRuntime()
    error = ServerError("unavailable", status=503, retry_after_s=3600.0)
    scheduler = Scheduler(runtime, [AlwaysFailing(runtime, error)], retry=RetryPolicy(max_retry_after_s=300))

    async def body():
        return await scheduler.submit("llm", {"input": "a"}).wait()

    record = runtime.run(body())
    assert record.status is TaskStatus.FAILED and record.updated_at == 0.0
    assert "Retry-After 3600 s is longer than max_retry_after_s=300" in record.error


@pytest.mark.parametrize("bogus", [float("nan"), -1.0, float("inf"), "soon", True])
def test_a_bogus_retry_after_on_an_error_is_ignored(bogus) -> None:
    runtime = SimPyRuntime()
    error = ServerError("unavailable", status=503)
    error.retry_after_s = bogus
    provider = AlwaysFailing(runtime, error, succeed_after=1)
    scheduler = Scheduler(
        runtime, [provider], retry=RetryPolicy(backoff=ConstantBackoff(delay_s=0.5), max_attempts=3)
    )

    async def body():
        return await scheduler.submit("llm", {"input": "a"}).wait()

    record = runtime.run(body())
    assert record.status is TaskStatus.SUCCEEDED and provider.calls == [0.0, 0.5]
