"""What counts as a number in an argument: the one test every argument check of aiqsim uses.

A ``bool`` is an ``int`` to Python but never a count, a rate or a duration here (``True`` is not one
server); a string that looks like a number is not one; any ``numbers.Real`` (numpy's included) is.
"""

from __future__ import annotations

import math
import numbers

from aiqsim.core.errors import ConfigurationError

__all__ = ["LARGEST_WHOLE", "check_time_scale", "is_positive_finite", "is_real", "is_wait", "is_whole"]

LARGEST_WHOLE = 2**63
"""The largest whole number a setting takes: what a scenario file accepts for any integer, and what
a :class:`~aiqsim.scheduler.retry.RetryPolicy` accepts for its counts. A float of any size past 2**53
is "whole" (``1e308 == int(1e308)``), so a whole-number check alone lets such a value through."""


def is_real(value: object) -> bool:
    """A real number (int, float, numpy scalar...), not a bool, not a string that looks like one."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_whole(value: object, least: int, most: int | None = None) -> bool:
    """A finite whole number (``3`` or ``3.0``) of at least ``least`` and, given ``most``, at most it."""
    if not (is_real(value) and math.isfinite(value) and value >= least and value == int(value)):  # type: ignore[arg-type, call-overload, operator]
        return False
    return most is None or value <= most  # type: ignore[operator]


def is_positive_finite(value: object) -> bool:
    """A real number > 0 and < infinity (a duration, a rate, a scale): infinity passes a plain
    ``> 0`` and then divides by zero or never wakes, NaN fails every comparison silently."""
    return is_real(value) and 0 < value < math.inf  # type: ignore[operator]


def is_wait(value: object) -> bool:
    """A real number of seconds >= 0, infinity included (a wait for something else to happen, as a
    quota's "until a slot is released"): what an object may ask a sleeper to wait. NaN fails every
    comparison silently (``max(nan, 0.0)`` is NaN, and a timer for NaN seconds never comes), and a
    negative wait is no instant at all."""
    return is_real(value) and value >= 0  # type: ignore[operator]


def check_time_scale(time_scale: object) -> None:
    """Refuse a runtime's ``time_scale`` (wall seconds per scheduler second) that is no finite number
    > 0 whose inverse is finite too: infinity made every sleep ``0 * inf`` (NaN, never woken), and
    1e-320 made the clock read infinity. Raises :class:`~aiqsim.core.errors.ConfigurationError`."""
    if not (is_positive_finite(time_scale) and 1 / time_scale < math.inf):  # type: ignore[operator]
        raise ConfigurationError(
            f"time_scale must be a finite number > 0 (wall seconds per scheduler second), got {time_scale!r}"
        )
