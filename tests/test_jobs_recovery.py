"""Jobs across a crash, step by step on the SimPy clock: what ``recover()`` re-drives, reuses and refuses."""

from __future__ import annotations

import random

import pytest

from aiqsim import (
    ExponentialBackoff,
    JobSpec,
    JobStatus,
    RetryPolicy,
    Scheduler,
    SimPyRuntime,
    Stage,
    TaskStatus,
)
from aiqsim.stores import MemoryStore
from tests.fakes import ScriptedProvider


def first(inputs, results):
    return {"input": f"first:{inputs['x']}"}


def second(inputs, results):
    return {"input": f"second:{results['a']['output']}"}


def other_second(inputs, results):
    return {"input": f"other:{results['a']['output']}"}


SPEC = JobSpec("chain", "1", [Stage("a", "a", build=first), Stage("b", "b", after=("a",), build=second)])


def make(runtime, store, provs, specs=(SPEC,)) -> Scheduler:
    scheduler = Scheduler(
        runtime,
        list(provs.values()),
        store=store,
        rng=random.Random(5),
        retry=RetryPolicy(backoff=ExponentialBackoff(base_s=1.0, cap_s=4.0), max_attempts=3),
    )
    for spec in specs:
        scheduler.jobs.register(spec)
    return scheduler


def crash_in_stage_b_then(restart):
    """Run SPEC until t = 1.5 (a done at 1.0, b's call in flight), crash, then ``restart(...)``."""
    runtime = SimPyRuntime()
    store = MemoryStore()
    provs = {name: ScriptedProvider(runtime, name=name, latency_s=1.0) for name in ("a", "b")}

    async def main():
        before = make(runtime, store, provs)
        before.submit_job(SPEC, {"x": 1}, job_id="j")
        before.submit_job(SPEC, {"x": 1}, job_id="j-again")  # a double click, waiting on j
        await runtime.sleep(1.5)
        before.crash()
        await runtime.sleep(1.0)
        return await restart(runtime, store, provs)

    return runtime.run(main())


def test_recovery_reuses_the_finished_stage_and_fails_the_interrupted_one_without_sending_it_again() -> None:
    # requeue_interrupted=False (the default) and no lookup: the orphan may have been billed, so it
    # is not sent again and the job fails at its stage, saying why; the double click shares that.
    # (The re-drive used to submit stage b anew: its new task took over the failed key, a 2nd call.)
    async def restart(runtime, store, provs):
        after = make(runtime, store, provs)
        report = await after.recover()
        assert after.jobs.handle("j") is None and after.jobs.handle("j-again") is None  # ended in recover()
        await after.join()
        return report, after.job_recovery, after.jobs.get("j"), after.jobs.get("j-again"), provs, store

    report, jobs_report, job, again, provs, store = crash_in_stage_b_then(restart)
    assert report.orphans_failed == 1  # b's task: no lookup on this provider, so it is interrupted
    assert (jobs_report.resumed, jobs_report.reattached) == (1, 1)
    assert job.status is JobStatus.FAILED and job.failed_stage == "b" and "TaskInterruptedError" in job.error
    assert job.finished_at == pytest.approx(2.5)  # at the restart: nothing ran
    assert again.status is JobStatus.DEDUPED and again.deduped_from == "j" and again.error == job.error
    assert len(provs["a"].calls) == 1  # a's result was in the job record: not called again
    assert len(provs["b"].calls) == 1  # the interrupted call only
    assert [store.get(t).status for t in job.stage_tasks["b"]] == [TaskStatus.FAILED]


def test_with_requeue_interrupted_the_job_resends_the_interrupted_stage_and_finishes() -> None:
    async def restart(runtime, store, provs):
        after = make(runtime, store, provs)
        report = await after.recover(requeue_interrupted=True)
        handle, waiter = after.jobs.handle("j"), after.jobs.handle("j-again")
        return report, await handle.wait(), await waiter.wait(), provs

    report, job, again, provs = crash_in_stage_b_then(restart)
    assert report.orphans_requeued == 1
    assert job.status is JobStatus.SUCCEEDED and job.finished_at == pytest.approx(3.5)  # b again 2.5-3.5
    assert again.status is JobStatus.DEDUPED and again.deduped_from == "j" and again.results == job.results
    assert len(provs["a"].calls) == 1
    assert len(provs["b"].calls) == 2  # the interrupted call, then the requeued one: the caller's choice
    assert len(job.stage_tasks["b"]) == 1  # the requeued task itself, waited for: not a second task


