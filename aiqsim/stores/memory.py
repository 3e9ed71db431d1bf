"""An in-memory task store for tests, sweeps and simulations.

It survives a simulated crash (the harness keeps the object and hands it to the restarted
scheduler), which makes it the fastest store for crash-recovery sweeps.
"""

from __future__ import annotations

from typing import Any

from aiqsim.core.job import JobRecord, JobStatus
from aiqsim.core.task import TaskRecord, TaskStatus
from aiqsim.stores.base import (
    DuplicateTaskIdError,
    PurgePlan,
    PurgeReport,
    claim_owner,
    plan_in_memory_purge,
    purge_report,
)
from aiqsim.stores.job_store import claim_job_owner


def _apply_plan(plan: PurgePlan, records: dict[str, Any], owners: dict[str, str]) -> None:
    """Delete a plan's records and the keys it names (a key only while that record still owns it)."""
    for key, owner_id in plan.keys:
        if owners.get(key) == owner_id:
            del owners[key]
    for record_id in plan.task_ids:
        del records[record_id]


class MemoryStore:
    """Dict-backed :class:`~aiqsim.stores.base.TaskStore`."""

    # slots: each transition reads them (see SimPyRuntime); an instance may still take attributes of its own
    __slots__ = (
        "__dict__",
        "__weakref__",
        "_job_owners",
        "_jobs",
        "_owners",
        "_poison",
        "_tasks",
        "deferred_commit",
        "writes",
    )

    def __init__(self) -> None:
        self._tasks: dict[str, TaskRecord] = {}
        self._owners: dict[str, str] = {}
        self._poison: dict[str, str] = {}
        self._jobs: dict[str, JobRecord] = {}
        self._job_owners: dict[str, str] = {}
        self.writes = 0
        self.deferred_commit = False
        """Every write is applied when its method returns; :meth:`flush` has nothing to do."""

    def insert_and_claim(self, task: TaskRecord) -> TaskRecord:
        # each attribute read once: a write per submission, on the hot path of every run
        task_id, key, tasks, owners = task.id, task.key, self._tasks, self._owners
        if task_id in tasks:
            raise DuplicateTaskIdError("task", task_id)
        owner_id = owners.get(key)
        owner = claim_owner(tasks.get(owner_id) if owner_id is not None else None, task)
        tasks[task_id] = task
        if owner is task:
            owners[key] = task_id
        self.writes += 1
        return owner

    def claim(self, task: TaskRecord) -> TaskRecord:
        if task.id not in self._tasks:
            raise KeyError(f"unknown task id {task.id!r}")
        owner_id = self._owners.get(task.key)
        if owner_id == task.id:
            return self._tasks[task.id]
        owner = claim_owner(self._tasks.get(owner_id) if owner_id is not None else None, task)
        if owner is task:
            self._owners[task.key] = task.id
            self.writes += 1
        return owner

    def update(self, task: TaskRecord) -> None:
        task_id, tasks = task.id, self._tasks
        if task_id not in tasks:
            raise KeyError(f"unknown task id {task_id!r}")
        tasks[task_id] = task
        self.writes += 1

    def get(self, task_id: str) -> TaskRecord | None:
        return self._tasks.get(task_id)

    def owner_of(self, key: str) -> TaskRecord | None:
        owner_id = self._owners.get(key)
        return self._tasks.get(owner_id) if owner_id is not None else None

    def list_by_status(self, *statuses: TaskStatus) -> list[TaskRecord]:
        if not statuses:
            return list(self._tasks.values())
        wanted = set(statuses)
        return [t for t in self._tasks.values() if t.status in wanted]

    def record_poison(self, key: str, error: str, now: float) -> None:
        self._poison[key] = error
        self.writes += 1

    def poison_error(self, key: str) -> str | None:
        return self._poison.get(key)

    def purge(self, now: float, *, finished_older_than_s: float, keys_older_than_s: float) -> PurgeReport:
        """Delete finished tasks, finished jobs and expired keys by :func:`~aiqsim.stores.base.plan_purge`
        (both plans are made before anything is deleted, so a bad TTL changes nothing)."""
        plan, job_plan = plan_in_memory_purge(
            [(self._tasks.values(), self._owners), (self._jobs.values(), self._job_owners)],
            now=now,
            finished_older_than_s=finished_older_than_s,
            keys_older_than_s=keys_older_than_s,
        )
        _apply_plan(plan, self._tasks, self._owners)
        _apply_plan(job_plan, self._jobs, self._job_owners)
        self.writes += 1
        return purge_report(plan, now, finished_older_than_s, keys_older_than_s, job_plan)

    def flush(self) -> int:
        """Nothing is ever staged here: returns 0."""
        return 0

    def close(self, *, flush: bool = True) -> None:
        """Nothing to release (``flush`` is accepted for the protocol's sake)."""

    # ------------------------------------------------------------------ jobs (JobStore)
    def insert_and_claim_job(self, job: JobRecord) -> JobRecord:
        if job.id in self._jobs:
            raise DuplicateTaskIdError("job", job.id)
        owner_id = self._job_owners.get(job.key)
        owner = claim_job_owner(self._jobs.get(owner_id) if owner_id is not None else None, job)
        self._jobs[job.id] = job
        if owner is job:
            self._job_owners[job.key] = job.id
        self.writes += 1
        return owner

    def claim_job(self, job: JobRecord) -> JobRecord:
        if job.id not in self._jobs:
            raise KeyError(f"unknown job id {job.id!r}")
        owner_id = self._job_owners.get(job.key)
        if owner_id == job.id:
            return self._jobs[job.id]
        owner = claim_job_owner(self._jobs.get(owner_id) if owner_id is not None else None, job)
        if owner is job:
            self._job_owners[job.key] = job.id
            self.writes += 1
        return owner

    def update_job(self, job: JobRecord) -> None:
        if job.id not in self._jobs:
            raise KeyError(f"unknown job id {job.id!r}")
        self._jobs[job.id] = job
        self.writes += 1

    def get_job(self, job_id: str) -> JobRecord | None:
        return self._jobs.get(job_id)

    def job_owner_of(self, key: str) -> JobRecord | None:
        owner_id = self._job_owners.get(key)
        return self._jobs.get(owner_id) if owner_id is not None else None

    def latest_job(self, name: str, version: str) -> JobRecord | None:
        """The job last stored under spec ``name`` and ``version``, if any
        (:func:`~aiqsim.stores.job_store.latest_job_of`)."""
        for job in reversed(self._jobs.values()):
            if job.name == name and job.version == version:
                return job
        return None

    def list_jobs(self, *statuses: JobStatus) -> list[JobRecord]:
        if not statuses:
            return list(self._jobs.values())
        wanted = set(statuses)
        return [job for job in self._jobs.values() if job.status in wanted]

    def __len__(self) -> int:
        return len(self._tasks)
