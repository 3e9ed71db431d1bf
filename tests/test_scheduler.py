"""Scheduler behaviour on the virtual clock: dedup, priorities, depth limit, SJF, aging, quotas."""

from __future__ import annotations

import random

import pytest

from aiqsim import (
    AgingShortestJobFirstPolicy,
    ExponentialBackoff,
    FifoPolicy,
    FullJitter,
    Priority,
    QueueFullError,
    QuotaConfigError,
    QuotaLimits,
    RetryPolicy,
    Scheduler,
    ShortestJobFirstPolicy,
    SimPyRuntime,
    TaskFailedError,
    TaskStatus,
)
from aiqsim.scheduler.events import AttemptRecord, TaskTransition
from tests.fakes import ScriptedProvider


def test_a_thousand_identical_submissions_make_one_provider_call() -> None:
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime)

    async def main():
        scheduler = Scheduler(runtime, [provider], interactive_limit=None)
        handles = [
            scheduler.submit("llm", {"input": "same", "n": 1}, priority=Priority.INTERACTIVE)
            for _ in range(1000)
        ]
        records = [await h.wait() for h in handles]
        late = await scheduler.submit("llm", {"n": 1, "input": "same"}).wait()  # dict order differs
        return records, late

    records, late = runtime.run(main())
    assert len(provider.calls) == 1
    statuses = [r.status for r in records]
    assert statuses.count(TaskStatus.SUCCEEDED) == 1
    assert statuses.count(TaskStatus.DEDUPED) == 999
    assert {str(r.result) for r in records} == {"{'output': 'done:same'}"}
    owner = next(r for r in records if r.status is TaskStatus.SUCCEEDED)
    assert all(r.deduped_from == owner.id for r in records if r.status is TaskStatus.DEDUPED)
    assert late.status is TaskStatus.DEDUPED and late.finished_at == late.created_at


def test_the_key_names_the_work_not_the_provider_as_docs_concepts_says() -> None:
    """docs/concepts.md: the key is (kind, version, params, input); the same work asked of a second
    provider is deduped, and a different ``version`` (the model) makes it a task of its own."""
    runtime = SimPyRuntime()
    first, second = ScriptedProvider(runtime, name="a"), ScriptedProvider(runtime, name="b")

    async def main():
        scheduler = Scheduler(runtime, [first, second])
        on_a = await scheduler.submit("summarize", {"input": "x"}, provider="a").wait()
        on_b = await scheduler.submit("summarize", {"input": "x"}, provider="b").wait()
        other_model = await scheduler.submit("summarize", {"input": "x"}, provider="b", version="m2").wait()
        return on_a, on_b, other_model

    on_a, on_b, other_model = runtime.run(main())
    assert (on_a.status, on_b.status, on_b.deduped_from) == (
        TaskStatus.SUCCEEDED,
        TaskStatus.DEDUPED,
        on_a.id,
    )
    assert other_model.status is TaskStatus.SUCCEEDED and other_model.key != on_a.key
    assert (len(first.calls), len(second.calls)) == (1, 1)


def test_a_duplicate_of_a_failed_run_shares_its_failure_without_a_second_call() -> None:
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, script={"bad": ["invalid"]})

    async def main():
        scheduler = Scheduler(runtime, [provider])
        first = scheduler.submit("llm", {"input": "bad"})
        second = scheduler.submit("llm", {"input": "bad"})
        with pytest.raises(TaskFailedError):
            await second
        return await first.wait(), await second.wait()

    first, second = runtime.run(main())
    assert first.status is TaskStatus.FAILED
    assert second.status is TaskStatus.DEDUPED and second.error == first.error
    assert provider.calls_for("bad") == 1


