"""``close()`` after ``crash()`` returns: a worker whose lease was lost must exit, not hang.

``LeaseKeeper`` calls ``scheduler.crash()`` when its lease is lost, and the worker then leaves its
``async with Scheduler(...)`` block for its supervisor to restart it. ``close()`` used to wait for the
live tasks to finish, which crashed tasks never do (nothing more is written for them), so the
worker hung. The crashed tasks stay as the store has them, for the next process's ``recover()``.
"""

from __future__ import annotations

import pytest

from aiqsim import MemoryStore, QuotaLimits, Scheduler, TaskStatus
from aiqsim.core.task import Priority
from aiqsim.scheduler.job_spec import JobSpec, Stage
from tests.runtimes import RUNTIMES, run_on

both = pytest.mark.parametrize("rt_name", RUNTIMES)


class BlockedProvider:
    """Every call blocks until the test process ends (a provider that never answers)."""

    name = "llm"

    def __init__(self, runtime) -> None:
        self.runtime = runtime
        self.calls = 0

    async def call(self, request):
        self.calls += 1
        await self.runtime.create_future()
        raise AssertionError("a blocked call never answers")


def _live_work(scheduler: Scheduler) -> list:
    """A running task blocked in its provider, a queued one behind it and a waiting duplicate."""
    return [
        scheduler.submit("llm", {"input": "a"}, key="a"),
        scheduler.submit("llm", {"input": "b"}, key="b"),
        scheduler.submit("llm", {"input": "a"}, key="a"),
    ]


@both
def test_close_after_crash_returns_and_leaves_the_store_as_it_was(rt_name: str) -> None:
    async def body(rt):
        store = MemoryStore()
        provider = BlockedProvider(rt)
        scheduler = Scheduler(rt, [provider], store=store, quotas={"llm": QuotaLimits(concurrency=1)})
        submissions = _live_work(scheduler)
        await rt.sleep(1.0)
        assert provider.calls == 1
        scheduler.crash()
        await rt.wait_for(scheduler.close(), 50.0)  # hung for ever before the fix
        return [store.get(s.id).status for s in submissions]

    statuses = run_on(rt_name, body)
    assert statuses == [TaskStatus.RUNNING, TaskStatus.QUEUED, TaskStatus.QUEUED]


@both
def test_leaving_async_with_after_crash_returns(rt_name: str) -> None:
    async def body(rt):
        store = MemoryStore()
        provider = BlockedProvider(rt)
        async with Scheduler(rt, [provider], store=store, quotas={"llm": QuotaLimits(concurrency=1)}) as s:
            submission = s.submit("llm", {"input": "a"}, key="a")
            await rt.sleep(1.0)
            s.crash()
        return store.get(submission.id).status

    assert run_on(rt_name, lambda rt: rt.wait_for(body(rt), 50.0)) is TaskStatus.RUNNING


@both
def test_close_after_crash_returns_with_a_job_in_flight(rt_name: str) -> None:
    async def body(rt):
        store = MemoryStore()
        provider = BlockedProvider(rt)
        scheduler = Scheduler(rt, [provider], store=store)
        spec = JobSpec("one", "1", [Stage("ask", "llm")])
        job = scheduler.submit_job(spec, "x", priority=Priority.BACKGROUND)
        await rt.sleep(1.0)
        assert provider.calls == 1
        scheduler.crash()
        await rt.wait_for(scheduler.close(), 50.0)
        return job

    run_on(rt_name, body)


@both
def test_a_crash_during_a_graceful_close_ends_the_close(rt_name: str) -> None:
    """The keeper may crash the scheduler while the worker is already draining it."""

    async def body(rt):
        store = MemoryStore()
        provider = BlockedProvider(rt)
        scheduler = Scheduler(rt, [provider], store=store)
        submission = scheduler.submit("llm", {"input": "a"}, key="a")
        await rt.sleep(1.0)
        closing = rt.spawn(scheduler.close(cancel_pending=False))
        await rt.sleep(1.0)
        assert not closing.done()  # a graceful close waits for the live task
        scheduler.crash()
        await rt.wait_for(closing, 50.0)
        return store.get(submission.id).status

    assert run_on(rt_name, body) is TaskStatus.RUNNING
