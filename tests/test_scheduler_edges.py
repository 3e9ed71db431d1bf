"""Edge cases found in review: each ran differently (or hung) on one runtime before its fix.

Every test runs on both runtimes and asserts the same outcome, so a semantic difference between
asyncio and the SimPy driver shows up as a failure here.
"""

from __future__ import annotations

import pytest

from aiqsim import (
    ExponentialBackoff,
    MemoryStore,
    ProviderResponse,
    QuotaLimits,
    RetryPolicy,
    Scheduler,
    SimPyRuntime,
    TaskStatus,
)
from aiqsim.core.failures import ServerError
from tests.fakes import ScriptedProvider
from tests.runtimes import RUNTIMES, run_on

both = pytest.mark.parametrize("rt_name", RUNTIMES)


class GatedProvider:
    """Answers (or fails) exactly when the test opens the gate, so events can share one loop tick."""

    name = "llm"

    def __init__(self, runtime, fail_first: bool = False) -> None:
        self.runtime = runtime
        self.gate = None
        self.calls = 0
        self.fail_first = fail_first

    async def call(self, request):
        self.calls += 1
        if self.calls == 1:
            self.gate = self.runtime.create_future()
            await self.gate
            if self.fail_first:
                raise ServerError("boom", status=503)
            return ProviderResponse(result="answer")
        await self.runtime.sleep(5)
        return ProviderResponse(result="late answer")


@both
def test_a_caller_that_stops_waiting_does_not_break_the_task_or_its_duplicates(rt_name: str) -> None:
    async def body(rt):
        scheduler = Scheduler(rt, [ScriptedProvider(rt, latency_s=1.0)])
        owner = scheduler.submit("llm", {"input": "a"})
        duplicate = scheduler.submit("llm", {"input": "a"})
        with pytest.raises(TimeoutError):
            await rt.wait_for(owner.wait(), 0.2)  # the caller gives up; the task must not care
        await rt.wait_for(scheduler.join(), 100)  # ~1 s; the slack is for a loaded machine
        return (await owner.wait()).status, (await duplicate.wait()).status, scheduler.in_flight

    assert run_on(rt_name, body) == (TaskStatus.SUCCEEDED, TaskStatus.DEDUPED, 0)


@both
def test_a_cancel_in_the_same_tick_as_the_answer_still_cancels(rt_name: str) -> None:
    async def body(rt):
        provider = GatedProvider(rt)
        scheduler = Scheduler(rt, [provider])
        handle = scheduler.submit("llm", {"input": "a"})
        await rt.sleep(1)
        provider.gate.set_result(None)
        cancelled = scheduler.cancel(handle.id)
        return cancelled, (await handle.wait()).status

    assert run_on(rt_name, body) == (True, TaskStatus.CANCELLED)


@both
def test_a_cancel_in_the_same_tick_as_a_failure_stops_the_retries(rt_name: str) -> None:
    async def body(rt):
        provider = GatedProvider(rt, fail_first=True)
        retry = RetryPolicy(backoff=ExponentialBackoff(base_s=0.1, cap_s=1.0))
        scheduler = Scheduler(rt, [provider], retry=retry)
        handle = scheduler.submit("llm", {"input": "a"})
        await rt.sleep(1)
        provider.gate.set_result(None)
        scheduler.cancel(handle.id)
        record = await handle.wait()
        return record.status, provider.calls

    assert run_on(rt_name, body) == (TaskStatus.CANCELLED, 1)


@both
def test_close_stops_a_dispatcher_that_waits_for_tokens(rt_name: str) -> None:
    async def body(rt):
        scheduler = Scheduler(
            rt,
            [ScriptedProvider(rt, latency_s=1.0)],
            quotas={"llm": QuotaLimits(tokens_per_min=6, token_burst=10)},
        )
        scheduler.submit("llm", {"input": "a"}, cost_estimate=10)
        await rt.sleep(2)
        # ~98 s until the bucket refills: b is still waiting for tokens at close() on asyncio too
        # (at 1 token/s, a 70 ms stall of the loaded machine let b through before the close)
        waiting = scheduler.submit("llm", {"input": "b"}, cost_estimate=10)
        await rt.sleep(1)
        pump = scheduler._lanes["llm"].pump
        waiting_for_tokens = not pump.idle  # a timed retry is scheduled for when b's tokens are back
        await scheduler.close()
        await rt.sleep(20)
        return waiting_for_tokens, pump.stopped and pump.idle, (await waiting.wait()).status

    assert run_on(rt_name, body) == (True, True, TaskStatus.CANCELLED)


