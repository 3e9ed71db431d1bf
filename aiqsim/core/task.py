"""The task record: one flat, immutable row per task, as stored and as reported."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.slot_init import FieldCopiers, compile_builder, compile_copier, fast_frozen_init

if TYPE_CHECKING:
    from random import Random  # the injected generator's type; no randomness is imported


class TaskStatus(enum.StrEnum):
    """The six states a task can be in. Transitions are owned by :mod:`aiqsim.core.states`."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    DEDUPED = "deduped"

    @property
    def is_terminal(self) -> bool:
        """True for states the scheduler never leaves on its own (failed may be retried by hand)."""
        return self in _TERMINAL


_TERMINAL = frozenset({TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.DEDUPED})

# The members as module globals, for the hot paths: on CPython 3.11 each read of ``TaskStatus.SUCCEEDED``
# goes through enum's member descriptor (~0.1 µs, not specialised), a global's ~0.02 µs.
QUEUED = TaskStatus.QUEUED
RUNNING = TaskStatus.RUNNING
SUCCEEDED = TaskStatus.SUCCEEDED
FAILED = TaskStatus.FAILED
CANCELLED = TaskStatus.CANCELLED
DEDUPED = TaskStatus.DEDUPED


class PriorityError(ConfigurationError):
    """A ``priority`` that is neither a :class:`Priority`, its value, nor its name."""


class Priority(enum.IntEnum):
    """Dispatch class. Lower value is served first; interactive always overtakes background."""

    INTERACTIVE = 0
    BACKGROUND = 1

    @classmethod
    def _missing_(cls, value: object) -> Priority:
        """Accept the names as documented (``"interactive"``, ``"Background"``: any case), so
        ``submit(priority="interactive")`` works; anything else is refused naming what is accepted."""
        if isinstance(value, str):
            member = cls.__members__.get(value.strip().upper())
            if member is not None:
                return member
        accepted = ", ".join(f"Priority.{m.name} ({m.name.lower()!r} or {m.value})" for m in cls)
        raise PriorityError(f"priority: expected one of {accepted}, got {value!r}")


INTERACTIVE = Priority.INTERACTIVE  # module globals, as the statuses above
BACKGROUND = Priority.BACKGROUND


@fast_frozen_init  # built on every submit and status change: see aiqsim.core.slot_init
@dataclass(frozen=True, slots=True)
class TaskRecord:
    """Everything the scheduler and the stores know about one task.

    Records are values: every change goes through :func:`aiqsim.core.states.transition`
    (for status) or :meth:`evolve` (for bookkeeping fields) and yields a new record.

    ``payload`` and ``result`` must be JSON-serialisable so durable stores can keep them.
    ``error`` is a short ``"ErrorType: message"`` string, never an exception object.
    ``worker`` names the scheduler instance that holds the task (``Scheduler(worker_id=...)``)
    when several processes share one store; ``None`` when the store has a single user.
    ``tenant`` names the customer the call is made for (``submit(tenant=...)``): the lane's queues
    share their service among tenants by weight (:mod:`aiqsim.scheduler.tenants`); ``None`` for a
    scheduler without tenants.
    ``route`` names the route the task was submitted through (``submit("gpt-4o", ...)`` with
    ``routes={"gpt-4o": Route(...)}``; :mod:`aiqsim.scheduler.routes`): ``provider`` is the
    deployment it runs on now, and a retry may move it to another of the route's; kept in the store
    so a task recovered after a restart may move too. ``None`` for a task submitted to a provider.
    """

    id: str
    key: str
    kind: str
    provider: str
    priority: Priority = Priority.BACKGROUND
    status: TaskStatus = TaskStatus.QUEUED
    cost_estimate: float = 0.0
    attempts: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    payload: Any = None
    result: Any = None
    error: str | None = None
    deduped_from: str | None = None
    worker: str | None = None
    tenant: str | None = None
    route: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def evolve(self, **changes: Any) -> TaskRecord:
        """Return a copy with bookkeeping fields changed; status changes must use ``transition``."""
        if "status" in changes:
            raise ConfigurationError("change status with aiqsim.core.states.transition(), not evolve()")
        return copy_record(self, changes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (enums as their values) for stores and DataFrames."""
        return {
            "id": self.id,
            "key": self.key,
            "kind": self.kind,
            "provider": self.provider,
            "priority": int(self.priority),
            "status": self.status.value,
            "cost_estimate": self.cost_estimate,
            "attempts": self.attempts,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "payload": self.payload,
            "result": self.result,
            "error": self.error,
            "deduped_from": self.deduped_from,
            "worker": self.worker,
            "tenant": self.tenant,
            "route": self.route,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskRecord:
        """Inverse of :meth:`to_dict`; raises ``KeyError``/``ValueError`` on malformed rows."""
        return cls(
            id=str(data["id"]),
            key=str(data["key"]),
            kind=str(data["kind"]),
            provider=str(data["provider"]),
            priority=Priority(int(data["priority"])),
            status=TaskStatus(data["status"]),
            cost_estimate=float(data["cost_estimate"]),
            attempts=int(data["attempts"]),
            created_at=float(data["created_at"]),
            updated_at=float(data["updated_at"]),
            started_at=None if data.get("started_at") is None else float(data["started_at"]),
            finished_at=None if data.get("finished_at") is None else float(data["finished_at"]),
            payload=data.get("payload"),
            result=data.get("result"),
            error=data.get("error"),
            deduped_from=data.get("deduped_from"),
            worker=data.get("worker"),
            tenant=data.get("tenant"),
            route=data.get("route"),
        )


def random_id(rng: Random) -> str:
    """A fresh task (or job) id: 64 bits drawn from ``rng``, as 16 lowercase hex digits.

    The same string as ``f"{rng.getrandbits(64):016x}"`` for the same draw, made without the
    format-spec machinery (a third of the cost; one per submission)."""
    return rng.getrandbits(64).to_bytes(8, "big").hex()


new_task_record: Callable[..., TaskRecord] = compile_builder(TaskRecord)
"""``new_task_record(...)``: ``TaskRecord(...)`` for the scheduler's hot path (one per submission),
without the cost of calling a class on 3.11 (:func:`aiqsim.core.slot_init.compile_builder`)."""

RECORD_COPIERS = FieldCopiers(TaskRecord)
"""The task record's copiers by changed names (what :data:`copy_record` dispatches to; a status change
reads ``RECORD_COPIERS.cache`` itself: :func:`aiqsim.core.states.transition_with`)."""

copy_record: Callable[[TaskRecord, dict[str, Any]], TaskRecord] = compile_copier(TaskRecord, RECORD_COPIERS)
"""``copy_record(task, changes)``: ``dataclasses.replace`` for task records, without its per-call
field introspection (see :mod:`aiqsim.core.slot_init`: one generated copier per set of changed names).

Every status change of every task goes through here, so it is on the scheduler's hot path
(``replace`` was a tenth of a simulation's time). ``TaskRecord.__init__`` validates nothing, so
skipping it changes nothing but the cost. A name that is not a field raises ``TypeError``."""
