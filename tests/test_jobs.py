"""Jobs (pipelines of stages) on the production scheduler, on the SimPy clock with exact times.

Each provider here is a :class:`ScriptedProvider` with a fixed latency, so every completion time
is known in advance: n independent stages end with the slowest, a chain ends at the sum, a fan-out
on two slots ends after ceil(n/2) latencies.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from aiqsim import (
    ExponentialBackoff,
    JobCancelledError,
    JobFailedError,
    JobSpec,
    JobSpecError,
    JobStatus,
    Priority,
    QueueFullError,
    QuotaLimits,
    RetryPolicy,
    Scheduler,
    SimPyRuntime,
    Stage,
    TaskStatus,
    derive_job_status,
)
from aiqsim.core.errors import ConfigurationError
from aiqsim.scheduler.job_events import JobTransition, StageEvent
from aiqsim.stores import MemoryStore
from tests.fakes import ScriptedProvider

RETRY = RetryPolicy(backoff=ExponentialBackoff(base_s=1.0, cap_s=8.0), max_attempts=3, attempt_timeout_s=100)


def named(name: str):
    """A build that sends ``{"input": <name>:<job input>}``: each stage's payload names its stage."""

    def build(inputs: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
        return {"input": f"{name}:{inputs['x']}"}

    build.__qualname__ = f"named.{name}"
    return build


def providers(runtime, latencies: dict[str, float], scripts=None):
    """One scripted provider per name; ``scripts`` maps a provider name to its script."""
    return {
        name: ScriptedProvider(runtime, name=name, latency_s=latency, script=(scripts or {}).get(name, {}))
        for name, latency in latencies.items()
    }


def make_scheduler(runtime, provs, **kwargs) -> Scheduler:
    kwargs.setdefault("retry", RETRY)
    kwargs.setdefault("rng", random.Random(3))
    return Scheduler(runtime, list(provs.values()), **kwargs)


def run(body):
    runtime = SimPyRuntime()
    return runtime.run(body(runtime))


# ---------------------------------------------------------------------------- shape and timing
def test_independent_stages_finish_with_the_slowest_not_their_sum() -> None:
    spec = JobSpec("fan", "1", [Stage(n, n, build=named(n)) for n in ("a", "b", "c")])

    async def body(runtime):
        provs = providers(runtime, {"a": 1.0, "b": 2.5, "c": 4.0})
        scheduler = make_scheduler(runtime, provs)
        handle = scheduler.submit_job(spec, {"x": 1})
        results = await handle
        return results, await handle.wait(), provs

    results, record, provs = run(body)
    assert record.status is JobStatus.SUCCEEDED
    assert record.finished_at == pytest.approx(4.0)  # max(1, 2.5, 4), not 7.5
    assert results == {n: {"output": f"done:{n}:1"} for n in "abc"}
    assert [call[0] for p in provs.values() for call in p.calls] == [0.0, 0.0, 0.0]


def test_n_independent_stages_on_one_unconstrained_provider_run_at_once() -> None:
    spec = JobSpec("wide", "1", [Stage(f"s{i}", "llm", build=named(f"s{i}")) for i in range(6)])

    async def body(runtime):
        provs = providers(runtime, {"llm": 2.0})
        handle = make_scheduler(runtime, provs).submit_job(spec, {"x": 0})
        return await handle.wait()

    record = run(body)
    assert record.status is JobStatus.SUCCEEDED and record.finished_at == pytest.approx(2.0)


def test_a_chain_finishes_in_the_sum_of_its_stages_and_feeds_results_forward() -> None:
    def script(inputs, results):
        return {"input": f"script-for-{results['video']['output']}"}

    def tts(inputs, results):
        return {"input": f"voice-{results['script']['output']}"}

    spec = JobSpec(
        "chain",
        "1",
        [
            Stage("video", "vision", build=named("video")),
            Stage("script", "llm", after=("video",), build=script),
            Stage("tts", "tts", after=["script"], build=tts),
        ],
    )

    async def body(runtime):
        provs = providers(runtime, {"vision": 1.5, "llm": 2.0, "tts": 3.0})
        handle = make_scheduler(runtime, provs).submit_job(spec, {"x": "clip"})
        return await handle, await handle.wait(), provs

    results, record, provs = run(body)
    assert record.finished_at == pytest.approx(6.5)
    assert record.started_at == pytest.approx(0.0)
    assert results["tts"] == {"output": "done:voice-done:script-for-done:video:clip"}
    assert [c[0] for c in provs["tts"].calls] == [pytest.approx(3.5)]


def test_fan_out_runs_one_task_per_element_and_keeps_their_order() -> None:
    def paragraphs(inputs, results):
        return [{"input": f"p{i}"} for i in range(5)]

    spec = JobSpec("tts", "1", [Stage("speak", "tts", build=paragraphs, fan_out=True, cost=1)])

    async def body(runtime):
        provs = providers(runtime, {"tts": 1.0})
        scheduler = make_scheduler(runtime, provs, quotas={"tts": QuotaLimits(concurrency=2)})
        handle = scheduler.submit_job(spec, {"x": 0})
        return await handle, await handle.wait(), scheduler

    results, record, scheduler = run(body)
    assert results["speak"] == [{"output": f"done:p{i}"} for i in range(5)]
    assert record.finished_at == pytest.approx(3.0)  # 5 calls on 2 slots: 3 rounds of 1 s
    assert len(record.stage_tasks["speak"]) == 5
    tasks = [scheduler.store.get(task_id) for task_id in record.stage_tasks["speak"]]
    assert [t.payload["input"] for t in tasks] == [f"p{i}" for i in range(5)]


# ---------------------------------------------------------------------------- failure and fallback
def test_a_fatal_stage_fails_the_job_naming_the_stage_and_the_reason() -> None:
    spec = JobSpec(
        "f",
        "1",
        [Stage("a", "a", build=named("a")), Stage("b", "b", after=("a",), build=named("b"))],
    )

    async def body(runtime):
        provs = providers(runtime, {"a": 1.0, "b": 1.0}, scripts={"a": {"a:1": ["invalid"]}})
        handle = make_scheduler(runtime, provs).submit_job(spec, {"x": 1})
        with pytest.raises(JobFailedError) as raised:
            await handle
        return raised.value, await handle.wait(), provs

    error, record, provs = run(body)
    assert record.status is JobStatus.FAILED and record.failed_stage == "a" and error.stage == "a"
    assert record.error.startswith("stage 'a' failed: InvalidRequestError")
    assert record.finished_at == pytest.approx(1.0)
    assert provs["b"].calls == []  # the later stage never ran


def test_a_failed_stage_takes_its_fallback_provider() -> None:
    spec = JobSpec("fb", "1", [Stage("tts", "tts", build=named("tts"), fallback="tts_backup")])

    async def body(runtime):
        provs = providers(runtime, {"tts": 1.0, "tts_backup": 2.0}, scripts={"tts": {"tts:1": ["invalid"]}})
        scheduler = make_scheduler(runtime, provs, events=(events := []).append)
        handle = scheduler.submit_job(spec, {"x": 1})
        return await handle, await handle.wait(), events

    results, record, events = run(body)
    assert record.status is JobStatus.SUCCEEDED and record.finished_at == pytest.approx(3.0)
    assert results == {"tts": {"output": "done:tts:1"}}  # the backup's answer (same payload)
    assert len(record.stage_tasks["tts"]) == 2  # the failed primary, then the fallback
    assert [e.event for e in events if isinstance(e, StageEvent)] == ["submitted", "fallback", "succeeded"]


def test_a_fan_out_falls_back_only_for_the_elements_that_failed_and_says_when_both_fail() -> None:
    def parts(inputs, results):
        return [{"input": f"q{i}"} for i in range(3)]

    spec = JobSpec(
        "fb2", "1", [Stage("s", "main", build=parts, fan_out=True, fallback=Stage("backup", "alt"))]
    )

    async def body(runtime, scripts):
        provs = providers(runtime, {"main": 1.0, "alt": 1.0}, scripts=scripts)
        handle = make_scheduler(runtime, provs).submit_job(spec, {"x": 1})
        return await handle.wait(), provs

    runtime = SimPyRuntime()
    record, provs = runtime.run(body(runtime, {"main": {"q1": ["invalid"]}}))
    assert record.status is JobStatus.SUCCEEDED
    assert [name for _, name, _ in provs["alt"].calls] == ["q1"]
    assert record.results["s"] == [{"output": f"done:q{i}"} for i in range(3)]
    runtime = SimPyRuntime()
    record, provs = runtime.run(body(runtime, {"main": {"q2": ["invalid"]}, "alt": {"q2": ["invalid"]}}))
    assert record.status is JobStatus.FAILED and record.failed_stage == "s"
    assert "InvalidRequestError" in record.error and "fallback 'alt' failed too" in record.error


def test_a_build_that_raises_fails_the_job_with_its_error() -> None:
    def broken(inputs, results):
        raise KeyError("paragraphs")

    spec = JobSpec("b", "1", [Stage("s", "llm", build=broken)])

    async def body(runtime):
        scheduler = make_scheduler(runtime, providers(runtime, {"llm": 1.0}))
        handle = scheduler.submit_job(spec, {"x": 1})
        assert handle.done()  # failed inside submit_job: nothing was sent
        record = await handle.wait()
        await runtime.sleep(0)  # let the dispatchers start, so that closing stops running coroutines
        await scheduler.close()
        return record

    record = run(body)
    assert (
        record.status is JobStatus.FAILED
        and record.error == "stage 's' failed: build raised KeyError: 'paragraphs'"
    )


# ---------------------------------------------------------------------------- cancellation
def test_cancelling_a_job_cancels_its_running_and_queued_stage_tasks() -> None:
    def many(inputs, results):
        return [{"input": f"m{i}"} for i in range(3)]

    spec = JobSpec(
        "c",
        "1",
        [
            Stage("one", "llm", build=many, fan_out=True),
            Stage("two", "llm", after=("one",), build=named("two")),
        ],
    )

    async def body(runtime):
        provs = providers(runtime, {"llm": 2.0})
        scheduler = make_scheduler(runtime, provs, quotas={"llm": QuotaLimits(concurrency=1)})
        handle = scheduler.submit_job(spec, {"x": 1})
        await runtime.sleep(1.0)  # m0 running, m1 and m2 queued
        assert handle.cancel()
        assert not handle.cancel()  # already cancelled
        with pytest.raises(JobCancelledError):
            await handle
        record = await handle.wait()
        await runtime.sleep(10)  # the running call receives its cancellation at its next await
        tasks = [scheduler.store.get(t) for t in record.stage_tasks["one"]]
        return record, tasks, provs["llm"], scheduler

    record, tasks, provider, scheduler = run(body)
    assert record.status is JobStatus.CANCELLED and record.finished_at == pytest.approx(1.0)
    assert [(t.status, t.attempts) for t in tasks] == [
        (TaskStatus.CANCELLED, 1),
        (TaskStatus.CANCELLED, 0),
        (TaskStatus.CANCELLED, 0),
    ]
    assert provider.cancelled == ["m0"] and [name for _, name, _ in provider.calls] == ["m0"]
    assert scheduler.in_flight == 0 and scheduler.jobs.in_flight == 0


# ---------------------------------------------------------------------------- idempotency
def test_a_duplicate_job_waits_for_the_one_in_flight_and_one_after_it_dedups() -> None:
    spec = JobSpec(
        "d", "1", [Stage("a", "a", build=named("a")), Stage("b", "b", after=("a",), build=named("b"))]
    )

    async def body(runtime):
        provs = providers(runtime, {"a": 1.0, "b": 1.0})
        scheduler = make_scheduler(runtime, provs)
        first = scheduler.submit_job(spec, {"x": 7}, job_id="first")
        await runtime.sleep(0.5)
        second = scheduler.submit_job(spec, {"x": 7}, job_id="second")  # the double click
        other = scheduler.submit_job(spec, {"x": 8}, job_id="other")  # different input: its own job
        records = [await h.wait() for h in (first, second, other)]
        third = await scheduler.submit_job(spec, {"x": 7}, job_id="third").wait()
        return [*records, third], provs, await second

    (first, second, other, third), provs, second_results = run(body)
    assert first.status is JobStatus.SUCCEEDED and first.finished_at == pytest.approx(2.0)
    assert second.status is JobStatus.DEDUPED and second.deduped_from == "first"
    assert second.finished_at == pytest.approx(2.0) and second_results == first.results
    assert other.status is JobStatus.SUCCEEDED and other.key != first.key
    assert third.status is JobStatus.DEDUPED and third.finished_at == pytest.approx(2.5)
    assert [name for _, name, _ in provs["a"].calls] == ["a:7", "a:8"]  # one call per distinct stage


def test_resubmitting_a_failed_job_reuses_finished_stages_and_bills_only_the_rest() -> None:
    spec = JobSpec(
        "r", "1", [Stage("a", "a", build=named("a")), Stage("b", "b", after=("a",), build=named("b"))]
    )

    async def body(runtime):
        provs = providers(runtime, {"a": 1.0, "b": 1.0}, scripts={"b": {"b:1": ["invalid", "ok"]}})
        scheduler = make_scheduler(runtime, provs)
        failed = await scheduler.submit_job(spec, {"x": 1}).wait()
        again = scheduler.submit_job(spec, {"x": 1})
        return failed, await again.wait(), provs, scheduler

    failed, again, provs, scheduler = run(body)
    assert failed.status is JobStatus.FAILED and failed.failed_stage == "b"
    assert again.status is JobStatus.SUCCEEDED and again.key == failed.key
    assert again.finished_at - again.created_at == pytest.approx(1.0)  # only b ran again
    assert len(provs["a"].calls) == 1 and len(provs["b"].calls) == 2
    reused = scheduler.store.get(again.stage_tasks["a"][0])
    assert reused.status is TaskStatus.DEDUPED and reused.deduped_from == failed.stage_tasks["a"][0]


def test_the_job_key_depends_on_the_definition_and_inputs_only() -> None:
    one = JobSpec("k", "1", [Stage("a", "a", build=named("a"))])
    same = JobSpec("k", "1", [Stage("a", "a", build=named("a"), cost=5)])  # cost does not change output
    other_build = JobSpec("k", "1", [Stage("a", "a", build=named("z"))])
    other_version = JobSpec("k", "2", [Stage("a", "a", build=named("a"))])
    assert one.key({"x": 1, "y": 2}) == same.key({"y": 2, "x": 1})
    assert (
        len({one.key({"x": 1}), other_build.key({"x": 1}), other_version.key({"x": 1}), one.key({"x": 2})})
        == 4
    )


# ---------------------------------------------------------------------------- priority and depth
def test_every_stage_of_an_interactive_job_goes_ahead_of_queued_background_work() -> None:
    spec = JobSpec(
        "i", "1", [Stage("a", "llm", build=named("a")), Stage("b", "llm", after=("a",), build=named("b"))]
    )

    async def body(runtime):
        provs = providers(runtime, {"llm": 1.0})
        scheduler = make_scheduler(runtime, provs, quotas={"llm": QuotaLimits(concurrency=1)})
        background = [scheduler.submit("llm", {"input": f"bg{i}"}) for i in range(4)]
        await runtime.sleep(0.5)
        job = scheduler.submit_job(spec, {"x": 1}, priority=Priority.INTERACTIVE)
        record = await job.wait()
        for submission in background:
            await submission.wait()
        return record, provs["llm"]

    record, provider = run(body)
    assert [name for _, name, _ in provider.calls] == ["bg0", "a:1", "b:1", "bg1", "bg2", "bg3"]
    assert record.finished_at == pytest.approx(3.0)


def test_the_depth_limit_counts_a_job_once_however_many_stage_tasks_it_has_queued() -> None:
    def wide(inputs, results):
        return [{"input": f"{inputs['x']}-{i}"} for i in range(6)]

    spec = JobSpec("w", "1", [Stage("s", "llm", build=wide, fan_out=True)])

    async def body(runtime):
        provs = providers(runtime, {"llm": 1.0})
        scheduler = make_scheduler(
            runtime, provs, quotas={"llm": QuotaLimits(concurrency=1)}, interactive_limit=3
        )
        interactive = Priority.INTERACTIVE
        blocker = scheduler.submit("llm", {"input": "blocker"}, priority=interactive)
        await runtime.sleep(0.1)  # the blocker runs; nothing is queued
        first = scheduler.submit_job(spec, {"x": "j1"}, priority=interactive)
        second = scheduler.submit_job(spec, {"x": "j2"}, priority=interactive)
        await runtime.sleep(0.1)  # both jobs have 6 stage tasks queued each: 12 tasks, 2 jobs
        depth = scheduler.jobs.depth(interactive)
        queued_tasks = scheduler.queued(interactive)
        plain = scheduler.submit("llm", {"input": "plain"}, priority=interactive)  # the third place
        with pytest.raises(QueueFullError):
            scheduler.submit_job(spec, {"x": "j3"}, priority=interactive)
        with pytest.raises(QueueFullError):
            scheduler.submit("llm", {"input": "plain2"}, priority=interactive)
        duplicate = scheduler.submit_job(spec, {"x": "j1"}, priority=interactive)  # waits: not refused
        assert scheduler.jobs.depth(interactive) == 3  # ... and, waiting, holds no place
        records = [await h.wait() for h in (first, second, duplicate)]
        await blocker.wait()
        await plain.wait()
        return depth, queued_tasks, records

    depth, queued_tasks, records = run(body)
    assert (depth, queued_tasks) == (2, 12)
    assert [r.status for r in records] == [JobStatus.SUCCEEDED, JobStatus.SUCCEEDED, JobStatus.DEDUPED]


# ---------------------------------------------------------------------------- spec checks
@pytest.mark.parametrize(
    ("stages", "message"),
    [
        ([], "at least one stage"),
        ([Stage("a", "llm"), Stage("a", "llm")], "two stages are named 'a'"),
        ([Stage("a", "llm", after=("nope",))], "unknown stage 'nope'"),
        ([Stage("a", "llm", after=("b",)), Stage("b", "llm", after=("a",))], "form a cycle"),
    ],
)
def test_invalid_specs_are_refused_before_anything_runs(stages, message) -> None:
    with pytest.raises(JobSpecError, match=message) as raised:
        JobSpec("bad", "1", stages)
    assert isinstance(raised.value, ConfigurationError) and isinstance(raised.value, ValueError)


def test_a_spec_naming_an_unknown_provider_or_reusing_a_version_is_refused_at_submission() -> None:
    async def body(runtime):
        scheduler = make_scheduler(runtime, providers(runtime, {"llm": 1.0}))
        with pytest.raises(JobSpecError, match=r"provider\(s\) \['tts'\]"):
            scheduler.submit_job(JobSpec("p", "1", [Stage("a", "llm", fallback="tts")]), {"x": 1})
        await scheduler.submit_job(JobSpec("v", "1", [Stage("a", "llm", build=named("a"))]), {"x": 1})
        with pytest.raises(JobSpecError, match="new version"):
            scheduler.submit_job(JobSpec("v", "1", [Stage("a", "llm", build=named("b"))]), {"x": 1})
        assert scheduler.store.list_jobs() and len(scheduler.store.list_jobs()) == 1

    run(body)


def test_job_transitions_and_stage_events_reach_the_event_sink() -> None:
    spec = JobSpec("e", "1", [Stage("a", "llm", build=named("a"))])

    async def body(runtime):
        events = []
        scheduler = make_scheduler(runtime, providers(runtime, {"llm": 1.0}), events=events.append)
        await scheduler.submit_job(spec, {"x": 1}, job_id="j")
        return events

    events = run(body)
    moves = [(e.time, e.old, e.new) for e in events if isinstance(e, JobTransition)]
    assert moves == [(0.0, None, "queued"), (0.0, "queued", "running"), (1.0, "running", "succeeded")]


def test_stage_states_read_from_the_task_records_give_the_derived_job_state() -> None:
    def many(inputs, results):
        return [{"input": f"m{i}"} for i in range(3)]

    spec = JobSpec(
        "s",
        "1",
        [
            Stage("one", "llm", build=many, fan_out=True),
            Stage("two", "llm", after=("one",), build=named("two")),
        ],
    )

    async def body(runtime):
        provs = providers(runtime, {"llm": 1.0})
        scheduler = make_scheduler(runtime, provs, quotas={"llm": QuotaLimits(concurrency=1)})
        handle = scheduler.submit_job(spec, {"x": 1}, job_id="j")
        await runtime.sleep(0.5)
        early = scheduler.jobs.stage_states("j")
        await runtime.sleep(3.0)  # the fan-out is done at 3.0, "two" runs 3.0-4.0
        later = scheduler.jobs.stage_states("j")
        await handle.wait()
        return early, later, scheduler.jobs.stage_states("j"), scheduler.jobs.get("j")

    early, later, end, record = run(body)
    assert early == {"one": TaskStatus.RUNNING, "two": None}
    assert later == {"one": TaskStatus.SUCCEEDED, "two": TaskStatus.RUNNING}
    assert end == {"one": TaskStatus.SUCCEEDED, "two": TaskStatus.SUCCEEDED}
    assert [derive_job_status(s) for s in (early, later, end)] == [TaskStatus.RUNNING] * 2 + [
        TaskStatus.SUCCEEDED
    ]
    assert record.status is JobStatus.SUCCEEDED


def test_a_stage_retry_policy_replaces_the_schedulers_for_its_tasks_only() -> None:
    def payload(name):
        def build(inputs, results):
            return {"input": name}

        build.__qualname__ = f"payload.{name}"
        return build

    once = RetryPolicy(backoff=ExponentialBackoff(base_s=1.0, cap_s=8.0), max_attempts=1)
    spec = JobSpec(
        "retry",
        "1",
        [
            Stage("patient", "llm", build=payload("p")),  # the scheduler's policy: 3 attempts
            Stage("impatient", "llm", build=payload("i"), retry=once, fallback="backup"),
        ],
    )

    async def body(runtime):
        scripts = {"llm": {"p": ["500", "ok"], "i": ["500", "ok"]}}
        provs = providers(runtime, {"llm": 1.0, "backup": 1.0}, scripts=scripts)
        record = await make_scheduler(runtime, provs).submit_job(spec, {"x": 1}).wait()
        return record, provs

    record, provs = run(body)
    assert record.status is JobStatus.SUCCEEDED
    assert [name for _, name, _ in provs["llm"].calls].count("p") == 2  # retried after 1 s
    assert [name for _, name, _ in provs["llm"].calls].count("i") == 1  # no retry: straight to the fallback
    assert [name for _, name, _ in provs["backup"].calls] == ["i"]
    assert record.finished_at == pytest.approx(3.0)  # p: 0-1, backoff 1 s, 2-3; i: 0-1, backup 1-2


def test_a_duplicate_of_a_job_another_process_runs_waits_for_it_through_the_store() -> None:
    spec = JobSpec("x", "1", [Stage("a", "llm", build=named("a"))])

    async def body(runtime):
        store = MemoryStore()  # shared, as two processes share one SQLite file
        provs_one = providers(runtime, {"llm": 2.0})
        provs_two = providers(runtime, {"llm": 2.0})
        one = make_scheduler(runtime, provs_one, store=store, duplicate_poll_s=0.25, worker_id="one")
        two = make_scheduler(runtime, provs_two, store=store, duplicate_poll_s=0.25, worker_id="two")
        first = one.submit_job(spec, {"x": 1}, job_id="first")
        await runtime.sleep(0.1)
        second = two.submit_job(spec, {"x": 1}, job_id="second")  # the owner is in the other process
        cancelled = one.submit_job(spec, {"x": 2}, job_id="cancelled")
        await runtime.sleep(0.1)
        takeover = two.submit_job(spec, {"x": 2}, job_id="takeover")
        await runtime.sleep(0.1)
        cancelled.cancel()  # the owner is cancelled: the waiting duplicate takes its key over
        return [await h.wait() for h in (first, second, cancelled, takeover)], provs_one, provs_two

    (first, second, cancelled, takeover), provs_one, provs_two = run(body)
    assert first.status is JobStatus.SUCCEEDED and first.finished_at == pytest.approx(2.0)
    assert second.status is JobStatus.DEDUPED and second.deduped_from == "first"
    assert second.finished_at == pytest.approx(2.0 + 0.1)  # seen at the next poll after 2.0 (0.1 + 8 x 0.25)
    assert cancelled.status is JobStatus.CANCELLED
    assert takeover.status is JobStatus.SUCCEEDED  # ran in process two after the cancel was seen
    assert [name for _, name, _ in provs_one["llm"].calls] == ["a:1", "a:2"]  # a:2 cancelled while running
    assert [name for _, name, _ in provs_two["llm"].calls] == ["a:2"]


def test_a_stage_running_its_fallback_shows_running_not_failed() -> None:
    spec = JobSpec("sf", "1", [Stage("tts", "tts", build=named("tts"), fallback="tts_backup")])

    async def body(runtime):
        provs = providers(runtime, {"tts": 1.0, "tts_backup": 2.0}, scripts={"tts": {"tts:1": ["invalid"]}})
        scheduler = make_scheduler(runtime, provs)
        handle = scheduler.submit_job(spec, {"x": 1}, job_id="j")
        await runtime.sleep(1.5)  # the primary failed at 1.0; the backup runs 1.0-3.0
        during = scheduler.jobs.stage_states("j")
        await handle.wait()
        return during, scheduler.jobs.stage_states("j")

    during, after = run(body)
    assert during == {"tts": TaskStatus.RUNNING}
    assert after == {"tts": TaskStatus.SUCCEEDED}


def test_an_empty_fan_out_succeeds_at_once_with_an_empty_list_and_feeds_the_next_stage() -> None:
    def nothing(inputs, results):
        return []

    def count(inputs, results):
        return {"input": f"count:{len(results['parts'])}"}

    spec = JobSpec(
        "e0",
        "1",
        [
            Stage("parts", "tts", build=nothing, fan_out=True),
            Stage("n", "llm", after=("parts",), build=count),
        ],
    )

    async def body(runtime):
        provs = providers(runtime, {"tts": 1.0, "llm": 1.0})
        return await make_scheduler(runtime, provs).submit_job(spec, {"x": 1}).wait(), provs

    record, provs = run(body)
    assert record.status is JobStatus.SUCCEEDED and record.finished_at == pytest.approx(1.0)
    assert record.results == {"parts": [], "n": {"output": "done:count:0"}}
    assert provs["tts"].calls == []


def _named_build(name: str) -> Any:
    def build(inputs: Any, results: Any) -> dict:
        return {"input": f"{name}:{inputs['x']}"}

    build.__qualname__ = f"build_{name}"
    return build


@pytest.mark.parametrize("breaks_on", ["job queued", "stage b submitted", "job succeeded"])
def test_a_sink_failing_on_a_job_event_is_reported_and_the_job_goes_on(breaks_on: str) -> None:
    """The job's events are sent in the middle of its steps: a sink raising there left the job
    stored but never run, its stage tasks named but never submitted, or finished but never resolved
    (each with its double clicks waiting for ever). The error is now reported as a failing callback."""
    spec = JobSpec(
        "pipeline",
        "1",
        [Stage("a", "a", build=_named_build("a")), Stage("b", "b", after=("a",), build=_named_build("b"))],
    )
    runtime = SimPyRuntime()
    armed = [True]

    def sink(event: Any) -> None:
        hit = {
            "job queued": isinstance(event, JobTransition) and event.new == "queued",
            "stage b submitted": isinstance(event, StageEvent)
            and (event.stage, event.event) == ("b", "submitted"),
            "job succeeded": isinstance(event, JobTransition) and event.new == "succeeded",
        }[breaks_on]
        if hit and armed[0]:
            armed[0] = False
            raise RuntimeError("event sink broke")

    async def body() -> tuple:
        providers = [ScriptedProvider(runtime, name=name) for name in "ab"]
        scheduler = Scheduler(runtime, providers, events=sink, rng=random.Random(3))
        first = await runtime.wait_for(scheduler.submit_job(spec, {"x": 1}).wait(), 100)
        again = await runtime.wait_for(scheduler.submit_job(spec, {"x": 1}).wait(), 100)
        return first.status, list(first.results), again.status, scheduler.jobs.in_flight

    assert runtime.run(body()) == (TaskStatus.SUCCEEDED, ["a", "b"], TaskStatus.DEDUPED, 0)
    assert [(name, str(error)) for name, error in runtime.task_errors] == [
        (f"job event sink ({'StageEvent' if 'stage' in breaks_on else 'JobTransition'})", "event sink broke")
    ]


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        ({"after": None}, "after must be a stage name or a list of names"),  # bare TypeError
        ({"after": [["a"]]}, "after must be a stage name or a list of names"),  # unhashable list
        ({"fan_out": "no"}, "fan_out must be True or False"),  # failed after stage a was billed
        ({"cost": float("inf")}, "cost must be a finite number >= 0"),  # the same
        ({"retry": "three times"}, "retry must be a RetryPolicy or None"),  # the same
    ],
)
def test_a_stage_that_cannot_run_is_refused_when_defined(arguments: dict, said: str) -> None:
    with pytest.raises(JobSpecError, match=said):
        Stage("b", "llm", **arguments)


