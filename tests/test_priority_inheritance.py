"""A dedup owner inherits the highest priority of its waiters, on the virtual clock.

Concurrency 1 and fixed latencies make every time exact: before the fix, an interactive duplicate of a
queued background task finished after the whole background backlog (3.1 s here, as in the issue).
"""

from __future__ import annotations

from typing import Any

import pytest

from aiqsim import (
    ExponentialBackoff,
    Priority,
    QueueFullError,
    QuotaLimits,
    RetryPolicy,
    Scheduler,
    SimPyRuntime,
    TaskStatus,
)
from tests.fakes import ScriptedProvider

BACKLOG = 30


def _scheduler(runtime: Any, provider: ScriptedProvider, **kwargs: Any) -> Scheduler:
    return Scheduler(
        runtime,
        [provider],
        quotas={"llm": QuotaLimits(concurrency=1)},
        retry=RetryPolicy(backoff=ExponentialBackoff(0.5, 4.0)),
        **kwargs,
    )


def test_an_interactive_duplicate_of_a_queued_background_task_does_not_wait_for_the_backlog() -> None:
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=0.1)

    async def main() -> tuple[Any, Any, Any, Scheduler]:
        scheduler = _scheduler(runtime, provider, background_limit=None)
        backlog = [scheduler.submit("llm", {"input": f"b{i}"}) for i in range(BACKLOG + 1)]
        await runtime.sleep(0)  # the dispatcher starts b0
        assert scheduler.queued(Priority.BACKGROUND) == BACKLOG  # b0 runs, 30 wait
        duplicate = scheduler.submit("llm", {"input": f"b{BACKLOG}"}, priority=Priority.INTERACTIVE)
        assert scheduler.queued(Priority.BACKGROUND) == BACKLOG - 1  # the owner moved...
        assert scheduler.queued(Priority.INTERACTIVE) == 1  # ...into the interactive queue
        fresh = scheduler.submit("llm", {"input": "fresh"}, priority=Priority.INTERACTIVE)
        records = [await handle.wait() for handle in backlog]
        return records[-1], await duplicate.wait(), await fresh.wait(), scheduler

    owner, duplicate, fresh, _ = runtime.run(main())
    assert owner.status is TaskStatus.SUCCEEDED and duplicate.status is TaskStatus.DEDUPED
    assert duplicate.deduped_from == owner.id
    assert owner.started_at == pytest.approx(0.1)  # right after b0, not after the backlog (3.0)
    assert duplicate.finished_at == pytest.approx(0.2)  # was 3.1 s
    assert fresh.finished_at == pytest.approx(0.3)  # behind the promoted owner, which was first
    assert owner.priority is Priority.INTERACTIVE  # the owner's record carries what it inherited
    assert [name for _, name, _ in provider.calls][:3] == ["b0", f"b{BACKLOG}", "fresh"]


@pytest.mark.parametrize(
    ("duplicate_at", "where_the_owner_is"),
    [(1.2, "in backoff"), (1.6, "waiting for its retry ticket")],
)
def test_a_retrying_owner_inherits_for_its_next_attempt(duplicate_at: float, where_the_owner_is: str) -> None:
    """x fails at t=1 and retries from t=1.5 (backoff 0.5 s); three fresh interactive tasks queued at
    t=0.5 hold the only slot from t=1 to t=4. x's retry is background work and goes after them (t=4-5)
    unless an interactive duplicate lifts it: then it takes the slot as soon as it frees (t=2)."""
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0, script={"x": ["500", "ok"]})

    async def main() -> tuple[Any, Any]:
        scheduler = _scheduler(runtime, provider)
        owner = scheduler.submit("llm", {"input": "x"})
        await runtime.sleep(0.5)
        others = [
            scheduler.submit("llm", {"input": f"i{i}"}, priority=Priority.INTERACTIVE) for i in range(3)
        ]
        await runtime.sleep(duplicate_at - 0.5)
        duplicate = scheduler.submit("llm", {"input": "x"}, priority=Priority.INTERACTIVE)
        for handle in others:
            await handle.wait()
        return await owner.wait(), await duplicate.wait()

    owner, duplicate = runtime.run(main())
    assert owner.attempts == 2
    assert [(t, name) for t, name, _ in provider.calls if name == "x"] == [(0.0, "x"), (2.0, "x")], (
        where_the_owner_is
    )
    assert duplicate.finished_at == pytest.approx(3.0)  # 5.0 without inheritance


