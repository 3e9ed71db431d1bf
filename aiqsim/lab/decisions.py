"""From a sweep's rows to a recommended setting, its evidence over seeds and the ``--set`` line to apply it.

Every lab notebook ends with a decision computed from its own results, never typed in. The rules here
are deliberately plain so a reader can check them against the table printed next to them:

- :func:`seed_bands` summarises each setting over its seeds: mean, worst and best seed, seed count.
- :func:`smallest_meeting` picks the smallest value of one parameter whose *worst* seed meets a target
  (the answer to "how much quota is enough?").
- :func:`best_setting` picks the setting with the best mean among those whose worst seed meets every
  constraint (the answer to "which of these should I run?").

Both return a :class:`Decision`, which renders as Markdown in a notebook and carries the ``aiqsim run``
command line that applies it.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd

from aiqsim.core.errors import ConfigurationError


class NoSettingMeetsError(ConfigurationError):
    """No setting in the sweep meets the stated target on every seed: widen the grid or relax the target.

    A :class:`~aiqsim.core.errors.ConfigurationError` (and so a ``ValueError``): the question as asked
    has no answer in the data; the message names the target and the closest setting.
    """


def format_value(value: Any) -> str:
    """A value as ``--set`` reads it back (TOML): ``true``, ``0.5``, ``120``, ``full_jitter``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, int | float):
        return f"{value:g}"
    return str(value)


def set_line(scenario_file: str, settings: Mapping[str, Any]) -> str:
    """``aiqsim run scenarios/x.toml --set k=v ...``: the command that runs ``settings`` on the scenario,
    quoted for a shell where needed (``'workloads[0].rate_per_s=1.8'``: zsh would glob the brackets)."""
    pairs = (f"{key}={format_value(value)}" for key, value in settings.items())
    flags = "".join(f" --set {shlex.quote(pair)}" for pair in pairs)
    return f"aiqsim run {shlex.quote(scenario_file)}{flags}"


def seed_bands(sweep: pd.DataFrame, by: Sequence[str], metrics: Sequence[str]) -> pd.DataFrame:
    """One row per setting of ``by``: each metric's mean, worst (max) and best (min) seed, and the
    number of seeds. Column names are ``<metric> mean``, ``<metric> max``, ``<metric> min``, ``seeds``."""
    grouped = sweep.groupby(list(by), sort=True)
    table = grouped[list(metrics)].agg(["mean", "max", "min"])
    table.columns = [f"{metric} {stat}" for metric, stat in table.columns]
    table["seeds"] = grouped.size()
    return table.reset_index()


@dataclass(frozen=True)
class Decision:
    """A recommended setting with the evidence for it.

    ``settings``: scenario keys and the values to set. ``rule``: the rule that chose it, in words.
    ``evidence``: the seed bands of every candidate (the chosen row first). ``scenario_file``: the file
    the ``--set`` line applies to. ``constraints``: the bounds (metric -> most allowed) every seed of the
    chosen setting had to keep, so a chart can mark the settings the decision rejected.
    """

    scenario_file: str
    settings: Mapping[str, Any]
    rule: str
    evidence: pd.DataFrame = field(repr=False, compare=False)
    constraints: Mapping[str, float] = field(default_factory=dict, compare=False)
    check_seed: int | None = field(default=None, compare=False)
    check: Mapping[str, float] = field(default_factory=dict, compare=False)

    @property
    def command(self) -> str:
        """The ``aiqsim run`` line that applies :attr:`settings`."""
        return set_line(self.scenario_file, self.settings)

    def checked(self, runs: pd.DataFrame, metrics: Sequence[str]) -> Decision:
        """This decision with the figures one of its own runs produced, so they can be reproduced.

        ``runs``: the rows (one per seed, with a ``seed`` column) the decision was computed from; rows
        are kept where every column named like a key of :attr:`settings` equals the chosen value, so a
        whole sweep can be passed (or pass the chosen setting's rows, e.g. when they are keyed by a
        policy name). ``metrics``: summary keys (as ``aiqsim run`` reports them) to record, from the
        lowest seed's row. :attr:`check_line` says what ``aiqsim run ... --seed N`` must print.
        """
        rows = runs
        for key, value in self.settings.items():
            if key in rows:
                rows = rows[rows[key] == value]
        if "seed" not in rows or rows.empty:
            raise ConfigurationError(
                f"no run of the chosen setting {dict(self.settings)} with a 'seed' column to check it by"
            )
        seed = int(rows["seed"].min())
        at_seed = rows[rows["seed"] == seed]
        if len(at_seed) != 1:
            raise ConfigurationError(
                f"{len(at_seed)} runs of {dict(self.settings)} at seed {seed}: pass the chosen setting's rows"
            )
        missing = [m for m in metrics if m not in at_seed]
        if missing:
            raise ConfigurationError(f"the runs have no column(s) {missing} to check the decision by")
        values = {m: float(at_seed[m].iloc[0]) for m in metrics}
        return replace(self, check_seed=seed, check=values)

    @property
    def check_line(self) -> str:
        """``check: aiqsim run ... --seed N -> key=value, ...``: what the command prints on one seed the
        decision was computed from (the simulation is deterministic per seed, so exactly this)."""
        if self.check_seed is None:
            return ""
        figures = ", ".join(f"{key}={value:.6g}" for key, value in self.check.items())
        return f"check: {self.command} --seed {self.check_seed} -> {figures}"

    def _repr_markdown_(self) -> str:
        chosen = ", ".join(f"`{k} = {format_value(v)}`" for k, v in self.settings.items()) or "the file as is"
        check = f"\n\n*Reproduce:* `{self.check_line.removeprefix('check: ')}`" if self.check_line else ""
        return f"**Decision:** {chosen}\n\n*Rule:* {self.rule}\n\n```\n{self.command}\n```{check}"

    def __str__(self) -> str:
        return f"{self.command}\n  rule: {self.rule}"


