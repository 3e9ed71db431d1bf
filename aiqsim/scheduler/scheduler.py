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

This module holds the public API (submit, cancel, retry, close, crash). The rest of the class is
written in one module per concern, each a part :class:`Scheduler` is assembled from:

- :mod:`~aiqsim.scheduler.claims`: who runs a key (claims, duplicates, priority inheritance);
- :mod:`~aiqsim.scheduler.lanes`: each provider's queues, quota and dispatch rule;
- :mod:`~aiqsim.scheduler.attempts`: a task's attempts inside ``running`` (failures, retries, gates);
- :mod:`~aiqsim.scheduler.outcomes`: each status change written, reported and settled, and the rule
  for a change that could not be persisted;
- :mod:`~aiqsim.scheduler.recovery`: reconciling the store after a restart.

The pure rules they apply live below them, in :mod:`aiqsim.core` (the transition table, the token
bucket, backoff, fingerprints).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn

from aiqsim.core.errors import SchedulingError
from aiqsim.core.fingerprint import fingerprint
from aiqsim.core.routing import Route
from aiqsim.core.states import transition
from aiqsim.core.task import QUEUED, Priority, TaskRecord, TaskStatus, new_task_record, random_id
from aiqsim.core.token_bucket import MultiQuota, QuotaLimits
from aiqsim.runtime.protocol import Future, Runtime, TaskHandle
from aiqsim.runtime.sync import Signal
from aiqsim.scheduler.arguments import (
    SchedulerArgumentError,
    SchedulerArgumentTypeError,
    UnknownNameError,
    checked_capable,
    checked_cost_estimate,
    checked_positive_seconds,
    checked_providers,
    checked_queue_limit,
    checked_worker_id,
)
from aiqsim.scheduler.attempts import AttemptLoop
from aiqsim.scheduler.claims import ClaimRules
from aiqsim.scheduler.commit import DEFAULT_COMMIT_WINDOW_S, GroupCommit, check_commit_window, defers_commits
from aiqsim.scheduler.depth_limit import DepthLimit
from aiqsim.scheduler.dispatch import DispatchPolicy, FifoPolicy, TaskQueue
from aiqsim.scheduler.events import EventSink, QueueRejected
from aiqsim.scheduler.handles import OutcomeHandle, await_own
from aiqsim.scheduler.lane_pump import LanePump
from aiqsim.scheduler.lanes import (
    Lane,
    LaneDispatch,
    check_slot_lease,
    lane_quota,
    report_quota_outages,
    share_quota_objects,
)
from aiqsim.scheduler.live import LiveTask, UnpersistedChange, new_live_task
from aiqsim.scheduler.outcomes import Outcomes
from aiqsim.scheduler.provider import Provider, StreamChunk
from aiqsim.scheduler.recovery import Recovery
from aiqsim.scheduler.recovery import RecoveryReport as RecoveryReport  # re-exported: its old home
from aiqsim.scheduler.refusals import QueueFullError as QueueFullError  # re-exported: its old home
from aiqsim.scheduler.refusals import SchedulerClosedError as SchedulerClosedError
from aiqsim.scheduler.retry import (
    AttemptGate,
    RetryPolicy,
    check_gate_providers,
    check_retry_policy,
    split_gates,
)
from aiqsim.scheduler.routes import RouteTable
from aiqsim.scheduler.store_writes import persist_change
from aiqsim.scheduler.streams import StreamChannel, stream_chunks
from aiqsim.scheduler.tenants import Tenant, TenantQueue, checked_tenants
from aiqsim.stores.base import LIVE_OWNER_STATUSES, StoreWriteError, TaskStore
from aiqsim.stores.memory import MemoryStore

if TYPE_CHECKING:
    from aiqsim.scheduler.depth_limit import Call
    from aiqsim.scheduler.job_host import JobHost
    from aiqsim.scheduler.jobs import JobHandle, JobRecoveryReport, Jobs, JobSpec

DEFAULT_INTERACTIVE_LIMIT = 5
DEFAULT_BACKGROUND_LIMIT = 2_000
"""Queued background tasks allowed by default. Past it, ``submit`` raises :class:`QueueFullError`
instead of letting a backlog the quota cannot serve grow without bound (at 10x the quota it grew by
~6,700 tasks in 2 minutes, ~2 KB each, and every queued task waits behind all of them). 2,000 is
about 4 MB and far above the deepest backlog of the shipped scenarios (under 1,000); raise it, or pass
``None``, for batch jobs that queue more on purpose."""


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
        live: LiveTask,
        new_future: Callable[[], Future[Any]],
        accepted: Future[StoreWriteError | None] | None = None,
    ) -> None:
        # the base named, not super(): 3.11 does not specialise the zero-argument form
        OutcomeHandle.__init__(self, task_id, key, live, new_future)
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
                try:
                    raise error
                finally:  # the traceback holds this frame: naming the error too would be a cycle
                    del error

    async def result(self) -> Any:
        """The task's result; raises :class:`TaskFailedError` or :class:`TaskCancelledError`."""
        record = await self.wait()
        if record.status is TaskStatus.CANCELLED:
            raise TaskCancelledError(record)
        if record.status is TaskStatus.FAILED or record.error is not None:
            raise TaskFailedError(record)
        return record.result

    def stream(self) -> AsyncIterator[StreamChunk]:
        """The task's answer as it arrives: ``async for chunk in submission.stream():``.

        For a task submitted with ``stream=True`` to a provider that streams, each
        :class:`~aiqsim.scheduler.provider.StreamChunk` is yielded as it arrives (attempts that
        failed before their first chunk are retried unseen); otherwise the whole result is yielded
        as one chunk once the task succeeded. A failure raises what :meth:`result` raises; a stream
        cut after its first chunk raises :class:`~aiqsim.scheduler.streams.StreamInterruptedError`
        (then ``await`` the submission: the scheduler may still recover the answer). Rules:
        :mod:`aiqsim.scheduler.streams`.
        """
        holder = self._holder
        channel = holder.stream if isinstance(holder, LiveTask) else None
        return stream_chunks(self.id, holder, channel, self._new_future, self.result)