def sink_failing_on_done_of(task_input: str, ids: dict):
    """An event sink that raises on the success record of one task: an error after the answer.
    (A negative usage was the old way to get one; usage is now clamped, see test_usage_anomalies.)"""

    def sink(event) -> None:
        if getattr(event, "decision", None) == "done" and event.task_id == ids.get(task_input):
            raise RuntimeError("event sink broke")

    return sink


@both
def test_an_error_after_the_answer_fails_the_task_and_frees_its_slot(rt_name: str) -> None:
    async def body(rt):
        provider = ScriptedProvider(rt, latency_s=1.0)
        quotas = {"llm": QuotaLimits(concurrency=1, tokens_per_min=1000)}
        ids: dict = {}
        scheduler = Scheduler(rt, [provider], quotas=quotas, events=sink_failing_on_done_of("bad", ids))
        bad = scheduler.submit("llm", {"input": "bad"}, cost_estimate=10)
        ids["bad"] = bad.id
        good = scheduler.submit("llm", {"input": "good"}, cost_estimate=10)
        return (await bad.wait()).status, (await good.wait()).status, scheduler.quota("llm").in_flight

    assert run_on(rt_name, body) == (TaskStatus.FAILED, TaskStatus.SUCCEEDED, 0)


def test_a_recovered_task_too_big_for_the_new_quota_fails_alone() -> None:
    runtime = SimPyRuntime()
    store = MemoryStore()
    provider = ScriptedProvider(runtime)

    async def main():
        old_quota = {"llm": QuotaLimits(concurrency=1, tokens_per_min=6000, token_burst=1000)}
        old = Scheduler(runtime, [provider], store=store, quotas=old_quota)
        old.submit("llm", {"input": "a"}, cost_estimate=10)
        big = old.submit("llm", {"input": "big"}, cost_estimate=500)
        await runtime.sleep(0.5)
        old.crash()
        new_quota = {"llm": QuotaLimits(concurrency=1, tokens_per_min=6000, token_burst=100)}
        new = Scheduler(runtime, [provider], store=store, quotas=new_quota)
        await new.recover()
        small = new.submit("llm", {"input": "small"}, cost_estimate=10)
        await new.join()
        return store.get(big.id), store.get(small.id)

    big, small = runtime.run(main())
    assert big.status is TaskStatus.FAILED and "exceeds bucket capacity" in big.error
    assert small.status is TaskStatus.SUCCEEDED
    assert runtime.task_errors == []


class WaitGate:
    """A gate that asks every attempt to wait until t = 10 (as adaptive send rates do)."""

    def seconds_until_attempt(self, provider, is_retry, now):
        return max(0.0, 10.0 - now)

    def before_attempt(self, provider, is_retry, now, rng):
        return None

    def after_attempt(self, provider, is_retry, failure, error, now):
        pass


def test_cancelling_during_a_gate_wait_gives_back_everything_reserved() -> None:
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime)

    async def main():
        quotas = {
            "llm": QuotaLimits(requests_per_min=1, request_burst=1, tokens_per_min=1e-6, token_burst=100)
        }
        scheduler = Scheduler(runtime, [provider], gates=[WaitGate()], quotas=quotas)
        handle = scheduler.submit("llm", {"input": "a"}, cost_estimate=100)
        await runtime.sleep(1)
        scheduler.cancel(handle.id)
        record = await handle.wait()
        quota = scheduler.quota("llm")
        levels = quota.requests.level(runtime.now()), quota.tokens.level(runtime.now())
        return record, levels

    record, (requests, tokens) = runtime.run(main())
    assert record.status is TaskStatus.CANCELLED and record.attempts == 0
    assert requests == pytest.approx(1.0) and tokens == pytest.approx(100.0)
    assert provider.calls == []


def test_nonsense_settings_are_refused_rather_than_spinning() -> None:
    runtime = SimPyRuntime()
    with pytest.raises(ValueError, match="duplicate_poll_s"):
        Scheduler(runtime, [ScriptedProvider(runtime)], duplicate_poll_s=0)
    scheduler = Scheduler(
        runtime, [ScriptedProvider(runtime)], quotas={"llm": QuotaLimits(tokens_per_min=60)}
    )
    with pytest.raises(ValueError, match="finite"):
        scheduler.quota("llm").tokens.set_level(float("nan"), 0.0)


