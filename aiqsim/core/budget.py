"""Spend budgets: the arithmetic of a daily budget, free of any clock or store.

A spend budget caps what the calls of one day may cost (in the currency of the prices: dollars,
euros, credits). Everything here is a pure function of its arguments:

* the **budget day** of an instant: days are ``day_s`` long (86 400 s by default) and start at
  ``origin`` on the scheduler's clock (``runtime.now()``), so day ``n`` is
  ``[origin + n * day_s, origin + (n + 1) * day_s)`` and its budget resets at the end of it
  (:func:`budget_day`, :func:`budget_resets_at`). Nothing reads a wall clock: to reset at
  midnight UTC, pass the scheduler-clock instant of some midnight as ``origin``;
* the **cost** of an attempt: ``units * price`` (:func:`attempt_cost`), units being the quota's
  unit the task's ``cost_estimate`` and a provider's reported ``usage`` are counted in (tokens);
* the **reservation**: an attempt is admitted only if what the day has spent and reserved, plus
  the attempt's estimated cost, stays within the limit (:func:`admits`), so a budget is never
  overspent by estimates; and the **reconcile**: after the attempt, the estimate is replaced by
  what the provider billed (:func:`reconciled`). Only a bill above its estimate can take a day
  past its limit, by at most the underestimates of the calls in flight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DAY_S",
    "BudgetHold",
    "BudgetWindow",
    "admits",
    "attempt_cost",
    "budget_day",
    "budget_resets_at",
    "budget_window",
    "reconciled",
]

DAY_S = 86_400.0
"""The length of a budget day in scheduler seconds (a calendar day)."""


@dataclass(frozen=True, slots=True)
class BudgetWindow:
    """The budget day an instant falls in: its index (0 is the day starting at the origin; days
    before the origin are negative) and the scheduler-clock instant its budget resets."""

    day: int
    resets_at: float


@dataclass(frozen=True, slots=True)
class BudgetHold:
    """What one admitted attempt reserved: ``amount`` (currency) in each of ``budgets``, on budget
    day ``day`` (the ledger's days), priced at ``price`` per unit. ``token`` is the ledger's own
    handle (a fleet ledger's reservation id), ``None`` for a local one."""

    budgets: tuple[str, ...]
    amount: float
    day: int
    price: float
    token: Any = None


def budget_day(now: float, origin: float = 0.0, day_s: float = DAY_S) -> int:
    """The index of the budget day holding ``now`` (days of ``day_s`` seconds starting at ``origin``)."""
    return math.floor((now - origin) / day_s)


def budget_resets_at(now: float, origin: float = 0.0, day_s: float = DAY_S) -> float:
    """The scheduler-clock instant the budget day holding ``now`` ends (always later than ``now``)."""
    return origin + (budget_day(now, origin, day_s) + 1) * day_s


def budget_window(now: float, origin: float = 0.0, day_s: float = DAY_S) -> BudgetWindow:
    """:func:`budget_day` and :func:`budget_resets_at` of ``now`` at once."""
    day = budget_day(now, origin, day_s)
    return BudgetWindow(day=day, resets_at=origin + (day + 1) * day_s)


def attempt_cost(units: float, price: float) -> float:
    """What ``units`` (tokens, the quota's unit) cost at ``price`` per unit."""
    return units * price


def admits(spent: float, estimate: float, limit: float) -> bool:
    """Whether a day that has spent (and reserved) ``spent`` can take an attempt estimated at
    ``estimate`` without going past ``limit``. A day that has reached its limit is spent: it refuses
    everything, a free attempt (``estimate == 0``) included."""
    if estimate <= 0:
        return spent < limit
    return spent + estimate <= limit


def reconciled(spent: float, estimate: float, billed: float) -> float:
    """The day's spend once an attempt reserved at ``estimate`` was billed ``billed`` (0: a call the
    provider did not bill, the whole estimate given back); never below 0 (rounding of many settles)."""
    return max(0.0, spent - estimate + billed)
