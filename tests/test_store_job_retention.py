"""Retention of jobs: ``store.purge`` deletes finished jobs by the task rule, in the same call.

The rule (:func:`aiqsim.stores.base.plan_purge`, module docs of :mod:`aiqsim.stores.retention`),
applied to the job table of every store: terminal jobs go after ``finished_older_than_s``; a succeeded
job that owns its key stays, with the key, until ``keys_older_than_s`` so a duplicate job submission is
still answered from it; queued and running jobs, and live owners' keys, are never touched; a job
stamped after ``now`` is kept. Then, on the scheduler: a duplicate submitted after the key TTL runs
again, and a running job whose finished stages' tasks were purged still completes, and recovers.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiqsim import JobSpec, RetryPolicy, Scheduler, SimPyRuntime, Stage
from aiqsim.core.job import JobRecord, JobStatus, job_transition
from aiqsim.stores import JsonFileStore, PurgeReport, RetentionPolicy, SqliteStore, TaskStore
from aiqsim.stores.base import PurgeCandidate, plan_purge
from tests.fakes import ScriptedProvider
from tests.test_store_retention import (
    _POSTGRES,
    DAY,
    FINISHED_TTL,
    HOUR,
    KEYS_TTL,
    NOW,
    _schema_for,
    open_store,
    populate,
)


@pytest.fixture(params=["memory", "json", "sqlite", "postgres"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TaskStore]:
    """Each real store in turn (PostgreSQL: a schema of its own on the session's server, dropped after)."""
    if request.param == "postgres":
        _POSTGRES["dsn"] = request.getfixturevalue("postgres_dsn")
    opened = open_store(request.param, tmp_path)
    yield opened
    opened.close()
    if request.param == "postgres":
        import psycopg

        with psycopg.connect(_POSTGRES["dsn"], autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {_schema_for(tmp_path)} CASCADE")


def new_job(job_id: str, key: str, created: float) -> JobRecord:
    return JobRecord(
        id=job_id, key=key, name="pipe", version="1", created_at=created, updated_at=created, inputs={"x": 1}
    )


def finish_job(store: TaskStore, job: JobRecord, status: JobStatus, at: float) -> JobRecord:
    if status in (JobStatus.SUCCEEDED, JobStatus.FAILED):
        job = job_transition(job, JobStatus.RUNNING, at - 1.0, stage_tasks={"a": ["t-" + job.id]})
        store.update_job(job)  # type: ignore[attr-defined]
    done = job_transition(job, status, at, results={"a": {"out": 1}} if status is JobStatus.SUCCEEDED else {})
    store.update_job(done)  # type: ignore[attr-defined]
    return done


def populate_jobs(store: TaskStore) -> None:
    """One job of every kind the rule distinguishes (names say status and age)."""
    ancient, old, recent, future = NOW - 10 * DAY, NOW - 2 * DAY, NOW - HOUR, NOW + HOUR
    claim = store.insert_and_claim_job  # type: ignore[attr-defined]
    finish_job(store, claim(new_job("ok-ancient", "j-ancient", ancient - 5)), JobStatus.SUCCEEDED, ancient)
    finish_job(store, claim(new_job("ok-old", "j-old", old - 5)), JobStatus.SUCCEEDED, old)
    finish_job(store, claim(new_job("ok-recent", "j-recent", recent - 5)), JobStatus.SUCCEEDED, recent)
    assert claim(new_job("dup-old", "j-old", old - 3)).id == "ok-old"  # answered by the owner
    finish_job(store, store.get_job("dup-old"), JobStatus.DEDUPED, old)  # type: ignore[attr-defined]
    finish_job(store, claim(new_job("failed-old", "j-failed", old - 5)), JobStatus.FAILED, old)
    finish_job(store, claim(new_job("cancel-old", "j-cancel", old - 5)), JobStatus.CANCELLED, old)
    claim(new_job("queued-ancient", "j-queued", ancient - 5))
    running = claim(new_job("running-ancient", "j-running", ancient - 5))
    store.update_job(job_transition(running, JobStatus.RUNNING, ancient))  # type: ignore[attr-defined]
    # stamped after `now` (another clock origin): kept, whatever the TTLs
    finish_job(store, claim(new_job("ok-future", "j-future", future - 5)), JobStatus.FAILED, future)


EXPECTED_JOBS_KEPT = ["ok-old", "ok-recent", "queued-ancient", "running-ancient", "ok-future"]
EXPECTED_TASKS_KEPT = ["ok-old", "ok-recent", "queued-ancient", "running-ancient"]


def job_ids(store: TaskStore) -> list[str]:
    return sorted(job.id for job in store.list_jobs())  # type: ignore[attr-defined]


def test_purge_removes_finished_jobs_in_the_same_call_and_keeps_job_dedup_working(
    any_store: TaskStore,
) -> None:
    store = any_store
    populate(store)
    populate_jobs(store)
    report = RetentionPolicy(finished_ttl_s=FINISHED_TTL, keys_ttl_s=KEYS_TTL).purge(store, NOW)

    assert job_ids(store) == sorted(EXPECTED_JOBS_KEPT)
    assert sorted(t.id for t in store.list_by_status()) == sorted(EXPECTED_TASKS_KEPT)
    # tasks: ancient owner + its key, the duplicate, failed and cancelled owners with their keys
    assert (report.tasks_removed, report.keys_removed, report.kept_for_keys) == (4, 3, 1)
    # jobs by the same rule: ok-ancient, dup-old, failed-old, cancel-old; keys of the three owners
    assert (report.jobs_removed, report.job_keys_removed) == (4, 3)

    owner_of = store.job_owner_of  # type: ignore[attr-defined]
    assert owner_of("j-old").id == "ok-old"  # past the finished TTL, inside the key TTL: still answers
    assert owner_of("j-queued").id == "queued-ancient" and owner_of("j-running").id == "running-ancient"
    assert owner_of("j-future").id == "ok-future"
    for gone in ("j-ancient", "j-failed", "j-cancel"):
        assert owner_of(gone) is None
    claim = store.insert_and_claim_job  # type: ignore[attr-defined]
    assert claim(new_job("again-old", "j-old", NOW)).id == "ok-old"  # within the key TTL: deduped
    assert claim(new_job("again-ancient", "j-ancient", NOW)).id == "again-ancient"  # after it: runs again

    second = store.purge(NOW, finished_older_than_s=FINISHED_TTL, keys_older_than_s=KEYS_TTL)
    assert (second.jobs_removed, second.job_keys_removed, second.tasks_removed) == (0, 0, 0)


def test_the_succeeded_job_owner_goes_with_its_key_once_the_key_ttl_passes(any_store: TaskStore) -> None:
    store = any_store
    populate_jobs(store)
    report = store.purge(NOW + 6 * DAY, finished_older_than_s=FINISHED_TTL, keys_older_than_s=KEYS_TTL)
    assert "ok-old" not in job_ids(store) and store.job_owner_of("j-old") is None  # type: ignore[attr-defined]
    assert "ok-recent" in job_ids(store)  # 6 days + 1 hour: its key still answers
    # ok-ancient, dup-old, failed-old, cancel-old, ok-old, and ok-future (now 6 days old, failed)
    assert (report.jobs_removed, report.job_keys_removed) == (6, 5)
    assert report.tasks_removed == 0 and report.keys_removed == 0  # no tasks in this store


def test_a_key_ttl_shorter_than_the_finished_ttl_drops_the_job_key_and_keeps_the_job(
    any_store: TaskStore,
) -> None:
    store = any_store
    populate_jobs(store)
    report = store.purge(NOW, finished_older_than_s=KEYS_TTL, keys_older_than_s=HOUR / 2)
    kept = job_ids(store)
    assert "ok-recent" in kept and "ok-old" in kept and "ok-ancient" not in kept  # ancient: 10 days > 7
    for key in ("j-recent", "j-old", "j-ancient"):
        assert store.job_owner_of(key) is None  # type: ignore[attr-defined]
    assert store.job_owner_of("j-running").id == "running-ancient"  # type: ignore[attr-defined]
    assert (report.jobs_removed, report.job_keys_removed) == (1, 3)


def test_infinite_ttls_keep_every_job(any_store: TaskStore) -> None:
    store = any_store
    populate_jobs(store)
    report = store.purge(NOW, finished_older_than_s=float("inf"), keys_older_than_s=float("inf"))
    assert (report.jobs_removed, report.job_keys_removed) == (0, 0)
    assert len(job_ids(store)) == 9


def test_random_job_histories_never_lose_a_live_job_or_an_unexpired_answer(any_store: TaskStore) -> None:
    """Jobs of random status and age on a few shared keys; after a purge every survivor and every
    deletion is what the rule says, checked record by record (seeded: a failure replays)."""
    store = any_store
    rng = random.Random(1234)
    claim = store.insert_and_claim_job  # type: ignore[attr-defined]
    terminal = [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED]
    for n in range(40):
        created = NOW - rng.uniform(0, 12 * DAY)
        job = claim(new_job(f"j{n}", f"key{rng.randrange(8)}", created))
        job = store.get_job(f"j{n}")  # type: ignore[attr-defined]
        if rng.random() < 0.8:
            owns = store.job_owner_of(job.key).id == job.id  # type: ignore[attr-defined]
            status = rng.choice(terminal) if owns else JobStatus.DEDUPED
            finish_job(store, job, status, min(NOW, created + rng.uniform(1, DAY)))
    before = {job.id: job for job in store.list_jobs()}  # type: ignore[attr-defined]
    owners = {job.key: store.job_owner_of(job.key) for job in before.values()}  # type: ignore[attr-defined]
    report = store.purge(NOW, finished_older_than_s=2 * DAY, keys_older_than_s=5 * DAY)
    after = set(job_ids(store))
    for job in before.values():
        age = NOW - job.finished_at if job.finished_at is not None else None
        owner = owners[job.key]
        answers = owner is not None and owner.id == job.id and job.status is JobStatus.SUCCEEDED
        if not job.status.is_terminal:
            assert job.id in after, job
        elif answers:
            assert (job.id in after) == (age < 5 * DAY), job
        else:
            assert (job.id in after) == (age < 2 * DAY), job
    assert report.jobs_removed == len(before) - len(after)


def test_the_job_rule_is_the_task_rule() -> None:
    """One rule: a plan over job candidates is :func:`plan_purge` itself (no job copy to drift)."""
    candidates = [
        PurgeCandidate("a", "k1", JobStatus.SUCCEEDED, NOW - 3 * DAY, True),
        PurgeCandidate("b", "k1", JobStatus.DEDUPED, NOW - 3 * DAY, False),
        PurgeCandidate("c", "k2", JobStatus.RUNNING, NOW - 30 * DAY, True),
    ]
    plan = plan_purge(candidates, now=NOW, finished_older_than_s=DAY, keys_older_than_s=KEYS_TTL)
    assert plan.task_ids == ("b",) and plan.keys == () and plan.kept_for_keys == 1


def test_purge_report_job_counts_default_to_zero() -> None:
    report = PurgeReport(
        now=1.0,
        finished_older_than_s=2.0,
        keys_older_than_s=3.0,
        tasks_removed=4,
        keys_removed=5,
        kept_for_keys=6,
    )
    assert (report.jobs_removed, report.job_keys_removed) == (0, 0)
    assert report.tasks_removed == 4 and report.kept_for_keys == 6


@pytest.mark.parametrize("kind_", ["json", "sqlite"])
def test_the_job_purge_is_durable_across_a_reopen(kind_: str, tmp_path: Path) -> None:
    first = open_store(kind_, tmp_path)
    populate(first)
    populate_jobs(first)
    first.purge(NOW, finished_older_than_s=FINISHED_TTL, keys_older_than_s=KEYS_TTL)
    first.close()
    reopened = open_store(kind_, tmp_path)
    try:
        assert job_ids(reopened) == sorted(EXPECTED_JOBS_KEPT)
        assert reopened.job_owner_of("j-ancient") is None  # type: ignore[attr-defined]
        assert reopened.job_owner_of("j-old").id == "ok-old"  # type: ignore[attr-defined]
    finally:
        reopened.close()


def test_json_journal_replays_a_job_purge_entry(tmp_path: Path) -> None:
    """A purge entry naming jobs, replayed from the journal (no snapshot folded it in yet)."""
    path = tmp_path / "tasks.json"
    first = JsonFileStore(path)
    populate_jobs(first)
    first.compact = lambda: None  # type: ignore[method-assign]  # keep the purge entry in the journal
    first.purge(NOW, finished_older_than_s=FINISHED_TTL, keys_older_than_s=KEYS_TTL)
    first.close()
    assert b'"jobs":[' in path.with_name("tasks.json.journal").read_bytes()
    with JsonFileStore(path) as reopened:
        assert job_ids(reopened) == sorted(EXPECTED_JOBS_KEPT)
        assert reopened.job_owner_of("j-failed") is None


# ---------------------------------------------------------------------------- on the scheduler
def stage_input(name: str):  # type: ignore[no-untyped-def]
    def build(inputs, results):  # type: ignore[no-untyped-def]
        return {"input": f"{name}:{inputs['x']}:{sorted(results)}"}

    build.__qualname__ = f"stage_input_{name}"
    return build


CHAIN = JobSpec(
    "chain3",
    "1",
    [
        Stage("a", "a", build=stage_input("a")),
        Stage("b", "b", after=("a",), build=stage_input("b")),
        Stage("c", "a", after=("b",), build=stage_input("c")),
    ],
)


def make_scheduler(runtime: SimPyRuntime, store: TaskStore, provs: dict[str, ScriptedProvider]) -> Scheduler:
    scheduler = Scheduler(
        runtime, list(provs.values()), store=store, rng=random.Random(7), retry=RetryPolicy(max_attempts=2)
    )
    scheduler.jobs.register(CHAIN)
    return scheduler


def test_a_duplicate_job_within_the_key_ttl_is_deduped_and_after_it_runs_again(tmp_path: Path) -> None:
    runtime = SimPyRuntime()
    store = SqliteStore(tmp_path / "jobs.sqlite")
    provs = {name: ScriptedProvider(runtime, name=name, latency_s=1.0) for name in ("a", "b")}
    policy = RetentionPolicy(finished_ttl_s=30.0, keys_ttl_s=100.0)

    async def main():  # type: ignore[no-untyped-def]
        scheduler = make_scheduler(runtime, store, provs)
        first = await scheduler.submit_job(CHAIN, {"x": 1}).wait()  # stages at 0-1, 1-2, 2-3
        await runtime.sleep(50.0)
        within = policy.purge(store, runtime.now())
        deduped = await scheduler.submit_job(CHAIN, {"x": 1}).wait()
        calls_within = len(provs["a"].calls) + len(provs["b"].calls)
        await runtime.sleep(60.0)  # the first job is now 110 s old
        after = policy.purge(store, runtime.now())
        rerun = await scheduler.submit_job(CHAIN, {"x": 1}).wait()
        await scheduler.close()
        return first, within, deduped, calls_within, after, rerun

    try:
        first, within, deduped, calls_within, after, rerun = runtime.run(main())
        assert first.status is JobStatus.SUCCEEDED and calls_within == 3  # the duplicate called nothing
        # 47 s old: past the finished TTL, kept (job and stage tasks) because they own their keys
        assert (within.jobs_removed, within.job_keys_removed, within.kept_for_keys) == (0, 0, 3)
        assert deduped.status is JobStatus.DEDUPED and deduped.deduped_from == first.id
        assert deduped.results == first.results
        # first (and its key) and the deduped duplicate are gone; stage tasks too, with their keys
        assert (after.jobs_removed, after.job_keys_removed) == (2, 1)
        assert after.tasks_removed == 3 and after.keys_removed == 3
        assert rerun.status is JobStatus.SUCCEEDED and rerun.id != first.id
        assert len(provs["a"].calls) + len(provs["b"].calls) == 6  # ran (and billed) again
        assert store.job_owner_of(first.key).id == rerun.id
    finally:
        store.close()


def test_a_running_job_whose_finished_stage_tasks_were_purged_completes_and_recovers(tmp_path: Path) -> None:
    """Decision: a live job is never purged, its finished stages' tasks may be (the task rule). The
    job record holds every finished stage's result, which is all that later stages and recovery
    read, so the job completes, and after a crash is re-driven without calling those stages again."""
    runtime = SimPyRuntime()
    path = tmp_path / "jobs.sqlite"
    provs = {name: ScriptedProvider(runtime, name=name, latency_s=1.0) for name in ("a", "b")}

    async def main():  # type: ignore[no-untyped-def]
        store = SqliteStore(path)
        before = make_scheduler(runtime, store, provs)
        before.submit_job(CHAIN, {"x": 1}, job_id="j")
        await runtime.sleep(1.5)  # a done at 1.0, b in flight
        report = store.purge(runtime.now(), finished_older_than_s=0.0, keys_older_than_s=0.0)
        stage_a = store.get_job("j").stage_tasks["a"]
        purged_a = [store.get(task_id) for task_id in stage_a]
        before.crash()
        store.close()
        await runtime.sleep(1.0)
        reopened = SqliteStore(path)  # a new process's store on the same file
        after = make_scheduler(runtime, reopened, provs)
        await after.recover(requeue_interrupted=True)  # b's call was interrupted: send it again
        job = await after.jobs.handle("j").wait()
        await after.close()
        reopened.close()
        return report, purged_a, job

    report, purged_a, job = runtime.run(main())
    assert (report.tasks_removed, report.keys_removed, report.jobs_removed) == (1, 1, 0)
    assert purged_a == [None]
    assert job.status is JobStatus.SUCCEEDED
    assert set(job.results) == {"a", "b", "c"} and job.results["a"] == {"output": "done:a:1:[]"}
    assert [name for _, name, _ in provs["a"].calls] == ["a:1:[]", "c:1:['a', 'b']"]  # a not re-run


def test_a_running_job_whose_finished_stage_tasks_were_purged_completes_without_a_crash(
    tmp_path: Path,
) -> None:
    runtime = SimPyRuntime()
    provs = {name: ScriptedProvider(runtime, name=name, latency_s=1.0) for name in ("a", "b")}
    with SqliteStore(tmp_path / "jobs.sqlite") as store:

        async def main():  # type: ignore[no-untyped-def]
            scheduler = make_scheduler(runtime, store, provs)
            handle = scheduler.submit_job(CHAIN, {"x": 1})
            await runtime.sleep(1.5)
            report = store.purge(runtime.now(), finished_older_than_s=0.0, keys_older_than_s=0.0)
            job = await handle.wait()
            await scheduler.close()
            return report, job

        report, job = runtime.run(main())
        assert report.tasks_removed == 1 and report.jobs_removed == 0
        assert job.status is JobStatus.SUCCEEDED and set(job.results) == {"a", "b", "c"}


def test_sqlite_purges_tasks_and_jobs_in_one_transaction(tmp_path: Path) -> None:
    """A job delete that fails (a trigger refuses it) takes the task deletes back with it."""
    import sqlite3

    from aiqsim.stores.base import StoreWriteError

    with SqliteStore(tmp_path / "tasks.sqlite") as store:
        populate(store)
        populate_jobs(store)
        tasks_before = sorted(t.id for t in store.list_by_status())
        other = sqlite3.connect(tmp_path / "tasks.sqlite")
        other.execute("CREATE TRIGGER refuse BEFORE DELETE ON jobs BEGIN SELECT RAISE(ABORT, 'refused'); END")
        other.commit()
        other.close()
        with pytest.raises(StoreWriteError, match="finished jobs"):
            store.purge(NOW, finished_older_than_s=FINISHED_TTL, keys_older_than_s=KEYS_TTL)
        assert sorted(t.id for t in store.list_by_status()) == tasks_before  # nothing was kept
        assert len(job_ids(store)) == 9 and store.owner_of("k-ancient") is not None


def test_postgres_purges_tasks_and_jobs_in_one_transaction(postgres_dsn: str, tmp_path: Path) -> None:
    """The same on PostgreSQL: a refused job delete rolls the task deletes back."""
    import psycopg

    from aiqsim.stores.base import StoreWriteError

    _POSTGRES["dsn"] = postgres_dsn
    schema = _schema_for(tmp_path)
    store = open_store("postgres", tmp_path)
    try:
        populate(store)
        populate_jobs(store)
        tasks_before = sorted(t.id for t in store.list_by_status())
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(
                f"CREATE FUNCTION {schema}.refuse() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'refused'; END $$"
            )
            conn.execute(
                f"CREATE TRIGGER refuse BEFORE DELETE ON {schema}.jobs "
                f"FOR EACH ROW EXECUTE FUNCTION {schema}.refuse()"
            )
        with pytest.raises(StoreWriteError, match="finished jobs"):
            store.purge(NOW, finished_older_than_s=FINISHED_TTL, keys_older_than_s=KEYS_TTL)
        assert sorted(t.id for t in store.list_by_status()) == tasks_before
        assert len(job_ids(store)) == 9 and store.owner_of("k-ancient") is not None
    finally:
        store.close()
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
