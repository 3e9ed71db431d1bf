"""Crash injection: a store wrapper that kills the simulated process right after its k-th write
(or, for the testing kit, right before it)."""

from __future__ import annotations

from collections.abc import Callable

from aiqsim.core.job import JobRecord, JobStatus
from aiqsim.core.task import TaskRecord, TaskStatus
from aiqsim.stores.base import PurgeReport, TaskStore


class SimulatedCrash(BaseException):
    """The simulated process died here. A ``BaseException`` so that no ``except Exception``
    in scheduler code can mistake it for a provider failure and carry on."""


class CrashingStore:
    """Passes every call to ``inner`` and counts writes; after a write whose number (counted on a
    shared ``counter``) is in ``crash_points``, calls ``on_crash`` and raises :class:`SimulatedCrash`.

    A write whose number is in ``crash_before`` is not made: the process dies just before it,
    after everything it did since the previous write (a provider call, the user's side effect),
    which a crash right after the previous write never lets happen. The simulator's crash
    scenarios use after-crashes only; the testing kit enumerates both.

    Once dead, every further write raises :class:`SimulatedCrash` too: a dead process writes
    nothing. Reads keep working so post-mortem code can look around.
    """

    def __init__(
        self,
        inner: TaskStore,
        *,
        counter: list[int],
        crash_points: set[int],
        on_crash: Callable[[], None],
        crash_before: set[int] | None = None,
    ) -> None:
        self.inner = inner
        self._counter = counter
        self._crash_points = crash_points
        self._crash_before = crash_before if crash_before is not None else set()
        self._on_crash = on_crash
        self.dead = False

    def _before_write(self) -> None:
        """Raise if the process is dead, or dies now: before a write numbered in ``crash_before``."""
        self._check_alive()
        upcoming = self._counter[0] + 1
        if upcoming in self._crash_before:
            self._crash_before.discard(upcoming)
            self.dead = True
            self._on_crash()
            raise SimulatedCrash(f"crash before store write #{upcoming}")

    def _wrote(self) -> None:
        self._counter[0] += 1
        if self._counter[0] in self._crash_points:
            self._crash_points.discard(self._counter[0])
            self.dead = True
            self._on_crash()
            raise SimulatedCrash(f"crash after store write #{self._counter[0]}")

    def _check_alive(self) -> None:
        if self.dead:
            raise SimulatedCrash("the process is dead")

    def insert_and_claim(self, task: TaskRecord) -> TaskRecord:
        self._before_write()
        owner = self.inner.insert_and_claim(task)
        self._wrote()
        return owner

    def claim(self, task: TaskRecord) -> TaskRecord:
        self._before_write()
        owner = self.inner.claim(task)
        self._wrote()
        return owner

    def update(self, task: TaskRecord) -> None:
        self._before_write()
        self.inner.update(task)
        self._wrote()

    def record_poison(self, key: str, error: str, now: float) -> None:
        self._before_write()
        self.inner.record_poison(key, error, now)
        self._wrote()

    def get(self, task_id: str) -> TaskRecord | None:
        return self.inner.get(task_id)

    def owner_of(self, key: str) -> TaskRecord | None:
        return self.inner.owner_of(key)

    def list_by_status(self, *statuses: TaskStatus) -> list[TaskRecord]:
        return self.inner.list_by_status(*statuses)

    def poison_error(self, key: str) -> str | None:
        return self.inner.poison_error(key)

    @property
    def deferred_commit(self) -> bool:
        return self.inner.deferred_commit

    def flush(self) -> int:
        self._check_alive()
        return self.inner.flush()

    def purge(self, now: float, *, finished_older_than_s: float, keys_older_than_s: float) -> PurgeReport:
        self._check_alive()
        return self.inner.purge(
            now, finished_older_than_s=finished_older_than_s, keys_older_than_s=keys_older_than_s
        )

    def close(self) -> None:
        self.inner.close()

    # jobs: writes count (and may crash) like task writes
    def insert_and_claim_job(self, job: JobRecord) -> JobRecord:
        self._before_write()
        owner = self.inner.insert_and_claim_job(job)  # type: ignore[attr-defined]
        self._wrote()
        return owner

    def claim_job(self, job: JobRecord) -> JobRecord:
        self._before_write()
        owner = self.inner.claim_job(job)  # type: ignore[attr-defined]
        self._wrote()
        return owner

    def update_job(self, job: JobRecord) -> None:
        self._before_write()
        self.inner.update_job(job)  # type: ignore[attr-defined]
        self._wrote()

    def get_job(self, job_id: str) -> JobRecord | None:
        return self.inner.get_job(job_id)  # type: ignore[attr-defined]

    def job_owner_of(self, key: str) -> JobRecord | None:
        return self.inner.job_owner_of(key)  # type: ignore[attr-defined]

    def list_jobs(self, *statuses: JobStatus) -> list[JobRecord]:
        return self.inner.list_jobs(*statuses)  # type: ignore[attr-defined]

    def __len__(self) -> int:
        return len(self.inner.list_by_status())