def test_stages_that_are_no_list_and_job_ids_that_are_no_text_are_refused() -> None:
    with pytest.raises(JobSpecError, match="stages must be a list of Stage objects"):
        JobSpec("pipeline", "1", Stage("a", "llm"))  # type: ignore[arg-type]
    runtime = SimPyRuntime()
    scheduler = Scheduler(runtime, [ScriptedProvider(runtime)])
    spec = JobSpec("pipeline", "1", [Stage("a", "llm")])
    for job_id in (123, ""):  # 123 was kept as a number in memory and as '123' in SQLite
        with pytest.raises(ConfigurationError, match="job_id: expected a non-empty string"):
            scheduler.submit_job(spec, {"input": "x"}, job_id=job_id)  # type: ignore[arg-type]
    assert scheduler.jobs.list() == []


def test_a_build_that_edits_what_it_is_given_changes_nothing_stored() -> None:
    """Stage b's build upper-cased results["a"]["output"]: a memory store's job and task records of
    stage a changed with it (a durable store's did not), and so did what a double click saw."""

    def shouting_build(inputs: Any, results: Any) -> dict:
        results["a"]["output"] = results["a"]["output"].upper()
        inputs["x"] = "edited"
        return {"input": results["a"]["output"]}

    spec = JobSpec(
        "pipeline",
        "1",
        [Stage("a", "a", build=_named_build("a")), Stage("b", "b", after=("a",), build=shouting_build)],
    )
    runtime = SimPyRuntime()

    async def body() -> Any:
        scheduler = Scheduler(
            runtime, [ScriptedProvider(runtime, name=name) for name in "ab"], rng=random.Random(3)
        )
        record = await scheduler.submit_job(spec, {"x": 1}).wait()
        stored_task = scheduler.store.get(record.stage_tasks["a"][0])
        return record, scheduler.jobs.get(record.id), stored_task

    record, stored_job, stored_task = runtime.run(body())
    assert record.results["a"] == stored_job.results["a"] == stored_task.result == {"output": "done:a:1"}
    assert stored_job.inputs == {"x": 1}
    assert record.results["b"] == {"output": "done:DONE:A:1"}


