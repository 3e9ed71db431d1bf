"""How sure a calibration is: a 95% interval for every fitted parameter.

A rate of lost responses estimated from 40 events, or a latency line fitted to three calls, came out
as exact-looking numbers. Each fitted value now carries an interval, by the cheapest method that is
right for it:

- **proportions** (``rate_limit_prob``, ``server_error_prob``, ``timeout_prob``, ...): the Wilson score
  interval of ``events / trials`` (closed form; unlike ``p +- 1.96 sqrt(p(1-p)/n)`` it stays inside
  [0, 1] and is not empty at 0 events);
- **arrival rates**: the score interval of a Poisson count over the bin's width;
- **everything else** (the latency line and its sigma, Retry-After, a limit estimated from 429s,
  the cost distribution, the output fraction, distinct inputs): the percentile bootstrap, with a
  seeded generator (:data:`BOOTSTRAP_SEED`, so the same log gives the same intervals) and a bounded
  number of resamples (:data:`BOOTSTRAP_RESAMPLES`);
- a value read from the log rather than estimated (a limit from ``x-ratelimit-*`` headers, a cost
  that is the same for every task) has an interval of width 0, said so by its method.

Below :data:`SMALL_SAMPLE` observations these intervals are themselves approximate (the bootstrap
and the score intervals rest on large-sample arguments), which calibration flags.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "BOOTSTRAP_SEED",
    "SMALL_SAMPLE",
    "Interval",
    "bootstrap",
    "exact",
    "format_intervals",
    "poisson_rate",
    "wilson",
]

Z_975 = 1.959963984540054
"""The standard normal's 0.975 quantile: the intervals are 95% ones."""

BOOTSTRAP_RESAMPLES = 200
"""Resamples per bootstrapped parameter: enough for 2.5% / 97.5% percentiles to within about a tenth
of the interval's width, and bounded, so a 6,000-attempt log calibrates in seconds, not minutes."""

BOOTSTRAP_SEED = 20_240_601
"""The bootstrap's seed: the same log always gives the same intervals."""

SMALL_SAMPLE = 50
"""Fewer observations than this behind a provider's fits (completed calls) or a workload's
(submissions) is flagged: the bootstrap's and the score intervals' large-sample arguments no longer
hold well, so even the intervals understate the uncertainty (a 3-row log says almost nothing)."""


@dataclass(frozen=True, slots=True)
class Interval:
    """A fitted ``value`` and its 95% interval ``[low, high]``, with the ``method`` and the sample
    size ``n`` it came from."""

    value: float
    low: float
    high: float
    method: str
    n: int

    def __str__(self) -> str:
        return f"{_num(self.value)} [{_num(self.low)}, {_num(self.high)}]"


def _num(value: float) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4g}"


def exact(value: float, method: str, n: int) -> Interval:
    """A value read from the log, not estimated: an interval of width 0."""
    return Interval(value, value, value, method, n)


def wilson(events: float, trials: float, value: float | None = None) -> Interval:
    """The Wilson score interval of ``events / trials`` (events may be fractional: expected counts).

    ``value``: the point estimate to report (default ``events / trials``)."""
    point = (events / trials if trials > 0 else 0.0) if value is None else value
    if trials <= 0:
        return Interval(point, 0.0, 1.0, "Wilson score (no trials: nothing known)", 0)
    p = min(max(events / trials, 0.0), 1.0)
    z2 = Z_975**2
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = Z_975 * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials**2)) / (1 + z2 / trials)
    # at p = 0 (or 1) the end is exactly 0 (or 1), but centre - half rounds to 5.6e-17 for some n
    # (0 of 3): an interval printed as [5.551e-17, 0.56] that left out its own estimate 0
    low = 0.0 if p <= 0.0 else max(centre - half, 0.0)
    high = 1.0 if p >= 1.0 else min(centre + half, 1.0)
    return Interval(point, low, high, "Wilson score", round(trials))


def poisson_rate(count: int, exposure_s: float) -> Interval:
    """The score interval of a Poisson rate: ``count`` events over ``exposure_s`` seconds."""
    if exposure_s <= 0:
        return Interval(math.nan, math.nan, math.nan, "Poisson score (no time observed)", count)
    z2 = Z_975**2
    centre = count + z2 / 2
    half = Z_975 * math.sqrt(count + z2 / 4)
    return Interval(
        count / exposure_s, max(centre - half, 0.0) / exposure_s, (centre + half) / exposure_s,
        "Poisson score", count,
    )  # fmt: skip


def bootstrap(
    data: tuple[np.ndarray, ...],
    statistic: Callable[..., float | tuple[float, ...]],
    rng: np.random.Generator,
    *,
    value: float | tuple[float, ...],
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> Any:
    """The percentile bootstrap interval of ``statistic(*arrays)``, each array of ``data`` resampled
    with replacement on its own (strata: completed calls and cut-off attempts stay apart).

    ``statistic`` may return a tuple (several parameters from one fit, e.g. a latency line's base,
    slope and sigma): the result is then a tuple of :class:`Interval`, one per element. ``value`` is
    the estimate (or estimates) from the full data. A resample on which the statistic fails (raises,
    or is not finite) is skipped; the method says how many counted."""
    values = value if isinstance(value, tuple) else (value,)
    sizes = [len(a) for a in data]
    n = sum(sizes)
    results: list[tuple[float, ...]] = []
    for _ in range(resamples if n else 0):
        drawn = tuple(a[rng.integers(0, len(a), len(a))] if len(a) else a for a in data)
        try:
            result = statistic(*drawn)
        except Exception:  # a degenerate resample (all one value, a fit that cannot run): skip it
            continue
        result = tuple(float(r) for r in (result if isinstance(result, tuple) else (result,)))
        if all(math.isfinite(r) for r in result):
            results.append(result)
    if not results:
        why = "no data" if n == 0 else f"no resample of {n} gave a value"
        out = tuple(Interval(v, math.nan, math.nan, f"bootstrap ({why})", n) for v in values)
    else:
        bounds = np.percentile(np.array(results), [2.5, 97.5], axis=0)
        counted = "" if len(results) == resamples else f", {len(results)} usable"
        out = tuple(
            Interval(v, float(low), float(high), f"bootstrap, {resamples} resamples{counted}", n)
            for v, low, high in zip(values, bounds[0], bounds[1], strict=True)
        )
    return out if isinstance(value, tuple) else out[0]


def format_intervals(intervals: Mapping[str, Interval], *, width: int = 0) -> list[str]:
    """One line per parameter: ``key = value [low, high]  (method, n)``."""
    return [
        f"{key:<{width}} = {interval}  ({interval.method}; n = {interval.n})"
        for key, interval in intervals.items()
    ]
