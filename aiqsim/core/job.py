"""Job records and the one rule that derives a job's state from its stages' states.

A *job* is one user action that sets off a pipeline of provider calls (video understanding ->
script -> TTS -> subtitles). Its stages run as ordinary scheduler tasks; the job itself is a
record beside them, with the *same* six-state vocabulary and the *same* legal-transition table
as a task (:mod:`aiqsim.core.states`), so a job can never do what a task may not.

Pure: no clock, no I/O. The orchestration lives in :mod:`aiqsim.scheduler.jobs`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiqsim.core.errors import ConfigurationError, SchedulingError
from aiqsim.core.slot_init import compile_copier
from aiqsim.core.states import TRANSITIONS, as_status
from aiqsim.core.task import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED, Priority, TaskStatus

JobStatus = TaskStatus
"""A job's status: the task vocabulary (queued, running, succeeded, failed, cancelled, deduped)."""

JOB_TRANSITIONS = TRANSITIONS
"""A job moves by the task table: the very same object, so the two can never drift apart."""

_DONE = frozenset({TaskStatus.SUCCEEDED, TaskStatus.DEDUPED})
_WAITING = frozenset({TaskStatus.QUEUED})


class IllegalJobTransitionError(SchedulingError):
    """A job status change that the transition table forbids. The record is left unchanged."""

    def __init__(self, job_id: str, current: TaskStatus, requested: TaskStatus) -> None:
        self.job_id = job_id
        self.current = current
        self.requested = requested
        allowed = ", ".join(sorted(s.value for s in JOB_TRANSITIONS[current])) or "none (terminal)"
        super().__init__(
            f"job {job_id!r}: illegal transition {current.value} -> {requested.value} (allowed: {allowed})"
        )


