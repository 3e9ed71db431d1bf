"""What counts as a number in an argument: the one test every argument check of aiqsim uses.

A ``bool`` is an ``int`` to Python but never a count, a rate or a duration here (``True`` is not one
server); a string that looks like a number is not one; any ``numbers.Real`` (numpy's included) is.
"""

from __future__ import annotations

import math
import numbers

__all__ = ["is_real", "is_whole"]


def is_real(value: object) -> bool:
    """A real number (int, float, numpy scalar...), not a bool, not a string that looks like one."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_whole(value: object, least: int) -> bool:
    """A finite whole number (``3`` or ``3.0``) of at least ``least``."""
    return bool(is_real(value) and math.isfinite(value) and value >= least and value == int(value))  # type: ignore[arg-type, call-overload, operator]
