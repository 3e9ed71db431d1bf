"""Store wrappers for write-failure tests: real stores underneath, failures injected at chosen writes."""

from __future__ import annotations

import errno
from collections import Counter
from typing import Any

from aiqsim.core.task import TaskRecord, TaskStatus
from aiqsim.stores.base import StoreWriteError
from aiqsim.stores.memory import MemoryStore


class FailingWrites:
    """Passes every call to ``inner``; write number k (1-based, over insert_and_claim, claim, update
    and record_poison) raises a raw ``OSError(ENOSPC)`` *instead of* writing when k is in
    ``fail_at``. ``fail_from`` fails every write from that number on until :meth:`heal` is called
    (a full disk). The raw error is what a store that lets an OS error through would raise; the
    scheduler must wrap it."""

    def __init__(self, inner: Any, fail_at: set[int] | None = None, fail_from: int | None = None) -> None:
        self.inner = inner
        self.fail_at = set(fail_at or ())
        self.fail_from = fail_from
        self.writes = 0
        self.failed: list[int] = []
        self.kinds: Counter[str] = Counter()

    def heal(self) -> None:
        self.fail_at.clear()
        self.fail_from = None

    def _write(self, kind: str) -> None:
        self.writes += 1
        self.kinds[kind] += 1
        k = self.writes
        if k in self.fail_at or (self.fail_from is not None and k >= self.fail_from):
            self.failed.append(k)
            raise OSError(errno.ENOSPC, "No space left on device (injected)")

    def insert_and_claim(self, task: TaskRecord) -> TaskRecord:
        self._write("insert_and_claim")
        return self.inner.insert_and_claim(task)

    def claim(self, task: TaskRecord) -> TaskRecord:
        self._write("claim")
        return self.inner.claim(task)

    def update(self, task: TaskRecord) -> None:
        self._write("update")
        self.inner.update(task)

    def record_poison(self, key: str, error: str, now: float) -> None:
        self._write("record_poison")
        self.inner.record_poison(key, error, now)

    def get(self, task_id: str) -> TaskRecord | None:
        return self.inner.get(task_id)

    def owner_of(self, key: str) -> TaskRecord | None:
        return self.inner.owner_of(key)

    def list_by_status(self, *statuses: TaskStatus) -> list[TaskRecord]:
        return self.inner.list_by_status(*statuses)

    def poison_error(self, key: str) -> str | None:
        return self.inner.poison_error(key)

    def close(self) -> None:
        self.inner.close()


class DeferredMemoryStore(MemoryStore):
    """A MemoryStore with the group-commit interface: writes are staged (reads see them) until
    :meth:`flush` commits them all at once; a flush number in ``fail_flushes`` rolls every staged
    write back and raises :class:`StoreWriteError`. :meth:`committed` is what a crash would leave."""

    def __init__(self, fail_flushes: set[int] | None = None) -> None:
        super().__init__()
        self.deferred_commit = True
        self.fail_flushes = set(fail_flushes or ())
        self.flushes = 0
        self.flushed_writes: list[int] = []
        self._saved = self._snapshot()
        self._staged = 0

    def _snapshot(self) -> tuple[dict, dict, dict]:
        return dict(self._tasks), dict(self._owners), dict(self._poison)

    def insert_and_claim(self, task: TaskRecord) -> TaskRecord:
        self._staged += 1
        return super().insert_and_claim(task)

    def claim(self, task: TaskRecord) -> TaskRecord:
        self._staged += 1
        return super().claim(task)

    def update(self, task: TaskRecord) -> None:
        self._staged += 1
        super().update(task)

    def record_poison(self, key: str, error: str, now: float) -> None:
        self._staged += 1
        super().record_poison(key, error, now)

    def flush(self) -> int:
        self.flushes += 1
        staged, self._staged = self._staged, 0
        if self.flushes in self.fail_flushes:
            self._tasks, self._owners, self._poison = (dict(part) for part in self._saved)
            raise StoreWriteError(f"{staged} staged write(s) rolled back (injected fsync failure)")
        self._saved = self._snapshot()
        self.flushed_writes.append(staged)
        return staged

    def committed(self) -> MemoryStore:
        """A plain store holding only what was committed (the state a crash would leave)."""
        store = MemoryStore()
        store._tasks, store._owners, store._poison = (dict(part) for part in self._saved)
        return store
