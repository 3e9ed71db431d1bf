"""The task store protocol shared by the in-memory, JSON-file and SQLite stores.

Store calls are synchronous and short: both runtimes are single-threaded and a store
write is one transaction. Every method that changes state is atomic on its own.

Group commit: a store whose :attr:`TaskStore.deferred_commit` is true stages its writes and
makes them durable together in :meth:`TaskStore.flush` (one transaction, one fsync). A caller
must then acknowledge a change (resolve a submission, report a task done) only after the flush
that covers it returned. A store that commits every write on its own has
``deferred_commit = False`` and a ``flush()`` that returns 0.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from aiqsim.core.errors import ConfigurationError, StoreError
from aiqsim.core.fingerprint import is_unicode_text
from aiqsim.core.task import Priority, TaskRecord, TaskStatus

LIVE_OWNER_STATUSES = frozenset({TaskStatus.QUEUED, TaskStatus.RUNNING, TaskStatus.SUCCEEDED})
"""An owner in one of these states keeps its key; a failed or cancelled owner gives it up."""


class StoreCorruptError(StoreError, RuntimeError):
    """A state file that cannot be trusted. The file is left untouched."""


class StoreLockedError(StoreError, RuntimeError):
    """Another process holds a single-process store (e.g. a JSON state file) open."""


class StoreOpenError(StoreError, OSError):
    """A store file that cannot be created at the path the caller gave (a missing folder, no
    permission to write in it). Nothing was written; the message names that path."""


class StoreAccessError(StoreOpenError, PermissionError):
    """The store's files cannot be read or written by this process (permissions, read-only file
    system). Raised when the store is opened, before anything is written; the message names
    the path and what is missing. A ``PermissionError`` too, which is what callers saw before."""


class StoreClosedError(StoreError, RuntimeError):
    """A store was used after :meth:`TaskStore.close`."""


class DuplicateTaskIdError(ConfigurationError):
    """A task (or job) id that the store already holds, e.g. ``submit(task_id=...)`` given an id in
    use. Nothing was stored. A ``ValueError`` too (a :class:`ConfigurationError`), which is what
    callers saw before. Every store raises this one class, so every store says the same."""

    def __init__(self, kind: str, record_id: str) -> None:
        self.kind = kind
        """``"task"`` or ``"job"``."""
        self.record_id = record_id
        super().__init__(
            f"{kind} id {record_id!r} already exists in the store; nothing was stored "
            f"(a {kind} id must be unique: pass another id, or none to get a fresh one)"
        )

    def __reduce__(self) -> tuple[type[DuplicateTaskIdError], tuple[str, str]]:
        return type(self), (self.kind, self.record_id)  # picklable across processes


def checked_store_path(path: Any, store: str) -> Path:
    """``path`` as a :class:`~pathlib.Path`: a non-empty ``str`` or ``os.PathLike`` with no NUL
    character; anything else (``None``, ``""``, bytes) is a ConfigurationError naming the store's
    argument instead of whatever pathlib or sqlite3 would raise about it."""
    if isinstance(path, str | os.PathLike):
        text = os.fspath(path)
        if isinstance(text, str) and text and "\x00" not in text:
            return Path(text)
    raise ConfigurationError(
        f"{store}: path: expected the path of a file (a non-empty string or os.PathLike, with no NUL "
        f"character), got {path!r}; the store was not opened"
    )


def check_store_location(path: Path) -> None:
    """Raise :class:`StoreOpenError` naming ``path`` unless its folder exists; writable for a new file.

    Called before a store creates anything, so the error names the user's path rather than a
    temp or lock file the store would have created next to it.
    """
    folder = path.parent
    try:
        if not folder.is_dir():
            problem = "does not exist" if not folder.exists() else "is not a directory"
            raise StoreOpenError(f"{path}: cannot create the store: the folder {folder} {problem}")
        exists = path.exists()
    except PermissionError as error:  # a folder on the way that this process may not search
        raise StoreAccessError(
            f"{path}: cannot open the store: no permission to look in {folder} ({error.strerror or error})"
        ) from error
    if not exists and not os.access(folder, os.W_OK | os.X_OK):
        raise StoreAccessError(f"{path}: cannot create the store: no permission to write in {folder}")


class UnstorableValueError(ConfigurationError, TypeError):
    """A record holds a value that a durable store keeps as JSON and JSON cannot hold (bytes, a set,
    an object): nothing was written. A payload is refused by ``submit``; a provider's result that
    cannot be stored fails its task with this error (the call itself was made)."""


def store_json(value: Any, what: str) -> str:
    """The compact JSON text durable stores keep for ``value`` (non-ASCII kept as is); a value JSON
    cannot hold raises :class:`UnstorableValueError` naming ``what`` (e.g. ``task 'a1' payload``)."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as error:
        raise UnstorableValueError(
            f"{what} cannot be stored: {error}. A durable store keeps payloads and results as JSON "
            "(strings, numbers, booleans, null, lists and dicts with string keys); nothing was written"
        ) from None


