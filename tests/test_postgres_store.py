"""PostgresStore against a real PostgreSQL server: races between processes, schema versions.

The TaskStore contract itself runs on PostgreSQL in tests/test_stores.py (``postgres`` is one of
its store kinds); this module covers what only a server shared by processes shows.
"""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aiqsim.core.task import TaskRecord, TaskStatus
from aiqsim.stores.base import StoreCorruptError, StoreError, StoreWriteError
from tests.helpers_store_worker import connect_ledger

WORKER = Path(__file__).with_name("helpers_store_worker.py")


@pytest.fixture
def schema(postgres_dsn: str, tmp_path: Path) -> Iterator[str]:
    import psycopg

    name = f"t_{random.Random(str(tmp_path)).getrandbits(48):012x}"
    yield name
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:  # whatever state the test left it in
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


def _race(
    dsn: str, schema: str, tmp_path: Path, *, processes: int, keys: int, repeat: int, poll: float = 0.02
) -> list:
    ledger_path, go = tmp_path / "ledger.sqlite", tmp_path / "go"
    connect_ledger(ledger_path).close()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                "race",
                "--kind",
                "postgres",
                "--store",
                dsn,
                "--schema",
                schema,
                "--ledger",
                str(ledger_path),
                "--name",
                f"p{n}",
                "--keys",
                str(keys),
                "--repeat",
                str(repeat),
                "--seed",
                str(n),
                "--go",
                str(go),
                "--poll",
                str(poll),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(processes)
    ]
    try:
        for proc in procs:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line.strip() == "ready", proc.communicate(timeout=60)[1]
        go.touch()
        for proc in procs:
            _, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, err
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    conn = sqlite3.connect(ledger_path)
    executions = conn.execute("SELECT key, task_id, pid FROM executions").fetchall()
    conn.close()
    return executions


def test_four_processes_1000_identical_submissions_execute_once(
    postgres_dsn: str, schema: str, tmp_path: Path
) -> None:
    """4 processes x 250 submissions of one input against one PostgreSQL store: 1 provider call.

    The duplicates of the three processes that lost the claim wait for the winner's run on another
    process. Their polling period is set to 10 minutes, longer than this test's timeout, so they
    finish only because the winner's commit is announced (LISTEN/NOTIFY), not by polling.
    """
    import time

    from aiqsim.stores.postgres import PostgresStore

    started = time.monotonic()
    executions = _race(postgres_dsn, schema, tmp_path, processes=4, keys=1, repeat=250, poll=600.0)
    print(f"4 x 250 identical submissions settled in {time.monotonic() - started:.1f} s (no polling)")
    assert len(executions) == 1, executions
    with PostgresStore(postgres_dsn, schema=schema) as store:
        records = store.list_by_status()
    assert len(records) == 1000
    counts = Counter(record.status for record in records)
    assert counts == {TaskStatus.SUCCEEDED: 1, TaskStatus.DEDUPED: 999}, counts
    owner = next(r for r in records if r.status is TaskStatus.SUCCEEDED)
    assert owner.id == executions[0][1]
    assert all(r.deduped_from == owner.id and r.result == owner.result for r in records if r is not owner)
    print(f"1000 submissions from 4 processes: {len(executions)} execution, by {owner.id.split('-')[0]}")


def test_four_processes_racing_on_30_keys_run_each_once(
    postgres_dsn: str, schema: str, tmp_path: Path
) -> None:
    executions = _race(postgres_dsn, schema, tmp_path, processes=4, keys=30, repeat=1)
    per_key = Counter(key for key, _, _ in executions)
    assert set(per_key) == {f"key{n:02d}" for n in range(30)}
    assert max(per_key.values()) == 1


def test_a_newer_schema_version_is_refused_and_left_alone(postgres_dsn: str, schema: str) -> None:
    from aiqsim.stores.postgres import PostgresStore

    with PostgresStore(postgres_dsn, schema=schema) as store:
        store.insert_and_claim(TaskRecord(id="a", key="k", kind="llm", provider="llm"))
        store._conn.execute(f"UPDATE {schema}.meta SET value = '99' WHERE name = 'schema_version'")
    with pytest.raises(StoreCorruptError, match="schema version 99"):
        PostgresStore(postgres_dsn, schema=schema)
    import psycopg

    with psycopg.connect(postgres_dsn) as conn:
        assert conn.execute(f"SELECT value FROM {schema}.meta").fetchone() == ("99",)
        assert conn.execute(f"SELECT count(*) FROM {schema}.tasks").fetchone() == (1,)


def test_a_schema_holding_other_tables_is_refused(postgres_dsn: str, schema: str) -> None:
    import psycopg

    from aiqsim.stores.postgres import PostgresStore

    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.tasks (x int)")
    with pytest.raises(StoreCorruptError, match="not an aiqsim store"):
        PostgresStore(postgres_dsn, schema=schema)


def test_bad_arguments_and_an_unreachable_server_are_clear_errors() -> None:
    from aiqsim.stores.postgres import PostgresStore

    with pytest.raises(StoreError, match="schema must be"):
        PostgresStore("postgresql://x@127.0.0.1:1/db", schema="Robert'); DROP TABLE")
    with pytest.raises(
        StoreError, match=r"cannot connect to PostgreSQL at postgresql://u:\*\*\*@127\.0\.0\.1:1"
    ):
        PostgresStore("postgresql://u:secret@127.0.0.1:1/db", connect_timeout_s=1)


