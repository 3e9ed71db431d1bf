"""Why a submission was refused before anything was queued: a full queue, a closed scheduler.

Their own module, so that :mod:`aiqsim.scheduler.jobs` (which raises them for jobs) need not import
:mod:`aiqsim.scheduler.scheduler`, which imports jobs; the scheduler module re-exports both.
"""

from __future__ import annotations

from aiqsim.core.errors import SchedulingError


class QueueFullError(SchedulingError, RuntimeError):
    """Too many queued requests of one priority: the submission was refused and nothing enqueued.

    Arrivals outpace what the provider's quota lets through. Retry later (the queue drains at the
    quota's rate), shed or defer work upstream, raise ``interactive_limit``/``background_limit``,
    or add quota. Each refusal is also a :class:`~aiqsim.scheduler.events.QueueRejected` event.
    """


class SchedulerClosedError(SchedulingError, RuntimeError):
    """The scheduler was closed (or crashed) and takes no more work."""


__all__ = ["QueueFullError", "SchedulerClosedError"]
