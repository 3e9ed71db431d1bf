"""When a lane's dispatcher runs: at a wake-up (something changed) or when the time it asked for comes.

The dispatch rule itself (which task starts next, and whether the quota lets it start now) is
``Scheduler._dispatch`` (in :mod:`aiqsim.scheduler.lanes`): one plain function that starts every
task it can and returns how long to wait before it can start the next one (``None``: until something
changes). :class:`LanePump` only decides *when* it runs:

- :meth:`LanePump.wake` (a submission, a release, a cancellation, a retry asking for quota) runs it
  in a later event of the same instant, never inside the caller: every change made in this instant
  before that event is seen, so same-instant submissions are ordered by the dispatch policy, not by
  who called first. Any number of wake-ups before it runs make one run.
- the wait it returned runs it again after that delay, unless a wake-up comes first.

A callback, not a coroutine: a lane's dispatcher is woken about once per call, and resuming a
waiting coroutine (a future, its event, the task's step, the ``await`` chain) cost three times what
running one scheduled callback does (``benchmarks/bench_mmc_peers.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from math import isinf  # names, not math.x: one lookup fewer per call in the hot path

from aiqsim.runtime.protocol import Runtime, ScheduledCall

__all__ = ["LanePump"]


class LanePump:
    """Runs ``step`` (a lane's dispatch) when woken or when the wait it returned has passed."""

    __slots__ = ("_name", "_running", "_runtime", "_soon", "_step", "_stopped", "_timer")

    def __init__(self, runtime: Runtime, step: Callable[[], float | None], name: str) -> None:
        self._runtime = runtime
        self._step = step
        self._name = name
        self._soon = False  # a run is scheduled for this instant
        self._running = False
        self._stopped = False
        self._timer: ScheduledCall | None = None

    @property
    def idle(self) -> bool:
        """Nothing scheduled: no run this instant and no timed retry (stopped, or waiting for a wake-up)."""
        return not self._soon and self._timer is None

    @property
    def stopped(self) -> bool:
        return self._stopped

    def wake(self) -> None:
        """Something changed: run the dispatch in a later event of this instant (once)."""
        if self._soon or self._running or self._stopped:
            return  # a run is due (or under way: it looks again before it stops), or none will come
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._soon = True
        self._runtime.call_soon(self._run, name=self._name)

    def stop(self) -> None:
        """Never run again (the scheduler closed or crashed)."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _run(self) -> None:
        self._soon = False
        if self._stopped:
            return
        self._running = True
        try:
            wait = self._step()
        finally:
            self._running = False
        if wait is not None and not self._stopped:
            if not wait >= 0 or isinf(wait):
                raise ValueError(f"{self._name}: the dispatch asked to wait {wait!r} s")
            self._timer = self._runtime.call_later(wait, self._expire, name=self._name)

    def _expire(self) -> None:
        self._timer = None
        self.wake()
