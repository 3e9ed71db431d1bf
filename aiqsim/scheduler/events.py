"""The scheduler's observability stream: flat, frozen records (DataFrames only at the edge).

Pass any ``Callable[[SchedulerEvent], None]`` as ``Scheduler(events=...)``; ``list.append``
is the cheapest sink. The simulator turns these records into its ``tasks``, ``calls``
and ``timeline`` DataFrames.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aiqsim.core.ratelimit import RateLimitSnapshot


@dataclass(frozen=True, slots=True)
class TaskTransition:
    """A task changed status (``old`` is ``None`` when it was submitted)."""

    time: float
    task_id: str
    key: str
    provider: str
    priority: int
    old: str | None
    new: str
    attempts: int
    cost_estimate: float | None = None
    """What the task was expected to cost in quota units (for the call log's cost model)."""


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One provider call: when, how it ended and what it reported.

    ``outcome`` is ``"ok"`` or the error type name (``"RateLimitError"``, ``"ProviderTimeoutError"``...).
    Whether the provider *billed* the call is known only to the provider; simulated providers
    keep that record themselves.
    """

    task_id: str
    key: str
    provider: str
    attempt: int
    start: float
    end: float
    outcome: str
    decision: str
    cost_estimate: float
    usage: float | None
    retry_after_s: float | None
    delay_s: float | None
    output_units: float | None = None
    """What the provider said it generated (completion tokens), when it said so."""
    ratelimit: RateLimitSnapshot | None = None
    """The provider's ``x-ratelimit-*`` view on this answer (success or error), when it sent one."""


@dataclass(frozen=True, slots=True)
class QuotaSample:
    """A provider's client-side quota at the moment an attempt was granted."""

    time: float
    provider: str
    requests_level: float
    tokens_level: float
    in_flight: int
    queued_interactive: int
    queued_background: int


@dataclass(frozen=True, slots=True)
class StoreWriteFailed:
    """A store write (or the group commit covering it) failed: ``lost`` names the change that was
    NOT persisted, ``error`` the store's error. The task's submission resolved with
    :class:`~aiqsim.stores.base.StoreWriteError`; the store still holds the task's previous state,
    which :meth:`~aiqsim.scheduler.Scheduler.recover` reconciles after a restart."""

    time: float
    task_id: str
    key: str
    provider: str
    lost: str
    error: str


@dataclass(frozen=True, slots=True)
class UsageAnomaly:
    """A provider reported a usage the scheduler would not charge as is (see :mod:`aiqsim.core.usage`).

    ``reported`` is the value as received (its ``repr``), ``charged`` what the bucket was reconciled
    with, ``reason`` why. The call itself still counts as done.
    """

    time: float
    task_id: str
    key: str
    provider: str
    attempt: int
    reported: str
    charged: float
    reason: str


@dataclass(frozen=True, slots=True)
class LanePaused:
    """A 429's Retry-After paused a whole provider lane until ``until`` (no attempt starts before it).

    ``task_id`` saw the 429; ``reason`` says why the pause reached the lane and not only that task:
    ``"scope=lane"`` (the policy pauses the lane for every 429), ``"quota_spent"`` (the provider said
    its quota is used up) or ``"repeated_429s"`` (a large recent share of 429s, from several tasks).
    """

    time: float
    provider: str
    until: float
    task_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class QueueRejected:
    """``submit`` refused a task because its priority's queue was full (:class:`QueueFullError`).

    ``queued`` tasks of that priority were waiting in the scheduler (all lanes) against ``limit``;
    ``queued_in_lane`` of them for ``provider``. A run of these means arrivals outpace the
    provider's quota: the signal to shed load upstream, raise the limit or add quota.
    """

    time: float
    provider: str
    priority: int
    queued: int
    limit: int
    queued_in_lane: int


SchedulerEvent = (
    TaskTransition
    | AttemptRecord
    | QuotaSample
    | StoreWriteFailed
    | UsageAnomaly
    | LanePaused
    | QueueRejected
)
EventSink = Callable[[SchedulerEvent], None]
