"""Provider lanes: each provider's queues, quota and dispatcher, and the rule that starts tasks.

One :class:`Lane` per provider holds its dispatch queues (one per priority), its quota and the retry
line of running tasks waiting for quota again. :class:`LaneDispatch` (one of the parts
:class:`~aiqsim.scheduler.scheduler.Scheduler` is made of) enqueues tasks and runs the dispatch: the
dispatch policy's choice starts as soon as the quota admits it, retries before new work of the same
priority, interactive before background.

Providers given one quota object (one account behind two models, say) draw on one budget, so they
are dispatched as one (:func:`share_quota_objects`): their lanes share the queues, the retry line
and the dispatcher of the first of them (its :attr:`Lane.head`). The policy's order, the class
order and the depth limit's trial then hold across those providers as they do within one, and a
slot given back by one provider's call is offered to the next task in that order, whichever
provider it is for (each lane waiting only for its own wake-ups waited for ever).
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from math import isinf  # names, not math.x: one lookup fewer per call in the hot path
from typing import Any

from aiqsim.core.failures import describe_error
from aiqsim.core.numeric import is_wait
from aiqsim.core.task import BACKGROUND, INTERACTIVE, Priority, TaskStatus
from aiqsim.core.token_bucket import MultiQuota, QuotaConfigError, QuotaLimits, Reservation
from aiqsim.runtime.protocol import Cancelled, Future
from aiqsim.scheduler.arguments import SchedulerArgumentError
from aiqsim.scheduler.dispatch import QueueItem, TaskQueue, new_queue_item
from aiqsim.scheduler.events import QuotaSample, QuotaUnavailable, new_quota_sample
from aiqsim.scheduler.lane_pump import LanePump
from aiqsim.scheduler.live import LiveTask
from aiqsim.scheduler.provider import Provider
from aiqsim.scheduler.rate_limit_scope import RateLimitHistory
from aiqsim.stores.base import StoreWriteError

_PRIORITIES = tuple(Priority)  # iterating the enum itself is measurably slow on the dispatch path


@dataclass(eq=False, slots=True)
class QuotaTicket:
    """A running task's request for quota for its next attempt."""

    task_id: str
    cost: float
    future: Future[Reservation]
    removed: bool = False


@dataclass(eq=False, slots=True)  # slots: every dispatch step reads a lane (see SimPyRuntime)
class Lane:
    """One provider: its quota, its queues and its dispatcher."""

    name: str
    provider: Provider
    quota: MultiQuota
    queues: dict[Priority, TaskQueue]
    pump: LanePump = field(init=False)
    """Runs the lane's dispatch (``LaneDispatch._dispatch``) when woken, or when its wait for quota ends."""
    retries: dict[Priority, deque[QuotaTicket]] = field(
        default_factory=lambda: {p: deque() for p in Priority}
    )
    slot_blocked: bool = False
    """The dispatcher waits for a concurrency slot: only a release can unblock it, not new work
    (read and set on the :attr:`head`, whose dispatcher it is)."""
    rate_limits: RateLimitHistory = field(default_factory=RateLimitHistory)
    """The lane's recent share of 429s (read by the ``adaptive`` rate-limit scope)."""
    head: Lane = field(init=False)
    """The lane whose queues and dispatcher this one uses: itself, unless an earlier lane has the
    same quota object (:func:`share_quota_objects`)."""
    shared: bool = False
    """Whether other lanes draw on this lane's quota object (and so share its queues)."""
    lines: tuple[tuple[Priority, deque[QuotaTicket], TaskQueue], ...] = field(init=False)
    """``(priority, retry line, queue)`` in dispatch order: what :meth:`LaneDispatch._next_candidate`
    walks, without two dictionary lookups per priority per dispatch step."""

    def __post_init__(self) -> None:
        self._link_lines()

    def _link_lines(self) -> None:
        self.lines = tuple((p, self.retries[p], self.queues[p]) for p in _PRIORITIES)