class _IssuedSubmission(Submission):
    """The :class:`Submission` ``submit`` returns: the same handle, with no Python ``__init__`` to
    run (:func:`_new_submission` fills it in)."""

    __slots__ = ()
    __init__ = object.__init__  # type: ignore[assignment]


def _new_submission(
    task_id: str,
    key: str,
    live: LiveTask,
    new_future: Callable[[], Future[Any]],
    accepted: Future[StoreWriteError | None] | None,
) -> Submission:
    """``Submission(task_id, key, live, new_future, accepted)`` without the class call: one is made
    per :meth:`Scheduler.submit`, and on CPython 3.11 a class call whose ``__init__`` calls its base's
    is not specialised (0.8% of an M/M/c customer's instructions). It sets the handle's
    slots itself, as ``OutcomeHandle.__init__`` does (filling them through one shared function
    instead gave back half the saving): ``tests/test_slot_init.py`` checks it against the
    constructor, slot by slot, so a slot added to either class and missed here fails there."""
    handle = _IssuedSubmission()
    handle.id = task_id
    handle.key = key
    handle._holder = live
    handle._new_future = new_future
    handle._accepted = accepted
    return handle


_NOTHING_QUEUED = "Nothing was queued or stored"
"""How a refused ``submit`` argument ends its message."""


class _SchedulerJobHost:
    """The :class:`~aiqsim.scheduler.job_host.JobHost` a scheduler gives its jobs orchestrator: each
    member a view of one of the scheduler's own rules or states, kept here, beside them."""

    __slots__ = ("_scheduler",)

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    @property
    def live(self) -> Mapping[str, LiveTask]:
        return self._scheduler._live

    @property
    def crashed(self) -> bool:
        return self._scheduler._crashed

    def closed_reason(self) -> str | None:
        scheduler = self._scheduler
        if scheduler._closed:
            return "scheduler is closed"
        return "scheduler is closing" if scheduler._closing else None

    def depth_limit(self, priority: Priority) -> int | None:
        return self._scheduler._limits[priority]

    def check_tenant(self, tenant: object) -> int | None:
        return self._scheduler._checked_tenant(tenant, "No job was submitted")

    def queued(self, priority: Priority) -> int:
        return self._scheduler._queued[priority]

    def held_by_gates(self, priority: Priority) -> list[str]:
        return self._scheduler._held_by_gates(priority)

    def refusing_job_limit(self, first_calls: Callable[[], Sequence[Call]], priority: Priority) -> int | None:
        return self._scheduler._refusing_job_limit(first_calls, priority)

    def promoted_call(self, task_id: str, priority: Priority) -> Call | None:
        return self._scheduler._promoted_call(task_id, priority)

    def new_call(self, provider: str, kind: str, payload: Any, cost: float | None) -> Call:
        scheduler = self._scheduler
        lane = scheduler._lanes.get(provider)
        if lane is None:  # a route: its first deployment stands for it in the depth limit's trial
            assert scheduler._routes is not None
            lane = scheduler._lanes[scheduler._routes.routes[provider].providers[0]]
        return (lane, scheduler._cost_estimate(lane, kind, payload, cost), None)

    def inherit_priority(self, task: LiveTask, priority: Priority) -> None:
        self._scheduler._inherit_priority(task, priority)

    def staged(self) -> None:
        self._scheduler._staged(None)

    def ensure_started(self) -> None:
        self._scheduler._ensure_started()

    def when_durable(self, callback: Callable[[StoreWriteError | None], None]) -> None:
        commit = self._scheduler._commit
        if commit is None or not commit.pending:
            callback(None)
        else:
            commit.durable().add_done_callback(lambda flushed: callback(flushed.result()))


def _refuse_names(kind: object, key: object, task_id: object) -> NoReturn:
    """The first of submit's names that is no text (a key of 123 was stored, then a JSON file store
    reported its own journal as corrupt on reopening)."""
    for name, value in (("kind", kind), ("key", key), ("task_id", task_id)):
        if type(value) is not str and (value is not None or name == "kind"):
            raise SchedulerArgumentTypeError(
                f"{name}: expected a string, got {value!r}; nothing was queued or stored"
            )
    raise AssertionError("unreachable: one of the names is no string")