def test_interactive_work_overtakes_a_background_backlog_without_preemption() -> None:
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0)

    async def main():
        scheduler = Scheduler(runtime, [provider], quotas={"llm": QuotaLimits(concurrency=1)})
        background = [scheduler.submit("llm", {"input": f"bg{i}"}) for i in range(20)]
        await runtime.sleep(2.5)  # bg0, bg1 done; bg2 running
        urgent = scheduler.submit("llm", {"input": "urgent"}, priority=Priority.INTERACTIVE)
        record = await urgent.wait()
        for h in background:
            await h.wait()
        return record

    record = runtime.run(main())
    assert record.started_at == 3.0  # right after the running bg2 finished, ahead of 17 queued tasks
    assert record.finished_at == 4.0
    order = [name for _, name, _ in provider.calls]
    assert order[:4] == ["bg0", "bg1", "bg2", "urgent"]


def test_the_interactive_depth_limit_rejects_a_sixth_waiting_request_and_enqueues_nothing() -> None:
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime)

    async def main():
        scheduler = Scheduler(runtime, [provider], quotas={"llm": QuotaLimits(concurrency=1)})
        # the first starts at once on the free slot; the next five wait: the default limit
        handles = [
            scheduler.submit("llm", {"input": f"i{i}"}, priority=Priority.INTERACTIVE) for i in range(6)
        ]
        stored_before = len(scheduler.store)
        with pytest.raises(QueueFullError, match="too many interactive requests"):
            scheduler.submit("llm", {"input": "i6"}, priority=Priority.INTERACTIVE)
        assert len(scheduler.store) == stored_before
        duplicate = scheduler.submit(
            "llm", {"input": "i0"}, priority=Priority.INTERACTIVE
        )  # dups don't queue
        background = scheduler.submit("llm", {"input": "b"}, priority=Priority.BACKGROUND)
        for h in [*handles, duplicate, background]:
            await h.wait()
        later = scheduler.submit("llm", {"input": "i6"}, priority=Priority.INTERACTIVE)
        return await later.wait()

    assert runtime.run(main()).status is TaskStatus.SUCCEEDED
    assert provider.calls_for("i6") == 1


def _token_contention(policy, small_stream_until: float = 0.0):
    """A 100k-token job behind a 60k one, thirty 1k jobs behind it; 120k tokens/min."""
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=0.5)

    async def main():
        scheduler = Scheduler(
            runtime,
            [provider],
            quotas={"llm": QuotaLimits(tokens_per_min=120_000)},
            dispatch=policy,
            background_limit=None,
        )
        first = scheduler.submit("llm", {"input": "warmup"}, cost_estimate=60_000)
        big = scheduler.submit("llm", {"input": "big"}, cost_estimate=100_000)
        small = [scheduler.submit("llm", {"input": f"s{i}"}, cost_estimate=1_000) for i in range(30)]
        stream = []
        t = 0.0
        while t < small_stream_until:
            await runtime.sleep(0.5)
            t += 0.5
            stream.append(scheduler.submit("llm", {"input": f"late{t}"}, cost_estimate=1_000))
        await first.wait()
        records = [await h.wait() for h in small]
        for h in stream:
            await h.wait()
        return await big.wait(), records

    return runtime.run(main())


def test_sjf_lets_small_tasks_pass_a_large_one_that_fifo_blocks_on() -> None:
    big_fifo, small_fifo = _token_contention(FifoPolicy())
    big_sjf, small_sjf = _token_contention(ShortestJobFirstPolicy())
    # FIFO: the 100k job waits for the bucket to climb from 60k to 100k (20 s at 2k tokens/s);
    # every small job waits behind it.
    assert big_fifo.started_at == pytest.approx(20.0)
    assert min(r.started_at for r in small_fifo) >= big_fifo.started_at
    # SJF: the small jobs start at once from the 60k left; the large one waits for the refill.
    assert max(r.started_at for r in small_sjf) == pytest.approx(0.0)
    assert big_sjf.started_at == pytest.approx((100_000 - 30_000) / 2_000)
    mean = lambda rs: sum(r.finished_at - r.created_at for r in rs) / len(rs)  # noqa: E731
    assert mean(small_sjf) < mean(small_fifo) / 10


