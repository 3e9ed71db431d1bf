"""The job-table protocol every store implements beside its task table.

A job's stages are ordinary tasks (the task table); the job itself is one row in a ``jobs``
table with its own idempotency key. ``insert_and_claim_job`` is the job-level twin of
``insert_and_claim``: the new job and its claim on the key are one atomic step, and a live owner
(queued, running or succeeded) keeps the key, so two processes racing on one job get one owner.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from aiqsim.core.job import JobRecord, JobStatus
from aiqsim.stores.base import LIVE_OWNER_STATUSES


@runtime_checkable
class JobStore(Protocol):
    """Durable (or not) home of job records; implemented by every store in :mod:`aiqsim.stores`."""

    def insert_and_claim_job(self, job: JobRecord) -> JobRecord:
        """Insert ``job``; return the owner of ``job.key`` (``job`` itself if it won the claim)."""
        ...

    def claim_job(self, job: JobRecord) -> JobRecord:
        """Claim ``job.key`` for an already stored job unless a live owner exists; return the owner."""
        ...

    def update_job(self, job: JobRecord) -> None:
        """Persist a changed job record (status, results and error together, in one step)."""
        ...

    def get_job(self, job_id: str) -> JobRecord | None: ...

    def job_owner_of(self, key: str) -> JobRecord | None:
        """The job that owns ``key``, if any."""
        ...

    def list_jobs(self, *statuses: JobStatus) -> list[JobRecord]:
        """Job records in any of ``statuses`` (all when none given), in insertion order."""
        ...


def claim_job_owner(current_owner: JobRecord | None, candidate: JobRecord) -> JobRecord:
    """The task claim rule, for jobs: a live owner keeps the key, otherwise the candidate takes it."""
    if current_owner is not None and current_owner.status in LIVE_OWNER_STATUSES:
        return current_owner
    return candidate