def share_quota_objects(lanes: Iterable[Lane]) -> tuple[Lane, ...]:
    """Make lanes given one quota object use one set of queues, one retry line, one dispatch and
    one history of 429s: those of the first of them, their :attr:`~Lane.head`. Every other lane is
    its own head. Returns the heads, one per quota object, in the lanes' order.
    Call once, before any lane has queued work and before the dispatchers are built."""
    heads: dict[int, Lane] = {}
    for lane in lanes:
        head = heads.setdefault(id(lane.quota), lane)
        lane.head = head
        if head is not lane:
            lane.queues, lane.retries = head.queues, head.retries
            lane._link_lines()
            # a 429 pauses the quota, so every provider on it: the account's 429s are one history
            lane.rate_limits = head.rate_limits
            head.shared = lane.shared = True
    return tuple(heads.values())


def lane_quota(given: QuotaLimits | Any, now: float) -> Any:
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


def report_quota_outages(scheduler: Any, lanes: Iterable[Lane]) -> None:
    """Give each lane quota object that reports its outages (a ``report_outages_to(report)`` method,
    as :class:`aiqsim.fleet.RedisQuota` has) a reporter that emits
    :class:`~aiqsim.scheduler.events.QuotaUnavailable` for every provider drawing on it, through the
    scheduler's event sink (read when the outage begins), at the scheduler's clock.

    The reporter holds the scheduler weakly (a quota may outlive it) and says nothing once it is
    closed. A sink that raises is handed to the runtime as a failing callback of its own, which
    reports it: the reservation that found the outage goes on."""
    by_quota: dict[int, tuple[Any, list[str]]] = {}
    for lane in lanes:
        by_quota.setdefault(id(lane.quota), (lane.quota, []))[1].append(lane.name)
    for quota, names in by_quota.values():
        watch = getattr(quota, "report_outages_to", None)
        if callable(watch):
            watch(_outage_reporter(weakref.ref(scheduler), tuple(names)))


def _outage_reporter(scheduler_ref: Any, providers: tuple[str, ...]) -> Any:
    def report(error: str) -> None:
        scheduler = scheduler_ref()
        if scheduler is None or scheduler._closed or scheduler.events is None:
            return
        now = scheduler.runtime.now()
        for provider in providers:
            try:
                scheduler.events(QuotaUnavailable(now, provider, error))
            except Exception as failure:

                def reraise(failure: Exception = failure) -> None:
                    raise failure

                scheduler.runtime.call_soon(reraise, name="event sink (QuotaUnavailable)")

    return report


def check_slot_lease(lane_name: str, quota: Any, policy: Any, consequence: str) -> None:
    """Refuse a retry ``policy`` whose attempts may outlive the concurrency slots of ``quota``.

    A shared quota's slot is a lease (``slot_ttl_s``, e.g. :class:`aiqsim.fleet.RedisQuota`'s) so
    a dead worker's slots come back; a call still out when its lease lapses no longer counts, and
    the fleet runs more calls at once than the account allows (slot_ttl_s=1 with 3 s calls: 3 in
    flight under concurrency 1). Refused, rather than renewing slots in flight: the attempt
    timeout already bounds every call, so one comparison made up front keeps the bound without a
    renewal loop per call. ``attempt_timeout_s=None`` (no bound) is refused for the same reason.
    Both are scheduler seconds (RedisQuota converts its ttl with ``time_scale``).
    """
    ttl = getattr(quota, "slot_ttl_s", None)
    if ttl is None:
        return
    timeout = policy.attempt_timeout_s
    if timeout is None or timeout >= ttl:
        bound = "no attempt timeout" if timeout is None else f"attempt_timeout_s={timeout:g}"
        raise SchedulerArgumentError(
            f"provider {lane_name!r}: its quota's concurrency slots lapse after slot_ttl_s={ttl:g} s, but "
            f"the retry policy has {bound}: a call still out when its slot lapses no longer counts, and "
            f"the fleet would run more calls than its concurrency. Give RetryPolicy(attempt_timeout_s=...) "
            f"below slot_ttl_s, or a longer slot_ttl_s; {consequence}"
        )


