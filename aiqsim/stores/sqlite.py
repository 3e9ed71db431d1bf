"""The default durable task store: one SQLite file, shareable between processes.

Schema (version 3, kept in ``PRAGMA user_version``): ``tasks`` (one row per task, ``seq`` gives
insertion order, payload/result as JSON text, ``worker`` the scheduler instance holding the task),
``keys`` (idempotency key -> owning task id) and ``poison`` (keys whose input poisons the
provider); version 3 adds ``jobs`` and ``job_keys``, the same pair for jobs (pipelines of tasks).
A version-1 or -2 file is validated as it is and then upgraded in one transaction when opened;
a file from a newer aiqsim is refused.

Concurrency: every write is one ``BEGIN IMMEDIATE`` transaction, so it takes SQLite's write lock
up front and never fails half-way on a lock upgrade. A claim is ``INSERT ... ON CONFLICT DO
NOTHING`` on ``keys`` inside that transaction; when the key is taken, the current owner is read
and replaced only if :func:`~aiqsim.stores.base.claim_owner` says so (a failed or cancelled
owner). Two processes racing on one key therefore get exactly one owner. ``busy_timeout`` makes
a process wait for the other's transaction instead of failing with "database is locked".

Durability: WAL journal with ``synchronous=FULL`` by default. In WAL mode ``NORMAL`` survives a
killed process but may roll back the last commits on power loss or an OS crash, and a lost
``running`` or ``succeeded`` write is exactly what makes a task run (and bill) twice. FULL costs
one fsync of the WAL per transition (see ``benchmarks/RESULTS.md``); pass ``synchronous="NORMAL"``
where that trade is acceptable, ``"OFF"`` only for bulk loads.

Opening never writes to a file it has not validated: a non-database, a truncated or
malformed file, a wrong schema version or an invalid row raises
:class:`~aiqsim.stores.base.StoreCorruptError` and the file stays byte-for-byte as it was.
A new store file is built under a temp name and linked into place, so a crash during creation
never leaves a half-initialised store behind.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import sqlite3
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from aiqsim.core.job import JobRecord, JobStatus
from aiqsim.core.task import Priority, TaskRecord, TaskStatus
from aiqsim.stores.base import StoreClosedError, StoreCorruptError, claim_owner, record_from_stored
from aiqsim.stores.job_store import claim_job_owner, job_from_stored

SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
"""Schema versions this build opens; older ones are upgraded by :data:`MIGRATIONS` on open."""
FILE_MODE = 0o600
DEFAULT_BUSY_TIMEOUT_S = 30.0
SYNCHRONOUS_LEVELS = ("OFF", "NORMAL", "FULL", "EXTRA")
SQLITE_HEADER = b"SQLite format 3\x00"
SQLITE_HEADER_SIZE = 100

COLUMNS = (
    "id",
    "key",
    "kind",
    "provider",
    "priority",
    "status",
    "cost_estimate",
    "attempts",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
    "payload",
    "result",
    "error",
    "deduped_from",
    "worker",
)
_ADDED_IN_VERSION = {"worker": 2}
"""Columns that a store of an older schema version does not have yet (read as NULL there)."""
_JSON_COLUMNS = frozenset({"payload", "result"})


def _select_for(version: int) -> str:
    """``SELECT`` of every record column as of ``version`` (NULL for columns it does not have)."""
    parts = ("NULL" if _ADDED_IN_VERSION.get(name, 1) > version else f"t.{name}" for name in COLUMNS)
    return "SELECT " + ", ".join(parts) + " FROM tasks t"


_SELECT = _select_for(SCHEMA_VERSION)

SCHEMA = """
CREATE TABLE tasks (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    key TEXT NOT NULL,
    kind TEXT NOT NULL,
    provider TEXT NOT NULL,
    priority INTEGER NOT NULL,
    status TEXT NOT NULL,
    cost_estimate REAL NOT NULL,
    attempts INTEGER NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    payload TEXT NOT NULL,
    result TEXT NOT NULL,
    error TEXT,
    deduped_from TEXT,
    worker TEXT
);
CREATE INDEX tasks_by_status ON tasks (status, seq);
CREATE TABLE keys (key TEXT PRIMARY KEY, owner_id TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE poison (key TEXT PRIMARY KEY, error TEXT NOT NULL, recorded_at REAL NOT NULL) WITHOUT ROWID;
"""

JOB_COLUMNS = (
    "id",
    "key",
    "name",
    "version",
    "priority",
    "status",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
    "inputs",
    "results",
    "stage_tasks",
    "failed_stage",
    "error",
    "deduped_from",
    "worker",
)
"""Columns of the ``jobs`` table (schema version 3, jobs of issue #15), after ``seq``."""
_JOB_JSON_COLUMNS = frozenset({"inputs", "results", "stage_tasks"})
_JOB_SELECT = "SELECT " + ", ".join(f"j.{name}" for name in JOB_COLUMNS) + " FROM jobs j"
_JOB_INSERT = f"INSERT INTO jobs ({', '.join(JOB_COLUMNS)}) VALUES ({', '.join('?' * len(JOB_COLUMNS))})"
JOB_SCHEMA = (
    """CREATE TABLE jobs (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    key TEXT NOT NULL,
    name TEXT NOT NULL,
    version TEXT NOT NULL,
    priority INTEGER NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    inputs TEXT NOT NULL,
    results TEXT NOT NULL,
    stage_tasks TEXT NOT NULL,
    failed_stage TEXT,
    error TEXT,
    deduped_from TEXT,
    worker TEXT
)""",
    "CREATE INDEX jobs_by_status ON jobs (status, seq)",
    "CREATE TABLE job_keys (key TEXT PRIMARY KEY, owner_id TEXT NOT NULL) WITHOUT ROWID",
)
"""The job tables, one statement each: created with a new store, added by the 2 -> 3 migration."""
SCHEMA = SCHEMA + "".join(f"{statement};\n" for statement in JOB_SCHEMA)

MIGRATIONS: dict[int, str | tuple[str, ...]] = {1: "ALTER TABLE tasks ADD COLUMN worker TEXT"}
MIGRATIONS[2] = JOB_SCHEMA
"""SQL that upgrades a store from the key's schema version to the next one."""


def expected_tables(version: int) -> dict[str, tuple[str, ...]]:
    """The tables and their columns, in order, of a task store of schema ``version``."""
    tasks = tuple(name for name in COLUMNS if _ADDED_IN_VERSION.get(name, 1) <= version)
    tables = {
        "tasks": ("seq", *tasks),
        "keys": ("key", "owner_id"),
        "poison": ("key", "error", "recorded_at"),
    }
    if version >= 3:
        tables.update(jobs=("seq", *JOB_COLUMNS), job_keys=("key", "owner_id"))
    return tables


EXPECTED_TABLES = expected_tables(SCHEMA_VERSION)

_NUMBER = "('real', 'integer')"
_SUSPECT_ROWS_V1 = f"""
SELECT seq FROM tasks WHERE
    typeof(id) != 'text' OR typeof(key) != 'text' OR typeof(kind) != 'text' OR typeof(provider) != 'text'
    OR status NOT IN ({", ".join(f"'{status.value}'" for status in TaskStatus)})
    OR typeof(priority) != 'integer' OR priority NOT IN ({", ".join(str(int(p)) for p in Priority)})
    OR typeof(attempts) != 'integer' OR attempts < 0
    OR typeof(cost_estimate) NOT IN {_NUMBER} OR typeof(created_at) NOT IN {_NUMBER}
    OR typeof(updated_at) NOT IN {_NUMBER}
    OR typeof(started_at) NOT IN ('real', 'integer', 'null')
    OR typeof(finished_at) NOT IN ('real', 'integer', 'null')
    OR typeof(error) NOT IN ('text', 'null') OR typeof(deduped_from) NOT IN ('text', 'null')
    OR typeof(payload) != 'text' OR typeof(result) != 'text'
    OR json_valid(payload) = 0 OR json_valid(result) = 0
"""


def _suspect_rows(version: int) -> str:
    """Rows whose column types or values a valid record cannot have (checked in SQL, then decoded)."""
    extra = " OR typeof(worker) NOT IN ('text', 'null')" if version >= 2 else ""
    return f"{_SUSPECT_ROWS_V1}{extra} ORDER BY seq"


_BAD_KEY = """
SELECT k.key, k.owner_id FROM keys k LEFT JOIN tasks t ON t.id = k.owner_id
WHERE t.id IS NULL OR t.key != k.key LIMIT 1
"""
_BAD_POISON = f"""
SELECT key FROM poison
WHERE typeof(key) != 'text' OR typeof(error) != 'text' OR typeof(recorded_at) NOT IN {_NUMBER} LIMIT 1
"""


def _json_text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class SqliteStore:
    """:class:`~aiqsim.stores.base.TaskStore` in an SQLite file (WAL), safe for several processes.

    Parameters:
        path: the database file; created (empty store, mode 0600) if absent.
        synchronous: SQLite ``synchronous`` level, ``"FULL"`` by default (see module docs).
        busy_timeout_s: how long a write waits for another process's transaction.
        validate: scan every row on open (default). Costs O(rows) once per open.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "FULL",
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
        validate: bool = True,
    ) -> None:
        synchronous = synchronous.upper()
        if synchronous not in SYNCHRONOUS_LEVELS:
            raise ValueError(f"synchronous must be one of {SYNCHRONOUS_LEVELS}, got {synchronous!r}")
        if not busy_timeout_s >= 0:
            raise ValueError(f"busy_timeout_s must be >= 0, got {busy_timeout_s!r}")
        self.path = Path(path)
        self.synchronous = synchronous
        self.busy_timeout_s = busy_timeout_s
        self._closed = False
        self._remove_stale_temps()
        if not self.path.exists():
            self._create()
        self._check_header()
        self._conn = self._connect(self.path)
        try:
            version = self._validate(full=validate)
            mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreCorruptError(f"{self.path}: cannot switch to WAL journal mode (got {mode!r})")
            self._conn.execute(f"PRAGMA synchronous = {synchronous}")
            if version < SCHEMA_VERSION:
                self._upgrade()
        except BaseException:
            self._conn.close()
            raise

    # ------------------------------------------------------------------ opening
    def _connect(self, path: Path) -> sqlite3.Connection:
        uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=rw"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=self.busy_timeout_s)
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
        return conn

    def _temp_prefix(self) -> str:
        return f".{self.path.name}.tmp-"

    def _remove_stale_temps(self) -> None:
        """Remove temp files of a creation interrupted by a crash (their creator is gone)."""
        for temp in self.path.parent.glob(glob.escape(self._temp_prefix()) + "*"):
            pid_text = temp.name[len(self._temp_prefix()) :].split("-", 1)[0]
            if not pid_text.isdigit() or int(pid_text) == os.getpid():
                continue
            try:
                os.kill(int(pid_text), 0)
            except ProcessLookupError:
                temp.unlink(missing_ok=True)
            except PermissionError:
                pass  # alive, owned by someone else

    def _create(self) -> None:
        """Build an empty store under a temp name, then link it into place (first creator wins)."""
        temp = self.path.with_name(f"{self._temp_prefix()}{os.getpid()}-{id(self):x}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        os.close(fd)
        try:
            conn = self._connect(temp)
            try:
                conn.executescript(f"BEGIN; {SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;")
                conn.execute("PRAGMA journal_mode = WAL")
            finally:
                conn.close()
            fd = os.open(temp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            with contextlib.suppress(FileExistsError):  # another process created it first: use theirs
                os.link(temp, self.path)
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        finally:
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(str(temp) + suffix).unlink(missing_ok=True)

    def _corrupt(self, problem: str) -> StoreCorruptError:
        return StoreCorruptError(f"{self.path}: {problem}; the file was left untouched")

    def _check_header(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                header = handle.read(SQLITE_HEADER_SIZE)
        except OSError as error:
            raise self._corrupt(f"cannot be read ({error.strerror or error})") from error
        if not header:
            raise self._corrupt("empty file (truncated?); expected an SQLite task store")
        if not header.startswith(SQLITE_HEADER):
            raise self._corrupt("not an SQLite database")
        if len(header) < SQLITE_HEADER_SIZE:
            raise self._corrupt(f"truncated: {len(header)} bytes, shorter than the SQLite header")

    def _validate(self, *, full: bool) -> int:
        """Refuse anything but an intact task store of a readable version, without writing a byte.

        Returns the file's schema version.
        """
        conn = self._conn
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in READABLE_VERSIONS:
                hint = " (written by a newer aiqsim)" if version > SCHEMA_VERSION else ""
                readable = " or ".join(map(str, READABLE_VERSIONS))
                raise self._corrupt(
                    f"schema version {version}{hint}; this build reads {readable} "
                    "(user_version 0 means not an aiqsim task store)"
                )
            for table, expected in expected_tables(version).items():
                found = tuple(row[1] for row in conn.execute(f"PRAGMA table_info({table})"))
                if found != expected:
                    raise self._corrupt(f"table {table!r} has columns {found}, expected {expected}")
            if not full:
                return version
            check = [row[0] for row in conn.execute("PRAGMA quick_check")]
            if check != ["ok"]:
                raise self._corrupt(f"integrity check failed: {'; '.join(map(str, check[:3]))}")
            for (seq,) in conn.execute(_suspect_rows(version)).fetchall():
                row = conn.execute(f"{_select_for(version)} WHERE t.seq = ?", (seq,)).fetchone()
                self._decode(row)  # raises with the precise problem; rows Python can read pass
            bad_key = conn.execute(_BAD_KEY).fetchone()
            if bad_key is not None:
                raise self._corrupt(
                    f"key {bad_key[0]!r} is owned by {bad_key[1]!r}, not a task with that key"
                )
            bad_poison = conn.execute(_BAD_POISON).fetchone()
            if bad_poison is not None:
                raise self._corrupt(f"invalid poison row for key {bad_poison[0]!r}")
            if version >= 3:
                self._validate_jobs(conn)
        except sqlite3.DatabaseError as error:
            raise self._corrupt(f"unreadable database ({error})") from error
        return version

    def _upgrade(self) -> None:
        """Bring a validated older store to :data:`SCHEMA_VERSION` in one transaction.

        The version is read again under the write lock: another process opening the same file
        may have upgraded it in the meantime.
        """
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:  # a newer aiqsim upgraded it meanwhile: never label it ours
                raise self._corrupt(
                    f"schema version {version} (written by a newer aiqsim); this build reads "
                    f"{' or '.join(map(str, READABLE_VERSIONS))}"
                )
            if version == SCHEMA_VERSION:
                conn.execute("ROLLBACK")  # another process upgraded it first: nothing to do
                return
            while version < SCHEMA_VERSION:
                migration = MIGRATIONS[version]
                for statement in (migration,) if isinstance(migration, str) else migration:
                    conn.execute(statement)
                version += 1
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _validate_jobs(self, conn: sqlite3.Connection) -> None:
        """Decode every job row and check every job key's owner (jobs are few next to tasks)."""
        for row in conn.execute(_JOB_SELECT).fetchall():
            self._decode_job(row)
        bad = conn.execute(
            "SELECT k.key, k.owner_id FROM job_keys k LEFT JOIN jobs j ON j.id = k.owner_id "
            "WHERE j.id IS NULL OR j.key != k.key LIMIT 1"
        ).fetchone()
        if bad is not None:
            raise self._corrupt(f"job key {bad[0]!r} is owned by {bad[1]!r}, not a job with that key")

    # ------------------------------------------------------------------ rows
    def _decode(self, row: Sequence[Any]) -> TaskRecord:
        data = dict(zip(COLUMNS, row, strict=True))
        for name in _JSON_COLUMNS:
            try:
                data[name] = json.loads(data[name])
            except (TypeError, ValueError) as error:
                raise self._corrupt(f"task {data['id']!r}: column {name!r} is not JSON ({error})") from error
        return record_from_stored(data, str(self.path))

    @staticmethod
    def _encode(task: TaskRecord) -> tuple[Any, ...]:
        data = task.to_dict()
        return tuple(_json_text(data[name]) if name in _JSON_COLUMNS else data[name] for name in COLUMNS)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"{self.path}: store is closed")

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: committed on success, rolled back on any error."""
        self._check_open()
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _read_one(self, sql: str, params: Sequence[Any]) -> TaskRecord | None:
        self._check_open()
        row = self._conn.execute(sql, params).fetchone()
        return self._decode(row) if row is not None else None

    # ------------------------------------------------------------------ TaskStore
    def insert_and_claim(self, task: TaskRecord) -> TaskRecord:
        values = self._encode(task)  # a non-JSON payload fails here, before the transaction
        with self._write() as conn:
            try:
                conn.execute(
                    f"INSERT INTO tasks ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
                    values,
                )
            except sqlite3.IntegrityError as error:
                raise ValueError(f"task id {task.id!r} already exists") from error
            return self._claim_in_transaction(conn, task)

    def claim(self, task: TaskRecord) -> TaskRecord:
        with self._write() as conn:
            row = conn.execute(f"{_SELECT} WHERE t.id = ?", (task.id,)).fetchone()
            if row is None:
                raise KeyError(f"unknown task id {task.id!r}")
            owner_row = conn.execute("SELECT owner_id FROM keys WHERE key = ?", (task.key,)).fetchone()
            if owner_row is not None and owner_row[0] == task.id:
                return self._decode(row)
            return self._claim_in_transaction(conn, task)

    def _claim_in_transaction(self, conn: sqlite3.Connection, task: TaskRecord) -> TaskRecord:
        taken = conn.execute(
            "INSERT INTO keys (key, owner_id) VALUES (?, ?) ON CONFLICT (key) DO NOTHING", (task.key, task.id)
        )
        if taken.rowcount == 1:
            return task
        row = conn.execute(
            f"{_SELECT} JOIN keys k ON k.owner_id = t.id WHERE k.key = ?", (task.key,)
        ).fetchone()
        owner = claim_owner(self._decode(row) if row is not None else None, task)
        if owner is task:
            conn.execute("UPDATE keys SET owner_id = ? WHERE key = ?", (task.id, task.key))
        return owner

    def update(self, task: TaskRecord) -> None:
        values = self._encode(task)
        assignments = ", ".join(f"{name} = ?" for name in COLUMNS[1:])
        with self._write() as conn:
            changed = conn.execute(f"UPDATE tasks SET {assignments} WHERE id = ?", (*values[1:], task.id))
            if changed.rowcount != 1:
                raise KeyError(f"unknown task id {task.id!r}")

    def get(self, task_id: str) -> TaskRecord | None:
        return self._read_one(f"{_SELECT} WHERE t.id = ?", (task_id,))

    def owner_of(self, key: str) -> TaskRecord | None:
        return self._read_one(f"{_SELECT} JOIN keys k ON k.owner_id = t.id WHERE k.key = ?", (key,))

    def list_by_status(self, *statuses: TaskStatus) -> list[TaskRecord]:
        self._check_open()
        if statuses:
            values = [TaskStatus(status).value for status in statuses]
            sql = f"{_SELECT} WHERE t.status IN ({', '.join('?' * len(values))}) ORDER BY t.seq"
            rows = self._conn.execute(sql, values).fetchall()
        else:
            rows = self._conn.execute(f"{_SELECT} ORDER BY t.seq").fetchall()
        return [self._decode(row) for row in rows]

    def record_poison(self, key: str, error: str, now: float) -> None:
        with self._write() as conn:
            conn.execute(
                "INSERT INTO poison (key, error, recorded_at) VALUES (?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET error = excluded.error, recorded_at = excluded.recorded_at",
                (key, error, float(now)),
            )

    def poison_error(self, key: str) -> str | None:
        self._check_open()
        row = self._conn.execute("SELECT error FROM poison WHERE key = ?", (key,)).fetchone()
        return row[0] if row is not None else None

    # ------------------------------------------------------------------ JobStore
    def _decode_job(self, row: Sequence[Any]) -> JobRecord:
        data = dict(zip(JOB_COLUMNS, row, strict=True))
        for name in _JOB_JSON_COLUMNS:
            try:
                data[name] = json.loads(data[name])
            except (TypeError, ValueError) as error:
                raise self._corrupt(f"job {data['id']!r}: column {name!r} is not JSON ({error})") from error
        return job_from_stored(data, str(self.path))

    @staticmethod
    def _encode_job(job: JobRecord) -> tuple[Any, ...]:
        data = job.to_dict()
        return tuple(
            _json_text(data[name]) if name in _JOB_JSON_COLUMNS else data[name] for name in JOB_COLUMNS
        )

    def _read_job(self, sql: str, params: Sequence[Any]) -> JobRecord | None:
        self._check_open()
        row = self._conn.execute(sql, params).fetchone()
        return self._decode_job(row) if row is not None else None

    def insert_and_claim_job(self, job: JobRecord) -> JobRecord:
        values = self._encode_job(job)  # non-JSON inputs fail here, before the transaction
        with self._write() as conn:
            try:
                conn.execute(_JOB_INSERT, values)
            except sqlite3.IntegrityError as error:
                raise ValueError(f"job id {job.id!r} already exists") from error
            return self._claim_job_in_transaction(conn, job)

    def claim_job(self, job: JobRecord) -> JobRecord:
        with self._write() as conn:
            row = conn.execute(f"{_JOB_SELECT} WHERE j.id = ?", (job.id,)).fetchone()
            if row is None:
                raise KeyError(f"unknown job id {job.id!r}")
            owner_row = conn.execute("SELECT owner_id FROM job_keys WHERE key = ?", (job.key,)).fetchone()
            if owner_row is not None and owner_row[0] == job.id:
                return self._decode_job(row)
            return self._claim_job_in_transaction(conn, job)

    def _claim_job_in_transaction(self, conn: sqlite3.Connection, job: JobRecord) -> JobRecord:
        taken = conn.execute(
            "INSERT INTO job_keys (key, owner_id) VALUES (?, ?) ON CONFLICT (key) DO NOTHING",
            (job.key, job.id),
        )
        if taken.rowcount == 1:
            return job
        row = conn.execute(
            f"{_JOB_SELECT} JOIN job_keys k ON k.owner_id = j.id WHERE k.key = ?", (job.key,)
        ).fetchone()
        owner = claim_job_owner(self._decode_job(row) if row is not None else None, job)
        if owner is job:
            conn.execute("UPDATE job_keys SET owner_id = ? WHERE key = ?", (job.id, job.key))
        return owner

    def update_job(self, job: JobRecord) -> None:
        values = self._encode_job(job)
        assignments = ", ".join(f"{name} = ?" for name in JOB_COLUMNS[1:])
        with self._write() as conn:
            changed = conn.execute(f"UPDATE jobs SET {assignments} WHERE id = ?", (*values[1:], job.id))
            if changed.rowcount != 1:
                raise KeyError(f"unknown job id {job.id!r}")

    def get_job(self, job_id: str) -> JobRecord | None:
        return self._read_job(f"{_JOB_SELECT} WHERE j.id = ?", (job_id,))

    def job_owner_of(self, key: str) -> JobRecord | None:
        return self._read_job(f"{_JOB_SELECT} JOIN job_keys k ON k.owner_id = j.id WHERE k.key = ?", (key,))

    def list_jobs(self, *statuses: JobStatus) -> list[JobRecord]:
        self._check_open()
        if statuses:
            values = [JobStatus(status).value for status in statuses]
            sql = f"{_JOB_SELECT} WHERE j.status IN ({', '.join('?' * len(values))}) ORDER BY j.seq"
            rows = self._conn.execute(sql, values).fetchall()
        else:
            rows = self._conn.execute(f"{_JOB_SELECT} ORDER BY j.seq").fetchall()
        return [self._decode_job(row) for row in rows]

    def close(self) -> None:
        """Close the connection (idempotent); every committed write is already durable."""
        if not self._closed:
            self._closed = True
            self._conn.close()

    def __len__(self) -> int:
        self._check_open()
        return int(self._conn.execute("SELECT count(*) FROM tasks").fetchone()[0])

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SqliteStore {self.path}{' closed' if self._closed else ''}>"