def test_a_job_whose_spec_is_not_registered_ends_failed_saying_why() -> None:
    async def restart(runtime, store, provs):
        after = make(runtime, store, provs, specs=())
        await after.recover()
        return store.get_job("j"), store.get_job("j-again"), after

    job, again, after = crash_in_stage_b_then(restart)
    assert job.status is JobStatus.FAILED and "no JobSpec 'chain' version '1' is registered" in job.error
    assert again.status is JobStatus.FAILED and again.error.startswith("job cannot continue")
    assert after.job_recovery.failed_unknown_spec == 2


def test_a_job_whose_registered_spec_changed_under_the_same_version_is_not_run_with_it() -> None:
    changed = JobSpec(
        "chain", "1", [Stage("a", "a", build=first), Stage("b", "b", after=("a",), build=other_second)]
    )

    async def restart(runtime, store, provs):
        after = make(runtime, store, provs, specs=(changed,))
        await after.recover()
        return store.get_job("j"), provs

    job, provs = crash_in_stage_b_then(restart)
    assert job.status is JobStatus.FAILED and "differs from the one job 'j' was submitted with" in job.error
    assert [name for _, name, _ in provs["b"].calls] == ["second:done:first:1"]  # nothing ran with it


def test_recovering_a_store_without_any_jobs_attaches_nothing() -> None:
    runtime = SimPyRuntime()

    async def main():
        scheduler = Scheduler(runtime, [ScriptedProvider(runtime, name="a")], store=MemoryStore())
        await scheduler.recover()
        return scheduler

    scheduler = runtime.run(main())
    assert scheduler.job_recovery is None and scheduler._jobs is None


class TasksOnlyStore:
    """A task store from before jobs (or a third-party one): the TaskStore methods, no job table."""

    def __init__(self) -> None:
        self._inner = MemoryStore()

    def __getattr__(self, name: str):
        if "job" in name:
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_a_store_without_a_job_table_still_recovers_tasks_and_refuses_jobs_clearly() -> None:
    from aiqsim.core.errors import ConfigurationError
    from aiqsim.sim.crash import CrashingStore

    runtime = SimPyRuntime()
    wrapped = CrashingStore(TasksOnlyStore(), counter=[0], crash_points=set(), on_crash=lambda: None)

    async def main():
        scheduler = Scheduler(runtime, [ScriptedProvider(runtime, name="a")], store=wrapped)
        report = await scheduler.recover()  # the wrapper has job methods, the store it wraps has none
        with pytest.raises(ConfigurationError, match="keeps no jobs"):
            scheduler.submit_job(SPEC, {"x": 1})
        return report, scheduler

    report, scheduler = runtime.run(main())
    assert report.queued_resumed == 0 and scheduler.job_recovery is None


def test_a_restarted_process_seeded_like_its_predecessor_draws_fresh_job_ids() -> None:
    runtime = SimPyRuntime()
    store = MemoryStore()
    provs = {name: ScriptedProvider(runtime, name=name, latency_s=1.0) for name in ("a", "b")}

    async def main():
        before = make(runtime, store, provs)
        first = await before.submit_job(SPEC, {"x": 1}).wait()
        before.crash()
        after = make(runtime, store, provs)  # the same seed: the same draws
        await after.recover()
        second = await after.submit_job(SPEC, {"x": 2}).wait()
        return first, second

    first, second = runtime.run(main())
    assert first.id != second.id and second.status is JobStatus.SUCCEEDED


