"""The one rule for trusting a provider's reported usage when the token bucket is reconciled.

A provider's response says how many tokens a call used, and the scheduler charges (or
refunds) the difference from the estimate. A buggy or hostile number must not do damage:
``1e30`` would drive the bucket to ``-1e30`` and freeze the lane for ever, ``-5`` or ``nan``
would make the reconcile raise and turn a successful, billed call into a failure.

The rule (pure, no I/O; the scheduler records the anomaly it reports):

* not a real number (``None`` is not an anomaly: it means "not reported"), ``nan``, ``inf``
  or negative: the count says nothing usable, so the **estimate** is charged;
* above the bound: charged at the **bound**, which is the token bucket's capacity (or the
  estimate, if larger). One call can then put the bucket at most one full capacity into
  debt, so the lane waits at most ``capacity / rate`` (one burst's refill) before it runs
  again, however large the reported number;
* otherwise the reported number, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import inf, isfinite  # names, not math.x: one lookup fewer per call in the hot path
from typing import Any

from aiqsim.core.slot_init import compile_builder, fast_frozen_init

__all__ = ["UsageVerdict", "sane_usage", "usage_bound"]


@fast_frozen_init  # built per call: see aiqsim.core.slot_init
@dataclass(frozen=True, slots=True)
class UsageVerdict:
    """What to charge for one call, and why it differs from the report (``anomaly``, or ``None``)."""

    usage: float
    anomaly: str | None = None


_new_verdict = compile_builder(UsageVerdict)  # one verdict per successful call: not a class call


def sane_usage(reported: Any, estimate: float, capacity: float | None) -> UsageVerdict:
    """The usage to reconcile for a call that reported ``reported`` tokens (see the module rule).

    ``estimate`` is the task's cost estimate (what was reserved); ``capacity`` the provider's
    token-bucket capacity, ``None`` when tokens are unlimited (then no upper bound applies).
    """
    if reported is None:
        return _new_verdict(estimate)
    if isinstance(reported, bool) or not isinstance(reported, int | float):
        return _new_verdict(
            estimate, f"usage is not a number ({type(reported).__name__}): charged the estimate"
        )
    try:
        value = float(reported)
    except OverflowError:  # an int beyond any float
        value = inf if reported > 0 else -inf
    if not isfinite(value):
        return _new_verdict(estimate, f"usage {value!r} is not finite: charged the estimate")
    if value < 0:
        return _new_verdict(estimate, f"usage {value:g} is negative: charged the estimate")
    if capacity is not None:
        bound = max(capacity, estimate)
        if value > bound:
            return _new_verdict(bound, f"usage {value:g} is above the bound {bound:g}: charged the bound")
    return _new_verdict(value)


def usage_bound(quota: Any) -> float | None:
    """The token capacity :func:`sane_usage` bounds a report charged to ``quota`` by.

    A local quota's own token bucket's capacity; else the ``token_capacity`` a quota whose bucket
    lives elsewhere declares (:class:`aiqsim.fleet.RedisQuota`: the shared bucket's, which one
    worker's 1e15 would otherwise freeze for the whole fleet); else ``None`` (tokens unlimited).
    One rule for every quota, in simulation as in production.
    """
    bucket = getattr(quota, "tokens", None)
    if bucket is not None:
        return float(bucket.capacity)
    capacity = getattr(quota, "token_capacity", None)
    return float(capacity) if capacity is not None else None
