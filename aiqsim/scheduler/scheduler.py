"""The scheduler: one implementation of every scheduling rule, on any :class:`Runtime`.

This module never imports asyncio, simpy or time and never touches the global
``random``: time comes from ``runtime.now()``, waiting from the runtime's futures, and
randomness from the injected ``rng``. The same object runs production traffic on
:class:`~aiqsim.runtime.AsyncioRuntime` and simulations on
:class:`~aiqsim.runtime.SimPyRuntime`.

Flow of a task: ``submit`` fingerprints it and claims its idempotency key in the store.
A duplicate of a finished task ends ``deduped`` at once; a duplicate of a task in flight
waits for that run's outcome. An owner goes into its provider's dispatch queue
(interactive before background, order by the dispatch policy). Each provider lane has one
dispatcher that starts the chosen task as soon as the provider's multi-dimension quota
can cover it. The task then runs its attempts inside ``running``: failures are classified,
retries back off (honouring Retry-After, which pauses the lane for everyone when the
rate-limit scope says the quota is spent, see :mod:`aiqsim.scheduler.rate_limit_scope`) and
re-enter the lane ahead of new work of the same priority.
"""

from __future__ import annotations

import math
import random
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from aiqsim.core.backoff import retry_delay
from aiqsim.core.errors import SchedulingError
from aiqsim.core.failures import (
    AttemptRejectedError,
    FailureClass,
    PoisonInputError,
    RateLimitError,
    TaskInterruptedError,
    classify_failure,
    describe_error,
    retry_after_of,
)
from aiqsim.core.fingerprint import fingerprint
from aiqsim.core.states import transition
from aiqsim.core.task import Priority, TaskRecord, TaskStatus
from aiqsim.core.token_bucket import MultiQuota, QuotaConfigError, QuotaLimits, Reservation
from aiqsim.core.usage import sane_usage
from aiqsim.runtime.protocol import Cancelled, Future, Runtime, TaskHandle
from aiqsim.runtime.sync import Signal
from aiqsim.scheduler.arguments import checked_cost_estimate, checked_providers
from aiqsim.scheduler.commit import DEFAULT_COMMIT_WINDOW_S, GroupCommit, check_commit_window, defers_commits
from aiqsim.scheduler.dispatch import DispatchPolicy, FifoPolicy, QueueItem, TaskQueue
from aiqsim.scheduler.events import (
    AttemptRecord,
    EventSink,
    LanePaused,
    QueueRejected,
    QuotaSample,
    StoreWriteFailed,
    TaskTransition,
    UsageAnomaly,
)
from aiqsim.scheduler.foreign_owner import FOREIGN_SAFETY_POLL_S, announces_changes, store_change
from aiqsim.scheduler.handles import OutcomeHandle, await_own
from aiqsim.scheduler.lane_pump import LanePump
from aiqsim.scheduler.provider import Provider, ProviderRequest, ProviderResponse, SupportsLookup
from aiqsim.scheduler.rate_limit_scope import RateLimitHistory, RateLimitScope, pauses_lane
from aiqsim.scheduler.recovery_lookup import LookupRetry, lookup_with_retries
from aiqsim.scheduler.retry import (
    AttemptGate,
    RetryPolicy,
    abandon_at_gate,
    ask_gates,
    gate_wait_s,
    split_gates,
    tell_gate,
)
from aiqsim.scheduler.store_writes import describe_change, persist, persist_change
from aiqsim.stores.base import StoreWriteError, TaskStore
from aiqsim.stores.memory import MemoryStore

if TYPE_CHECKING:
    from aiqsim.scheduler.jobs import JobHandle, JobRecoveryReport, Jobs, JobSpec

DEFAULT_INTERACTIVE_LIMIT = 5
DEFAULT_BACKGROUND_LIMIT = 2_000
"""Queued background tasks allowed by default. Past it, ``submit`` raises :class:`QueueFullError`
instead of letting a backlog the quota cannot serve grow without bound (at 10x the quota it grew by
~6,700 tasks in 2 minutes, ~2 KB each, and every queued task waits behind all of them). 2,000 is
about 4 MB and far above the deepest backlog of the shipped scenarios (under 1,000); raise it, or pass
``None``, for batch jobs that queue more on purpose."""
_PRIORITIES = tuple(Priority)  # iterating the enum itself is measurably slow on the dispatch path


class QueueFullError(SchedulingError, RuntimeError):
    """Too many queued requests of one priority: the submission was refused and nothing enqueued.

    Arrivals outpace what the provider's quota lets through. Retry later (the queue drains at the
    quota's rate), shed or defer work upstream, raise ``interactive_limit``/``background_limit``,
    or add quota. Each refusal is also a :class:`~aiqsim.scheduler.events.QueueRejected` event.
    """


class SchedulerClosedError(SchedulingError, RuntimeError):
    """The scheduler was closed (or crashed) and takes no more work."""


class TaskFailedError(SchedulingError):
    """Raised by :meth:`Submission.result` for a task that failed (or shared a failed run)."""

    def __init__(self, record: TaskRecord) -> None:
        super().__init__(f"task {record.id!r} failed: {record.error}")
        self.record = record


class TaskCancelledError(SchedulingError):
    """Raised by :meth:`Submission.result` for a cancelled task."""

    def __init__(self, record: TaskRecord) -> None:
        super().__init__(f"task {record.id!r} was cancelled")
        self.record = record


class Submission(OutcomeHandle[TaskRecord]):
    """The handle ``submit`` returns. ``await submission`` gives the result or raises.

    If the task's outcome could not be persisted (a store write failed, or the group commit that
    covered it), the submission resolves with :class:`~aiqsim.stores.base.StoreWriteError`:
    ``await submission``, :meth:`result` and :meth:`wait` raise it. A success is only ever reported
    after its terminal write is durable. :meth:`wait` gives the final task record and never raises
    for a task failure; :meth:`result` does.
    """

    __slots__ = ("_accepted",)
    _repr_name = "Submission"

    def __init__(
        self,
        task_id: str,
        key: str,
        future: Future[TaskRecord],
        new_future: Callable[[], Future[TaskRecord]] | None = None,
        accepted: Future[StoreWriteError | None] | None = None,
    ) -> None:
        super().__init__(task_id, key, future, new_future)
        self._accepted = accepted

    async def accepted(self) -> None:
        """Wait until this submission's own record is durable in the store; raise
        :class:`~aiqsim.stores.base.StoreWriteError` if it never will be (the submission is lost).

        With a store that commits each write (every store by default) the record is durable when
        ``submit`` returns and this returns at once; with a group-commit store it waits for the
        flush that covers the record (at most the commit window plus one flush).
        """
        if self._accepted is not None:
            error = await await_own(self._accepted, self._new_future)
            if error is not None:
                raise error

    async def result(self) -> Any:
        """The task's result; raises :class:`TaskFailedError` or :class:`TaskCancelledError`."""
        record = await self.wait()
        if record.status is TaskStatus.CANCELLED:
            raise TaskCancelledError(record)
        if record.status is TaskStatus.FAILED or record.error is not None:
            raise TaskFailedError(record)
        return record.result


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What :meth:`Scheduler.recover` found in the store after a restart.

    ``orphans_completed``: tasks found running whose work the provider had already done (completed
    from its record, no second call). ``orphans_failed``: running tasks failed as interrupted.
    ``orphans_requeued``: running tasks sent again (``requeue_interrupted``). ``queued_resumed``:
    queued owners put back in their queues. ``duplicates_reattached``: queued duplicates waiting on
    their owner again. ``left_to_other_workers``: tasks of other live workers, left alone.
    """

    orphans_completed: int
    orphans_failed: int
    orphans_requeued: int
    queued_resumed: int
    duplicates_reattached: int
    left_to_other_workers: int = 0
    """Queued or running tasks held by workers this recovery did not adopt (they were not touched)."""
    left_for_unknown_providers: int = 0
    """Queued or running tasks for providers this scheduler lacks, left as they were (``"leave"``)."""
    undecided: tuple[str, ...] = ()
    """Ids of orphans whose provider lookup kept failing: left ``running`` as they were (neither
    failed nor re-sent, since the provider may have done the work). Call ``recover()`` again later."""


@dataclass(eq=False, slots=True)
class _Ticket:
    """A running task's request for quota for its next attempt."""

    task_id: str
    cost: float
    future: Future[Reservation]
    removed: bool = False