def checked_quota_wait(lane: Lane, cost: float, wait: object) -> float:
    """``wait``, the quota's answer to ``time_until(cost, ...)``, as a float, if it is a number of
    seconds >= 0 (infinity: until a release frees a slot); else a :class:`QuotaConfigError` naming
    the provider, the quota and the value. NaN passed ``max(wait, 0.0)`` and made the lane's timer
    NaN: the lane stalled with its tasks queued and nothing said. Raised inside the dispatch, it
    fails the task the lane was reserving for (as a quota that refuses a cost does), with this
    message, and the lane goes on with its next task; other lanes are not touched."""
    if is_wait(wait):
        try:
            return float(wait)  # type: ignore[arg-type]
        except OverflowError:  # an int past any float (10**400): no number of seconds either
            pass
    raise QuotaConfigError(
        f"provider {lane.name!r}: its quota {type(lane.quota).__name__}.time_until({cost!r}) returned "
        f"{wait!r}; a quota must answer a number of seconds >= 0 (inf: until a release frees a "
        "slot). The task was failed rather than left waiting for a time that never comes"
    )


def quota_raised(lane: Lane, method: str, error: Exception) -> QuotaConfigError:
    """A :class:`QuotaConfigError` naming the provider, the quota and what its ``try_reserve`` or
    ``time_until`` raised (a quota's bug). It fails the task the lane was reserving for, as a refused
    cost does, and the lane goes on; raised out of the dispatch, it left the lane without a timer and
    its queued tasks waited for ever."""
    return QuotaConfigError(
        f"provider {lane.name!r}: its quota {type(lane.quota).__name__}.{method} raised "
        f"{describe_error(error)}; the task was failed"
    )


_QUOTA_METHODS = ("check_cost", "try_reserve", "time_until", "release", "cancel", "reconcile", "pause_until")