def test_aging_bounds_the_wait_of_a_large_task_that_plain_sjf_starves() -> None:
    # A stream of small jobs (2k tokens/s offered = the refill rate) keeps the bucket low for 200 s.
    big_sjf, _ = _token_contention(ShortestJobFirstPolicy(), small_stream_until=200.0)
    big_aged, _ = _token_contention(AgingShortestJobFirstPolicy(max_wait_s=10.0), small_stream_until=200.0)
    assert big_sjf.started_at > 150.0  # starved while the stream lasted
    refill_time = 100_000 / 2_000
    assert big_aged.started_at <= 10.0 + refill_time + 1e-9


def test_a_retry_after_pauses_the_provider_for_every_task_with_lane_scope() -> None:
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0, script={"x": ["429:10", "ok"]})

    async def main():
        retry = RetryPolicy(backoff=ExponentialBackoff(0.5, 4.0), rate_limit_scope="lane")
        scheduler = Scheduler(runtime, [provider], retry=retry)
        first = scheduler.submit("llm", {"input": "x"})
        await runtime.sleep(1.5)
        other = scheduler.submit("llm", {"input": "y"})
        return await first.wait(), await other.wait()

    first, other = runtime.run(main())
    assert other.started_at == 11.0  # not before the server's Retry-After expired
    assert first.attempts == 2 and first.finished_at == 12.0


@pytest.mark.parametrize(
    ("max_retry_after_s", "expected"),
    [
        # 1000 days asked: the task gives up at once and the lane is paused for the ceiling only
        (300.0, {"first": ("failed", 1, 1.0), "other_started": 301.0}),
        # no ceiling: everyone waits the full 1000 days, then the task retries and succeeds
        (None, {"first": ("succeeded", 2, 86_400_000 + 2.0), "other_started": 86_400_000 + 1.0}),
    ],
)
def test_a_retry_after_beyond_the_ceiling_fails_that_task_and_pauses_the_lane_for_the_ceiling(
    max_retry_after_s: float | None, expected: dict[str, object]
) -> None:
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0, script={"x": ["429:86400000", "ok"]})

    async def main():
        retry = RetryPolicy(
            backoff=ExponentialBackoff(0.5, 4.0), max_retry_after_s=max_retry_after_s, rate_limit_scope="lane"
        )
        scheduler = Scheduler(runtime, [provider], retry=retry)
        first = scheduler.submit("llm", {"input": "x"})
        await runtime.sleep(1.5)
        other = scheduler.submit("llm", {"input": "y"})
        return await first.wait(), await other.wait()

    first, other = runtime.run(main())
    assert (first.status.value, first.attempts, first.finished_at) == expected["first"]
    assert other.started_at == expected["other_started"]
    if max_retry_after_s is not None:
        assert first.error == (
            "RateLimitError: slow down (Retry-After 8.64e+07 s is longer than max_retry_after_s=300)"
        )


def test_retry_policy_checks_its_retry_after_ceiling() -> None:
    with pytest.raises(ValueError, match="max_retry_after_s must be > 0 or None"):
        RetryPolicy(max_retry_after_s=0)
    policy = RetryPolicy(max_retry_after_s=60)
    assert policy.retry_after_wait(None) == (None, False)
    assert policy.retry_after_wait(60.0) == (60.0, False)
    assert policy.retry_after_wait(61.0) == (60, True)
    assert RetryPolicy(honour_retry_after=False).retry_after_wait(10_000.0) == (None, False)


def test_cost_above_the_token_capacity_is_refused_at_submit() -> None:
    runtime = SimPyRuntime()

    async def main():
        scheduler = Scheduler(
            runtime, [ScriptedProvider(runtime)], quotas={"llm": QuotaLimits(tokens_per_min=1000)}
        )
        with pytest.raises(QuotaConfigError, match="exceeds bucket capacity"):
            scheduler.submit("llm", {"input": "huge"}, cost_estimate=5000)
        return len(scheduler.store)

    assert runtime.run(main()) == 0