@dataclass(eq=False, slots=True)
class _Live:
    """In-process state of a task that is not yet terminal here."""

    record: TaskRecord
    future: Future[TaskRecord]
    queue_item: QueueItem | None = None
    runner: TaskHandle[None] | None = None
    started: bool = False
    cancel_requested: bool = False
    waiting_on: str | None = None
    finishing: bool = False
    """The terminal write is staged and waits for its group commit; the task can no longer change."""
    lost: StoreWriteError | None = None
    """Set when the task's record was rolled back before its runner started: it must not run."""
    retry: RetryPolicy | None = None  # this task's own policy (a job stage's), else the scheduler's


@dataclass(frozen=True, slots=True)
class _Unpersisted:
    """A task whose change this process could not persist: what was lost, and the terminal record
    it was to write (``None`` unless it was an outcome), which a later duplicate writes late."""

    what: str
    outcome: TaskRecord | None


@dataclass(eq=False)
class _Lane:
    """One provider: its quota, its queues and its dispatcher."""

    name: str
    provider: Provider
    quota: MultiQuota
    queues: dict[Priority, TaskQueue]
    pump: LanePump = field(init=False)
    """Runs the lane's dispatch (``Scheduler._dispatch``) when woken, or when its wait for quota ends."""
    retries: dict[Priority, deque[_Ticket]] = field(default_factory=lambda: {p: deque() for p in Priority})
    slot_blocked: bool = False
    """The dispatcher waits for a concurrency slot: only a release can unblock it, not new work."""
    rate_limits: RateLimitHistory = field(default_factory=RateLimitHistory)
    """The lane's recent share of 429s (read by the ``adaptive`` rate-limit scope)."""


def _lane_quota(given: QuotaLimits | Any, now: float) -> Any:
    """A lane's quota: a local :class:`MultiQuota` built from :class:`QuotaLimits` (unlimited when
    absent), or a quota object given as is — e.g. :class:`aiqsim.fleet.RedisQuota`, shared by a
    fleet — with the same reserve/release/reconcile interface."""
    if given is None:
        return MultiQuota(QuotaLimits(), now=now)
    if isinstance(given, QuotaLimits):
        return MultiQuota(given, now=now)
    missing = [name for name in _QUOTA_METHODS if not callable(getattr(given, name, None))]
    if missing:
        raise QuotaConfigError(
            f"a quota must be QuotaLimits or an object with {', '.join(_QUOTA_METHODS)}; "
            f"{type(given).__name__} lacks {', '.join(missing)}"
        )
    return given


_QUOTA_METHODS = ("check_cost", "try_reserve", "time_until", "release", "cancel", "reconcile", "pause_until")


def _checked_worker_id(value: str | None, what: str) -> str | None:
    """A worker id is a non-empty string; ``None`` means "no worker id" (tasks of a single user)."""
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"{what} must be a non-empty string or None, got {value!r}")
    return value


