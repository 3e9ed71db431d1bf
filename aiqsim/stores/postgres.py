"""A task store on PostgreSQL, shared by workers on several hosts (psycopg 3, the ``postgres`` extra).

Same contract as :class:`~aiqsim.stores.sqlite.SqliteStore`, on a server instead of a file:

- Every write is one transaction (autocommit connection, ``BEGIN`` ... ``COMMIT`` per call);
  a transition and its result are one ``UPDATE``.
- A claim is ``INSERT INTO keys ... ON CONFLICT DO NOTHING``. When the key is taken, the
  owner's key row is locked (``SELECT ... FOR UPDATE``) and replaced only if
  :func:`~aiqsim.stores.base.claim_owner` says so (a failed or cancelled owner). Two workers
  racing on one key, on any host, get exactly one owner: PostgreSQL makes the second
  ``INSERT`` wait for the first transaction and then see its row.
- Tables live in their own PostgreSQL schema (``schema="aiqsim"`` by default), so the store
  can share a database with the application, and tests can give each store a fresh schema.
  The schema version is kept in ``<schema>.meta``; a store of an older version is upgraded in
  one transaction under an advisory lock (:data:`MIGRATIONS`), a newer one is refused with
  :class:`~aiqsim.stores.base.StoreCorruptError` and left untouched.
- Leases (schema version 2): a worker holds a lease that it renews (:meth:`renew_lease`, on the
  database server's clock, which every host shares); a live worker adopts the tasks of a worker
  whose lease expired (:meth:`adopt_expired`, exactly one adopter per dead worker), see
  :class:`aiqsim.fleet.LeaseKeeper`.
- Jobs (schema version 3): ``jobs`` and ``job_keys`` beside the task tables, the
  :class:`~aiqsim.stores.job_store.JobStore` methods claiming a job's key as tasks claim theirs.
- Tenants (schema version 4): the tasks' ``tenant`` column (:mod:`aiqsim.scheduler.tenants`).
- Routes and job tenants (schema version 5): the tasks' ``route`` column (:mod:`aiqsim.scheduler.routes`)
  and the jobs' ``tenant``.
- ``notify=True`` (default) sends ``NOTIFY aiqsim_task_done, '<schema>:<task id>'`` in the
  transaction that makes a task terminal, so a process waiting for a duplicate's owner on
  another host can wake on it instead of polling (see :meth:`wait_for_terminal`).

Errors: connection and server failures on writes raise
:class:`~aiqsim.stores.base.StoreWriteError` (the change is not persisted; the transaction was
rolled back); on reads, :class:`~aiqsim.stores.base.StoreError`. A lost connection (the server
restarted, an idle connection was cut, the network went away) is made again by the next call: a
write whose ``BEGIN`` finds the connection lost begins again on a new one (nothing of it had
reached the server), and so does a read; a write that loses its connection before its ``COMMIT``
raises ``StoreWriteError`` (the server rolls it back). One whose ``COMMIT`` answer was lost is looked
up by its transaction id on a new connection (a server process still holding it open, because the
``COMMIT`` never arrived, is ended first, which rolls it back): applied, the write returns as if
nothing happened (:attr:`PostgresStore.commits_confirmed` counts these); rolled back, it raises
``StoreWriteError``; and if the server cannot be asked, ``StoreWriteOutcomeUnknownError`` (a
``StoreWriteError``: the store's rows say which, and ``recover()`` reconciles from them). A write
whose connection was lost mid-transaction ends the server process still holding it (its row locks
would block a retry of the same key until the server noticed), and every connection sets
``idle_in_transaction_session_timeout`` (:data:`STRANDED_TRANSACTION_TIMEOUT_MS`, unless the DSN's
``options`` set it) for a transaction stranded while the server could not be reached. Learning
the id costs no round trip of its own (``BEGIN`` asks for it), about 20 µs per write on loopback
(time in psycopg's handling of the two results). While the server cannot be reached every call raises
(naming the DSN), and the first call after it is back works, with no restart of the process.
Messages name the DSN without its password (:func:`aiqsim.core.dsn.redacted_dsn`). Durability is the server's:
with PostgreSQL's default ``synchronous_commit = on`` a committed transition survives a crash of
the server's host.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from aiqsim.core.dsn import redacted_dsn, without_secrets
from aiqsim.core.job import JobRecord, JobStatus
from aiqsim.core.task import TaskRecord, TaskStatus
from aiqsim.stores.base import (
    DuplicateTaskIdError,
    PurgeReport,
    StoreClosedError,
    StoreCorruptError,
    StoreError,
    StoreWriteError,
    StoreWriteOutcomeUnknownError,
    check_purge_ttls,
    claim_owner,
    purge_report,
    record_from_stored,
    unencodable_text,
)
from aiqsim.stores.columns import COLUMNS, JOB_COLUMNS
from aiqsim.stores.job_store import claim_job_owner, job_from_stored
from aiqsim.stores.sql_records import (
    JOB_TABLE,
    TASK_TABLE,
    KeyClaim,
    RecordSql,
    decode_row,
    encode_row,
    plan_table_purge,
    postgres_dialect,
    update_row,
)

SCHEMA_VERSION = 5
DEFAULT_SCHEMA = "aiqsim"
NOTIFY_CHANNEL = "aiqsim_task_done"
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

_BEGIN = "BEGIN; SELECT txid_current()"
"""Opens a write's transaction and returns its id, which a lost ``COMMIT`` answer is looked up by."""
_END_IDLE_TRANSACTION = (
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = %s "
    "AND backend_xid = (%s %% 4294967296)::text::xid AND state LIKE 'idle in transaction%%'"
)
"""Ends the server process of a lost connection that still holds the write's transaction open."""
_OUTCOME_POLLS = 100
_OUTCOME_POLL_S = 0.05
STRANDED_TRANSACTION_TIMEOUT_MS = 10_000
"""``idle_in_transaction_session_timeout`` of every connection the store opens (unless the DSN's
``options`` set one): a write's transaction never waits on anything between its statements, so one
idle this long belongs to a client that is gone, and the server ends it, freeing its row locks."""


