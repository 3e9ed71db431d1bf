"""Reservations tried against a quota and then dropped: "would these calls start now?"

The depth limit (:mod:`aiqsim.scheduler.depth_limit`) asks which queued calls a lane would start
in this instant without starting them. It asks the quota itself, through a :class:`QuotaTrial`:

- a quota with ``trial()`` (:class:`~aiqsim.core.token_bucket.MultiQuota` and the quotas built on
  it) gives a private copy; nothing done to the copy reaches the quota, so its levels stay
  bit-for-bit what they were;
- a quota without one (a :class:`aiqsim.fleet.RedisQuota`, whose state is the server's) is
  reserved for real, and :meth:`QuotaTrial.discard` cancels every grant. Other workers may see
  those reservations for the moment in between.
"""

from __future__ import annotations

from typing import Any

from aiqsim.core.token_bucket import Reservation

__all__ = ["QuotaTrial"]


class QuotaTrial:
    """Reservations against ``quota`` that are never kept. Call :meth:`discard` when done."""

    __slots__ = ("_granted", "_real", "_target")

    def __init__(self, quota: Any) -> None:
        make_copy = getattr(quota, "trial", None)
        copy = make_copy() if callable(make_copy) else None
        self._target = quota if copy is None else copy
        self._real = quota if copy is None else None
        self._granted: list[Reservation] = []

    def try_reserve(self, tokens: float, now: float) -> Reservation | None:
        """What the quota would grant now, on top of what this trial was granted already."""
        reservation = self._target.try_reserve(tokens, now)
        if reservation is not None and self._real is not None:
            self._granted.append(reservation)
        return reservation

    def give_back(self, reservation: Reservation, now: float) -> None:
        """Return one reservation of this trial at once: what a task that starts and hands its quota
        straight back would leave (a gate holding its first attempt back)."""
        self._target.cancel(reservation, now)
        if self._real is not None:
            self._granted.remove(reservation)

    def discard(self, now: float) -> None:
        """Give back what a quota without a private copy granted (nothing to do for a copy)."""
        granted, self._granted = self._granted, []
        for reservation in reversed(granted):
            self._real.cancel(reservation, now)