class FailingJobWrites(MemoryStore):
    """A memory store whose disk 'fills up' when a job's first result is written, until ``heal()``."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = True

    def update_job(self, job) -> None:  # type: ignore[no-untyped-def]
        if self.broken and job.results:
            from aiqsim.stores import StoreWriteError

            raise StoreWriteError(f"job {job.id!r} result", OSError(28, "No space left on device"))
        super().update_job(job)


def test_a_job_whose_progress_cannot_be_written_resolves_failed_and_recovers_later() -> None:
    runtime = SimPyRuntime()
    store = FailingJobWrites()
    provs = {name: ScriptedProvider(runtime, name=name, latency_s=1.0) for name in ("a", "b")}

    async def main():
        before = make(runtime, store, provs)
        handle = before.submit_job(SPEC, {"x": 1}, job_id="j")
        in_process = await runtime.wait_for(handle.wait(), 60)  # resolves: it does not hang
        stored = store.get_job("j")
        store.broken = False  # the disk has room again; a new process recovers
        before.crash()
        after = make(runtime, store, provs)
        await after.recover()
        return in_process, stored, await after.jobs.handle("j").wait()

    in_process, stored, recovered = runtime.run(main())
    assert in_process.status is JobStatus.FAILED and in_process.error.startswith(
        "store write failed: StoreWriteError"
    )
    assert "recover() re-drives it" in in_process.error
    assert stored.status is JobStatus.RUNNING and stored.results == {}  # the last write that succeeded
    assert recovered.status is JobStatus.SUCCEEDED
    assert len(provs["a"].calls) == 1 and len(provs["b"].calls) == 1  # stage a was reused, not re-run


class FailingStageWrites(MemoryStore):
    """A memory store whose disk 'fills up' when a task of provider ``a`` is written succeeded,
    until ``broken`` is cleared."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = True

    def update(self, task) -> None:  # type: ignore[no-untyped-def]
        if self.broken and task.provider == "a" and task.status is TaskStatus.SUCCEEDED:
            from aiqsim.stores import StoreWriteError

            raise StoreWriteError(f"task {task.id!r} -> succeeded", OSError(28, "No space left on device"))
        super().update(task)


def test_a_job_whose_stage_outcome_cannot_be_written_resolves_failed_and_recovers_later() -> None:
    """Before: the stage's task left the scheduler with its submission resolved by the
    StoreWriteError, but the job was never told and its handle waited for ever (found while
    reviewing the change to duplicates of unreadable owners)."""
    runtime = SimPyRuntime()
    store = FailingStageWrites()
    provs = {name: ScriptedProvider(runtime, name=name, latency_s=1.0) for name in ("a", "b")}

    async def main():
        before = make(runtime, store, provs)
        handle = before.submit_job(SPEC, {"x": 1}, job_id="j")
        in_process = await runtime.wait_for(handle.wait(), 60)  # resolves: it does not hang
        await before.join()
        when, b_calls = runtime.now(), len(provs["b"].calls)
        stored = store.get_job("j")
        store.broken = False
        before.crash()
        after = make(runtime, store, provs)
        await after.recover(requeue_interrupted=True)
        return in_process, when, b_calls, stored, await after.jobs.handle("j").wait()

    in_process, when, b_calls, stored, recovered = runtime.run(main())
    assert in_process.status is JobStatus.FAILED and in_process.error.startswith(
        "store write failed: StoreWriteError: store write failed, not persisted: task"
    )
    assert "No space left on device" in in_process.error and "recover() re-drives it" in in_process.error
    assert when == pytest.approx(1.0)  # when stage a's outcome could not be written
    assert stored.status is JobStatus.RUNNING and stored.results == {}
    assert b_calls == 0  # stage b never started on an unrecorded result
    assert recovered.status is JobStatus.SUCCEEDED
    assert len(provs["a"].calls) == 2 and len(provs["b"].calls) == 1  # a's unrecorded run was sent again


FALLBACK_SPEC = JobSpec("voice", "1", [Stage("tts", "tts", build=first, fallback="tts_backup")])


def failing_over_world():
    """A runtime, a memory store and the two TTS providers of FALLBACK_SPEC: the primary fails the
    job's input at t = 1 (an invalid request); the backup answers after 2 s."""
    runtime = SimPyRuntime()
    provs = {
        "tts": ScriptedProvider(runtime, name="tts", latency_s=1.0, script={"first:1": ["invalid"]}),
        "tts_backup": ScriptedProvider(runtime, name="tts_backup", latency_s=2.0),
    }
    return runtime, MemoryStore(), provs