def _first(rows: pd.DataFrame, evidence: pd.DataFrame, params: Sequence[str]) -> pd.DataFrame:
    """``evidence`` with the chosen row (first of ``rows``) moved to the top."""
    chosen = rows.iloc[[0]][list(params)].merge(evidence, on=list(params))
    rest = evidence.merge(rows.iloc[[0]][list(params)], on=list(params), how="left", indicator=True)
    rest = rest[rest["_merge"] == "left_only"].drop(columns="_merge")
    return pd.concat([chosen, rest], ignore_index=True)


def smallest_meeting(
    sweep: pd.DataFrame,
    param: str,
    metric: str,
    target: float,
    *,
    scenario_file: str,
    report: Sequence[str] = (),
) -> Decision:
    """The smallest ``param`` value whose worst seed has ``metric <= target``.

    Raises :class:`NoSettingMeetsError` when no swept value meets the target on every seed.
    """
    bands = seed_bands(sweep, [param], [metric, *[m for m in report if m != metric]])
    meeting = bands[bands[f"{metric} max"] <= target].sort_values(param)
    if meeting.empty:
        closest = bands.sort_values(f"{metric} max").iloc[0]
        raise NoSettingMeetsError(
            f"no {param} in {sorted(bands[param])} keeps {metric} <= {target:g} on every seed; the closest, "
            f"{param}={format_value(closest[param])}, reaches {closest[f'{metric} max']:.4g}"
        )
    value = meeting[param].iloc[0]  # from the column, so the swept value keeps its type (120, not 120.0)
    rule = (
        f"smallest {param} whose worst of {int(meeting.iloc[0]['seeds'])} seeds keeps {metric} <= {target:g}"
    )
    return Decision(
        scenario_file, {param: _plain(value)}, rule, _first(meeting, bands, [param]), {metric: target}
    )


def best_setting(
    sweep: pd.DataFrame,
    params: Sequence[str],
    metric: str,
    *,
    scenario_file: str,
    maximize: bool = False,
    constraints: Mapping[str, float] | None = None,
    tie_break: str | None = None,
    report: Sequence[str] = (),
) -> Decision:
    """The setting of ``params`` with the best mean ``metric`` among those whose worst seed keeps every
    ``constraints`` metric at or below its bound. Ties (equal means) go to the lower mean ``tie_break``.

    Raises :class:`NoSettingMeetsError` when no setting meets the constraints on every seed.
    """
    constraints = dict(constraints or {})
    metrics = list(dict.fromkeys([metric, *constraints, *([tie_break] if tie_break else []), *report]))
    bands = seed_bands(sweep, params, metrics)
    allowed = bands
    for name, bound in constraints.items():
        allowed = allowed[allowed[f"{name} max"] <= bound]
    if allowed.empty:
        raise NoSettingMeetsError(
            f"no setting of {list(params)} keeps {constraints} on every seed (swept {len(bands)} settings)"
        )
    keys = [f"{metric} mean"] + ([f"{tie_break} mean"] if tie_break else [])
    ordered = allowed.sort_values(keys, ascending=[not maximize] + [True] * (len(keys) - 1), kind="stable")
    best = ordered.iloc[0]
    words = "highest" if maximize else "lowest"
    rule = f"{words} mean {metric} over {int(best['seeds'])} seeds"
    if constraints:
        rule += " among settings whose worst seed keeps " + ", ".join(
            f"{name} <= {bound:g}" for name, bound in constraints.items()
        )
    if tie_break:
        rule += f"; ties go to the lower mean {tie_break}"
    settings = {p: _plain(ordered[p].iloc[0]) for p in params}
    ranked = bands.sort_values(keys, ascending=[not maximize] + [True] * (len(keys) - 1), kind="stable")
    return Decision(scenario_file, settings, rule, _first(ordered, ranked, params), constraints)


def _plain(value: Any) -> Any:
    """numpy scalars to Python ones (so ``--set`` lines and reprs read 120, not np.int64(120))."""
    return value.item() if hasattr(value, "item") else value
