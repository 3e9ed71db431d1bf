"""The default durable task store: one SQLite file, shareable between processes.

Schema (version 5, kept in ``PRAGMA user_version``): ``tasks`` (one row per task, ``seq`` gives
insertion order, payload/result as JSON text, ``worker`` the scheduler instance holding the task),
``keys`` (idempotency key -> owning task id) and ``poison`` (keys whose input poisons the
provider); version 3 adds ``jobs`` and ``job_keys``, the same pair for jobs (pipelines of tasks),
version 4 the tasks' ``tenant`` column (:mod:`aiqsim.scheduler.tenants`), and version 5 the
tasks' ``route`` column (:mod:`aiqsim.scheduler.routes`) and the jobs' ``tenant``.
A version-1, -2, -3 or -4 file is validated as it is and then upgraded in one transaction when opened;
a file from a newer aiqsim is refused.

Concurrency: every write is one ``BEGIN IMMEDIATE`` transaction, so it takes SQLite's write lock
up front and never fails half-way on a lock upgrade. A claim is ``INSERT ... ON CONFLICT DO
NOTHING`` on ``keys`` inside that transaction; when the key is taken, the current owner is read
and replaced only if :func:`~aiqsim.stores.base.claim_owner` says so (a failed or cancelled
owner). Two processes racing on one key therefore get exactly one owner. ``busy_timeout`` makes
a process wait for the other's transaction instead of failing with "database is locked".

Group commit (``group_commit=True``, :attr:`SqliteStore.deferred_commit`): every write method
stages its change inside one open ``BEGIN IMMEDIATE`` transaction (each write in a savepoint of
its own, so a write that fails takes back only itself) and :meth:`SqliteStore.flush` commits
everything staged in one transaction -- one fsync under ``synchronous=FULL`` for the whole
window. Reads on this connection see staged rows; other connections do not see them until the
flush. The claim stays atomic across processes because the write lock is held from the first
staged write to the flush. The trade: that lock is held for the whole commit window, so another
process's write waits up to that long (its ``busy_timeout_s`` must exceed the window), and a
staged write is not durable -- a crash loses exactly the writes not yet flushed, so a caller may
acknowledge a change only after the :meth:`~SqliteStore.flush` that covers it returned.

Durability: WAL journal with ``synchronous=FULL`` by default. In WAL mode ``NORMAL`` survives a
killed process but may roll back the last commits on power loss or an OS crash, and a lost
``running`` or ``succeeded`` write is exactly what makes a task run (and bill) twice. FULL costs
one fsync of the WAL per transition (see ``benchmarks/RESULTS.md``); pass ``synchronous="NORMAL"``
where that trade is acceptable, ``"OFF"`` only for bulk loads.

Opening never writes to a file it has not validated: a non-database, a truncated or
malformed file, a wrong schema version or an invalid row raises
:class:`~aiqsim.stores.base.StoreCorruptError` and the file stays byte-for-byte as it was. So does
a damaged ``-wal`` that SQLite would replay only up to the damage, silently dropping committed
transactions after it (and then checkpointing the evidence away): it is read first, before any
connection opens the file (:mod:`aiqsim.stores.sqlite_wal`); a torn tail left by a crash is not
damage and opens as SQLite recovers it.
A new store file is built under a temp name and linked into place, so a crash during creation
never leaves a half-initialised store behind.

What opening checks (``validate=True``, the default), and why: the file's size against its header
(whole pages, at least the recorded page count: SQLite reads a short last page as zeros, so a file
one byte short would open with a changed value); ``PRAGMA integrity_check`` rather than
``quick_check`` -- only the former compares every index with its table, and a stale
``tasks_by_status`` index made ``list_by_status(RUNNING)`` miss a running task, so ``recover()``
never reconciled it; every text column decodes as UTF-8 (SQLite keeps any bytes as text, and
Python cannot read such a row at all); every row's types and values; every key's owner. All of it
is O(n), paid once per open (and so once per ``recover()`` after a restart): at 100k tasks about
0.74 s of CPU in all, of which integrity_check 0.21 s vs 0.08 s for quick_check, the UTF-8 pass
0.31 s and the row scan 0.20 s (``benchmarks/bench_store_checks.py``; wall time 2-4x that on the
loaded 2-core machine). A recovery that misses an orphan bills twice, which outweighs a fraction
of a second per start. ``validate=False`` skips the O(n) part for a store known good; damage met
later still surfaces as an error, never as a wrong answer read quietly.

Errors: no raw ``sqlite3`` exception leaves the store. A read that fails is
:class:`~aiqsim.stores.base.StoreCorruptError` (damage) or ``StoreError`` (lock, I/O); a write that
fails (disk full, I/O error, lock timeout, a page found malformed) is
:class:`~aiqsim.stores.base.StoreWriteError` naming the change that was not persisted, and the
store stays usable. A store this process cannot write (file, ``-wal``/``-shm``, or the directory
WAL needs) is refused at open with :class:`~aiqsim.stores.base.StoreAccessError`: there is no
read-only mode, and SQLite would otherwise open it read-only without a word.

Not protected against: deleting (or replacing) the ``-wal`` file, or the database file, while a
process has the store open. Committed transactions live in the WAL until a checkpoint copies them
into the main file; a ``-wal`` removed behind SQLite's back takes them with it, and the next open
silently sees the store as of the last checkpoint. Neither SQLite nor this store can detect files
removed from under them by another program; never clean a store's directory while it is in use.
"""