# ---------------------------------------------------------------------------- a failed job sends nothing more
FAIL_FAST = RetryPolicy(
    backoff=ExponentialBackoff(base_s=4.0, cap_s=4.0), max_attempts=3, attempt_timeout_s=100
)


@pytest.mark.parametrize(
    ("a_script", "a_latency", "a_ends", "a_calls"),
    [
        (["500", "ok"], 1.0, TaskStatus.CANCELLED, 1),  # between attempts at t=2: cancelled then
        (["500", "ok"], 3.0, TaskStatus.CANCELLED, 1),  # at the provider at t=2: its call fails, no retry
        (["ok"], 3.0, TaskStatus.SUCCEEDED, 1),  # at the provider at t=2: its answer is kept
    ],
    ids=["in-backoff", "in-flight-then-fails", "in-flight-then-succeeds"],
)
def test_when_a_job_fails_its_other_stages_send_no_further_attempt(
    a_script: list[str], a_latency: float, a_ends: TaskStatus, a_calls: int
) -> None:
    """README: a failed stage "fails the job (queued stage tasks are cancelled, calls in flight finish
    and are kept)". A stage task waiting out a backoff was neither: its retry was sent (and billed)
    after the job had failed (found by a review that fuzzed jobs)."""
    spec = JobSpec("two", "1", [Stage("a", "a", build=named("a")), Stage("b", "b", build=named("b"))])

    async def body(runtime):
        provs = providers(
            runtime, {"a": a_latency, "b": 2.0}, scripts={"a": {"a:1": a_script}, "b": {"b:1": ["invalid"]}}
        )
        scheduler = make_scheduler(runtime, provs, retry=FAIL_FAST)
        record = await scheduler.submit_job(spec, {"x": 1}).wait()
        await scheduler.join()
        a_task = scheduler.store.get(record.stage_tasks["a"][0])
        await scheduler.close()
        return record, a_task, provs["a"].calls, runtime.task_errors

    record, a_task, calls, errors = run(body)
    assert record.status is JobStatus.FAILED and record.failed_stage == "b" and record.finished_at == 2.0
    assert len(calls) == a_calls and all(at < record.finished_at for at, _, _ in calls)
    assert a_task.status is a_ends and errors == []


