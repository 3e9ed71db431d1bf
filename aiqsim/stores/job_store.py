"""The job-table protocol every store implements beside its task table.

A job's stages are ordinary tasks (the task table); the job itself is one row in a ``jobs``
table with its own idempotency key. ``insert_and_claim_job`` is the job-level twin of
``insert_and_claim``: the new job and its claim on the key are one atomic step, and a live owner
(queued, running or succeeded) keeps the key, so two processes racing on one job get one owner.
"""

from __future__ import annotations

import math
from typing import Any, Protocol, runtime_checkable

from aiqsim.core.job import JobRecord, JobStatus
from aiqsim.core.task import Priority
from aiqsim.stores.base import LIVE_OWNER_STATUSES, StoreCorruptError, is_one_of, unicode_text_problem


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


def latest_job_of(store: object, name: str, version: str) -> JobRecord | None:
    """The job last stored under spec ``name`` and ``version``, whatever its status, through the
    store's ``latest_job`` (every store in :mod:`aiqsim.stores` has it); ``None`` from a store
    without it. What tells a job submitted after a restart that a different spec ran under the same
    name and version (:mod:`aiqsim.scheduler.jobs`)."""
    latest = getattr(store, "latest_job", None)
    return latest(name, version) if callable(latest) else None


def claim_job_owner(current_owner: JobRecord | None, candidate: JobRecord) -> JobRecord:
    """The task claim rule, for jobs: a live owner keeps the key, otherwise the candidate takes it."""
    if current_owner is not None and current_owner.status in LIVE_OWNER_STATUSES:
        return current_owner
    return candidate


_JOB_TEXT_FIELDS = ("id", "key", "name")
_JOB_NUMBER_FIELDS = ("created_at", "updated_at")
_JOB_OPTIONAL_NUMBER_FIELDS = ("started_at", "finished_at")
_JOB_OPTIONAL_TEXT_FIELDS = ("failed_stage", "error", "deduped_from", "worker", "tenant")
_STATUS_VALUES = frozenset(status.value for status in JobStatus)
_PRIORITY_VALUES = frozenset(int(priority) for priority in Priority)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)


def job_problem(data: Any) -> str | None:
    """Why ``data`` is not a valid stored job record (``None`` when it is); strict like
    :func:`~aiqsim.stores.base.record_problem`: a durable store refuses what it would have to guess."""
    if not isinstance(data, dict):
        return f"a job record must be a JSON object, got {type(data).__name__}"
    for name in _JOB_TEXT_FIELDS:
        if not isinstance(data.get(name), str) or not data[name]:
            return f"field {name!r} must be a non-empty string, got {data.get(name)!r}"
    if not isinstance(data.get("version"), str):
        return f"field 'version' must be a string, got {data.get('version')!r}"
    if not is_one_of(data.get("status"), _STATUS_VALUES):
        return f"invalid status {data.get('status')!r} (expected one of {sorted(_STATUS_VALUES)})"
    priority = data.get("priority")
    if isinstance(priority, bool) or not is_one_of(priority, _PRIORITY_VALUES):
        return f"invalid priority {priority!r} (expected one of {sorted(_PRIORITY_VALUES)})"
    for name in _JOB_NUMBER_FIELDS:
        if not _is_number(data.get(name)):
            return f"field {name!r} must be a number, got {data.get(name)!r}"
    for name in _JOB_OPTIONAL_NUMBER_FIELDS:
        if data.get(name) is not None and not _is_number(data[name]):
            return f"field {name!r} must be a number or null, got {data[name]!r}"
    for name in _JOB_OPTIONAL_TEXT_FIELDS:
        if data.get(name) is not None and not isinstance(data[name], str):
            return f"field {name!r} must be a string or null, got {data[name]!r}"
    results = data.get("results")
    if not isinstance(results, dict):
        return f"field 'results' must be an object, got {type(results).__name__}"
    stage_tasks = data.get("stage_tasks")
    if not isinstance(stage_tasks, dict) or not all(
        isinstance(ids, list) and all(isinstance(i, str) for i in ids) for ids in stage_tasks.values()
    ):
        return f"field 'stage_tasks' must map stage names to lists of task ids, got {stage_tasks!r}"
    return unicode_text_problem(data)


def job_from_stored(data: Any, source: str) -> JobRecord:
    """Decode a stored job strictly; raise :class:`StoreCorruptError` naming ``source`` if invalid."""
    problem = job_problem(data)
    if problem is not None:
        job_id = data.get("id") if isinstance(data, dict) else None
        where = f"{source}: job {job_id!r}" if isinstance(job_id, str) else source
        raise StoreCorruptError(f"{where}: {problem}")
    return JobRecord.from_dict(data)
