"""The statement shapes both SQL stores share (aiqsim.stores.sql_records).

The stores' behaviour is tested in test_stores*.py / test_postgres_store.py against a real SQLite
file and a real PostgreSQL; here, the claim that the two dialects differ *only* by placeholders,
the schema prefix and the locking/conflict clauses, so that a statement changed for one store
cannot silently keep its old shape in the other.
"""

from __future__ import annotations

import dataclasses
import sqlite3

import pytest

from aiqsim.stores.base import StoreCorruptError
from aiqsim.stores.sql_records import (
    JOB_TABLE,
    SQLITE,
    TASK_TABLE,
    RecordSql,
    RecordTable,
    decode_row,
    encode_row,
    postgres_dialect,
)

STATEMENTS = [f.name for f in dataclasses.fields(RecordSql) if f.name not in ("table", "dialect", "lock_key")]


def _as_sqlite(statement: str, schema: str) -> str:
    """A PostgreSQL statement with its dialect's parts taken out (what SQLite should run)."""
    dialect = postgres_dialect(schema)
    return (
        statement.replace(dialect.insert_suffix, "")
        .replace(dialect.lock_suffix, "")
        .replace(dialect.prefix, "")
        .replace(dialect.placeholder, SQLITE.placeholder)
    )


@pytest.mark.parametrize("table", [TASK_TABLE, JOB_TABLE], ids=lambda t: t.kind)
def test_the_dialects_differ_only_by_placeholders_prefix_and_clauses(table: RecordTable) -> None:
    sqlite_sql = RecordSql.build(table, SQLITE)
    postgres_sql = RecordSql.build(table, postgres_dialect("tenant_7"))
    for name in STATEMENTS:
        assert _as_sqlite(getattr(postgres_sql, name), "tenant_7") == getattr(sqlite_sql, name), name
    assert sqlite_sql.lock_key is None  # BEGIN IMMEDIATE already holds the database
    assert postgres_sql.lock_key == postgres_sql.key_owner + " FOR UPDATE"
    assert postgres_sql.insert.endswith(" ON CONFLICT (id) DO NOTHING")


@pytest.mark.parametrize("table", [TASK_TABLE, JOB_TABLE], ids=lambda t: t.kind)
def test_every_sqlite_statement_prepares_against_the_real_schema(table: RecordTable) -> None:
    from aiqsim.stores.sqlite import SCHEMA

    conn = sqlite3.connect(":memory:")
    conn.executescript(SCHEMA)
    sql = RecordSql.build(table, SQLITE)
    for name in STATEMENTS:
        statement = getattr(sql, name)
        conn.execute(f"EXPLAIN {statement}", ("x",) * statement.count("?"))  # raises on any mismatch
    for values in ([], ["queued"], ["queued", "running", "failed"]):
        statement, params = sql.by_status(values)
        assert statement.count("?") == len(params) == len(values)
        assert conn.execute(statement, params).fetchall() == []


def test_postgres_passes_a_status_list_as_one_array() -> None:
    sql = RecordSql.build(TASK_TABLE, postgres_dialect("aiqsim"))
    statement, params = sql.by_status(["queued", "running"])
    assert params == (["queued", "running"],) and "= ANY(%s)" in statement
    assert sql.by_status([]) == (f"{sql.select} ORDER BY t.seq", ())


def test_a_row_round_trips_and_a_bad_json_column_is_named() -> None:
    data = {name: f"v-{name}" for name in TASK_TABLE.columns}
    data.update(payload={"input": "é"}, result=None)
    row = encode_row(TASK_TABLE, data)
    assert row[TASK_TABLE.columns.index("payload")] == '{"input":"é"}'  # compact, not ASCII-escaped
    assert decode_row(TASK_TABLE, row, StoreCorruptError) == data
    broken = list(row)
    broken[TASK_TABLE.columns.index("result")] = "{not json"
    with pytest.raises(StoreCorruptError, match=r"task 'v-id': column 'result' is not JSON"):
        decode_row(TASK_TABLE, broken, StoreCorruptError)


@pytest.mark.parametrize("table", [TASK_TABLE, JOB_TABLE], ids=lambda t: t.kind)
def test_a_json_column_nested_too_deeply_is_the_stores_corruption_error(table: RecordTable) -> None:
    """Valid JSON to SQLite and PostgreSQL, but json.loads raised RecursionError (both stores share this)."""
    row = dict.fromkeys(table.columns, "null") | {"id": "deep-id"}
    name = min(table.json_columns)
    row[name] = "[" * 100_000 + "]" * 100_000
    with pytest.raises(
        StoreCorruptError, match=rf"{table.kind} 'deep-id': column '{name}' .*nested too deeply"
    ):
        decode_row(table, list(row.values()), StoreCorruptError)