def crash_during_the_fallback_then(restart, *, crash_at: float = 2.0):
    """The primary fails at t = 1 (an invalid request), the fallback's call runs 1-3: crash at
    ``crash_at``, then ``restart(...)`` one second later."""
    runtime, store, provs = failing_over_world()

    async def main():
        before = make(runtime, store, provs, specs=(FALLBACK_SPEC,))
        before.submit_job(FALLBACK_SPEC, {"x": 1}, job_id="j")
        await runtime.sleep(crash_at)
        before.crash()
        await runtime.sleep(1.0)
        return await restart(runtime, store, provs)

    return runtime.run(main())


@pytest.mark.parametrize("requeue", [False, True], ids=["interrupted", "requeued"])
def test_a_crash_during_a_fallback_goes_on_with_the_fallback_and_never_resends_the_primary(requeue) -> None:
    """The re-drive used to submit the stage on its primary again: its failed call was sent (and
    billed) a second time before the job fell back again."""

    async def restart(runtime, store, provs):
        after = make(runtime, store, provs, specs=(FALLBACK_SPEC,))
        await after.recover(requeue_interrupted=requeue)
        await after.join()
        return after.jobs.get("j"), provs, store

    job, provs, store = crash_during_the_fallback_then(restart)
    assert len(provs["tts"].calls) == 1  # the failed primary, once
    primary, backup = job.stage_tasks["tts"]
    assert store.get(primary).status is TaskStatus.FAILED
    if requeue:  # the caller's choice: the interrupted fallback call is sent again, and it succeeds
        assert len(provs["tts_backup"].calls) == 2
        assert job.status is JobStatus.SUCCEEDED and job.results == {"tts": {"output": "done:first:1"}}
        assert job.finished_at == pytest.approx(5.0)  # the restart at 3, the backup's 2 s
    else:  # interrupted without a lookup: not sent again; the job fails saying both
        assert len(provs["tts_backup"].calls) == 1
        assert job.status is JobStatus.FAILED and job.failed_stage == "tts"
        assert "InvalidRequestError" in job.error and "fallback 'tts_backup' failed too" in job.error
        assert "TaskInterruptedError" in job.error
        assert store.get(backup).status is TaskStatus.FAILED


def test_a_fallback_that_ended_before_the_crash_gives_the_stage_its_result_without_a_call() -> None:
    """The fallback's task was stored as succeeded, but the job's own write of the result was lost
    (two writes: with a SQL store, two transactions): the job record is put back as it was while
    the fallback ran (t = 2), and recovery finds the result in the fallback's task."""
    runtime, store, provs = failing_over_world()

    async def main():
        before = make(runtime, store, provs, specs=(FALLBACK_SPEC,))
        before.submit_job(FALLBACK_SPEC, {"x": 1}, job_id="j")
        await runtime.sleep(2.0)
        while_falling_back = store.get_job("j")
        await runtime.sleep(1.5)
        before.crash()
        assert store.get_job("j").status is JobStatus.SUCCEEDED
        store.update_job(while_falling_back)
        after = make(runtime, store, provs, specs=(FALLBACK_SPEC,))
        await after.recover()
        await after.join()
        return while_falling_back, after.jobs.get("j")

    while_falling_back, job = runtime.run(main())
    assert while_falling_back.status is JobStatus.RUNNING and len(while_falling_back.stage_tasks["tts"]) == 2
    assert job.status is JobStatus.SUCCEEDED and job.results == {"tts": {"output": "done:first:1"}}
    assert job.finished_at == pytest.approx(3.5)  # at the restart: nothing ran again
    assert (len(provs["tts"].calls), len(provs["tts_backup"].calls)) == (1, 1)


