"""The ``[budget]`` section: spend limits per day, and a price per unit for declared providers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiqsim.sim.config import BudgetConfig
from aiqsim.sim.scenario.checks import _NON_NEGATIVE, _Invalid
from aiqsim.sim.scenario.errors import _join
from aiqsim.sim.scenario.reader import _Reader


def _budget(values: dict[str, Any], providers: Sequence[str], reader: _Reader) -> BudgetConfig:
    """The ``[budget]`` section: each price a number >= 0 for a declared provider (none given: the
    providers' own ``price_per_1k_units``, see :func:`aiqsim.sim.simulate.budget_gate`)."""
    prices: dict[str, float] = {}
    for name, price in values.get("prices", {}).items():
        path = _join("budget.prices", name)
        if name not in providers:
            raise reader.error(path, f"expected a declared provider's name (one of: {', '.join(providers)})")
        try:
            prices[name] = _NON_NEGATIVE(price)
        except _Invalid:
            raise reader.expected(path, f"{_NON_NEGATIVE.expected} (the price per unit)", price) from None
    budget = BudgetConfig(**{**values, "prices": prices})
    return budget