class LaneDispatch:
    """Each provider lane's queues and its dispatch: which task starts next, and when the quota admits it."""

    __slots__ = ()

    def _enqueue(self, live: LiveTask) -> None:
        record = live.record
        priority = record.priority
        lane = self._lanes[record.provider]
        seq = self._seq = self._seq + 1
        item = new_queue_item(record.id, record.cost_estimate, self.runtime.now(), seq, False, record.tenant)
        live.queue_item = item
        lane.queues[priority].push(item)
        self._queued[priority] += 1
        if not lane.head.slot_blocked:  # new work cannot help a dispatcher that waits for a free slot
            lane.pump.wake()

    def _ensure_started(self) -> None:
        if self._started or self._closed:
            return
        self._started = True
        for head in self._lane_heads:
            head.pump.wake()

    def _stop_background(self) -> None:
        for head in self._lane_heads:
            head.pump.stop()
        for watcher in list(self._watchers.values()):
            watcher.cancel()
        self._watchers.clear()

    def _next_candidate(self, lane: Lane, now: float) -> tuple[QuotaTicket | QueueItem, Priority] | None:
        for priority, tickets, queue in lane.lines:
            while tickets and (tickets[0].removed or tickets[0].future.done()):
                tickets.popleft()
            if tickets:
                return tickets[0], priority
            item = queue.peek(now)
            if item is not None:
                return item, priority
        return None

    def _start_order(self, lane: Lane, now: float) -> Iterator[tuple[QuotaTicket | QueueItem, Priority]]:
        """Every candidate of ``lane`` in the order :meth:`_dispatch` at ``now`` would take them if
        the quota admitted each: what :meth:`_next_candidate` returns, then what it returns once
        that one is gone, and so on. Nothing is taken (the depth limit asks what would start)."""
        for priority in _PRIORITIES:
            for ticket in lane.retries[priority]:
                if not ticket.removed and not ticket.future.done():
                    yield ticket, priority
            queue = lane.queues[priority]
            ordered = getattr(queue, "ordered", None)
            if callable(ordered):
                for item in ordered(now):
                    yield item, priority
            else:  # a policy's queue that cannot show its order: its head, and no further
                head = queue.peek(now)
                if head is not None:
                    yield head, priority
                    return

    def _dispatch(self, lane: Lane) -> float | None:
        """Start every task ``lane``'s quota admits now, in the dispatch policy's order.

        The policy's choice is never skipped: when it must wait for quota, so does the lane. Returns
        how long until it may start (``None``: until a wake-up, as when nothing is queued or only a
        release can free a slot). Run by the lane's :class:`~aiqsim.scheduler.lane_pump.LanePump`,
        for a :attr:`~Lane.head` only: its queues hold the work of every lane that shares its quota
        object, and each task starts on its own provider's lane.
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
            asked = "try_reserve"  # for the error of a quota that raises (quota_raised)
            try:
                reservation = quota.try_reserve(candidate.cost, now)
                if reservation is None:
                    asked = "time_until"
                    wait = quota.time_until(candidate.cost, now)
                    if wait.__class__ is not float or not wait >= 0.0:  # one test on the hot path
                        wait = self._checked_wait(lane, candidate, wait)
            except Exception as raised:  # e.g. recovered from a process with a larger burst
                error = raised if isinstance(raised, QuotaConfigError) else quota_raised(lane, asked, raised)
                if isinstance(candidate, QuotaTicket):  # a retry: its attempt loop fails the task
                    lane.retries[priority].popleft()  # (e.g. a shared quota's Redis refused the call)
                    candidate.future.set_exception(error)
                    continue
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
                if isinstance(candidate, QueueItem):
                    wait = min(wait, lane.queues[priority].next_change(now) - now)
                if isinf(wait):
                    lane.slot_blocked = True
                    return None
                return max(wait, 0.0)
            own = self._lanes[self._live[candidate.task_id].record.provider] if lane.shared else lane
            # the sample is read now (the queue still holds the candidate) but sent once the start
            # is recorded: a sink that submits in between (a duplicate) sees the task started
            sample = self._quota_sample(own, now) if self._quota_events else None
            if isinstance(candidate, QuotaTicket):
                lane.retries[priority].popleft()
                candidate.future.set_result(reservation)
            else:
                lane.queues[priority].pop(candidate)
                self._queued[priority] -= 1
                task_id = candidate.task_id
                live = self._live[task_id]
                live.queue_item = None
                run = self._run(own, live, reservation)
                live.runner = runtime.spawn(run, name=f"task-{task_id}")
            if sample is not None:
                assert self.events is not None
                self.events(sample)

    def _checked_wait(self, lane: Lane, candidate: QuotaTicket | QueueItem, wait: object) -> float:
        """:func:`checked_quota_wait`, and a bad wait also told to the event sink
        (:class:`~aiqsim.scheduler.events.QuotaUnavailable` for the candidate's provider)."""
        try:
            return checked_quota_wait(lane, candidate.cost, wait)
        except QuotaConfigError as error:
            if self.events is not None:
                provider = self._live[candidate.task_id].record.provider
                _outage_reporter(weakref.ref(self), (provider,))(str(error))
            raise

    async def _await_ticket(self, lane: Lane, live: LiveTask) -> Reservation:
        ticket = QuotaTicket(live.record.id, live.record.cost_estimate, self.runtime.create_future())
        lane.retries[live.record.priority].append(ticket)
        lane.pump.wake()
        try:
            return await ticket.future
        except Cancelled:
            ticket.removed = True
            future = ticket.future
            if future.done() and not future.cancelled():
                lane.quota.cancel(future.result(), self.runtime.now())
            self._quota_returned(lane)
            raise

    def _quota_returned(self, lane: Lane) -> None:
        """Quota came back to ``lane`` (a release, a cancelled reservation, a retry that stopped
        waiting): wake its dispatcher, unless no task waits for quota anywhere, when that run would
        find nothing to start. The slot is then noted as free, so that the next submission wakes it
        (a release once cost a dispatch run per call even on an idle lane)."""
        head = lane.head
        retries = head.retries
        queued = self._queued
        if queued[INTERACTIVE] or queued[BACKGROUND] or retries[INTERACTIVE] or retries[BACKGROUND]:
            head.pump.wake()
        else:
            head.slot_blocked = False

    def _emit_quota(self, lane: Lane, now: float) -> None:
        assert self.events is not None
        self.events(self._quota_sample(lane, now))

    def _quota_sample(self, lane: Lane, now: float) -> QuotaSample:
        """The quota's levels and the queues' lengths, for ``lane``'s provider (the queues of
        every provider sharing its quota object, when it shares one)."""
        requests, tokens, in_flight = lane.quota.levels(now)
        queues = lane.queues
        # positional, in QuotaSample's field order: one is built per granted attempt
        return new_quota_sample(
            now,
            lane.name,
            requests,
            tokens,
            in_flight,
            len(queues[INTERACTIVE]),
            len(queues[BACKGROUND]),
        )
