"""The TaskStore contract, run against every store: memory, JSON file and SQLite.

File stores are also reopened, which is the point of having them: whatever a store
returned before ``close`` it must return after reopening.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiqsim.core.states import transition
from aiqsim.core.task import Priority, TaskRecord, TaskStatus
from aiqsim.core.token_bucket import QuotaLimits
from aiqsim.errors import AiqsimError, ConfigurationError
from aiqsim.runtime import SimPyRuntime
from aiqsim.scheduler import ProviderResponse, Scheduler
from aiqsim.stores import (
    DuplicateTaskIdError,
    JsonFileStore,
    MemoryStore,
    SqliteStore,
    StoreClosedError,
    StoreCorruptError,
    StoreLockedError,
    TaskStore,
    UnstorableValueError,
    open_store,
)
from aiqsim.stores.sqlite import SCHEMA_VERSION

KINDS = ["memory", "json", "sqlite", "postgres"]
FILE_KINDS = ["json", "sqlite", "postgres"]
"""Stores that keep records outside the process (a PostgreSQL schema counts as a file here)."""


class Opener:
    """Opens (and reopens) one store of a kind; memory 'reopens' to the same object.

    A PostgreSQL store gets a schema of its own on the session's server, dropped afterwards.
    """

    def __init__(self, kind: str, directory: Path, dsn: str | None = None) -> None:
        self.kind = kind
        self.path = None if kind in ("memory", "postgres") else directory / f"tasks.{kind}"
        self.dsn = dsn
        self.schema = f"t_{random.Random(str(directory)).getrandbits(48):012x}"
        self._memory: MemoryStore | None = None
        self.opened: list[TaskStore] = []

    def open(self) -> TaskStore:
        if self.kind == "memory":
            self._memory = self._memory or MemoryStore()
            return self._memory
        if self.kind == "postgres":
            from aiqsim.stores.postgres import PostgresStore

            assert self.dsn is not None
            store: TaskStore = PostgresStore(self.dsn, schema=self.schema)
        else:
            store = open_store(self.kind, self.path)
        self.opened.append(store)
        return store

    def cleanup(self) -> None:
        for store in self.opened:
            store.close()
        if self.kind == "postgres":
            from aiqsim.stores.postgres import PostgresStore

            with PostgresStore(self.dsn, schema=self.schema) as store:
                store.drop()

    def reopen(self, store: TaskStore) -> TaskStore:
        if self.kind == "memory":
            return store
        store.close()
        return self.open()


def _opener(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    dsn = request.getfixturevalue("postgres_dsn") if request.param == "postgres" else None
    return Opener(request.param, tmp_path, dsn)


@pytest.fixture(params=KINDS)
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    opener = _opener(request, tmp_path)
    yield opener
    opener.cleanup()


@pytest.fixture(params=FILE_KINDS)
def file_opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    opener = _opener(request, tmp_path)
    yield opener
    opener.cleanup()


def task(task_id: str, key: str = "", **fields: object) -> TaskRecord:
    return TaskRecord(id=task_id, key=key or f"key-{task_id}", kind="llm", provider="llm", **fields)


def moved(record: TaskRecord, *statuses: TaskStatus, now: float = 1.0, **changes: object) -> TaskRecord:
    """``record`` walked through ``statuses``; ``changes`` apply on the last step."""
    for index, status in enumerate(statuses):
        record = transition(record, status, now + index, **(changes if index == len(statuses) - 1 else {}))
    return record


RICH = task(
    "rich",
    key="k-rich",
    priority=Priority.INTERACTIVE,
    cost_estimate=123.5,
    created_at=1.25,
    updated_at=1.25,
    payload={"prompt": "héllo \n wörld ✓", "n": [1, 2.5, None, True], "nested": {"a": {"b": []}}},
)


# ---------------------------------------------------------------------------- round trip
def test_every_store_satisfies_the_protocol(opener: Opener) -> None:
    assert isinstance(opener.open(), TaskStore)


def test_the_tenant_is_kept_across_a_reopen_and_an_update(opener: Opener) -> None:
    store = opener.open()
    store.insert_and_claim(task("t", tenant="acme"))
    store.update(moved(store.get("t"), TaskStatus.RUNNING))  # type: ignore[arg-type]
    store = opener.reopen(store)
    assert store.get("t").tenant == "acme" and store.get("t").status is TaskStatus.RUNNING  # type: ignore[union-attr]
    assert store.owner_of("key-t").tenant == "acme"  # type: ignore[union-attr]


def test_the_route_is_kept_across_a_reopen_and_an_update(opener: Opener) -> None:
    store = opener.open()
    store.insert_and_claim(task("t", route="gpt"))
    store.update(moved(store.get("t"), TaskStatus.RUNNING, provider="west"))  # type: ignore[arg-type]
    store = opener.reopen(store)
    kept = store.get("t")
    assert kept is not None and (kept.route, kept.provider) == ("gpt", "west")
    assert kept.status is TaskStatus.RUNNING
    assert store.owner_of("key-t").route == "gpt"  # type: ignore[union-attr]


def test_record_round_trips_with_payload_and_result(opener: Opener) -> None:
    store = opener.open()
    assert store.insert_and_claim(RICH) == RICH
    finished = moved(
        RICH,
        TaskStatus.RUNNING,
        TaskStatus.SUCCEEDED,
        attempts=2,
        result={"text": "ünïcode", "scores": [0.1, 2]},
    )
    store.update(finished)
    assert store.get("rich") == finished
    store = opener.reopen(store)
    again = store.get("rich")
    assert again == finished
    assert again is not None and again.payload == RICH.payload and again.result == finished.result
    assert again.priority is Priority.INTERACTIVE and again.status is TaskStatus.SUCCEEDED
    assert store.get("missing") is None


def test_failed_record_keeps_its_error(opener: Opener) -> None:
    store = opener.open()
    store.insert_and_claim(task("a"))
    failed = moved(task("a"), TaskStatus.RUNNING, TaskStatus.FAILED, error="ServerError: boom")
    store.update(failed)
    store = opener.reopen(store)
    assert store.get("a") == failed
    assert store.get("a").error == "ServerError: boom"  # type: ignore[union-attr]


# ---------------------------------------------------------------------------- claim rules
@pytest.mark.parametrize(
    "owner_path",
    [(), (TaskStatus.RUNNING,), (TaskStatus.RUNNING, TaskStatus.SUCCEEDED)],
    ids=["queued", "running", "succeeded"],
)
def test_live_owner_keeps_its_key(opener: Opener, owner_path: tuple[TaskStatus, ...]) -> None:
    store = opener.open()
    first = task("first", key="shared")
    assert store.insert_and_claim(first) is first
    owner = moved(first, *owner_path) if owner_path else first
    store.update(owner)
    second = task("second", key="shared")
    assert store.insert_and_claim(second) == owner
    assert store.claim(second) == owner
    store = opener.reopen(store)
    assert store.owner_of("shared") == owner
    assert store.get("second") == second  # the loser is stored all the same


@pytest.mark.parametrize("end", [TaskStatus.FAILED, TaskStatus.CANCELLED])
def test_failed_or_cancelled_owner_is_replaced(opener: Opener, end: TaskStatus) -> None:
    store = opener.open()
    first = task("first", key="shared")
    store.insert_and_claim(first)
    store.update(moved(first, TaskStatus.RUNNING, end))
    second = task("second", key="shared")
    assert store.insert_and_claim(second) == second
    assert store.owner_of("shared") == second
    store = opener.reopen(store)
    assert store.owner_of("shared") == second


def test_claim_takes_over_from_a_failed_owner_and_is_idempotent(opener: Opener) -> None:
    store = opener.open()
    first, second = task("first", key="shared"), task("second", key="shared")
    store.insert_and_claim(first)
    assert store.insert_and_claim(second) == first
    store.update(moved(first, TaskStatus.RUNNING, TaskStatus.FAILED, error="X: y"))
    assert store.claim(second) == second
    assert store.claim(second) == second  # already the owner
    assert store.claim(first) == second  # a live owner keeps the key against the old one
    store = opener.reopen(store)
    assert store.owner_of("shared") == second


def test_misuse_raises_clear_errors(opener: Opener) -> None:
    store = opener.open()
    store.insert_and_claim(task("a"))
    with pytest.raises(ValueError, match="already exists"):
        store.insert_and_claim(task("a", key="other"))
    with pytest.raises(KeyError, match="unknown task id"):
        store.update(task("ghost"))
    with pytest.raises(KeyError, match="unknown task id"):
        store.claim(task("ghost"))
    assert store.owner_of("key-a") == task("a")  # failed calls changed nothing
    assert [record.id for record in store.list_by_status()] == ["a"]


# ---------------------------------------------------------------------------- listing
def test_list_by_status_keeps_insertion_order(opener: Opener) -> None:
    store = opener.open()
    rng = random.Random(7)
    ids = [f"t{n:02d}" for n in range(12)]
    for task_id in ids:
        store.insert_and_claim(task(task_id))
    paths = {
        TaskStatus.QUEUED: (),
        TaskStatus.RUNNING: (TaskStatus.RUNNING,),
        TaskStatus.SUCCEEDED: (TaskStatus.RUNNING, TaskStatus.SUCCEEDED),
        TaskStatus.CANCELLED: (TaskStatus.CANCELLED,),
    }
    wanted = {task_id: rng.choice(list(paths)) for task_id in ids}
    for task_id in rng.sample(ids, len(ids)):  # update in a shuffled order
        if paths[wanted[task_id]]:
            store.update(moved(task(task_id), *paths[wanted[task_id]]))
    for _ in range(2):
        assert [record.id for record in store.list_by_status()] == ids
        for status in paths:
            assert [r.id for r in store.list_by_status(status)] == [i for i in ids if wanted[i] is status]
        both = store.list_by_status(TaskStatus.RUNNING, TaskStatus.QUEUED)
        assert [r.id for r in both] == [
            i for i in ids if wanted[i] in (TaskStatus.RUNNING, TaskStatus.QUEUED)
        ]
        assert store.list_by_status(TaskStatus.DEDUPED) == []
        store = opener.reopen(store)


# ---------------------------------------------------------------------------- poison
def test_poison_is_recorded_and_survives_reopen(opener: Opener) -> None:
    store = opener.open()
    assert store.poison_error("bad") is None
    store.record_poison("bad", "SchemaViolationError: unexpected shape", 5.0)
    store.record_poison("worse", "InvalidRequestError: no", 6.0)
    store.record_poison("bad", "SchemaViolationError: again", 7.0)  # the latest error wins
    store = opener.reopen(store)
    assert store.poison_error("bad") == "SchemaViolationError: again"
    assert store.poison_error("worse") == "InvalidRequestError: no"
    assert store.poison_error("fine") is None


# ---------------------------------------------------------------------------- reopening
def test_reopen_gives_the_same_records_and_owners(file_opener: Opener) -> None:
    store = file_opener.open()
    rng = random.Random(11)
    expected: dict[str, TaskRecord] = {}
    for n in range(60):
        record = task(f"t{n}", key=f"k{rng.randrange(20)}", payload={"n": n}, cost_estimate=float(n))
        store.insert_and_claim(record)
        expected[record.id] = record
        if rng.random() < 0.6:
            end = rng.choice([TaskStatus.SUCCEEDED, TaskStatus.FAILED])
            record = moved(
                record, TaskStatus.RUNNING, end, result={"n": n} if end is TaskStatus.SUCCEEDED else None
            )
            store.update(record)
            expected[record.id] = record
            store.claim(record)
    owners = {key: store.owner_of(key) for key in {r.key for r in expected.values()}}
    store = file_opener.reopen(store)
    assert {r.id: r for r in store.list_by_status()} == expected
    assert [r.id for r in store.list_by_status()] == list(expected)
    assert {key: store.owner_of(key) for key in owners} == owners


@pytest.mark.parametrize("value", [{"when": object()}, b"raw bytes", {"tags": {"a", "b"}}])
def test_non_json_payload_is_refused_without_a_trace(file_opener: Opener, value: object) -> None:
    store = file_opener.open()
    with pytest.raises(UnstorableValueError, match=r"task 'a'.* cannot be stored: .*nothing was written"):
        store.insert_and_claim(task("a", payload=value))
    assert store.get("a") is None and store.owner_of("key-a") is None
    assert issubclass(UnstorableValueError, TypeError)  # what this used to raise, bare
    store.insert_and_claim(task("b"))
    store = file_opener.reopen(store)
    assert [r.id for r in store.list_by_status()] == ["b"]


def test_a_result_a_durable_store_cannot_keep_fails_its_task_saying_so(tmp_path: Path) -> None:
    """A provider's answer that JSON cannot hold (a set): the task fails with an error that says the
    result could not be stored, in the store and to the caller; the next task runs as usual."""
    runtime = SimPyRuntime()

    class SetProvider:
        name = "llm"

        async def call(self, request):
            await runtime.sleep(1)
            answer = {"labels": {"cat", "dog"}} if request.payload == "bad" else {"labels": ["cat"]}
            return ProviderResponse(result=answer)

    store = SqliteStore(tmp_path / "tasks.sqlite")

    async def main():
        scheduler = Scheduler(runtime, [SetProvider()], store=store)
        records = [await scheduler.submit("llm", payload).wait() for payload in ("bad", "good")]
        await scheduler.close()
        return records

    bad, good = runtime.run(main())
    assert bad.status is TaskStatus.FAILED and good.status is TaskStatus.SUCCEEDED
    assert bad.error.startswith("UnstorableValueError: task ") and "result cannot be stored" in bad.error
    assert store.get(bad.id).status is TaskStatus.FAILED and store.get(bad.id).error == bad.error
    assert runtime.task_errors == []
    store.close()


def test_closed_store_refuses_use(file_opener: Opener) -> None:
    store = file_opener.open()
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreClosedError, match="closed"):
        store.get("a")
    with pytest.raises(StoreClosedError, match="closed"):
        store.insert_and_claim(task("a"))


@pytest.mark.parametrize("kind", ["json", "sqlite"])  # a PostgreSQL store has no files: the server's roles
def test_state_files_are_private(kind: str, tmp_path: Path) -> None:
    file_opener = Opener(kind, tmp_path)
    store = file_opener.open()
    store.insert_and_claim(task("a"))
    assert file_opener.path is not None
    for path in file_opener.path.parent.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    file_opener.cleanup()


def test_open_store_factory_validates_its_arguments(tmp_path: Path) -> None:
    assert isinstance(open_store("memory"), MemoryStore)
    with pytest.raises(ValueError, match="unknown store kind"):
        open_store("redis", tmp_path / "x")
    with pytest.raises(ValueError, match="needs a file path"):
        open_store("sqlite")
    with pytest.raises(ValueError, match="do not pass a path"):
        open_store("memory", tmp_path / "x")


# ---------------------------------------------------------------------------- JSON specifics
def test_json_document_is_versioned(tmp_path: Path) -> None:
    path = tmp_path / "tasks.json"
    with JsonFileStore(path) as store:
        store.insert_and_claim(task("a"))
        store.compact()
    doc = json.loads(path.read_text())
    assert (doc["format"], doc["version"]) == ("aiqsim-taskstore", 2)
    assert [t["id"] for t in doc["store"]["tasks"]] == ["a"] and doc["store"]["owners"] == {"key-a": "a"}


def test_json_journal_is_compacted_into_the_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "tasks.json"
    store = JsonFileStore(path, compact_min_entries=10)
    for n in range(25):
        store.insert_and_claim(task(f"t{n}"))
    journal_lines = store.journal_path.read_bytes().count(b"\n")
    assert journal_lines < 25  # compaction emptied it along the way
    assert len(json.loads(path.read_text())["store"]["tasks"]) + journal_lines == 25
    store.close()
    with JsonFileStore(path) as again:
        assert [r.id for r in again.list_by_status()] == [f"t{n}" for n in range(25)]


def test_json_crash_between_snapshot_and_journal_truncation_replays_nothing_twice(tmp_path: Path) -> None:
    path = tmp_path / "tasks.json"
    store = JsonFileStore(path)
    store.insert_and_claim(task("a"))
    store.update(moved(task("a"), TaskStatus.RUNNING))
    journal = store.journal_path.read_bytes()
    store.compact()
    store.close()
    store.journal_path.write_bytes(journal)  # as if the process died before emptying the journal
    with JsonFileStore(path) as again:
        assert [(r.id, r.status) for r in again.list_by_status()] == [("a", TaskStatus.RUNNING)]
        again.update(moved(again.get("a"), TaskStatus.SUCCEEDED, result=1))  # type: ignore[arg-type]
    with JsonFileStore(path) as again:
        assert again.get("a").result == 1  # type: ignore[union-attr]


def test_json_store_is_locked_against_a_second_process(tmp_path: Path) -> None:
    path = tmp_path / "tasks.json"
    with JsonFileStore(path) as store:
        store.insert_and_claim(task("a"))
        with pytest.raises(StoreLockedError, match="single-process"):
            JsonFileStore(path)
        probe = (
            "import sys\n"
            "from aiqsim.stores import JsonFileStore, StoreLockedError\n"
            "try:\n    JsonFileStore(sys.argv[1])\nexcept StoreLockedError as e:\n    print('LOCKED', e)\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", probe, str(path)], capture_output=True, text=True, check=True
        )
        assert out.stdout.startswith("LOCKED") and f"pid {os.getpid()}" in out.stdout
        assert store.get("a") == task("a")  # the refused opener did not touch anything
    with JsonFileStore(path) as again:  # released on close
        assert again.get("a") == task("a")


# ---------------------------------------------------------------------------- SQLite specifics
def test_sqlite_file_is_wal_with_a_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite"
    with SqliteStore(path) as store:
        store.insert_and_claim(task("a"))
        conn = sqlite3.connect(path)
        try:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
            assert conn.execute("SELECT key, owner_id FROM keys").fetchall() == [("key-a", "a")]
        finally:
            conn.close()
    assert not list(tmp_path.glob(".*tmp*"))  # creation left no temp file behind


V1_STORE = Path(__file__).parent / "data" / "store_v1.sqlite"
"""A store written by aiqsim's first SQLite schema (no ``worker`` column): t1 queued, t2 running,
t3 succeeded, poison recorded for key-9. Generated once by the version-1 code and kept as is."""


def copy_of_v1_store(tmp_path: Path) -> Path:
    path = tmp_path / "old.sqlite"
    path.write_bytes(V1_STORE.read_bytes())
    return path


def sqlite_columns(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [row[1] for row in conn.execute("PRAGMA table_info(tasks)")]
    finally:
        conn.close()


def test_sqlite_opens_a_version_1_store_and_upgrades_it_keeping_every_record(tmp_path: Path) -> None:
    path = copy_of_v1_store(tmp_path)
    assert "worker" not in sqlite_columns(path)
    with SqliteStore(path) as store:
        assert [(r.id, r.status, r.worker) for r in store.list_by_status()] == [
            ("t1", TaskStatus.QUEUED, None),
            ("t2", TaskStatus.RUNNING, None),
            ("t3", TaskStatus.SUCCEEDED, None),
        ]
        assert store.get("t3").result == {"text": "done"}  # type: ignore[union-attr]
        assert store.poison_error("key-9") == "SchemaViolationError: bad"
        assert store.owner_of("key-2").id == "t2"  # type: ignore[union-attr]
        store.update(store.get("t1").evolve(worker="w-1"))  # type: ignore[union-attr]
    assert sqlite_columns(path)[-3:] == ["worker", "tenant", "route"]
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        conn.close()
    with SqliteStore(path) as again:  # the upgraded file opens as a current one
        assert again.get("t1").worker == "w-1"  # type: ignore[union-attr]


def upgraded_meanwhile(monkeypatch: pytest.MonkeyPatch, path: Path, *statements: str) -> None:
    """Make another process change the file between this open's validation and its upgrade."""
    validate = SqliteStore._validate

    def racing(self, *, full):  # type: ignore[no-untyped-def]
        version = validate(self, full=full)
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            for statement in statements:
                other.execute(statement)
            other.execute("COMMIT")
        finally:
            other.close()
        return version

    monkeypatch.setattr(SqliteStore, "_validate", racing)


