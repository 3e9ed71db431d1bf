"""What random search of a given budget finds on a fully evaluated grid, exactly (no sampling noise).

Comparing an optimiser with a handful of random-search runs compares it with noise: on a grid where a
few settings are near the optimum, one lucky random run can win or lose by chance. When the whole grid
has been evaluated (the known optimum a tuner is checked against), the distribution of random search's
result is known exactly: ``budget`` draws, uniform and with replacement over the grid's ``N`` points
(what Optuna's ``RandomSampler`` does on categorical parameters), find the k-th best feasible value or
better unless all of them miss the k best, which happens with probability ``((N - k) / N) ** budget``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from aiqsim.core.errors import ConfigurationError

__all__ = ["random_search_best_distribution", "random_search_expected_best"]


def random_search_best_distribution(
    values: Sequence[float], feasible: Sequence[bool], budget: int
) -> tuple[list[tuple[float, float]], float]:
    """(value, probability) of each feasible grid value being the best that ``budget`` uniform draws
    (with replacement) over the grid find when minimising, best first; and the probability that no
    draw is feasible. ``values[i]``/``feasible[i]`` describe grid point ``i``."""
    if len(values) != len(feasible) or not values:
        raise ConfigurationError("values and feasible: two non-empty sequences of the same length")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ConfigurationError(f"budget: expected an integer >= 1, got {budget!r}")
    n = len(values)
    ranked = sorted(v for v, ok in zip(values, feasible, strict=True) if ok)
    out = []
    for k, value in enumerate(ranked):
        # P(no draw among the k better points) - P(no draw among the k + 1 best)
        p = ((n - k) / n) ** budget - ((n - k - 1) / n) ** budget
        out.append((float(value), p))
    return out, ((n - len(ranked)) / n) ** budget


def random_search_expected_best(values: Sequence[float], feasible: Sequence[bool], budget: int) -> float:
    """The mean best feasible value random search of ``budget`` draws finds on the grid (minimising),
    given that at least one draw is feasible; ``inf`` if no point is feasible."""
    distribution, none = random_search_best_distribution(values, feasible, budget)
    if not distribution:
        return math.inf
    return sum(value * p for value, p in distribution) / (1.0 - none)
