"""The statements and row mapping the SQL stores share, and the key claim they both run.

:class:`~aiqsim.stores.sqlite.SqliteStore` and :class:`~aiqsim.stores.postgres.PostgresStore` keep
tasks and jobs in tables of one shape (:mod:`aiqsim.stores.columns`): a record table (``seq``
then the record's columns, some JSON-encoded) and a key table (idempotency key -> owning id).
Every statement on them has one shape; the dialects differ only in what :class:`SqlDialect`
holds: the placeholder, the schema prefix, how an insert of an existing id is detected, whether
the owner's key row is locked before it is read, and how a list of statuses is passed.

:class:`KeyClaim` is the claim itself, run inside the store's own write transaction: the first
writer of a key owns it; a later one replaces the owner only where
:func:`~aiqsim.stores.base.claim_owner` (or its job twin) says so. The stores keep the
transaction, the error mapping and the decoding into records; nothing here opens a connection.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from aiqsim.core.task import TaskStatus
from aiqsim.stores.base import PurgeCandidate, PurgePlan, plan_purge, store_json
from aiqsim.stores.columns import COLUMNS, JOB_COLUMNS, JOB_JSON_COLUMNS, JSON_COLUMNS


class _Keyed(Protocol):
    """A record with an id and an idempotency key (a task or a job)."""

    @property
    def id(self) -> str: ...
    @property
    def key(self) -> str: ...


R = TypeVar("R", bound=_Keyed)

__all__ = [
    "JOB_TABLE",
    "POSTGRES_PLACEHOLDER",
    "SQLITE",
    "TASK_TABLE",
    "KeyClaim",
    "RecordSql",
    "RecordTable",
    "SqlDialect",
    "decode_row",
    "encode_row",
    "json_text",
    "plan_table_purge",
    "postgres_dialect",
    "select_sql",
    "update_row",
]


@dataclass(frozen=True, slots=True)
class RecordTable:
    """One kind of record as the SQL stores lay it out: its table, its key table, its columns.

    ``kind`` names a record in messages (``"task"``, ``"job"``); ``alias`` is the record table's
    alias in every ``SELECT`` (``t``, ``j``), which the key table joins as ``k``.
    """

    kind: str
    table: str
    keys: str
    alias: str
    columns: tuple[str, ...]
    json_columns: frozenset[str]


TASK_TABLE = RecordTable("task", "tasks", "keys", "t", COLUMNS, JSON_COLUMNS)
JOB_TABLE = RecordTable("job", "jobs", "job_keys", "j", JOB_COLUMNS, JOB_JSON_COLUMNS)

POSTGRES_PLACEHOLDER = "%s"


@dataclass(frozen=True, slots=True)
class SqlDialect:
    """What one SQL store's statements differ by.

    ``placeholder``: a parameter marker (``?`` for sqlite3, ``%s`` for psycopg). ``prefix``: put
    before every table name (a PostgreSQL schema and a dot; empty for SQLite). ``insert_suffix``:
    appended to a record insert (PostgreSQL: ``ON CONFLICT (id) DO NOTHING``, a zero row count
    then means the id exists; SQLite raises an integrity error instead). ``lock_suffix``: appended
    to a select of the key row that locks it before its owner is read (PostgreSQL: ``FOR UPDATE``;
    SQLite's ``BEGIN IMMEDIATE`` already holds the whole database). ``status_any``: a list of
    statuses is one array parameter (``= ANY(%s)``) rather than one marker each (``IN (?, ?)``).
    """

    placeholder: str
    prefix: str = ""
    insert_suffix: str = ""
    lock_suffix: str = ""
    status_any: bool = False


SQLITE = SqlDialect("?")


def postgres_dialect(schema: str) -> SqlDialect:
    """The PostgreSQL dialect for tables in ``schema`` (a validated SQL identifier)."""
    return SqlDialect(
        POSTGRES_PLACEHOLDER,
        prefix=f"{schema}.",
        insert_suffix=" ON CONFLICT (id) DO NOTHING",
        lock_suffix=" FOR UPDATE",
        status_any=True,
    )


@dataclass(frozen=True, slots=True)
class RecordSql:
    """Every statement on one kind of record in one dialect, built once by :meth:`build`.

    ``select`` reads every record column (``FROM <table> <alias>``); ``by_id`` and ``owner`` read
    one record by id and by key (through the key table); ``insert`` and ``update`` write one
    (``update`` takes the columns after ``id``, then the id); ``key_owner`` reads a key's owner id,
    ``lock_key`` the same row locked (``None`` where the dialect needs no lock); ``take_key``
    inserts a key row unless one exists; ``set_owner`` moves a key to a new owner.
    """

    table: RecordTable
    dialect: SqlDialect
    select: str
    by_id: str
    owner: str
    insert: str
    update: str
    key_owner: str
    lock_key: str | None
    take_key: str
    set_owner: str
    delete_key: str
    delete_record: str

    @classmethod
    def build(cls, table: RecordTable, dialect: SqlDialect) -> RecordSql:
        """The statements for ``table`` in ``dialect`` (strings built once, per store or module)."""
        p, a, ph = dialect.prefix, table.alias, dialect.placeholder
        cols = table.columns
        select = select_sql(table, dialect)
        key_owner = f"SELECT owner_id FROM {p}{table.keys} WHERE key = {ph}"
        assignments = ", ".join(f"{name} = {ph}" for name in cols[1:])
        return cls(
            table=table,
            dialect=dialect,
            select=select,
            by_id=f"{select} WHERE {a}.id = {ph}",
            owner=f"{select} JOIN {p}{table.keys} k ON k.owner_id = {a}.id WHERE k.key = {ph}",
            insert=(
                f"INSERT INTO {p}{table.table} ({', '.join(cols)}) VALUES ({', '.join([ph] * len(cols))})"
                f"{dialect.insert_suffix}"
            ),
            update=f"UPDATE {p}{table.table} SET {assignments} WHERE id = {ph}",
            key_owner=key_owner,
            lock_key=key_owner + dialect.lock_suffix if dialect.lock_suffix else None,
            take_key=(
                f"INSERT INTO {p}{table.keys} (key, owner_id) VALUES ({ph}, {ph}) "
                "ON CONFLICT (key) DO NOTHING"
            ),
            set_owner=f"UPDATE {p}{table.keys} SET owner_id = {ph} WHERE key = {ph}",
            delete_key=f"DELETE FROM {p}{table.keys} WHERE key = {ph} AND owner_id = {ph}",
            delete_record=f"DELETE FROM {p}{table.table} WHERE id = {ph}",
        )

    def by_status(self, values: Sequence[str]) -> tuple[str, tuple[Any, ...]]:
        """``(sql, params)`` listing the records in ``values`` (every record if empty), in ``seq`` order."""
        a, ph = self.table.alias, self.dialect.placeholder
        if not values:
            return f"{self.select} ORDER BY {a}.seq", ()
        if self.dialect.status_any:
            return f"{self.select} WHERE {a}.status = ANY({ph}) ORDER BY {a}.seq", (list(values),)
        markers = ", ".join([ph] * len(values))
        return f"{self.select} WHERE {a}.status IN ({markers}) ORDER BY {a}.seq", tuple(values)

    def latest_named(self) -> str:
        """The last record stored with a given ``name`` and ``version`` (jobs: a spec's), newest first."""
        a, ph = self.table.alias, self.dialect.placeholder
        return f"{self.select} WHERE {a}.name = {ph} AND {a}.version = {ph} ORDER BY {a}.seq DESC LIMIT 1"

    def purge_candidates(self, cutoff: float) -> tuple[str, tuple[Any, ...]]:
        """``(sql, params)`` reading the retention candidates: ``(id, key, status, finished, owns_key)``
        of every terminal record finished at or before ``cutoff``, without payloads or results."""
        p, a, ph = self.dialect.prefix, self.table.alias, self.dialect.placeholder
        terminal = [status.value for status in TaskStatus if status.is_terminal]
        finished = f"coalesce({a}.finished_at, {a}.updated_at)"
        if self.dialect.status_any:
            status_sql, params = f"= ANY({ph})", (terminal,)
        else:
            status_sql, params = f"IN ({', '.join([ph] * len(terminal))})", tuple(terminal)
        return (
            f"SELECT {a}.id, {a}.key, {a}.status, {finished}, k.owner_id IS NOT NULL "
            f"FROM {p}{self.table.table} {a} LEFT JOIN {p}{self.table.keys} k "
            f"ON k.key = {a}.key AND k.owner_id = {a}.id "
            f"WHERE {a}.status {status_sql} AND {finished} <= {ph}",
            (*params, cutoff),
        )


def select_sql(table: RecordTable, dialect: SqlDialect, absent: Collection[str] = ()) -> str:
    """``SELECT`` of every record column of ``table``, ``NULL`` for the ``absent`` ones."""
    parts = ("NULL" if name in absent else f"{table.alias}.{name}" for name in table.columns)
    return f"SELECT {', '.join(parts)} FROM {dialect.prefix}{table.table} {table.alias}"


# ---------------------------------------------------------------------------- rows
def json_text(value: Any, what: str = "a value") -> str:
    """The compact JSON text the SQL stores keep (:func:`~aiqsim.stores.base.store_json`)."""
    return store_json(value, what)


def encode_row(table: RecordTable, data: Mapping[str, Any]) -> tuple[Any, ...]:
    """A record's ``to_dict()`` as the row values of ``table`` (JSON columns as text), in order.
    A JSON column whose value JSON cannot hold raises :class:`~aiqsim.stores.base.UnstorableValueError`
    naming the record and the column."""
    return tuple(
        json_text(data[name], f"{table.kind} {data.get('id')!r} {name}")
        if name in table.json_columns
        else data[name]
        for name in table.columns
    )


def decode_row(table: RecordTable, row: Sequence[Any], corrupt: Callable[[str], Exception]) -> dict[str, Any]:
    """A row of ``table`` as the mapping its record is rebuilt from (JSON columns parsed).

    A JSON column that does not parse (or is nested too deeply for :func:`json.loads`) raises
    ``corrupt(problem)``, the store's own corruption error naming the record and the column.
    """
    data = dict(zip(table.columns, row, strict=True))
    for name in table.json_columns:
        try:
            data[name] = json.loads(data[name])
        except (TypeError, ValueError) as error:
            raise corrupt(f"{table.kind} {data['id']!r}: column {name!r} is not JSON ({error})") from error
        except RecursionError as error:  # valid JSON to the database, but json.loads recurses per level
            raise corrupt(
                f"{table.kind} {data['id']!r}: column {name!r} holds JSON nested too deeply to read"
            ) from error
    return data


# ---------------------------------------------------------------------------- the claim
@dataclass(frozen=True, slots=True)
class KeyClaim(Generic[R]):
    """The claim of one kind of record's key, run inside the store's own write transaction.

    The first writer of a key owns it. When the key is taken, its row is locked where the dialect
    needs it, the owner read (``decode`` turns its row into a record), and replaced by the
    claiming record only if ``choose_owner(owner, record)`` returns that record (a failed or
    cancelled owner: :func:`~aiqsim.stores.base.claim_owner`, or its job twin). ``conn`` is a
    DB-API connection whose ``execute`` returns a cursor (sqlite3 and psycopg 3 both do).
    """

    sql: RecordSql
    decode: Callable[[Sequence[Any]], R]
    choose_owner: Callable[[R | None, R], R]

    def claim(self, conn: Any, record: R) -> R:
        """Claim ``record``'s key (its row was just inserted); return the key's owner."""
        sql, key, record_id = self.sql, record.key, record.id
        if conn.execute(sql.take_key, (key, record_id)).rowcount == 1:
            return record
        if sql.lock_key is not None:
            conn.execute(sql.lock_key, (key,))
        row = conn.execute(sql.owner, (key,)).fetchone()
        owner = self.choose_owner(self.decode(row) if row is not None else None, record)
        if owner is record:
            conn.execute(sql.set_owner, (record_id, key))
        return owner

    def claim_stored(self, conn: Any, record: R) -> R:
        """Claim the key of a record already stored (``KeyError`` if its id is not): the stored
        record if it owns the key already, else :meth:`claim`'s answer."""
        row = conn.execute(self.sql.by_id, (record.id,)).fetchone()
        if row is None:
            raise KeyError(f"unknown {self.sql.table.kind} id {record.id!r}")
        owner_row = conn.execute(self.sql.key_owner, (record.key,)).fetchone()
        if owner_row is not None and owner_row[0] == record.id:
            return self.decode(row)
        return self.claim(conn, record)


def plan_table_purge(
    conn: Any,
    sql: RecordSql,
    *,
    now: float,
    finished_older_than_s: float,
    keys_older_than_s: float,
    executemany: Callable[[str, Sequence[Sequence[Any]]], Any],
) -> PurgePlan:
    """Plan and apply the retention rule (:func:`~aiqsim.stores.base.plan_purge`) to one table
    (tasks or jobs), inside the store's open write transaction; return the plan it applied.

    Only records finished before the earlier of the two cutoffs are read, without payloads.
    ``executemany`` is the connection's or a cursor's (sqlite3 and psycopg differ there).
    """
    cutoff = now - min(finished_older_than_s, keys_older_than_s)
    select, params = sql.purge_candidates(cutoff)
    rows = conn.execute(select, params).fetchall()
    plan = plan_purge(
        (PurgeCandidate(i, k, TaskStatus(st), float(f), bool(o)) for i, k, st, f, o in rows),
        now=now,
        finished_older_than_s=finished_older_than_s,
        keys_older_than_s=keys_older_than_s,
    )
    if plan.keys:
        executemany(sql.delete_key, plan.keys)
    if plan.task_ids:
        executemany(sql.delete_record, [(record_id,) for record_id in plan.task_ids])
    return plan


def update_row(conn: Any, sql: RecordSql, record_id: str, values: Sequence[Any]) -> Any:
    """Write a record's row ``values`` (from :func:`encode_row`) over its stored row; ``KeyError``
    if no row has ``record_id``. Returns the cursor."""
    changed = conn.execute(sql.update, (*values[1:], record_id))
    if changed.rowcount != 1:
        raise KeyError(f"unknown {sql.table.kind} id {record_id!r}")
    return changed