def unencodable_text(what: str, error: UnicodeEncodeError) -> UnstorableValueError:
    """The error for text a durable store cannot encode (a lone surrogate such as ``"\\ud800"``,
    which Python strings may hold and UTF-8 may not): nothing was written."""
    return UnstorableValueError(
        f"{what} cannot be stored: {error.object[error.start : error.end]!r} is not valid Unicode text "
        "(a lone surrogate); nothing was written"
    )


def is_one_of(value: Any, allowed: frozenset[Any]) -> bool:
    """``value in allowed`` for a value read from a file: one that cannot be hashed (a list, a dict
    where a status or a number was expected) is simply not one of them."""
    try:
        return value in allowed
    except TypeError:
        return False


class StoreWriteError(StoreError, OSError):
    """A store write failed (disk full, read-only file, I/O error): the change was NOT persisted.

    ``what`` says which change was lost (e.g. ``"task 'a1' running -> succeeded"``) and
    ``__cause__`` holds the underlying error. Nothing the error names is durable, so a caller
    must not report it done.
    """

    headline = "store write failed, not persisted"
    """The message's first words: what a reader may conclude about the change."""

    def __init__(self, what: str, cause: BaseException | None = None) -> None:
        self.what = what
        detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        super().__init__(f"{self.headline}: {what}{detail}")


class StoreWriteOutcomeUnknownError(StoreWriteError):
    """A write whose ``COMMIT`` was sent but whose answer was lost, and whose outcome the store
    could not learn afterwards (the server stayed out of reach): it may or may not be persisted.

    Handled as a :class:`StoreWriteError` (the caller must not report the change done); the
    store's rows say what happened, and recovery reconciles from them.
    """

    headline = "store write's outcome unknown (it may or may not be persisted)"


@runtime_checkable
class TaskStore(Protocol):
    """Durable (or not) home of task records.

    ``insert_and_claim`` is the idempotency primitive: it stores a new task and, in the same
    atomic step, makes it the owner of its key unless a live owner already exists, returning
    the key's owner either way. Two processes racing on one key get exactly one owner.
    """

    def insert_and_claim(self, task: TaskRecord) -> TaskRecord:
        """Insert ``task``; return the owner of ``task.key`` (``task`` itself if it won the claim)."""
        ...

    def claim(self, task: TaskRecord) -> TaskRecord:
        """Claim ``task.key`` for an already stored task unless a live owner exists; return the owner."""
        ...

    def update(self, task: TaskRecord) -> None:
        """Persist a changed record (status, result and error together, in one step)."""
        ...

    def get(self, task_id: str) -> TaskRecord | None: ...

    def owner_of(self, key: str) -> TaskRecord | None:
        """The task that owns ``key``, if any."""
        ...

    def list_by_status(self, *statuses: TaskStatus) -> list[TaskRecord]:
        """Records in any of ``statuses`` (all records when none given), in insertion order."""
        ...

    def record_poison(self, key: str, error: str, now: float) -> None:
        """Remember that ``key``'s input poisons the provider; survives restarts."""
        ...

    def poison_error(self, key: str) -> str | None:
        """The recorded poison error for ``key``, if any."""
        ...

    deferred_commit: bool
    """True when writes are staged until :meth:`flush` (``SqliteStore(group_commit=True)``);
    False when every write method is durable when it returns (every other store)."""

    def flush(self) -> int:
        """Make every staged write durable in one transaction; return how many writes it covered.

        Returns 0 without doing anything when :attr:`deferred_commit` is false. On failure
        nothing staged is kept and :class:`StoreWriteError` names what was lost.
        """
        ...

    def purge(self, now: float, *, finished_older_than_s: float, keys_older_than_s: float) -> PurgeReport:
        """Delete finished tasks and jobs and their expired idempotency keys in one transaction
        (see :func:`plan_purge`)."""
        ...

    def close(self) -> None:
        """Release the store; a deferred store flushes first (``close(flush=False)`` drops staged writes)."""
        ...