def test_an_interrupted_primary_is_not_sent_to_the_fallback_either() -> None:
    """The primary's call was in flight at the crash (t = 0.5 of 1 s) and the provider has no lookup:
    recovery fails it as interrupted, since it may have been done and billed. The re-drive used to
    take that failure as the primary's and send the stage to its fallback: billed on both providers."""
    runtime = SimPyRuntime()
    store = MemoryStore()
    provs = {
        "tts": ScriptedProvider(runtime, name="tts", latency_s=1.0),
        "tts_backup": ScriptedProvider(runtime, name="tts_backup", latency_s=1.0),
    }

    async def main():
        before = make(runtime, store, provs, specs=(FALLBACK_SPEC,))
        before.submit_job(FALLBACK_SPEC, {"x": 1}, job_id="j")
        await runtime.sleep(0.5)
        before.crash()
        after = make(runtime, store, provs, specs=(FALLBACK_SPEC,))
        report = await after.recover()
        await after.join()
        return report, after.jobs.get("j")

    report, job = runtime.run(main())
    assert report.orphans_failed == 1
    assert job.status is JobStatus.FAILED and job.failed_stage == "tts"
    assert job.error.startswith("stage 'tts' failed: TaskInterruptedError")
    assert (len(provs["tts"].calls), len(provs["tts_backup"].calls)) == (1, 0)


def test_the_crash_kit_finds_no_stage_billed_on_both_providers() -> None:
    """The review's schedule (a fallback stage, a slow primary, other writes while it is in flight),
    crashed after every store write by the kit users run on their own code."""
    from aiqsim.testing import CrashDriver
    from aiqsim.testing.options import CrashOptions

    def build(inputs, results):
        return {"input": inputs["x"], "prompt_units": 5, "output_units": 100}

    spec = JobSpec("one", "1", [Stage("s", "primary", build=build, fallback="backup")])

    def providers(world):
        return [
            world.simulated_provider("primary", supports_lookup=False, latency_base_s=2.0),
            world.simulated_provider("backup", supports_lookup=False),
            world.simulated_provider("other", supports_lookup=False, latency_base_s=0.1),
        ]

    async def scenario(life):
        life.submit_job(spec, {"x": "doc"}, job_id="j")
        for n in range(3):
            await life.runtime.sleep(0.3)
            life.submit("other", {"input": f"o{n}", "prompt_units": 1, "output_units": 1}, task_id=f"o{n}")
        await life.join()

    report = CrashDriver(CrashOptions(seeds=(0, 1))).run(scenario, providers=providers, jobs=[spec])
    assert report.cases >= 10


@pytest.mark.parametrize("mode", ["cancel", "fail"])
@pytest.mark.parametrize("crash_after", [1, 2, 3])
def test_a_crash_while_a_job_ends_never_lets_recovery_send_its_stopped_stages(
    mode: str, crash_after: int
) -> None:
    """The job's terminal write came first and the cancellation of its queued stage tasks after it:
    a crash in between left a cancelled (or failed) job with a queued stage task, which recover()
    resumed and sent for a job nobody waited for. Stage b waits in the queue behind a's one slot;
    the job ends (cancelled at 0.5, or failed by a at 1.0) and the process dies at the
    ``crash_after``-th store write from then on."""
    from aiqsim import QuotaLimits
    from aiqsim.sim.crash import CrashingStore, SimulatedCrash

    spec = JobSpec("two", "1", [Stage("a", "llm", build=first), Stage("b", "llm", build=other_second_input)])
    runtime = SimPyRuntime()
    raw = MemoryStore()
    writes = [0]
    points: set[int] = set()
    llm = ScriptedProvider(runtime, name="llm", latency_s=1.0, script={"first:1": ["invalid"]})
    current: dict[str, Scheduler] = {}

    def new_scheduler() -> tuple[Scheduler, CrashingStore]:
        store = CrashingStore(raw, counter=writes, crash_points=points, on_crash=lambda: current["s"].crash())
        scheduler = Scheduler(
            runtime, [llm], store=store, quotas={"llm": QuotaLimits(concurrency=1)}, rng=random.Random(9)
        )
        scheduler.jobs.register(spec)
        current["s"] = scheduler
        return scheduler, store

    async def main():
        before, store = new_scheduler()
        handle = before.submit_job(spec, {"x": 1}, job_id="j")
        await runtime.sleep(0.5)
        points.add(writes[0] + crash_after)
        if mode == "cancel":
            try:
                handle.cancel()
            except SimulatedCrash:
                pass
        await runtime.sleep(2.0)
        assert before._crashed, "the crash point was reached"
        store.dead = True
        after, _ = new_scheduler()
        await after.recover()
        await after.join()
        return raw.get_job("j"), raw.list_by_status(), llm.calls

    job, tasks, calls = runtime.run(main())
    assert [name for _, name, _ in calls] == ["first:1"]  # b was never sent
    assert job.status.is_terminal and all(task.status.is_terminal for task in tasks)


