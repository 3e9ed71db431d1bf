"""The queue depth limit: how many requests of a priority class may *wait* for their lane.

A limit (``interactive_limit``, ``background_limit``) bounds the requests that wait. A request its
lane can start at once -- no request of its class or a higher one ahead of it in that lane, and the
quota admitting it now -- does not wait, so it is accepted even at the limit. Hence:

- a fan-out of calls submitted in one instant is refused only beyond what the lanes start at once
  plus the limit (a lane's dispatch runs in a later event of the instant, so until then every one
  of them sits in a queue; counting them all refused calls that free slots would have started);
- a limit of 0 means "start at once or be refused": a loss system (M/M/c/c, Erlang B).

At the limit the lanes' dispatch runs first, inside the submission (:meth:`LanePump.run_now`), so
the requests that can start in this instant leave the queues before they are counted. The rule of
which request starts stays where it is (:meth:`~aiqsim.scheduler.lanes.LaneDispatch._dispatch`);
this module only decides whether one more request may join the queue. :class:`DepthLimit` is one
of the parts :class:`~aiqsim.scheduler.scheduler.Scheduler` is made of.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiqsim.core.task import Priority
from aiqsim.scheduler.lanes import Lane

if TYPE_CHECKING:
    from aiqsim.scheduler.job_spec import JobSpec


class DepthLimit:
    """Whether one more request of a priority class may be queued, or the class is full."""

    def _refusing_limit(self, lane: Lane, priority: Priority, cost: float) -> int | None:
        """The limit that refuses one more task of ``priority`` and ``cost`` on ``lane`` now, or
        ``None`` when it may be queued (under the limit, or its lane starts it at once)."""
        limit = self._limits[priority]
        if limit is None or self._depth(priority) < limit:
            return None
        self._dispatch_now()
        if self._depth(priority) < limit or self._starts_at_once(lane, priority, cost):
            return None
        return limit

    def _refusing_job_limit(self, spec: JobSpec, priority: Priority) -> int | None:
        """:meth:`_refusing_limit` for a job: it does not wait when every first stage's lane (the
        stages with no ``after``) could start a call at once (a cost given as a function of the
        payload, which is not built yet, counts as 0 here)."""
        limit = self._limits[priority]
        if limit is None or self._depth(priority) < limit:
            return None
        self._dispatch_now()
        if self._depth(priority) < limit:
            return None
        for stage in spec.stages:
            if stage.after:
                continue
            lane = self._lanes.get(stage.provider)
            cost = stage.cost if isinstance(stage.cost, int | float) else 0.0
            if lane is None or not self._starts_at_once(lane, priority, float(cost)):
                return limit
        return None

    def _dispatch_now(self) -> None:
        """Run every lane's dispatch now, so what can start in this instant leaves the queues."""
        if not self._started:
            return  # nothing has been dispatched yet: the queues hold only what waits for the start
        for lane in self._lanes.values():
            lane.pump.run_now()

    def _starts_at_once(self, lane: Lane, priority: Priority, cost: float) -> bool:
        """Whether a new request of ``priority`` and ``cost`` would start on ``lane`` in this instant:
        nothing of its class or a higher one waits ahead of it, and the quota admits it now."""
        now = self.runtime.now()
        ahead = self._next_candidate(lane, now)
        if ahead is not None and ahead[1] <= priority:
            return False
        # can_reserve where the quota has it: a shared quota's time_until never says "now" (a Redis
        # quota answers from its last refusal, at least 1 us), which would refuse every request at 0
        can_reserve = getattr(lane.quota, "can_reserve", None)
        if callable(can_reserve):
            return bool(can_reserve(cost, now))
        return bool(lane.quota.time_until(cost, now) <= 0.0)