MAX_DESCRIBED_WRITES = 5
"""How many lost writes :func:`describe_writes` names one by one before it only counts."""


def describe_writes(whats: list[str]) -> str:
    """Name a batch of writes for an error message: ``"3 staged writes: a; b; c"`` (long lists cut)."""
    if len(whats) == 1:
        return whats[0]
    shown = "; ".join(whats[:MAX_DESCRIBED_WRITES])
    more = f"; and {len(whats) - MAX_DESCRIBED_WRITES} more" if len(whats) > MAX_DESCRIBED_WRITES else ""
    return f"{len(whats)} staged writes: {shown}{more}"


def claim_owner(current_owner: TaskRecord | None, candidate: TaskRecord) -> TaskRecord:
    """The claim rule all stores share: a live owner keeps the key, otherwise the candidate takes it."""
    if current_owner is not None and current_owner.status in LIVE_OWNER_STATUSES:
        return current_owner
    return candidate


def count_by_status(records: Iterable[TaskRecord]) -> dict[TaskStatus, int]:
    """How many records are in each status (every status present, zero included)."""
    counts = dict.fromkeys(TaskStatus, 0)
    for record in records:
        counts[record.status] += 1
    return counts


_TEXT_FIELDS = ("id", "key", "kind", "provider")
_NUMBER_FIELDS = ("cost_estimate", "created_at", "updated_at")
_OPTIONAL_NUMBER_FIELDS = ("started_at", "finished_at")
_OPTIONAL_TEXT_FIELDS = ("error", "deduped_from", "worker", "tenant", "route")
_STATUS_VALUES = frozenset(status.value for status in TaskStatus)
_PRIORITY_VALUES = frozenset(int(priority) for priority in Priority)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)


def _holds_only_unicode_text(value: Any) -> bool:
    """Whether every str in ``value`` (JSON-decoded: dicts, lists, text, numbers), dict keys
    included, has a UTF-8 form. Iterative: a deeply nested payload cannot exhaust the stack."""
    pending = [value]
    while pending:
        value = pending.pop()
        kind = type(value)
        if kind is str:
            if not (value.isascii() or is_unicode_text(value)):
                return False
        elif kind is dict:
            for key, item in value.items():
                if type(key) is str and not (key.isascii() or is_unicode_text(key)):
                    return False
                if type(item) is str:
                    if not (item.isascii() or is_unicode_text(item)):
                        return False
                elif type(item) is dict or type(item) is list:
                    pending.append(item)
        elif kind is list:
            pending.extend(value)
    return True


def _path_to_bad_text(value: Any, path: str) -> str:
    """The path (``'payload'['a'][0]``) to the first text without a UTF-8 form in ``value``."""
    if type(value) is dict:
        for key, item in value.items():
            if type(key) is str and not is_unicode_text(key):
                return f"{path} (a key)"
            if not _holds_only_unicode_text(item):
                return _path_to_bad_text(item, f"{path}[{key!r}]")
    elif type(value) is list:
        for index, item in enumerate(value):
            if not _holds_only_unicode_text(item):
                return _path_to_bad_text(item, f"{path}[{index}]")
    return path


def unicode_text_problem(data: dict[str, Any]) -> str | None:
    """Where a decoded record holds text with no UTF-8 form (``None`` when it holds none).

    A JSON escape can spell a lone surrogate (``"\\ud800"``), which ``json.loads`` turns into a
    str that no store can write back: a record holding one anywhere (a key, an error, a payload's
    nested value or dict key) would open, and then fail the next compaction or update of it. No
    write of ours can put one there (every write encodes first), so it is corruption, refused when
    read; the message names the field and the path to the text."""
    if _holds_only_unicode_text(data):
        return None
    for name, value in data.items():
        if not _holds_only_unicode_text(value):
            where = _path_to_bad_text(value, repr(name))
            return f"field {where} is not valid Unicode text (a lone surrogate)"
    return "a field name is not valid Unicode text (a lone surrogate)"


