"""A single-process task store in a JSON snapshot plus an append-only, checksummed journal.

Layout next to ``path`` (all files mode 0600):

- ``path``: the snapshot, a versioned JSON document
  ``{"format": "aiqsim-taskstore", "version": 1, "last_seq": N, "tasks": [...], "owners": {...},
  "poison": {...}}``. It is only ever replaced atomically: written to a temp file in the same
  directory, flushed and fsynced, ``os.replace``-d over the old one, then the directory is fsynced.
- ``path.journal``: one JSON line per change since the snapshot,
  ``{"crc":"<crc32 of entry bytes>","entry":{"seq": n, "op": ...}}``, fsynced per append.
- ``path.lock``: an advisory ``flock`` held while the store is open.

Why a journal: rewriting the whole snapshot per write costs O(number of tasks) (measured in
``benchmarks/bench_stores.py``); an append costs O(1). The journal is folded into the snapshot
when it holds as many entries as the store holds tasks (and at least ``compact_min_entries``),
so compaction stays O(1) amortised per write.

Crash safety: a crash mid-append leaves a torn last line, detected by its missing newline,
by zero bytes in or after it, or by framing that does not parse; it is ignored and cut off on
the next open. A last line that is whole and well-formed but fails its checksum is not what a
crash leaves behind (the newline is the last byte written): that is damage or a hand edit,
refused like any other bad line. A crash mid-snapshot leaves a stale temp file,
ignored and removed on the next open. A crash between replacing the snapshot and emptying the
journal is harmless: journal entries carry sequence numbers and those already in the snapshot
(``seq <= last_seq``) are skipped. Anything else that does not decode raises
:class:`~aiqsim.stores.base.StoreCorruptError` and leaves every file untouched.

Single process only: the lock makes a second process (or a second open in this process) fail
with :class:`~aiqsim.stores.base.StoreLockedError` instead of interleaving writes. Use
:class:`~aiqsim.stores.sqlite.SqliteStore` to share a store between processes.

``payload`` and ``result`` round-trip as JSON (tuples come back as lists, dict keys as strings).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import re
import zlib
from pathlib import Path
from typing import Any

from aiqsim.core.job import JobRecord, JobStatus
from aiqsim.core.task import TaskRecord, TaskStatus
from aiqsim.stores.base import (
    StoreClosedError,
    StoreCorruptError,
    StoreLockedError,
    claim_owner,
    record_from_stored,
)
from aiqsim.stores.job_store import claim_job_owner, job_from_stored

FORMAT = "aiqsim-taskstore"
VERSION = 2
READABLE_VERSIONS = (1, 2)
"""Version 2 adds ``jobs`` and ``job_owners`` (jobs, issue #15); a version-1 file reads as having no
jobs and is written as version 2 at its next compaction. A file from a newer aiqsim is refused."""
FILE_MODE = 0o600
DEFAULT_COMPACT_MIN_ENTRIES = 1000

_LINE = re.compile(rb'\{"crc":"([0-9a-f]{8})","entry":(.*)\}')
_OPS = frozenset({"insert", "claim", "update", "poison"})
_JOB_OPS = frozenset({"job_insert", "job_claim", "job_update"})
_OPS = _OPS | _JOB_OPS


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class JsonFileStore:
    """:class:`~aiqsim.stores.base.TaskStore` in a JSON snapshot plus journal (see module docs).

    Parameters:
        path: the snapshot file; created (empty store) if absent.
        fsync: fsync every append and snapshot (default). ``False`` is only for bulk loads
            and benchmarks' setup: a power loss may then lose recent writes.
        compact_min_entries: journal length below which no compaction happens.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync: bool = True,
        compact_min_entries: int = DEFAULT_COMPACT_MIN_ENTRIES,
    ) -> None:
        if compact_min_entries < 1:
            raise ValueError(f"compact_min_entries must be >= 1, got {compact_min_entries}")
        self.path = Path(path)
        self.journal_path = self.path.with_name(self.path.name + ".journal")
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.fsync = fsync
        self.compact_min_entries = compact_min_entries
        self._tasks: dict[str, TaskRecord] = {}
        self._owners: dict[str, str] = {}
        self._poison: dict[str, tuple[str, float]] = {}
        self._jobs: dict[str, JobRecord] = {}
        self._job_owners: dict[str, str] = {}
        self._seq = 0
        self._journal_entries = 0
        self._journal_size = 0
        self._journal_fd: int | None = None
        self._closed = False
        self.torn_tail_recovered = False
        """True when opening found (and cut off) an incomplete last journal line."""
        self.stale_temp_files_removed = 0
        """Temp files of an interrupted snapshot write found (and removed) on open."""
        self.last_compaction_error: OSError | None = None
        """Why the last automatic compaction failed (e.g. disk full); the journal keeps growing meanwhile."""
        self._compact_deferred_to = 0
        self._lock_fd: int | None = self._acquire_lock()
        try:
            self._open()
        except BaseException:
            self._release()
            raise

    # ------------------------------------------------------------------ crash injection
    @staticmethod
    def leave_torn_write(path: str | Path) -> list[Path]:
        """Leave on disk what a process killed in the middle of a write leaves: a half-written
        snapshot temp file and an incomplete last journal line. For crash-injection tests and
        simulations; call it only while no store has ``path`` open. Returns the files touched.

        The next :class:`JsonFileStore` opened on ``path`` must ignore and clean both.
        """
        path = Path(path)
        temp = path.with_name(f".{path.name}.tmp-0")
        temp.write_text('{"format": "aiqsim-taskstore", "version": 1, "tasks": [{"id": "', encoding="utf-8")
        journal = path.with_name(path.name + ".journal")
        with open(journal, "a", encoding="utf-8") as handle:
            handle.write('{"seq": 999999999, "op": "update", "task": {"id": "torn')
        return [temp, journal]

    # ------------------------------------------------------------------ opening
    def _acquire_lock(self) -> int:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise StoreLockedError(
                f"{self.path}: already open in another process (pid {holder}) or another JsonFileStore; "
                f"the JSON store is single-process (lock file {self.lock_path}). "
                "Use SqliteStore to share a store between processes."
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _temp_files(self) -> list[Path]:
        return sorted(self.path.parent.glob(f".{glob.escape(self.path.name)}.tmp-*"))

    def _open(self) -> None:
        for stale in self._temp_files():  # we hold the lock: no other writer can own them
            stale.unlink(missing_ok=True)
            self.stale_temp_files_removed += 1
        if not self.path.exists():
            if self.journal_path.exists() and self.journal_path.stat().st_size > 0:
                raise StoreCorruptError(
                    f"{self.journal_path}: journal present but snapshot {self.path} is missing; "
                    "refusing to start from a partial history"
                )
            self._write_snapshot()
        else:
            self._load_snapshot()
        valid_length = self._replay_journal()
        fd = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
        self._journal_fd = fd
        if self.torn_tail_recovered:
            os.ftruncate(fd, valid_length)
            os.fsync(fd)
        self._journal_size = valid_length
        if self.fsync:
            _fsync_directory(self.path.parent)

    def _corrupt(self, where: Path, problem: str) -> StoreCorruptError:
        return StoreCorruptError(f"{where}: {problem}; the file was left untouched")

    def _read(self, where: Path) -> bytes:
        try:
            return where.read_bytes()
        except OSError as error:
            raise self._corrupt(where, f"cannot be read ({error.strerror or error})") from error

    def _load_snapshot(self) -> None:
        raw = self._read(self.path)
        if not raw.strip():
            raise self._corrupt(self.path, "empty file (truncated?)")
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise self._corrupt(self.path, f"not valid JSON, truncated or hand-edited ({error})") from error
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
            raise self._corrupt(
                self.path, f"not an aiqsim task store (format {found!r}, expected {FORMAT!r})"
            )
        version = doc.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version not in READABLE_VERSIONS:
            newer = isinstance(version, int) and version > VERSION
            hint = " (written by a newer aiqsim)" if newer else ""
            raise self._corrupt(
                self.path, f"unsupported version {version!r}{hint}; this build reads {VERSION}"
            )
        tasks, owners, poison, last_seq = (
            doc.get(name) for name in ("tasks", "owners", "poison", "last_seq")
        )
        if not isinstance(tasks, list) or not isinstance(owners, dict) or not isinstance(poison, dict):
            raise self._corrupt(self.path, "'tasks' must be a list, 'owners' and 'poison' objects")
        if not isinstance(last_seq, int) or isinstance(last_seq, bool) or last_seq < 0:
            raise self._corrupt(self.path, f"'last_seq' must be a non-negative integer, got {last_seq!r}")
        for index, data in enumerate(tasks):
            record = record_from_stored(data, f"{self.path}: tasks[{index}]")
            if record.id in self._tasks:
                raise self._corrupt(self.path, f"task id {record.id!r} appears twice")
            self._tasks[record.id] = record
        for key, owner_id in owners.items():
            owner = self._tasks.get(owner_id) if isinstance(owner_id, str) else None
            if owner is None or owner.key != key:
                raise self._corrupt(
                    self.path, f"key {key!r} is owned by {owner_id!r}, not a task with that key"
                )
            self._owners[key] = owner_id
        for key, entry in poison.items():
            self._poison[key] = self._poison_value(entry, self.path)
        self._seq = last_seq
        self._load_jobs(doc)

    def _load_jobs(self, doc: dict[str, Any]) -> None:
        """The job table of a version-2 snapshot (absent in version 1: no jobs)."""
        jobs, owners = doc.get("jobs", []), doc.get("job_owners", {})
        if not isinstance(jobs, list) or not isinstance(owners, dict):
            raise self._corrupt(self.path, "'jobs' must be a list and 'job_owners' an object")
        for index, data in enumerate(jobs):
            job = job_from_stored(data, f"{self.path}: jobs[{index}]")
            if job.id in self._jobs:
                raise self._corrupt(self.path, f"job id {job.id!r} appears twice")
            self._jobs[job.id] = job
        for key, owner_id in owners.items():
            owner = self._jobs.get(owner_id) if isinstance(owner_id, str) else None
            if owner is None or owner.key != key:
                raise self._corrupt(
                    self.path, f"job key {key!r} is owned by {owner_id!r}, not a job with that key"
                )
            self._job_owners[key] = owner_id

    def _poison_value(self, entry: Any, where: Path) -> tuple[str, float]:
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("error"), str)
            or not isinstance(entry.get("recorded_at"), int | float)
            or isinstance(entry.get("recorded_at"), bool)
        ):
            raise self._corrupt(where, f"invalid poison entry {entry!r}")
        return entry["error"], float(entry["recorded_at"])

    def _replay_journal(self) -> int:
        """Apply journal entries newer than the snapshot; return the length of the valid prefix."""
        if not self.journal_path.exists():
            return 0
        raw = self._read(self.journal_path)
        lines = raw.split(b"\n")
        complete, tail = lines[:-1], lines[-1]  # ``tail`` is what follows the last newline
        entries: list[tuple[dict[str, Any], int]] = []
        offset = 0
        for number, line in enumerate(complete, start=1):
            offset += len(line) + 1
            entry = self._parse_line(line)
            if entry is None:
                if number == len(complete) and not tail.strip(b"\0") and self._looks_torn(line, tail):
                    self.torn_tail_recovered = True  # a damaged last line: a crash mid-append
                    break
                raise self._corrupt(self.journal_path, f"line {number} fails its checksum or does not parse")
            entries.append((entry, offset))
        else:
            if tail:
                self.torn_tail_recovered = True  # an incomplete last line: a crash mid-append
        valid_length = entries[-1][1] if entries else 0
        previous: int | None = None
        for number, (entry, _) in enumerate(entries, start=1):
            seq = entry.get("seq")
            if (
                not isinstance(seq, int)
                or isinstance(seq, bool)
                or (previous is not None and seq != previous + 1)
            ):
                raise self._corrupt(self.journal_path, f"line {number}: sequence {seq!r} after {previous!r}")
            previous = seq
            if seq <= self._seq:
                continue  # already folded into the snapshot (crash between replace and truncate)
            if seq != self._seq + 1:
                raise self._corrupt(
                    self.journal_path, f"line {number}: sequence {seq} but the snapshot ends at {self._seq}"
                )
            try:
                self._apply(entry, f"{self.journal_path}: line {number}")
            except StoreCorruptError:
                raise
            except (KeyError, ValueError, TypeError) as error:
                raise self._corrupt(self.journal_path, f"line {number}: invalid entry ({error})") from error
            self._seq = seq
            self._journal_entries += 1
        return valid_length

    @staticmethod
    def _looks_torn(line: bytes, tail: bytes) -> bool:
        """Whether a bad last line is what an interrupted append leaves: zero-filled blocks in it or
        after it, or framing cut apart. A well-formed line with a wrong checksum is not."""
        if b"\0" in line or tail:
            return True
        match = _LINE.fullmatch(line)
        if match is None:
            return True
        try:
            json.loads(match.group(2))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return True
        return False

    @staticmethod
    def _parse_line(line: bytes) -> dict[str, Any] | None:
        match = _LINE.fullmatch(line)
        if match is None or int(match.group(1), 16) != zlib.crc32(match.group(2)):
            return None
        try:
            entry = json.loads(match.group(2))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None
        return entry if isinstance(entry, dict) and entry.get("op") in _OPS else None

    def _apply(self, entry: dict[str, Any], source: str) -> None:
        """Apply one journal entry to the in-memory state (replay and live writes alike)."""
        op = entry["op"]
        if op in _JOB_OPS:
            self._apply_job(entry, source)
            return
        if op in ("insert", "update"):
            record = record_from_stored(entry["task"], source)
            known = record.id in self._tasks
            if known == (op == "insert"):
                raise StoreCorruptError(
                    f"{source}: {op} of {'known' if known else 'unknown'} task {record.id!r}"
                )
            self._tasks[record.id] = record
            if op == "insert" and entry["owner"] is True:
                self._owners[record.key] = record.id
        elif op == "claim":
            owner = self._tasks.get(entry["owner_id"])
            if owner is None or owner.key != entry["key"]:
                raise StoreCorruptError(
                    f"{source}: claim of {entry['key']!r} by unknown task {entry['owner_id']!r}"
                )
            self._owners[owner.key] = owner.id
        else:
            if not isinstance(entry["key"], str):
                raise StoreCorruptError(f"{source}: poison key must be a string")
            self._poison[entry["key"]] = self._poison_value(entry, Path(source))

    def _apply_job(self, entry: dict[str, Any], source: str) -> None:
        """Apply one job journal entry (``job_insert``, ``job_update``, ``job_claim``)."""
        op = entry["op"]
        if op == "job_claim":
            owner = self._jobs.get(entry["owner_id"])
            if owner is None or owner.key != entry["key"]:
                raise StoreCorruptError(
                    f"{source}: claim of job key {entry['key']!r} by unknown job {entry['owner_id']!r}"
                )
            self._job_owners[owner.key] = owner.id
            return
        job = job_from_stored(entry["job"], source)
        known = job.id in self._jobs
        if known == (op == "job_insert"):
            raise StoreCorruptError(f"{source}: {op} of {'known' if known else 'unknown'} job {job.id!r}")
        self._jobs[job.id] = job
        if op == "job_insert" and entry["owner"] is True:
            self._job_owners[job.key] = job.id

    # ------------------------------------------------------------------ writing
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"{self.path}: store is closed")

    def _commit(self, entry: dict[str, Any]) -> None:
        """Durably append ``entry`` to the journal, then apply it in memory (never the other way round)."""
        self._check_open()
        assert self._journal_fd is not None
        seq = self._seq + 1
        body = _dumps({"seq": seq, **entry})  # may raise TypeError for a non-JSON payload: nothing written
        line = b'{"crc":"%08x","entry":%b}\n' % (zlib.crc32(body), body)
        try:
            _write_all(self._journal_fd, line)
            if self.fsync:
                os.fsync(self._journal_fd)
        except BaseException:
            with contextlib.suppress(OSError):  # take back a partial line so the next append is not glued on
                os.ftruncate(self._journal_fd, self._journal_size)
            raise
        self._journal_size += len(line)
        self._apply(json.loads(body), f"{self.journal_path}: seq {seq}")  # exactly what a reopen would see
        self._seq = seq
        self._journal_entries += 1
        if self._journal_entries >= max(
            self.compact_min_entries, len(self._tasks), self._compact_deferred_to
        ):
            try:
                self.compact()
            except OSError as error:  # the write itself is durable: report it as done, compact later
                self.last_compaction_error = error
                self._compact_deferred_to = 2 * self._journal_entries

    def _snapshot_document(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "last_seq": self._seq,
            "tasks": [record.to_dict() for record in self._tasks.values()],
            "owners": dict(self._owners),
            "poison": {key: {"error": e, "recorded_at": t} for key, (e, t) in self._poison.items()},
            "jobs": [job.to_dict() for job in self._jobs.values()],
            "job_owners": dict(self._job_owners),
        }

    def _write_snapshot(self) -> None:
        data = _dumps(self._snapshot_document()) + b"\n"
        temp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        temp.unlink(missing_ok=True)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        try:
            try:
                _write_all(fd, data)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, self.path)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        if self.fsync:
            _fsync_directory(self.path.parent)

    def compact(self) -> None:
        """Fold the journal into a new snapshot (atomic replace), then empty the journal."""
        self._check_open()
        assert self._journal_fd is not None
        self._write_snapshot()
        os.ftruncate(self._journal_fd, 0)
        if self.fsync:
            os.fsync(self._journal_fd)
        self._journal_size = 0
        self._journal_entries = 0
        self._compact_deferred_to = 0
        self.last_compaction_error = None

    # ------------------------------------------------------------------ TaskStore
    def insert_and_claim(self, task: TaskRecord) -> TaskRecord:
        self._check_open()
        if task.id in self._tasks:
            raise ValueError(f"task id {task.id!r} already exists")
        owner = claim_owner(self.owner_of(task.key), task)
        self._commit({"op": "insert", "task": task.to_dict(), "owner": owner is task})
        return owner

    def claim(self, task: TaskRecord) -> TaskRecord:
        self._check_open()
        if task.id not in self._tasks:
            raise KeyError(f"unknown task id {task.id!r}")
        if self._owners.get(task.key) == task.id:
            return self._tasks[task.id]
        owner = claim_owner(self.owner_of(task.key), task)
        if owner is task:
            self._commit({"op": "claim", "key": task.key, "owner_id": task.id})
        return owner

    def update(self, task: TaskRecord) -> None:
        self._check_open()
        if task.id not in self._tasks:
            raise KeyError(f"unknown task id {task.id!r}")
        self._commit({"op": "update", "task": task.to_dict()})

    def get(self, task_id: str) -> TaskRecord | None:
        self._check_open()
        return self._tasks.get(task_id)

    def owner_of(self, key: str) -> TaskRecord | None:
        self._check_open()
        owner_id = self._owners.get(key)
        return self._tasks.get(owner_id) if owner_id is not None else None

    def list_by_status(self, *statuses: TaskStatus) -> list[TaskRecord]:
        self._check_open()
        if not statuses:
            return list(self._tasks.values())
        wanted = set(statuses)
        return [record for record in self._tasks.values() if record.status in wanted]

    def record_poison(self, key: str, error: str, now: float) -> None:
        self._commit({"op": "poison", "key": key, "error": error, "recorded_at": now})

    def poison_error(self, key: str) -> str | None:
        self._check_open()
        entry = self._poison.get(key)
        return entry[0] if entry is not None else None

    # ------------------------------------------------------------------ JobStore
    def insert_and_claim_job(self, job: JobRecord) -> JobRecord:
        self._check_open()
        if job.id in self._jobs:
            raise ValueError(f"job id {job.id!r} already exists")
        owner = claim_job_owner(self.job_owner_of(job.key), job)
        self._commit({"op": "job_insert", "job": job.to_dict(), "owner": owner is job})
        return owner

    def claim_job(self, job: JobRecord) -> JobRecord:
        self._check_open()
        if job.id not in self._jobs:
            raise KeyError(f"unknown job id {job.id!r}")
        if self._job_owners.get(job.key) == job.id:
            return self._jobs[job.id]
        owner = claim_job_owner(self.job_owner_of(job.key), job)
        if owner is job:
            self._commit({"op": "job_claim", "key": job.key, "owner_id": job.id})
        return owner

    def update_job(self, job: JobRecord) -> None:
        self._check_open()
        if job.id not in self._jobs:
            raise KeyError(f"unknown job id {job.id!r}")
        self._commit({"op": "job_update", "job": job.to_dict()})

    def get_job(self, job_id: str) -> JobRecord | None:
        self._check_open()
        return self._jobs.get(job_id)

    def job_owner_of(self, key: str) -> JobRecord | None:
        self._check_open()
        owner_id = self._job_owners.get(key)
        return self._jobs.get(owner_id) if owner_id is not None else None

    def list_jobs(self, *statuses: JobStatus) -> list[JobRecord]:
        self._check_open()
        if not statuses:
            return list(self._jobs.values())
        wanted = set(statuses)
        return [job for job in self._jobs.values() if job.status in wanted]

    def close(self) -> None:
        """Close the journal and release the lock (idempotent). Nothing is lost: every write is durable."""
        if self._closed:
            return
        self._closed = True
        self._release()

    def _release(self) -> None:
        if self._journal_fd is not None:
            os.close(self._journal_fd)
            self._journal_fd = None
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._lock_fd, 0)
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def __len__(self) -> int:
        return len(self._tasks)

    def __enter__(self) -> JsonFileStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._tasks)} tasks"
        return f"<JsonFileStore {self.path} {state}>"
