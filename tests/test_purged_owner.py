"""A duplicate waiting on another process's run, when a retention purge takes that run's record first.

Two schedulers share one store, as two processes share one database: a duplicate submitted to the
second waits on the first's run by polling the owner's record every ``duplicate_poll_s``. If the run
ends and a purge (``RetentionPolicy`` with a finished TTL shorter than the poll) deletes the record
and its key before the next poll, the waiter finds nothing. It must then take the key over, as after a
cancelled owner, and run the call itself: waiting on a record that no longer exists would hang for
ever (found while making the retention policy purge jobs).
"""

from __future__ import annotations

import random

import pytest

from aiqsim import JobSpec, JobStatus, Scheduler, SimPyRuntime, Stage, TaskStatus
from aiqsim.stores import MemoryStore
from tests.fakes import ScriptedProvider

POLL_S = 0.25


def _stage_a(inputs: dict, results: dict) -> dict:
    return {"input": f"a:{inputs['x']}"}


def _purge_everything_finished(store: MemoryStore, now: float) -> None:
    report = store.purge(now, finished_older_than_s=0.0, keys_older_than_s=0.0)
    assert report.tasks_removed + report.jobs_removed > 0  # the owner's record is gone


def test_a_duplicate_whose_foreign_owner_was_purged_takes_the_key_over_and_runs() -> None:
    runtime = SimPyRuntime()
    store = MemoryStore()  # shared, as two processes share one SQLite file
    one_provider = ScriptedProvider(runtime, latency_s=2.0)
    two_provider = ScriptedProvider(runtime, latency_s=2.0)

    async def main():
        one = Scheduler(runtime, [one_provider], store=store, duplicate_poll_s=POLL_S, worker_id="one")
        two = Scheduler(runtime, [two_provider], store=store, duplicate_poll_s=POLL_S, worker_id="two")
        owner = one.submit("llm", {"input": "a"}, task_id="owner")
        await runtime.sleep(0.1)
        duplicate = two.submit("llm", {"input": "a"}, task_id="duplicate")  # waits on process one
        await runtime.sleep(0.2)  # t = 0.3: polled at 0.35, 0.6, ...
        one.cancel("owner")
        await runtime.sleep(0.01)
        _purge_everything_finished(store, runtime.now())  # before the duplicate's next poll
        return await owner.wait(), await duplicate.wait()

    owner, duplicate = runtime.run(main())
    assert owner.status is TaskStatus.CANCELLED
    assert duplicate.status is TaskStatus.SUCCEEDED and duplicate.result == {"output": "done:a"}
    assert [name for _, name, _ in two_provider.calls] == ["a"]  # process two ran it after the purge
    assert duplicate.started_at == pytest.approx(0.35)  # at the first poll after the purge
    assert store.owner_of(duplicate.key).id == "duplicate"


def test_a_duplicate_job_whose_foreign_owner_was_purged_takes_the_key_over_and_runs() -> None:
    runtime = SimPyRuntime()
    store = MemoryStore()
    spec = JobSpec("x", "1", [Stage("a", "llm", build=_stage_a)])
    one_provider = ScriptedProvider(runtime, latency_s=2.0)
    two_provider = ScriptedProvider(runtime, latency_s=2.0)

    async def main():
        common = {"store": store, "duplicate_poll_s": POLL_S, "rng": random.Random(3)}
        one = Scheduler(runtime, [one_provider], worker_id="one", **common)
        two = Scheduler(runtime, [two_provider], worker_id="two", **common)
        owner = one.submit_job(spec, {"x": 1}, job_id="owner")
        await runtime.sleep(0.1)
        duplicate = two.submit_job(spec, {"x": 1}, job_id="duplicate")
        await runtime.sleep(0.2)
        owner.cancel()
        await runtime.sleep(0.01)
        _purge_everything_finished(store, runtime.now())
        return await owner.wait(), await duplicate.wait()

    owner, duplicate = runtime.run(main())
    assert owner.status is JobStatus.CANCELLED
    assert duplicate.status is JobStatus.SUCCEEDED
    assert [name for _, name, _ in two_provider.calls] == ["a:1"]