class Scheduler(Recovery, ClaimRules, DepthLimit, LaneDispatch, AttemptLoop, Outcomes):
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
            by default; ``None``: unbounded; otherwise a whole number >= 0 of *waiting* tasks: one
            its lane starts at once is never refused, and 0 means "start at once or be refused";
            :mod:`aiqsim.scheduler.depth_limit`).
            Duplicates enqueue nothing and are exempt, except an
            interactive duplicate that lifts its queued owner into the interactive queue.
        rng: the only source of randomness (jitter, task ids). Seed it for reproducible runs.
        events: a sink for :mod:`aiqsim.scheduler.events` records (e.g. ``list.append``). It is
            called after the change it reports is made; an exception it raises does not undo or
            stall that change (see "A failing event sink" below).
        gates: overload guards consulted before each attempt (retry budgets, breakers...).
        poison_fallback: called with the record of a task whose input proved poison; its
            return value becomes the task's result (the task still records the poison).
        duplicate_poll_s: how often to check a key owned by *another process* sharing the store.
        worker_id: this scheduler instance's name when several processes share one store. Its
            tasks carry it, and :meth:`recover` then adopts only its own (see there). Give each
            live process its own id, and the same id to the process that replaces it.
        tenants: the tenants sharing each lane by weighted fair queuing, name ->
            :class:`~aiqsim.scheduler.tenants.Tenant` (``submit(tenant=...)`` names one;
            :mod:`aiqsim.scheduler.tenants` has the rule). ``None``: no tenants, the policy's queues.
        commit_window_s: with a store that defers commits (``SqliteStore(path, group_commit=True)``),
            how long staged writes wait to share one flush (see :mod:`aiqsim.scheduler.commit`).
            Ignored by stores that commit every write.
        routes: routes across deployments by name (``{"gpt-4o": Route(["east", "west"])}``):
            ``submit("gpt-4o", ...)`` (or ``provider="gpt-4o"``) gives the task one of the route's
            providers by the route's policy, at submission and again at each retry when the route
            has ``retry_elsewhere`` (rules: :mod:`aiqsim.scheduler.routes`). A route naming an unknown
            provider, mixing kinds or named like a provider raises
            :class:`~aiqsim.core.routing.RouteConfigError` (a ``ConfigurationError``).

    Failed store writes. A store write that fails (disk full, read-only file, I/O error; a raw
    ``OSError`` or ``sqlite3`` error is wrapped) fails only the task it was for: its submission
    resolves with :class:`~aiqsim.stores.base.StoreWriteError` naming the change that was not
    persisted, a :class:`~aiqsim.scheduler.events.StoreWriteFailed` event is emitted and counted
    in :attr:`store_write_failures`, its quota reservation and concurrency slot are given back, and
    the scheduler keeps serving: the next writes may succeed once the disk has room. Nothing is
    reported succeeded unless its terminal write persisted. The store keeps the task's previous
    state (``queued``, or ``running`` when the outcome write failed); a lost outcome is written again
    in the background until the store takes it (bounded backoff, a ``StoreWriteFailed`` event per
    failed try; :mod:`aiqsim.scheduler.outcomes`), so that a duplicate in another worker learns it;
    what a crash or a close leaves unwritten, :meth:`recover` after a restart reconciles with the
    provider like any orphan. A later duplicate of its key submitted to this
    scheduler first writes the lost outcome late (the disk may have room again), then shares it as
    usual (a success dedups, a failure frees the key); when that write fails too, or the lost change
    was the ``running`` write, the duplicate resolves with ``StoreWriteError`` at once. It never
    waits for a run this process will not finish, and the key is never sent again (the provider may
    have done the work). A failing ``submit`` write raises ``StoreWriteError`` from ``submit``.

    A failing event sink. The sink is called after the change it reports, and the change stands:
    an exception from it on a task's ``queued`` event is raised from ``submit`` after the task is
    stored and queued (it runs; a duplicate submission of its key finds it); on ``running`` or on an
    attempt's record it fails the task with the sink's error as the task's error (its quota is
    given back; an answer already received is not reported succeeded, as after any error that
    follows it); on a terminal event the task keeps that outcome and its submission resolves, and
    the error ends the coroutine that emitted the event, which the runtime reports
    (``SimPyRuntime.task_errors``; asyncio's exception handler). A job's events come in the middle
    of its steps: a sink's error there is handed to the runtime as a failing callback (reported the
    same way) and the job goes on. No task or job is left waiting and no quota stays held because a
    sink broke.

    Hostile usage. A response's usage is clamped before the token bucket is reconciled (the rule
    is :func:`aiqsim.core.usage.sane_usage`); the call still succeeds, and the anomaly is emitted
    as :class:`~aiqsim.scheduler.events.UsageAnomaly` and counted in :attr:`anomalies`.
    """

    # Every attribute a scheduler has is a slot (its parts declare ``__slots__ = ()``): with 34
    # attributes in an instance dict (past CPython's 30 shared keys) each ``self._live`` read was a
    # full dict lookup, and a method-cache miss walked all seven classes of the MRO (slots: fewer
    # instructions per M/M/c customer). ``__dict__`` and ``__weakref__`` stay for users (an
    # attribute of their own, a patched method, a weak reference): the dict is made only when
    # something is put in it.
    __slots__ = (  # noqa: RUF023 (grouped by what they hold, not sorted)
        # what it was given
        "runtime", "store", "retry", "dispatch", "events", "gates", "rng", "worker_id",
        "duplicate_poll_s", "poison_fallback", "job_recovery", "_limits", "_quota_events",
        "_early_gates", "_late_gates", "_create_future", "_commit", "_tenants",
        # its lanes and tasks
        "_lanes", "_lane_heads", "_live", "_queued", "_seq", "_waiters", "_watchers", "_unpersisted",
        "_healing", "_rewriter", "_idle", "_jobs", "_gate_held", "_routes",
        # its lifecycle and what it counted
        "_started", "_closing", "_closed", "_crashed", "anomalies", "store_write_failures",
        # for users, empty unless they use it
        "__dict__", "__weakref__",
    )  # fmt: skip

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
        routes: Mapping[str, Route] | None = None,
        tenants: Mapping[str, Tenant] | None = None,
    ) -> None:
        providers = checked_providers(providers)
        self._tenants = checked_tenants(tenants)
        self.worker_id = checked_worker_id(worker_id, "worker_id", "no scheduler was created")
        """This process's name in the store: the ``worker`` of every record it writes."""
        check_commit_window(commit_window_s)
        refused = "no scheduler was created"
        checked_capable(
            runtime,
            "runtime",
            ("now", "sleep", "create_future", "spawn"),
            "a runtime (AsyncioRuntime or SimPyRuntime)",
            refused,
        )
        if store is not None:
            checked_capable(
                store, "store", ("insert_and_claim", "update", "get", "owner_of"), "a task store", refused
            )
        if dispatch is not None:
            checked_capable(
                dispatch, "dispatch", ("new_queue",),
                "a dispatch policy object (for a name: dispatch_policy_from_name)", refused,
            )  # fmt: skip
        if events is not None and not callable(events):
            raise SchedulerArgumentTypeError(f"events: expected a callable sink, got {events!r}; {refused}")
        self.runtime = runtime
        """Where its coroutines run (:class:`~aiqsim.runtime.AsyncioRuntime` or a simulated clock)."""
        self._create_future = runtime.create_future  # bound once: each handle keeps it (one per submit)
        self.store: TaskStore = store if store is not None else MemoryStore()
        """The task records and key claims (a :class:`~aiqsim.stores.memory.MemoryStore` by default)."""
        self.dispatch = dispatch if dispatch is not None else FifoPolicy()
        """Which queued task of a lane starts next (FIFO by default)."""
        self.retry = retry if retry is not None else RetryPolicy()
        """The retry policy of every task submitted without one of its own."""
        check_retry_policy(self.retry, "retry", "no scheduler was created")
        self.rng = rng if rng is not None else random.Random()
        """The scheduler's own randomness (task ids, backoff jitter): seed it to replay a run."""
        self.events = events
        """The event sink every task transition, attempt and quota sample is sent to, if any."""
        # a sink may decline the per-grant quota samples (the call log does: it has no use for them)
        self._quota_events = events is not None and getattr(events, "wants_quota_samples", True)
        try:
            given_gates = tuple(gates)
        except TypeError:
            raise SchedulerArgumentTypeError(
                f"gates: expected an iterable of attempt gates, got {gates!r}; {refused}"
            ) from None
        self.gates = given_gates
        """The overload gates each attempt must pass (:mod:`aiqsim.overload`), in order."""
        self._early_gates, self._late_gates = split_gates(self.gates)
        self.poison_fallback = poison_fallback
        """Called with the record of a task whose input proved poison; its value is the task's result."""
        self.duplicate_poll_s = checked_positive_seconds(
            duplicate_poll_s, "duplicate_poll_s", "how often a duplicate rereads its owner's record"
        )
        """How often a duplicate rereads the record of an owner in another process."""
        self._limits = {
            Priority.INTERACTIVE: checked_queue_limit(interactive_limit, "interactive_limit"),
            Priority.BACKGROUND: checked_queue_limit(background_limit, "background_limit"),
        }
        self._queued = dict.fromkeys(Priority, 0)
        self._gate_held: set[str] = set()
        """The tasks whose first attempt a gate holds back (a wait-mode breaker, an adaptive rate):
        they wait, as queued tasks do, so the depth limit counts them (:meth:`_depth`), in the class
        their record has now (a duplicate may lift it while it waits)."""
        if not isinstance(providers, Mapping):
            providers = {p.name: p for p in providers}
        if quotas is not None and not isinstance(quotas, Mapping):
            raise SchedulerArgumentTypeError(
                f"quotas: expected a mapping provider name -> QuotaLimits, got {quotas!r}; "
                "no scheduler was created"
            )
        quotas = dict(quotas or {})
        unknown = set(quotas) - set(providers)
        if unknown:
            raise SchedulerArgumentError(
                f"quotas: given for provider(s) {sorted(unknown, key=str)} that this scheduler was not given "
                f"(its providers: {sorted(providers)}); key each quota by a provider's name; "
                "no scheduler was created"
            )
        check_gate_providers(self.gates, providers, self._tenants)
        now = runtime.now()
        self._lanes: dict[str, Lane] = {
            name: Lane(
                name=name,
                provider=provider,
                quota=lane_quota(quotas.get(name), now),
                queues={p: self._new_queue() for p in Priority},
            )
            for name, provider in providers.items()
        }
        for lane in self._lanes.values():
            check_slot_lease(lane.name, lane.quota, self.retry, "no scheduler was created")
        # providers on one quota object: one dispatch (and one trial of the depth limit) for them all
        self._lane_heads = share_quota_objects(self._lanes.values())
        for head in self._lane_heads:
            names = "+".join(lane.name for lane in self._lanes.values() if lane.head is head)
            head.pump = LanePump(runtime, partial(self._dispatch, head), f"dispatch-{names}")
        for lane in self._lanes.values():
            lane.pump = lane.head.pump
        report_quota_outages(self, self._lanes.values())  # a fleet quota's outage: QuotaUnavailable
        self._routes: RouteTable | None = RouteTable(routes, self._lanes) if routes else None
        """The routes across deployments, if any (:mod:`aiqsim.scheduler.routes`)."""
        self._live: dict[str, LiveTask] = {}
        self._waiters: dict[str, list[str]] = {}
        self._watchers: dict[str, TaskHandle[None]] = {}
        self._idle = Signal(runtime)
        self._seq = 0
        self._started = False
        self._closed = False
        self._closing = False
        """close() has begun: only a live job's later stages may still be submitted."""
        self._crashed = False
        self._commit: GroupCommit | None = (
            GroupCommit(runtime, self.store, commit_window_s, self._batch_lost)
            if defers_commits(self.store)
            else None
        )
        self._unpersisted: dict[str, UnpersistedChange] = {}
        """Task id -> the change of that task this process could not persist (see the class docs)."""
        self._healing: set[str] = set()
        self._rewriter: TaskHandle[None] | None = None
        """Writes lost outcomes again while any is left (:meth:`Outcomes._rewrite_outcomes`)."""
        self.store_write_failures = 0
        """Submissions resolved with ``StoreWriteError`` (their outcome, or their owner's, not persisted)."""
        self.anomalies: Counter[str] = Counter()
        """Provider anomalies seen and defused, by kind (e.g. ``"usage"``)."""
        self._jobs: Jobs | None = None  # created on first use of jobs (aiqsim.scheduler.jobs)
        self.job_recovery: JobRecoveryReport | None = None
        """What the last :meth:`recover` did to jobs (``None`` before one ran)."""

    def _new_queue(self) -> TaskQueue:
        """One priority class's queue of a lane: the policy's, shared among tenants if there are any."""
        if self._tenants is None:
            return self.dispatch.new_queue()
        return TenantQueue(self.dispatch, self._tenants)

    def _check_tenant(self, tenant: str | None, consequence: str = _NOTHING_QUEUED) -> int | None:
        """Refuse a ``tenant`` this scheduler was not given; return its ``max_queued``."""
        tenants = self._tenants
        if tenants is None:
            raise SchedulerArgumentError(
                f"tenant: this scheduler has no tenants, got tenant={tenant!r}; give "
                "Scheduler(tenants={name: Tenant(...)}) or submit without tenant=. "
                f"{consequence}"
            )
        if tenant is None:
            return None  # the default tenant: no depth limit of its own
        config = tenants.get(tenant)
        if config is None:
            raise SchedulerArgumentError(
                f"tenant: no tenant named {tenant!r}; this scheduler has {sorted(tenants)} "
                f"(or tenant=None, the default tenant). {consequence}"
            )
        return config.max_queued

    def _checked_tenant(self, tenant: object, consequence: str = _NOTHING_QUEUED) -> int | None:
        """Refuse a ``tenant=`` argument of ``submit`` or ``submit_job`` that is no tenant of this
        scheduler (``None``, the default tenant, is one whenever there are tenants, and the only
        one without); return its ``max_queued``."""
        if tenant is None and self._tenants is None:
            return None
        if tenant is not None and type(tenant) is not str:
            raise SchedulerArgumentTypeError(
                f"tenant: expected a tenant's name (a string) or None, got {tenant!r}; {consequence.lower()}"
            )
        return self._check_tenant(tenant, consequence)

    def _check_tenant_limit(self, tenant: str, limit: int, key: str) -> None:
        """Refuse one more task of ``tenant`` at its ``max_queued``, unless it is a duplicate of a
        live owner (it queues nothing: the owner's run is shared, in the owner's tenant)."""
        queued = self.queued_for(tenant)
        if queued < limit:
            return
        owner = self.store.owner_of(key)  # only at the limit: a store read saved otherwise
        if owner is not None and owner.status in LIVE_OWNER_STATUSES:
            return
        raise QueueFullError(
            f"tenant {tenant!r}: {queued} of its tasks already queued (its max_queued is {limit}); "
            "nothing was enqueued. Retry later, or raise Tenant(max_queued=...)"
        )

    # ------------------------------------------------------------------ public API
    def queued_for(self, tenant: str | None) -> int:
        """Tasks of ``tenant`` waiting in dispatch queues (every lane, both classes); 0 without tenants."""
        if self._tenants is None:
            return 0
        return sum(
            queue.queued(tenant)
            for head in self._lane_heads
            for queue in head.queues.values()
            if isinstance(queue, TenantQueue)
        )

    @property
    def providers(self) -> list[str]:
        """Provider (lane) names."""
        return list(self._lanes)

    @property
    def routes(self) -> dict[str, Route]:
        """The routes across deployments, by name (empty when none were given)."""
        return {} if self._routes is None else dict(self._routes.routes)

    def quota(self, provider: str) -> MultiQuota:
        """The live client-side quota of ``provider`` (for inspection and header corrections).

        Raises :class:`~aiqsim.scheduler.arguments.UnknownNameError` (a ``KeyError``) for a provider
        this scheduler was not given.
        """
        lane = self._lanes.get(provider)
        if lane is None:
            raise UnknownNameError(
                f"provider: no provider named {provider!r}; this scheduler has {sorted(self._lanes)}"
            )
        return lane.quota

    def queued(self, priority: Priority | None = None) -> int:
        """Tasks waiting in dispatch queues (of one priority, or all)."""
        if priority is None:
            return sum(self._queued.values())
        return self._queued[priority if type(priority) is Priority else Priority(priority)]

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
        stream: bool = False,
        tenant: str | None = None,
    ) -> Submission:
        """Queue one call and return its :class:`Submission` handle.

        The idempotency ``key`` defaults to the fingerprint of (kind, version, params,
        payload). Raises :class:`QueueFullError` when the priority's queue is at its depth
        limit, :class:`~aiqsim.scheduler.arguments.SchedulerArgumentError` (a ``ValueError``) for an
        unknown provider or another unusable argument,
        :class:`~aiqsim.stores.base.DuplicateTaskIdError` for a ``task_id`` already in the store
        (nothing is stored), and
        :class:`~aiqsim.core.token_bucket.QuotaConfigError` for a cost the quota could never grant.
        ``job_stage`` is set by :mod:`aiqsim.scheduler.jobs` for a job's stage tasks: the depth
        limit counts their job once, not each of them. ``retry`` replaces the scheduler's retry
        policy for this task in this process (not persisted: a task resumed by :meth:`recover`
        runs under the scheduler's policy). ``stream=True`` runs its attempts through the provider's
        ``stream()`` when it has one, and the caller reads the chunks as they arrive with
        ``async for chunk in submission.stream()`` (:mod:`aiqsim.scheduler.streams`; quota,
        retries before the first chunk and idempotency are the scheduler's as for any task).
        ``tenant`` names the customer the call is for, one of the scheduler's ``tenants``: within its
        priority class the lane shares its service among tenants by weight, and the tenant's own
        ``max_queued`` bounds what it may have waiting (:mod:`aiqsim.scheduler.tenants`). It is stored
        with the task (recovery and duplicates keep it) and sent in the :class:`ProviderRequest`.
        """
        if self._closed or (self._closing and not job_stage):
            raise SchedulerClosedError("scheduler is closed" if self._closed else "scheduler is closing")
        if retry is not None:
            check_retry_policy(retry, "retry", "nothing was queued or stored")
        if stream is not False and stream is not True:
            raise SchedulerArgumentTypeError(
                f"stream: expected True or False, got {stream!r}; nothing was queued or stored"
            )
        if (
            type(kind) is not str
            or (key is not None and type(key) is not str)
            or (task_id is not None and type(task_id) is not str)
        ):
            _refuse_names(kind, key, task_id)
        tenant_limit = None
        # a job stage's tenant is the job's, checked by submit_job: a recovered job's tenant that this
        # process lacks is queued as the default tenant's, as a recovered task's is (tenants.py)
        if not job_stage and (tenant is not None or self._tenants is not None):
            tenant_limit = self._checked_tenant(tenant)
        lane_name = provider if provider is not None else kind
        lane = self._lanes.get(lane_name) if type(lane_name) is str else None
        route_name = None
        if lane is None and self._routes is not None and type(lane_name) is str and lane_name in self._routes:
            route_name = lane_name  # the deployment is chosen now (aiqsim.scheduler.routes)
            lane = self._routes.choose(lane_name, self._lanes, self.runtime.now(), self.rng)
            lane_name = lane.name
        if lane is None:
            if type(lane_name) is not str:
                raise SchedulerArgumentTypeError(
                    f"provider: expected a provider name (a string), got {provider!r}; "
                    "nothing was queued or stored"
                )
            named_by = "provider" if provider is not None else "kind (no provider= given)"
            raise SchedulerArgumentError(
                f"{named_by}: no provider named {lane_name!r}; this scheduler has {sorted(self._lanes)}"
                + (f" and routes {sorted(self.routes)}" if self._routes is not None else "")
                + ". Pass provider= one of them; nothing was queued or stored"
            )
        if type(priority) is not Priority:
            priority = Priority(priority)
        cost_estimate = self._cost_estimate(lane, kind, payload, cost_estimate)
        if retry is not None:
            check_slot_lease(lane.name, lane.quota, retry, "nothing was queued or stored")
        if key is None:
            key = fingerprint(kind, payload, params=params, version=version)
        if tenant_limit is not None and not job_stage:  # a job is refused at submit_job, not mid-way
            assert tenant is not None
            self._check_tenant_limit(tenant, tenant_limit, key)
        # A duplicate enqueues nothing, unless it moves its queued owner into its own (higher) queue;
        # a job's stage tasks are counted as their job (see Jobs.depth). The rule: depth_limit.py.
        if not job_stage and self._limits[priority] is not None:
            self._check_depth_limit(lane, priority, cost_estimate, key, None, tenant)
        now = self.runtime.now()
        # positional, in TaskRecord's field order (pinned by tests/test_slot_init.py): a keyword call
        # maps each name to its parameter, once per submission; the cost is a float already
        record = new_task_record(
            task_id if task_id is not None else random_id(self.rng),  # id
            key,
            kind,
            lane_name,  # provider
            priority,
            QUEUED,  # status
            cost_estimate,
            0,  # attempts
            now,  # created_at
            now,  # updated_at
            None,  # started_at
            None,  # finished_at
            payload,
            None,  # result
            None,  # error
            None,  # deduped_from
            self.worker_id,  # worker
            tenant,
            route_name,  # route
        )
        owner = persist_change(None, record, self.store.insert_and_claim)
        commit = self._commit  # _staged, inlined (as in Outcomes._write): once per submission
        if commit is not None:
            commit.staged(record.id)
            accepted = commit.durable()
        else:
            accepted = None
        # positional, in LiveTask's field order (record, future, queue_item, runner, started,
        # cancel_requested, waiting_on, finishing, lost, retry; tests/test_slot_init.py). No future:
        # one is made only if a handle waits before the outcome is known (aiqsim.scheduler.handles)
        live = new_live_task(record, None, None, None, False, False, None, False, None, retry)
        if stream:
            live.stream = StreamChannel(self._create_future)
        if route_name is not None:
            live.route = route_name
        task_id = record.id
        self._live[task_id] = live
        try:
            if self.events is not None:
                self._emit_transition(None, record)
        finally:  # also when the sink broke: the task is stored, so it is queued all the same
            if not self._started:
                self._ensure_started()
            self._follow_owner(live, owner)
        return _new_submission(task_id, key, live, self._create_future, accepted)

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
        tenant: str | None = None,
    ) -> JobHandle:
        """Run a pipeline of calls (a :class:`~aiqsim.scheduler.job_spec.JobSpec`) on ``inputs``.

        Returns a :class:`~aiqsim.scheduler.jobs.JobHandle`: ``await`` it for ``{stage: result}``.
        Rules (idempotency, depth limit, failure, recovery): :mod:`aiqsim.scheduler.jobs`.
        ``tenant`` (checked as ``submit(tenant=...)`` checks it) is the tenant of every task of every
        stage, fallbacks included, and is stored with the job, so a recovered job keeps it.
        """
        return self.jobs.submit(spec, inputs, priority=priority, job_id=job_id, tenant=tenant)

    @property
    def jobs(self) -> Jobs:
        """This scheduler's jobs orchestrator (created on first use; see :mod:`aiqsim.scheduler.jobs`)."""
        if self._jobs is None:
            from aiqsim.scheduler.jobs import Jobs  # the jobs room builds on this module, not back

            Jobs(self)  # attaches itself (attach_jobs)
        assert self._jobs is not None
        return self._jobs

    def attach_jobs(self, jobs: Jobs) -> JobHost:
        """Make ``jobs`` this scheduler's jobs orchestrator (``Jobs(scheduler)`` calls it) and give it
        the seam it runs through (:class:`~aiqsim.scheduler.job_host.JobHost`). One per scheduler:
        a second raises :class:`~aiqsim.core.errors.SchedulingError`."""
        if self._jobs is not None:
            raise SchedulingError("this scheduler already has a Jobs orchestrator (scheduler.jobs)")
        self._jobs = jobs
        return _SchedulerJobHost(self)

    def _depth(self, priority: Priority, starting: Collection[str] = ()) -> int:
        """Queued requests of ``priority`` as its depth limit counts them (a job counts once),
        leaving out the queued tasks in ``starting`` (they start in this instant)."""
        if self._jobs is None:
            return self._queued[priority] + len(self._held_by_gates(priority)) - len(starting)
        return self._jobs.depth(priority, starting)

    def _held_by_gates(self, priority: Priority) -> list[str]:
        """The tasks of ``priority`` whose first attempt a gate holds back (:attr:`_gate_held`)."""
        if not self._gate_held:
            return []
        live = self._live
        return [task_id for task_id in self._gate_held if live[task_id].record.priority is priority]

    def _cost_estimate(self, lane: Lane, kind: str, payload: Any, given: float | None) -> float:
        """The quota cost a call is submitted with: ``given``, else the provider's estimate, else 0.
        Raises when it is not a number >= 0, or when the lane's quota could never grant it."""
        if given is None:
            estimate = getattr(lane.provider, "estimate_cost", None)
            if not callable(estimate):
                given = 0.0
            else:
                try:
                    estimated = estimate(kind, payload)
                except (TypeError, ValueError, OverflowError, RecursionError) as error:  # max_tokens 10**400
                    raise SchedulerArgumentError(
                        f"provider {lane.name!r}: estimate_cost({kind!r}, payload) raised "
                        f"{type(error).__name__}: {error}; the payload cannot be sized; nothing was queued "
                        "or stored"
                    ) from error
                try:
                    given = checked_cost_estimate(float(estimated))
                except (TypeError, ValueError, OverflowError):
                    raise SchedulerArgumentError(
                        f"provider {lane.name!r}: estimate_cost({kind!r}, ...) returned {estimated!r}; "
                        "expected a finite number >= 0 (a bug in the provider's adapter); nothing was queued "
                        "or stored"
                    ) from None
        cost = checked_cost_estimate(given)
        lane.quota.check_cost(cost)
        return cost

    def _queue_full(self, lane: Lane, priority: Priority, limit: int) -> QueueFullError:
        """The refusal of one more ``priority`` task, reported as an event first."""
        queued = self._depth(priority)  # what waits, as the limit counts it
        name = priority.name.lower()
        if self.events is not None:
            in_lane = len(lane.queues[priority])
            self.events(QueueRejected(self.runtime.now(), lane.name, int(priority), queued, limit, in_lane))
        if limit == 0:
            return QueueFullError(
                f"no {name} request may wait ({name}_limit=0) and provider {lane.name!r} cannot start this "
                "one now; nothing was enqueued. Retry later, raise the limit, or add quota"
            )
        return QueueFullError(
            f"too many {name} requests: {queued} already queued (limit {limit}), nothing was enqueued. "
            f"Retry later (the queue drains at the provider's quota), raise {name}_limit, or add quota"
        )

    def cancel(self, task_id: str) -> bool:
        """Cancel a queued or running task of this scheduler; False if it is not live here.

        A queued task ends ``cancelled`` at once; a running one receives a cancellation at
        its current await (an in-flight provider call is abandoned) and ends ``cancelled``.

        Duplicates waiting on a cancelled owner (a double click's second submission) do not end
        with it: the first of them takes the key over and sends the call again, under the same
        idempotency key (a provider honouring it does not bill twice). To stop all of a key's work,
        cancel each of its submissions.
        """
        if not isinstance(task_id, str):
            raise SchedulerArgumentTypeError(
                f"task_id: expected a task id (str), got {task_id!r}; nothing was cancelled"
            )
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

        Raises :class:`~aiqsim.scheduler.arguments.UnknownNameError` (a ``KeyError``) for an id not
        in the store or a task of a provider this scheduler lacks, and
        :class:`~aiqsim.core.states.IllegalTransitionError` for a task that is not failed, and
        :class:`QueueFullError` when its priority's queue is at its depth limit, as
        :meth:`submit` does; the task is then left as it was.
        """
        if self._closed or self._closing:
            raise SchedulerClosedError("scheduler is closed" if self._closed else "scheduler is closing")
        record = self.store.get(task_id)
        if record is None:
            raise UnknownNameError(f"task_id: no task {task_id!r} in the store; nothing was retried")
        if record.provider not in self._lanes:
            raise UnknownNameError(
                f"task_id: task {task_id!r} is for provider {record.provider!r}, which this scheduler "
                f"lacks (it has {sorted(self._lanes)}); retry it from a scheduler given that provider. "
                f"The task was left {record.status.value}"
            )
        if self._limits[record.priority] is not None and record.status is TaskStatus.FAILED:
            lane = self._lanes[record.provider]  # the depth limit, as for a submission
            self._check_depth_limit(
                lane, record.priority, record.cost_estimate, record.key, record.id, record.tenant
            )
        failed = record
        record = transition(record, TaskStatus.QUEUED, self.runtime.now(), worker=self.worker_id)
        persist_change(failed, record, self.store.update)
        self._staged(record.id)
        accepted = self._commit.durable() if self._commit is not None else None
        self._emit_transition(TaskStatus.FAILED, record)
        live = LiveTask(record=record)
        if record.route is not None and self._routes is not None:  # its retries may move again
            live.route = self._routes.route_of(record)
        self._live[record.id] = live
        self._ensure_started()
        self._claim_and_follow(live)
        return _new_submission(record.id, record.key, live, self._create_future, accepted)

    async def join(self) -> None:
        """Wait until every task submitted here is terminal, or the scheduler crashed (its live tasks
        then never finish here: they are left to :meth:`recover`)."""
        while self._live and not self._crashed:
            await self._idle.wait()

    async def close(self, *, cancel_pending: bool = True) -> None:
        """Stop taking work; cancel what is still live (or wait for it) and stop the dispatchers.

        After :meth:`crash` (what :class:`~aiqsim.fleet.LeaseKeeper` does on a lost lease) it returns
        at once: a crashed task never finishes in this process, so there is nothing to wait for, and
        its record stays as the store has it for the next process's :meth:`recover`. A worker can
        then leave ``async with Scheduler(...)`` and exit for its supervisor to restart it.
        """
        if self._crashed:
            self._closing = self._closed = True
            self._stop_background()  # crash() stopped it; once more is harmless
            return
        self._closing = True  # refuse new work at once; a live job's later stages still get in
        if self._jobs is not None:  # a job's later stages are submitted while it runs
            await self._jobs.close(cancel_pending=cancel_pending)
        self._closed = True  # refuse new submissions while the live ones finish
        if cancel_pending:
            for task_id in list(self._live):
                self.cancel(task_id)
        await self.join()
        await self._last_rewrite()
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
        if self._rewriter is not None:
            self._rewriter.cancel()
        self._stop_background()
        self._idle.notify()  # a close() or join() under way returns: nothing live will finish here

    def submission(self, task_id: str) -> Submission | None:
        """A handle for a task that is live in this scheduler (e.g. one resumed by ``recover``)."""
        live = self._live.get(task_id)
        if live is None:
            return None
        return _new_submission(task_id, live.record.key, live, self._create_future, None)