def test_sqlite_upgrade_that_another_process_finished_first_is_not_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = copy_of_v1_store(tmp_path)
    upgraded_meanwhile(
        monkeypatch, path, "ALTER TABLE tasks ADD COLUMN worker TEXT", "PRAGMA user_version = 2"
    )
    with SqliteStore(path) as store:  # would fail with "duplicate column name: worker" if re-run
        assert len(store) == 3
    assert sqlite_columns(path).count("worker") == 1


def test_sqlite_upgrade_never_relabels_a_file_a_newer_aiqsim_upgraded_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = copy_of_v1_store(tmp_path)
    upgraded_meanwhile(
        monkeypatch,
        path,
        "ALTER TABLE tasks ADD COLUMN worker TEXT",
        "ALTER TABLE tasks ADD COLUMN lease REAL",
        f"PRAGMA user_version = {SCHEMA_VERSION + 1}",
    )
    newer = SCHEMA_VERSION + 1
    with pytest.raises(StoreCorruptError, match=rf"schema version {newer} \(written by a newer aiqsim\)"):
        SqliteStore(path)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == newer
    finally:
        conn.close()


def test_sqlite_refuses_a_damaged_version_1_store_without_upgrading_it(tmp_path: Path) -> None:
    path = copy_of_v1_store(tmp_path)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("UPDATE tasks SET status = 'done' WHERE id = 't1'")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    before = path.read_bytes()
    with pytest.raises(StoreCorruptError, match=r"invalid status 'done'"):
        SqliteStore(path)
    assert path.read_bytes() == before  # not upgraded, not touched
    assert "worker" not in sqlite_columns(path)