def other_second_input(inputs, results):
    return {"input": f"b:{inputs['x']}"}


class _FlakyPrimary:
    """A provider that fails each element's first two calls with a 500 (elements 0 and 1 only)
    and records every call it answers, as billed."""

    def __init__(self, runtime, name: str, latency_s: float, billed: list) -> None:  # type: ignore[no-untyped-def]
        self.name, self._runtime, self._latency_s, self._billed = name, runtime, latency_s, billed
        self._calls: dict[str, int] = {}

    async def call(self, request):  # type: ignore[no-untyped-def]
        from aiqsim.core.failures import ServerError
        from aiqsim.scheduler.provider import ProviderResponse

        item = request.payload["input"]
        self._calls[item] = self._calls.get(item, 0) + 1
        failing = self.name == "tts" and not item.endswith(":2") and self._calls[item] <= 2
        started = self._runtime.now()
        await self._runtime.sleep(self._latency_s)
        if failing:
            raise ServerError("overloaded", status=500)
        self._billed.append((started, self.name, item))
        return ProviderResponse(result=item)


def test_a_fallback_task_stored_before_a_crash_is_not_billed_when_the_stage_goes_back_to_its_primary() -> (
    None
):
    """Found by a review agent's crash sweep: the crash came after the job record named both
    fallback tasks of a fan-out stage but only one of them was stored. Recovery resumed the stored
    fallback task, the stage was (rightly) submitted again on its primary, and the resumed fallback
    task ran too: element 0 billed on both providers."""
    from aiqsim.sim.crash import CrashingStore

    runtime = SimPyRuntime()
    billed: list = []
    providers = [_FlakyPrimary(runtime, "tts", 0.5, billed), _FlakyPrimary(runtime, "tts2", 0.7, billed)]
    spec = JobSpec(
        "p",
        "1",
        [
            Stage(
                "fan",
                "tts",
                fan_out=True,
                build=lambda inputs, results: [{"input": f"tts:{k}"} for k in range(3)],
                fallback=Stage(
                    "fb", "tts2", build=lambda inputs, results: [{"input": f"fb:{k}"} for k in range(3)]
                ),
                retry=RetryPolicy(backoff=ExponentialBackoff(base_s=0.4, cap_s=1.0), max_attempts=2),
            )
        ],
    )
    memory, counter, current = MemoryStore(), [0], {}

    def new(seed: int) -> Scheduler:
        store = CrashingStore(
            memory, counter=counter, crash_points={13}, on_crash=lambda: current["s"].crash()
        )
        scheduler = Scheduler(runtime, providers, store=store, rng=random.Random(seed))
        scheduler.jobs.register(spec)
        current["s"] = scheduler
        return scheduler

    async def main():  # type: ignore[no-untyped-def]
        new(0).submit_job(spec, {}, job_id="j1")
        await runtime.sleep(2.9)  # the crash came at t = 1.4, after write 13
        after = new(1)
        await after.recover()
        await after.jobs.join()
        await after.join()
        return memory.get_job("j1")

    stored = runtime.run(main())
    assert counter[0] > 13  # the crash point was reached
    assert stored.status is JobStatus.SUCCEEDED
    assert stored.results == {"fan": ["tts:0", "tts:1", "tts:2"]}
    assert sorted(item for _, _, item in billed) == ["tts:0", "tts:1", "tts:2"]  # each element once
    assert all(name == "tts" for _, name, _ in billed)