def test_close_refuses_new_work_at_once_while_a_live_job_finishes_its_stages() -> None:
    """close(cancel_pending=False) set its flag only after the live jobs had finished: a job and a
    plain call submitted meanwhile were accepted and run (found by a review that fuzzed jobs)."""
    from aiqsim.scheduler.scheduler import SchedulerClosedError

    spec = JobSpec(
        "j", "1", [Stage("a", "a", build=named("a")), Stage("b", "a", after=("a",), build=named("b"))]
    )

    async def body(runtime):
        provs = providers(runtime, {"a": 5.0})
        scheduler = make_scheduler(runtime, provs)
        handle = scheduler.submit_job(spec, {"x": 1})
        closing = runtime.spawn(scheduler.close(cancel_pending=False))
        await runtime.sleep(1.0)
        refused = []
        for submit in (
            lambda: scheduler.submit_job(spec, {"x": 2}),
            lambda: scheduler.submit("a", {"input": "x"}),
        ):
            with pytest.raises(SchedulerClosedError, match="closing"):
                submit()
            refused.append(True)
        await closing
        return await handle.wait(), runtime.now(), refused, provs["a"].calls

    record, closed_at, refused, calls = run(body)
    assert record.status is JobStatus.SUCCEEDED  # its later stage still got in
    assert closed_at == 10.0 and refused == [True, True]
    assert [name for _, name, _ in calls] == ["a:1", "b:1"]