def test_a_lifted_owners_retry_tells_the_provider_its_new_priority() -> None:
    """Before: the retry of a background owner lifted by an interactive duplicate took its ticket in
    the interactive line, but its ProviderRequest still said BACKGROUND (the attempt loop built every
    request from the record it held at the first try; review)."""
    runtime = SimPyRuntime()
    seen: list[tuple[int, Priority]] = []

    class Recording(ScriptedProvider):
        async def call(self, request: Any) -> Any:
            seen.append((request.attempt, request.priority))
            return await super().call(request)

    provider = Recording(runtime, latency_s=1.0, script={"a": ["500", "ok"]})

    async def main() -> None:
        scheduler = _scheduler(runtime, provider)
        owner = scheduler.submit("llm", {"input": "a"}, priority=Priority.BACKGROUND)
        await runtime.sleep(1.2)  # the owner is in its backoff
        duplicate = scheduler.submit("llm", {"input": "a"}, priority=Priority.INTERACTIVE)
        await owner.wait()
        await duplicate.wait()

    runtime.run(main())
    assert seen == [(1, Priority.BACKGROUND), (2, Priority.INTERACTIVE)]


def test_a_running_owner_has_nothing_to_move_and_its_duplicate_is_exempt_from_the_limit() -> None:
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0)

    async def main() -> tuple[Any, Any, Scheduler]:
        scheduler = _scheduler(runtime, provider, interactive_limit=1)
        owner = scheduler.submit("llm", {"input": "x"})
        await runtime.sleep(0)  # x starts
        scheduler.submit("llm", {"input": "i0"}, priority=Priority.INTERACTIVE)  # the queue is full
        duplicate = scheduler.submit("llm", {"input": "x"}, priority=Priority.INTERACTIVE)  # owner runs
        return await owner.wait(), await duplicate.wait(), scheduler

    owner, duplicate, _ = runtime.run(main())
    assert owner.started_at == 0.0 and owner.finished_at == 1.0  # its call was in flight: nothing moved
    assert owner.priority is Priority.INTERACTIVE  # a retry would have been interactive work
    assert duplicate.status is TaskStatus.DEDUPED and duplicate.finished_at == 1.0


def test_a_duplicate_that_would_lift_its_owner_counts_against_the_interactive_limit() -> None:
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0)

    async def main() -> None:
        scheduler = _scheduler(runtime, provider, interactive_limit=1)
        scheduler.submit("llm", {"input": "busy"})  # takes the slot
        await runtime.sleep(0)
        owner = scheduler.submit("llm", {"input": "x"})  # queued background
        scheduler.submit("llm", {"input": "i0"}, priority=Priority.INTERACTIVE)  # interactive queue full
        records_before = len(scheduler.store.list_by_status())
        with pytest.raises(QueueFullError, match="interactive"):
            scheduler.submit("llm", {"input": "x"}, priority=Priority.INTERACTIVE)
        assert len(scheduler.store.list_by_status()) == records_before  # nothing written
        assert scheduler.queued(Priority.BACKGROUND) == 1  # the owner was not moved
        # a background duplicate lifts nothing and stays exempt
        background_duplicate = scheduler.submit("llm", {"input": "x"})
        assert (await background_duplicate.wait()).deduped_from == owner.id

    runtime.run(main())


def test_cancelling_a_lifted_owner_removes_it_from_the_queue_it_is_in() -> None:
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0)

    async def main() -> tuple[Any, Any, Scheduler]:
        scheduler = _scheduler(runtime, provider)
        scheduler.submit("llm", {"input": "busy"})
        await runtime.sleep(0)
        owner = scheduler.submit("llm", {"input": "x"})
        duplicate = scheduler.submit("llm", {"input": "x"}, priority=Priority.INTERACTIVE)
        assert scheduler.cancel(owner.id)
        assert scheduler.queued() == 1  # the duplicate took over the key and queued (interactive)
        return await owner.wait(), await duplicate.wait(), scheduler

    owner, duplicate, scheduler = runtime.run(main())
    assert owner.status is TaskStatus.CANCELLED
    assert duplicate.status is TaskStatus.SUCCEEDED and duplicate.finished_at == 2.0
    assert scheduler.queued() == 0