@dataclass(frozen=True, slots=True)
class _OpenTransaction:
    """A write's transaction: its connection, its id, and the server process and address serving it
    (what looking up a lost ``COMMIT``'s outcome, or ending a stranded transaction, needs)."""

    conn: Any
    id: int
    backend_pid: int
    server: tuple[str, int]


_SCHEMA_SQL = """
CREATE TABLE {s}.meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE {s}.tasks (
    seq BIGSERIAL PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    key TEXT NOT NULL,
    kind TEXT NOT NULL,
    provider TEXT NOT NULL,
    priority INTEGER NOT NULL,
    status TEXT NOT NULL,
    cost_estimate DOUBLE PRECISION NOT NULL,
    attempts INTEGER NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    started_at DOUBLE PRECISION,
    finished_at DOUBLE PRECISION,
    payload TEXT NOT NULL,
    result TEXT NOT NULL,
    error TEXT,
    deduped_from TEXT,
    worker TEXT,
    tenant TEXT,
    route TEXT
);
CREATE INDEX tasks_by_status ON {s}.tasks (status, seq);
CREATE TABLE {s}.keys (key TEXT PRIMARY KEY, owner_id TEXT NOT NULL);
CREATE TABLE {s}.poison (key TEXT PRIMARY KEY, error TEXT NOT NULL, recorded_at DOUBLE PRECISION NOT NULL);
"""

_LEASES_SQL = """
CREATE TABLE {s}.leases (
    worker TEXT PRIMARY KEY,
    expires_at DOUBLE PRECISION NOT NULL,
    adopted_by TEXT
);
"""


_JOBS_SQL = """
CREATE TABLE {s}.jobs (
    seq BIGSERIAL PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    key TEXT NOT NULL,
    name TEXT NOT NULL,
    version TEXT NOT NULL,
    priority INTEGER NOT NULL,
    status TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    started_at DOUBLE PRECISION,
    finished_at DOUBLE PRECISION,
    inputs TEXT NOT NULL,
    results TEXT NOT NULL,
    stage_tasks TEXT NOT NULL,
    failed_stage TEXT,
    error TEXT,
    deduped_from TEXT,
    worker TEXT
);
CREATE INDEX jobs_by_status ON {s}.jobs (status, seq);
CREATE TABLE {s}.job_keys (key TEXT PRIMARY KEY, owner_id TEXT NOT NULL);
"""

MIGRATIONS: dict[int, str] = {
    1: _LEASES_SQL,
    2: _JOBS_SQL,
    3: "ALTER TABLE {s}.tasks ADD COLUMN tenant TEXT;",
    4: "ALTER TABLE {s}.tasks ADD COLUMN route TEXT; ALTER TABLE {s}.jobs ADD COLUMN tenant TEXT;",
}
"""SQL that upgrades a store from the key's schema version to the next one: version 2 adds leases,
version 3 the job tables, version 4 the tasks' ``tenant`` column, version 5 the tasks' ``route``
and the jobs' ``tenant`` (after the job table's other columns: :data:`_JOBS_SQL` is version 3's)."""

_SERVER_NOW = "extract(epoch from clock_timestamp())"
"""The database server's clock: the one clock every worker on every host agrees on."""