@pytest.mark.parametrize(
    ("hit", "script", "ends", "cancelled"),
    [
        ("terminal", {}, JobStatus.SUCCEEDED, False),
        ("a-succeeded", {}, JobStatus.CANCELLED, True),  # b has not started: the cancel stops the job
        ("b-succeeded", {}, JobStatus.SUCCEEDED, False),  # every result is in: too late
        ("b-failed", {"b:1": ["invalid"]}, JobStatus.FAILED, False),  # the failure is decided: too late
    ],
)
def test_a_sink_that_cancels_the_job_it_is_told_about_gets_a_consistent_answer(
    hit: str, script: dict, ends: JobStatus, cancelled: bool
) -> None:
    """Job events are sent in the middle of a job's steps. A sink that cancelled the job (a UI's stop
    button wired to the stream) got IllegalJobTransitionError on the terminal event, or ended a job
    cancelled with every result recorded (and 'cancelled -> succeeded' in task_errors), or cancelled
    with a 'failed' stage event (found by a review that fuzzed jobs). Once the job's ending is
    decided cancel() returns False; before it, the cancel wins and nothing more starts."""
    spec = JobSpec(
        "ab", "1", [Stage("a", "a", build=named("a")), Stage("b", "b", after=("a",), build=named("b"))]
    )
    answers: list[object] = []
    handle_box: list = []

    def sink(event) -> None:
        matches = {
            "terminal": isinstance(event, JobTransition)
            and event.new in ("succeeded", "failed", "cancelled"),
            "a-succeeded": isinstance(event, StageEvent) and (event.stage, event.event) == ("a", "succeeded"),
            "b-succeeded": isinstance(event, StageEvent) and (event.stage, event.event) == ("b", "succeeded"),
            "b-failed": isinstance(event, StageEvent) and (event.stage, event.event) == ("b", "failed"),
        }
        if matches[hit] and handle_box and not answers:
            answers.append(handle_box[0].cancel())

    async def body(runtime):
        provs = providers(runtime, {"a": 1.0, "b": 1.0}, scripts={"b": script})
        scheduler = make_scheduler(runtime, provs, events=sink)
        handle_box.append(scheduler.submit_job(spec, {"x": 1}))
        record = await handle_box[0].wait()
        await scheduler.join()
        return record, provs["b"].calls, runtime.task_errors, scheduler.jobs.in_flight

    record, b_calls, errors, in_flight = run(body)
    assert answers == [cancelled] and record.status is ends
    assert errors == [] and in_flight == 0
    if ends is JobStatus.CANCELLED:
        assert b_calls == [] and "b" not in record.results