def record_problem(data: Any) -> str | None:
    """Why ``data`` is not a valid stored task record (``None`` when it is).

    Stricter than :meth:`TaskRecord.from_dict`, which coerces: a durable store must refuse a
    hand-edited ``"id": 7`` or ``"status": "done"`` instead of silently reinterpreting it.
    """
    if not isinstance(data, dict):
        return f"a task record must be a JSON object, got {type(data).__name__}"
    for name in _TEXT_FIELDS:
        if not isinstance(data.get(name), str) or not data[name]:
            return f"field {name!r} must be a non-empty string, got {data.get(name)!r}"
    if not is_one_of(data.get("status"), _STATUS_VALUES):
        return f"invalid status {data.get('status')!r} (expected one of {sorted(_STATUS_VALUES)})"
    priority = data.get("priority")
    if isinstance(priority, bool) or not is_one_of(priority, _PRIORITY_VALUES):
        return f"invalid priority {priority!r} (expected one of {sorted(_PRIORITY_VALUES)})"
    attempts = data.get("attempts")
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 0:
        return f"field 'attempts' must be a non-negative integer, got {attempts!r}"
    for name in _NUMBER_FIELDS:
        if not _is_number(data.get(name)):
            return f"field {name!r} must be a number, got {data.get(name)!r}"
    for name in _OPTIONAL_NUMBER_FIELDS:
        if data.get(name) is not None and not _is_number(data[name]):
            return f"field {name!r} must be a number or null, got {data[name]!r}"
    for name in _OPTIONAL_TEXT_FIELDS:
        if data.get(name) is not None and not isinstance(data[name], str):
            return f"field {name!r} must be a string or null, got {data[name]!r}"
    return unicode_text_problem(data)


def record_from_stored(data: Any, source: str) -> TaskRecord:
    """Decode a stored record strictly; raise :class:`StoreCorruptError` naming ``source`` if invalid."""
    problem = record_problem(data)
    if problem is not None:
        task_id = data.get("id") if isinstance(data, dict) else None
        where = f"{source}: task {task_id!r}" if isinstance(task_id, str) else source
        raise StoreCorruptError(f"{where}: {problem}")
    return TaskRecord.from_dict(data)


# ---------------------------------------------------------------------------- retention
@dataclass(frozen=True)
class PurgeCandidate:
    """What the retention rule needs to know about one finished task or job (no payload, no result).

    Jobs are candidates of the very same shape (a job has an id, an idempotency key, the task
    status vocabulary and ``finished_at``), so one rule, :func:`plan_purge`, decides for both."""

    task_id: str
    """The record's id: a task's, or a job's when the candidates are jobs."""
    key: str
    status: TaskStatus
    finished_at: float
    """When it reached its terminal state (``updated_at`` for records that lack ``finished_at``)."""
    owns_key: bool
    """Whether the store's key table names this task as its key's owner."""


@dataclass(frozen=True)
class PurgePlan:
    """What one purge deletes: task rows and ``(key, owner_id)`` ownership entries."""

    task_ids: tuple[str, ...]
    """The records to delete (job ids when the candidates were jobs)."""
    keys: tuple[tuple[str, str], ...]
    kept_for_keys: int
    """Records past the finished TTL kept because they own a key still within its TTL."""


EMPTY_PURGE_PLAN = PurgePlan(task_ids=(), keys=(), kept_for_keys=0)
"""Nothing to delete: the job plan of a store that holds no jobs."""


@dataclass(frozen=True)
class PurgeReport:
    """The outcome of one :meth:`TaskStore.purge` (all of it committed in one transaction).

    ``keys_removed`` and ``kept_for_keys`` count task keys and tasks; ``jobs_removed`` and
    ``job_keys_removed`` count job records and job keys deleted by the same rule in the same
    transaction (0 by default, so a report built without them still reads as before)."""

    now: float
    finished_older_than_s: float
    keys_older_than_s: float
    tasks_removed: int
    keys_removed: int
    kept_for_keys: int
    jobs_removed: int = 0
    job_keys_removed: int = 0


def check_purge_ttls(finished_older_than_s: float, keys_older_than_s: float) -> None:
    """Refuse a TTL that is negative or NaN (``ConfigurationError``) before anything is read.

    ``math.inf`` is allowed and means "never" (e.g. keep idempotency keys forever)."""
    for name, value in (
        ("finished_older_than_s", finished_older_than_s),
        ("keys_older_than_s", keys_older_than_s),
    ):
        if not (_is_number(value) and value >= 0):
            raise ConfigurationError(f"{name} must be a number of seconds >= 0 (inf: never), got {value!r}")