class Scheduler:
    """Schedules provider calls under quotas, with retries, idempotency and cancellation.

    Parameters:
        runtime: where the coroutines run (asyncio for production, SimPy for simulation).
        providers: provider adapters by name; a task goes to ``provider=`` or, by default,
            the provider named like its ``kind``.
        quotas: client-side limits per provider name (unlimited when absent): ``QuotaLimits``, or a
            quota object shared with other workers (:class:`aiqsim.fleet.RedisQuota`).
        store: task store; an in-memory one by default.
        dispatch: dispatch policy for every lane (FIFO by default).
        retry: retry policy (full jitter, 5 attempts, 60 s attempt timeout by default).
        interactive_limit: queued interactive tasks allowed at once; one more raises
            :class:`QueueFullError`. ``background_limit`` likewise (:data:`DEFAULT_BACKGROUND_LIMIT`
            by default; ``None``: unbounded). Duplicates enqueue nothing and are exempt, except an
            interactive duplicate that lifts its queued owner into the interactive queue.
        rng: the only source of randomness (jitter, task ids). Seed it for reproducible runs.
        events: a sink for :mod:`aiqsim.scheduler.events` records (e.g. ``list.append``).
        gates: overload guards consulted before each attempt (retry budgets, breakers...).
        poison_fallback: called with the record of a task whose input proved poison; its
            return value becomes the task's result (the task still records the poison).
        duplicate_poll_s: how often to check a key owned by *another process* sharing the store.
        worker_id: this scheduler instance's name when several processes share one store. Its
            tasks carry it, and :meth:`recover` then adopts only its own (see there). Give each
            live process its own id, and the same id to the process that replaces it.
        commit_window_s: with a store that defers commits (``SqliteStore(path, group_commit=True)``),
            how long staged writes wait to share one flush (see :mod:`aiqsim.scheduler.commit`).
            Ignored by stores that commit every write.

    Failed store writes. A store write that fails (disk full, read-only file, I/O error; a raw
    ``OSError`` or ``sqlite3`` error is wrapped) fails only the task it was for: its submission
    resolves with :class:`~aiqsim.stores.base.StoreWriteError` naming the change that was not
    persisted, a :class:`~aiqsim.scheduler.events.StoreWriteFailed` event is emitted and counted
    in :attr:`store_write_failures`, its quota reservation and concurrency slot are given back, and
    the scheduler keeps serving: the next writes may succeed once the disk has room. Nothing is
    reported succeeded unless its terminal write persisted. The store keeps the task's previous
    state (``queued``, or ``running`` when the outcome write failed); :meth:`recover` after a restart
    reconciles it with the provider like any orphan. A later duplicate of its key submitted to this
    scheduler first writes the lost outcome late (the disk may have room again), then shares it as
    usual (a success dedups, a failure frees the key); when that write fails too, or the lost change
    was the ``running`` write, the duplicate resolves with ``StoreWriteError`` at once. It never
    waits for a run this process will not finish, and the key is never sent again (the provider may
    have done the work). A failing ``submit`` write raises ``StoreWriteError`` from ``submit``.

    Hostile usage. A response's usage is clamped before the token bucket is reconciled (the rule
    is :func:`aiqsim.core.usage.sane_usage`); the call still succeeds, and the anomaly is emitted
    as :class:`~aiqsim.scheduler.events.UsageAnomaly` and counted in :attr:`anomalies`.
    """

    def __init__(
        self,
        runtime: Runtime,
        providers: Mapping[str, Provider] | Iterable[Provider],
        *,
        quotas: Mapping[str, QuotaLimits] | None = None,
        store: TaskStore | None = None,
        dispatch: DispatchPolicy | None = None,
        retry: RetryPolicy | None = None,
        interactive_limit: int | None = DEFAULT_INTERACTIVE_LIMIT,
        background_limit: int | None = DEFAULT_BACKGROUND_LIMIT,
        rng: random.Random | None = None,
        events: EventSink | None = None,
        gates: Iterable[AttemptGate] = (),
        poison_fallback: Callable[[TaskRecord], Awaitable[Any]] | None = None,
        duplicate_poll_s: float = 0.5,
        worker_id: str | None = None,
        commit_window_s: float = DEFAULT_COMMIT_WINDOW_S,
    ) -> None:
        providers = checked_providers(providers)
        self.worker_id = _checked_worker_id(worker_id, "worker_id")
        check_commit_window(commit_window_s)
        self.runtime = runtime
        self.store: TaskStore = store if store is not None else MemoryStore()
        self.dispatch = dispatch if dispatch is not None else FifoPolicy()
        self.retry = retry if retry is not None else RetryPolicy()
        self.rng = rng if rng is not None else random.Random()
        self.events = events
        # a sink may decline the per-grant quota samples (the call log does: it has no use for them)
        self._quota_events = events is not None and getattr(events, "wants_quota_samples", True)
        self.gates = tuple(gates)
        self._early_gates, self._late_gates = split_gates(self.gates)
        self.poison_fallback = poison_fallback
        if not duplicate_poll_s > 0:
            raise ValueError(f"duplicate_poll_s must be > 0, got {duplicate_poll_s!r}")
        self.duplicate_poll_s = duplicate_poll_s
        self._limits = {Priority.INTERACTIVE: interactive_limit, Priority.BACKGROUND: background_limit}
        self._queued = dict.fromkeys(Priority, 0)
        if not isinstance(providers, Mapping):
            providers = {p.name: p for p in providers}
        quotas = dict(quotas or {})
        unknown = set(quotas) - set(providers)
        if unknown:
            raise ValueError(f"quotas given for unknown providers: {sorted(unknown)}")
        now = runtime.now()
        self._lanes: dict[str, _Lane] = {
            name: _Lane(
                name=name,
                provider=provider,
                quota=_lane_quota(quotas.get(name), now),
                queues={p: self.dispatch.new_queue() for p in Priority},
            )
            for name, provider in providers.items()
        }
        for lane in self._lanes.values():
            lane.pump = LanePump(runtime, partial(self._dispatch, lane), f"dispatch-{lane.name}")
        self._live: dict[str, _Live] = {}
        self._waiters: dict[str, list[str]] = {}
        self._watchers: dict[str, TaskHandle[None]] = {}
        self._idle = Signal(runtime)
        self._seq = 0
        self._started = False
        self._closed = False
        self._crashed = False
        self._commit: GroupCommit | None = (
            GroupCommit(runtime, self.store, commit_window_s, self._batch_lost)
            if defers_commits(self.store)
            else None
        )
        self._unpersisted: dict[str, _Unpersisted] = {}
        """Task id -> the change of that task this process could not persist (see the class docs)."""
        self._healing: set[str] = set()
        self.store_write_failures = 0
        """Submissions resolved with ``StoreWriteError`` (their outcome, or their owner's, not persisted)."""
        self.anomalies: Counter[str] = Counter()
        """Provider anomalies seen and defused, by kind (e.g. ``"usage"``)."""
        self._jobs: Jobs | None = None  # created on first use of jobs (aiqsim.scheduler.jobs)
        self.job_recovery: JobRecoveryReport | None = None  # what the last recover() did to jobs

    # ------------------------------------------------------------------ public API
    @property
    def providers(self) -> list[str]:
        """Provider (lane) names."""
        return list(self._lanes)

    def quota(self, provider: str) -> MultiQuota:
        """The live client-side quota of ``provider`` (for inspection and header corrections)."""
        return self._lanes[provider].quota

    def queued(self, priority: Priority | None = None) -> int:
        """Tasks waiting in dispatch queues (of one priority, or all)."""
        if priority is None:
            return sum(self._queued.values())
        return self._queued[priority]

    def sample_quotas(self) -> None:
        """Emit a :class:`QuotaSample` for every provider now (bucket levels, in-flight calls, queue depths).

        The scheduler samples on its own each time it grants an attempt; call this periodically to
        also see the quiet stretches (a refilling bucket, a growing queue while nothing can start).
        """
        if self.events is not None:
            now = self.runtime.now()
            for lane in self._lanes.values():
                self._emit_quota(lane, now)

    @property
    def in_flight(self) -> int:
        """Tasks submitted to this scheduler that have not reached a terminal state."""
        return len(self._live)

    def submit(
        self,
        kind: str,
        payload: Any,
        *,
        provider: str | None = None,
        priority: Priority = Priority.BACKGROUND,
        cost_estimate: float | None = None,
        key: str | None = None,
        params: Mapping[str, Any] | None = None,
        version: str = "",
        task_id: str | None = None,
        job_stage: bool = False,
        retry: RetryPolicy | None = None,
    ) -> Submission:
        """Queue one call and return its :class:`Submission` handle.

        The idempotency ``key`` defaults to the fingerprint of (kind, version, params,
        payload). Raises :class:`QueueFullError` when the priority's queue is at its depth
        limit, ``ValueError`` for an unknown provider, and
        :class:`~aiqsim.core.token_bucket.QuotaConfigError` for a cost the quota could never grant.
        ``job_stage`` is set by :mod:`aiqsim.scheduler.jobs` for a job's stage tasks: the depth
        limit counts their job once, not each of them. ``retry`` replaces the scheduler's retry
        policy for this task in this process (not persisted: a task resumed by :meth:`recover`
        runs under the scheduler's policy).
        """
        if self._closed:
            raise SchedulerClosedError("scheduler is closed")
        lane_name = provider if provider is not None else kind
        lane = self._lanes.get(lane_name)
        if lane is None:
            raise ValueError(f"no provider named {lane_name!r}; known: {sorted(self._lanes)}")
        if type(priority) is not Priority:
            priority = Priority(priority)
        if cost_estimate is None:
            estimate = getattr(lane.provider, "estimate_cost", None)
            cost_estimate = float(estimate(kind, payload)) if callable(estimate) else 0.0
        cost_estimate = checked_cost_estimate(cost_estimate)
        lane.quota.check_cost(cost_estimate)
        if key is None:
            key = fingerprint(kind, payload, params=params, version=version)
        existing = self.store.owner_of(key)
        is_duplicate = existing is not None and existing.status in (
            TaskStatus.QUEUED,
            TaskStatus.RUNNING,
            TaskStatus.SUCCEEDED,
        )
        limit = self._limits[priority]
        # A duplicate enqueues nothing, unless it moves its queued owner into its own (higher) queue;
        # a job's stage tasks are counted as their job (see Jobs.depth).
        counts_against_limit = not job_stage and (
            not is_duplicate or (existing is not None and self._would_promote(existing.id, priority))
        )
        if counts_against_limit and limit is not None and self._depth(priority) >= limit:
            raise self._queue_full(lane, priority, limit)
        now = self.runtime.now()
        record = TaskRecord(
            id=task_id if task_id is not None else f"{self.rng.getrandbits(64):016x}",
            key=key,
            kind=kind,
            provider=lane_name,
            priority=priority,
            cost_estimate=float(cost_estimate),
            created_at=now,
            updated_at=now,
            payload=payload,
            worker=self.worker_id,
        )
        owner = persist_change(None, record, self.store.insert_and_claim, record)
        self._staged(record.id)
        accepted = self._commit.durable() if self._commit is not None else None
        live = _Live(record=record, future=self.runtime.create_future(), retry=retry)
        self._live[record.id] = live
        self._emit_transition(None, record)
        self._ensure_started()
        self._follow_owner(live, owner)
        return Submission(record.id, key, live.future, self.runtime.create_future, accepted)

    async def submit_durable(self, kind: str, payload: Any, **options: Any) -> Submission:
        """:meth:`submit`, then wait until the submission's record is durable (:meth:`Submission.accepted`).

        Use it where the caller acknowledges the request to someone else (an HTTP 202, a queue
        ack): once it returns, a crash cannot lose the submission. Raises what ``submit`` raises,
        and :class:`~aiqsim.stores.base.StoreWriteError` if the record could not be persisted.
        """
        submission = self.submit(kind, payload, **options)
        await submission.accepted()
        return submission

    def submit_job(
        self,
        spec: JobSpec,
        inputs: Any,
        *,
        priority: Priority = Priority.BACKGROUND,
        job_id: str | None = None,
    ) -> JobHandle:
        """Run a pipeline of calls (a :class:`~aiqsim.scheduler.jobs.JobSpec`) on ``inputs``.

        Returns a :class:`~aiqsim.scheduler.jobs.JobHandle`: ``await`` it for ``{stage: result}``.
        Rules (idempotency, depth limit, failure, recovery): :mod:`aiqsim.scheduler.jobs`.
        """
        return self.jobs.submit(spec, inputs, priority=priority, job_id=job_id)

    @property
    def jobs(self) -> Jobs:
        """This scheduler's jobs orchestrator (created on first use; see :mod:`aiqsim.scheduler.jobs`)."""
        from aiqsim.scheduler.jobs import jobs_of

        return jobs_of(self)

    def _depth(self, priority: Priority) -> int:
        """Queued requests of ``priority`` as its depth limit counts them (a job counts once)."""
        return self._queued[priority] if self._jobs is None else self._jobs.depth(priority)

    def _queue_full(self, lane: _Lane, priority: Priority, limit: int) -> QueueFullError:
        """The refusal of one more ``priority`` task, reported as an event first."""
        queued = self._queued[priority]
        name = priority.name.lower()
        if self.events is not None:
            in_lane = len(lane.queues[priority])
            self.events(QueueRejected(self.runtime.now(), lane.name, int(priority), queued, limit, in_lane))
        return QueueFullError(
            f"too many {name} requests: {queued} already queued (limit {limit}), nothing was enqueued. "
            f"Retry later (the queue drains at the provider's quota), raise {name}_limit, or add quota"
        )

    def cancel(self, task_id: str) -> bool:
        """Cancel a queued or running task of this scheduler; False if it is not live here.

        A queued task ends ``cancelled`` at once; a running one receives a cancellation at
        its current await (an in-flight provider call is abandoned) and ends ``cancelled``.
        """
        live = self._live.get(task_id)
        if live is None or live.cancel_requested or live.finishing or self._crashed:
            return False
        live.cancel_requested = True
        if live.queue_item is not None:
            lane = self._lanes[live.record.provider]
            lane.queues[live.record.priority].pop(live.queue_item)
            self._queued[live.record.priority] -= 1
            live.queue_item = None
            lane.pump.wake()
            self._finish(live, TaskStatus.CANCELLED)
        elif live.waiting_on is not None:
            waiters = self._waiters.get(live.waiting_on)
            if waiters and task_id in waiters:
                waiters.remove(task_id)
            live.waiting_on = None
            self._finish(live, TaskStatus.CANCELLED)
        elif live.runner is not None and live.started:
            live.runner.cancel()
        return True

    def retry_failed(self, task_id: str) -> Submission:
        """Manually retry a failed task: it moves failed -> queued and runs again (new attempts).

        Raises ``KeyError`` for an unknown id and
        :class:`~aiqsim.core.states.IllegalTransitionError` for a task that is not failed.
        """
        if self._closed:
            raise SchedulerClosedError("scheduler is closed")
        record = self.store.get(task_id)
        if record is None:
            raise KeyError(f"unknown task id {task_id!r}")
        failed = record
        record = transition(record, TaskStatus.QUEUED, self.runtime.now(), worker=self.worker_id)
        persist_change(failed, record, self.store.update, record)
        self._staged(record.id)
        accepted = self._commit.durable() if self._commit is not None else None
        self._emit_transition(TaskStatus.FAILED, record)
        live = _Live(record=record, future=self.runtime.create_future())
        self._live[record.id] = live
        self._ensure_started()
        self._claim_and_follow(live)
        return Submission(record.id, record.key, live.future, self.runtime.create_future, accepted)

    async def join(self) -> None:
        """Wait until every task submitted here is terminal."""
        while self._live:
            await self._idle.wait()

    async def close(self, *, cancel_pending: bool = True) -> None:
        """Stop taking work; cancel what is still live (or wait for it) and stop the dispatchers."""
        if self._jobs is not None:  # a job's later stages are submitted while it runs
            await self._jobs.close(cancel_pending=cancel_pending)
        self._closed = True  # refuse new submissions while the live ones finish
        if cancel_pending:
            for task_id in list(self._live):
                self.cancel(task_id)
        await self.join()
        if self._commit is not None:
            self._commit.stop(flush=True)
        self._stop_background()

    async def __aenter__(self) -> Scheduler:
        self._ensure_started()
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        await self.close(cancel_pending=exc_type is not None)

    def crash(self) -> None:
        """Simulate the process dying: every coroutine stops where it is, nothing more is written.

        Handles stay unresolved, exactly as they would be for a killed process. A new
        Scheduler on the same store then calls :meth:`recover`.
        """
        self._crashed = True
        self._closed = True
        if self._jobs is not None:
            self._jobs.crash()
        for live in self._live.values():
            if live.runner is not None:
                live.runner.cancel()
        if self._commit is not None:
            self._commit.stop(flush=False)
        self._stop_background()

    async def recover(
        self,
        *,
        requeue_interrupted: bool = False,
        use_lookup: bool = True,
        workers: Iterable[str | None] | None = None,
        unknown_providers: str = "raise",
        lookup_retry: LookupRetry | None = None,
    ) -> RecoveryReport:
        """Reconcile the store after a restart; call once before submitting new work.

        Tasks found ``running`` are orphans of the dead process. If their provider can look
        up the idempotency key and already did the work, the task is completed from the
        provider's record (no second call, no second bill); otherwise it fails with
        :class:`~aiqsim.core.failures.TaskInterruptedError`, or is requeued when
        ``requeue_interrupted``. Queued tasks resume: owners go back to their queues and
        duplicates wait for their owner again. ``use_lookup=False`` skips the provider lookup
        (to measure what reconciliation saves).

        Which tasks are adopted: with ``workers``, those held by any of these worker ids (``None``
        in it stands for tasks written without one); otherwise, for a scheduler with a
        ``worker_id``, its own; otherwise every task in the store (a store with one user).
        Adopted tasks carry this scheduler's ``worker_id`` from then on. Tasks held by other
        workers are not touched: their processes are alive and still running them.

        Recovery trusts that each worker id is held by one live process at a time, and that a
        dead worker's tasks (``workers=["its-id"]``) are taken over by one process only. A takeover
        cut short by a crash is finished with ``workers=["its-id", own_id]`` (what was already
        taken over carries this worker's id). A store written before worker ids has tasks without
        one: give ``workers=[None, own_id]`` once to adopt them.

        Unfinished tasks for a provider this scheduler was not given raise ``ValueError`` before
        anything is written (``unknown_providers="raise"``); with ``"leave"`` they stay in the
        store as they are, for a scheduler that has the provider, and are counted in the report.

        A lookup that fails or hangs is retried with backoff (``lookup_retry``, see
        :class:`~aiqsim.scheduler.recovery_lookup.LookupRetry`; 4 attempts by default) and never
        stops the recovery of the other orphans. An orphan whose lookups all failed is left
        ``running``, untouched (not failed: the provider may have done, and billed, the work), and
        its id is listed in ``RecoveryReport.undecided``; call ``recover()`` again once the provider
        answers. A store write that fails raises :class:`~aiqsim.stores.base.StoreWriteError`
        (the orphans already reconciled stay reconciled).
        """
        if unknown_providers not in ("raise", "leave"):
            raise ValueError(f"unknown_providers must be 'raise' or 'leave', got {unknown_providers!r}")
        adopted = self._adopted_workers(workers)

        def ours(record: TaskRecord) -> bool:
            return adopted is None or record.worker in adopted or record.id in requeued_ids

        requeued_ids: set[str] = set()
        unknown = self._unknown_provider_tasks(ours)
        if unknown and unknown_providers == "raise":
            names = sorted({record.provider for record in unknown.values()})
            raise ValueError(
                f"the store holds {len(unknown)} unfinished task(s) for provider(s) {names} that this "
                f"scheduler was not given (it has {sorted(self._lanes)}); nothing was recovered. Add "
                "those providers, or pass unknown_providers='leave' to leave the tasks in the store"
            )
        completed = failed = requeued = resumed = reattached = left = 0
        undecided: list[str] = []
        retry = lookup_retry if lookup_retry is not None else LookupRetry()
        me = self.worker_id
        for orphan in self.store.list_by_status(TaskStatus.RUNNING):
            if orphan.id in self._live or orphan.id in unknown:
                continue  # running here, in this process (not an orphan), or not ours to run
            if not ours(orphan):
                left += 1
                continue
            lane = self._lanes.get(orphan.provider)
            response: ProviderResponse | None = None
            if use_lookup and lane is not None and isinstance(lane.provider, SupportsLookup):
                outcome = await lookup_with_retries(self.runtime, lane.provider, orphan.key, retry, self.rng)
                if not outcome.decided:
                    undecided.append(orphan.id)
                    continue
                response = outcome.response
            now = self.runtime.now()
            if response is not None:
                done = transition(orphan, TaskStatus.SUCCEEDED, now, result=response.result, worker=me)
                self._write(done)
                self._emit_transition(TaskStatus.RUNNING, done)
                completed += 1
                continue
            error = describe_error(TaskInterruptedError("process stopped while the task was running"))
            done = transition(orphan, TaskStatus.FAILED, now, error=error, worker=me)
            if requeue_interrupted:
                # running -> failed -> queued through the table, but one write: a crash between two
                # writes would strand the task in failed.
                again = transition(done, TaskStatus.QUEUED, now)
                self._write(again)
                self._emit_transition(TaskStatus.RUNNING, done)
                self._emit_transition(TaskStatus.FAILED, again)
                requeued_ids.add(again.id)
                requeued += 1
            else:
                self._write(done)
                self._emit_transition(TaskStatus.RUNNING, done)
                failed += 1
        for queued in self.store.list_by_status(TaskStatus.QUEUED):
            if queued.id in self._live or queued.id in unknown:
                continue
            if not ours(queued):  # requeued orphans are ours, whatever worker they came from
                left += 1
                continue
            if queued.worker != me:  # taken over from another worker: say so in the store first
                queued = queued.evolve(worker=me)
                self._write(queued)
            owner = persist(f"claim of key {queued.key!r} by task {queued.id!r}", self.store.claim, queued)
            self._staged(queued.id)
            live = _Live(record=queued, future=self.runtime.create_future())
            self._live[queued.id] = live
            if owner.id == queued.id:
                resumed += queued.id not in requeued_ids  # requeued orphans are counted once, above
            else:
                reattached += 1
            self._follow_owner(live, owner)
        if self._live:
            self._ensure_started()
        from aiqsim.scheduler.jobs import recover_jobs  # jobs build on this module

        self.job_recovery = await recover_jobs(self, adopted)  # re-drive jobs once their tasks are settled
        if self._commit is not None:  # what recovery wrote is durable before it reports it
            lost = await self._commit.durable()
            if lost is not None:
                raise lost
        return RecoveryReport(
            completed, failed, requeued, resumed, reattached, left, len(unknown), tuple(undecided)
        )

    def _unknown_provider_tasks(self, ours: Callable[[TaskRecord], bool]) -> dict[str, TaskRecord]:
        """Running and queued tasks that recovery would adopt but that name no provider of ours."""
        return {
            record.id: record
            for record in self.store.list_by_status(TaskStatus.RUNNING, TaskStatus.QUEUED)
            if record.provider not in self._lanes and record.id not in self._live and ours(record)
        }

    def _adopted_workers(self, workers: Iterable[str | None] | None) -> frozenset[str | None] | None:
        """The worker ids whose tasks :meth:`recover` takes on (``None``: every task)."""
        if isinstance(workers, str):
            raise TypeError(f"workers takes a collection of worker ids, not one string: use [{workers!r}]")
        if workers is not None:
            return frozenset(_checked_worker_id(worker, "each of workers") for worker in workers)
        if self.worker_id is not None:
            return frozenset({self.worker_id})
        return None

    def submission(self, task_id: str) -> Submission | None:
        """A handle for a task that is live in this scheduler (e.g. one resumed by ``recover``)."""
        live = self._live.get(task_id)
        if live is None:
            return None
        return Submission(task_id, live.record.key, live.future, self.runtime.create_future)

    # ------------------------------------------------------------------ claims and duplicates
    def _follow_owner(self, live: _Live, owner: TaskRecord) -> None:
        record = live.record
        if owner.id == record.id:
            self._enqueue(live)
            waiting = self._waiters.get(record.id)
            if waiting:  # waiters attached before this owner was live here (recovery order)
                priorities = [self._live[w].record.priority for w in waiting if w in self._live]
                if priorities:
                    self._inherit_priority(live, min(priorities))
        elif owner.status is TaskStatus.SUCCEEDED:
            self._finish(live, TaskStatus.DEDUPED, result=owner.result, deduped_from=owner.id)
        elif owner.id in self._unpersisted and owner.id not in self._live:
            self._follow_unpersisted(live, owner)  # its run ended here, unrecorded: never wait for it
        else:
            live.waiting_on = owner.id
            self._waiters.setdefault(owner.id, []).append(record.id)
            owner_live = self._live.get(owner.id)
            if owner_live is not None:
                self._inherit_priority(owner_live, record.priority)
            elif owner.id not in self._watchers:
                self._watchers[owner.id] = self.runtime.spawn(
                    self._watch_foreign_owner(owner.id), name=f"watch-{owner.id}"
                )

    def _follow_unpersisted(self, live: _Live, owner: TaskRecord) -> None:
        """``live`` duplicates a key whose owner's run ended in this process without its outcome
        reaching the store (which still says ``owner.status``). Write that outcome now (the disk
        may have room again) and follow the key as usual: a success dedups, a failure frees the
        key. If it cannot be written (or there is no outcome to write: the lost change was the
        ``running`` one), the duplicate resolves with ``StoreWriteError`` at once."""
        outcome = self._unpersisted[owner.id].outcome
        if outcome is not None and owner.id not in self._healing:
            try:
                self._write(outcome, owner)
            except StoreWriteError:
                pass
            else:
                self._emit_transition(owner.status, outcome)
                self._healing.add(owner.id)  # a store that still says otherwise cannot loop us
                try:
                    self._claim_and_follow(live)
                finally:
                    self._healing.discard(owner.id)
                return
        self._lose_duplicate(live, owner.id)

    def _claim_and_follow(self, live: _Live) -> None:
        """Claim ``live``'s key for it (it is stored already) and follow whoever owns the key."""
        record = live.record
        try:
            owner = persist(f"claim of key {record.key!r} by task {record.id!r}", self.store.claim, record)
        except StoreWriteError as error:
            self._lose(live, error)
            return
        self._staged(record.id)
        self._follow_owner(live, owner)

    def _would_promote(self, owner_id: str, priority: Priority) -> bool:
        """Whether a duplicate of ``priority`` would move its owner, queued here, into a higher queue."""
        owner = self._live.get(owner_id)
        return owner is not None and owner.queue_item is not None and priority < owner.record.priority

    def _inherit_priority(self, owner: _Live, priority: Priority) -> None:
        """Raise a live owner to its waiter's priority, so no waiter waits behind a lower class.

        Without this, an interactive duplicate of a queued background task waits for the
        background backlog ahead of its owner (priority inversion through dedup). A queued owner
        moves to the waiter's queue (behind the work already queued there); a running owner waiting
        for a retry ticket has its ticket moved; a running owner in backoff asks for its next ticket
        in the new class; an owner whose call is in flight has nothing to move. The new priority is
        the owner's from then on (its record carries it, persisted with its next transition; after
        a crash, :meth:`recover` re-attaches the waiter and the owner inherits again).
        """
        old = owner.record.priority
        if priority >= old:
            return
        owner.record = owner.record.evolve(priority=priority)
        lane = self._lanes[owner.record.provider]
        if owner.queue_item is not None:
            lane.queues[old].pop(owner.queue_item)
            self._queued[old] -= 1
            owner.queue_item = None
            self._enqueue(owner)
        else:
            tickets = lane.retries[old]
            for ticket in tickets:
                if ticket.task_id == owner.record.id and not ticket.removed and not ticket.future.done():
                    tickets.remove(ticket)
                    lane.retries[priority].append(ticket)
                    lane.pump.wake()
                    break

    def _enqueue(self, live: _Live) -> None:
        record = live.record
        lane = self._lanes[record.provider]
        self._seq += 1
        item = QueueItem(record.id, record.cost_estimate, self.runtime.now(), self._seq)
        live.queue_item = item
        lane.queues[record.priority].push(item)
        self._queued[record.priority] += 1
        if not lane.slot_blocked:  # new work cannot help a dispatcher that waits for a free slot
            lane.pump.wake()

    def _resolve_waiters(self, owner_id: str, owner: TaskRecord | None) -> None:
        """The run of ``owner_id`` ended (``owner`` is its terminal record): share it with the
        duplicates waiting on it. ``owner`` is ``None`` when the record is gone from the store (a
        retention purge took it, and its key, between two polls of another process's run): there is
        nothing to share, and the key is free, as after a cancelled owner."""
        waiter_ids = self._waiters.pop(owner_id, ())
        for waiter_id in waiter_ids:
            waiter = self._live.get(waiter_id)
            if waiter is None or waiter.waiting_on != owner_id:
                continue
            waiter.waiting_on = None
            if owner is not None and owner.status in (TaskStatus.SUCCEEDED, TaskStatus.FAILED):
                self._finish(
                    waiter,
                    TaskStatus.DEDUPED,
                    result=owner.result,
                    error=owner.error,
                    deduped_from=owner.id,
                )
            else:  # the owner was cancelled (or purged): the first waiter takes over the key
                self._claim_and_follow(waiter)

    async def _watch_foreign_owner(self, owner_id: str) -> None:
        """Wait until the run of a key owned by another process is terminal.

        A store that announces terminal transitions (PostgreSQL's ``NOTIFY``) on a runtime that can
        wait on a descriptor wakes the watcher when one happens, anywhere in the fleet; it looks at
        the store then, and otherwise only every ``max(FOREIGN_SAFETY_POLL_S, duplicate_poll_s)``
        as a safety net. Otherwise it polls every
        ``duplicate_poll_s`` (see :func:`~aiqsim.scheduler.foreign_owner.store_change`).
        """
        notified = announces_changes(self.runtime, self.store)
        try:
            if notified:
                self.store.notification_fileno()  # listen first, then look: nothing falls in between
            while True:
                if not notified:
                    await self.runtime.sleep(self.duplicate_poll_s)
                owner = self.store.get(owner_id)  # after LISTEN began: no announcement is missed
                if owner is None or owner.status.is_terminal:
                    break
                if notified:
                    safety_poll = max(FOREIGN_SAFETY_POLL_S, self.duplicate_poll_s)
                    await store_change(self.runtime, self.store, safety_poll)
        finally:
            self._watchers.pop(owner_id, None)
        self._resolve_waiters(owner_id, owner)

    # ------------------------------------------------------------------ dispatch
    def _ensure_started(self) -> None:
        if self._started or self._closed:
            return
        self._started = True
        for lane in self._lanes.values():
            lane.pump.wake()

    def _stop_background(self) -> None:
        for lane in self._lanes.values():
            lane.pump.stop()
        for watcher in list(self._watchers.values()):
            watcher.cancel()
        self._watchers.clear()

    def _next_candidate(self, lane: _Lane, now: float) -> tuple[_Ticket | QueueItem, Priority] | None:
        for priority in _PRIORITIES:
            tickets = lane.retries[priority]
            while tickets and (tickets[0].removed or tickets[0].future.done()):
                tickets.popleft()
            if tickets:
                return tickets[0], priority
            item = lane.queues[priority].peek(now)
            if item is not None:
                return item, priority
        return None

    def _dispatch(self, lane: _Lane) -> float | None:
        """Start every task ``lane``'s quota admits now, in the dispatch policy's order.

        The policy's choice is never skipped: when it must wait for quota, so does the lane. Returns
        how long until it may start (``None``: until a wake-up, as when nothing is queued or only a
        release can free a slot). Run by the lane's :class:`~aiqsim.scheduler.lane_pump.LanePump`.
        """
        runtime = self.runtime
        quota = lane.quota
        lane.slot_blocked = False
        now = runtime.now()  # one reading: no time passes while it runs
        while True:
            choice = self._next_candidate(lane, now)
            if choice is None:
                return None
            candidate, priority = choice
            try:
                reservation = quota.try_reserve(candidate.cost, now)
            except QuotaConfigError as error:  # e.g. recovered from a process with a larger burst
                assert isinstance(candidate, QueueItem)  # a ticket's cost was granted once already
                lane.queues[priority].pop(candidate)
                self._queued[priority] -= 1
                live = self._live[candidate.task_id]
                live.queue_item = None
                try:
                    self._move(live, TaskStatus.RUNNING)
                except StoreWriteError as write_error:
                    self._lose(live, write_error)
                    continue
                self._finish(live, TaskStatus.FAILED, error=describe_error(error))
                continue
            if reservation is None:
                wait = quota.time_until(candidate.cost, now)
                if isinstance(candidate, QueueItem):
                    wait = min(wait, lane.queues[priority].next_change(now) - now)
                if math.isinf(wait):
                    lane.slot_blocked = True
                    return None
                return max(wait, 0.0)
            if self._quota_events:
                self._emit_quota(lane, now)
            if isinstance(candidate, _Ticket):
                lane.retries[priority].popleft()
                candidate.future.set_result(reservation)
                continue
            lane.queues[priority].pop(candidate)
            self._queued[priority] -= 1
            live = self._live[candidate.task_id]
            live.queue_item = None
            live.runner = runtime.spawn(self._run(lane, live, reservation), name=f"task-{candidate.task_id}")

    async def _await_ticket(self, lane: _Lane, live: _Live) -> Reservation:
        ticket = _Ticket(live.record.id, live.record.cost_estimate, self.runtime.create_future())
        lane.retries[live.record.priority].append(ticket)
        lane.pump.wake()
        try:
            return await ticket.future
        except Cancelled:
            ticket.removed = True
            future = ticket.future
            if future.done() and not future.cancelled():
                lane.quota.cancel(future.result(), self.runtime.now())
            lane.pump.wake()
            raise

    # ------------------------------------------------------------------ running a task
    async def _run(self, lane: _Lane, live: _Live, reservation: Reservation | None) -> None:
        live.started = True
        runtime = self.runtime
        policy = self.retry if live.retry is None else live.retry
        if live.cancel_requested or live.lost is not None:
            assert reservation is not None
            lane.quota.cancel(reservation, runtime.now())
            lane.pump.wake()
            if live.lost is None:
                self._finish(live, TaskStatus.CANCELLED)
            return
        if not await self._persist_running(lane, live, reservation):
            return
        record = live.record
        attempts = record.attempts
        tries = 0
        previous_delay: float | None = None
        cause: BaseException | None = None
        awaiting_outcome = False
        admitted = False  # a retry the gates admitted before its backoff, not yet sent
        try:
            poison = self.store.poison_error(record.key)
            if poison is not None:
                assert reservation is not None
                lane.quota.cancel(reservation, runtime.now())
                reservation = None
                lane.pump.wake()
                await self._fail_poison(
                    live, attempts, PoisonInputError(f"input recorded as poison ({poison})")
                )
                return
            while True:
                if reservation is None:
                    reservation = await self._await_ticket(lane, live)
                attempts += 1
                tries += 1
                is_retry = tries > 1
                wait = self._gate_wait(lane.name, is_retry) if self.gates else 0.0
                while wait > 0:
                    await runtime.sleep(wait)
                    wait = self._gate_wait(lane.name, is_retry)
                asked = self._late_gates if admitted else self.gates
                refusal = self._gate_refusal(lane.name, is_retry, record.id, cause, asked) if asked else None
                if refusal is not None and admitted:  # not sent after all: the quota gets its charge back
                    self._abandon_early(lane.name, record.id)
                admitted = False
                if refusal is not None:
                    lane.quota.cancel(reservation, runtime.now())
                    reservation = None
                    lane.pump.wake()
                    error = AttemptRejectedError(refusal)
                    self._emit_attempt(
                        live, attempts, runtime.now(), runtime.now(), error, "rejected", None, None
                    )
                    self._finish(live, TaskStatus.FAILED, attempts=attempts, error=describe_error(error))
                    return
                request = ProviderRequest(
                    task_id=record.id,
                    idempotency_key=record.key,
                    kind=record.kind,
                    payload=record.payload,
                    cost_estimate=record.cost_estimate,
                    attempt=attempts,
                    priority=record.priority,
                )
                start = runtime.now()
                awaiting_outcome = True
                try:
                    call = lane.provider.call(request)
                    if policy.attempt_timeout_s is None:
                        response = await call
                    else:
                        response = await runtime.wait_for(call, policy.attempt_timeout_s)
                except Exception as error:
                    awaiting_outcome = False
                    now = runtime.now()
                    lane.quota.release(reservation, now)
                    reservation = None
                    lane.pump.wake()
                    failure = classify_failure(error, tries, poison_after=policy.poison_after)
                    retry_after = retry_after_of(error)
                    pause, too_long = policy.retry_after_wait(retry_after)
                    if pause is not None and isinstance(error, RateLimitError):
                        self._pause_for_rate_limit(lane, error, record.id, now, pause)
                    for gate in self.gates:
                        tell_gate(gate, lane.name, is_retry, failure, error, now, task_id=record.id)
                    if too_long:
                        self._emit_attempt(
                            live, attempts, start, now, error, "retry_after_too_long", retry_after, None
                        )
                        message = (
                            f"{describe_error(error)} (Retry-After {retry_after:g} s is longer than "
                            f"max_retry_after_s={policy.max_retry_after_s:g})"
                        )
                        self._finish(live, TaskStatus.FAILED, attempts=attempts, error=message)
                        return
                    if failure is FailureClass.RETRYABLE and tries < policy.max_attempts:
                        delay = retry_delay(
                            policy.backoff,
                            tries - 1,
                            self.rng,
                            previous=previous_delay,
                            retry_after_s=retry_after if policy.honour_retry_after else None,
                        )
                        if self._early_gates:
                            # A retry quota is asked when the retry is decided, before the backoff:
                            # refused (AWS: no retry quota), the task fails now, with no delay. The
                            # other gates are asked just before the retry is sent (see split_gates).
                            refusal = self._gate_refusal(lane.name, True, record.id, error, self._early_gates)
                            if refusal is not None:
                                self._emit_attempt(
                                    live, attempts, start, now, error, "retry", retry_after, None
                                )
                                rejected = AttemptRejectedError(refusal)
                                attempts += 1
                                self._emit_attempt(live, attempts, now, now, rejected, "rejected", None, None)
                                self._finish(
                                    live, TaskStatus.FAILED, attempts=attempts, error=describe_error(rejected)
                                )
                                return
                            admitted = True
                        self._emit_attempt(live, attempts, start, now, error, "retry", retry_after, delay)
                        previous_delay = delay
                        cause = error
                        if getattr(lane.quota, "paused_until", -math.inf) < now + delay:
                            await runtime.sleep(delay)
                        # else the lane stays paused at least until this retry is due: it waits for
                        # the lane in the retry line (granted no earlier than the pause's end), so
                        # that it goes before queued work when the lane reopens on either runtime
                        # (sleeping instead, on asyncio it raced the lane's own wake-up at that instant)
                        continue
                    decision = "exhausted" if failure is FailureClass.RETRYABLE else failure.value
                    self._emit_attempt(live, attempts, start, now, error, decision, retry_after, None)
                    if failure is FailureClass.POISON:
                        await self._fail_poison(live, attempts, error)
                        return
                    self._finish(live, TaskStatus.FAILED, attempts=attempts, error=describe_error(error))
                    return
                awaiting_outcome = False
                now = runtime.now()
                usage = self._charged_usage(lane, live, attempts, response.usage, now)
                lane.quota.reconcile(reservation, usage, now)
                lane.quota.release(reservation, now)
                reservation = None
                lane.pump.wake()
                for gate in self.gates:
                    tell_gate(gate, lane.name, is_retry, None, None, now, task_id=record.id)
                self._emit_attempt(
                    live, attempts, start, now, None, "done", None, None, usage, response=response
                )
                lane.rate_limits.record_success(now, policy.adaptive_rule)
                self._finish(live, TaskStatus.SUCCEEDED, attempts=attempts, result=response.result)
                return
        except Cancelled:
            if awaiting_outcome:
                for gate in self.gates:
                    abandon_at_gate(gate, lane.name, tries > 1, True, runtime.now(), task_id=record.id)
            elif admitted:  # a retry charged before its backoff and never sent: give the charge back
                self._abandon_early(lane.name, record.id)
            if reservation is not None:
                if awaiting_outcome:  # the call was sent: the provider counts it
                    lane.quota.release(reservation, runtime.now())
                else:  # cancelled in a gate wait: nothing was sent, give it all back
                    lane.quota.cancel(reservation, runtime.now())
                    attempts -= 1
                lane.pump.wake()
            if self._crashed:
                raise
            self._finish(live, TaskStatus.CANCELLED, attempts=attempts)
        except Exception as error:  # not a provider failure: a gate or an event sink broke
            if admitted:
                self._abandon_early(lane.name, record.id)
            if reservation is not None:
                lane.quota.release(reservation, runtime.now())
                lane.pump.wake()
            if live.record.status.is_terminal or self._crashed:
                raise
            self._finish(live, TaskStatus.FAILED, attempts=attempts, error=describe_error(error))

    async def _persist_running(self, lane: _Lane, live: _Live, reservation: Reservation | None) -> bool:
        """Write ``queued -> running`` and wait until it is durable: no call is sent before.

        False when the task must not run: the write (or its group commit) failed, so the task is
        lost (quota given back), or it was cancelled while waiting for the commit.
        """
        assert reservation is not None
        try:
            self._move(live, TaskStatus.RUNNING)
            if self._commit is not None:
                lost = await self._commit.durable()
                if lost is not None:
                    raise lost
        except StoreWriteError as error:
            self._give_back(lane, reservation)
            self._lose(live, error)
            return False
        except Cancelled:
            self._give_back(lane, reservation)
            if self._crashed:
                raise
            self._finish(live, TaskStatus.CANCELLED)
            return False
        return True

    def _give_back(self, lane: _Lane, reservation: Reservation) -> None:
        """Give back an unused reservation (nothing was sent) and wake the lane's dispatcher."""
        lane.quota.cancel(reservation, self.runtime.now())
        lane.pump.wake()

    def _charged_usage(self, lane: _Lane, live: _Live, attempt: int, reported: Any, now: float) -> float:
        """The usage to reconcile for a successful call; a hostile or buggy report is clamped and
        recorded (rule: :func:`aiqsim.core.usage.sane_usage`), never allowed to fail the call."""
        record = live.record
        tokens = lane.quota.tokens
        verdict = sane_usage(reported, record.cost_estimate, tokens.capacity if tokens is not None else None)
        if verdict.anomaly is not None:
            self.anomalies["usage"] += 1
            if self.events is not None:
                self.events(
                    UsageAnomaly(
                        time=now,
                        task_id=record.id,
                        key=record.key,
                        provider=record.provider,
                        attempt=attempt,
                        reported=repr(reported),
                        charged=verdict.usage,
                        reason=verdict.anomaly,
                    )
                )
        return verdict.usage

    def _pause_for_rate_limit(
        self, lane: _Lane, error: BaseException, task_id: str, now: float, pause: float
    ) -> None:
        """Pause the whole lane for a 429's Retry-After when the rate-limit scope says so.

        The task that saw the 429 waits it out in any case (its retry delay is floored by it).
        """
        policy = self.retry
        scope = policy.rate_limit_scope
        quota_spent = error.quota_spent if isinstance(error, RateLimitError) else None
        looks_spent = lane.rate_limits.record_rate_limit(task_id, now, policy.adaptive_rule)
        if not pauses_lane(scope, quota_spent, looks_spent):
            return
        lane.quota.pause_until(now + pause)
        if self.events is not None:
            if scope is RateLimitScope.LANE:
                reason = "scope=lane"
            else:
                reason = "quota_spent" if quota_spent else "repeated_429s"
            self.events(LanePaused(now, lane.name, lane.quota.paused_until, task_id, reason))

    async def _fail_poison(self, live: _Live, attempts: int, error: BaseException) -> None:
        record = live.record
        now = self.runtime.now()
        try:
            persist(
                f"poison record of key {record.key!r} (task {record.id!r})",
                self.store.record_poison,
                record.key,
                describe_error(error),
                now,
            )
        except StoreWriteError as write_error:
            self._lose(live, write_error)
            return
        self._staged(record.id)
        if self.poison_fallback is not None:
            try:
                result = await self.poison_fallback(record)
            except Exception as fallback_error:
                message = f"{describe_error(error)}; fallback failed: {describe_error(fallback_error)}"
                self._finish(live, TaskStatus.FAILED, attempts=attempts, error=message)
                return
            self._finish(live, TaskStatus.SUCCEEDED, attempts=attempts, result=result)
            return
        self._finish(live, TaskStatus.FAILED, attempts=attempts, error=describe_error(error))

    def _gate_wait(self, provider: str, is_retry: bool) -> float:
        """The longest wait any gate asks for before the next attempt (0: none)."""
        if not self.gates:
            return 0.0
        now = self.runtime.now()
        return max((gate_wait_s(gate, provider, is_retry, now) for gate in self.gates), default=0.0)

    def _gate_refusal(
        self,
        provider: str,
        is_retry: bool,
        task_id: str,
        cause: BaseException | None,
        gates: tuple[Any, ...] | None = None,
    ) -> str | None:
        """The first refusal of this attempt by ``gates`` (all by default), or None (:func:`ask_gates`)."""
        gates = self.gates if gates is None else gates
        if not gates:
            return None
        now = self.runtime.now()
        return ask_gates(gates, provider, is_retry, now, self.rng, task_id=task_id, cause=cause)

    def _abandon_early(self, provider: str, task_id: str) -> None:
        """Tell the gates that charged a retry before its backoff that it will not be sent."""
        now = self.runtime.now()
        for gate in reversed(self._early_gates):
            abandon_at_gate(gate, provider, True, False, now, task_id=task_id)

    # ------------------------------------------------------------------ transitions
    def _write(self, record: TaskRecord, old: TaskRecord | None = None) -> None:
        """Persist ``record`` (raises :class:`StoreWriteError` naming the change if it fails)."""
        if self._crashed:
            raise Cancelled()
        persist_change(old, record, self.store.update, record)
        if self._commit is not None:  # _staged, inlined: this runs on every transition
            self._commit.staged(record.id)

    def _staged(self, task_id: str | None) -> None:
        """Tell the group commit (if the store defers commits) that a write of ``task_id`` is staged."""
        if self._commit is not None:
            self._commit.staged(task_id)

    def _move(self, live: _Live, status: TaskStatus, **changes: Any) -> TaskRecord:
        old = live.record
        record = transition(old, status, self.runtime.now(), **changes)
        self._write(record, old)
        live.record = record
        self._emit_transition(old.status, record)
        return record

    def _finish(self, live: _Live, status: TaskStatus, **changes: Any) -> None:
        """Write the terminal state; resolve the submission once that write is durable.

        A failed write (or group commit) resolves the submission with ``StoreWriteError`` instead.
        """
        old = live.record
        record = transition(old, status, self.runtime.now(), **changes)
        try:
            self._write(record, old)
        except StoreWriteError as error:
            self._lose(live, error, outcome=record)
            return
        live.record = record
        self._emit_transition(old.status, record)
        if self._commit is None:
            self._settle(live, record)
            return
        live.finishing = True
        committed = self._commit.durable()  # now: the flush that covers this very write
        live.runner = self.runtime.spawn(
            self._settle_when_durable(live, record, committed, describe_change(old, record)),
            name=f"commit-{record.id}",
        )

    async def _settle_when_durable(
        self, live: _Live, record: TaskRecord, committed: Future[StoreWriteError | None], lost: str
    ) -> None:
        """Resolve a finished task once the flush covering its terminal write is done. A coroutine,
        not a callback, so that a crash or a failing event sink stops it like any task; a crash
        (``crash()`` cancels it) leaves the handle unresolved, as for a killed process."""
        error = await committed
        if error is None:
            self._settle(live, record)
        else:
            self._lose(live, error, lost, outcome=record)

    def _settle(self, live: _Live, record: TaskRecord) -> None:
        """The terminal record is durable: resolve the submission and its duplicates' waits."""
        del self._live[record.id]
        live.future.set_result(record)
        if record.id in self._waiters:
            self._resolve_waiters(record.id, record)
        if self._jobs is not None:  # a job's next stage is queued in this same instant
            self._jobs.task_finished(record)
        if not self._live:
            self._idle.notify()

    def _lose(
        self,
        live: _Live,
        error: StoreWriteError,
        lost: str | None = None,
        *,
        outcome: TaskRecord | None = None,
    ) -> None:
        """The one rule for a task whose change could not be persisted (see the class docs).

        The submission resolves with ``error``; the task leaves its queue or its owner's wait
        list; duplicates waiting on it resolve with a ``StoreWriteError`` of their own. Quota held
        by a running attempt is the caller's to give back. The store keeps the task's last
        persisted state for :meth:`recover`; ``outcome`` (the terminal record that was not
        written) is kept so that a later duplicate of the key can write it (:meth:`_follow_unpersisted`).
        """
        record = live.record
        if self._live.get(record.id) is not live:
            return  # already resolved (e.g. a rolled-back batch and its own failed wait)
        del self._live[record.id]
        what = lost if lost is not None else error.what
        self._unpersisted[record.id] = _Unpersisted(what, outcome)
        self.store_write_failures += 1
        if live.queue_item is not None:
            lane = self._lanes[record.provider]
            lane.queues[record.priority].pop(live.queue_item)
            self._queued[record.priority] -= 1
            live.queue_item = None
            lane.pump.wake()
        if live.waiting_on is not None:
            waiters = self._waiters.get(live.waiting_on)
            if waiters and record.id in waiters:
                waiters.remove(record.id)
            live.waiting_on = None
        if self.events is not None:
            self.events(
                StoreWriteFailed(
                    time=self.runtime.now(),
                    task_id=record.id,
                    key=record.key,
                    provider=record.provider,
                    lost=what,
                    error=describe_error(error),
                )
            )
        if not live.future.done():
            live.future.set_exception(error)
        for waiter_id in self._waiters.pop(record.id, ()):
            waiter = self._live.get(waiter_id)
            if waiter is not None and waiter.waiting_on == record.id:
                waiter.waiting_on = None
                self._lose_duplicate(waiter, record.id)
        if not self._live:
            self._idle.notify()

    def _lose_duplicate(self, live: _Live, owner_id: str) -> None:
        """``live`` shares the run of ``owner_id``, whose outcome this process could not persist."""
        what = self._unpersisted[owner_id].what
        error = StoreWriteError(
            f"task {live.record.id!r} is a duplicate of task {owner_id!r}, whose change was not "
            f"persisted ({what}); recover() after a restart reconciles it"
        )
        self._lose(live, error)

    def _batch_lost(self, task_ids: frozenset[str], error: StoreWriteError) -> None:
        """A group commit failed: every task with a write in it that is not itself waiting on that
        commit (those see the error and call :meth:`_lose` themselves) is lost now."""
        for task_id in sorted(task_ids):
            live = self._live.get(task_id)
            if live is None or live.finishing:
                continue
            if live.runner is not None:
                if live.started:
                    continue  # waits on its running write's commit and resolves itself
                live.lost = error  # dispatched, not started: _run gives its reservation back
            self._lose(live, error, f"task {task_id!r}: {live.record.status.value} record rolled back")

    # ------------------------------------------------------------------ observability
    def _emit_transition(self, old: TaskStatus | None, record: TaskRecord) -> None:
        # positional, in TaskTransition's field order: this runs several times per call; ``_value_``
        # is the enum's plain value (``.value`` goes through a descriptor, measurably slower here)
        if self.events is not None:
            self.events(
                TaskTransition(
                    record.updated_at,
                    record.id,
                    record.key,
                    record.provider,
                    int(record.priority),
                    None if old is None else old._value_,
                    record.status._value_,
                    record.attempts,
                    record.cost_estimate,
                )
            )

    def _emit_attempt(
        self,
        live: _Live,
        attempt: int,
        start: float,
        end: float,
        error: BaseException | None,
        decision: str,
        retry_after: float | None,
        delay: float | None,
        usage: float | None = None,
        response: ProviderResponse | None = None,
    ) -> None:
        # positional, in AttemptRecord's field order: this runs once per provider call
        if self.events is not None:
            record = live.record
            seen = response if response is not None else error
            self.events(
                AttemptRecord(
                    record.id,
                    record.key,
                    record.provider,
                    attempt,
                    start,
                    end,
                    "ok" if error is None else type(error).__name__,
                    decision,
                    record.cost_estimate,
                    usage,
                    retry_after,
                    delay,
                    getattr(response, "output_units", None),
                    getattr(seen, "ratelimit", None),
                )
            )

    def _emit_quota(self, lane: _Lane, now: float) -> None:
        assert self.events is not None
        requests, tokens, in_flight = lane.quota.levels(now)
        self.events(
            QuotaSample(
                time=now,
                provider=lane.name,
                requests_level=requests,
                tokens_level=tokens,
                in_flight=in_flight,
                queued_interactive=len(lane.queues[Priority.INTERACTIVE]),
                queued_background=len(lane.queues[Priority.BACKGROUND]),
            )
        )