def test_an_owner_resumed_after_its_waiter_by_recovery_still_inherits(tmp_path: Any) -> None:
    """Recovery walks queued tasks in store order; a waiter listed before its owner (here: a failed
    interactive task retried by hand while a newer background task held its key) is attached before
    the owner is live. The owner must still go first when it is resumed."""
    from aiqsim import SqliteStore

    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0, script={"k": ["invalid", "ok"], "stuck": ["hang"]})
    store = SqliteStore(tmp_path / "tasks.sqlite3")

    async def main() -> tuple[Any, Any]:
        first = _scheduler(runtime, provider, store=store)
        failed = first.submit("llm", {"input": "k"}, priority=Priority.INTERACTIVE)
        assert (await failed.wait()).status is TaskStatus.FAILED
        first.submit("llm", {"input": "stuck"})  # holds the only slot until the crash
        await runtime.sleep(0.5)
        for i in range(5):
            first.submit("llm", {"input": f"b{i}"})
        owner = first.submit("llm", {"input": "k"})  # background, takes the failed task's key
        first.retry_failed(failed.id)  # now a waiter on the queued owner
        first.crash()
        second = _scheduler(runtime, provider, store=store)
        await second.recover()
        await second.join()
        return store.get(owner.id), store.get(failed.id)

    owner, waiter = runtime.run(main())
    store.close()
    after_crash = [name for _, name, _ in provider.calls[2:]]
    assert after_crash == ["k", "b0", "b1", "b2", "b3", "b4"]  # before the background queued ahead of it
    assert owner.priority is Priority.INTERACTIVE and owner.status is TaskStatus.SUCCEEDED
    assert waiter.status is TaskStatus.DEDUPED and waiter.deduped_from == owner.id


def _payload_p(inputs: Any, results: Any) -> dict[str, str]:
    return {"input": "P"}


def _payload_of_x(inputs: Any, results: Any) -> dict[str, str]:
    return {"input": f"A:{inputs['x']}"}


def test_an_interactive_duplicate_job_lifts_the_task_its_owners_stage_waits_on() -> None:
    """A background job whose stage duplicates a queued background task P, then an interactive
    duplicate of the job: P must move into the interactive queue, as for a plain interactive
    duplicate of P. Before, only the job's own stage task was raised, and it has nothing queued
    (it waits on P): the duplicate job finished after the whole backlog (t = 6.0, not 1.0)."""
    from aiqsim import JobSpec, Stage

    spec = JobSpec("j", "1", [Stage("a", "llm", build=_payload_p)])
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0)

    async def main() -> Any:
        scheduler = _scheduler(runtime, provider, background_limit=None)
        for i in range(5):
            scheduler.submit("llm", {"input": f"bg{i}"})  # a background backlog of 5 s
        scheduler.submit("llm", {"input": "P"})  # queued last
        scheduler.submit_job(spec, {"x": 1})  # its stage waits on P
        duplicate = scheduler.submit_job(spec, {"x": 1}, priority=Priority.INTERACTIVE)
        return await duplicate.wait()

    record = runtime.run(main())
    assert record.finished_at == pytest.approx(1.0)
    assert [name for _, name, _ in provider.calls][:2] == ["P", "bg0"]


def test_an_interactive_duplicate_job_that_would_lift_its_owner_counts_against_the_limit() -> None:
    """As a plain duplicate that would lift its queued owner counts against the interactive limit
    (above), so does a duplicate job whose owner job has a queued stage. Before, a duplicate job
    was never counted, and an interactive job got past interactive_limit=0."""
    from aiqsim import JobSpec, Stage

    spec = JobSpec("j", "1", [Stage("a", "llm", build=_payload_of_x)])
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=5.0)

    async def main() -> Any:
        scheduler = _scheduler(runtime, provider, interactive_limit=0, background_limit=None)
        scheduler.submit("llm", {"input": "busy"})  # the only slot, until t = 5
        owner = scheduler.submit_job(spec, {"x": 1})  # its stage waits in the background queue
        await runtime.sleep(1.0)
        with pytest.raises(QueueFullError, match="interactive"):
            scheduler.submit_job(spec, {"x": 1}, priority=Priority.INTERACTIVE)
        assert scheduler.queued(Priority.BACKGROUND) == 1  # the owner's stage was not moved
        background_duplicate = scheduler.submit_job(spec, {"x": 1})  # lifts nothing: exempt
        return await owner.wait(), await background_duplicate.wait()

    owner, duplicate = runtime.run(main())
    assert owner.finished_at == pytest.approx(10.0)
    assert duplicate.deduped_from == owner.id