@pytest.mark.parametrize("how", ["job", "stage task"])
def test_the_stage_states_of_a_cancelled_job_derive_cancelled(how: str) -> None:
    """stage_states() is "the input of derive_job_status", but for a cancelled job it said the stage
    a cancelled task had stopped was failed (derived: failed), or left the running stage None
    (derived: running), found by a review that fuzzed jobs."""
    from aiqsim.core.job import derive_job_status

    spec = JobSpec(
        "ab", "1", [Stage("a", "a", build=named("a")), Stage("b", "b", after=("a",), build=named("b"))]
    )

    async def body(runtime):
        provs = providers(runtime, {"a": 1.0, "b": 5.0})
        scheduler = make_scheduler(runtime, provs)
        handle = scheduler.submit_job(spec, {"x": 1}, job_id="j")
        await runtime.sleep(2.0)  # a done, b running
        if how == "job":
            handle.cancel()
        else:
            scheduler.cancel(scheduler.jobs.get("j").stage_tasks["b"][0])
        record = await handle.wait()
        return record, scheduler.jobs.stage_states("j")

    record, states = run(body)
    assert record.status is JobStatus.CANCELLED
    assert states == {"a": TaskStatus.SUCCEEDED, "b": TaskStatus.CANCELLED}
    assert derive_job_status(states) is TaskStatus.CANCELLED


