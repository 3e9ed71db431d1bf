"""The fleet keys (:func:`aiqsim.sim.fleet_metrics.summarize_fleet`) in streaming mode.

:class:`StreamingFleet` reads each worker's task transitions (the worker is known from which
scheduler's sink the event came through), the refused submissions and the provider ledger's
executions, and feeds the same :class:`~aiqsim.sim.fleet_metrics.FleetLoad` as the full-record
mode, so offered load, utilisation and wasted capacity are identical to it; the per-worker latency
p95 comes from a :class:`~aiqsim.sim.streaming.RelativeErrorHistogram` (within its relative error).

A task's submission is counted once it is known not to be a duplicate (its first status other than
``queued``/``deduped``, or at the end of the run while still queued), because the full-record mode
leaves out the tasks whose final status is ``deduped``. Per-task state lives while the task is
alive and for ``window_s`` after its last activity (an execution the provider records after the
client gave up still finds its task's worker); memory is flat in the number of tasks.
"""

from __future__ import annotations

import math
from typing import Any

from aiqsim.scheduler.events import TaskTransition
from aiqsim.sim.config import Scenario
from aiqsim.sim.fleet_metrics import FleetLoad
from aiqsim.sim.recent_keys import RecentKeys
from aiqsim.sim.streaming import DEFAULT_RELATIVE_ERROR, RelativeErrorHistogram

_TERMINAL = frozenset({"succeeded", "failed", "cancelled", "deduped"})
_UNDECIDED = frozenset({"queued", "deduped"})


class _FleetTask:
    __slots__ = ("arrived", "cost", "counted", "created", "elapsed", "provider", "status", "worker")

    def __init__(
        self, arrived: float, created: float, provider: str, cost: float | None, worker: int
    ) -> None:
        self.arrived = arrived
        self.created = created
        self.provider = provider
        self.cost = cost
        self.worker = worker
        self.counted = False
        self.status = "queued"
        self.elapsed: float | None = None
        """Arrival to terminal, while the task is terminal (taken back if it leaves that state)."""


class StreamingFleet:
    """Fleet keys as the run goes; ``window_s``: how long a finished task's worker is remembered."""

    def __init__(
        self, scenario: Scenario, window_s: float, relative_error: float = DEFAULT_RELATIVE_ERROR
    ) -> None:
        self.histograms = [RelativeErrorHistogram(relative_error) for _ in range(scenario.fleet.workers)]
        self.load = FleetLoad(scenario, self.histograms)
        self._arrivals: dict[str, float] = {}
        self._tasks: dict[str, _FleetTask] = {}
        self._finished: RecentKeys[str] = RecentKeys(window_s)

    def arrival(self, task_id: str, time: float) -> None:
        """A user submitted ``task_id`` at ``time`` (latency counts from here)."""
        self._arrivals[task_id] = time

    def rejected(self, task_id: str, provider: str, time: float, cost: float | None, worker: int) -> None:
        """``worker`` refused the submission at the door: offered load all the same."""
        self._arrivals.pop(task_id, None)
        self.load.submission(provider, time, cost, worker)

    def event(self, event: Any, worker: int) -> None:
        """One scheduler event from ``worker``'s sink (only task transitions are read)."""
        if type(event) is not TaskTransition:
            return
        task = self._tasks.get(event.task_id)
        if event.old is None or task is None:
            arrived = self._arrivals.pop(event.task_id, event.time)
            task = _FleetTask(arrived, event.time, event.provider, event.cost_estimate, worker)
            self._tasks[event.task_id] = task
        if task.elapsed is not None:  # it leaves a terminal state (e.g. failed -> queued): take it back
            self.histograms[task.worker].remove(task.elapsed)
            task.elapsed = None
        if not task.counted and event.new not in _UNDECIDED:
            task.counted = True
            self.load.submission(task.provider, task.created, task.cost, task.worker)
        task.status = event.new
        if event.new in _TERMINAL:
            task.elapsed = event.time - task.arrived
            self.histograms[task.worker].add(task.elapsed)
            self._finished.touch(event.task_id, event.time)
        self._expire(event.time)

    def execution(self, x: Any) -> None:
        """One provider ledger record."""
        task = self._tasks.get(x.task_id)
        if task is not None:
            self.load.execution(x.provider, x.start, x.outcome, x.units, task.worker)
            if task.elapsed is not None:
                self._finished.touch(x.task_id, x.end)
        self._expire(x.end)

    def _expire(self, now: float) -> None:
        for task_id in self._finished.expired(now):
            task = self._tasks.get(task_id)
            if task is not None and task.elapsed is not None:
                del self._tasks[task_id]

    @property
    def retained(self) -> int:
        """Tasks whose state is held now (alive, or finished within the window)."""
        return len(self._tasks)

    def summary(self) -> dict[str, float]:
        """The fleet keys; tasks still queued at the end count as offered (they are not duplicates)."""
        for task in self._tasks.values():
            if not task.counted and task.status != "deduped":
                task.counted = True
                self.load.submission(task.provider, task.created, task.cost, task.worker)
        return self.load.summary(lambda h: h.percentile(95) if h.count else math.nan)