from __future__ import annotations

import contextlib
import glob
import os
import sqlite3
import stat
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from aiqsim.core.errors import ConfigurationError, StoreError
from aiqsim.core.job import JobRecord, JobStatus
from aiqsim.core.task import Priority, TaskRecord, TaskStatus
from aiqsim.stores.base import (
    DuplicateTaskIdError,
    PurgeReport,
    StoreAccessError,
    StoreClosedError,
    StoreCorruptError,
    StoreWriteError,
    check_purge_ttls,
    check_store_location,
    checked_store_path,
    claim_owner,
    describe_writes,
    purge_report,
    record_from_stored,
    unencodable_text,
)
from aiqsim.stores.columns import COLUMNS, JOB_COLUMNS
from aiqsim.stores.job_store import claim_job_owner, job_from_stored
from aiqsim.stores.sql_records import (
    JOB_TABLE,
    SQLITE,
    TASK_TABLE,
    KeyClaim,
    RecordSql,
    decode_row,
    encode_row,
    plan_table_purge,
    select_sql,
    update_row,
)
from aiqsim.stores.sqlite_wal import wal_problem

SCHEMA_VERSION = 5
READABLE_VERSIONS = (1, 2, 3, 4, 5)
"""Schema versions this build opens; older ones are upgraded by :data:`MIGRATIONS` on open."""
FILE_MODE = 0o600
DEFAULT_BUSY_TIMEOUT_S = 30.0
SYNCHRONOUS_LEVELS = ("OFF", "NORMAL", "FULL", "EXTRA")
SQLITE_HEADER = b"SQLite format 3\x00"
SQLITE_HEADER_SIZE = 100
_WAL_READS = 5
"""How often a ``-wal`` showing a problem is read again before it is left to its writer (``_check_wal``)."""

_ADDED_IN_VERSION = {"worker": 2, "tenant": 4, "route": 5}
"""Columns that a store of an older schema version does not have yet (read as NULL there)."""
_TRANSIENT_CODES = frozenset({5, 6, 7, 10, 13, 14})
"""Primary SQLite result codes that are not damage: BUSY, LOCKED, NOMEM, IOERR, FULL, CANTOPEN."""


def _select_for(version: int) -> str:
    """``SELECT`` of every record column as of ``version`` (NULL for columns it does not have)."""
    return select_sql(TASK_TABLE, SQLITE, {name for name, v in _ADDED_IN_VERSION.items() if v > version})