EXPECTED_TABLES = {
    "meta": ("name", "value"),
    "tasks": ("seq", *COLUMNS),
    "keys": ("key", "owner_id"),
    "poison": ("key", "error", "recorded_at"),
    "leases": ("worker", "expires_at", "adopted_by"),
    "jobs": ("seq", *JOB_COLUMNS),
    "job_keys": ("key", "owner_id"),
}
_ADDED_IN_VERSION = {"leases": 2, "jobs": 3, "job_keys": 3}


def expected_tables(version: int) -> dict[str, tuple[str, ...]]:
    """The tables of a store of schema ``version`` (leases arrived in version 2, jobs in 3, the
    tasks' ``tenant`` column in 4, the tasks' ``route`` and the jobs' ``tenant`` in 5)."""
    tables = {
        name: cols for name, cols in EXPECTED_TABLES.items() if _ADDED_IN_VERSION.get(name, 1) <= version
    }
    if version < 5:
        tables["tasks"] = tuple(name for name in tables["tasks"] if name != "route")
        if "jobs" in tables:
            tables["jobs"] = tuple(name for name in tables["jobs"] if name != "tenant")
    if version < 4:
        tables["tasks"] = tuple(name for name in tables["tasks"] if name != "tenant")
    return tables


T = TypeVar("T")

DEAD_SERVER_SETTINGS = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}
"""libpq settings of every connection the store opens (a DSN that sets one keeps its own): after 10 s
of silence the OS probes the server every 5 s and gives up after 3 unanswered probes (25 s in all), and
data the server has not acknowledged within 30 s fails the call. A slow query is not cut short: the
server's host answers the probes while it runs. Linux's default is to start probing after 2 hours."""


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as error:  # pragma: no cover - exercised only without the extra
        raise StoreError(
            "PostgresStore needs psycopg 3: pip install 'aiqsim[postgres]' (or psycopg[binary])"
        ) from error
    return psycopg


