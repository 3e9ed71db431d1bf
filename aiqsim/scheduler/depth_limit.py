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

_PROBE_ID = "\x00depth-limit-probe"
"""The task id of a trial dispatch's probe: never a real task's (ids are hex, or given and stored)."""


class DepthLimit:
    """Whether more requests of a priority class may be queued, or the class is full."""

    def _refusing_submission(
        self, lane: Lane, priority: Priority, cost: float, duplicate_of: TaskRecord | None
    ) -> int | None:
        """The limit that refuses a submission of ``priority`` and ``cost`` on ``lane``, or ``None``.

        A duplicate (``duplicate_of``: the live owner of its key) queues nothing, so no limit
        refuses it, unless it moves its queued owner into its own, higher class: it then stands
        for the owner there (the owner's lane and cost).
        """
        if duplicate_of is None:
            return self._refusing_limit(lane, priority, cost)
        if not self._would_promote(duplicate_of.id, priority):
            return None
        owner = self._live[duplicate_of.id]
        record = owner.record
        return self._refusing_limit(
            self._lanes[record.provider], priority, record.cost_estimate, replacing=owner.queue_item
        )

    def _refusing_limit(
        self, lane: Lane, priority: Priority, cost: float, *, replacing: QueueItem | None = None
    ) -> int | None:
        """The limit that refuses one more request of ``priority`` and ``cost`` on ``lane`` now, or
        ``None`` when it may be queued. ``replacing`` is the queue item of a queued owner that the
        request would move into its class (a duplicate promoting it): the request stands for it."""
        limit = self._limits[priority]
        if limit is None or self._depth(priority) < limit:
            return None
        if self._admitted_at_limit(priority, limit, ((lane, cost),), replacing):
            return None
        return limit

    def _refusing_job_limit(
        self, first_calls: Callable[[], Sequence[tuple[Lane, float]]], priority: Priority
    ) -> int | None:
        """:meth:`_refusing_limit` for a job whose first calls (its stages without ``after``, one
        per element of a fan-out, each a lane and a cost) ``first_calls()`` lists: it does not wait
        when they all start at once. They are only listed at the limit (it runs the job's builds)."""
        limit = self._limits[priority]
        if limit is None or self._depth(priority) < limit:
            return None
        if self._admitted_at_limit(priority, limit, first_calls(), None):
            return None
        return limit

    def _admitted_at_limit(
        self,
        priority: Priority,
        limit: int,
        calls: Iterable[tuple[Lane, float]],
        replacing: QueueItem | None,
    ) -> bool:
        """Whether new requests (``calls``) of ``priority`` may join the queues of a class at its
        limit: they all start in this instant, or fewer than ``limit`` others would still wait."""
        now = self.runtime.now()
        probes: list[tuple[Lane, QueueItem]] = []
        for lane, cost in calls:
            self._seq += 1  # a probe's place among equals is after everything already queued
            probe = QueueItem(_PROBE_ID, cost, now, self._seq)
            lane.queues[priority].push(probe)
            probes.append((lane, probe))
        if not probes:
            return True  # nothing would be queued (a job whose first calls are all duplicates)
        trials: dict[int, QuotaTrial] = {}  # one per quota object: lanes may share one account
        try:
            starting: set[str] = set()
            probe_lanes = [lane for lane, _ in probes]
            lanes = self._dispatch_order(probe_lanes)
            last_probe_lane = max(lanes.index(lane) for lane in probe_lanes)
            probes_started = 0
            for position, lane in enumerate(lanes):
                probes_started += self._trial_dispatch(lane, now, priority, starting, replacing, trials)
                if position == last_probe_lane and probes_started == len(probes):
                    return True  # what later lanes start cannot take back what these were granted
            return self._depth(priority, starting) < limit
        finally:
            for trial in trials.values():
                trial.discard(now)
            for lane, probe in probes:
                lane.queues[priority].pop(probe)

    def _dispatch_order(self, probe_lanes: Sequence[Lane]) -> list[Lane]:
        """The lanes in the order their dispatches run in this instant: those already due, in the
        order they were woken; then the probes' lanes (their submissions would wake them); then the
        rest. It matters only where lanes share a quota object: the first to run takes it first."""
        position = {lane: index for index, lane in enumerate(self._lanes.values())}

        def order(lane: Lane) -> tuple[int, int]:
            if lane.pump.due_now:
                return (0, lane.pump.due_order)
            if lane in probe_lanes:
                return (1, probe_lanes.index(lane))
            return (2, position[lane])

        return sorted(self._lanes.values(), key=order)

    def _trial_dispatch(
        self,
        lane: Lane,
        now: float,
        priority: Priority,
        starting: set[str],
        replacing: QueueItem | None,
        trials: dict[int, QuotaTrial],
    ) -> int:
        """Take ``lane``'s candidates in dispatch order against the trial of its quota (from
        ``trials``, made on first use), up to the first it would not grant. Adds the queued tasks
        of ``priority`` that would start (or leave the queue, failed for a cost the quota can never
        grant) to ``starting``; returns how many probes would start."""
        probes_started = 0
        for candidate, klass in self._start_order(lane, now):
            if candidate is replacing:
                continue  # it is the probe now, in its new class
            trial = trials.get(id(lane.quota))
            if trial is None:
                trial = trials[id(lane.quota)] = QuotaTrial(lane.quota)
            try:
                granted = trial.try_reserve(candidate.cost, now) is not None
            except QuotaConfigError:
                granted = isinstance(candidate, QueueItem)  # dispatch fails it: it does not wait
            if not granted:
                break
            if isinstance(candidate, QueueItem) and klass is priority:
                if candidate.task_id == _PROBE_ID:
                    probes_started += 1
                else:
                    starting.add(candidate.task_id)
        return probes_started