_TASKS = RecordSql.build(TASK_TABLE, SQLITE)
_JOBS = RecordSql.build(JOB_TABLE, SQLITE)

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
    worker TEXT,
    tenant TEXT,
    route TEXT
);
CREATE INDEX tasks_by_status ON tasks (status, seq);
CREATE TABLE keys (key TEXT PRIMARY KEY, owner_id TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE poison (key TEXT PRIMARY KEY, error TEXT NOT NULL, recorded_at REAL NOT NULL) WITHOUT ROWID;
"""

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
"""The job tables as version 3 made them, one statement each: added by the 2 -> 3 migration."""
JOB_TENANT = "ALTER TABLE jobs ADD COLUMN tenant TEXT"
"""The jobs' ``tenant`` column (version 5): added after the table's other columns, in a new store too,
so that every store of one version has the same columns in the same order."""
SCHEMA = SCHEMA + "".join(f"{statement};\n" for statement in (*JOB_SCHEMA, JOB_TENANT))

MIGRATIONS: dict[int, str | tuple[str, ...]] = {1: "ALTER TABLE tasks ADD COLUMN worker TEXT"}
MIGRATIONS[2] = JOB_SCHEMA
MIGRATIONS[3] = "ALTER TABLE tasks ADD COLUMN tenant TEXT"
MIGRATIONS[4] = ("ALTER TABLE tasks ADD COLUMN route TEXT", JOB_TENANT)
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
        jobs = JOB_COLUMNS if version >= 5 else tuple(name for name in JOB_COLUMNS if name != "tenant")
        tables.update(jobs=("seq", *jobs), job_keys=("key", "owner_id"))
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
    OR payload LIKE '%\\ud%' OR result LIKE '%\\ud%'
"""
# (the last line: JSON that escapes a surrogate code point, \uD800-\uDFFF, which LIKE matches in
# either case; our writes never escape one, so only a hand edit's rows are decoded, and a lone one
# is refused as text no store can write back: base.unicode_text_problem)


_TEXT_COLUMNS_V1 = ("id", "key", "kind", "provider", "status", "payload", "result", "error", "deduped_from")


def _suspect_rows(version: int) -> str:
    """Rows whose column types or values a valid record cannot have (checked in SQL, then decoded)."""
    extra = " OR typeof(worker) NOT IN ('text', 'null')" if version >= 2 else ""
    if version >= 4:
        extra += " OR typeof(tenant) NOT IN ('text', 'null')"
    if version >= 5:
        extra += " OR typeof(route) NOT IN ('text', 'null')"
    return f"{_SUSPECT_ROWS_V1}{extra} ORDER BY seq"


def _text_columns(version: int) -> tuple[str, ...]:
    later = tuple(name for name, added in _ADDED_IN_VERSION.items() if added <= version)
    return _TEXT_COLUMNS_V1 + later


def _not_a_regular_file(path: Path) -> str | None:
    """What ``path`` is when it exists and is no regular file (``"a FIFO"``, ``"a directory"``...),
    after following symlinks; ``None`` for a regular file. Raises ``FileNotFoundError`` if absent."""
    mode = path.stat().st_mode
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "a device")


def _access(path: Path, mode: int) -> bool:
    """``os.access`` with the effective ids where the platform allows it (setuid-safe)."""
    return os.access(path, mode, effective_ids=os.access in os.supports_effective_ids)


_BAD_KEY = """
SELECT k.key, k.owner_id FROM keys k LEFT JOIN tasks t ON t.id = k.owner_id
WHERE t.id IS NULL OR t.key != k.key LIMIT 1
"""
_BAD_POISON = f"""
SELECT key FROM poison
WHERE typeof(key) != 'text' OR typeof(error) != 'text' OR typeof(recorded_at) NOT IN {_NUMBER} LIMIT 1
"""


_UNIQUE_COLUMNS: dict[str, tuple[str, ...]] = {
    "tasks": ("seq", "id"),
    "keys": ("key",),
    "poison": ("key",),
    "jobs": ("seq", "id"),
    "job_keys": ("key",),
}
"""The columns each table must keep unique (a primary key or a unique index), as :data:`SCHEMA` makes them."""


def _missing_constraint(conn: sqlite3.Connection, version: int) -> str | None:
    """What the file lacks of the schema's tables and uniqueness (``None``: nothing): a table that is
    a view, or a column the store writes with ``ON CONFLICT`` or looks records up by that is not
    unique. Read-only: ``sqlite_master`` and the ``table_info`` / ``index_list`` pragmas."""
    for table in expected_tables(version):
        kind = conn.execute("SELECT type FROM sqlite_master WHERE name = ?", (table,)).fetchone()
        if kind is None or kind[0] != "table":
            return f"{table!r} is a {kind[0] if kind else 'missing object'}, not a table"
        primary = [row[1] for row in conn.execute(f"PRAGMA table_info({table})") if row[5]]
        unique = {tuple(primary)}
        for index in conn.execute(f"PRAGMA index_list({table})").fetchall():
            if index[2]:  # unique
                unique.add(tuple(row[2] for row in conn.execute(f"PRAGMA index_info({index[1]!r})")))
        for column in _UNIQUE_COLUMNS[table]:
            if (column,) not in unique:
                return f"table {table!r}: column {column!r} is neither its primary key nor unique"
    return None