def test_a_dispatch_that_raises_is_reported_and_the_lane_goes_on() -> None:
    """An event sink that breaks on the first quota sample (emitted as the dispatch grants a task)
    makes that dispatch raise. It is reported under the lane's dispatcher name and the next wake-up
    dispatches again: both tasks finish. (As a coroutine, the dispatcher died with the error and its
    lane never started anything again.)"""
    from aiqsim.scheduler.events import QuotaSample

    runtime = SimPyRuntime()
    broke: list[float] = []

    def sink(event: object) -> None:
        if isinstance(event, QuotaSample) and not broke:
            broke.append(event.time)
            raise RuntimeError("event sink broke")

    async def body() -> list[TaskStatus]:
        scheduler = Scheduler(runtime, [ScriptedProvider(runtime, latency_s=1.0)], events=sink)
        first = scheduler.submit("llm", {"input": "a"}, cost_estimate=1)
        await runtime.sleep(5)
        second = scheduler.submit("llm", {"input": "b"}, cost_estimate=1)
        records = [await first.wait(), await second.wait()]
        await scheduler.close()
        return [record.status for record in records]

    assert runtime.run(runtime.wait_for(body(), 600)) == [TaskStatus.SUCCEEDED, TaskStatus.SUCCEEDED]
    assert [(name, str(error)) for name, error in runtime.task_errors] == [
        ("dispatch-llm", "event sink broke")
    ]


def sink_failing_on(status: str, task_input: str, ids: dict):
    """An event sink that raises on one task's transition to ``status``."""

    def sink(event) -> None:
        if getattr(event, "new", None) == status and event.task_id == ids.get(task_input, event.task_id):
            raise RuntimeError(f"event sink broke on {status}")

    return sink


@both
def test_a_sink_failing_on_queued_raises_from_submit_and_the_task_still_runs(rt_name: str) -> None:
    """The change a sink reports stands: the task was stored, so it is queued and runs; a second
    submission of its key finds it; nothing waits for ever (close() used to hang)."""

    async def body(rt):
        provider = ScriptedProvider(rt, latency_s=1.0)
        ids: dict = {}
        scheduler = Scheduler(rt, [provider], events=sink_failing_on("queued", "first", ids))
        ids["first"] = "first-id"
        with pytest.raises(RuntimeError, match="event sink broke on queued"):
            scheduler.submit("llm", {"input": "a"}, task_id="first-id")
        again = scheduler.submit("llm", {"input": "a"})
        record = await again.wait()
        await scheduler.close()
        return scheduler.store.get("first-id").status, record.status, record.deduped_from, len(provider.calls)

    assert run_on(rt_name, body) == (TaskStatus.SUCCEEDED, TaskStatus.DEDUPED, "first-id", 1)


async def bad_then_good(rt, provider, status: str) -> tuple[list, Scheduler]:
    """Tasks "bad" then "good" on one slot, with a sink that breaks on bad's ``status`` event;
    their records once both are done, and the closed scheduler."""
    ids: dict = {}
    quotas = {"llm": QuotaLimits(concurrency=1)}
    scheduler = Scheduler(rt, [provider], quotas=quotas, events=sink_failing_on(status, "bad", ids))
    bad = scheduler.submit("llm", {"input": "bad"})
    ids["bad"] = bad.id
    good = scheduler.submit("llm", {"input": "good"})
    records = [await bad.wait(), await good.wait()]
    await scheduler.close()
    return records, scheduler


@both
def test_a_sink_failing_on_running_fails_that_task_and_frees_its_slot(rt_name: str) -> None:
    async def body(rt):
        provider = ScriptedProvider(rt, latency_s=1.0)
        records, _ = await bad_then_good(rt, provider, "running")
        return [(r.status, r.error) for r in records], [name for _, name, _ in provider.calls]

    statuses, sent = run_on(rt_name, body)
    assert statuses == [
        (TaskStatus.FAILED, "RuntimeError: event sink broke on running"),
        (TaskStatus.SUCCEEDED, None),
    ]
    assert sent == ["good"]  # the failed task was never sent


@both
def test_a_sink_failing_on_a_terminal_event_leaves_the_outcome_delivered(rt_name: str) -> None:
    """The success is stored and stays; the submission resolves and the slot is free (both used to
    wait for ever); the error ends the attempt's coroutine, reported as the runtime reports those
    (SimPy: task_errors; asyncio: its exception handler, once the task is collected)."""

    async def body(rt):
        records, scheduler = await bad_then_good(rt, ScriptedProvider(rt, latency_s=1.0), "succeeded")
        stored = [scheduler.store.get(r.id).status for r in records]
        return [r.status for r in records], stored, [str(e) for _, e in getattr(rt, "task_errors", [])]

    statuses, stored, task_errors = run_on(rt_name, body)
    assert statuses == stored == [TaskStatus.SUCCEEDED, TaskStatus.SUCCEEDED]
    if rt_name != "asyncio":
        assert task_errors == ["event sink broke on succeeded"]