def _terminate_backend(dsn: str, pid: int) -> None:
    """End one server process as an administrator (or a server restart) would: its client's
    connection is lost, and it finds out at its next statement."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)


def test_a_connection_the_server_dropped_is_made_again_by_the_next_call(
    postgres_dsn: str, schema: str
) -> None:
    from aiqsim.stores.postgres import PostgresStore

    with PostgresStore(postgres_dsn, schema=schema) as store:
        store.insert_and_claim(TaskRecord(id="a", key="k", kind="llm", provider="llm"))
        _terminate_backend(postgres_dsn, store._conn.info.backend_pid)
        # the write finds the connection gone at BEGIN, before any of it reached the server
        assert store.insert_and_claim(TaskRecord(id="b", key="k2", kind="llm", provider="llm")).id == "b"
        assert store.reconnects == 1
        _terminate_backend(postgres_dsn, store._conn.info.backend_pid)
        assert store.get("a") is not None  # a read asks again on a new connection
        assert store.reconnects == 2
        assert sorted(r.id for r in store.list_by_status()) == ["a", "b"]
    with PostgresStore(postgres_dsn, schema=schema) as again:
        assert sorted(r.id for r in again.list_by_status()) == ["a", "b"]


def test_while_the_server_is_unreachable_calls_fail_and_the_first_after_it_is_back_works(
    postgres_dsn: str, schema: str
) -> None:
    from urllib.parse import urlsplit, urlunsplit

    from aiqsim.stores.postgres import PostgresStore
    from tests.tcp_link import TcpLink

    parts = urlsplit(postgres_dsn)
    assert parts.hostname is not None and parts.port is not None, postgres_dsn
    with TcpLink((parts.hostname, parts.port)) as link:
        user = f"{parts.username}@" if parts.username else ""
        via_link = urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{link.port}"))
        with PostgresStore(via_link, schema=schema, connect_timeout_s=2) as store:
            store.insert_and_claim(TaskRecord(id="a", key="k", kind="llm", provider="llm"))
            link.cut()
            with pytest.raises(StoreWriteError, match=r"not persisted: insert task 'b'.*cannot connect"):
                store.insert_and_claim(TaskRecord(id="b", key="k2", kind="llm", provider="llm"))
            with pytest.raises(StoreError, match=f"cannot connect to PostgreSQL at .*:{link.port}"):
                store.get("a")
            link.restore()
            store.insert_and_claim(TaskRecord(id="c", key="k3", kind="llm", provider="llm"))
            assert sorted(r.id for r in store.list_by_status()) == ["a", "c"]
            assert store.reconnects == 1
    with PostgresStore(postgres_dsn, schema=schema) as again:  # b was never written
        assert sorted(r.id for r in again.list_by_status()) == ["a", "c"]


def test_a_write_that_loses_its_connection_mid_transaction_is_not_applied(
    postgres_dsn: str, schema: str
) -> None:
    from aiqsim.core.states import transition
    from aiqsim.stores.postgres import PostgresStore

    with PostgresStore(postgres_dsn, schema=schema) as store:
        record = TaskRecord(id="a", key="k", kind="llm", provider="llm")
        store.insert_and_claim(record)
        # the connection dies inside the transaction, before its COMMIT
        with (
            pytest.raises(StoreWriteError, match="not persisted: task 'a' -> running"),
            store._write("task 'a' -> running") as conn,
        ):
            conn.execute(f"UPDATE {schema}.tasks SET status = 'running' WHERE id = 'a'")
            _terminate_backend(postgres_dsn, conn.info.backend_pid)
            conn.execute("SELECT 1")
        assert store.get("a").status is TaskStatus.QUEUED  # rolled back by the server; the store goes on
        store.update(transition(record, TaskStatus.RUNNING, 1.0))
        assert store.get("a").status is TaskStatus.RUNNING


@pytest.fixture
def waiter_and_writer(postgres_dsn: str, schema: str) -> Iterator[tuple[Any, Any, TaskRecord]]:
    """Two stores on one schema, one to listen for announcements and one to write, and a task
    ``"a"`` inserted (queued) by the writer."""
    from aiqsim.stores.postgres import PostgresStore

    with (
        PostgresStore(postgres_dsn, schema=schema) as waiter,
        PostgresStore(postgres_dsn, schema=schema) as writer,
    ):
        record = TaskRecord(id="a", key="k", kind="llm", provider="llm")
        writer.insert_and_claim(record)
        yield waiter, writer, record


def _succeed(writer: Any, record: TaskRecord) -> None:
    """Take ``record`` through running to succeeded in ``writer``'s store (the second write notifies)."""
    from aiqsim.core.states import transition

    running = transition(record, TaskStatus.RUNNING, 1.0)
    writer.update(running)
    writer.update(transition(running, TaskStatus.SUCCEEDED, 2.0, result={"ok": json.dumps(1)}))


def test_terminal_transitions_are_announced(waiter_and_writer: tuple[Any, Any, TaskRecord]) -> None:
    waiter, writer, record = waiter_and_writer
    assert waiter.wait_for_terminal(["a"], timeout_s=0.05) == set()  # starts listening, nothing yet
    _succeed(writer, record)
    assert waiter.wait_for_terminal(["a"], timeout_s=10) == {"a"}


def test_the_listen_connection_is_made_again_after_it_was_lost(
    postgres_dsn: str, waiter_and_writer: tuple[Any, Any, TaskRecord]
) -> None:
    waiter, writer, record = waiter_and_writer
    waiter.notification_fileno()  # starts listening
    lost = waiter._listener.info.backend_pid
    _terminate_backend(postgres_dsn, lost)
    with pytest.raises(StoreError, match="notifications failed"):
        waiter.wait_for_terminal(["a"], timeout_s=5)  # finds out that it was lost
    assert waiter.wait_for_terminal(["a"], timeout_s=0.05) == set()  # listening again
    assert waiter._listener.info.backend_pid != lost
    _succeed(writer, record)
    assert waiter.wait_for_terminal(["a"], timeout_s=10) == {"a"}


