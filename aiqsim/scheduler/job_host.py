"""The seam between the scheduler and its jobs orchestrator: what :class:`~aiqsim.scheduler.jobs.Jobs`
needs of a :class:`~aiqsim.scheduler.Scheduler` beyond its public API, and nothing more.

Jobs run their stages as ordinary scheduler tasks (``submit``, ``cancel``, the store, the runtime,
the event sink: all public), but they also take part in rules the scheduler keeps to itself: the
depth limit counts a job once, a duplicate job lifts its owner's queued tasks, a job's terminal
write waits for a deferred commit. Those go through a :class:`JobHost`, which
``Scheduler.attach_jobs`` gives the orchestrator: jobs never read a scheduler's private attributes,
and this module imports neither of them (the scheduler imports jobs; jobs import only this).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from aiqsim.core.task import Priority
from aiqsim.stores.base import StoreWriteError

if TYPE_CHECKING:
    from aiqsim.scheduler.depth_limit import Call
    from aiqsim.scheduler.live import LiveTask


class JobHost(Protocol):
    """What a jobs orchestrator asks of the scheduler it is attached to."""

    @property
    def live(self) -> Mapping[str, LiveTask]:
        """The scheduler's live tasks by id (read only)."""
        ...

    @property
    def crashed(self) -> bool:
        """``Scheduler.crash()`` ran: nothing more may be written."""
        ...

    def closed_reason(self) -> str | None:
        """``"scheduler is closed"`` / ``"scheduler is closing"`` when no new job may be submitted."""
        ...

    def depth_limit(self, priority: Priority) -> int | None:
        """The queue depth limit of ``priority`` (``None``: unbounded)."""
        ...

    def check_tenant(self, tenant: object) -> int | None:
        """Refuse a job's ``tenant`` as ``submit(tenant=...)`` refuses a task's; return its
        ``max_queued`` (``None``: unbounded, or the default tenant)."""
        ...

    def queued(self, priority: Priority) -> int:
        """Tasks of ``priority`` waiting in a dispatch queue (stage tasks included)."""
        ...

    def held_by_gates(self, priority: Priority) -> list[str]:
        """The tasks of ``priority`` whose first attempt a gate holds back: they wait, as queued ones do."""
        ...

    def refusing_job_limit(self, first_calls: Callable[[], Sequence[Call]], priority: Priority) -> int | None:
        """The depth limit that refuses a new job whose first calls ``first_calls()`` lists, or ``None``."""
        ...

    def promoted_call(self, task_id: str, priority: Priority) -> Call | None:
        """What a duplicate of ``priority`` queues for task ``task_id``: nothing, unless it lifts it."""
        ...

    def new_call(self, provider: str, kind: str, payload: Any, cost: float | None) -> Call:
        """The call a task of ``kind`` and ``payload`` on ``provider`` would queue, as the depth limit
        counts it (raises what ``submit`` would for a cost that cannot be estimated or granted)."""
        ...

    def inherit_priority(self, task: LiveTask, priority: Priority) -> None:
        """Lift a live task into ``priority`` (a duplicate of a higher class joined it)."""
        ...

    def staged(self) -> None:
        """A job write was staged: with a store that defers commits, a flush follows."""
        ...

    def ensure_started(self) -> None:
        """Start the scheduler's dispatchers if they are not running yet."""
        ...

    def when_durable(self, callback: Callable[[StoreWriteError | None], None]) -> None:
        """Call ``callback(None)`` once every write made so far is durable (at once with a store
        that commits each write), or ``callback(error)`` if the flush that held them failed."""
        ...
