"""Retention: ``store.purge`` on all three stores, its rule, and the periodic runner.

The rule under test (module docs of :mod:`aiqsim.stores.retention`): finished tasks go after
``finished_older_than_s``; a succeeded key owner and its key stay until ``keys_older_than_s`` so
dedup keeps answering; queued and running tasks, live owners' keys and poison records stay.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.states import transition
from aiqsim.core.task import TaskRecord, TaskStatus
from aiqsim.runtime import Cancelled, SimPyRuntime
from aiqsim.stores import (
    JsonFileStore,
    MemoryStore,
    PurgeReport,
    RetentionPolicy,
    SqliteStore,
    TaskStore,
    purge_periodically,
)

HOUR = 3600.0
DAY = 24 * HOUR
FINISHED_TTL = DAY
KEYS_TTL = 7 * DAY
NOW = 30 * DAY


def open_store(kind: str, directory: Path, **options: object) -> TaskStore:
    if kind == "memory":
        return MemoryStore()
    if kind == "postgres":  # the schema named after the directory, on the session's server
        from aiqsim.stores.postgres import PostgresStore

        return PostgresStore(_POSTGRES["dsn"], schema=_schema_for(directory))
    path = directory / f"tasks.{kind}"
    return JsonFileStore(path, **options) if kind == "json" else SqliteStore(path, **options)  # type: ignore[arg-type]


_POSTGRES: dict[str, str] = {}


def _schema_for(directory: Path) -> str:
    return "ret_" + hashlib.sha256(str(directory).encode()).hexdigest()[:16]


@pytest.fixture(params=["memory", "json", "sqlite", "postgres"])
def kind(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "postgres":
        _POSTGRES["dsn"] = request.getfixturevalue("postgres_dsn")
    yield request.param


@pytest.fixture
def store(kind: str, tmp_path: Path) -> Iterator[TaskStore]:
    store = open_store(kind, tmp_path)
    yield store
    store.close()
    if kind == "postgres":
        import psycopg

        with psycopg.connect(_POSTGRES["dsn"], autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {_schema_for(tmp_path)} CASCADE")


def new(task_id: str, key: str, created: float) -> TaskRecord:
    return TaskRecord(
        id=task_id,
        key=key,
        kind="llm",
        provider="llm",
        created_at=created,
        updated_at=created,
        payload={"q": 1},
    )


def finish(store: TaskStore, record: TaskRecord, status: TaskStatus, at: float) -> TaskRecord:
    if status in (TaskStatus.SUCCEEDED, TaskStatus.FAILED):
        record = transition(record, TaskStatus.RUNNING, at - 1.0)
        store.update(record)
    done = transition(record, status, at, result={"a": 1} if status is TaskStatus.SUCCEEDED else None)
    store.update(done)
    return done


def populate(store: TaskStore) -> None:
    """One task of every kind the rule distinguishes (names say status and age)."""
    ancient, old, recent = NOW - 10 * DAY, NOW - 2 * DAY, NOW - HOUR
    finish(
        store,
        store.insert_and_claim(new("ok-ancient", "k-ancient", ancient - 5)),
        TaskStatus.SUCCEEDED,
        ancient,
    )
    finish(store, store.insert_and_claim(new("ok-old", "k-old", old - 5)), TaskStatus.SUCCEEDED, old)
    finish(
        store, store.insert_and_claim(new("ok-recent", "k-recent", recent - 5)), TaskStatus.SUCCEEDED, recent
    )
    dup = store.insert_and_claim(new("dup-old", "k-old", old - 3))
    assert dup.id == "ok-old"  # the duplicate was answered by the owner
    finish(store, store.get("dup-old"), TaskStatus.DEDUPED, old)
    finish(store, store.insert_and_claim(new("failed-old", "k-failed", old - 5)), TaskStatus.FAILED, old)
    finish(store, store.insert_and_claim(new("cancel-old", "k-cancel", old - 5)), TaskStatus.CANCELLED, old)
    store.insert_and_claim(new("queued-ancient", "k-queued", ancient - 5))
    running = store.insert_and_claim(new("running-ancient", "k-running", ancient - 5))
    store.update(transition(running, TaskStatus.RUNNING, ancient))
    store.record_poison("k-poison", "SchemaViolationError: bad input", ancient)


EXPECTED_KEPT = ["ok-old", "ok-recent", "queued-ancient", "running-ancient"]


def test_purge_removes_what_expired_and_keeps_dedup_working(
    store: TaskStore, kind: str, tmp_path: Path
) -> None:
    populate(store)
    report = store.purge(NOW, finished_older_than_s=FINISHED_TTL, keys_older_than_s=KEYS_TTL)
    assert report == PurgeReport(
        now=NOW,
        finished_older_than_s=FINISHED_TTL,
        keys_older_than_s=KEYS_TTL,
        tasks_removed=4,  # ok-ancient (key expired), dup-old, failed-old, cancel-old
        keys_removed=3,  # k-ancient, k-failed, k-cancel
        kept_for_keys=1,  # ok-old: past the task TTL, kept because its key is not
    )
    if kind != "memory":
        store.close()
        store = open_store(kind, tmp_path)
    try:
        assert sorted(r.id for r in store.list_by_status()) == EXPECTED_KEPT
        assert store.poison_error("k-poison") == "SchemaViolationError: bad input"
        # a duplicate of a key within its TTL is still answered by the stored result ...
        assert store.insert_and_claim(new("dup-2", "k-old", NOW)).id == "ok-old"
        # ... one whose key expired runs again, as do keys of purged failed/cancelled owners
        for task_id, key in (("again-1", "k-ancient"), ("again-2", "k-failed"), ("again-3", "k-cancel")):
            assert store.insert_and_claim(new(task_id, key, NOW)).id == task_id
        # live owners keep their keys whatever their age
        assert store.owner_of("k-queued").id == "queued-ancient"
        assert store.owner_of("k-running").id == "running-ancient"
        # a second purge at the same instant finds nothing more
        again = store.purge(NOW, finished_older_than_s=FINISHED_TTL, keys_older_than_s=KEYS_TTL)
        assert (again.tasks_removed, again.keys_removed) == (0, 0)
    finally:
        if kind != "memory":
            store.close()


def test_later_purge_takes_the_owner_once_its_key_expires(store: TaskStore) -> None:
    populate(store)
    store.purge(NOW, finished_older_than_s=FINISHED_TTL, keys_older_than_s=KEYS_TTL)
    later = store.purge(NOW + 6 * DAY, finished_older_than_s=FINISHED_TTL, keys_older_than_s=KEYS_TTL)
    assert (later.tasks_removed, later.keys_removed) == (1, 1)  # ok-old: its key is now 8 days old
    assert sorted(r.id for r in store.list_by_status()) == ["ok-recent", "queued-ancient", "running-ancient"]
    assert store.owner_of("k-old") is None and store.owner_of("k-recent").id == "ok-recent"


def test_keys_ttl_shorter_than_finished_ttl_drops_the_key_and_keeps_the_task(store: TaskStore) -> None:
    populate(store)
    report = store.purge(NOW, finished_older_than_s=5 * DAY, keys_older_than_s=HOUR / 2)
    assert {r.id for r in store.list_by_status()} >= {"ok-old", "ok-recent", "failed-old"}
    assert store.owner_of("k-old") is None and store.owner_of("k-recent") is None
    assert store.get("ok-ancient") is None
    assert report.kept_for_keys == 0


@pytest.mark.parametrize("seed", range(3))
def test_random_histories_never_lose_a_live_task_or_an_unexpired_answer(
    store: TaskStore, kind: str, seed: int
) -> None:
    """Seeded random stores: every invariant of the rule checked independently of its code."""
    rng = random.Random(seed)
    statuses = [
        TaskStatus.QUEUED,
        TaskStatus.RUNNING,
        TaskStatus.SUCCEEDED,
        TaskStatus.FAILED,
        TaskStatus.CANCELLED,
    ]
    for n in range(60):
        created = NOW - rng.uniform(0, 12 * DAY)
        record = store.insert_and_claim(new(f"t{n}", f"k{rng.randrange(25)}", created))
        record = store.get(f"t{n}")
        status = rng.choice(statuses)
        if status is TaskStatus.RUNNING:
            store.update(transition(record, TaskStatus.RUNNING, created + 1))
        elif status is not TaskStatus.QUEUED:
            finish(store, record, status, min(NOW, created + rng.uniform(2, DAY)))
    before = {r.id: r for r in store.list_by_status()}
    owners_before = {key: store.owner_of(key) for key in {r.key for r in before.values()}}
    store.purge(NOW, finished_older_than_s=FINISHED_TTL, keys_older_than_s=3 * DAY)
    after = {r.id: r for r in store.list_by_status()}
    for task_id, record in before.items():
        age = NOW - (record.finished_at if record.finished_at is not None else record.updated_at)
        if task_id not in after:
            assert record.status.is_terminal and age >= FINISHED_TTL, record
        if not record.status.is_terminal or age < FINISHED_TTL:
            assert after.get(task_id) == record
    for key, owner in owners_before.items():
        if owner is None:
            continue
        owner_age = NOW - (owner.finished_at or owner.updated_at)
        if not owner.status.is_terminal or (owner.status is TaskStatus.SUCCEEDED and owner_age < 3 * DAY):
            assert store.owner_of(key) == owner, key  # live owners and unexpired answers keep the key


def test_bad_ttls_are_refused_before_anything_changes(store: TaskStore) -> None:
    populate(store)
    for bad in (-1.0, float("nan"), "1"):
        with pytest.raises(ConfigurationError, match="finished_older_than_s"):
            store.purge(NOW, finished_older_than_s=bad, keys_older_than_s=KEYS_TTL)
    with pytest.raises(ConfigurationError, match="interval_s"):
        RetentionPolicy(interval_s=0)
    assert len(store.list_by_status()) == 8  # nothing was purged


def test_infinite_ttls_mean_never(store: TaskStore) -> None:
    populate(store)
    keep_keys = store.purge(NOW, finished_older_than_s=FINISHED_TTL, keys_older_than_s=float("inf"))
    assert (keep_keys.tasks_removed, keep_keys.keys_removed) == (3, 2)  # dup, failed, cancelled
    assert store.owner_of("k-ancient").id == "ok-ancient"
    keep_all = store.purge(NOW * 10, finished_older_than_s=float("inf"), keys_older_than_s=float("inf"))
    assert (keep_all.tasks_removed, keep_all.keys_removed) == (0, 0)


def test_group_commit_store_flushes_staged_writes_before_its_purge(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite"
    with SqliteStore(path, group_commit=True) as store:
        populate(store)
        report = store.purge(NOW, finished_older_than_s=FINISHED_TTL, keys_older_than_s=KEYS_TTL)
        assert report.tasks_removed == 4
        assert store.flush() == 0  # the purge committed the staged writes, then itself
        with SqliteStore(path) as other:
            assert sorted(r.id for r in other.list_by_status()) == EXPECTED_KEPT


def test_json_purge_is_one_journal_entry_and_gives_the_space_back(tmp_path: Path) -> None:
    path = tmp_path / "tasks.json"
    with JsonFileStore(path, compact_min_entries=10_000) as store:
        populate(store)
        before = path.stat().st_size + store.journal_path.stat().st_size
        store.purge(NOW, finished_older_than_s=FINISHED_TTL, keys_older_than_s=KEYS_TTL)
        assert store.journal_path.stat().st_size == 0  # folded into the snapshot
        assert path.stat().st_size < before
    with JsonFileStore(path) as store:
        assert sorted(r.id for r in store.list_by_status()) == EXPECTED_KEPT


def test_purge_periodically_runs_on_the_runtime_clock() -> None:
    """On the SimPy clock: tasks finishing every 10 minutes, a purge every hour with a 2-hour TTL."""
    runtime = SimPyRuntime()
    store = MemoryStore()
    policy = RetentionPolicy(finished_ttl_s=2 * HOUR, keys_ttl_s=2 * HOUR, interval_s=HOUR)
    reports: list[PurgeReport] = []

    async def workload() -> None:
        for n in range(36):  # six hours of work
            record = store.insert_and_claim(new(f"t{n}", f"k{n}", runtime.now()))
            finish(store, record, TaskStatus.SUCCEEDED, runtime.now())
            await runtime.sleep(600)

    async def main() -> None:
        purger = runtime.spawn(purge_periodically(store, runtime, policy, on_report=reports.append))
        await workload()
        await runtime.sleep(1)
        purger.cancel()
        with pytest.raises(Cancelled):
            await purger

    runtime.run(main())
    assert [r.now for r in reports] == [HOUR * h for h in range(1, 7)]
    assert [r.tasks_removed for r in reports] == [0, 1, 6, 6, 6, 6]
    finished_at = sorted(r.finished_at for r in store.list_by_status())
    assert finished_at[0] >= 6 * HOUR - 2 * HOUR  # nothing older than the TTL survives the last purge
