"""A pipeline changed under the same name and version, found after a restart, finished or not.

The job key holds the spec, so a changed spec gave a new key: resubmitted after a restart with the
same inputs, it ran as a new job next to the finished one (the store then held two finished jobs for
the same inputs), while an unfinished one was caught by recovery. Both are now refused, with one
message, on a durable store (SQLite, and a real PostgreSQL server).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from aiqsim import JobSpec, JobSpecError, JobStatus, Scheduler, SimPyRuntime, Stage
from aiqsim.stores import SqliteStore
from tests.fakes import ScriptedProvider


def first(inputs: Any, results: Any) -> Any:
    return {"input": f"first:{inputs['x']}"}


def second(inputs: Any, results: Any) -> Any:
    return {"input": f"second:{results['a']['output']}"}


def other_second(inputs: Any, results: Any) -> Any:
    return {"input": f"other:{results['a']['output']}"}


SPEC = JobSpec("chain", "1", [Stage("a", "a", build=first), Stage("b", "b", after=("a",), build=second)])
CHANGED = JobSpec(
    "chain", "1", [Stage("a", "a", build=first), Stage("b", "b", after=("a",), build=other_second)]
)


@pytest.fixture(params=["sqlite", "postgres"])
def open_store(request: Any, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    """Opens the same durable store again each time it is called: each call is a restarted process."""
    if request.param == "sqlite":
        yield lambda: SqliteStore(tmp_path / "jobs.db")
        return
    import psycopg

    from aiqsim.stores.postgres import PostgresStore

    dsn = request.getfixturevalue("postgres_dsn")
    schema = f"t_{random.Random(str(tmp_path)).getrandbits(48):012x}"
    yield lambda: PostgresStore(dsn, schema=schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def run_process(
    open_store: Callable[[], Any], body: Callable[[Scheduler], Any], until: float | None = None
) -> Any:
    runtime = SimPyRuntime()
    store = open_store()
    providers = [ScriptedProvider(runtime, name=name, latency_s=1.0) for name in ("a", "b")]
    scheduler = Scheduler(runtime, providers, store=store, rng=random.Random(5))
    try:
        return (
            runtime.run(body(scheduler), until=until) if until is not None else runtime.run(body(scheduler))
        )
    finally:
        store.close()


def test_a_changed_spec_is_refused_after_a_restart_whether_its_job_finished_or_not(
    open_store: Callable[[], Any],
) -> None:
    async def finish(scheduler: Scheduler) -> Any:
        return await scheduler.submit_job(SPEC, {"x": 1}, job_id="done").wait()

    assert run_process(open_store, finish).status is JobStatus.SUCCEEDED

    async def resubmit_changed(scheduler: Scheduler) -> str:
        with pytest.raises(JobSpecError) as refused:
            scheduler.submit_job(CHANGED, {"x": 1}, job_id="again")
        return str(refused.value)

    refused_finished = run_process(open_store, resubmit_changed)

    async def start(scheduler: Scheduler) -> None:
        scheduler.submit_job(SPEC, {"x": 2}, job_id="in-flight")
        await scheduler.runtime.sleep(1.5)  # stage a done, b's call in flight: then the process stops
        scheduler.crash()

    run_process(open_store, start)

    async def recover_with_changed(scheduler: Scheduler) -> Any:
        scheduler.jobs.register(CHANGED)
        await scheduler.recover()
        return scheduler.store.get_job("in-flight")

    in_flight = run_process(open_store, recover_with_changed)
    assert in_flight.status is JobStatus.FAILED
    # one message, naming the job each was found by
    problem = in_flight.error.removeprefix("job cannot continue: ")
    assert refused_finished == problem.replace("'in-flight'", "'done'") + "; no job was submitted"
    assert re.search(
        r"differs from the one job 'done' was submitted with.*needs a new version", refused_finished
    )

    async def same_spec_still_runs(scheduler: Scheduler) -> Any:
        return await scheduler.submit_job(SPEC, {"x": 3}).wait()

    # the last stored job ("in-flight", failed) was the original spec's: the original is accepted
    assert run_process(open_store, same_spec_still_runs).status is JobStatus.SUCCEEDED