def _fetch_one(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> Any:
    """The first row ``sql`` finds, or None. Text that cannot be encoded (a lone surrogate, which a
    Python string may hold and UTF-8 may not) matches no stored row: none could have been written."""
    try:
        return conn.execute(sql, params).fetchone()
    except UnicodeEncodeError:
        return None


class SqliteStore:
    """:class:`~aiqsim.stores.base.TaskStore` in an SQLite file (WAL), safe for several processes.

    Parameters:
        path: the database file; created (empty store, mode 0600) if absent.
        synchronous: SQLite ``synchronous`` level, ``"FULL"`` by default (see module docs).
        busy_timeout_s: how long a write waits for another process's transaction.
        validate: run the full open-time checks (default; see module docs). O(rows) once per open.
        group_commit: stage writes until :meth:`flush` (see module docs); off by default, when
            every write method commits (and fsyncs) on its own.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "FULL",
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
        validate: bool = True,
        group_commit: bool = False,
    ) -> None:
        synchronous = synchronous.upper()
        if synchronous not in SYNCHRONOUS_LEVELS:
            raise ConfigurationError(f"synchronous must be one of {SYNCHRONOUS_LEVELS}, got {synchronous!r}")
        if not busy_timeout_s >= 0:
            raise ConfigurationError(f"busy_timeout_s must be >= 0, got {busy_timeout_s!r}")
        self.path = checked_store_path(path, "SqliteStore")
        self.synchronous = synchronous
        self.busy_timeout_s = busy_timeout_s
        self.deferred_commit = bool(group_commit)
        """True when writes are staged until :meth:`flush` (``group_commit=True``)."""
        self._staged: list[str] = []
        """What each write staged in the open transaction changed, in order (group commit)."""
        self._lost: list[str] = []
        """Staged writes SQLite rolled back under a later failed write; the next flush reports them."""
        self._lost_cause: BaseException | None = None
        self._closed = False
        self._task_claim = KeyClaim(_TASKS, self._decode, claim_owner)
        self._job_claim = KeyClaim(_JOBS, self._decode_job, claim_job_owner)
        check_store_location(self.path)  # a missing folder: StoreOpenError naming the path given
        try:
            self._remove_stale_temps()
            if not self.path.exists():
                self._create()
        except PermissionError as error:
            raise StoreAccessError(
                f"{self.path}: cannot create or inspect the store ({error.strerror or error}); "
                "nothing was written"
            ) from error
        except (OSError, sqlite3.Error) as error:  # e.g. a full disk while the empty store is built
            raise StoreWriteError(f"creation of an empty store at {self.path}", error) from error
        self._check_header()
        self._check_writable()
        self._check_wal()
        try:
            self._conn = self._connect(self.path)
        except sqlite3.Error as error:
            raise StoreError(f"{self.path}: cannot open the store ({error}); nothing was written") from error
        try:
            version = self._validate(full=validate)
            try:
                mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                self._conn.execute(f"PRAGMA synchronous = {synchronous}")
                if version < SCHEMA_VERSION:
                    self._upgrade()
            except sqlite3.Error as error:
                raise StoreError(f"{self.path}: cannot prepare the store for writing ({error})") from error
            if str(mode).lower() != "wal":
                raise StoreCorruptError(f"{self.path}: cannot switch to WAL journal mode (got {mode!r})")
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
        """Refuse what is not a whole SQLite file, from its first 100 bytes and its size.

        SQLite reads a short last page as if the missing bytes were zeros, so a file cut short
        by even one byte would open with a changed value. Its size must therefore be whole pages
        and at least the page count the header records (when that count is valid). A non-empty
        ``-wal`` beside it may legitimately hold pages the file lacks (a checkpoint cut short), so
        the size is then left to ``integrity_check``.
        """
        try:
            kind = _not_a_regular_file(self.path)
            if kind is not None:  # open() would wait for ever on a FIFO's writer
                raise self._corrupt(f"is {kind}, not a regular file; expected an SQLite task store")
            with open(self.path, "rb") as handle:
                header = handle.read(SQLITE_HEADER_SIZE)
                size = os.fstat(handle.fileno()).st_size
        except PermissionError as error:
            raise StoreAccessError(
                f"{self.path}: the store file cannot be read ({error.strerror or error}); it was not opened"
            ) from error
        except OSError as error:
            raise self._corrupt(f"cannot be read ({error.strerror or error})") from error
        if not header:
            raise self._corrupt("empty file (truncated?); expected an SQLite task store")
        if not header.startswith(SQLITE_HEADER):
            raise self._corrupt("not an SQLite database")
        if len(header) < SQLITE_HEADER_SIZE:
            raise self._corrupt(f"truncated: {len(header)} bytes, shorter than the SQLite header")
        wal = Path(f"{self.path}-wal")
        if wal.exists() and wal.stat().st_size > 0:
            return
        page_size = int.from_bytes(header[16:18], "big")
        page_size = 65536 if page_size == 1 else page_size
        if page_size < 512 or page_size & (page_size - 1):
            raise self._corrupt(f"invalid page size {page_size} in the SQLite header")
        if size % page_size:
            raise self._corrupt(
                f"truncated or extended: {size} bytes is not a whole number of {page_size}-byte pages"
            )
        page_count = int.from_bytes(header[28:32], "big")
        count_valid = header[92:96] == header[24:28] and page_count > 0
        if count_valid and size < page_count * page_size:
            raise self._corrupt(
                f"truncated: {size} bytes, but the header records {page_count} pages of {page_size}"
            )

    def _check_wal(self) -> None:
        """Refuse a ``-wal`` whose damage SQLite would drop silently with committed transactions after it
        (see :mod:`aiqsim.stores.sqlite_wal`), before any connection can replay or checkpoint it.

        Another process may be appending to the ``-wal`` while it is read, so a problem counts only
        once two reads in a row return the same bytes; a file that keeps changing is in live use,
        and its writer, not this open, decides what it holds.
        """
        journal = Path(f"{self.path}-journal")
        if journal.is_symlink() or journal.exists():
            # The store writes in WAL mode, so it leaves no rollback journal. SQLite would play a hot
            # one back into the file (or delete it) on the first read: refused before that happens.
            raise self._corrupt(
                f"a rollback journal {journal} is beside it, which aiqsim's WAL-mode store never "
                "leaves; another program wrote to this file. Nothing was opened or played back; move "
                "the journal away only if you know the file is whole without it"
            )
        wal = Path(f"{self.path}-wal")
        data = self._read_wal(wal)
        for _ in range(_WAL_READS):
            problem = wal_problem(data)
            if problem is None:
                return
            again = self._read_wal(wal)
            if again == data:
                raise self._corrupt(
                    f"its write-ahead log {wal} is damaged: {problem}. Nothing was opened or checkpointed "
                    "(-wal and -shm are as they were too); restore a backup or inspect the -wal"
                )
            data = again

    def _read_wal(self, wal: Path) -> bytes:
        try:
            kind = _not_a_regular_file(wal)
            if kind is not None:
                raise self._corrupt(f"its write-ahead log {wal} is {kind}, not a regular file")
            return wal.read_bytes()
        except FileNotFoundError:
            return b""
        except PermissionError as error:
            raise StoreAccessError(
                f"{wal}: the store's write-ahead log cannot be read ({error.strerror or error}); "
                "it was not opened"
            ) from error
        except OSError as error:
            raise self._corrupt(
                f"its write-ahead log {wal} cannot be read ({error.strerror or error})"
            ) from error

    def _check_writable(self) -> None:
        """Refuse a store this process could read but not write, before SQLite opens it.

        Otherwise SQLite opens it read-only without a word and the first write fails with
        ``attempt to write a readonly database``. WAL mode also needs to create ``-wal`` and
        ``-shm`` beside the file, so the directory must be writable unless both already are.
        A store is opened for writing or not at all (there is no read-only mode).
        """
        problems = []
        if not _access(self.path, os.R_OK | os.W_OK):
            problems.append("the file is not writable")
        sides = [Path(f"{self.path}{suffix}") for suffix in ("-wal", "-shm")]
        for side in sides:
            if side.exists() and not _access(side, os.R_OK | os.W_OK):
                problems.append(f"{side.name} is not writable")
        if not _access(self.path.parent, os.W_OK | os.X_OK) and not all(side.exists() for side in sides):
            problems.append(
                f"its directory {self.path.parent} is not writable (the WAL journal's "
                f"{self.path.name}-wal and -shm are created there)"
            )
        if problems:
            raise StoreAccessError(
                f"{self.path}: the store is read-only for this process ({'; '.join(problems)}); it was not "
                "opened and nothing was written. Fix the permissions, or open a writable copy."
            )

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
            missing = _missing_constraint(conn, version)
            if missing is not None:
                raise self._corrupt(
                    f"{missing}: the store's claims rely on it (a key runs once). Not an aiqsim task "
                    "store, or one rebuilt without its constraints; restore a backup or copy its rows "
                    "into a store aiqsim creates"
                )
            if not full:
                return version
            check = [row[0] for row in conn.execute("PRAGMA integrity_check")]
            if check != ["ok"]:
                raise self._corrupt(f"integrity check failed: {'; '.join(map(str, check[:3]))}")
            self._check_utf8(version)
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
                self._validate_jobs(conn, version)
        except sqlite3.DatabaseError as error:
            raise self._corrupt(f"unreadable database ({error})") from error
        return version

    def _check_utf8(self, version: int) -> None:
        """Refuse text that is not UTF-8 (SQLite keeps whatever bytes it is given as text; Python
        then cannot read that row at all). Each row's text columns come to Python as one blob,
        joined in SQL by an ASCII separator (so a sequence cut at a column boundary still fails);
        only non-ASCII blobs are decoded. ~0.5-1 s at 100k tasks (``benchmarks/bench_store_checks.py``).
        """
        columns = _text_columns(version)
        joined = " || '|' || ".join(f"coalesce({name}, '')" for name in columns)
        for seq, blob in self._conn.execute(f"SELECT seq, CAST({joined} AS BLOB) FROM tasks"):
            if blob.isascii():
                continue
            try:
                blob.decode("utf-8")
            except UnicodeDecodeError as error:
                task_id = blob.split(b"|", 1)[0].decode("utf-8", "replace")
                raise self._corrupt(
                    f"task {task_id!r} (row {seq}): holds text that is not valid UTF-8 ({error})"
                ) from error

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

    def _validate_jobs(self, conn: sqlite3.Connection, version: int) -> None:
        """Decode every job row and check every job key's owner (jobs are few next to tasks)."""
        select = _JOBS.select if version >= 5 else select_sql(JOB_TABLE, SQLITE, {"tenant"})
        for row in conn.execute(select).fetchall():
            self._decode_job(row)
        bad = conn.execute(
            "SELECT k.key, k.owner_id FROM job_keys k LEFT JOIN jobs j ON j.id = k.owner_id "
            "WHERE j.id IS NULL OR j.key != k.key LIMIT 1"
        ).fetchone()
        if bad is not None:
            raise self._corrupt(f"job key {bad[0]!r} is owned by {bad[1]!r}, not a job with that key")

    # ------------------------------------------------------------------ rows
    def _decode(self, row: Sequence[Any]) -> TaskRecord:
        return record_from_stored(decode_row(TASK_TABLE, row, self._corrupt), str(self.path))

    @staticmethod
    def _encode(task: TaskRecord) -> tuple[Any, ...]:
        return encode_row(TASK_TABLE, task.to_dict())

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"{self.path}: store is closed")

    @contextlib.contextmanager
    def _write(self, what: str) -> Iterator[sqlite3.Connection]:
        """One write: its own ``BEGIN IMMEDIATE`` transaction, or a savepoint in the staged one.

        ``what`` names the change for :class:`StoreWriteError`. A ``ValueError``/``KeyError`` the
        body raises (duplicate id, unknown id) takes back this write only and propagates as is;
        an SQLite failure (disk full, read-only file, I/O error, lock timeout) becomes a
        :class:`StoreWriteError` naming every change that was not persisted.
        """
        self._check_open()
        try:
            if self.deferred_commit:
                with self._staged_write(what) as conn:
                    yield conn
                return
            with self._transaction(what) as conn:
                yield conn
        except UnicodeEncodeError as error:  # sqlite3 encodes text as UTF-8; the write was taken back
            raise unencodable_text(what, error) from None

    @contextlib.contextmanager
    def _transaction(self, what: str) -> Iterator[sqlite3.Connection]:
        """A ``BEGIN IMMEDIATE`` transaction of its own, committed on success."""
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            yield conn
            conn.execute("COMMIT")
        except sqlite3.Error as error:
            self._rollback()
            raise StoreWriteError(what, error) from error
        except BaseException:
            self._rollback()
            raise

    @contextlib.contextmanager
    def _staged_write(self, what: str) -> Iterator[sqlite3.Connection]:
        conn = self._conn
        try:
            if not conn.in_transaction:
                conn.execute("BEGIN IMMEDIATE")
            conn.execute("SAVEPOINT aiqsim_write")
        except sqlite3.Error as error:
            raise StoreWriteError(what, error) from error
        try:
            yield conn
            conn.execute("RELEASE aiqsim_write")
        except BaseException as error:
            self._undo_staged_write(error)
            if isinstance(error, sqlite3.Error):
                lost = "; rolled back with it: " + describe_writes(self._lost) if self._lost else ""
                raise StoreWriteError(what + lost, error) from error
            raise
        self._staged.append(what)

    def _undo_staged_write(self, error: BaseException) -> None:
        """Take back the failed write only; if SQLite already dropped the whole transaction (it
        does on a full disk or an I/O error), the earlier staged writes are lost with it."""
        conn = self._conn
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK TO aiqsim_write")
                conn.execute("RELEASE aiqsim_write")
                return
            except sqlite3.Error:
                self._rollback()
        if self._staged:
            self._lost.extend(self._staged)
            self._lost_cause = error
            self._staged = []

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # the transaction is gone either way
                self._conn.execute("ROLLBACK")

    def flush(self) -> int:
        """Commit every staged write in one transaction; return how many writes it made durable.

        A no-op returning 0 unless :attr:`deferred_commit`. On failure everything staged is
        rolled back and :class:`StoreWriteError` names it; so are staged writes an earlier
        failure already rolled back, which were never durable either. The store stays usable:
        the next write opens a new transaction.
        """
        self._check_open()
        if not self.deferred_commit:
            return 0
        lost, cause = self._lost, self._lost_cause
        self._lost, self._lost_cause = [], None
        staged, self._staged = self._staged, []
        if self._conn.in_transaction:
            try:
                self._conn.execute("COMMIT")
            except sqlite3.Error as error:
                self._rollback()
                raise StoreWriteError(describe_writes(lost + staged), error) from error
        if lost:
            raise StoreWriteError(describe_writes(lost), cause)
        return len(staged)

    @contextlib.contextmanager
    def _reading(self, what: str) -> Iterator[sqlite3.Connection]:
        """A read; a raw SQLite failure becomes a project error that says what could not be read.

        Damage (malformed pages or index, text that is not UTF-8) is :class:`StoreCorruptError`;
        a lock or I/O failure, which says nothing about the file's contents, is :class:`StoreError`.
        Nothing is written either way.
        """
        self._check_open()
        try:
            yield self._conn
        except sqlite3.Error as error:
            code = getattr(error, "sqlite_errorcode", None)
            transient = code is not None and code & 0xFF in _TRANSIENT_CODES
            if transient:
                raise StoreError(f"{self.path}: cannot read {what} ({error}); nothing was changed") from error
            raise self._corrupt(f"cannot read {what} ({error})") from error

    def _read_one(self, sql: str, params: Sequence[Any], what: str) -> TaskRecord | None:
        with self._reading(what) as conn:
            row = _fetch_one(conn, sql, params)
        return self._decode(row) if row is not None else None

    # ------------------------------------------------------------------ TaskStore
    def insert_and_claim(self, task: TaskRecord) -> TaskRecord:
        values = self._encode(task)  # a non-JSON payload fails here, before the transaction
        with self._write(f"insert of task {task.id!r} ({task.status.value})") as conn:
            try:
                conn.execute(_TASKS.insert, values)
            except sqlite3.IntegrityError as error:
                raise DuplicateTaskIdError("task", task.id) from error
            return self._task_claim.claim(conn, task)

    def claim(self, task: TaskRecord) -> TaskRecord:
        with self._write(f"claim of key {task.key!r} by task {task.id!r}") as conn:
            return self._task_claim.claim_stored(conn, task)

    def update(self, task: TaskRecord) -> None:
        values = self._encode(task)
        with self._write(f"update of task {task.id!r} to {task.status.value}") as conn:
            update_row(conn, _TASKS, task.id, values)

    def get(self, task_id: str) -> TaskRecord | None:
        return self._read_one(_TASKS.by_id, (task_id,), f"task {task_id!r}")

    def owner_of(self, key: str) -> TaskRecord | None:
        return self._read_one(_TASKS.owner, (key,), f"the owner of key {key!r}")

    def list_by_status(self, *statuses: TaskStatus) -> list[TaskRecord]:
        values = [TaskStatus(status).value for status in statuses]
        sql, params = _TASKS.by_status(values)
        with self._reading(f"the tasks in {values or 'any status'}") as conn:
            rows = conn.execute(sql, params).fetchall()
        return [self._decode(row) for row in rows]

    def record_poison(self, key: str, error: str, now: float) -> None:
        with self._write(f"poison record for key {key!r}") as conn:
            conn.execute(
                "INSERT INTO poison (key, error, recorded_at) VALUES (?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET error = excluded.error, recorded_at = excluded.recorded_at",
                (key, error, float(now)),
            )

    def purge(self, now: float, *, finished_older_than_s: float, keys_older_than_s: float) -> PurgeReport:
        """Delete finished tasks, finished jobs and expired keys by
        :func:`~aiqsim.stores.base.plan_purge`, in one transaction of its own (with group commit,
        the staged writes are flushed first).

        Candidates are read without their payloads (terminal records finished before the earlier of
        the two cutoffs); SQLite reuses the freed pages, the file does not shrink (``VACUUM`` does).
        """
        self._check_open()
        check_purge_ttls(finished_older_than_s, keys_older_than_s)
        if self.deferred_commit:
            self.flush()
        ttls = {
            "now": float(now),
            "finished_older_than_s": finished_older_than_s,
            "keys_older_than_s": keys_older_than_s,
        }
        with self._transaction("purge of finished tasks, finished jobs and expired keys") as conn:
            plan = plan_table_purge(conn, _TASKS, executemany=conn.executemany, **ttls)
            job_plan = plan_table_purge(conn, _JOBS, executemany=conn.executemany, **ttls)
        return purge_report(plan, float(now), finished_older_than_s, keys_older_than_s, job_plan)

    def poison_error(self, key: str) -> str | None:
        with self._reading(f"the poison record of key {key!r}") as conn:
            row = _fetch_one(conn, "SELECT error FROM poison WHERE key = ?", (key,))
        return row[0] if row is not None else None

    # ------------------------------------------------------------------ JobStore
    def _decode_job(self, row: Sequence[Any]) -> JobRecord:
        return job_from_stored(decode_row(JOB_TABLE, row, self._corrupt), str(self.path))

    @staticmethod
    def _encode_job(job: JobRecord) -> tuple[Any, ...]:
        return encode_row(JOB_TABLE, job.to_dict())

    def _read_job(self, sql: str, params: Sequence[Any], what: str) -> JobRecord | None:
        with self._reading(what) as conn:
            row = _fetch_one(conn, sql, params)
        return self._decode_job(row) if row is not None else None

    def insert_and_claim_job(self, job: JobRecord) -> JobRecord:
        values = self._encode_job(job)  # non-JSON inputs fail here, before the transaction
        with self._write(f"insert of job {job.id!r} ({job.status.value})") as conn:
            try:
                conn.execute(_JOBS.insert, values)
            except sqlite3.IntegrityError as error:
                raise DuplicateTaskIdError("job", job.id) from error
            return self._job_claim.claim(conn, job)

    def claim_job(self, job: JobRecord) -> JobRecord:
        with self._write(f"claim of job key {job.key!r} by job {job.id!r}") as conn:
            return self._job_claim.claim_stored(conn, job)

    def update_job(self, job: JobRecord) -> None:
        values = self._encode_job(job)
        with self._write(f"update of job {job.id!r} to {job.status.value}") as conn:
            update_row(conn, _JOBS, job.id, values)

    def get_job(self, job_id: str) -> JobRecord | None:
        return self._read_job(_JOBS.by_id, (job_id,), f"job {job_id!r}")

    def job_owner_of(self, key: str) -> JobRecord | None:
        return self._read_job(_JOBS.owner, (key,), f"the owner of job key {key!r}")

    def latest_job(self, name: str, version: str) -> JobRecord | None:
        """The job last stored under spec ``name`` and ``version``, if any
        (:func:`~aiqsim.stores.job_store.latest_job_of`)."""
        return self._read_job(_JOBS.latest_named(), (name, version), f"the last job of {name!r} {version!r}")

    def list_jobs(self, *statuses: JobStatus) -> list[JobRecord]:
        values = [JobStatus(status).value for status in statuses]
        sql, params = _JOBS.by_status(values)
        with self._reading(f"the jobs in {values or 'any status'}") as conn:
            rows = conn.execute(sql, params).fetchall()
        return [self._decode_job(row) for row in rows]

    def close(self, *, flush: bool = True) -> None:
        """Close the connection (idempotent); every committed write is already durable.

        With group commit, staged writes are flushed first (``flush=False`` drops them, as a
        crash would); a failed flush still closes the store, then raises its
        :class:`StoreWriteError`.
        """
        if self._closed:
            return
        try:
            if flush and self.deferred_commit:
                self.flush()
        finally:
            self._closed = True
            self._staged = []
            self._conn.close()  # an open transaction is rolled back: nothing staged survives

    def __len__(self) -> int:
        with self._reading("the task count") as conn:
            return int(conn.execute("SELECT count(*) FROM tasks").fetchone()[0])

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SqliteStore {self.path}{' closed' if self._closed else ''}>"
