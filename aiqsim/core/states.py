"""The task state machine: the one place that knows which status may follow which.

Like h11's ``_state.py``, every status change in aiqsim goes through :func:`transition`,
and the table below is the whole rule set. Tests drive the table without any I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from aiqsim.core.errors import ConfigurationError, SchedulingError
from aiqsim.core.task import _TERMINAL, QUEUED, RECORD_COPIERS, RUNNING, TaskRecord, TaskStatus, copy_record

_S = TaskStatus

_NEXT_STATES: dict[TaskStatus, frozenset[TaskStatus]] = {
    _S.QUEUED: frozenset({_S.RUNNING, _S.CANCELLED, _S.DEDUPED}),
    _S.RUNNING: frozenset({_S.SUCCEEDED, _S.FAILED, _S.CANCELLED}),
    # failed -> queued is a *manual* retry; the scheduler retries inside ``running``.
    _S.FAILED: frozenset({_S.QUEUED}),
    _S.SUCCEEDED: frozenset(),
    _S.CANCELLED: frozenset(),
    _S.DEDUPED: frozenset(),
}

TRANSITIONS: Mapping[TaskStatus, frozenset[TaskStatus]] = MappingProxyType(_NEXT_STATES)
"""Legal next states for each state. Anything not listed raises :class:`IllegalTransitionError`.
(A read-only view of the one table; :func:`transition_with` reads the table itself, without the
view's indirection, on every status change.)"""


_COPIES = RECORD_COPIERS.cache


class IllegalTransitionError(SchedulingError):
    """A status change that the transition table forbids. The record is left unchanged."""

    def __init__(self, task_id: str, current: TaskStatus, requested: TaskStatus) -> None:
        self.task_id = task_id
        self.current = current
        self.requested = requested
        allowed = ", ".join(sorted(s.value for s in TRANSITIONS[current])) or "none (terminal)"
        super().__init__(
            f"task {task_id!r}: illegal transition {current.value} -> {requested.value} (allowed: {allowed})"
        )


def as_status(value: TaskStatus | str) -> TaskStatus:
    """``value`` as a :class:`TaskStatus` (a member or its value, ``"running"``); anything else is a
    :class:`ConfigurationError` that lists the statuses there are (not the enum's bare ``ValueError``)."""
    if type(value) is TaskStatus:
        return value
    try:
        return TaskStatus(value)
    except ValueError:
        statuses = ", ".join(status.value for status in TaskStatus)
        raise ConfigurationError(f"unknown task status {value!r}; expected one of: {statuses}") from None


def is_legal(current: TaskStatus, requested: TaskStatus) -> bool:
    """True when ``current -> requested`` is in :data:`TRANSITIONS`."""
    return requested in TRANSITIONS[current]


def transition(task: TaskRecord, next_status: TaskStatus, now: float, **changes: Any) -> TaskRecord:
    """Return ``task`` moved to ``next_status`` at time ``now``, with optional field ``changes``.

    Sets ``updated_at``; sets ``started_at`` on entering running (first time only) and
    ``finished_at`` on entering a terminal state (cleared again by a manual retry).
    Raises :class:`IllegalTransitionError` naming both states and the task id.
    """
    return transition_with(task, next_status, now, changes)


def transition_with(
    task: TaskRecord, next_status: TaskStatus, now: float, changes: dict[str, Any]
) -> TaskRecord:
    """:func:`transition` with the field changes in a dict of the caller's that this call may fill in
    (with ``updated_at``, ``status``...): for a caller that holds its changes as a keyword-argument
    dict of its own already, which would otherwise be unpacked only to be packed again (once per
    status change of every task: the scheduler's ``_move`` and ``_finish``)."""
    if type(next_status) is not TaskStatus:
        next_status = as_status(next_status)
    if next_status not in _NEXT_STATES[task.status]:
        raise IllegalTransitionError(task.id, task.status, next_status)
    if "status" in changes:
        raise ConfigurationError("pass the new status as next_status, not in changes")
    fields = changes
    # ``name not in fields`` rather than ``setdefault``: no method call (this runs per status change)
    if "updated_at" not in fields:
        fields["updated_at"] = now
    if next_status is RUNNING and task.started_at is None and "started_at" not in fields:
        fields["started_at"] = now
    if next_status in _TERMINAL:  # is_terminal without the enum property lookup (hot path)
        if "finished_at" not in fields:
            fields["finished_at"] = now
    elif next_status is QUEUED:
        if "finished_at" not in fields:
            fields["finished_at"] = None
        if "error" not in fields:
            fields["error"] = None
    fields["status"] = next_status
    # copy_record's dispatch, inlined: the copier for these changed names, built on first use
    copy = _COPIES.get(tuple(fields))
    return copy(task, fields) if copy is not None else copy_record(task, fields)