@pytest.mark.parametrize("written", ["0", "\u00b2", "-1", " 3", ""])
def test_a_schema_version_that_is_no_whole_number_from_1_is_refused_and_left_alone(
    postgres_dsn: str, schema: str, written: str
) -> None:
    """'0' raised a bare KeyError (no migration from version 0) and '\u00b2' passed str.isdigit(), then
    int() raised a bare ValueError: neither said the store was foreign."""
    from aiqsim.stores.postgres import PostgresStore

    with PostgresStore(postgres_dsn, schema=schema) as store:
        store._conn.execute(f"UPDATE {schema}.meta SET value = %s WHERE name = 'schema_version'", (written,))
    with pytest.raises(StoreCorruptError, match="no valid schema_version in meta"):
        PostgresStore(postgres_dsn, schema=schema)
    import psycopg

    with psycopg.connect(postgres_dsn) as conn:
        assert conn.execute(f"SELECT value FROM {schema}.meta").fetchone() == (written,)


@pytest.mark.parametrize(
    ("dsn", "secret"),
    [
        ("host=127.0.0.1 port=1 user=postgres password=S3cretPassw0rd dbname=aiqsim", "S3cretPassw0rd"),
        ("postgresql://postgres:S3cr@tPassw0rd@127.0.0.1:1/aiqsim", "tPassw0rd"),
        ("postgresql://postgres@127.0.0.1:1/aiqsim?password=S3cret&sslmode=disable", "S3cret"),
    ],
    ids=["key-value", "url-with-at-sign", "url-query"],
)
def test_a_store_that_cannot_connect_names_the_dsn_without_its_password(dsn: str, secret: str) -> None:
    """Only a URL's user:password@ was hidden: a key=value DSN's password, a password holding an '@'
    and one in the query string were printed in the error (and its repr)."""
    from aiqsim.stores.postgres import PostgresStore

    with pytest.raises(StoreError) as raised:
        PostgresStore(dsn, connect_timeout_s=2)
    assert secret not in str(raised.value) and secret not in repr(raised.value)
    assert "127.0.0.1" in str(raised.value) and "***" in str(raised.value)


def test_a_version_1_store_is_upgraded_keeping_its_records(postgres_dsn: str, schema: str) -> None:
    import psycopg

    from aiqsim.stores.postgres import SCHEMA_VERSION, PostgresStore

    with PostgresStore(postgres_dsn, schema=schema) as store:
        store.insert_and_claim(TaskRecord(id="a", key="k", kind="llm", provider="llm", payload={"x": 1}))
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:  # what version 1 left behind
        conn.execute(f"DROP TABLE {schema}.leases")
        conn.execute(f"DROP TABLE {schema}.jobs, {schema}.job_keys")  # version 3's
        conn.execute(f"ALTER TABLE {schema}.tasks DROP COLUMN tenant, DROP COLUMN route")  # versions 4, 5
        conn.execute(f"UPDATE {schema}.meta SET value = '1' WHERE name = 'schema_version'")
    with PostgresStore(postgres_dsn, schema=schema) as store:
        assert store.get("a") is not None and store.get("a").payload == {"x": 1}  # type: ignore[union-attr]
        assert store.renew_lease("w", 5.0)
    with psycopg.connect(postgres_dsn) as conn:
        assert conn.execute(f"SELECT value FROM {schema}.meta").fetchone() == (str(SCHEMA_VERSION),)


def test_a_version_2_store_is_upgraded_with_the_job_tables(postgres_dsn: str, schema: str) -> None:
    import psycopg

    from aiqsim.core.job import JobRecord
    from aiqsim.stores.postgres import PostgresStore

    with PostgresStore(postgres_dsn, schema=schema) as store:
        store.insert_and_claim(TaskRecord(id="a", key="k", kind="llm", provider="llm", payload={"x": 1}))
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:  # what version 2 left behind
        conn.execute(f"DROP TABLE {schema}.jobs, {schema}.job_keys")
        conn.execute(f"ALTER TABLE {schema}.tasks DROP COLUMN tenant, DROP COLUMN route")  # versions 4, 5
        conn.execute(f"UPDATE {schema}.meta SET value = '2' WHERE name = 'schema_version'")
    job = JobRecord(id="j", key="jk", name="edit", version="1", inputs={"clip": "a"})
    with PostgresStore(postgres_dsn, schema=schema) as store:
        assert store.get("a") is not None and store.list_jobs() == []
        assert store.insert_and_claim_job(job) == job
    with PostgresStore(postgres_dsn, schema=schema) as store:
        assert store.job_owner_of("jk") == job


def test_a_version_3_store_is_upgraded_with_the_tenant_column(postgres_dsn: str, schema: str) -> None:
    import psycopg

    from aiqsim.stores.postgres import SCHEMA_VERSION, PostgresStore

    with PostgresStore(postgres_dsn, schema=schema) as store:
        store.insert_and_claim(TaskRecord(id="a", key="k", kind="llm", provider="llm", payload={"x": 1}))
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:  # what version 3 left behind
        conn.execute(f"ALTER TABLE {schema}.tasks DROP COLUMN tenant, DROP COLUMN route")
        conn.execute(f"ALTER TABLE {schema}.jobs DROP COLUMN tenant")
        conn.execute(f"UPDATE {schema}.meta SET value = '3' WHERE name = 'schema_version'")
    with PostgresStore(postgres_dsn, schema=schema) as store:
        assert store.get("a").tenant is None  # type: ignore[union-attr]
        store.insert_and_claim(TaskRecord(id="b", key="k2", kind="llm", provider="llm", tenant="acme"))
    with PostgresStore(postgres_dsn, schema=schema) as store:
        assert store.get("b").tenant == "acme"  # type: ignore[union-attr]
    with psycopg.connect(postgres_dsn) as conn:
        assert conn.execute(f"SELECT value FROM {schema}.meta").fetchone() == (str(SCHEMA_VERSION),)


