"""The one way task and job handles wait for their outcome (aiqsim.scheduler.handles).

Every test runs on both runtimes: a waiter that gives up must not cancel the shared future, an
outcome (value or exception) must reach every waiter, through a real Scheduler for both handles,
and the shared future is made only when someone waits before the outcome is known.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from aiqsim import JobHandle, JobSpec, JobStatus, Scheduler, Stage, Submission, TaskStatus
from aiqsim.scheduler.handles import (
    OutcomeAlreadySetError,
    OutcomeHandle,
    PendingOutcome,
    await_outcome,
    await_own,
    outcome_known,
    resolve,
    resolve_with_error,
)
from tests.fakes import ScriptedProvider
from tests.runtimes import ASYNCIO_LATENESS_S, RUNTIMES, run_on

both = pytest.mark.parametrize("rt_name", RUNTIMES)


class _Handle(OutcomeHandle[str]):
    __slots__ = ()
    _repr_name = "Probe"

    async def result(self) -> Any:
        return (await self.wait()).upper()


@both
def test_a_waiter_that_gives_up_leaves_the_shared_future_to_the_others(rt_name: str) -> None:
    async def body(rt):
        holder = PendingOutcome()
        handle = _Handle("t1", "k1", holder, rt.create_future)
        with pytest.raises(TimeoutError):
            await rt.wait_for(handle.wait(), 0.5)
        pending = handle.done()
        shared = holder.future  # made by the waiter that gave up; left for the next
        other = rt.spawn(handle.result())
        await rt.sleep(1)
        resolve(holder, "answer")
        return pending, shared is holder.future, shared.cancelled(), await other, handle.done(), repr(handle)

    assert run_on(rt_name, body) == (False, True, False, "ANSWER", True, "<Probe t1 done>")


@both
def test_an_exception_on_the_shared_future_reaches_every_waiter(rt_name: str) -> None:
    class Lost(Exception):
        pass

    async def body(rt):
        shared = rt.create_future()
        waiters = [rt.spawn(await_own(shared, rt.create_future)) for _ in range(2)]
        await rt.sleep(1)
        error = Lost("outcome not persisted")
        shared.set_exception(error)
        seen = []
        for waiter in waiters:
            try:
                await waiter
            except Lost as raised:
                seen.append(raised)
        return seen, error

    seen, error = run_on(rt_name, body)
    assert seen == [error, error]


@both
def test_an_exception_ending_a_holder_reaches_waiters_before_and_after(rt_name: str) -> None:
    class Lost(Exception):
        pass

    async def body(rt):
        holder = PendingOutcome()
        early = [rt.spawn(await_outcome(holder, rt.create_future)) for _ in range(2)]
        await rt.sleep(1)
        error = Lost("outcome not persisted")
        resolve_with_error(holder, error)
        seen = []
        for waiter in [*early, rt.spawn(await_outcome(holder, rt.create_future))]:
            try:
                await waiter
            except Lost as raised:
                seen.append(raised)
        return seen, error, outcome_known(holder)

    seen, error, known = run_on(rt_name, body)
    assert seen == [error, error, error] and known


@both
def test_an_outcome_known_before_anyone_waits_needs_no_future(rt_name: str) -> None:
    def refuse() -> Any:
        raise AssertionError("a known outcome needs no future")

    async def body(rt):
        holder = PendingOutcome()
        handle = _Handle("t1", "k1", holder, refuse)
        before = handle.done()
        resolve(holder, "ready")
        return before, handle.done(), await handle.wait(), await handle, holder.future

    assert run_on(rt_name, body) == (False, True, "ready", "READY", None)


def test_an_outcome_is_set_once() -> None:
    holder = PendingOutcome()
    resolve(holder, "first")
    with pytest.raises(OutcomeAlreadySetError):
        resolve(holder, "second")
    with pytest.raises(OutcomeAlreadySetError):
        resolve_with_error(holder, RuntimeError("late"))
    assert holder.outcome == "first" and holder.outcome_error is None


@both
def test_a_scheduler_makes_no_future_for_a_submission_nobody_awaits(rt_name: str) -> None:
    async def body(rt):
        scheduler = Scheduler(rt, [ScriptedProvider(rt, latency_s=0.01)], rng=random.Random(5))
        quiet = scheduler.submit("llm", {"input": "a"})
        awaited = scheduler.submit("llm", {"input": "b"})
        result = await awaited
        await scheduler.join()
        return quiet._holder.future, awaited._holder.future is not None, quiet.done(), await quiet, result

    no_future, made, done, quiet_result, result = run_on(rt_name, body)
    assert no_future is None and made and done
    assert quiet_result == {"output": "done:a"} and result == {"output": "done:b"}


@both
def test_a_finished_future_is_read_without_a_new_one(rt_name: str) -> None:
    def refuse() -> Any:
        raise AssertionError("a done future needs no waiter of its own")

    async def body(rt):
        shared = rt.create_future()
        shared.set_result("ready")
        return await await_own(shared, refuse)

    assert run_on(rt_name, body) == "ready"


@both
def test_task_and_job_handles_share_the_waiting_rule_and_keep_their_reprs(rt_name: str) -> None:
    spec = JobSpec("one", "1", [Stage("a", "llm", build=lambda inputs, results: {"input": inputs["x"]})])

    async def body(rt):
        # The calls outlast both 0.2 s waits by more than an asyncio timer may run late on a loaded
        # machine (ASYNCIO_LATENESS_S; with 1 s calls, two CPU hogs let the job finish first), and
        # stay within the default 60 s attempt timeout.
        latency_s = ASYNCIO_LATENESS_S + 1.0
        scheduler = Scheduler(rt, [ScriptedProvider(rt, latency_s=latency_s)], rng=random.Random(5))
        task = scheduler.submit("llm", {"input": "a"})
        job = scheduler.submit_job(spec, {"x": "b"})
        before = repr(task), repr(job)
        for handle in (task, job):  # each caller gives up once; the work must not care
            with pytest.raises(TimeoutError):
                await rt.wait_for(handle.wait(), 0.2)
        await rt.wait_for(scheduler.join(), latency_s + 2 * ASYNCIO_LATENESS_S)
        return before, (await task.wait()).status, (await job.wait()).status, await job, repr(task), repr(job)

    before, task_status, job_status, results, task_repr, job_repr = run_on(rt_name, body)
    assert before[0].startswith("<Submission ") and before[0].endswith(" pending>")
    assert before[1].startswith("<JobHandle ") and before[1].endswith(" pending>")
    assert task_repr.endswith(" done>") and job_repr.endswith(" done>")
    assert task_status is TaskStatus.SUCCEEDED and job_status is JobStatus.SUCCEEDED
    assert results == {"a": {"output": "done:b"}}
    assert issubclass(Submission, OutcomeHandle) and issubclass(JobHandle, OutcomeHandle)


@both
def test_a_job_handle_relays_an_exception_on_its_future_instead_of_hanging(rt_name: str) -> None:
    """JobHandle used to copy only a result: an exception raised inside its callback, and the
    waiter never resolved. It now waits as Submission does (the scheduler never ends a job with an
    exception today)."""

    class Broken(Exception):
        pass

    async def body(rt):
        scheduler = Scheduler(rt, [ScriptedProvider(rt, latency_s=1.0)], rng=random.Random(5))
        holder = PendingOutcome()
        handle = JobHandle(scheduler.jobs, "job-1", "key-1", holder)
        waiter = rt.spawn(handle.wait())
        await rt.sleep(1)
        resolve_with_error(holder, Broken("lost"))
        with pytest.raises(Broken):
            await rt.wait_for(waiter, 5)
        return True

    assert run_on(rt_name, body)