def plan_purge(
    candidates: Iterable[PurgeCandidate],
    *,
    now: float,
    finished_older_than_s: float,
    keys_older_than_s: float,
) -> PurgePlan:
    """The retention rule every store applies (pure: the store supplies ``candidates`` and ``now``).

    Like Celery's ``result_expires``, with idempotency keys on a clock of their own:

    - only terminal tasks (succeeded, failed, cancelled, deduped) are ever deleted; queued and
      running tasks, and so every live owner's key, are never touched, whatever their age;
    - a succeeded task that owns its key is what a duplicate submission is answered from, so the
      key and that task are kept until the key is ``keys_older_than_s`` old, even past
      ``finished_older_than_s``; after that a duplicate runs (and bills) again;
    - every other terminal task (duplicates, failed or cancelled owners, whose key a new
      submission may take anyway) goes once it is ``finished_older_than_s`` old, with its key;
    - poison records are not candidates: a poisoned input stays refused.

    Age is ``now - finished_at``; a task stamped after ``now`` (another clock origin) is kept.

    Jobs go by the same rule, in the same purge call: a store passes its job records as candidates
    (:func:`purge_candidate` takes a job as well as a task) and gets a plan of job ids and job keys.
    A succeeded job that owns its key answers duplicate job submissions until the key TTL.
    """
    check_purge_ttls(finished_older_than_s, keys_older_than_s)
    task_ids: list[str] = []
    keys: list[tuple[str, str]] = []
    kept_for_keys = 0
    for candidate in candidates:
        if not candidate.status.is_terminal:
            continue
        age = now - candidate.finished_at
        task_expired = age >= finished_older_than_s
        if candidate.owns_key and candidate.status in LIVE_OWNER_STATUSES:
            if age < keys_older_than_s:
                kept_for_keys += int(task_expired)
                continue
            keys.append((candidate.key, candidate.task_id))
        elif candidate.owns_key and task_expired:
            keys.append((candidate.key, candidate.task_id))
        if task_expired:
            task_ids.append(candidate.task_id)
    return PurgePlan(task_ids=tuple(task_ids), keys=tuple(keys), kept_for_keys=kept_for_keys)


class Purgeable(Protocol):
    """What :func:`purge_candidate` reads from a record: a :class:`TaskRecord` or a
    :class:`~aiqsim.core.job.JobRecord` (both have these fields)."""

    @property
    def id(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def status(self) -> TaskStatus: ...
    @property
    def finished_at(self) -> float | None: ...
    @property
    def updated_at(self) -> float: ...


def purge_candidate(record: Purgeable, owns_key: bool) -> PurgeCandidate:
    """The :class:`PurgeCandidate` for a stored task or job record."""
    finished = record.finished_at if record.finished_at is not None else record.updated_at
    return PurgeCandidate(record.id, record.key, record.status, finished, owns_key)


def plan_in_memory_purge(
    tables: Iterable[tuple[Iterable[Purgeable], Mapping[str, str]]],
    *,
    now: float,
    finished_older_than_s: float,
    keys_older_than_s: float,
) -> list[PurgePlan]:
    """:func:`plan_purge` for each ``(records, key owners)`` table of a store that keeps them in
    memory (the memory and JSON-file stores: tasks, then jobs). Every plan is made before the
    caller deletes anything, so a bad TTL changes nothing."""
    return [
        plan_purge(
            purge_candidates(records, owners),
            now=now,
            finished_older_than_s=finished_older_than_s,
            keys_older_than_s=keys_older_than_s,
        )
        for records, owners in tables
    ]


def purge_candidates(records: Iterable[Purgeable], owners: Mapping[str, str]) -> Iterator[PurgeCandidate]:
    """The candidates of :func:`plan_purge` in a store that keeps its records and its key owners
    (key -> owning id) in memory, as the memory and JSON-file stores do: every terminal task (or
    job, given the job records and the job key owners), with whether it owns its key."""
    for record in records:
        if record.status.is_terminal:
            yield purge_candidate(record, owners.get(record.key) == record.id)


def purge_report(
    plan: PurgePlan,
    now: float,
    finished_older_than_s: float,
    keys_older_than_s: float,
    job_plan: PurgePlan = EMPTY_PURGE_PLAN,
) -> PurgeReport:
    """The report of a purge that applied ``plan`` to the tasks and ``job_plan`` to the jobs."""
    return PurgeReport(
        now=now,
        finished_older_than_s=finished_older_than_s,
        keys_older_than_s=keys_older_than_s,
        tasks_removed=len(plan.task_ids),
        keys_removed=len(plan.keys),
        kept_for_keys=plan.kept_for_keys,
        jobs_removed=len(job_plan.task_ids),
        job_keys_removed=len(job_plan.keys),
    )
