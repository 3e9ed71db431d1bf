"""A sliding time window of event timestamps: the counting primitive of the overload policies."""

from __future__ import annotations

import math
from collections import deque

from aiqsim.core.errors import ConfigurationError


class TimeWindow:
    """Timestamps of events over the last ``window_s`` seconds.

    An event at ``t`` counts at ``now`` while ``now - t < window_s``: the window is the
    half-open interval ``(now - window_s, now]``. Events must be added in time order.
    Memory is one float per event in the window.
    """

    __slots__ = ("_times", "window_s")

    def __init__(self, window_s: float) -> None:
        if not window_s > 0 or not math.isfinite(window_s):
            raise ConfigurationError(
                f"window_s must be a positive finite number of seconds, got {window_s!r}"
            )
        self.window_s = float(window_s)
        self._times: deque[float] = deque()

    def add(self, now: float) -> None:
        """Record one event at ``now``."""
        self._times.append(now)

    def count(self, now: float) -> int:
        """Events in ``(now - window_s, now]``."""
        horizon = now - self.window_s
        times = self._times
        while times and times[0] <= horizon:
            times.popleft()
        return len(times)

    def remove_latest(self) -> None:
        """Forget the most recent event (an admission that was rolled back at once)."""
        if self._times:
            self._times.pop()

    def clear(self) -> None:
        """Forget every event."""
        self._times.clear()

    def __len__(self) -> int:
        return len(self._times)
