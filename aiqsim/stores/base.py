"""The task store protocol shared by the in-memory, JSON-file and SQLite stores.

Store calls are synchronous and short: both runtimes are single-threaded and a store
write is one transaction. Every method that changes state is atomic on its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from aiqsim.core.task import TaskRecord, TaskStatus

LIVE_OWNER_STATUSES = frozenset({TaskStatus.QUEUED, TaskStatus.RUNNING, TaskStatus.SUCCEEDED})
"""An owner in one of these states keeps its key; a failed or cancelled owner gives it up."""


class StoreCorruptError(RuntimeError):
    """A state file that cannot be trusted. The file is left untouched."""


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

    def close(self) -> None: ...


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