def test_sqlite_two_connections_race_for_one_key(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite"
    with SqliteStore(path) as left, SqliteStore(path) as right:
        a, b = task("a", key="k"), task("b", key="k")
        assert left.insert_and_claim(a) == a
        assert right.insert_and_claim(b) == a
        left.update(moved(a, TaskStatus.CANCELLED))
        assert right.claim(b) == b
        assert left.owner_of("k") == b


# ---------------------------------------------------------------------------- with the scheduler
class Echo:
    name = "llm"

    def __init__(self, runtime: SimPyRuntime) -> None:
        self.runtime = runtime
        self.calls: list[str] = []

    async def call(self, request):  # type: ignore[no-untyped-def]
        self.calls.append(request.idempotency_key)
        await self.runtime.sleep(1.0)
        return ProviderResponse(result={"echo": request.payload})

    async def lookup(self, key: str) -> ProviderResponse | None:
        return None


def test_scheduler_crash_and_recover_on_a_file_store(file_opener: Opener) -> None:
    """Crash a scheduler mid-run, reopen the file, recover: every task ends, duplicates dedupe."""
    inputs = [0, 1, 2, 0, 3, 1]

    def first_life() -> None:
        runtime = SimPyRuntime()
        store = file_opener.open()

        async def main() -> None:
            scheduler = Scheduler(
                runtime,
                [Echo(runtime)],
                store=store,
                quotas={"llm": QuotaLimits(concurrency=1)},
                rng=random.Random(1),
            )
            for n, value in enumerate(inputs):
                scheduler.submit("llm", {"v": value}, task_id=f"t{n}")
            await runtime.sleep(1.5)  # the first task finished, others queued or running
            scheduler.crash()

        runtime.run(main())
        store.close()

    def second_life() -> tuple[object, list[TaskRecord], list[str]]:
        runtime = SimPyRuntime()
        store = file_opener.open()
        provider = Echo(runtime)

        async def main() -> object:
            scheduler = Scheduler(runtime, [provider], store=store, rng=random.Random(2))
            report = await scheduler.recover(requeue_interrupted=True)
            await scheduler.join()
            await scheduler.close()
            return report

        report = runtime.run(main())
        records = store.list_by_status()
        store.close()
        return report, records, provider.calls

    first_life()
    report, records, calls = second_life()
    assert [r.id for r in records] == [f"t{n}" for n in range(len(inputs))]
    assert all(r.status in (TaskStatus.SUCCEEDED, TaskStatus.DEDUPED) for r in records), records
    assert all(r.result == {"echo": {"v": inputs[int(r.id[1:])]}} for r in records)
    assert len(calls) == len(set(calls))  # the second life ran each key at most once
    # t1 was running at the crash (requeued), t5 waited on it (reattached). queued_resumed is not
    # checked: recover() counts a requeued orphan there as well (reported to the lead).
    assert (report.orphans_requeued, report.duplicates_reattached) == (1, 1)  # type: ignore[attr-defined]


def test_submit_with_a_task_id_already_stored_is_a_project_error_and_stores_nothing(opener: Opener) -> None:
    """Every store raised a bare ValueError("task id 'x' already exists")."""
    store = opener.open()
    runtime = SimPyRuntime()

    async def main() -> DuplicateTaskIdError:
        scheduler = Scheduler(runtime, [Echo(runtime)], store=store, rng=random.Random(1))
        scheduler.submit("llm", {"v": 1}, task_id="x")
        with pytest.raises(DuplicateTaskIdError) as caught:
            scheduler.submit("llm", {"v": 2}, task_id="x")
        await scheduler.join()
        await scheduler.close()
        return caught.value

    error = runtime.run(main())
    assert isinstance(error, AiqsimError) and isinstance(error, ConfigurationError)
    assert isinstance(error, ValueError)  # what callers caught before
    assert "task id 'x' already exists" in str(error) and "nothing was stored" in str(error)
    assert (error.kind, error.record_id) == ("task", "x")
    store = opener.reopen(store)
    assert [(r.id, r.payload) for r in store.list_by_status()] == [("x", {"v": 1})]


def test_json_failed_compaction_does_not_fail_the_durable_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "tasks.json"
    store = JsonFileStore(path, compact_min_entries=3)
    real_write_snapshot = store._write_snapshot

    def disk_full() -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "_write_snapshot", disk_full)
    for n in range(3):
        store.insert_and_claim(task(f"t{n}"))  # the third write triggers the failing compaction
    assert isinstance(store.last_compaction_error, OSError)
    monkeypatch.setattr(store, "_write_snapshot", real_write_snapshot)
    for n in range(3, 6):
        store.insert_and_claim(task(f"t{n}"))  # compaction was deferred to 6 journal entries, then succeeds
    assert store.last_compaction_error is None
    assert store.journal_path.stat().st_size == 0
    store.close()
    with JsonFileStore(path) as again:
        assert [r.id for r in again.list_by_status()] == [f"t{n}" for n in range(6)]
