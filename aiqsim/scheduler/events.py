"""The scheduler's observability stream: flat, immutable records (DataFrames only at the edge).

Pass any ``Callable[[SchedulerEvent], None]`` as ``Scheduler(events=...)``; ``list.append``
is the cheapest sink. The simulator turns these records into its ``tasks``, ``calls``
and ``timeline`` DataFrames.

The records are :class:`typing.NamedTuple` classes, not frozen dataclasses: the scheduler builds
several per call on its serving path, and a named tuple is built in one C-level tuple allocation
where a frozen dataclass pays an ``object.__setattr__`` call per field (about three times the cost,
see benchmarks/RESULTS.md, ``bench_call_log.py``). Read them by field name (``event.task_id``), as
before; they are immutable (assigning a field raises :class:`AttributeError`), hashable, pickle,
and ``event._replace(...)``/``event._asdict()`` work. Equality is by record type *and* values: a
record never equals a plain tuple or a record of another type holding the same values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from aiqsim.core.ratelimit import RateLimitSnapshot
from aiqsim.core.slot_init import compile_builder


class TaskTransition(NamedTuple):
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
    tenant: str | None = None
    """The task's tenant (``submit(tenant=...)``; per-tenant figures), ``None`` without tenants."""


class AttemptRecord(NamedTuple):
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
    first_token_s: float | None = None
    """For a streamed answer, seconds from the attempt's start to its first content chunk (TTFT)."""
    tokens_per_s: float | None = None
    """For a streamed answer, its output units per second from the first chunk to the attempt's end."""


class QuotaSample(NamedTuple):
    """A provider's client-side quota at the moment an attempt was granted (the queue lengths are
    those of every provider sharing its quota object, when it shares one: they have one queue)."""

    time: float
    provider: str
    requests_level: float
    tokens_level: float
    in_flight: int
    queued_interactive: int
    queued_background: int


new_task_transition: Callable[..., TaskTransition] = compile_builder(TaskTransition)
new_attempt_record: Callable[..., AttemptRecord] = compile_builder(AttemptRecord)
new_quota_sample: Callable[..., QuotaSample] = compile_builder(QuotaSample)
"""The three records built on every call (a status change, an attempt, a grant), built without a
class call (:func:`aiqsim.core.slot_init.compile_builder`): equal to ``TaskTransition(...)`` etc."""


class StoreWriteFailed(NamedTuple):
    """A store write (or the group commit covering it) failed: ``lost`` names the change that was
    NOT persisted, ``error`` the store's error. The task's submission resolved with
    :class:`~aiqsim.stores.base.StoreWriteError`; the store still holds the task's previous state,
    which :meth:`~aiqsim.scheduler.Scheduler.recover` reconciles after a restart. A lost outcome is
    written again in the background: each retry that fails is one more event, its ``lost`` ending
    in ``"(written again later)"``."""

    time: float
    task_id: str
    key: str
    provider: str
    lost: str
    error: str


class UsageAnomaly(NamedTuple):
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


class LanePaused(NamedTuple):
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


class QueueRejected(NamedTuple):
    """``submit`` refused a task because its priority's queue was full (:class:`QueueFullError`).

    ``queued`` tasks of that priority were waiting in the scheduler (all lanes) against ``limit``;
    ``queued_in_lane`` of them for ``provider`` (for every provider sharing its quota object,
    when it shares one: they have one queue). A run of these means arrivals outpace the
    provider's quota: the signal to shed load upstream, raise the limit or add quota.
    """

    time: float
    provider: str
    priority: int
    queued: int
    limit: int
    queued_in_lane: int


