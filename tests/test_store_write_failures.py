"""Every store write that fails is a StoreWriteError naming what was lost, and the store recovers;
a store this process cannot write is refused at open with StoreAccessError.

Real failures only: a child process under ``RLIMIT_FSIZE`` gets the kernel's ``EFBIG`` on a write
past the limit (what a full quota or disk gives the store: a refused write), and raising the
limit again is "the disk has space again". Permission cases run the store in a child that drops
root to ``nobody`` after importing (root ignores permission bits), against real files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOBODY = 65534


def run_child(script: str, *args: str, unprivileged: bool = False) -> dict:
    """Run ``script`` in a fresh interpreter; it prints one JSON report, which is returned."""
    prologue = ""
    if unprivileged and os.geteuid() == 0:
        # everything the script needs is imported first: the interpreter's own files may not be
        # readable once the process is nobody
        prologue = f"import os\nos.setgroups([])\nos.setgid({NOBODY})\nos.setuid({NOBODY})\n"
    imports = (
        "import json, os, resource, signal, sys, sqlite3, zlib, fcntl\n"
        "from aiqsim.core.task import TaskRecord, TaskStatus\n"
        "from aiqsim.core.states import transition\n"
        "from aiqsim.core.errors import StoreError\n"
        "from aiqsim.stores import JsonFileStore, SqliteStore, StoreWriteError\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", imports + prologue + textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert child.returncode == 0, child.stderr
    return json.loads(child.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- disk full
FULL_DISK = """
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    kind, path = sys.argv[1], sys.argv[2]

    def rec(n):
        return TaskRecord(id=f"t{n}", key=f"k{n}", kind="llm", provider="llm", payload={"pad": "x" * 3000})

    def open_store():
        return JsonFileStore(path) if kind == "json" else SqliteStore(path)

    report = {"errors": []}
    store = open_store()
    store.insert_and_claim(rec(0))
    store.update(transition(rec(0), TaskStatus.RUNNING, 1.0))
    appended = path + (".journal" if kind == "json" else "-wal")  # where every write goes first
    resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(appended), hard))  # the disk is now full
    done = transition(transition(rec(0), TaskStatus.RUNNING, 1.0), TaskStatus.SUCCEEDED, 2.0)
    writes = [
        lambda: store.insert_and_claim(rec(1)),
        lambda: store.update(done),
        lambda: store.record_poison("k-bad", "SchemaViolationError", 3.0),
    ]
    for write in writes:
        try:
            write()
        except StoreWriteError as error:
            report["errors"].append([error.what, type(error.__cause__).__name__, isinstance(error, OSError)])
        except BaseException as error:
            report["errors"].append(["RAW " + type(error).__name__, str(error), False])
    report["after_failure"] = {
        "ids": sorted(r.id for r in store.list_by_status()),
        "t0": store.get("t0").status.value,
        "poison": store.poison_error("k-bad"),
    }
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space again
    store.insert_and_claim(rec(1))
    store.update(done)
    store.close()
    store = open_store()
    ids = sorted(r.id for r in store.list_by_status())
    report["reopened"] = {"ids": ids, "t0": store.get("t0").status.value}
    store.close()
    print(json.dumps(report))
"""


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_full_disk_write_is_store_write_error_and_the_store_recovers(tmp_path: Path, kind: str) -> None:
    report = run_child(FULL_DISK, kind, str(tmp_path / f"tasks.{kind}"))
    assert [what for what, _, _ in report["errors"]] == [
        "insert of task 't1' (queued)",
        "update of task 't0' to succeeded",
        "poison record for key 'k-bad'",
    ], report
    assert all(is_os_error for _, _, is_os_error in report["errors"])  # still an OSError for old callers
    assert {cause for _, cause, _ in report["errors"]} <= {"OSError", "OperationalError"}, report
    assert report["after_failure"] == {"ids": ["t0"], "t0": "running", "poison": None}  # nothing half-applied
    assert report["reopened"] == {"ids": ["t0", "t1"], "t0": "succeeded"}


# ---------------------------------------------------------------------------- permissions
@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory an unprivileged child can reach (pytest's tmp_path parents are root-only)."""
    directory = Path(tempfile.mkdtemp(prefix="aiqsim-perm-"))
    directory.chmod(0o755)
    yield directory
    for path in [directory, *directory.rglob("*")]:
        path.chmod(0o700)
    shutil.rmtree(directory)


def give_to_nobody(*paths: Path) -> None:
    if os.geteuid() == 0:
        for path in paths:
            os.chown(path, NOBODY, NOBODY)


OPEN_AND_WRITE = """
    kind, path = sys.argv[1], sys.argv[2]
    report = {}
    try:
        store = JsonFileStore(path) if kind == "json" else SqliteStore(path)
        store.insert_and_claim(TaskRecord(id="t1", key="k1", kind="llm", provider="llm"))
        store.close()
        report["opened"] = True
    except StoreError as error:
        report["error"] = type(error).__name__
        report["message"] = str(error)
        report["permission_error"] = isinstance(error, PermissionError)
    except BaseException as error:
        report["error"] = "RAW " + type(error).__name__
        report["message"] = str(error)
    print(json.dumps(report))
"""


def make_store(kind: str, directory: Path) -> Path:
    from aiqsim.core.task import TaskRecord
    from aiqsim.stores import JsonFileStore, SqliteStore

    path = directory / f"tasks.{kind}"
    store = JsonFileStore(path) if kind == "json" else SqliteStore(path)
    store.insert_and_claim(TaskRecord(id="t0", key="k0", kind="llm", provider="llm"))
    store.close()
    return path