class PostgresStore:
    """:class:`~aiqsim.stores.base.TaskStore` in PostgreSQL, safe for many workers on many hosts.

    Every write commits before it returns (``deferred_commit`` is False): PostgreSQL already
    groups the WAL flushes of concurrent transactions (``commit_delay``), and a transaction held
    open across a scheduler's awaits would hold row locks other hosts wait on.

    Parameters:
        dsn: a libpq connection string or URL (``postgresql://user@host:5432/db``).
        schema: the PostgreSQL schema holding the store's tables (created if absent).
        notify: send a notification when a task becomes terminal (see module docs).
        connect_timeout_s: how long to wait for the server when connecting.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        notify: bool = True,
        connect_timeout_s: float = 10.0,
    ) -> None:
        if not isinstance(dsn, str) or not dsn:
            raise StoreError(f"PostgresStore needs a connection string, got {dsn!r}")
        if not isinstance(schema, str) or not _IDENTIFIER.match(schema):
            raise StoreError(
                f"schema must be a lower-case SQL identifier ([a-z_][a-z0-9_]*, at most 63 characters), "
                f"got {schema!r}"
            )
        psycopg = _psycopg()
        self.dsn = dsn
        self.schema = schema
        self.notify = notify
        self._closed = False
        self._errors = psycopg.Error
        self._connect_timeout = max(1, int(connect_timeout_s))
        self.reconnects = 0
        """Connections made again after one was lost (see the module docs); 0 on a steady link."""
        self.commits_confirmed = 0
        """Writes whose ``COMMIT`` answer was lost and which the server confirmed applied."""
        self._conn = self._connect()
        try:
            self._open_schema()
        except BaseException:
            self._conn.close()
            raise
        dialect = postgres_dialect(schema)
        self._tasks = RecordSql.build(TASK_TABLE, dialect)
        self._jobs = RecordSql.build(JOB_TABLE, dialect)
        self._task_claim = KeyClaim(self._tasks, self._decode, claim_owner)
        self._job_claim = KeyClaim(self._jobs, self._decode_job, claim_job_owner)

    def _where(self) -> str:
        """The DSN without its password, for messages (:func:`redacted_dsn`)."""
        return redacted_dsn(self.dsn)

    def _connect(self) -> Any:
        """A new autocommit connection to the server; :class:`StoreError` naming the DSN (without
        its password) when there is none to be had. TCP keepalives and a user timeout
        (:data:`DEAD_SERVER_SETTINGS`, unless the DSN sets its own) make a call fail when the server
        went silent (a host that lost power, a network cut that drops packets) instead of blocking
        the worker for hours: a blocked call holds the event loop, and with it the lease's beats."""
        psycopg = _psycopg()
        try:
            given = psycopg.conninfo.conninfo_to_dict(self.dsn)
            settings: dict[str, Any] = {
                name: value for name, value in DEAD_SERVER_SETTINGS.items() if name not in given
            }
            options = str(given.get("options") or "")
            if "idle_in_transaction_session_timeout" not in options:
                timeout = f"-c idle_in_transaction_session_timeout={STRANDED_TRANSACTION_TIMEOUT_MS}"
                settings["options"] = f"{options} {timeout}".strip()
            return psycopg.connect(
                self.dsn, autocommit=True, connect_timeout=self._connect_timeout, **settings
            )
        except psycopg.Error as error:
            detail = without_secrets(str(error), self.dsn)
            raise StoreError(f"cannot connect to PostgreSQL at {self._where()}: {detail}") from None

    def _connection(self) -> Any:
        """The store's connection, made again first if the last one was lost; raises
        :class:`StoreClosedError` after :meth:`close`, :class:`StoreError` while the server cannot
        be reached."""
        self._check_open()
        if self._lost(self._conn):
            self._replace_connection()
        return self._conn

    def _replace_connection(self) -> None:
        """Drop the lost connection and open a new one (the next call tries again if this fails)."""
        try:
            self._conn.close()
        except self._errors:  # pragma: no cover - closing a broken connection does not talk to the server
            pass
        self._conn = self._connect()
        self.reconnects += 1

    @staticmethod
    def _lost(conn: Any) -> bool:
        """Whether ``conn`` is gone (the server or the network dropped it, or it was closed)."""
        return bool(conn.broken or conn.closed)

    def _on_a_live_connection(self, step: Callable[[Any], T]) -> T:
        """``step(connection)``; if it failed because the connection was lost, once more on a new one.
        Only for steps that change nothing on the server when they fail (a ``BEGIN``, a read)."""
        conn = self._connection()
        try:
            return step(conn)
        except self._errors:
            if not self._lost(conn):
                raise
            return step(self._connection())

    # ------------------------------------------------------------------ schema
    def _open_schema(self) -> None:
        s = self.schema
        conn = self._conn
        try:
            with conn.transaction():
                # One opener at a time creates or upgrades the schema (a lock scoped to this transaction).
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"aiqsim-schema:{s}",))
                exists = conn.execute(
                    "SELECT 1 FROM information_schema.tables WHERE table_schema = %s AND table_name = 'meta'",
                    (s,),
                ).fetchone()
                if exists is None:
                    self._check_empty_schema()
                    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
                    conn.execute(
                        _SCHEMA_SQL.format(s=s)
                        + _LEASES_SQL.format(s=s)
                        + _JOBS_SQL.format(s=s)
                        + f"ALTER TABLE {s}.jobs ADD COLUMN tenant TEXT;"
                    )
                    conn.execute(
                        f"INSERT INTO {s}.meta (name, value) VALUES ('schema_version', %s)",
                        (str(SCHEMA_VERSION),),
                    )
                    return
                version = self._read_version()
                if version > SCHEMA_VERSION:
                    raise StoreCorruptError(
                        f"{self._where()} schema {s!r}: schema version {version} (written by a newer "
                        f"aiqsim); this build reads up to {SCHEMA_VERSION}; nothing was changed"
                    )
                self._check_tables(version)
                while version < SCHEMA_VERSION:
                    conn.execute(MIGRATIONS[version].format(s=s))
                    version += 1
                    conn.execute(
                        f"UPDATE {s}.meta SET value = %s WHERE name = 'schema_version'", (str(version),)
                    )
        except self._errors as error:
            detail = without_secrets(str(error), self.dsn)
            raise StoreError(f"{self._where()} schema {s!r}: cannot open the store: {detail}") from error

    def _check_empty_schema(self) -> None:
        """Refuse to build the store into a schema that already holds other tables of the same names."""
        clash = self._conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
            "AND table_name IN ('tasks', 'keys', 'poison')",
            (self.schema,),
        ).fetchall()
        if clash:
            raise StoreCorruptError(
                f"{self._where()} schema {self.schema!r} has tables {sorted(r[0] for r in clash)} but no "
                "aiqsim meta table: not an aiqsim store; choose another schema"
            )

    def _read_version(self) -> int:
        row = self._conn.execute(
            f"SELECT value FROM {self.schema}.meta WHERE name = 'schema_version'"
        ).fetchone()
        text = None if row is None else str(row[0])
        # ASCII digits only: str.isdigit() took '²', which int() then refused with a bare ValueError
        if text is None or re.fullmatch(r"[0-9]{1,9}", text) is None or int(text) < 1:
            raise StoreCorruptError(
                f"{self._where()} schema {self.schema!r}: no valid schema_version in meta "
                f"(got {text!r}; expected a whole number from 1 to {SCHEMA_VERSION}); nothing was changed"
            )
        return int(text)

    def _check_tables(self, version: int) -> None:
        for table, expected in expected_tables(version).items():
            found = tuple(
                row[0]
                for row in self._conn.execute(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
                    (self.schema, table),
                )
            )
            if found != expected:
                raise StoreCorruptError(
                    f"{self._where()} schema {self.schema!r}: table {table!r} has columns {found}, "
                    f"expected {expected} (schema version {version}); nothing was changed"
                )

    # ------------------------------------------------------------------ rows
    def _corrupt(self, problem: str) -> StoreCorruptError:
        return StoreCorruptError(f"{self._where()}: {problem}")

    def _decode(self, row: Sequence[Any]) -> TaskRecord:
        data = decode_row(TASK_TABLE, row, self._corrupt)
        return record_from_stored(data, f"{self._where()} schema {self.schema!r}")

    @staticmethod
    def _encode(task: TaskRecord) -> tuple[Any, ...]:
        return encode_row(TASK_TABLE, task.to_dict())

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"{self._where()}: store is closed")

    @contextmanager
    def _write(self, what: str) -> Iterator[Any]:
        """One transaction; any server or connection failure becomes a StoreWriteError (rolled back).

        A ``COMMIT`` whose answer was lost with the connection is not taken for a failure: the
        transaction's outcome is asked on a new connection (:meth:`_commit_outcome`), so a change
        the server applied is reported applied (a submission's claim of its key is not left to a
        task nothing runs) and one it did not apply raises :class:`StoreWriteError`. Only when the
        server cannot be asked does :class:`StoreWriteOutcomeUnknownError` say it is unknown."""
        try:
            transaction = self._begin()
        except StoreClosedError:
            raise
        except (StoreError, self._errors) as error:
            raise StoreWriteError(what, error) from error
        conn = transaction.conn
        try:
            yield conn
            if conn.info.transaction_status == _psycopg().pq.TransactionStatus.INERROR:
                # a statement failed and its error was handled inside the block: COMMIT would roll back
                raise StoreWriteError(what, StoreError("a statement of the transaction failed"))
        except BaseException as error:
            if self._lost(conn):
                self._end_stranded(transaction)
            else:
                self._roll_back(conn)
            if isinstance(error, self._errors):
                raise StoreWriteError(what, error) from error
            if isinstance(error, UnicodeEncodeError):
                raise unencodable_text(what, error) from None
            raise
        try:
            conn.execute("COMMIT")
        except self._errors as error:
            if not self._lost(conn):  # the server refused the COMMIT and rolled the transaction back
                raise StoreWriteError(what, error) from error
            try:
                committed = self._commit_outcome(transaction)
            except StoreError as unknown:
                raise StoreWriteOutcomeUnknownError(what, unknown) from error
            if not committed:
                raise StoreWriteError(what, error) from error
            self.commits_confirmed += 1

    def _begin(self) -> _OpenTransaction:
        """``BEGIN`` a transaction and learn its id (one round trip). A connection found lost at
        ``BEGIN`` is made again and the ``BEGIN`` sent once more: nothing of the write had reached
        the server, so beginning it again cannot apply anything twice."""

        def begin(conn: Any) -> _OpenTransaction:
            try:
                cursor = conn.execute(_BEGIN, prepare=False)  # one round trip, two results
                cursor.nextset()
                row = cursor.fetchone()
            except self._errors:
                if not self._lost(conn):
                    self._roll_back(conn)
                raise
            info = conn.info
            return _OpenTransaction(conn, int(row[0]), info.backend_pid, (info.host, info.port))

        return self._on_a_live_connection(begin)

    def _roll_back(self, conn: Any) -> None:
        """End the open transaction on ``conn`` without applying it (nothing to do if it is lost:
        the server rolls back a transaction whose connection went away)."""
        try:
            conn.execute("ROLLBACK")
        except self._errors:
            pass

    def _commit_outcome(self, transaction: _OpenTransaction) -> bool:
        """Whether the transaction whose ``COMMIT`` answer was lost was committed, asked on a new
        connection. While it is still open (its ``COMMIT`` never reached the server, whose process
        for the lost connection waits on it), that process is ended, which rolls it back, so the
        answer is final before it is given; StoreError when the server cannot say (or the new
        connection reached another server, whose transaction ids say nothing of this one)."""
        for _ in range(_OUTCOME_POLLS):
            rows = self._read("SELECT txid_status(%s)", (transaction.id,))
            if (self._conn.info.host, self._conn.info.port) != transaction.server:
                raise StoreError(f"{self._where()}: reconnected to another server than the write's")
            status = rows[0][0]
            if status == "committed":
                return True
            if status == "aborted":
                return False
            if status is None:
                raise StoreError(f"{self._where()}: transaction {transaction.id} is too old to look up")
            # in progress: end the lost connection's server process if it is idle inside this
            # transaction (one committing right now is left to finish), then ask again
            self._end_stranded(transaction)
            self._read("SELECT pg_sleep(%s)", (_OUTCOME_POLL_S,))
        raise StoreError(
            f"{self._where()}: transaction {transaction.id} still in progress after "
            f"{_OUTCOME_POLLS * _OUTCOME_POLL_S:g} s"
        )

    def _end_stranded(self, transaction: _OpenTransaction) -> None:
        """End the server process of a lost connection that still holds ``transaction`` open (as
        it does until the server notices the client is gone): its row locks would block the next
        write of the same key (a retry) until then. Asked on a new connection; best effort (the
        idle-in-transaction timeout every connection sets ends it anyway)."""
        try:
            self._read(_END_IDLE_TRANSACTION, (transaction.backend_pid, transaction.id))
        except StoreError:
            pass

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run a query; a connection found lost is made again and the query asked once more (a
        read changes nothing, so asking twice is harmless)."""
        try:
            return self._on_a_live_connection(lambda conn: conn.execute(sql, params).fetchall())
        except self._errors as error:
            raise StoreError(f"{self._where()}: read failed: {error}") from error

    # ------------------------------------------------------------------ TaskStore
    def insert_and_claim(self, task: TaskRecord) -> TaskRecord:
        values = self._encode(task)  # a non-JSON payload fails here, before the transaction
        with self._write(f"insert task {task.id!r}") as conn:
            if conn.execute(self._tasks.insert, values).rowcount != 1:
                raise DuplicateTaskIdError("task", task.id)
            return self._task_claim.claim(conn, task)

    def claim(self, task: TaskRecord) -> TaskRecord:
        with self._write(f"claim key of task {task.id!r}") as conn:
            return self._task_claim.claim_stored(conn, task)

    def update(self, task: TaskRecord) -> None:
        values = self._encode(task)
        with self._write(f"task {task.id!r} -> {task.status.value}") as conn:
            update_row(conn, self._tasks, task.id, values)
            if self.notify and task.status.is_terminal:
                conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, f"{self.schema}:{task.id}"))

    def get(self, task_id: str) -> TaskRecord | None:
        rows = self._read(self._tasks.by_id, (task_id,))
        return self._decode(rows[0]) if rows else None

    def owner_of(self, key: str) -> TaskRecord | None:
        rows = self._read(self._tasks.owner, (key,))
        return self._decode(rows[0]) if rows else None

    def list_by_status(self, *statuses: TaskStatus) -> list[TaskRecord]:
        sql, params = self._tasks.by_status([TaskStatus(status).value for status in statuses])
        return [self._decode(row) for row in self._read(sql, params)]

    def record_poison(self, key: str, error: str, now: float) -> None:
        with self._write(f"poison record of key {key!r}") as conn:
            conn.execute(
                f"INSERT INTO {self.schema}.poison (key, error, recorded_at) VALUES (%s, %s, %s) "
                "ON CONFLICT (key) DO UPDATE SET error = excluded.error, recorded_at = excluded.recorded_at",
                (key, error, float(now)),
            )

    def poison_error(self, key: str) -> str | None:
        rows = self._read(f"SELECT error FROM {self.schema}.poison WHERE key = %s", (key,))
        return rows[0][0] if rows else None

    # ------------------------------------------------------------------ JobStore
    def _decode_job(self, row: Sequence[Any]) -> JobRecord:
        data = decode_row(JOB_TABLE, row, self._corrupt)
        return job_from_stored(data, f"{self._where()} schema {self.schema!r}")

    @staticmethod
    def _encode_job(job: JobRecord) -> tuple[Any, ...]:
        return encode_row(JOB_TABLE, job.to_dict())

    def insert_and_claim_job(self, job: JobRecord) -> JobRecord:
        values = self._encode_job(job)  # non-JSON inputs fail here, before the transaction
        with self._write(f"insert job {job.id!r}") as conn:
            if conn.execute(self._jobs.insert, values).rowcount != 1:
                raise DuplicateTaskIdError("job", job.id)
            return self._job_claim.claim(conn, job)

    def claim_job(self, job: JobRecord) -> JobRecord:
        with self._write(f"claim key of job {job.id!r}") as conn:
            return self._job_claim.claim_stored(conn, job)

    def update_job(self, job: JobRecord) -> None:
        values = self._encode_job(job)
        with self._write(f"job {job.id!r} -> {job.status.value}") as conn:
            update_row(conn, self._jobs, job.id, values)

    def get_job(self, job_id: str) -> JobRecord | None:
        rows = self._read(self._jobs.by_id, (job_id,))
        return self._decode_job(rows[0]) if rows else None

    def job_owner_of(self, key: str) -> JobRecord | None:
        rows = self._read(self._jobs.owner, (key,))
        return self._decode_job(rows[0]) if rows else None

    def latest_job(self, name: str, version: str) -> JobRecord | None:
        """The job last stored under spec ``name`` and ``version``, if any
        (:func:`~aiqsim.stores.job_store.latest_job_of`)."""
        rows = self._read(self._jobs.latest_named(), (name, version))
        return self._decode_job(rows[0]) if rows else None

    def list_jobs(self, *statuses: JobStatus) -> list[JobRecord]:
        sql, params = self._jobs.by_status([JobStatus(status).value for status in statuses])
        return [self._decode_job(row) for row in self._read(sql, params)]

    deferred_commit = False

    def flush(self) -> int:
        """Nothing is ever staged here (see the class docs): returns 0."""
        self._check_open()
        return 0

    def purge(self, now: float, *, finished_older_than_s: float, keys_older_than_s: float) -> PurgeReport:
        """Delete finished tasks, finished jobs and expired keys by
        :func:`~aiqsim.stores.base.plan_purge`, in one transaction; candidates are read without
        their payloads.

        ``now`` is on the clock the tasks were stamped with (the scheduler's), as for every store.
        """
        check_purge_ttls(finished_older_than_s, keys_older_than_s)
        ttls = {
            "now": float(now),
            "finished_older_than_s": finished_older_than_s,
            "keys_older_than_s": keys_older_than_s,
        }
        what = "purge of finished tasks, finished jobs and expired keys"
        with self._write(what) as conn, conn.cursor() as cursor:
            plan = plan_table_purge(conn, self._tasks, executemany=cursor.executemany, **ttls)
            job_plan = plan_table_purge(conn, self._jobs, executemany=cursor.executemany, **ttls)
        return purge_report(plan, float(now), finished_older_than_s, keys_older_than_s, job_plan)

    # ------------------------------------------------------------------ across hosts
    def wait_for_terminal(self, task_ids: Sequence[str], timeout_s: float) -> set[str]:
        """Block up to ``timeout_s`` for a terminal notification about any of ``task_ids``.

        Returns the ids that were announced terminal (possibly empty on timeout). Uses a
        separate ``LISTEN`` connection, opened on first use; callers must still read the
        store afterwards, since a notification can arrive before they started listening.
        """
        wanted = {f"{self.schema}:{task_id}" for task_id in task_ids}
        listener = self._listening()
        try:
            found: set[str] = set()
            for note in listener.notifies(timeout=timeout_s, stop_after=None):
                if note.payload in wanted:
                    found.add(note.payload.split(":", 1)[1])
                    break
            return found
        except self._errors as error:
            raise StoreError(f"{self._where()}: waiting for notifications failed: {error}") from error

    def _listening(self) -> Any:
        """The ``LISTEN`` connection, opened on first use and again after it was lost (notifications
        sent while it was gone are not delivered: callers read the store after waking anyway)."""
        self._check_open()
        listener = getattr(self, "_listener", None)
        if listener is not None and self._lost(listener):
            listener.close()
            listener = self._listener = None
        if listener is None:
            listener = self._connect()
            try:
                listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
            except self._errors as error:
                listener.close()
                raise StoreError(f"{self._where()}: cannot listen for notifications: {error}") from error
            self._listener = listener
        return listener

    # ------------------------------------------------------------------ leases
    def renew_lease(self, worker: str, ttl_s: float) -> bool:
        """Extend ``worker``'s lease for ``ttl_s`` seconds of the server's clock (or take it, if it
        has none).

        Returns False when the lease was adopted by another worker, whether that adoption is under
        way or finished: this worker was presumed dead, its tasks now belong to someone else, and it
        must stop at once. A finished adoption is kept as a tombstone for this: when its row was
        deleted, a worker that woke after it took a fresh lease and ran its tasks a second time.
        """
        return self._hold_lease(worker, ttl_s, f"lease of worker {worker!r}", after_adoption=False)

    def acquire_lease(self, worker: str, ttl_s: float) -> bool:
        """Take ``worker``'s lease at a process's start (:meth:`renew_lease` for the beats after it).

        A new process of a worker id whose tasks were adopted and recovered (a finished adoption's
        tombstone) starts afresh with a new lease. False while an adoption of it is under way: its
        tasks are being taken over now, so it must not start under that id yet.
        """
        return self._hold_lease(
            worker, ttl_s, f"lease of worker {worker!r} at its start", after_adoption=True
        )

    def _hold_lease(self, worker: str, ttl_s: float, what: str, *, after_adoption: bool) -> bool:
        """Insert or extend ``worker``'s lease unless it is adopted; ``after_adoption``: also over a
        finished adoption's tombstone (which it clears). Whether the lease is held now."""
        leases = f"{self.schema}.leases"
        tombstone = f" OR {leases}.expires_at = '-Infinity'" if after_adoption else ""
        clear = ", adopted_by = NULL" if after_adoption else ""
        with self._write(what) as conn:
            row = conn.execute(
                f"INSERT INTO {leases} (worker, expires_at) VALUES (%s, {_SERVER_NOW} + %s) "
                f"ON CONFLICT (worker) DO UPDATE SET expires_at = excluded.expires_at{clear} "
                f"WHERE {leases}.adopted_by IS NULL{tombstone} RETURNING worker",
                (worker, float(ttl_s)),
            ).fetchone()
            return row is not None

    def release_lease(self, worker: str) -> None:
        """Give up ``worker``'s lease (a clean shutdown: nothing is left to adopt)."""
        with self._write(f"release lease of worker {worker!r}") as conn:
            conn.execute(
                f"DELETE FROM {self.schema}.leases WHERE worker = %s AND adopted_by IS NULL", (worker,)
            )

    def adopt_expired(self, adopter: str) -> list[str]:
        """The workers whose tasks ``adopter`` is to take over now (each adopted by one worker only).

        Workers whose lease expired; adoptions of ``adopter``'s own that are not finished (recovery
        left orphans undecided: they are taken up again); and adoptions under way by a worker that
        holds no lease any more (it died or was itself adopted mid-takeover: otherwise the dead
        worker's remaining tasks stayed stranded). The ``UPDATE`` is the atomic step: of several
        live workers looking at one such row, exactly one gets it back. The adopter then recovers
        the dead worker's tasks (:meth:`Scheduler.recover` with ``workers=[...]``) and
        :meth:`finish_adoption`.
        """
        s = self.schema
        with self._write(f"adoption by worker {adopter!r}") as conn:
            rows = conn.execute(
                f"UPDATE {s}.leases AS dead SET adopted_by = %s "
                f"WHERE dead.worker != %s AND dead.expires_at != '-Infinity' AND ("
                f"(dead.adopted_by IS NULL AND dead.expires_at < {_SERVER_NOW}) "
                f"OR dead.adopted_by = %s "
                f"OR (dead.adopted_by IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {s}.leases AS held "
                f"WHERE held.worker = dead.adopted_by AND held.adopted_by IS NULL))"
                f") RETURNING worker",
                (adopter, adopter, adopter),
            ).fetchall()
            return sorted(row[0] for row in rows)

    def finish_adoption(self, dead: str, adopter: str) -> None:
        """``adopter`` has recovered ``dead``'s tasks: its lease becomes a tombstone, which fences off
        a process of ``dead`` that wakes later (:meth:`renew_lease`) until a new one starts
        (:meth:`acquire_lease`)."""
        with self._write(f"end of adoption of {dead!r}") as conn:
            conn.execute(
                f"UPDATE {self.schema}.leases SET expires_at = '-Infinity' "
                "WHERE worker = %s AND adopted_by = %s",
                (dead, adopter),
            )

    def leases(self) -> dict[str, tuple[float, str | None]]:
        """Every lease held or under adoption: worker -> (seconds until it expires on the server's
        clock, adopter or None). A finished adoption's tombstone is no lease and is left out."""
        rows = self._read(
            f"SELECT worker, expires_at - {_SERVER_NOW}, adopted_by FROM {self.schema}.leases "
            "WHERE expires_at != '-Infinity'"
        )
        return {worker: (float(left), adopter) for worker, left, adopter in rows}

    def notification_fileno(self) -> int:
        """The socket of this store's ``LISTEN`` connection (opened on first use), to wait on with
        :meth:`AsyncioRuntime.wait_readable <aiqsim.runtime.AsyncioRuntime.wait_readable>`: it becomes
        readable when some worker, on any host, makes a task terminal."""
        return int(self._listening().fileno())

    def drain_notifications(self) -> set[str]:
        """Task ids announced terminal since the last drain (without blocking); clears the socket."""
        listener = getattr(self, "_listener", None)
        if listener is None:
            return set()
        prefix = f"{self.schema}:"
        try:
            return {
                note.payload[len(prefix) :]
                for note in listener.notifies(timeout=0)
                if note.payload.startswith(prefix)
            }
        except self._errors as error:
            raise StoreError(f"{self._where()}: reading notifications failed: {error}") from error

    def drop(self) -> None:
        """Delete the store's schema and every record in it (for tests and teardown)."""
        with self._write(f"drop schema {self.schema!r}") as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")

    def close(self, *, flush: bool = True) -> None:
        """Close the connections (idempotent); every write is already durable (nothing is staged)."""
        if not self._closed:
            self._closed = True
            self._conn.close()  # (a lost one closes without talking to the server)
            listener = getattr(self, "_listener", None)
            if listener is not None:
                listener.close()

    def __len__(self) -> int:
        return int(self._read(f"SELECT count(*) FROM {self.schema}.tasks")[0][0])

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<PostgresStore {self._where()} schema={self.schema}{' closed' if self._closed else ''}>"
