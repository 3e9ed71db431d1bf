"""Job events for the scheduler's event sink: flat, frozen records like :mod:`aiqsim.scheduler.events`.

The jobs orchestrator (:mod:`aiqsim.scheduler.jobs`) sends them to the same ``Scheduler(events=...)``
sink as the task events, so one list holds a run's whole story. Consumers that only know the task
events skip these (they filter by type).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class JobTransition:
    """A job changed status (``old`` is ``None`` when it was submitted).

    ``stage`` and ``error`` are set when a stage failed or was the reason for the change.
    """

    time: float
    job_id: str
    key: str
    name: str
    priority: int
    old: str | None
    new: str
    stage: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class StageEvent:
    """One stage of a job moved: ``event`` is ``"submitted"``, ``"fallback"``, ``"succeeded"``,
    ``"failed"`` or ``"cancelled"``; or, from recovery, ``"rebuilt_differently"``: the stage's
    ``build`` gave other payloads than its stored tasks (``task_ids``) were submitted with.

    ``task_ids`` are the stage's tasks at that moment (fan-out elements in order; on
    ``"fallback"``, the fallback tasks just submitted), to join with the task records.
    """

    time: float
    job_id: str
    stage: str
    event: str
    task_ids: tuple[str, ...]
    error: str | None = None