def test_a_version_4_store_is_upgraded_with_the_route_and_job_tenant_columns(
    postgres_dsn: str, schema: str
) -> None:
    import psycopg

    from aiqsim.core.job import JobRecord
    from aiqsim.stores.postgres import SCHEMA_VERSION, PostgresStore

    old_job = JobRecord(id="j", key="jk", name="edit", version="1", inputs={"clip": "a"})
    with PostgresStore(postgres_dsn, schema=schema) as store:
        store.insert_and_claim(TaskRecord(id="a", key="k", kind="llm", provider="llm", payload={"x": 1}))
        store.insert_and_claim_job(old_job)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:  # what version 4 left behind
        conn.execute(f"ALTER TABLE {schema}.tasks DROP COLUMN route")
        conn.execute(f"ALTER TABLE {schema}.jobs DROP COLUMN tenant")
        conn.execute(f"UPDATE {schema}.meta SET value = '4' WHERE name = 'schema_version'")
    with PostgresStore(postgres_dsn, schema=schema) as store:
        assert store.get("a").route is None  # type: ignore[union-attr]
        assert store.get_job("j") == old_job
        store.insert_and_claim(TaskRecord(id="b", key="k2", kind="llm", provider="east", route="gpt"))
        store.insert_and_claim_job(JobRecord(id="j2", key="jk2", name="edit", version="1", tenant="acme"))
    with PostgresStore(postgres_dsn, schema=schema) as store:
        assert store.get("b").route == "gpt"  # type: ignore[union-attr]
        assert store.get_job("j2").tenant == "acme"  # type: ignore[union-attr]
    with psycopg.connect(postgres_dsn) as conn:
        assert conn.execute(f"SELECT value FROM {schema}.meta").fetchone() == (str(SCHEMA_VERSION),)