class OwnerUnreadable(NamedTuple):
    """A duplicate stopped waiting on the owner of its key: a run of another process sharing the
    store, whose record cannot be read and reading it again cannot help (a corrupt record, a closed
    store; an unreachable store is waited out instead). One event per duplicate, sent before it ends.

    ``kind`` is ``"task"`` or ``"job"``: ``waiter_id`` is the duplicate task's or job's id, ``key``
    its idempotency key, ``owner_id`` the run it waited on, ``error`` what the store said. A task's
    submission then resolves with :class:`~aiqsim.stores.base.StoreCorruptError` (or
    :class:`~aiqsim.stores.base.StoreClosedError`) and its record stays ``queued``; a job ends
    ``failed`` (``"store failed: ..."``); either is left to :meth:`~aiqsim.scheduler.Scheduler.recover`
    once the store can be read. :attr:`Scheduler.anomalies` counts ``"owner_unreadable"`` once per
    owner.
    """

    time: float
    kind: str
    waiter_id: str
    key: str
    owner_id: str
    error: str


class QuotaUnavailable(NamedTuple):
    """A quota shared through an outside service (a fleet's Redis account) could not be reached:
    no attempt of ``provider`` is granted until it answers again. ``error`` is what the client said.
    The scheduler emits it for a quota object that reports its outages (``report_outages_to``, as
    :class:`aiqsim.fleet.RedisQuota` does). Sent once when an outage begins, not once per attempt
    that waits it out; the next
    :class:`QuotaSample` of the provider says the quota answers again.

    Also emitted, once per answer, when a quota's ``time_until`` answers a wait that is no number of
    seconds >= 0 (NaN, negative, not a number: a bug of the quota, or a bad number from a shared
    one): ``error`` names the quota and the value, and the task it was asked for fails with it.
    """

    time: float
    provider: str
    error: str


class BudgetCharged(NamedTuple):
    """A spend budget (:class:`aiqsim.overload.Budget`) settled an attempt: it had reserved
    ``estimate`` (currency) before the call and charged ``billed`` after it (the provider's reported
    usage times its price; 0 for a failure the provider does not bill). ``tenant`` is ``None`` for
    a task without one. A dashboard sums ``billed`` for the spend, per provider or tenant."""

    time: float
    task_id: str | None
    provider: str
    tenant: str | None
    estimate: float
    billed: float


class BudgetRefused(NamedTuple):
    """A spend budget refused an attempt: ``budget`` (``"per_day"``, ``"per_tenant_per_day[acme]"``)
    had spent (and reserved) ``spent`` of its ``limit`` and the attempt needed ``estimate``; it
    resets at ``resets_at`` (scheduler clock). The task fails with
    :class:`~aiqsim.core.failures.BudgetExceeded`."""

    time: float
    task_id: str | None
    provider: str
    tenant: str | None
    budget: str
    spent: float
    limit: float
    estimate: float
    resets_at: float


def _same_record(self: tuple[Any, ...], other: object) -> bool:
    """Records are equal when they are of the same type and hold the same values."""
    return type(self) is type(other) and tuple.__eq__(self, other)  # type: ignore[arg-type]


def _different_record(self: tuple[Any, ...], other: object) -> bool:
    return not _same_record(self, other)


_RECORDS = (
    TaskTransition,
    AttemptRecord,
    QuotaSample,
    StoreWriteFailed,
    UsageAnomaly,
    LanePaused,
    QueueRejected,
    OwnerUnreadable,
    QuotaUnavailable,
    BudgetCharged,
    BudgetRefused,
)
for _record in _RECORDS:
    # tuple equality would make ``LanePaused(...) == (...)`` true; the hash stays the tuple's,
    # which is consistent (equal records hold equal values)
    _record.__eq__ = _same_record  # type: ignore[assignment,method-assign]
    _record.__ne__ = _different_record  # type: ignore[assignment,method-assign]
del _record

SchedulerEvent = (
    TaskTransition
    | AttemptRecord
    | QuotaSample
    | StoreWriteFailed
    | UsageAnomaly
    | LanePaused
    | QueueRejected
    | OwnerUnreadable
    | QuotaUnavailable
    | BudgetCharged
    | BudgetRefused
)
EventSink = Callable[[SchedulerEvent], None]