class NotAnException(BaseException):
    """What a buggy provider (or a library under it) may raise: a BaseException that is no Exception."""


@both
def test_a_provider_raising_a_base_exception_fails_its_task_and_the_lane_goes_on(rt_name: str) -> None:
    async def body(rt):
        provider = ScriptedProvider(rt, latency_s=1.0)
        original = provider.call

        async def call(request):
            if request.payload["input"] == "bad":
                raise NotAnException("deep in a library")
            return await original(request)

        provider.call = call  # type: ignore[method-assign]
        scheduler = Scheduler(rt, [provider], quotas={"llm": QuotaLimits(concurrency=1)})
        bad = scheduler.submit("llm", {"input": "bad"})
        good = scheduler.submit("llm", {"input": "good"})
        records = await bad.wait(), await good.wait()
        await scheduler.close()
        return [(r.status, r.error) for r in records], scheduler.quota("llm").in_flight

    records, in_flight = run_on(rt_name, body)
    assert records == [(TaskStatus.FAILED, "NotAnException: deep in a library"), (TaskStatus.SUCCEEDED, None)]
    assert in_flight == 0


def test_ctrl_c_in_a_provider_stops_a_simulation_instead_of_being_swallowed() -> None:
    """KeyboardInterrupt leaves SimPyRuntime.run() as it leaves an asyncio loop; it used to be kept in
    task_errors while the run went on (and Ctrl-C at the CLI was lost about half the time)."""
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0)
    original = provider.call

    async def call(request):
        await original(request)
        raise KeyboardInterrupt

    provider.call = call  # type: ignore[method-assign]

    async def main():
        scheduler = Scheduler(runtime, [provider])
        await scheduler.submit("llm", {"input": "a"}).wait()

    with pytest.raises(KeyboardInterrupt):
        runtime.run(main())
    assert runtime.now() == 1.0 and runtime.task_errors == []


@both
def test_a_provider_awaiting_another_loops_primitive_fails_its_attempt(rt_name: str) -> None:
    """A provider that awaits something its runtime cannot drive (an asyncio future on the SimPy
    runtime; a bare yield on asyncio): the error is thrown in at that await, as asyncio throws
    "Task got bad yield", so the attempt fails and frees its slot. On SimPy the task used to die
    with the error only in task_errors, leaving the task running and its lane stalled."""

    class Foreign:
        def __await__(self):
            yield "foreign"  # neither a SimPy event nor an asyncio future (None is asyncio's bare yield)

    async def body(rt):
        provider = ScriptedProvider(rt, latency_s=1.0)
        original = provider.call

        async def call(request):
            if request.payload["input"] == "bad":
                await Foreign()
            return await original(request)

        provider.call = call  # type: ignore[method-assign]
        retry = RetryPolicy(max_attempts=1)
        scheduler = Scheduler(rt, [provider], quotas={"llm": QuotaLimits(concurrency=1)}, retry=retry)
        bad = scheduler.submit("llm", {"input": "bad"})
        good = scheduler.submit("llm", {"input": "good"})
        records = await bad.wait(), await good.wait()
        await scheduler.close()
        errors = list(getattr(rt, "task_errors", ()))
        return [r.status for r in records], records[0].error, errors

    statuses, error, task_errors = run_on(rt_name, body)
    assert statuses == [TaskStatus.FAILED, TaskStatus.SUCCEEDED]
    assert error is not None and ("cannot await 'foreign'" in error or "bad yield" in error)
    assert task_errors == []


@both
@pytest.mark.parametrize("answer", [float("inf"), float("nan"), None, "soon", 10**400])
def test_a_gate_asking_an_impossible_wait_fails_the_attempt_not_the_lane(
    rt_name: str, answer: object
) -> None:
    """A gate whose seconds_until_attempt is not a finite number: the task fails naming the gate and
    the answer, and its slot is free (inf slept for ever holding the lane's only slot)."""

    class BrokenGate(WaitGate):
        def seconds_until_attempt(self, provider, is_retry, now):
            return answer if self.broken else 0.0

    async def body(rt):
        gate = BrokenGate()
        gate.broken = True
        provider = ScriptedProvider(rt, latency_s=1.0)
        scheduler = Scheduler(rt, [provider], gates=[gate], quotas={"llm": QuotaLimits(concurrency=1)})
        bad = await scheduler.submit("llm", {"input": "bad"}).wait()
        gate.broken = False
        good = await scheduler.submit("llm", {"input": "good"}).wait()
        await scheduler.close()
        return bad, good.status, [name for _, name, _ in provider.calls]

    bad, good, sent = run_on(rt_name, body)
    assert bad.status is TaskStatus.FAILED and "BrokenGate.seconds_until_attempt('llm') returned" in bad.error
    assert (good, sent) == (TaskStatus.SUCCEEDED, ["good"])


