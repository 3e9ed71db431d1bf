"""A single-process task store in a JSON snapshot plus an append-only, checksummed journal.

Layout next to ``path`` (all files mode 0600):

- ``path``: the snapshot, a versioned, checksummed JSON document (version 2)
  ``{"format":"aiqsim-taskstore","version":2,"crc":"<crc32 of the store bytes>","store":{"last_seq":N,
  "tasks":[...],"owners":{...},"poison":{...}}}``, written compactly in exactly that order so the
  checksum covers the ``store`` value's bytes as they are on disk; a flipped byte anywhere in it is
  refused instead of opening with an altered payload. Version 1 files (the same fields at the top
  level, no checksum) are still read; the next snapshot rewrites them as version 2. It is only ever
  replaced atomically: written to a temp file in the same directory, flushed and fsynced,
  ``os.replace``-d over the old one, then the directory is fsynced.
- ``path.journal``: one JSON line per change since the snapshot,
  ``{"crc":"<crc32 of entry bytes>","entry":{"seq": n, "op": ...}}``, fsynced per append.
- ``path.lock``: an advisory ``flock`` held while the store is open.

Why a journal: rewriting the whole snapshot per write costs O(number of tasks) (measured in
``benchmarks/bench_stores.py``); an append costs O(1). The journal is folded into the snapshot
when it holds as many entries as the store holds tasks (and at least ``compact_min_entries``),
so compaction stays O(1) amortised per write.

Crash safety: a crash mid-append leaves a torn last line: bytes after the last newline (the
newline is the last byte an append writes). Only that is ignored and cut off on the next open.
A line that ends with its newline was written whole, so if it fails its checksum or does not
parse -- the last line included -- that is damage or a hand edit, refused like any other bad
line (cutting it off would silently drop a task whose write had been acknowledged). A crash
mid-snapshot leaves a stale temp file,
ignored and removed on the next open. A crash between replacing the snapshot and emptying the
journal is harmless: journal entries carry sequence numbers and those already in the snapshot
(``seq <= last_seq``) are skipped. Anything else that does not decode raises
:class:`~aiqsim.stores.base.StoreCorruptError` and leaves every file untouched.

Write failures (disk full, read-only file, I/O error) raise
:class:`~aiqsim.stores.base.StoreWriteError` naming the change that was not persisted; a partial
line is taken back, nothing changes in memory, and the next write succeeds once the cause is
gone. A store whose directory or journal this process cannot write or read is refused at open
with :class:`~aiqsim.stores.base.StoreAccessError`.

Not protected against: deleting ``path.journal`` (or replacing the snapshot) behind a running
store's back. The store keeps appending to the unlinked journal, and the next open finds no
journal and silently misses every write since the last snapshot. No store can detect files
removed from under it by another program; do not clean a store's directory while it is open.

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
import numbers
import os
import re
import zlib
from pathlib import Path
from typing import Any

from aiqsim.core.errors import ConfigurationError, StoreError
from aiqsim.core.job import JobRecord, JobStatus
from aiqsim.core.task import TaskRecord, TaskStatus
from aiqsim.stores.base import (
    DuplicateTaskIdError,
    PurgeReport,
    StoreAccessError,
    StoreClosedError,
    StoreCorruptError,
    StoreLockedError,
    StoreWriteError,
    check_store_location,
    checked_store_path,
    claim_owner,
    is_one_of,
    plan_in_memory_purge,
    purge_report,
    record_from_stored,
    store_json,
    unencodable_text,
)
from aiqsim.stores.job_store import claim_job_owner, job_from_stored

FORMAT = "aiqsim-taskstore"
VERSION = 2
READABLE_VERSIONS = (1, 2)
"""Snapshot versions this build opens: 1 (no checksum) and 2 (checksummed, written by this build).
A ``store`` may hold ``jobs`` and ``job_owners`` (jobs); without them it holds no jobs."""
FILE_MODE = 0o600
DEFAULT_COMPACT_MIN_ENTRIES = 1000

_LINE = re.compile(rb'\{"crc":"([0-9a-f]{8})","entry":(.*)\}')
_SNAPSHOT_PREFIX = b'{"format":"%s","version":%d,"crc":"' % (FORMAT.encode(), VERSION)
_SNAPSHOT = re.compile(re.escape(_SNAPSHOT_PREFIX) + rb'([0-9a-f]{8})","store":(.*)\}\n?', re.DOTALL)
_OPS = frozenset({"insert", "claim", "update", "poison", "purge"})
_JOB_OPS = frozenset({"job_insert", "job_claim", "job_update"})
_OPS = _OPS | _JOB_OPS


def _dumps(value: Any, what: str = "the store") -> bytes:
    text = store_json(value, what)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise unencodable_text(what, error) from None


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
        fsync: fsync every append and snapshot (default). ``False`` is for bulk loads, benchmarks'
            setup and simulations (which model process crashes, not power loss): a power loss may
            then lose recent writes; a killed process loses nothing the store returned from.
        compact_min_entries: journal length below which no compaction happens (a whole number >= 1;
            anything else raises :class:`~aiqsim.core.errors.ConfigurationError` before any file is
            touched).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync: bool = True,
        compact_min_entries: int = DEFAULT_COMPACT_MIN_ENTRIES,
    ) -> None:
        if (
            isinstance(compact_min_entries, bool)
            or not isinstance(compact_min_entries, numbers.Integral)
            or compact_min_entries < 1
        ):
            raise ConfigurationError(
                "compact_min_entries: expected a whole number >= 1 (journal entries before a compaction), "
                f"got {compact_min_entries!r}; the store was not opened"
            )
        self.path = checked_store_path(path, "JsonFileStore")
        check_store_location(self.path)
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
        self.deferred_commit = False
        """Every write is appended and fsynced before its method returns; :meth:`flush` returns 0."""
        self.torn_tail_recovered = False
        """True when opening found (and cut off) an incomplete last journal line."""
        self.stale_temp_files_removed = 0
        """Temp files of an interrupted snapshot write found (and removed) on open."""
        self.last_compaction_error: OSError | None = None
        """Why the last automatic compaction failed (e.g. disk full); the journal keeps growing meanwhile."""
        self._compact_deferred_to = 0
        self._journal_needs_cut = False
        """A failed append's partial line could not be taken back yet; cut before the next append."""
        self._lock_fd: int | None = None
        try:
            self._lock_fd = self._acquire_lock()
            self._check_writable()
            self._open()
        except StoreError:
            self._release()
            raise
        except PermissionError as error:
            self._release()
            raise StoreAccessError(
                f"{self.path}: cannot open the store ({error.strerror or error}: {error.filename}); "
                "nothing was written"
            ) from error
        except OSError as error:
            self._release()
            raise StoreWriteError(f"opening the store at {self.path}", error) from error
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
        try:  # the holder's pid is only a hint for the error above: a full disk must not stop the open
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass
        return fd

    def _check_writable(self) -> None:
        """Refuse, before anything is read or written, a store this process could not keep writing:
        the snapshot is replaced through a temp file in its directory, so that must be writable."""
        effective = os.access in os.supports_effective_ids
        directory = self.path.parent
        if not os.access(directory, os.W_OK | os.X_OK, effective_ids=effective):
            raise StoreAccessError(
                f"{self.path}: the store's directory {directory} is not writable by this process (snapshots "
                "are replaced through a temp file there); it was not opened. Fix the permissions."
            )
        for path in (self.path, self.journal_path):  # a file made read-only is not to be replaced either
            if path.exists() and not os.access(path, os.R_OK | os.W_OK, effective_ids=effective):
                raise StoreAccessError(
                    f"{path}: not writable by this process; the store was not opened and nothing was "
                    "written. Fix the permissions, or open a writable copy."
                )

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
        except PermissionError as error:
            raise StoreAccessError(
                f"{where}: cannot be read by this process ({error.strerror or error}); it was not opened"
            ) from error
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
        except RecursionError as error:  # json.loads recurses once per nesting level
            raise self._corrupt(
                self.path, "JSON nested too deeply for Python to read (hand-made or damaged?)"
            ) from error
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
            raise self._corrupt(
                self.path, f"not an aiqsim task store (format {found!r}, expected {FORMAT!r})"
            )
        version = doc.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version not in READABLE_VERSIONS:
            newer = isinstance(version, int) and not isinstance(version, bool) and version > VERSION
            hint = " (written by a newer aiqsim)" if newer else ""
            readable = " or ".join(map(str, READABLE_VERSIONS))
            raise self._corrupt(
                self.path, f"unsupported version {version!r}{hint}; this build reads {readable}"
            )
        if version >= 2:
            doc = self._checked_store(raw, doc)
            if not isinstance(doc, dict):
                raise self._corrupt(self.path, f"'store' must be an object, got {type(doc).__name__}")
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
        """The job table of a snapshot's store (absent in version 1 and in stores without jobs)."""
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

    def _checked_store(self, raw: bytes, doc: dict[str, Any]) -> Any:
        """The ``store`` object of a version-2 snapshot, once its checksum matches its bytes."""
        match = _SNAPSHOT.fullmatch(raw)
        if match is None:
            raise self._corrupt(
                self.path,
                "version 2 snapshot is not in its checksummed layout (reformatted or hand-edited?)",
            )
        expected, body = int(match.group(1), 16), match.group(2)
        if zlib.crc32(body) != expected:
            raise self._corrupt(
                self.path,
                f"checksum mismatch (crc32 {zlib.crc32(body):08x}, recorded {expected:08x}): damaged",
            )
        return doc.get("store")

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
                last = (
                    " (the last line, but it ends with its newline: written whole, so not a torn append)"
                    if number == len(complete)
                    else ""
                )
                raise self._corrupt(
                    self.journal_path, f"line {number} fails its checksum or does not parse{last}"
                )
            entries.append((entry, offset))
        if tail:
            self.torn_tail_recovered = True  # no newline yet: an append cut short by a crash
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
    def _parse_line(line: bytes) -> dict[str, Any] | None:
        match = _LINE.fullmatch(line)
        if match is None or int(match.group(1), 16) != zlib.crc32(match.group(2)):
            return None
        try:
            entry = json.loads(match.group(2))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):  # RecursionError: nested too deep
            return None
        return entry if isinstance(entry, dict) and is_one_of(entry.get("op"), _OPS) else None

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
        elif op == "purge":
            self._apply_purge(entry, source)
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

    def _apply_purge(self, entry: dict[str, Any], source: str) -> None:
        """Apply a purge entry, all or nothing: it may only name finished tasks and jobs and their own
        keys. ``jobs`` and ``job_keys`` are absent from entries written before jobs were purged."""
        tables = (
            ("task", entry["tasks"], entry["keys"], self._tasks, self._owners),
            ("job", entry.get("jobs", []), entry.get("job_keys", []), self._jobs, self._job_owners),
        )
        for kind, ids, keys, records, owners in tables:
            if not isinstance(ids, list) or not isinstance(keys, list):
                raise StoreCorruptError(f"{source}: purge entry needs lists of {kind}s and their keys")
            for record_id in ids:
                record = records.get(record_id) if isinstance(record_id, str) else None
                if record is None or not record.status.is_terminal:
                    raise StoreCorruptError(f"{source}: purge of unknown or unfinished {kind} {record_id!r}")
            for pair in keys:
                if not (isinstance(pair, list) and len(pair) == 2 and owners.get(pair[0]) == pair[1]):
                    raise StoreCorruptError(f"{source}: purge of key {pair!r} that {kind} does not own")
        for _, ids, keys, records, owners in tables:
            for key, _ in keys:
                del owners[key]
            for record_id in ids:
                del records[record_id]

    # ------------------------------------------------------------------ writing
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"{self.path}: store is closed")

    def _commit(self, entry: dict[str, Any], what: str) -> None:
        """Durably append ``entry`` to the journal, then apply it in memory (never the other way round).

        A failed append raises :class:`StoreWriteError` naming ``what``; its partial line is taken
        back (now or before the next append) and memory is unchanged, so the store stays usable.
        """
        self._check_open()
        assert self._journal_fd is not None
        seq = self._seq + 1
        body = _dumps(
            {"seq": seq, **entry}, what
        )  # a value JSON cannot hold: UnstorableValueError, nothing written
        line = b'{"crc":"%08x","entry":%b}\n' % (zlib.crc32(body), body)
        try:
            if self._journal_needs_cut:
                os.ftruncate(self._journal_fd, self._journal_size)
                self._journal_needs_cut = False
            _write_all(self._journal_fd, line)
            if self.fsync:
                os.fsync(self._journal_fd)
        except OSError as error:
            self._take_back_partial_line()
            raise StoreWriteError(what, error) from error
        except BaseException:
            self._take_back_partial_line()
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
            except StoreWriteError as error:  # the write itself is durable: report it as done, compact later
                self.last_compaction_error = error
                self._compact_deferred_to = 2 * self._journal_entries

    def _take_back_partial_line(self) -> None:
        """Cut the journal back to its last whole line so the next append is not glued onto a fragment."""
        assert self._journal_fd is not None
        try:
            os.ftruncate(self._journal_fd, self._journal_size)
        except OSError:
            self._journal_needs_cut = True  # retried before the next append, which fails if it still cannot

    def _snapshot_bytes(self) -> bytes:
        """The version-2 snapshot: format, version and checksum first, then the checksummed ``store``."""
        body = _dumps(
            {
                "last_seq": self._seq,
                "tasks": [record.to_dict() for record in self._tasks.values()],
                "owners": dict(self._owners),
                "poison": {key: {"error": e, "recorded_at": t} for key, (e, t) in self._poison.items()},
                "jobs": [job.to_dict() for job in self._jobs.values()],
                "job_owners": dict(self._job_owners),
            }
        )
        return b'%s%08x","store":%b}\n' % (_SNAPSHOT_PREFIX, zlib.crc32(body), body)

    def _write_snapshot(self) -> None:
        data = self._snapshot_bytes()
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
        """Fold the journal into a new snapshot (atomic replace), then empty the journal.

        Raises :class:`StoreWriteError` if the snapshot cannot be written; nothing is lost then
        (every write is still in the journal and the old snapshot is intact).
        """
        self._check_open()
        assert self._journal_fd is not None
        what = "compaction of the journal into a new snapshot (every write is still in the journal)"
        try:
            self._write_snapshot()
        except OSError as error:
            raise StoreWriteError(what, error) from error
        try:
            os.ftruncate(self._journal_fd, 0)
            if self.fsync:
                os.fsync(self._journal_fd)
        except OSError as error:  # the snapshot holds every entry: replay skips them (seq <= last_seq)
            self._journal_needs_cut = False
            self._journal_size = os.fstat(self._journal_fd).st_size
            raise StoreWriteError(
                "emptying the journal after a compaction (nothing is lost)", error
            ) from error
        self._journal_size = 0
        self._journal_entries = 0
        self._compact_deferred_to = 0
        self.last_compaction_error = None

    # ------------------------------------------------------------------ TaskStore
    def insert_and_claim(self, task: TaskRecord) -> TaskRecord:
        self._check_open()
        if task.id in self._tasks:
            raise DuplicateTaskIdError("task", task.id)
        owner = claim_owner(self.owner_of(task.key), task)
        self._commit(
            {"op": "insert", "task": task.to_dict(), "owner": owner is task},
            f"insert of task {task.id!r} ({task.status.value})",
        )
        return owner

    def claim(self, task: TaskRecord) -> TaskRecord:
        self._check_open()
        if task.id not in self._tasks:
            raise KeyError(f"unknown task id {task.id!r}")
        if self._owners.get(task.key) == task.id:
            return self._tasks[task.id]
        owner = claim_owner(self.owner_of(task.key), task)
        if owner is task:
            self._commit(
                {"op": "claim", "key": task.key, "owner_id": task.id},
                f"claim of key {task.key!r} by task {task.id!r}",
            )
        return owner

    def update(self, task: TaskRecord) -> None:
        self._check_open()
        if task.id not in self._tasks:
            raise KeyError(f"unknown task id {task.id!r}")
        self._commit(
            {"op": "update", "task": task.to_dict()}, f"update of task {task.id!r} to {task.status.value}"
        )

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
        self._commit(
            {"op": "poison", "key": key, "error": error, "recorded_at": now}, f"poison record for key {key!r}"
        )

    def poison_error(self, key: str) -> str | None:
        self._check_open()
        entry = self._poison.get(key)
        return entry[0] if entry is not None else None

    # ------------------------------------------------------------------ JobStore
    def insert_and_claim_job(self, job: JobRecord) -> JobRecord:
        self._check_open()
        if job.id in self._jobs:
            raise DuplicateTaskIdError("job", job.id)
        owner = claim_job_owner(self.job_owner_of(job.key), job)
        self._commit(
            {"op": "job_insert", "job": job.to_dict(), "owner": owner is job}, f"insert of job {job.id!r}"
        )
        return owner

    def claim_job(self, job: JobRecord) -> JobRecord:
        self._check_open()
        if job.id not in self._jobs:
            raise KeyError(f"unknown job id {job.id!r}")
        if self._job_owners.get(job.key) == job.id:
            return self._jobs[job.id]
        owner = claim_job_owner(self.job_owner_of(job.key), job)
        if owner is job:
            self._commit(
                {"op": "job_claim", "key": job.key, "owner_id": job.id}, f"claim of job key by {job.id!r}"
            )
        return owner

    def update_job(self, job: JobRecord) -> None:
        self._check_open()
        if job.id not in self._jobs:
            raise KeyError(f"unknown job id {job.id!r}")
        self._commit({"op": "job_update", "job": job.to_dict()}, f"job {job.id!r} -> {job.status.value}")

    def get_job(self, job_id: str) -> JobRecord | None:
        self._check_open()
        return self._jobs.get(job_id)

    def job_owner_of(self, key: str) -> JobRecord | None:
        self._check_open()
        owner_id = self._job_owners.get(key)
        return self._jobs.get(owner_id) if owner_id is not None else None

    def latest_job(self, name: str, version: str) -> JobRecord | None:
        """The job last stored under spec ``name`` and ``version``, if any
        (:func:`~aiqsim.stores.job_store.latest_job_of`)."""
        self._check_open()
        for job in reversed(self._jobs.values()):
            if job.name == name and job.version == version:
                return job
        return None

    def list_jobs(self, *statuses: JobStatus) -> list[JobRecord]:
        self._check_open()
        if not statuses:
            return list(self._jobs.values())
        wanted = set(statuses)
        return [job for job in self._jobs.values() if job.status in wanted]

    def purge(self, now: float, *, finished_older_than_s: float, keys_older_than_s: float) -> PurgeReport:
        """Delete finished tasks, finished jobs and expired keys by :func:`~aiqsim.stores.base.plan_purge`.

        The purge is one journal entry (one atomic append) naming the tasks, jobs and keys it
        deletes; a snapshot then folds it in so the space is given back (a failed compaction is
        kept in :attr:`last_compaction_error`).
        """
        self._check_open()
        plan, job_plan = plan_in_memory_purge(
            [(self._tasks.values(), self._owners), (self._jobs.values(), self._job_owners)],
            now=now,
            finished_older_than_s=finished_older_than_s,
            keys_older_than_s=keys_older_than_s,
        )
        if plan.task_ids or plan.keys or job_plan.task_ids or job_plan.keys:
            what = (
                f"purge of {len(plan.task_ids)} finished tasks and {len(plan.keys)} keys, "
                f"{len(job_plan.task_ids)} finished jobs and {len(job_plan.keys)} job keys"
            )
            entry: dict[str, Any] = {
                "op": "purge",
                "tasks": list(plan.task_ids),
                "keys": [list(k) for k in plan.keys],
            }
            if job_plan.task_ids or job_plan.keys:  # absent otherwise: the entry older builds wrote
                entry["jobs"] = list(job_plan.task_ids)
                entry["job_keys"] = [list(k) for k in job_plan.keys]
            self._commit(entry, what)
            if not self._closed and self._journal_entries:
                try:
                    self.compact()
                except StoreWriteError as error:  # the purge is durable; the space comes back later
                    self.last_compaction_error = error
        return purge_report(plan, now, finished_older_than_s, keys_older_than_s, job_plan)

    def flush(self) -> int:
        """Nothing is ever staged (each write is durable on return): returns 0."""
        self._check_open()
        return 0

    def close(self, *, flush: bool = True) -> None:
        """Close the journal and release the lock (idempotent). Nothing is lost: every write is durable.

        ``flush`` is accepted for the protocol's sake; there is never anything staged.
        """
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