def file_bytes(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def test_sqlite_read_only_file_is_refused_at_open(shared_dir: Path) -> None:
    """Before: it opened (SQLite fell back to read-only) and the first write raised the raw
    ``attempt to write a readonly database``."""
    work = shared_dir / "store"
    work.mkdir()
    path = make_store("sqlite", work)
    give_to_nobody(work, path)
    path.chmod(0o400)
    before = file_bytes(work)
    report = run_child(OPEN_AND_WRITE, "sqlite", str(path), unprivileged=True)
    assert report.get("error") == "StoreAccessError", report
    assert str(path) in report["message"] and "the file is not writable" in report["message"]
    assert report["permission_error"]
    assert file_bytes(work) == before


def test_sqlite_store_in_a_read_only_directory_is_refused_at_open(shared_dir: Path) -> None:
    work = shared_dir / "store"
    work.mkdir()
    path = make_store("sqlite", work)
    give_to_nobody(path)  # the file is writable, but WAL must create -wal/-shm beside it
    work.chmod(0o555)
    report = run_child(OPEN_AND_WRITE, "sqlite", str(path), unprivileged=True)
    assert report.get("error") == "StoreAccessError", report
    assert f"its directory {work} is not writable" in report["message"]


@pytest.mark.parametrize("mode", [0o000, 0o555], ids=["unreadable", "read-only"])
def test_json_store_in_an_inaccessible_directory_is_refused_at_open(shared_dir: Path, mode: int) -> None:
    """Before: an unreadable directory raised a raw PermissionError."""
    work = shared_dir / "store"
    work.mkdir()
    path = make_store("json", work)
    give_to_nobody(*work.iterdir())
    before = file_bytes(work)
    work.chmod(mode)
    report = run_child(OPEN_AND_WRITE, "json", str(path), unprivileged=True)
    assert report.get("error") == "StoreAccessError", report
    assert str(path) in report["message"] and report["permission_error"]
    work.chmod(0o755)
    assert file_bytes(work) == before


@pytest.mark.parametrize("name", ["tasks.json", "tasks.json.journal"])
def test_json_read_only_snapshot_or_journal_is_refused_at_open(shared_dir: Path, name: str) -> None:
    """A snapshot made read-only would otherwise be silently replaced by the next compaction."""
    work = shared_dir / "store"
    work.mkdir()
    path = make_store("json", work)
    give_to_nobody(work, *work.iterdir())
    (work / name).chmod(0o400)
    before = file_bytes(work)
    report = run_child(OPEN_AND_WRITE, "json", str(path), unprivileged=True)
    assert report.get("error") == "StoreAccessError", report
    assert f"{work / name}: not writable" in report["message"]
    assert file_bytes(work) == before


PURGE_ON_FULL_DISK = """
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    kind, path = sys.argv[1], sys.argv[2]
    store = JsonFileStore(path) if kind == "json" else SqliteStore(path)
    for n in range(200):
        rec = TaskRecord(id=f"t{n}", key=f"k{n % 50}", kind="llm", provider="llm", payload={"pad": "x" * 500})
        owner = store.insert_and_claim(rec)
        if owner.id == rec.id:
            store.update(transition(transition(rec, TaskStatus.RUNNING, n), TaskStatus.SUCCEEDED, n + 0.5))
        else:
            store.update(transition(rec, TaskStatus.DEDUPED, n + 0.5))
    report = {"before": len(store.list_by_status())}
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))  # no write of any size fits any more
    try:
        store.purge(10_000.0, finished_older_than_s=0.0, keys_older_than_s=0.0)
    except StoreWriteError as error:
        report["what"] = error.what
    report["after_failure"] = len(store.list_by_status())
    report["owner_k3"] = store.owner_of("k3").id
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    purged = store.purge(10_000.0, finished_older_than_s=0.0, keys_older_than_s=0.0)
    report["removed"] = [purged.tasks_removed, purged.keys_removed]
    store.close()
    store = JsonFileStore(path) if kind == "json" else SqliteStore(path)
    report["reopened"] = len(store.list_by_status())
    store.close()
    print(json.dumps(report))
"""


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_a_purge_that_cannot_be_written_removes_nothing(tmp_path: Path, kind: str) -> None:
    """The purge is one transaction (one journal line): refused whole on a full disk, then done whole."""
    report = run_child(PURGE_ON_FULL_DISK, kind, str(tmp_path / f"tasks.{kind}"))
    assert report["before"] == 200
    assert report["what"].startswith("purge of "), report
    assert report["after_failure"] == 200 and report["owner_k3"] == "t3"
    assert report["removed"] == [200, 50]
    assert report["reopened"] == 0


CREATE_ON_FULL_DISK = """
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    kind, path = sys.argv[1], sys.argv[2]
    report = {}
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
    try:
        JsonFileStore(path) if kind == "json" else SqliteStore(path)
    except StoreWriteError as error:
        report["what"] = error.what
    except BaseException as error:
        report["what"] = "RAW " + type(error).__name__
    report["left_behind"] = sorted(os.listdir(os.path.dirname(path)))
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    store = JsonFileStore(path) if kind == "json" else SqliteStore(path)
    store.insert_and_claim(TaskRecord(id="t1", key="k1", kind="llm", provider="llm"))
    report["tasks"] = len(store.list_by_status())
    store.close()
    print(json.dumps(report))
"""


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_creating_a_store_on_a_full_disk_is_store_write_error(tmp_path: Path, kind: str) -> None:
    report = run_child(CREATE_ON_FULL_DISK, kind, str(tmp_path / f"tasks.{kind}"))
    assert report["what"].startswith(("creation of an empty store", "opening the store")), report
    assert f"tasks.{kind}" not in report["left_behind"] or kind == "json"  # sqlite links only a whole file
    assert report["tasks"] == 1
