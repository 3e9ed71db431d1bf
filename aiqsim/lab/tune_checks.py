"""How far a tuned setting is from its constraints, and how sure that is: the pick's figures over seeds.

A tuning trial is the *mean* over a few replication seeds, and the best feasible trial is the one
whose mean met every bound. With three seeds that mean is noisy: a pick that meets ``p99 <= 20 s``
by 0.4 s with a seed-to-seed standard deviation of 3 s is a coin toss on fresh seeds. So for the
pick each constraint gets its value (the mean), its margin to the bound (positive: met), the seeds'
standard deviation, a 95% Student-t interval for the mean, and how many single seeds met it; a
margin smaller than ``t * standard error`` is *within noise* and said so.

:func:`check_pick` computes that from per-seed values (the search's seeds, or fresh ones for the
confirmation run); :func:`format_checks` renders it as the lines ``aiqsim tune`` prints.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aiqsim.validation.mmc import t_quantile_975

__all__ = ["ConstraintCheck", "PickCheck", "check_pick", "format_checks", "t_interval"]


def t_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """``(mean, sd, half_width)`` of a 95% Student-t interval for the mean of ``values``.

    ``sd`` and ``half_width`` are NaN for fewer than two values (one seed says nothing about spread).
    """
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    sd = statistics.stdev(values)
    return mean, sd, t_quantile_975(len(values) - 1) * sd / math.sqrt(len(values))


@dataclass(frozen=True, slots=True)
class ConstraintCheck:
    """One constraint (``metric op bound``) at the pick, over ``seeds`` seeds.

    ``margin`` is how far the mean is on the right side of the bound (negative: violated);
    ``half_width`` is the 95% t-interval's half-width (``t * sd / sqrt(n)``, NaN for one seed);
    ``seeds_meeting`` how many single seeds met the bound.
    """

    metric: str
    op: str
    bound: float
    mean: float
    sd: float
    half_width: float
    margin: float
    seeds: int
    seeds_meeting: int

    @property
    def within_noise(self) -> bool:
        """True when the margin does not clear the interval's half-width (or a single seed gives none)."""
        return math.isnan(self.half_width) or self.margin < self.half_width or math.isnan(self.margin)

    @property
    def label(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"


@dataclass(frozen=True, slots=True)
class PickCheck:
    """The pick's constraints over a set of seeds, and the means of the other metrics shown beside."""

    seeds: tuple[int, ...]
    constraints: tuple[ConstraintCheck, ...]
    seeds_feasible: int
    """Seeds on which every constraint held at once (the share a fresh run can expect to meet them)."""
    means: Mapping[str, float]

    @property
    def noisy(self) -> tuple[ConstraintCheck, ...]:
        """The constraints met on the mean whose margin is within noise."""
        return tuple(c for c in self.constraints if c.margin >= 0 and c.within_noise)


def _meets(op: str, value: float, bound: float) -> bool:
    if math.isnan(value):
        return False
    return value <= bound if op == "<=" else value >= bound


def check_pick(
    per_seed: Mapping[str, Sequence[float]],
    constraints: Sequence[tuple[str, str, float]],
    seeds: Sequence[int],
    shown: Sequence[str] = (),
) -> PickCheck:
    """The :class:`PickCheck` of per-seed values (``per_seed[metric][i]`` is seed ``seeds[i]``'s).

    ``constraints`` are ``(metric, op, bound)``; ``shown`` are further metrics whose means are kept.
    """
    checks = []
    feasible = [True] * len(seeds)
    for metric, op, bound in constraints:
        values = [float(v) for v in per_seed[metric]]
        mean, sd, half = t_interval(values)
        meets = [_meets(op, v, bound) for v in values]
        feasible = [f and m for f, m in zip(feasible, meets, strict=True)]
        margin = bound - mean if op == "<=" else mean - bound
        checks.append(ConstraintCheck(metric, op, bound, mean, sd, half, margin, len(values), sum(meets)))
    means = {name: statistics.fmean(float(v) for v in per_seed[name]) for name in shown if name in per_seed}
    return PickCheck(tuple(seeds), tuple(checks), sum(feasible), means)


def _num(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.4g}"


def _seed_span(seeds: Sequence[int]) -> str:
    if not seeds:
        return "no seeds"
    if list(seeds) == list(range(seeds[0], seeds[0] + len(seeds))) and len(seeds) > 1:
        return f"seeds {seeds[0]}..{seeds[-1]}"
    return "seed" + ("s " if len(seeds) > 1 else " ") + ", ".join(map(str, seeds))


def _check_line(check: ConstraintCheck) -> str:
    interval = (
        "no interval from one seed"
        if math.isnan(check.half_width)
        else f"95% t-interval [{_num(check.mean - check.half_width)}, {_num(check.mean + check.half_width)}]"
    )
    return (
        f"{check.label}: mean {_num(check.mean)}, sd {_num(check.sd)}, {interval}, "
        f"margin {_num(check.margin)}; {check.seeds_meeting} of {check.seeds} seeds meet it"
    )


def format_checks(search: PickCheck, confirmation: PickCheck | None = None) -> list[str]:
    """The lines ``aiqsim tune`` prints for the pick: each constraint on the search's seeds, warnings
    for margins within noise, and (with a confirmation run) the same on fresh seeds beside them."""
    lines: list[str] = []
    if not search.constraints:
        return lines
    lines.append(f"constraints at the pick, over the search's {_seed_span(search.seeds)}:")
    lines += [f"  {_check_line(check)}" for check in search.constraints]
    lines.append(f"  all constraints met on {search.seeds_feasible} of {len(search.seeds)} seeds")
    for check in search.constraints:
        if check.margin >= 0 and math.isnan(check.half_width):
            lines.append(
                f"warning: {check.label} is judged on one seed: its margin {_num(check.margin)} has no "
                "noise estimate; tune with --seeds 2 or more, or re-check with --confirm-seeds N"
            )
        elif check.margin >= 0 and check.within_noise:
            se = check.sd / math.sqrt(check.seeds)
            lines.append(
                f"warning: {check.label} is met by a margin within noise: {_num(check.margin)} is "
                f"{check.margin / se if se else math.inf:.2g} standard errors, less than the 95% "
                f"half-width {_num(check.half_width)}; {check.seeds - check.seeds_meeting} of "
                f"{check.seeds} seeds violate it. Re-check with --confirm-seeds N before shipping"
            )
    if confirmation is not None:
        lines.append(f"confirmation on {len(confirmation.seeds)} fresh {_seed_span(confirmation.seeds)}:")
        lines += [f"  {_check_line(check)}" for check in confirmation.constraints]
        lines.append(
            f"  all constraints met on {confirmation.seeds_feasible} of {len(confirmation.seeds)} fresh "
            f"seeds ({confirmation.seeds_feasible / len(confirmation.seeds):.0%}; search: "
            f"{search.seeds_feasible} of {len(search.seeds)})"
        )
        for name, fresh in confirmation.means.items():
            lines.append(f"  {name}: mean {_num(fresh)} on fresh seeds (search {_num(search.means[name])})")
        violated = [c.label for c in confirmation.constraints if c.margin < 0]
        if violated:
            lines.append(f"warning: on fresh seeds the pick violates {', '.join(violated)} on the mean")
    return lines