@both
def test_an_attempt_timeout_says_which_deadline_on_both_runtimes(rt_name: str) -> None:
    """asyncio's wait_for raises a TimeoutError without a message: the task's error was a bare
    'TimeoutError: ' there and 'timed out after 2 s (virtual)' on SimPy."""

    async def body(rt):
        provider = ScriptedProvider(rt, latency_s=1.0, script={"slow": ["hang"]})
        retry = RetryPolicy(max_attempts=1, attempt_timeout_s=2.0)
        scheduler = Scheduler(rt, [provider], retry=retry)
        record = await scheduler.submit("llm", {"input": "slow"}).wait()
        await scheduler.close()
        return record.status, record.error

    status, error = run_on(rt_name, body)
    assert status is TaskStatus.FAILED
    assert error.startswith("TimeoutError: provider 'llm': timed out after 2 s")
    assert "attempt_timeout_s=2" in error and "billed" in error


class OwnTimeout:
    """Raises a TimeoutError of its own (an SDK's read timeout) after 1 s."""

    name = "llm"

    def __init__(self, runtime) -> None:
        self.runtime = runtime

    async def call(self, request):
        await self.runtime.sleep(1.0)
        raise TimeoutError("read timeout from the SDK")


@both
def test_a_providers_own_timeout_error_is_not_called_the_attempt_timeout(rt_name: str) -> None:
    async def body(rt):
        scheduler = Scheduler(rt, [OwnTimeout(rt)], retry=RetryPolicy(max_attempts=1, attempt_timeout_s=60.0))
        record = await scheduler.submit("llm", {"input": "x"}).wait()
        await scheduler.close()
        return record.error

    assert run_on(rt_name, body) == "TimeoutError: read timeout from the SDK"


@both
def test_wait_for_says_its_own_deadline_passed_with_deadline_exceeded(rt_name: str) -> None:
    from aiqsim.runtime import DeadlineExceeded

    async def body(rt):
        async def own() -> None:
            raise TimeoutError("inner")

        outcomes = []
        for work in (rt.sleep(10), own()):
            try:
                await rt.wait_for(work, 1.0)
            except TimeoutError as error:
                outcomes.append(isinstance(error, DeadlineExceeded))
        return outcomes

    assert run_on(rt_name, body) == [True, False]  # the deadline's own, then the work's TimeoutError


@both
def test_cancelling_a_double_clicks_first_submission_leaves_the_second_to_send_the_key_again(
    rt_name: str,
) -> None:
    """The rule ``Scheduler.cancel`` documents: a waiting duplicate does not end with its cancelled
    owner; it takes the key over and sends it again, under the same idempotency key. Cancelling
    both ends the key's work."""

    async def body(rt):
        # the first call of each input never answers: only the cancellation ends it, however late
        # a loaded machine runs the test's sleeps
        provider = ScriptedProvider(rt, latency_s=2.0, script={"edit": ["hang", "ok"], "again": ["hang"]})
        scheduler = Scheduler(rt, [provider])
        first = scheduler.submit("llm", {"input": "edit"})
        second = scheduler.submit("llm", {"input": "edit"})
        await rt.sleep(1.0)
        scheduler.cancel(first.id)
        kept = await rt.wait_for(second.wait(), 100)
        ended = await first.wait()
        sent = [(at, name) for at, name, _ in provider.calls]
        third = scheduler.submit("llm", {"input": "again"})
        fourth = scheduler.submit("llm", {"input": "again"})
        await rt.sleep(1.0)
        scheduler.cancel(third.id)
        scheduler.cancel(fourth.id)
        both_ended = [(await h.wait()).status for h in (third, fourth)]
        await scheduler.close()
        return ended.status, kept.status, kept.result, sent, both_ended, provider.calls_for("again")

    ended, kept, result, sent, both_ended, again = run_on(rt_name, body)
    assert (ended, kept, result) == (TaskStatus.CANCELLED, TaskStatus.SUCCEEDED, {"output": "done:edit"})
    assert [name for _, name in sent] == ["edit", "edit"]
    assert sent[0][0] < sent[1][0] and sent[1][0] >= 1.0  # sent again once the first was cancelled
    assert both_ended == [TaskStatus.CANCELLED, TaskStatus.CANCELLED] and again == 1