def test_an_interactive_double_click_of_a_job_lifts_its_owner_out_of_the_background_backlog() -> None:
    """A duplicate task lifts its lower-priority owner to its own class; a duplicate job did not: the
    interactive double click of a background job waited for the 5 background calls queued ahead
    of its owner's stage (resolved at 6 s; the same with plain tasks at 1 s; found by a review)."""
    from aiqsim import Priority, QuotaLimits

    spec = JobSpec(
        "ab", "1", [Stage("a", "llm", build=named("a")), Stage("b", "llm", after=("a",), build=named("b"))]
    )

    async def body(runtime):
        provs = providers(runtime, {"llm": 1.0})
        scheduler = make_scheduler(runtime, provs, quotas={"llm": QuotaLimits(concurrency=1)})
        for n in range(5):
            scheduler.submit("llm", {"input": f"bg{n}"})
        owner = scheduler.submit_job(spec, {"x": 1}, priority=Priority.BACKGROUND)
        click = scheduler.submit_job(spec, {"x": 1}, priority=Priority.INTERACTIVE)
        record = await click.wait()
        await scheduler.join()
        return record, (await owner.wait()), [name for _, name, _ in provs["llm"].calls]

    click, owner, calls = run(body)
    assert click.status is JobStatus.DEDUPED and click.finished_at == 2.0  # a then b, ahead of the backlog
    assert calls[:2] == ["a:1", "b:1"] and owner.priority is Priority.INTERACTIVE
