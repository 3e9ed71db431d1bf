"""A duplicate waiting on another process's run, when that run's record cannot be read any more.

Two schedulers share one SQLite file, as two processes do: a duplicate submitted to the second
waits on the first's run by polling the owner's record. If that record turns corrupt (a hand edit,
a bad migration) or the store is closed under the scheduler, reading it again cannot help. Before,
the watcher died with the error and its duplicates waited for ever (a review finding); now each
of them resolves with an error that says why, and the scheduler can be joined. Each also sends
an :class:`~aiqsim.scheduler.events.OwnerUnreadable` event to the scheduler's event sink first
(before, a user watching events saw nothing of it).
"""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from aiqsim import JobSpec, JobStatus, Scheduler, SimPyRuntime, Stage
from aiqsim.core.task import TaskStatus
from aiqsim.scheduler import JobTransition, OwnerUnreadable
from aiqsim.stores import SqliteStore, StoreClosedError, StoreCorruptError
from tests.fakes import ScriptedProvider

POLL_S = 0.25


def _stage_a(inputs: dict, results: dict) -> dict:
    return {"input": f"a:{inputs['x']}"}


def _unreadable(events: list) -> list[OwnerUnreadable]:
    return [event for event in events if isinstance(event, OwnerUnreadable)]


def _hand_edit(path: Path, statement: str) -> None:
    """Change the file behind the store's back, as another program would."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(statement)
    finally:
        conn.close()


def test_duplicates_of_a_task_whose_record_turned_corrupt_resolve_with_the_error(tmp_path: Path) -> None:
    runtime = SimPyRuntime()
    path = tmp_path / "shared.db"
    store = SqliteStore(path, validate=False)  # rows are checked as they are read
    slow = ScriptedProvider(runtime, latency_s=10.0)
    two_provider = ScriptedProvider(runtime, latency_s=1.0)

    seen: list = []

    async def main():
        one = Scheduler(runtime, [slow], store=store, duplicate_poll_s=POLL_S, worker_id="one")
        two = Scheduler(
            runtime, [two_provider], store=store, duplicate_poll_s=POLL_S, worker_id="two", events=seen.append
        )
        owner = one.submit("llm", {"input": "a"}, task_id="owner")
        await runtime.sleep(0.1)
        first = two.submit("llm", {"input": "a"}, task_id="d1")  # both wait on process one's run
        second = two.submit("llm", {"input": "a"}, task_id="d2")
        await runtime.sleep(0.9)  # t = 1.0, between two polls (0.35, 0.6, ..., 0.85, 1.1)
        _hand_edit(path, "UPDATE tasks SET status = 'zombie' WHERE id = 'owner'")
        outcomes = []
        for duplicate in (first, second):
            with pytest.raises(StoreCorruptError) as caught:
                await duplicate
            outcomes.append((str(caught.value), runtime.now()))
        await two.join()  # nothing of process two is left waiting
        return outcomes, two, await owner.wait()

    outcomes, two, owner = runtime.run(main())
    for (message, when), task_id in zip(outcomes, ("d1", "d2"), strict=True):
        assert f"task {task_id!r} duplicates task 'owner' of another process" in message
        assert "invalid status 'zombie'" in message and "stays queued for recover()" in message
        assert when == pytest.approx(1.1)  # at the first poll after the edit
    assert two.anomalies["owner_unreadable"] == 1
    told = _unreadable(seen)  # one event per duplicate, for a user watching the events
    assert [(e.time, e.kind, e.waiter_id, e.owner_id) for e in told] == [
        (pytest.approx(1.1), "task", "d1", "owner"),
        (pytest.approx(1.1), "task", "d2", "owner"),
    ]
    key = store.get("d1").key
    assert all(e.key == key and e.error.startswith("StoreCorruptError: ") for e in told)
    assert all("invalid status 'zombie'" in e.error for e in told)
    assert not runtime.task_errors  # the watcher did not die with the error
    assert [name for _, name, _ in two_provider.calls] == []  # nothing was sent twice
    assert owner.status is TaskStatus.SUCCEEDED  # process one's own run is not disturbed
    store.close()
    with SqliteStore(path) as again:  # the duplicates' records stay queued for recover()
        assert {r.id for r in again.list_by_status(TaskStatus.QUEUED)} == {"d1", "d2"}


def test_a_duplicate_waiting_when_its_store_is_closed_resolves_with_the_error(tmp_path: Path) -> None:
    runtime = SimPyRuntime()
    store = SqliteStore(tmp_path / "shared.db")
    slow = ScriptedProvider(runtime, latency_s=10.0)
    seen: list = []

    async def main():
        one = Scheduler(runtime, [slow], store=store, duplicate_poll_s=POLL_S, worker_id="one")
        two = Scheduler(
            runtime, [ScriptedProvider(runtime)], store=store, duplicate_poll_s=POLL_S, events=seen.append
        )
        one.submit("llm", {"input": "a"}, task_id="owner")
        await runtime.sleep(0.1)
        duplicate = two.submit("llm", {"input": "a"}, task_id="d")
        await runtime.sleep(0.5)
        store.close()
        with pytest.raises(StoreClosedError, match="task 'd' duplicates task 'owner'"):
            await duplicate
        await two.join()
        return two

    two = runtime.run(main(), until=5.0)  # process one's run cannot finish on a closed store
    assert two.anomalies["owner_unreadable"] == 1
    (told,) = _unreadable(seen)
    assert (told.kind, told.waiter_id, told.owner_id) == ("task", "d", "owner")
    assert told.error.startswith("StoreClosedError: ")


def test_a_duplicate_job_whose_owner_record_turned_corrupt_fails_saying_why(tmp_path: Path) -> None:
    runtime = SimPyRuntime()
    path = tmp_path / "shared.db"
    store = SqliteStore(path, validate=False)
    spec = JobSpec("x", "1", [Stage("a", "llm", build=_stage_a)])
    two_provider = ScriptedProvider(runtime, latency_s=1.0)
    seen: list = []

    async def main():
        common = {"store": store, "duplicate_poll_s": POLL_S, "rng": random.Random(3)}
        one = Scheduler(runtime, [ScriptedProvider(runtime, latency_s=10.0)], worker_id="one", **common)
        two = Scheduler(runtime, [two_provider], worker_id="two", events=seen.append, **common)
        owner = one.submit_job(spec, {"x": 1}, job_id="owner")
        await runtime.sleep(0.1)
        duplicate = two.submit_job(spec, {"x": 1}, job_id="duplicate")
        await runtime.sleep(0.9)
        _hand_edit(path, "UPDATE jobs SET status = 'zombie' WHERE id = 'owner'")
        record = await duplicate.wait()
        await two.join()
        return record, two, await owner.wait()

    record, two, owner = runtime.run(main())
    assert record.status is JobStatus.FAILED
    assert record.error is not None and record.error.startswith("store failed: StoreCorruptError")
    assert "zombie" in record.error
    assert record.finished_at == pytest.approx(1.1)
    assert two.anomalies["owner_unreadable"] == 1 and not runtime.task_errors
    (told,) = _unreadable(seen)
    assert (told.time, told.kind, told.waiter_id, told.key, told.owner_id) == (
        pytest.approx(1.1),
        "job",
        "duplicate",
        record.key,
        "owner",
    )
    assert told.error.startswith("StoreCorruptError: ") and "zombie" in told.error
    failed = [e for e in seen if isinstance(e, JobTransition) and e.new == "failed"]
    assert [e.job_id for e in failed] == ["duplicate"]
    assert seen.index(told) < seen.index(failed[0])  # why, before the failure it explains
    assert two_provider.calls == []
    assert owner.status is JobStatus.SUCCEEDED
    store.close()


def _shared_stage(inputs: dict, results: dict) -> dict:
    return {"input": "shared"}  # the same payload, so the same task key, for every job


def test_a_job_whose_stage_duplicates_an_unreadable_task_of_another_process_fails_saying_why(
    tmp_path: Path,
) -> None:
    """The stage's task leaves the scheduler with the error; its job must hear of it, not wait
    for ever on a stage that will not end."""
    runtime = SimPyRuntime()
    path = tmp_path / "shared.db"
    store = SqliteStore(path, validate=False)
    spec = JobSpec("x", "1", [Stage("a", "llm", build=_shared_stage)])
    two_provider = ScriptedProvider(runtime, latency_s=1.0)
    seen: list = []

    async def main():
        common = {"store": store, "duplicate_poll_s": POLL_S, "rng": random.Random(5)}
        one = Scheduler(runtime, [ScriptedProvider(runtime, latency_s=10.0)], worker_id="one", **common)
        two = Scheduler(runtime, [two_provider], worker_id="two", events=seen.append, **common)
        one.submit_job(spec, {"x": 1}, job_id="owner")
        await runtime.sleep(0.1)
        duplicate = two.submit_job(spec, {"x": 2}, job_id="other")  # another job, the same stage task
        await runtime.sleep(0.9)
        (owner_task,) = store.get_job("owner").stage_tasks["a"]
        _hand_edit(path, f"UPDATE tasks SET status = 'zombie' WHERE id = '{owner_task}'")
        record = await duplicate.wait()
        await two.join()
        return record, two, owner_task

    record, two, owner_task = runtime.run(main(), until=5.0)
    assert record.status is JobStatus.FAILED and record.error is not None
    assert record.error.startswith("store failed: StoreCorruptError") and "zombie" in record.error
    assert record.finished_at == pytest.approx(1.1)
    assert two.anomalies["owner_unreadable"] == 1 and not runtime.task_errors
    (told,) = _unreadable(seen)  # the stage's task stopped waiting: a task's event
    (stage_task,) = store.get_job("other").stage_tasks["a"]
    assert (told.kind, told.waiter_id, told.owner_id) == ("task", stage_task, owner_task)
    assert two_provider.calls == []
    store.close()