@dataclass(frozen=True, slots=True)
class JobRecord:
    """Everything the scheduler and the stores know about one job.

    ``inputs`` and ``results`` must be JSON-serialisable (durable stores keep them).
    ``results`` maps each finished stage's name to its result (a list, in order, for a fan-out
    stage). ``stage_tasks`` maps each started stage to the ids of the tasks that ran it (its
    fan-out elements, then any fallback tasks), so a job's stages can be found among the tasks.
    ``failed_stage`` and ``error`` say which stage stopped a failed job and why.
    ``deduped_from`` names the job whose run a duplicate shared. ``tenant`` names the customer the
    job is for (``submit_job(tenant=...)``): every task of every stage is queued in that tenant, so
    weighted fair queuing between tenants counts jobs too (:mod:`aiqsim.scheduler.tenants`).
    """

    id: str
    key: str
    name: str
    version: str
    priority: Priority = Priority.BACKGROUND
    status: TaskStatus = TaskStatus.QUEUED
    created_at: float = 0.0
    updated_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    inputs: Any = None
    results: dict[str, Any] = field(default_factory=dict)
    stage_tasks: dict[str, list[str]] = field(default_factory=dict)
    failed_stage: str | None = None
    error: str | None = None
    deduped_from: str | None = None
    worker: str | None = None
    tenant: str | None = None

    def evolve(self, **changes: Any) -> JobRecord:
        """Return a copy with bookkeeping fields changed; status changes must use :func:`job_transition`."""
        if "status" in changes:
            raise ConfigurationError("change a job's status with job_transition(), not evolve()")
        return _copy_job(self, changes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (enums as their values) for stores and DataFrames."""
        return {
            "id": self.id,
            "key": self.key,
            "name": self.name,
            "version": self.version,
            "priority": int(self.priority),
            "status": self.status.value,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "inputs": self.inputs,
            "results": dict(self.results),
            "stage_tasks": {stage: list(ids) for stage, ids in self.stage_tasks.items()},
            "failed_stage": self.failed_stage,
            "error": self.error,
            "deduped_from": self.deduped_from,
            "worker": self.worker,
            "tenant": self.tenant,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobRecord:
        """Inverse of :meth:`to_dict`; raises ``KeyError``/``ValueError``/``TypeError`` on malformed rows."""
        return cls(
            id=str(data["id"]),
            key=str(data["key"]),
            name=str(data["name"]),
            version=str(data["version"]),
            priority=Priority(int(data["priority"])),
            status=TaskStatus(data["status"]),
            created_at=float(data["created_at"]),
            updated_at=float(data["updated_at"]),
            started_at=None if data.get("started_at") is None else float(data["started_at"]),
            finished_at=None if data.get("finished_at") is None else float(data["finished_at"]),
            inputs=data.get("inputs"),
            results=dict(data.get("results") or {}),
            stage_tasks={str(k): [str(i) for i in v] for k, v in (data.get("stage_tasks") or {}).items()},
            failed_stage=data.get("failed_stage"),
            error=data.get("error"),
            deduped_from=data.get("deduped_from"),
            worker=data.get("worker"),
            tenant=data.get("tenant"),
        )


def job_transition(job: JobRecord, next_status: TaskStatus, now: float, **changes: Any) -> JobRecord:
    """Return ``job`` moved to ``next_status`` at ``now`` (the task table's rules and timestamps).

    Raises :class:`IllegalJobTransitionError` naming both states and the job id.
    """
    next_status = as_status(next_status)
    if next_status not in JOB_TRANSITIONS[job.status]:
        raise IllegalJobTransitionError(job.id, job.status, next_status)
    if "status" in changes:
        raise ConfigurationError("pass the new status as next_status, not in changes")
    changes.setdefault("updated_at", now)
    if next_status is RUNNING and job.started_at is None:
        changes.setdefault("started_at", now)
    if next_status.is_terminal:
        changes.setdefault("finished_at", now)
    elif next_status is QUEUED:
        changes.setdefault("finished_at", None)
        changes.setdefault("error", None)
        changes.setdefault("failed_stage", None)
    changes["status"] = next_status
    return _copy_job(job, changes)


_copy_job: Callable[[JobRecord, dict[str, Any]], JobRecord] = compile_copier(JobRecord)
"""``dataclasses.replace`` for job records without its per-call introspection (a job changes at
every stage); a name that is not a field raises ``TypeError``, as ``replace`` does."""


def stage_status(task_statuses: Iterable[TaskStatus | None]) -> TaskStatus | None:
    """The state of one stage (or of a whole job) from the states of its parts.

    ``None`` stands for a part not started yet (a stage waiting for its inputs). The rule, in
    order: any part failed -> failed; any cancelled -> cancelled; every part done (succeeded or
    deduped) -> succeeded; nothing started or every started part queued -> queued (``None``
    when no part has started at all); otherwise running. An empty collection is ``None``.

    A fan-out stage is its elements; a job is its stages. A stage that took its fallback passes
    the fallback's state here, not the failed primary's (see :func:`derive_job_status`).
    """
    statuses = list(task_statuses)
    if not statuses:
        return None
    present = [status for status in statuses if status is not None]
    if FAILED in present:
        return FAILED
    if CANCELLED in present:
        return CANCELLED
    if len(present) == len(statuses) and all(status in _DONE for status in present):
        return SUCCEEDED
    if not present:
        return None
    if all(status in _WAITING for status in present):
        return QUEUED
    return RUNNING


def derive_job_status(stage_states: Mapping[str, TaskStatus | None]) -> TaskStatus:
    """A job's state from its stages' states (``None``: stage not started).

    Same precedence as :func:`stage_status`; a job none of whose stages has started is queued.
    ``deduped`` is never derived: it is reserved for a duplicate *job* that shared another's run.
    """
    return stage_status(stage_states.values()) or QUEUED


def job_failure_message(stage: str, reason: str) -> str:
    """The error a failed job carries: which stage stopped it and why (one line)."""
    return f"stage {stage!r} failed: {reason}"
