"""Group commit (``SqliteStore(group_commit=True)``): the store side of the contract.

Everything here runs on real SQLite files; crashes are real processes that die (``os._exit`` /
SIGKILL) and a failing commit is a real write refused by the kernel (``RLIMIT_FSIZE`` in a child
process, the same ``EFBIG`` a full quota gives), never a mock.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from aiqsim.core.states import transition
from aiqsim.core.task import TaskRecord, TaskStatus
from aiqsim.stores import JsonFileStore, MemoryStore, SqliteStore

REPO = Path(__file__).resolve().parents[1]


def task(n: int, key: str | None = None, pad: int = 0) -> TaskRecord:
    return TaskRecord(
        id=f"t{n}", key=key or f"k{n}", kind="llm", provider="llm", payload={"n": n, "pad": "x" * pad}
    )


def committed_ids(path: Path) -> list[str]:
    """Task ids another connection sees (what is durable), read with plain sqlite3."""
    conn = sqlite3.connect(path)
    try:
        return [row[0] for row in conn.execute("SELECT id FROM tasks ORDER BY seq")]
    finally:
        conn.close()


def run_child(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


# ---------------------------------------------------------------------------- the flag and no-op flush
def test_only_a_group_commit_sqlite_store_defers(tmp_path: Path) -> None:
    stores = [
        MemoryStore(),
        JsonFileStore(tmp_path / "t.json"),
        SqliteStore(tmp_path / "plain.sqlite"),
        SqliteStore(tmp_path / "group.sqlite", group_commit=True),
    ]
    try:
        assert [store.deferred_commit for store in stores] == [False, False, False, True]
        for store in stores[:3]:
            store.insert_and_claim(task(1))
            assert store.flush() == 0  # nothing staged: each write was durable on return
        assert committed_ids(tmp_path / "plain.sqlite") == ["t1"]
    finally:
        for store in stores:
            store.close()


# ---------------------------------------------------------------------------- visibility
def test_staged_writes_are_read_back_here_and_invisible_elsewhere_until_flush(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite"
    with SqliteStore(path, group_commit=True) as store:
        first = task(1)
        assert store.insert_and_claim(first) is first
        running = transition(first, TaskStatus.RUNNING, 1.0)
        store.update(running)
        duplicate = task(2, key="k1")
        assert store.insert_and_claim(duplicate) == running  # the staged owner wins the key
        store.record_poison("k-bad", "SchemaViolationError", 2.0)

        assert store.get("t1") == running and store.owner_of("k1") == running
        assert store.poison_error("k-bad") == "SchemaViolationError"
        assert committed_ids(path) == []  # nothing is durable yet

        assert store.flush() == 4
        assert committed_ids(path) == ["t1", "t2"]
        assert store.flush() == 0  # nothing left to commit

        store.update(transition(running, TaskStatus.SUCCEEDED, 3.0, result={"ok": True}))
        assert committed_ids(path) == ["t1", "t2"]
        with SqliteStore(path) as other:  # a second store on the same file sees the last flush
            assert other.get("t1") == running
    with SqliteStore(path) as reopened:  # close() flushed the last update
        assert reopened.get("t1").status is TaskStatus.SUCCEEDED


def test_a_failed_write_takes_back_only_itself(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite"
    with SqliteStore(path, group_commit=True) as store:
        store.insert_and_claim(task(1))
        with pytest.raises(ValueError, match="already exists"):
            store.insert_and_claim(task(1))
        with pytest.raises(KeyError):
            store.update(task(9))
        store.insert_and_claim(task(2))
        assert store.flush() == 2
    assert committed_ids(path) == ["t1", "t2"]


def test_close_without_flush_drops_exactly_the_staged_writes(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite"
    store = SqliteStore(path, group_commit=True)
    store.insert_and_claim(task(1))
    assert store.flush() == 1
    store.insert_and_claim(task(2))
    store.update(transition(task(1), TaskStatus.RUNNING, 1.0))
    store.close(flush=False)  # what a crash does
    with SqliteStore(path) as reopened:
        assert [r.id for r in reopened.list_by_status()] == ["t1"]
        assert reopened.get("t1").status is TaskStatus.QUEUED
        assert reopened.owner_of("k2") is None


# ---------------------------------------------------------------------------- real crashes
@pytest.mark.parametrize("death", ["exit", "sigkill"])
def test_a_killed_process_loses_only_its_unflushed_writes(tmp_path: Path, death: str) -> None:
    path = tmp_path / "tasks.sqlite"
    script = """
        import os, signal, sys
        from aiqsim.core.task import TaskRecord
        from aiqsim.stores import SqliteStore
        store = SqliteStore(sys.argv[1], group_commit=True)
        for n in range(30):
            store.insert_and_claim(TaskRecord(id=f"t{n}", key=f"k{n}", kind="llm", provider="llm"))
            if n % 10 == 9:
                assert store.flush() == 10
        for n in range(30, 37):
            store.insert_and_claim(TaskRecord(id=f"t{n}", key=f"k{n}", kind="llm", provider="llm"))
        print("staged", flush=True)
        if sys.argv[2] == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(0)
    """
    child = run_child(script, str(path), death)
    assert child.stdout.strip() == "staged", child.stderr
    assert child.returncode == (-signal.SIGKILL if death == "sigkill" else 0)
    with SqliteStore(path) as store:
        assert [r.id for r in store.list_by_status()] == [f"t{n}" for n in range(30)]
        assert store.owner_of("k30") is None


# ---------------------------------------------------------------------------- other processes
def test_another_process_waits_for_the_commit_window_and_cannot_steal_the_key(tmp_path: Path) -> None:
    """The staged claim holds the write lock: another process's claim of the same key times out
    with StoreWriteError (not a raw 'database is locked'); after the flush it finds our owner."""
    path = tmp_path / "tasks.sqlite"
    script = """
        import sys
        from aiqsim.core.task import TaskRecord
        from aiqsim.stores import SqliteStore, StoreWriteError
        with SqliteStore(sys.argv[1], busy_timeout_s=float(sys.argv[2])) as store:
            try:
                owner = store.insert_and_claim(TaskRecord(id="theirs", key="k1", kind="llm", provider="llm"))
            except StoreWriteError as error:
                print("StoreWriteError", error.what)
            else:
                print("owner", owner.id)
    """
    with SqliteStore(path, group_commit=True) as store:
        store.insert_and_claim(task(1))
        blocked = run_child(script, str(path), "0.2")
        assert blocked.stdout.strip() == "StoreWriteError insert of task 'theirs' (queued)", blocked.stderr
        assert store.flush() == 1
        after = run_child(script, str(path), "5")
        assert after.stdout.split() == ["owner", "t1"], after.stderr
        assert store.owner_of("k1").id == "t1"
        assert {r.id for r in store.list_by_status()} == {"t1", "theirs"}


# ---------------------------------------------------------------------------- failed commits
FSIZE_SCRIPT = """
    import json, resource, signal, sys
    from aiqsim.core.task import TaskRecord
    from aiqsim.stores import SqliteStore, StoreWriteError

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large write then fails with EFBIG
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)

    def rec(n):
        return TaskRecord(id=f"t{n}", key=f"k{n}", kind="llm", provider="llm", payload={"pad": "x" * 4000})

    report = {}
    store = SqliteStore(sys.argv[1], group_commit=True)
    for n in range(3):
        store.insert_and_claim(rec(n))
    report["first_flush"] = store.flush()
    for n in range(3, 40):
        store.insert_and_claim(rec(n))
    resource.setrlimit(resource.RLIMIT_FSIZE, (32 * 1024, hard))  # the disk "fills up"
    try:
        store.flush()
    except StoreWriteError as error:
        report["error"] = str(error)
        report["what"] = error.what
        report["cause"] = type(error.__cause__).__name__
    report["after_failure"] = sorted(r.id for r in store.list_by_status())
    report["flush_again"] = store.flush()
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space is back
    store.insert_and_claim(rec(99))
    report["recovered_flush"] = store.flush()
    store.close()
    print(json.dumps(report))
