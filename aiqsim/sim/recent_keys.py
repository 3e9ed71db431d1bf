"""Keys remembered for a window of (simulated) time after their last activity.

Streaming mode forgets per-task and per-key state once a key has been silent for the idempotency
window; this is the one structure that decides when. Pure: time is passed in, nothing is read.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class RecentKeys(Generic[K]):
    """Keys with the time of their last activity; :meth:`expired` hands back those silent for
    ``window_s``. One queue entry per key (re-queued lazily when it was touched again), so memory is
    the number of keys active within the window."""

    __slots__ = ("_last", "_queue", "window_s")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._last: dict[K, float] = {}
        self._queue: deque[tuple[float, K]] = deque()

    def touch(self, key: K, now: float) -> None:
        """Record activity of ``key`` at ``now`` (times must not go backwards)."""
        if key not in self._last:
            self._queue.append((now, key))
        self._last[key] = now

    def expired(self, now: float) -> list[K]:
        """Forget and return every key whose last activity is older than ``now - window_s``."""
        return [key for key, _ in self.expired_since(now)]

    def expired_since(self, now: float) -> list[tuple[K, float]]:
        """:meth:`expired`, each key with the time of its last activity."""
        cutoff = now - self.window_s
        queue, last = self._queue, self._last
        gone: list[tuple[K, float]] = []
        while queue and queue[0][0] < cutoff:
            _, key = queue.popleft()
            seen = last[key]
            if seen < cutoff:
                del last[key]
                gone.append((key, seen))
            else:
                queue.append((seen, key))
        return gone

    def __contains__(self, key: object) -> bool:
        return key in self._last

    def __len__(self) -> int:
        return len(self._last)