def test_workers_opening_a_version_4_store_at_once_upgrade_it_once(postgres_dsn: str, schema: str) -> None:
    """Four workers open the same version-4 schema at the same moment: the advisory lock lets one
    migrate, the others then find version 5 (none fails on a column already added)."""
    import threading

    import psycopg

    from aiqsim.stores.postgres import SCHEMA_VERSION, PostgresStore

    with PostgresStore(postgres_dsn, schema=schema) as store:
        store.insert_and_claim(TaskRecord(id="a", key="k", kind="llm", provider="llm"))
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:  # what version 4 left behind
        conn.execute(f"ALTER TABLE {schema}.tasks DROP COLUMN route")
        conn.execute(f"ALTER TABLE {schema}.jobs DROP COLUMN tenant")
        conn.execute(f"UPDATE {schema}.meta SET value = '4' WHERE name = 'schema_version'")
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def open_it() -> None:
        start.wait(timeout=60)
        try:
            PostgresStore(postgres_dsn, schema=schema).close()
        except BaseException as error:  # reported below
            errors.append(error)

    workers = [threading.Thread(target=open_it) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert errors == [] and not any(worker.is_alive() for worker in workers)
    with PostgresStore(postgres_dsn, schema=schema) as store:
        assert store.get("a").route is None  # type: ignore[union-attr]
    with psycopg.connect(postgres_dsn) as conn:
        assert conn.execute(f"SELECT value FROM {schema}.meta").fetchone() == (str(SCHEMA_VERSION),)


def test_leases_expire_and_are_adopted_by_exactly_one_worker(postgres_dsn: str, schema: str) -> None:
    import time

    from aiqsim.stores.postgres import PostgresStore

    with PostgresStore(postgres_dsn, schema=schema) as a, PostgresStore(postgres_dsn, schema=schema) as b:
        assert a.renew_lease("dead", 0.2) and b.renew_lease("b", 30.0) and a.renew_lease("c", 30.0)
        assert b.adopt_expired("b") == []  # nobody expired yet
        time.sleep(0.3)
        assert b.adopt_expired("b") == ["dead"]
        assert a.adopt_expired("c") == []  # already adopted: one adopter only
        assert not a.renew_lease("dead", 5.0)  # the presumed-dead worker is fenced off
        assert b.leases()["dead"][1] == "b"
        b.finish_adoption("dead", "b")
        assert "dead" not in b.leases()


def test_a_worker_that_wakes_after_its_adoption_finished_is_still_fenced_off(
    postgres_dsn: str, schema: str
) -> None:
    """finish_adoption deleted the lease row, so a worker that stalled past its lease and woke after
    the adopter had recovered its tasks renewed a fresh lease and ran those tasks a second time (found
    by a review with real processes). The finished adoption is now a tombstone: the stalled process's
    beats are refused; a new process of the worker id takes a fresh lease at its start."""
    import time

    from aiqsim.stores.postgres import PostgresStore

    with PostgresStore(postgres_dsn, schema=schema) as a, PostgresStore(postgres_dsn, schema=schema) as b:
        assert a.acquire_lease("dead", 0.2) and b.acquire_lease("b", 30.0)
        time.sleep(0.3)
        assert b.adopt_expired("b") == ["dead"]
        assert not a.acquire_lease("dead", 5.0)  # a new process must wait while the takeover runs
        b.finish_adoption("dead", "b")
        assert "dead" not in b.leases()  # a tombstone is no lease
        assert not a.renew_lease("dead", 5.0)  # the stalled process wakes: still fenced off
        assert b.adopt_expired("b") == []  # and nothing is adopted twice
        assert a.acquire_lease("dead", 5.0)  # a restarted process of the worker id starts afresh
        assert a.renew_lease("dead", 5.0) and b.leases()["dead"][1] is None


def test_an_adoption_cut_short_is_taken_up_again(postgres_dsn: str, schema: str) -> None:
    """An adoption whose adopter died mid-takeover stayed 'adopted by' it for ever: the dead worker's
    remaining tasks were never recovered. Its adopter takes it up again while alive (recovery left
    orphans undecided); once the adopter holds no lease any more, another worker does."""
    import time

    from aiqsim.stores.postgres import PostgresStore

    with PostgresStore(postgres_dsn, schema=schema) as store:
        assert store.acquire_lease("dead", 0.1) and store.acquire_lease("a", 0.6)
        assert store.acquire_lease("c", 30.0)
        time.sleep(0.2)
        assert store.adopt_expired("a") == ["dead"]
        assert store.adopt_expired("a") == ["dead"]  # not finished: its adopter takes it up again
        assert store.adopt_expired("c") == []  # a is alive: its takeover is its own
        time.sleep(0.5)  # a dies mid-takeover; its lease expires
        assert store.adopt_expired("c") == ["a"]  # first a itself ...
        assert store.adopt_expired("c") == ["a", "dead"]  # ... then what a had not finished
        store.finish_adoption("a", "c")
        store.finish_adoption("dead", "c")
        assert store.adopt_expired("c") == [] and set(store.leases()) == {"c"}


def test_a_worker_whose_lease_was_adopted_stops(postgres_dsn: str, schema: str) -> None:
    from aiqsim.fleet import LeaseKeeper, LeaseLostError
    from aiqsim.runtime import SimPyRuntime
    from aiqsim.scheduler import Scheduler
    from aiqsim.stores.postgres import PostgresStore
    from tests.fakes import ScriptedProvider

    with (
        PostgresStore(postgres_dsn, schema=schema) as store,
        PostgresStore(postgres_dsn, schema=schema) as peer,
    ):
        runtime = SimPyRuntime()
        scheduler = Scheduler(runtime, [ScriptedProvider(runtime, "llm")], store=store, worker_id="slow")
        keeper = LeaseKeeper(scheduler, ttl_s=0.2)
        keeper.beat()
        import time

        time.sleep(0.3)  # the worker stalls past its lease ...
        assert peer.adopt_expired("peer") == ["slow"]  # ... and is presumed dead
        with pytest.raises(LeaseLostError, match="presumed dead"):
            keeper.beat()
        from aiqsim.scheduler.scheduler import SchedulerClosedError

        with pytest.raises(SchedulerClosedError):
            scheduler.submit("llm", {"x": 1})


def test_a_keeper_finishes_an_adoption_only_once_recovery_decided_every_orphan(
    postgres_dsn: str, schema: str
) -> None:
    """The keeper finished an adoption whose recovery left orphans undecided (the provider's lookup
    was down): the tasks stayed running under the dead worker for ever, with no lease to retry them."""
    import time

    from aiqsim.core.states import transition
    from aiqsim.fleet import LeaseKeeper
    from aiqsim.runtime import SimPyRuntime
    from aiqsim.scheduler import Scheduler
    from aiqsim.scheduler.provider import ProviderResponse
    from aiqsim.stores.postgres import PostgresStore

    class Lookups:
        name = "llm"
        down = True

        async def call(self, request):
            return ProviderResponse(result="fresh")

        async def lookup(self, key):
            if self.down:
                raise ConnectionError("lookup endpoint down")
            return ProviderResponse(result="done before the crash")

    with PostgresStore(postgres_dsn, schema=schema) as store:
        orphan = TaskRecord(id="o", key="k-o", kind="llm", provider="llm", worker="dead")
        store.insert_and_claim(orphan)
        store.update(transition(orphan, TaskStatus.RUNNING, 0.0))
        assert store.acquire_lease("dead", 0.1)
        time.sleep(0.2)
        runtime = SimPyRuntime()
        provider = Lookups()
        scheduler = Scheduler(runtime, [provider], store=store, worker_id="me")
        keeper = LeaseKeeper(scheduler, ttl_s=30.0)
        first = runtime.run(keeper.adopt())
        assert [a.report.undecided for a in first] == [("o",)]
        assert store.leases()["dead"][1] == "me"  # still under way
        provider.down = False
        second = runtime.run(keeper.adopt())
        assert [a.report.orphans_completed for a in second] == [1]
        assert "dead" not in store.leases() and store.get("o").status is TaskStatus.SUCCEEDED


def _store_behind_a_link(postgres_dsn: str, schema: str, link: Any) -> Any:
    """A PostgresStore that reaches the server through ``link`` (a :class:`tests.tcp_link.TcpLink`)."""
    from urllib.parse import urlsplit, urlunsplit

    from aiqsim.stores.postgres import PostgresStore

    parts = urlsplit(postgres_dsn)
    user = f"{parts.username}@" if parts.username else ""
    return PostgresStore(
        urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{link.port}")), schema=schema, connect_timeout_s=2
    )


def _link_to(postgres_dsn: str) -> Any:
    from urllib.parse import urlsplit

    from tests.tcp_link import TcpLink

    parts = urlsplit(postgres_dsn)
    assert parts.hostname is not None and parts.port is not None, postgres_dsn
    return TcpLink((parts.hostname, parts.port))


def test_a_keeper_beats_through_a_store_outage_shorter_than_its_lease(postgres_dsn: str, schema: str) -> None:
    """Before: the first beat that could not reach the store killed the keeper, and the scheduler
    (whose store now makes its connection again) ran on without a lease: another worker adopted its
    tasks once the lease ran out, and both ran them."""
    import asyncio

    from aiqsim.fleet import LeaseKeeper
    from aiqsim.runtime import AsyncioRuntime
    from aiqsim.scheduler import Scheduler
    from aiqsim.stores.postgres import PostgresStore
    from tests.fakes import ScriptedProvider

    ttl_s, every_s = 6.0, 0.5

    async def body(store: Any, link: Any) -> tuple[int, bool, bool]:
        runtime = AsyncioRuntime()
        scheduler = Scheduler(runtime, [ScriptedProvider(runtime, "llm")], store=store, worker_id="w")
        keeper = LeaseKeeper(scheduler, ttl_s=ttl_s, renew_every_s=every_s)
        handle = keeper.start()
        link.cut()
        await asyncio.sleep(3 * every_s)  # a few beats miss ...
        link.restore()
        await asyncio.sleep(3 * every_s)  # ... and the next ones renew
        alive = not handle.done()
        missed = keeper.missed_beats
        record = await scheduler.submit("llm", {"input": "after"}).wait()
        await keeper.stop()
        await scheduler.close()
        return missed, alive, record.status is TaskStatus.SUCCEEDED

    with _link_to(postgres_dsn) as link, _store_behind_a_link(postgres_dsn, schema, link) as store:
        missed, alive, ran = asyncio.run(body(store, link))
    assert missed >= 2 and alive and ran
    with PostgresStore(postgres_dsn, schema=schema) as peer:
        assert peer.adopt_expired("peer") == []  # nothing to adopt: the lease was kept (and released)


def test_a_keeper_that_cannot_renew_in_time_stops_its_scheduler_before_the_lease_runs_out(
    postgres_dsn: str, schema: str
) -> None:
    import asyncio

    from aiqsim.fleet import LeaseKeeper, LeaseLostError
    from aiqsim.runtime import AsyncioRuntime
    from aiqsim.scheduler import Scheduler
    from aiqsim.scheduler.scheduler import SchedulerClosedError
    from aiqsim.stores.postgres import PostgresStore
    from tests.fakes import ScriptedProvider

    ttl_s, every_s = 4.0, 1.0  # it stops one beat (1 s) before the lease would run out

    async def body(store: Any, link: Any, peer: Any) -> tuple[float, int]:
        runtime = AsyncioRuntime()
        scheduler = Scheduler(runtime, [ScriptedProvider(runtime, "llm")], store=store, worker_id="w")
        keeper = LeaseKeeper(scheduler, ttl_s=ttl_s, renew_every_s=every_s)
        handle = keeper.start()
        await asyncio.sleep(every_s)
        link.cut()
        with pytest.raises(LeaseLostError, match=r"could not be renewed .* ttl_s=4 .*could not be reached"):
            await handle
        left_s = peer.leases()["w"][0]  # read on the server's clock the moment the worker stopped
        with pytest.raises(SchedulerClosedError):
            scheduler.submit("llm", {"input": "late"})
        link.restore()
        await keeper.stop()  # the shutdown call: the lease of a worker that stopped as dead stays
        assert "w" in peer.leases()  # (review: releasing it left the worker's tasks to nobody)
        return left_s, keeper.missed_beats

    with (
        _link_to(postgres_dsn) as link,
        _store_behind_a_link(postgres_dsn, schema, link) as store,
        PostgresStore(postgres_dsn, schema=schema) as peer,
    ):
        left_s, missed = asyncio.run(body(store, link, peer))
        assert left_s > 0, "stopped after its lease had run out: another worker could have adopted it"
        assert missed >= 1


def test_a_duplicate_waiting_on_another_workers_task_waits_through_a_store_outage(
    postgres_dsn: str, schema: str
) -> None:
    """Before: the first read of the owner's record that could not reach the store ended the
    watcher with the error, and the duplicate waited for ever."""
    import asyncio

    from aiqsim.core.states import transition
    from aiqsim.runtime import AsyncioRuntime
    from aiqsim.scheduler import Scheduler
    from aiqsim.stores.postgres import PostgresStore
    from tests.fakes import ScriptedProvider

    owner = TaskRecord(id="o", key="k", kind="llm", provider="llm", worker="other")

    async def body(store: Any, link: Any, other: Any) -> tuple[TaskRecord, int]:
        runtime = AsyncioRuntime()
        provider = ScriptedProvider(runtime, "llm")
        scheduler = Scheduler(runtime, [provider], store=store, worker_id="me", duplicate_poll_s=0.1)
        duplicate = scheduler.submit("llm", {"input": "x"}, key="k")
        await asyncio.sleep(0.3)  # the duplicate waits on the other worker's running task
        link.cut()
        await asyncio.sleep(0.5)  # its watcher cannot reach the store
        link.restore()
        await asyncio.sleep(0.3)
        other.update(transition(other.get("o"), TaskStatus.SUCCEEDED, 2.0, result={"from": "other"}))
        record = await runtime.wait_for(duplicate.wait(), 30)
        await scheduler.close()
        assert provider.calls == []  # never sent here
        return record, scheduler.anomalies["store_unreachable"]

    with (
        PostgresStore(postgres_dsn, schema=schema) as other,
        _link_to(postgres_dsn) as link,
        _store_behind_a_link(postgres_dsn, schema, link) as store,
    ):
        other.insert_and_claim(owner)
        other.update(transition(owner, TaskStatus.RUNNING, 1.0))
        record, unreachable = asyncio.run(body(store, link, other))
    assert (record.status, record.result, record.deduped_from) == (TaskStatus.DEDUPED, {"from": "other"}, "o")
    assert unreachable >= 1


def test_a_keeper_counts_how_long_a_failing_beat_takes_before_it_risks_another(
    postgres_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A beat that fails slowly (a connect timeout) says the next one may take as long: with ttl 3 s
    and beats every 0.5 s, a beat that fails after 1 s at 0.5 s leaves too little time for a next
    beat (1 s from 2 s) to renew before 3 s, so the worker stops at 1.5 s. Review: counting only
    when the next beat starts, it stopped at 3 s, after its lease had run out."""
    import asyncio
    import time

    from aiqsim.fleet import LeaseKeeper, LeaseLostError
    from aiqsim.runtime import AsyncioRuntime
    from aiqsim.scheduler import Scheduler
    from aiqsim.stores.base import StoreError
    from aiqsim.stores.postgres import PostgresStore
    from tests.fakes import ScriptedProvider

    with (
        PostgresStore(postgres_dsn, schema=schema) as store,
        PostgresStore(postgres_dsn, schema=schema) as peer,
    ):
        renew = store.renew_lease
        beats: list[str] = []

        def slow_then_failing(worker: str, ttl_s: float) -> bool:
            beats.append(worker)
            if len(beats) == 1:
                return renew(worker, ttl_s)
            time.sleep(1.0)  # a connect that times out, blocking the loop as a synchronous store call does
            raise StoreError("cannot connect to PostgreSQL (a stand-in for a connect timeout)")

        monkeypatch.setattr(store, "renew_lease", slow_then_failing)

        async def body() -> float:
            runtime = AsyncioRuntime()
            scheduler = Scheduler(runtime, [ScriptedProvider(runtime, "llm")], store=store, worker_id="w")
            handle = LeaseKeeper(scheduler, ttl_s=3.0, renew_every_s=0.5).start()
            with pytest.raises(LeaseLostError, match="could not be renewed"):
                await handle
            return peer.leases()["w"][0]

        left_s = asyncio.run(body())
    assert len(beats) == 2  # the first renewed; the second failed slowly, and there was no third
    assert left_s > 0.5, f"stopped with {left_s:.2f} s left on the lease"


def _first_stage_payload(inputs: Any, results: Any) -> dict[str, str]:
    return {"input": f"a:{inputs['x']}"}


def test_a_duplicate_job_waiting_on_another_workers_job_waits_through_a_store_outage(
    postgres_dsn: str, schema: str
) -> None:
    """The job's counterpart of the task watcher (review: it ended at the first StoreError, and the
    duplicate job waited for ever)."""
    import asyncio

    from aiqsim import JobSpec, JobStatus, Stage
    from aiqsim.runtime import AsyncioRuntime
    from aiqsim.scheduler import Scheduler
    from aiqsim.stores.postgres import PostgresStore
    from tests.fakes import ScriptedProvider

    spec = JobSpec("x", "1", [Stage("a", "llm", build=_first_stage_payload)])

    async def body(direct: Any, behind: Any, link: Any) -> tuple[Any, Any, int, list[Any]]:
        runtime = AsyncioRuntime()
        one = Scheduler(runtime, [ScriptedProvider(runtime, latency_s=2.0)], store=direct, worker_id="one")
        calls_of_two = ScriptedProvider(runtime, latency_s=0.1)
        two = Scheduler(runtime, [calls_of_two], store=behind, worker_id="two", duplicate_poll_s=0.1)
        owner = one.submit_job(spec, {"x": 1}, job_id="owner")
        await asyncio.sleep(0.2)
        duplicate = two.submit_job(spec, {"x": 1}, job_id="duplicate")
        await asyncio.sleep(0.3)  # the duplicate waits on the other worker's job
        link.cut()
        await asyncio.sleep(0.5)  # its watcher cannot reach the store
        link.restore()
        first = await owner.wait()
        second = await runtime.wait_for(duplicate.wait(), 30)
        await one.close()
        await two.close()
        return first, second, two.anomalies["store_unreachable"], calls_of_two.calls

    with (
        PostgresStore(postgres_dsn, schema=schema) as direct,
        _link_to(postgres_dsn) as link,
        _store_behind_a_link(postgres_dsn, schema, link) as behind,
    ):
        first, second, unreachable, calls = asyncio.run(body(direct, behind, link))
    assert (first.status, second.status) == (JobStatus.SUCCEEDED, JobStatus.DEDUPED)
    assert unreachable >= 1 and calls == []


def test_every_connection_gives_up_on_a_server_that_went_silent(postgres_dsn: str, schema: str) -> None:
    """A server whose host lost power, or a network that drops packets, sends no reset: with the
    OS's defaults a call waits about two hours for it, holding the worker's event loop (and the
    lease's beats) all that time (review). The store asks for keepalives and a user timeout on its
    connections, the LISTEN one included; a DSN that sets its own keeps it."""
    from aiqsim.stores.postgres import DEAD_SERVER_SETTINGS, PostgresStore

    expected = {name: str(value) for name, value in DEAD_SERVER_SETTINGS.items()}
    with PostgresStore(postgres_dsn, schema=schema) as store:
        store.notification_fileno()
        for conn in (store._conn, store._listener):
            parameters = conn.info.get_parameters()
            assert {name: parameters.get(name) for name in expected} == expected
    separator = "&" if "?" in postgres_dsn else "?"
    with PostgresStore(f"{postgres_dsn}{separator}keepalives_idle=60", schema=schema) as own:
        assert own._conn.info.get_parameters()["keepalives_idle"] == "60"


def _task(task_id: str) -> TaskRecord:
    return TaskRecord(id=task_id, key=f"key-{task_id}", kind="llm", provider="llm")


def test_a_write_whose_commit_answer_was_lost_reports_what_the_server_decided(
    postgres_dsn: str, schema: str
) -> None:
    """Before: a COMMIT the server applied but whose answer the network lost raised "not
    persisted", while the row was there; a submission then failed although its key was claimed,
    and a retry of the key waited on a task nothing would run (review). Now the store asks the
    server on a new connection what became of the transaction."""
    from aiqsim.stores.postgres import PostgresStore

    with _link_to(postgres_dsn) as link, _store_behind_a_link(postgres_dsn, schema, link) as store:
        store.insert_and_claim(_task("a"))
        link.lose_the_answer_to(b"COMMIT", delivered=True)  # applied; the client never hears so
        assert store.insert_and_claim(_task("b")).id == "b"
        assert link.sprung.is_set()
        assert (store.commits_confirmed, store.reconnects) == (1, 1)
        assert store.get("b") is not None and store.owner_of("key-b").id == "b"

        # the COMMIT never arrives: the server's process for the lost connection still holds the
        # transaction open; the store ends it (rolling it back) and reports the write not persisted
        link.lose_the_answer_to(b"COMMIT", delivered=False)
        with pytest.raises(StoreWriteError, match="not persisted: insert task 'c'") as caught:
            store.insert_and_claim(_task("c"))
        assert type(caught.value) is StoreWriteError
        assert link.sprung.is_set() and store.commits_confirmed == 1
        assert store.get("c") is None and store.owner_of("key-c") is None
        store.insert_and_claim(_task("c"))  # its key is free: nothing holds a lock on it

        # an update, applied and unheard
        record = store.get("a")
        assert record is not None
        link.lose_the_answer_to(b"COMMIT", delivered=True)
        store.update(_running(record))
        assert store.get("a").status is TaskStatus.RUNNING and store.commits_confirmed == 2
    with PostgresStore(postgres_dsn, schema=schema) as again:
        assert sorted(r.id for r in again.list_by_status()) == ["a", "b", "c"]


def _running(record: TaskRecord) -> TaskRecord:
    from aiqsim.core.states import transition

    return transition(record, TaskStatus.RUNNING, 1.0)


def test_a_lost_commit_answer_with_the_server_out_of_reach_is_an_unknown_outcome(
    postgres_dsn: str, schema: str
) -> None:
    """When the server cannot be asked either, the error says the write may or may not be
    persisted (a StoreWriteError still: nothing may report it done); the rows say which."""
    from aiqsim.stores.base import StoreWriteOutcomeUnknownError

    with _link_to(postgres_dsn) as link, _store_behind_a_link(postgres_dsn, schema, link) as store:
        store.insert_and_claim(_task("a"))
        link.lose_the_answer_to(b"COMMIT", delivered=True, then_refuse=True)
        with pytest.raises(
            StoreWriteOutcomeUnknownError, match=r"outcome unknown .*insert task 'b'"
        ) as caught:
            store.insert_and_claim(_task("b"))
        assert isinstance(caught.value, StoreWriteError)
        link.restore()
        assert store.get("b") is not None  # it had been applied


def _retry_returns_within(seconds: float, retry: Any) -> Any:
    """Run ``retry()`` in a thread: its result, or a failure if it still blocks after ``seconds``
    (a retry blocked on a stranded transaction's row locks waits until the server ends it)."""
    import threading

    outcome: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("value", retry()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert "value" in outcome, f"the retry still blocks after {seconds} s"
    return outcome["value"]


def test_a_write_that_loses_its_connection_mid_transaction_frees_its_key_for_a_retry(
    postgres_dsn: str, schema: str
) -> None:
    """Before: the server's process for the lost connection stayed idle in the transaction, holding
    the key's row lock until the server noticed the client was gone (hours with default
    keepalives), and a retry of the same key blocked the worker all that time (review)."""
    with _link_to(postgres_dsn) as link, _store_behind_a_link(postgres_dsn, schema, link) as store:
        store.insert_and_claim(_task("a"))
        link.lose_the_answer_to(b"INSERT INTO", delivered=True)  # the insert ran; its answer is lost
        with pytest.raises(StoreWriteError, match="not persisted: insert task 'b'"):
            store.insert_and_claim(_task("b"))
        # a few seconds at most: the retry takes milliseconds once the stranded process is gone;
        # without ending it, it waits for the idle-in-transaction timeout (10 s) or for ever
        assert _retry_returns_within(5.0, lambda: store.insert_and_claim(_task("b"))).id == "b"


def test_every_connection_ends_a_transaction_left_idle_by_a_client_that_is_gone(
    postgres_dsn: str, schema: str
) -> None:
    """While the server cannot be reached nothing can end the stranded transaction from here; the
    server does, after the idle-in-transaction timeout every connection sets (a DSN's own wins:
    one second here, so the test does not wait the default ten)."""
    from aiqsim.stores.base import StoreWriteOutcomeUnknownError
    from aiqsim.stores.postgres import STRANDED_TRANSACTION_TIMEOUT_MS, PostgresStore

    with PostgresStore(postgres_dsn, schema=schema) as plain:
        timeout = plain._conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()[0]
        assert timeout == f"{STRANDED_TRANSACTION_TIMEOUT_MS // 1000}s"
    separator = "&" if "?" in postgres_dsn else "?"
    own = f"{postgres_dsn}{separator}options=-c%20idle_in_transaction_session_timeout%3D1000"
    with _link_to(own) as link, _store_behind_a_link(own, schema, link) as store:
        assert store._conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()[0] == "1s"
        store.insert_and_claim(_task("a"))
        link.lose_the_answer_to(b"COMMIT", delivered=False, then_refuse=True)
        with pytest.raises(StoreWriteOutcomeUnknownError):
            store.insert_and_claim(_task("b"))
        link.restore()
        assert store.get("b") is None  # the COMMIT never arrived
        assert _retry_returns_within(10.0, lambda: store.insert_and_claim(_task("b"))).id == "b"