"""


def test_a_failed_flush_rolls_back_everything_staged_and_the_store_recovers(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite"
    SqliteStore(path).close()  # created with a normal file-size limit
    child = run_child(FSIZE_SCRIPT, str(path))
    assert child.returncode == 0, child.stderr
    report = json.loads(child.stdout)
    assert report["first_flush"] == 3
    assert report["what"].startswith("37 staged writes: insert of task 't3' (queued);"), report
    assert "and 32 more" in report["what"]
    assert report["cause"] in ("OperationalError", "DatabaseError"), report
    assert "not persisted" in report["error"]
    assert report["after_failure"] == ["t0", "t1", "t2"]  # the staged rows are gone here too
    assert report["flush_again"] == 0
    assert report["recovered_flush"] == 1
    assert committed_ids(path) == ["t0", "t1", "t2", "t99"]


SPILL_SCRIPT = """
    import json, resource, signal, sys
    from aiqsim.core.task import TaskRecord
    from aiqsim.stores import SqliteStore, StoreWriteError

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)

    def rec(n):
        return TaskRecord(id=f"t{n}", key=f"k{n}", kind="llm", provider="llm", payload={"pad": "x" * 4000})

    report = {}
    store = SqliteStore(sys.argv[1], group_commit=True)
    store.insert_and_claim(rec(0))
    store.flush()
    store._conn.execute("PRAGMA cache_size = 10")  # staged pages spill to the WAL mid-window
    resource.setrlimit(resource.RLIMIT_FSIZE, (32 * 1024, hard))
    n = 1
    try:
        while n < 200:
            store.insert_and_claim(rec(n))
            n += 1
    except StoreWriteError as error:
        report["failed_write"] = n
        report["what"] = error.what
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    report["visible"] = sorted(r.id for r in store.list_by_status())
    try:
        store.flush()
    except StoreWriteError as error:
        report["flush_what"] = error.what
    store.insert_and_claim(rec(500))
    report["recovered_flush"] = store.flush()
    store.close()
    print(json.dumps(report))
"""


def test_a_write_that_loses_the_staged_transaction_names_it_and_flush_reports_it(tmp_path: Path) -> None:
    """When SQLite itself drops the open transaction (a full disk while staged pages spill), the
    failed write names the earlier staged writes it took along, and the next flush raises for
    them instead of returning as if they were durable."""
    path = tmp_path / "tasks.sqlite"
    SqliteStore(path).close()
    child = run_child(SPILL_SCRIPT, str(path))
    assert child.returncode == 0, child.stderr
    report = json.loads(child.stdout)
    failed = report["failed_write"]
    assert failed > 1, report  # some writes were staged before the failure
    assert report["what"].startswith(f"insert of task 't{failed}' (queued); rolled back with it: ")
    assert f"{failed - 1} staged writes: insert of task 't1' (queued);" in report["what"]
    assert report["visible"] == ["t0"]
    assert report["flush_what"].startswith(f"{failed - 1} staged writes: insert of task 't1'")
    assert report["recovered_flush"] == 1
    assert committed_ids(path) == ["t0", "t500"]