def test_unknown_provider_is_a_clear_error() -> None:
    runtime = SimPyRuntime()

    async def main():
        scheduler = Scheduler(runtime, [ScriptedProvider(runtime)])
        with pytest.raises(ValueError, match="no provider named 'tts'"):
            scheduler.submit("tts", {"input": "x"})

    runtime.run(main())


def test_cancel_a_running_task_reaches_the_provider_call_and_frees_the_slot() -> None:
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0, script={"slow": ["hang"]})

    async def main():
        scheduler = Scheduler(runtime, [provider], quotas={"llm": QuotaLimits(concurrency=1)})
        slow = scheduler.submit("llm", {"input": "slow"})
        after = scheduler.submit("llm", {"input": "after"})
        await runtime.sleep(3)
        assert scheduler.cancel(slow.id)
        assert not scheduler.cancel(slow.id)  # second cancel is a no-op
        return await slow.wait(), await after.wait(), scheduler.quota("llm").in_flight

    slow, after, in_flight = runtime.run(main())
    assert slow.status is TaskStatus.CANCELLED and slow.finished_at == 3.0
    assert provider.cancelled == ["slow"]
    assert after.started_at == 3.0 and after.status is TaskStatus.SUCCEEDED
    assert in_flight == 0


def test_manual_retry_moves_a_failed_task_back_to_queued_and_runs_it() -> None:
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, script={"flaky": ["invalid", "ok"]})

    async def main():
        scheduler = Scheduler(runtime, [provider])
        failed = await scheduler.submit("llm", {"input": "flaky"}, task_id="job").wait()
        again = await scheduler.retry_failed("job").wait()
        return failed, again

    failed, again = runtime.run(main())
    assert failed.status is TaskStatus.FAILED
    assert again.id == "job" and again.status is TaskStatus.SUCCEEDED and again.attempts == 2


def test_retries_stop_at_max_attempts() -> None:
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, script={"down": ["500"]})

    async def main():
        scheduler = Scheduler(
            runtime, [provider], retry=RetryPolicy(backoff=ExponentialBackoff(1, 4), max_attempts=4)
        )
        return await scheduler.submit("llm", {"input": "down"}).wait()

    record = runtime.run(main())
    assert record.status is TaskStatus.FAILED and record.attempts == 4
    # attempts at 0, 2, 5, 10: latency 1 s, then waits 1, 2, 4 (exponential, base 1, cap 4)
    assert [t for t, _, _ in provider.calls] == [0.0, 2.0, 5.0, 10.0]


def _storm_events(seed: int):
    runtime = SimPyRuntime()
    rng = random.Random(seed)
    script = {
        f"in{i}": [rng.choice(["ok", "429:1", "500", "timeout"]) for _ in range(4)] + ["ok"]
        for i in range(60)
    }
    provider = ScriptedProvider(runtime, latency_s=0.3, script=script)
    events = []

    async def main():
        scheduler = Scheduler(
            runtime,
            [provider],
            quotas={"llm": QuotaLimits(requests_per_min=120, concurrency=4)},
            retry=RetryPolicy(backoff=FullJitter(0.2, 5.0), max_attempts=6),
            rng=random.Random(seed),
            events=events.append,
            background_limit=None,
        )
        handles = []
        for i in range(60):
            await runtime.sleep(rng.expovariate(5.0))
            handles.append(scheduler.submit("llm", {"input": f"in{i % 45}"}))
        for h in handles:
            await h.wait()

    runtime.run(main())
    return events


def test_same_seed_gives_an_identical_event_stream() -> None:
    first, second = _storm_events(3), _storm_events(3)
    assert first == second
    assert any(isinstance(e, AttemptRecord) and e.decision == "retry" for e in first)
    assert any(isinstance(e, TaskTransition) and e.new == "deduped" for e in first)
    assert _storm_events(4) != first
