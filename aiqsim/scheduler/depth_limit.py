"""The queue depth limit: how many requests of a priority class may *wait* for their lane.

A limit (``interactive_limit``, ``background_limit``) bounds the requests that wait. A request its
lane would start in this instant does not wait, so it is accepted even at the limit; so is one
that would wait while fewer than ``limit`` others of its class still wait once this instant's
starts are made. Hence:

- a fan-out of calls submitted in one instant is refused only beyond what the lanes start at once
  plus the limit (a lane's dispatch runs in a later event of the instant, so until then every one
  of them sits in a queue; counting them all refused calls that free slots would have started);
- a limit of 0 means "start at once or be refused": a loss system (M/M/c/c, Erlang B).

Below the limit nothing more is asked. At the limit the question "what would start now?" is
answered by a *trial dispatch*: the new request is put in its queue as a probe, every candidate is
taken in the order the dispatch would take them (:meth:`LaneDispatch._start_order`, the same
policy queues and the same class order) against a :class:`~aiqsim.core.quota_trial.QuotaTrial` of
the lane's quota, and the probe is taken out again. Nothing starts and no quota is kept, so the
order in which the instant's requests start is still the dispatch policy's, whoever was submitted
first (a cheaper request submitted later in the instant still goes first under SJF; an interactive
one still goes before background work). The other side of that choice: a request accepted
because it would start now can be overtaken in the same instant by a request the policy puts first
(an interactive one, or a cheaper one under SJF) submitted after it, and then waits even at limit
0; each such overtaking was itself admitted by the same rule. This module only decides whether
one more request may join the queues; :class:`DepthLimit` is one of the parts
:class:`~aiqsim.scheduler.scheduler.Scheduler` is made of.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from aiqsim.core.quota_trial import QuotaTrial
from aiqsim.core.task import Priority, TaskRecord
from aiqsim.core.token_bucket import QuotaConfigError
from aiqsim.scheduler.dispatch import QueueItem
from aiqsim.scheduler.lanes import Lane
from aiqsim.stores.base import LIVE_OWNER_STATUSES

Call = tuple[Lane, float, QueueItem | None]
"""A request the depth limit is asked about: its lane, its cost, and the queue item of the queued
owner it would move into its class (a duplicate promoting its owner stands for it), if any."""

_PROBE_ID = "\x00depth-limit-probe"
"""The task id of a trial dispatch's probe: never a real task's (ids are hex, or given and stored)."""


class DepthLimit:
    """Whether more requests of a priority class may be queued, or the class is full."""

    __slots__ = ()

    def _check_depth_limit(
        self,
        lane: Lane,
        priority: Priority,
        cost: float,
        key: str,
        task_id: str | None = None,
        tenant: str | None = None,
    ) -> None:
        """Raise :class:`~aiqsim.scheduler.refusals.QueueFullError` when the limit of ``priority``
        refuses one more request (a submission, or the manual retry of task ``task_id``) of ``cost``
        for ``key`` on ``lane``; its key's live owner, if another task, makes it a duplicate. The
        trial puts the request in its ``tenant``'s queue (:mod:`aiqsim.scheduler.tenants`)."""
        existing = self.store.owner_of(key)  # only the limit asks: a store read (SQL) saved without one
        live = existing is not None and existing.id != task_id and existing.status in LIVE_OWNER_STATUSES
        limit = self._refusing_submission(lane, priority, cost, existing if live else None, tenant)
        if limit is not None:
            raise self._queue_full(lane, priority, limit)

    def _refusing_submission(
        self,
        lane: Lane,
        priority: Priority,
        cost: float,
        duplicate_of: TaskRecord | None,
        tenant: str | None = None,
    ) -> int | None:
        """The limit that refuses a submission of ``priority`` and ``cost`` on ``lane``, or ``None``.

        A duplicate (``duplicate_of``: the live owner of its key) queues nothing, so no limit
        refuses it, unless it moves its queued owner into its own, higher class: it then stands
        for the owner there (the owner's lane and cost).
        """
        if duplicate_of is None:
            return self._refusing_limit(lane, priority, cost, tenant=tenant)
        promoted = self._promoted_call(duplicate_of.id, priority)
        if promoted is None:
            return None
        owner_lane, owner_cost, owner_item = promoted
        return self._refusing_limit(owner_lane, priority, owner_cost, replacing=owner_item)

    def _promoted_call(self, owner_id: str, priority: Priority) -> Call | None:
        """What a duplicate of ``priority`` queues: nothing (``None``), unless it moves its owner,
        queued here, into its own higher class; it then stands for the owner there."""
        owner = self._promoted_owner(owner_id, priority)
        if owner is None:
            return None
        return (self._lanes[owner.record.provider], owner.record.cost_estimate, owner.queue_item)

    def _refusing_limit(
        self,
        lane: Lane,
        priority: Priority,
        cost: float,
        *,
        replacing: QueueItem | None = None,
        tenant: str | None = None,
    ) -> int | None:
        """The limit that refuses one more request of ``priority`` and ``cost`` on ``lane`` now, or
        ``None`` when it may be queued. ``replacing`` is the queue item of a queued owner that the
        request would move into its class (a duplicate promoting it): the request stands for it."""
        limit = self._limits[priority]
        if limit is None or self._depth(priority) < limit:
            return None
        if self._admitted_at_limit(priority, limit, ((lane, cost, replacing),), tenant):
            return None
        return limit

    def _refusing_job_limit(
        self, first_calls: Callable[[], Sequence[Call]], priority: Priority
    ) -> int | None:
        """:meth:`_refusing_limit` for a job whose first calls (its stages without ``after``, one
        per element of a fan-out; each a lane, a cost and the queued owner it would promote, as
        in :meth:`_refusing_limit`) ``first_calls()`` lists: it does not wait when they all start
        at once. They are only listed at the limit (it runs the job's builds)."""
        limit = self._limits[priority]
        if limit is None or self._depth(priority) < limit:
            return None
        if self._admitted_at_limit(priority, limit, first_calls()):
            return None
        return limit

    def _admitted_at_limit(
        self, priority: Priority, limit: int, calls: Iterable[Call], tenant: str | None = None
    ) -> bool:
        """Whether new requests (``calls``) of ``priority`` may join the queues of a class at its
        limit: they all start in this instant, or fewer than ``limit`` others would still wait.

        Each lane :attr:`~aiqsim.scheduler.lanes.Lane.head` (one per quota object) is tried on its
        own: what one of them starts takes nothing from another's quota."""
        now = self.runtime.now()
        probes: list[tuple[Lane, QueueItem]] = []
        replaced: set[int] = set()  # the ids of the queue items that probes stand for
        for lane, cost, replacing in calls:
            self._seq += 1  # a probe's place among equals is after everything already queued
            # a probe waits in the queue of the tenant it stands for (a promoted owner's, else ``tenant``)
            probe = QueueItem(
                _PROBE_ID, cost, now, self._seq, False, replacing.tenant if replacing else tenant
            )
            lane.queues[priority].push(probe)
            probes.append((lane, probe))
            if replacing is not None:
                replaced.add(id(replacing))
        if not probes:
            return True  # nothing would be queued (a job whose first calls are all duplicates)
        probe_lanes = {id(probe): lane.name for lane, probe in probes}
        try:
            starting: set[str] = set()
            with_probes = list(dict.fromkeys(lane.head for lane, _ in probes))
            probes_started = 0
            for head in with_probes:
                probes_started += self._trial_dispatch(head, now, priority, starting, replaced, probe_lanes)
            if probes_started == len(probes):
                return True
            for head in self._lane_heads:  # what leaves the other lanes' queues in this instant
                if head not in with_probes and len(head.queues[priority]):
                    self._trial_dispatch(head, now, priority, starting, replaced, probe_lanes)
            return self._depth(priority, starting) < limit
        finally:
            for lane, probe in probes:
                lane.queues[priority].pop(probe)

    def _trial_dispatch(
        self,
        lane: Lane,
        now: float,
        priority: Priority,
        starting: set[str],
        replaced: set[int],
        probe_lanes: dict[int, str],
    ) -> int:
        """Take ``lane``'s candidates in dispatch order against a trial of its quota, up to the
        first it would not grant. Adds the queued tasks of ``priority`` that would start (or leave
        the queue, failed for a cost the quota can never grant) to ``starting``; returns how many
        probes would start. ``replaced`` holds the ids of the queue items that probes stand for,
        ``probe_lanes`` the provider of each probe (by id). A queued task whose provider's gates
        hold first attempts back does not start: it would take its quota only to give it back and
        wait (:meth:`~aiqsim.scheduler.attempts.AttemptLoop._wait_for_gates`)."""
        trial = QuotaTrial(lane.quota)
        probes_started = 0
        held: dict[str, bool] = {}
        try:
            for candidate, klass in self._start_order(lane, now):
                if id(candidate) in replaced:
                    continue  # it is a probe now, in its new class
                reservation = None
                try:
                    reservation = trial.try_reserve(candidate.cost, now)
                    granted = reservation is not None
                except QuotaConfigError:
                    granted = isinstance(candidate, QueueItem)  # dispatch fails it: it does not wait
                if not granted:
                    break  # the policy's choice waits for quota, and so does the lane
                if reservation is not None and self.gates and isinstance(candidate, QueueItem):
                    provider = probe_lanes.get(id(candidate)) or self._live[candidate.task_id].record.provider
                    if provider not in held:
                        held[provider] = self._gate_wait(provider, False) > 0
                    if held[provider]:  # it starts, gives its quota back at once and waits in the gate
                        trial.give_back(reservation, now)
                        continue
                if isinstance(candidate, QueueItem) and klass is priority:
                    if candidate.task_id == _PROBE_ID:
                        probes_started += 1
                    else:
                        starting.add(candidate.task_id)
        finally:
            trial.discard(now)
        return probes_started
