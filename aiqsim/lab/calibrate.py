"""Calibrate a scenario from call logs: fit the provider and the workload that production saw.

Input: one or more call logs (folders with ``tasks.csv``/``calls.csv`` or ``.parquet``, written by
:class:`aiqsim.scheduler.call_log.CallLog`, from production or from ``simulate()``). Output: an
ordinary scenario (:class:`~aiqsim.sim.config.Scenario`, TOML via :meth:`Calibration.to_toml`) whose
simulated providers and workloads reproduce the log, plus the fits and their diagnostics.

What is fitted, per provider (the family :class:`~aiqsim.sim.providers.SimulatedProvider` uses):

- **latency** of successful calls ``L = (base + per_unit * x) * N``, ``x`` the output units (the
  usage when the provider reported no output split), ``N`` lognormal with mean 1 and log-sd
  ``sigma``. Estimator: since ``E[L | x] = base + per_unit * x`` and ``sd(L | x)`` is proportional to
  it, iteratively reweighted least squares on ``L`` with weights ``1 / fitted^2`` (the quasi-likelihood
  estimator for constant coefficient of variation; unbiased for the mean line, unlike least squares
  on ``log L``, which is biased by the unknown ``-sigma^2/2``). ``sigma`` is the standard deviation
  of ``log(L / fitted)``. The report's QQ plot compares those log residuals with a normal.
- **server limits**: ``x-ratelimit-limit-{requests,tokens}`` when the log holds them (the mode over
  answers); without headers, where 429s start: the attempts the server admitted in the 60 s before
  each limit 429 (median over the 429s seen at the busiest times).
- **429s**: a 429 is the server limit when the answer said the window was spent (remaining requests
  < 1 or remaining tokens below the attempt's size), else random; ``rate_limit_prob`` = random 429s
  / attempts past the limit check, and their Retry-After (median) ``rate_limit_retry_after_s``.
- **failures** in the order the simulated server decides them: quota exhausted and invalid request
  among admitted attempts, 5xx among those, lost responses (client timeouts) among the rest.

And the workload, per (provider, priority): a Poisson process with a piecewise-constant rate over
``arrival_bins`` equal intervals (its diurnal shape; one bin is a homogeneous Poisson fit), the cost
distribution (``fixed`` when every estimate is equal, else ``lognormal`` with the sample mean and
log-sd), the output fraction, and duplicate submissions (as ``distinct_inputs`` solving
``E[repeats] = observed repeats`` under uniform draws of inputs).

With ``arrivals="replay"`` the scenario's workloads do not draw arrivals from those fits: each
(provider, priority) becomes a ``replay`` workload whose arrivals CSV (written next to the scenario,
see :mod:`aiqsim.sim.replay_arrivals`) holds the log's own submit times, relative to the first, with
each task's cost estimate split by the fitted output fraction and its key as the input label (so
repeated submissions repeat). The fits are still made and reported.

The client's own settings (quotas, retry, dispatch) are not in a log: pass ``settings`` (a scenario
whose client tables are copied) or get the defaults.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd

from aiqsim.core.errors import ConfigurationError
from aiqsim.lab.lab_errors import CalibrationError
from aiqsim.lab.toml_out import dumps_toml
from aiqsim.scheduler.call_log import CALL_LOG_COLUMNS, TASK_LOG_COLUMNS
from aiqsim.sim.providers import WINDOW_S

if TYPE_CHECKING:
    from aiqsim.sim.config import Scenario
    from aiqsim.sim.replay_arrivals import ReplayRow

__all__ = [
    "Calibration",
    "CalibrationError",
    "LatencyFit",
    "ProviderFit",
    "WorkloadFit",
    "calibrate",
    "check_arrival_bins",
    "fit_latency",
    "read_call_log",
]

POOR_FIT_LOG_RESIDUAL_KS = 0.08
"""Kolmogorov-Smirnov distance of the standardised log residuals from a normal above which the
latency fit is flagged (lognormal noise assumed by the model does not describe the data)."""

MAX_ARRIVAL_BINS = 10_000
"""Most arrival-rate bins a calibration accepts. Each bin becomes one ``poisson`` workload per
(provider, priority) in the written scenario; hourly bins over a year are 8,760, so more is a typo
(``--arrival-bins 100000000`` ran for minutes building workloads nobody could use)."""


def check_arrival_bins(bins: Any, *, label: str = "arrival_bins") -> int:
    """``bins`` if it is an integer in [1, :data:`MAX_ARRIVAL_BINS`], else a ConfigurationError naming
    ``label`` (the CLI passes ``--arrival-bins``)."""
    if isinstance(bins, bool) or not isinstance(bins, int) or not 1 <= bins <= MAX_ARRIVAL_BINS:
        raise ConfigurationError(
            f"{label}: expected an integer in [1, {MAX_ARRIVAL_BINS:,}] (one workload per bin), got {bins!r}"
        )
    return bins


ArrivalModel = Literal["fitted", "replay"]
"""How a calibrated scenario's workloads arrive: the fitted Poisson model or the log's own times."""

POOR_FIT_DISPERSION = 2.0
"""Index of dispersion (variance / mean of arrivals per 10 s) above which arrivals are flagged as
burstier than Poisson."""


# ---------------------------------------------------------------------- reading
def read_call_log(location: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(tasks, calls) DataFrames of the call log in folder ``location`` (CSV or Parquet)."""
    folder = Path(location)
    if not folder.is_dir():
        raise CalibrationError(f"{folder}: not a call-log folder (expected tasks.csv and calls.csv in it)")
    frames = []
    for name, columns in (("tasks", TASK_LOG_COLUMNS), ("calls", CALL_LOG_COLUMNS)):
        csv_path, parquet_path = folder / f"{name}.csv", folder / f"{name}.parquet"
        try:
            if csv_path.exists():
                frame = pd.read_csv(csv_path)
            elif parquet_path.exists():
                frame = pd.read_parquet(parquet_path)
            else:
                raise CalibrationError(f"{folder}: no {name}.csv or {name}.parquet")
        except (OSError, ValueError, ImportError) as error:
            if isinstance(error, CalibrationError):
                raise
            raise CalibrationError(f"{folder}: cannot read {name}: {error}") from error
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise CalibrationError(f"{folder}/{name}: missing column(s) {', '.join(missing)}")
        _check_cells(frame, f"{folder}/{name}", _NUMBER_COLUMNS[name], _REQUIRED_COLUMNS[name])
        frames.append(frame)
    if frames[0].empty:
        raise CalibrationError(f"{folder}/tasks: no task rows: nothing to calibrate from")
    return frames[0], frames[1]


_NUMBER_COLUMNS: dict[str, tuple[str, ...]] = {
    "tasks": ("cost_estimate", "attempts", "submitted_at", "started_at", "finished_at", "latency_s"),
    "calls": (
        "attempt", "start", "end", "latency_s", "cost_estimate", "usage", "output_units", "retry_after_s",
        "delay_s", "limit_requests", "remaining_requests", "reset_requests_s", "limit_tokens",
        "remaining_tokens", "reset_tokens_s",
    ),
}  # fmt: skip
"""The columns of a call log that hold numbers (blank where there is none), per file."""

_REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "tasks": ("task_id", "key", "provider", "priority", "submitted_at"),
    "calls": ("task_id", "key", "provider", "priority", "start", "end"),
}
"""The columns every row of a call log fills in (the writer always does)."""

_LARGEST_NUMBER = 1e15
"""Larger than any time (s), size or count a call log holds; beyond it the fits' arithmetic
overflows (numpy refused a histogram of times near 1e308)."""


def _check_cells(frame: pd.DataFrame, where: str, numbers: Sequence[str], required: Sequence[str]) -> None:
    """Refuse a cell that is no number in a number column, a blank required cell, or a number no log
    holds, naming the file, the column and the line (the header is line 1), before any fit reads it."""
    for column in required:
        blank = frame[column].isna()
        if blank.any():
            line = int(np.flatnonzero(blank.to_numpy())[0]) + 2
            raise CalibrationError(f"{where}, line {line}: column {column!r} is blank; every row fills it")
    for column in numbers:
        values = pd.to_numeric(frame[column], errors="coerce")
        wrong = (values.isna() & frame[column].notna()) | (values.abs() > _LARGEST_NUMBER)
        if wrong.any():
            line = int(np.flatnonzero(wrong.to_numpy())[0]) + 2
            cell = frame[column].iloc[line - 2]
            raise CalibrationError(
                f"{where}, line {line}: column {column!r} holds {cell!r}; expected a number "
                f"(at most {_LARGEST_NUMBER:g} in size) or a blank"
            )
        frame[column] = values


def _concat_logs(locations: Sequence[str | Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Several logs as one, laid end to end by their submissions (keys stay apart).

    Each log is shifted so that its first submission comes one mean inter-arrival gap (of the
    previous log) after the previous log's last submission: the arrivals run on at the rate they
    had, whatever happened after them. Shifting past the previous log's last *finish* instead left
    an arrival-free gap as long as its slowest task's tail (one task finishing 600 s late halved the
    fitted rate of a 300 s log laid twice). The previous log's calls still running then overlap the
    next log's first ones, as they would have in production had the traffic gone on.
    """
    tasks_all, calls_all = [], []
    offset = 0.0
    for index, location in enumerate(locations):
        tasks, calls = read_call_log(location)
        submits = tasks["submitted_at"].to_numpy(float)
        shift = offset - float(submits.min())
        for frame, cols in (
            (tasks, ("submitted_at", "started_at", "finished_at")),
            (calls, ("start", "end")),
        ):
            for col in cols:
                frame[col] = frame[col].astype(float) + shift
            frame["key"] = f"{index}:" + frame["key"].astype(str)
            frame["task_id"] = f"{index}:" + frame["task_id"].astype(str)
        offset = float(submits.max()) + shift + _mean_gap(submits)
        tasks_all.append(tasks)
        calls_all.append(calls)
    return pd.concat(tasks_all, ignore_index=True), pd.concat(calls_all, ignore_index=True)


def _mean_gap(submits: np.ndarray) -> float:
    """The mean time between consecutive ``submits`` (the span over the gaps); 1 s when there is no
    gap to measure (one submission, or all at one time), so the next log's first one never coincides."""
    span = float(submits.max() - submits.min())
    return span / (len(submits) - 1) if len(submits) > 1 and span > 0 else 1.0


# ---------------------------------------------------------------------- fits
@dataclass(frozen=True, slots=True)
class LatencyFit:
    """``L = (base_s + per_unit_s * x) * lognormal(mean 1, sigma)`` fitted to ``n`` successful calls."""

    base_s: float
    per_unit_s: float
    sigma: float
    n: int
    regressor: str
    """``output_units`` or ``usage``: what ``x`` was."""
    ks_distance: float
    """KS distance of the standardised log residuals from N(0, 1) (small is good)."""


def fit_latency(x: np.ndarray, latency: np.ndarray, *, iterations: int = 5) -> tuple[float, float, float]:
    """(base, per_unit, sigma) by IRLS with weights ``1/fitted^2`` (see the module docstring).

    A negative intercept or slope is clipped to 0 and the other coefficient refitted, since the
    simulated provider accepts neither.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(latency, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y) & (y > 0)
    x, y = x[keep], y[keep]
    if len(y) < 3:
        raise CalibrationError(f"latency: {len(y)} successful call(s); at least 3 are needed for a fit")
    weights = np.ones_like(y)
    base, slope = float(np.median(y)), 0.0
    for _ in range(iterations):
        design = np.column_stack([np.ones_like(x), x]) * np.sqrt(weights)[:, None]
        (base, slope), *_ = np.linalg.lstsq(design, y * np.sqrt(weights), rcond=None)
        if slope < 0:
            base, slope = float(np.average(y, weights=weights)), 0.0
        if base < 0:
            base = 0.0
            slope = float(np.sum(weights * x * y) / max(np.sum(weights * x * x), 1e-300))
        fitted = np.maximum(base + slope * x, 1e-12)
        weights = 1.0 / fitted**2
    log_residuals = np.log(y / np.maximum(base + slope * x, 1e-12))
    sigma = float(np.std(log_residuals, ddof=2)) if len(y) > 2 else 0.0
    return float(base), float(slope), sigma


def _ks_normal(values: np.ndarray) -> float:
    from statistics import NormalDist

    if len(values) < 2 or np.std(values) == 0:
        return 0.0
    z = np.sort((values - values.mean()) / values.std())
    cdf = np.array([NormalDist().cdf(v) for v in z])
    n = len(z)
    return float(max(np.max(np.arange(1, n + 1) / n - cdf), np.max(cdf - np.arange(n) / n)))


@dataclass(frozen=True, slots=True)
class ProviderFit:
    """Everything fitted for one provider, with the counts each rate was estimated from."""

    name: str
    latency: LatencyFit
    server_requests_per_min: float | None
    server_units_per_min: float | None
    limits_from: str
    """``headers``, ``429s`` (estimated from where 429s start) or ``none`` (no 429 and no header)."""
    rate_limit_prob: float
    rate_limit_retry_after_s: float | None
    server_error_prob: float
    timeout_prob: float
    quota_exhausted_prob: float
    invalid_request_prob: float
    attempts: int
    limit_429s: int
    random_429s: int
    counts: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WorkloadFit:
    """One (provider, priority) stream of submissions: piecewise Poisson rates, sizes, duplicates."""

    provider: str
    priority: str
    start_s: float
    end_s: float
    rates_per_s: tuple[float, ...]
    """Rate in each of the equal bins between ``start_s`` and ``end_s``."""
    submissions: int
    cost_dist: str
    cost_mean: float
    cost_sigma: float
    output_fraction: float
    duplicate_fraction: float
    distinct_inputs: int | None
    dispersion: float
    """Variance / mean of arrivals per 10 s after removing the fitted rate (1 for Poisson)."""


@dataclass(frozen=True)
class Calibration:
    """The result of :func:`calibrate`: the scenario, the fits behind it and the fits' warnings."""

    scenario: Scenario
    providers: dict[str, ProviderFit]
    workloads: list[WorkloadFit]
    flags: list[str]
    """Poor fits and guesses, one sentence each (empty when every fit looks right)."""
    tasks: pd.DataFrame = field(repr=False)
    calls: pd.DataFrame = field(repr=False)
    arrivals: ArrivalModel = "fitted"
    """``fitted`` (Poisson workloads) or ``replay`` (workloads replaying the log's arrivals files)."""
    inputs: Mapping[str, Any] = field(default_factory=dict, repr=False)
    """How to redo the fits: ``logs`` (absolute paths) and the keyword arguments of :func:`calibrate`
    that shape them (a notebook report re-runs ``calibrate(**inputs)``)."""

    def to_toml(self, relative_to: str | Path | None = None) -> str:
        """The calibrated scenario as a scenario file (``aiqsim validate`` accepts it).

        ``relative_to``: the folder the file will be in; replay workloads then name their arrivals
        files relative to it (as the scenario loader resolves them), else by absolute path.
        """
        from aiqsim.sim.scenario import scenario_to_dict

        document = scenario_to_dict(self.scenario)
        if relative_to is not None:
            for workload in document["workloads"]:
                if workload.get("arrivals"):
                    workload["arrivals"] = Path(os.path.relpath(workload["arrivals"], relative_to)).as_posix()
        return dumps_toml(document)

    def write(self, path: str | Path) -> Path:
        """Write :meth:`to_toml` to ``path`` (replayed arrivals named relative to its folder); returns it."""
        from aiqsim.lab.output_files import write_text_atomically

        target = Path(path)
        try:  # an earlier file at ``path`` stays whole if this fails
            write_text_atomically(target, self.to_toml(relative_to=target.parent.resolve()))
        except OSError as error:
            raise CalibrationError(f"cannot write {target}: {error.strerror or error}") from None
        return target


def _mode(values: pd.Series) -> float | None:
    values = values.dropna()
    if values.empty:
        return None
    return float(values.round(6).mode().iloc[0])


def _limit_429_mask(calls: pd.DataFrame) -> pd.Series:
    """Which 429s the server limit caused, from the remaining counts the answer carried."""
    limited = calls["outcome_class"] == "rate_limited"
    size = calls["usage"].fillna(calls["cost_estimate"]).astype(float)
    spent_requests = calls["remaining_requests"].astype(float) < 1
    spent_tokens = calls["remaining_tokens"].astype(float) < size
    return limited & (spent_requests | spent_tokens)


LIMIT_429_SHARE = 0.25
"""Without headers, a server limit is fitted only if at least this share of the attempts made with
the minute's window (nearly) full were 429s..."""
LIMIT_429_CONTRAST = 2.0
"""...and that share is at least this many times the share of 429s at other times. Random 429s are
as frequent everywhere (measured: 13% near the busiest window against 10% elsewhere, for a 10%
random rate); a limit's are nearly all there (84% against 0% for retry_storm_429)."""


def _limit_from_429s(calls: pd.DataFrame) -> tuple[float | None, pd.Series]:
    """Without headers: a 429 at a time when the server had admitted (nearly) as many attempts in
    the last minute as it ever did is a limit 429; the limit is the median of those counts, and
    never below the most attempts the log shows admitted in one minute (the server let those
    through). A limit is fitted only if 429s are concentrated at such times
    (:data:`LIMIT_429_SHARE`, :data:`LIMIT_429_CONTRAST`); else they are random, and no limit is
    (a limit of 90/min was fitted where 96 had been admitted and every 429 was random)."""
    none = (None, pd.Series(False, index=calls.index))
    limited = (calls["outcome_class"] == "rate_limited").to_numpy()
    admitted_starts = np.sort(calls.loc[~limited, "start"].to_numpy(float))
    if not limited.any() or len(admitted_starts) == 0:
        return none
    starts = calls["start"].to_numpy(float)
    counts = np.searchsorted(admitted_starts, starts, side="left") - np.searchsorted(
        admitted_starts, starts - WINDOW_S, side="left"
    )
    busiest = counts[limited].max()
    at_busiest = limited & (counts >= 0.9 * busiest)
    if not at_busiest.any():
        return none
    most_admitted = int((counts[~limited] + 1).max())  # in one window, itself included
    limit = max(float(np.median(counts[at_busiest])), float(most_admitted))
    near_full = counts >= 0.9 * limit
    share_near = float(limited[near_full].mean()) if near_full.any() else 0.0
    share_elsewhere = float(limited[~near_full].mean()) if (~near_full).any() else 0.0
    if share_near < LIMIT_429_SHARE or share_near < LIMIT_429_CONTRAST * share_elsewhere:
        return none
    return limit, pd.Series(limited & near_full, index=calls.index)


def _fit_provider(name: str, calls: pd.DataFrame, flags: list[str]) -> ProviderFit:
    sent = calls[calls["outcome_class"] != "rejected_locally"]
    classes = sent["outcome_class"].value_counts().to_dict()
    ok = sent[sent["outcome_class"] == "ok"]
    use_output = ok["output_units"].notna().mean() > 0.9 if len(ok) else False
    regressor = "output_units" if use_output else "usage"
    x = ok[regressor].fillna(ok["cost_estimate"]).to_numpy(float)
    base, slope, sigma = fit_latency(x, ok["latency_s"].to_numpy(float))
    residuals = np.log(ok["latency_s"].to_numpy(float) / np.maximum(base + slope * x, 1e-12))
    ks = _ks_normal(residuals[np.isfinite(residuals)])
    latency = LatencyFit(base, slope, sigma, len(ok), regressor, ks)
    if ks > POOR_FIT_LOG_RESIDUAL_KS:
        flags.append(
            f"{name}: latency residuals are not lognormal (KS distance {ks:.3f} > "
            f"{POOR_FIT_LOG_RESIDUAL_KS}); see the QQ plot"
        )

    has_headers = sent["limit_requests"].notna().any() or sent["limit_tokens"].notna().any()
    if has_headers:
        rpm, upm = _mode(sent["limit_requests"]), _mode(sent["limit_tokens"])
        limit_mask = _limit_429_mask(sent)
        limits_from = "headers"
    else:
        rpm, limit_mask = _limit_from_429s(sent)
        upm = None
        limits_from = "429s" if rpm is not None else "none"
        if rpm is not None:
            flags.append(f"{name}: no x-ratelimit headers; server limit estimated from 429s ({rpm:g}/min)")
        elif (sent["outcome_class"] == "rate_limited").any():
            flags.append(
                f"{name}: no x-ratelimit headers, and its 429s are no more frequent when the minute was "
                "busiest than at other times: no server limit fitted, they are counted as random 429s"
            )
    limited = sent["outcome_class"] == "rate_limited"
    limit_429s = int((limited & limit_mask).sum())
    random_mask = limited & ~limit_mask
    random_429s = int(random_mask.sum())
    past_limit = len(sent) - limit_429s
    admitted = past_limit - random_429s
    qe = classes.get("quota_exhausted", 0)
    inv = classes.get("invalid_request", 0)
    s5 = classes.get("server_error", 0)
    schema = classes.get("schema_violation", 0)
    timeouts = classes.get("timeout", 0)
    after_checks = admitted - qe - inv
    executed = after_checks - s5

    def ratio(numerator: int, denominator: int) -> float:
        return float(numerator / denominator) if denominator > 0 else 0.0

    retry_after = sent.loc[random_mask, "retry_after_s"].dropna()
    return ProviderFit(
        name=name,
        latency=latency,
        server_requests_per_min=rpm,
        server_units_per_min=upm,
        limits_from=limits_from,
        rate_limit_prob=ratio(random_429s, past_limit),
        rate_limit_retry_after_s=float(retry_after.median()) if len(retry_after) else None,
        server_error_prob=ratio(s5, after_checks),
        timeout_prob=ratio(timeouts, executed - schema),
        quota_exhausted_prob=ratio(qe, admitted),
        invalid_request_prob=ratio(inv, admitted),
        attempts=len(sent),
        limit_429s=limit_429s,
        random_429s=random_429s,
        counts={str(k): int(v) for k, v in classes.items()},
    )


def _distinct_for(submissions: int, repeats: int) -> int | None:
    """``D`` such that drawing ``submissions`` inputs uniformly from ``D`` repeats ``repeats`` times."""
    if repeats <= 0 or submissions < 2:
        return None
    target = submissions - repeats  # distinct inputs seen

    def seen(d: float) -> float:
        return d * (1.0 - (1.0 - 1.0 / d) ** submissions)

    low, high = max(1.0, float(target)), float(submissions) * 1e6
    for _ in range(200):
        mid = math.sqrt(low * high)
        if seen(mid) < target:
            low = mid
        else:
            high = mid
    return max(1, round(high))


def _fit_workload(
    provider: str, priority: str, tasks: pd.DataFrame, calls: pd.DataFrame, bins: int, flags: list[str]
) -> WorkloadFit:
    times = np.sort(tasks["submitted_at"].to_numpy(float))
    start, end = float(times[0]), float(times[-1])
    n = len(times)
    span = max(end - start, 1e-9)
    # the ML rate of a Poisson process observed over [start, end] with its first event at start
    edges = np.linspace(start, end, bins + 1)
    counts = np.histogram(times, bins=edges)[0] if bins > 1 else np.array([n])
    width = span / bins
    rates = tuple(float(c / width) for c in counts)
    window = 10.0
    if span >= 3 * window:
        per_window = np.histogram(times, bins=np.arange(start, end + window, window))[0]
        expected = np.repeat(np.array(rates) * window, 1)
        centre = (np.arange(len(per_window)) + 0.5) * window + start
        index = np.clip(((centre - start) / width).astype(int), 0, bins - 1)
        expected = np.array(rates)[index] * window
        dispersion = float(np.sum((per_window - expected) ** 2) / max(np.sum(expected), 1e-9))
    else:
        dispersion = 1.0
    if dispersion > POOR_FIT_DISPERSION:
        flags.append(
            f"{provider}/{priority}: arrivals are burstier than Poisson (dispersion {dispersion:.2f}); "
            "consider more arrival bins or replaying the log"
        )
    costs = tasks["cost_estimate"].dropna().to_numpy(float)
    if len(costs) == 0 or np.all(costs == costs[0]):
        dist, mean, sigma = "fixed", float(costs[0]) if len(costs) else 1.0, 0.0
    else:
        positive = costs[costs > 0]
        dist, mean, sigma = "lognormal", float(positive.mean()), float(np.std(np.log(positive), ddof=1))
    ok = calls[(calls["outcome_class"] == "ok") & calls["output_units"].notna() & (calls["usage"] > 0)]
    fraction = float(np.median(ok["output_units"] / ok["usage"])) if len(ok) else 0.2
    repeats = int(tasks["key"].duplicated().sum())
    return WorkloadFit(
        provider=provider,
        priority=priority,
        start_s=start,
        end_s=end,
        rates_per_s=rates,
        submissions=n,
        cost_dist=dist,
        cost_mean=mean,
        cost_sigma=sigma,
        output_fraction=min(max(fraction, 0.0), 1.0),
        duplicate_fraction=repeats / n,
        distinct_inputs=_distinct_for(n, repeats),
        dispersion=dispersion,
    )


def calibrate(
    logs: str | Path | Iterable[str | Path],
    *,
    settings: Scenario | str | Path | None = None,
    name: str = "calibrated",
    arrival_bins: int = 1,
    price_per_1k_units: float | None = None,
    duration_s: float | None = None,
    arrivals: ArrivalModel = "fitted",
    replay_dir: str | Path | None = None,
    replay_stem: str = "arrivals",
) -> Calibration:
    """Fit a scenario to the call logs at ``logs`` (see the module docstring for what and how).

    ``settings`` supplies the client's tables (quotas, retry, dispatch, overload, store) and the
    providers' prices and idempotency behaviour, which no log shows; ``arrival_bins`` is how many
    equal intervals the arrival rate is piecewise constant over; ``price_per_1k_units`` overrides
    the price (else the settings' provider's, else the default). ``duration_s`` is how long the
    scenario's arrivals last (default: the log's span; several logs are laid end to end, each one
    mean inter-arrival gap after the previous one's last submission, so their span is the sum):
    the fitted rates are kept and their shape is stretched to it.

    ``arrivals="replay"`` makes each (provider, priority) a ``replay`` workload of the log's own
    submit times; their CSVs are written to ``replay_dir`` (required then; the scenario file should
    go there too) as ``{replay_stem}.{provider}.{priority}.csv``. A replay keeps the log's times, so
    it cannot be stretched with ``duration_s``.
    """
    from aiqsim.sim.config import CostConfig, ProviderConfig, WorkloadConfig
    from aiqsim.sim.scenario import scenario_to_dict
    from aiqsim.sim.simulate import resolve_scenario

    locations = [logs] if isinstance(logs, str | Path) else list(logs)
    if not locations:
        raise ConfigurationError("logs: give at least one call-log folder")
    check_arrival_bins(arrival_bins)
    if arrivals not in ("fitted", "replay"):
        raise ConfigurationError(f"arrivals: expected 'fitted' or 'replay', got {arrivals!r}")
    if arrivals == "replay":
        if replay_dir is None:
            raise ConfigurationError("arrivals='replay' needs replay_dir: the folder for the arrivals CSVs")
        if duration_s is not None:
            raise ConfigurationError("duration_s stretches fitted arrivals; a replay keeps the log's times")
    base = resolve_scenario(settings) if settings is not None else None
    tasks, calls = _concat_logs(locations)
    if calls.empty:
        raise CalibrationError(f"{', '.join(map(str, locations))}: the log holds no provider calls")
    _check_every_provider_called(tasks, calls, locations)
    flags: list[str] = []
    fits = {
        name_: _fit_provider(name_, group, flags) for name_, group in calls.groupby("provider", sort=True)
    }
    workloads = [
        _fit_workload(p, prio, group, calls[calls["provider"] == p], arrival_bins, flags)
        for (p, prio), group in tasks.groupby(["provider", "priority"], sort=True)
    ]
    origin = min(w.start_s for w in workloads)
    end = max(w.end_s for w in workloads)
    if duration_s is not None:
        if isinstance(duration_s, bool) or not isinstance(duration_s, int | float) or not duration_s > 0:
            raise ConfigurationError(f"duration_s: expected a number > 0, got {duration_s!r}")
        if not math.isfinite(duration_s):
            raise ConfigurationError(f"duration_s: expected a finite number, got {duration_s!r}")
    stretch = 1.0 if duration_s is None else duration_s / max(end - origin, 1e-9)

    defaults = ProviderConfig(name="defaults")  # slots dataclass: defaults live on instances only
    providers = []
    for fit in fits.values():
        known = None
        if base is not None:
            try:
                known = base.provider(fit.name)
            except KeyError:
                known = None
        price = price_per_1k_units
        if price is None:
            price = known.price_per_1k_units if known is not None else defaults.price_per_1k_units
        providers.append(
            ProviderConfig(
                name=fit.name,
                kind=known.kind if known is not None else "llm",
                latency_base_s=fit.latency.base_s,
                latency_per_unit_s=fit.latency.per_unit_s,
                latency_sigma=fit.latency.sigma,
                server_requests_per_min=fit.server_requests_per_min,
                server_units_per_min=fit.server_units_per_min,
                rate_limit_prob=fit.rate_limit_prob,
                rate_limit_retry_after_s=fit.rate_limit_retry_after_s
                if fit.rate_limit_retry_after_s is not None
                else defaults.rate_limit_retry_after_s,
                server_error_prob=fit.server_error_prob,
                timeout_prob=fit.timeout_prob,
                quota_exhausted_prob=fit.quota_exhausted_prob,
                invalid_request_prob=fit.invalid_request_prob,
                honours_idempotency=known.honours_idempotency if known is not None else False,
                supports_lookup=known.supports_lookup if known is not None else True,
                price_per_1k_units=price,
            )
        )
    workload_configs = []
    for w in workloads if arrivals == "fitted" else ():
        if w.cost_dist == "fixed":
            cost = CostConfig(dist="fixed", mean=w.cost_mean, output_fraction=w.output_fraction)
        else:
            cost = CostConfig(
                dist="lognormal", mean=w.cost_mean, sigma=w.cost_sigma, output_fraction=w.output_fraction
            )
        width = (w.end_s - w.start_s) / len(w.rates_per_s)
        for index, rate in enumerate(w.rates_per_s):
            if rate <= 0:
                continue
            workload_configs.append(
                WorkloadConfig(
                    type="poisson",
                    provider=w.provider,
                    priority=w.priority,  # type: ignore[arg-type]
                    rate_per_s=rate,
                    start_s=(w.start_s - origin + index * width) * stretch,
                    end_s=(w.start_s - origin + (index + 1) * width) * stretch,
                    cost=cost,
                    distinct_inputs=w.distinct_inputs,
                )
            )
    document: dict[str, Any] = {}
    if base is not None:
        document = scenario_to_dict(base)
    document.setdefault("scenario", {})
    document["scenario"].update(
        {
            "name": name,
            "description": f"Calibrated from {len(locations)} call log(s): {len(tasks)} tasks, "
            f"{len(calls)} attempts. " + " ".join(flags),
            "duration_s": max((end - origin) * stretch, 1e-3),
        }
    )
    document["providers"] = [_provider_dict(p) for p in providers]
    document["workloads"] = [_workload_dict(w) for w in workload_configs]
    replays: dict[Path, list[ReplayRow]] = {}
    if arrivals == "replay":
        assert replay_dir is not None
        kinds = {p.name: p.kind for p in providers}
        for w in workloads:
            path = (Path(replay_dir) / _replay_file_name(w, replay_stem, taken=replays)).resolve()
            replays[path] = _replay_rows(w, tasks, origin, kinds[w.provider])
        document["workloads"] = [
            {"type": "replay", "provider": w.provider, "priority": w.priority, "arrivals": str(path)}
            for w, path in zip(workloads, replays, strict=True)
        ]
    document.pop("crashes", None)
    quotas = document.get("quotas", {})
    document["quotas"] = {k: v for k, v in quotas.items() if k in fits}
    scenario = _checked_scenario(document, name, locations, replays)
    scenario = _write_replays(scenario, replays)  # only now, every check passed: nothing is half-written
    inputs = {
        "logs": [str(Path(location).resolve()) for location in locations],
        "name": name,
        "arrival_bins": arrival_bins,
        "price_per_1k_units": price_per_1k_units,
        "duration_s": duration_s,
    }
    if isinstance(settings, str | Path):
        inputs["settings"] = str(Path(settings).resolve())
    return Calibration(scenario, fits, workloads, flags, tasks, calls, arrivals, inputs)


_FITTED_FROM: tuple[tuple[str, str], ...] = (
    ("latency_", "the calls' latency_s (end - start) and usage"),
    ("server_requests_per_min", "the calls' start times and limit_requests"),
    ("server_units_per_min", "the calls' usage and limit_tokens"),
    ("rate_limit_retry_after_s", "the calls' retry_after_s"),
    ("_prob", "the calls' outcomes"),
    ("cost", "the tasks' cost_estimate and the calls' usage and output_units"),
    ("distinct_inputs", "the tasks' keys"),
    ("rate_per_s", "the tasks' submitted_at"),
    ("start_s", "the tasks' submitted_at"),
    ("end_s", "the tasks' submitted_at"),
    ("duration_s", "the tasks' submitted_at"),
    ("arrivals", "the tasks' submitted_at, cost_estimate and key"),
)
"""What the calibrated scenario's fitted fields are computed from, by a part of their key path."""


def _fitted_from(key_path: str) -> str | None:
    """The log columns a calibrated scenario's ``key_path`` was fitted from (``None``: a value the
    settings scenario gave, e.g. a quota)."""
    if not key_path.startswith(("providers", "workloads", "scenario.duration_s")):
        return None
    field_name = key_path.rsplit(".", 1)[-1]
    for part, columns in _FITTED_FROM:
        if part in field_name or (part == "cost" and ".cost." in key_path):
            return columns
    return None


def _check_every_provider_called(
    tasks: pd.DataFrame, calls: pd.DataFrame, locations: Sequence[str | Path]
) -> None:
    """Refuse a provider with tasks but no calls, naming the log(s) its tasks are in and the provider.

    Nothing about such a provider can be fitted (latency, limits and errors come from its calls), so
    its tasks would become a workload of a provider the scenario does not declare.
    """
    called = set(calls["provider"])
    for provider, group in tasks.groupby("provider", sort=True):
        if provider in called:
            continue
        indices = sorted({int(str(task_id).split(":", 1)[0]) for task_id in group["task_id"]})
        logs = ", ".join(str(locations[index]) for index in indices)
        raise CalibrationError(
            f"{logs}: provider {str(provider)!r} has {len(group)} task(s) in tasks but no call in calls, "
            "so nothing about it can be fitted (were its tasks cancelled or refused before any call?); "
            "calibrate from a log with its calls, or drop its tasks (nothing was written)"
        )


def _replay_file_name(w: WorkloadFit, stem: str, *, taken: Iterable[Path] = ()) -> str:
    """The file name of ``w``'s replay arrivals CSV: ``{stem}.{provider}.{priority}.csv``, made safe
    (and numbered when another workload's name, in ``taken``, is made the same)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{stem}.{w.provider}.{w.priority}")
    names = {path.name for path in taken}
    name, number = f"{safe}.csv", 1
    while name in names:
        number += 1
        name = f"{safe}.{number}.csv"
    return name


def _replay_rows(w: WorkloadFit, tasks: pd.DataFrame, origin: float, kind: Any) -> list[ReplayRow]:
    """The log's arrivals of ``w``'s (provider, priority) as replay rows, offsets from ``origin``."""
    from aiqsim.sim.replay_arrivals import ReplayRow
    from aiqsim.sim.workloads import split_units

    mine = tasks[(tasks["provider"] == w.provider) & (tasks["priority"] == w.priority)]
    mine = mine.sort_values("submitted_at", kind="stable")
    labels: dict[str, int] = {}
    rows = []
    for submitted, cost, key in zip(
        mine["submitted_at"].to_numpy(float),
        mine["cost_estimate"].to_numpy(float),
        mine["key"].astype(str),
        strict=True,
    ):
        units = max(1, round(cost if math.isfinite(cost) else w.cost_mean))
        prompt, output = split_units(units, kind, w.output_fraction)
        label = labels.setdefault(key, len(labels))
        rows.append(ReplayRow(float(submitted - origin), prompt, output, f"input-{label}"))
    return rows


def _checked_scenario(
    document: dict[str, Any],
    name: str,
    locations: Sequence[str | Path],
    replays: Mapping[Path, list[ReplayRow]],
) -> Scenario:
    """``document`` parsed, with every check the scenario loader makes, before anything is written.

    The loader reads a replay workload's arrivals file in full, so the rows of ``replays`` are
    checked from copies in a temporary folder: a calibration that fails leaves the files of an
    earlier one (same ``--out``) as they were. The scenario returned names those copies, which are
    gone; :func:`_write_replays` names the real files.
    """
    import tempfile

    if not replays:
        return _parsed(document, name, locations, {})
    with tempfile.TemporaryDirectory(prefix="aiqsim-calibrate-") as folder:
        staged = {path: Path(folder) / path.name for path in replays}
        for path, rows in replays.items():
            _write_arrivals(staged[path], rows)
        copy = dict(document)
        copy["workloads"] = [
            dict(w, arrivals=str(staged[Path(w["arrivals"])])) for w in document["workloads"]
        ]
        real_names = {str(copy_path): str(path) for path, copy_path in staged.items()}
        return _parsed(copy, name, locations, real_names)


def _parsed(
    document: dict[str, Any], name: str, locations: Sequence[str | Path], real_names: Mapping[str, str]
) -> Scenario:
    """``document`` as a scenario; a value fitted from the log that it refuses is a CalibrationError
    naming the log's columns (``real_names``: staged arrivals paths -> the paths they stand for)."""
    from aiqsim.sim.scenario import ScenarioError, parse_scenario

    try:
        return parse_scenario(document, source=name)
    except ScenarioError as error:
        fitted_from = _fitted_from(error.key_path)
        if fitted_from is None:
            raise  # a value of the settings scenario's, not of the log's
        message = error.message
        for staged, real in real_names.items():
            message = message.replace(staged, real)
        raise CalibrationError(
            f"{', '.join(map(str, locations))}: the calibrated scenario's {error.key_path}, fitted from "
            f"{fitted_from}, is unusable ({message}); check those columns of the log (nothing "
            "was written)"
        ) from None


def _write_replays(scenario: Scenario, replays: Mapping[Path, list[ReplayRow]]) -> Scenario:
    """Write each replay arrivals file (atomically: temp file + rename) and point ``scenario``'s
    replay workloads at them, in the order of ``replays`` (the workloads' order)."""
    from dataclasses import replace

    if not replays:
        return scenario
    for path, rows in replays.items():
        _write_arrivals(path, rows)
    paths = iter(replays)
    workloads = tuple(
        replace(w, arrivals=str(next(paths))) if w.type == "replay" else w for w in scenario.workloads
    )
    return replace(scenario, workloads=workloads)


def _write_arrivals(path: Path, rows: list[ReplayRow]) -> None:
    """:func:`~aiqsim.sim.replay_arrivals.write_replay_arrivals`, its error a CalibrationError."""
    from aiqsim.sim.replay_arrivals import ReplayArrivalsError, write_replay_arrivals

    try:
        write_replay_arrivals(path, rows)
    except ReplayArrivalsError as error:
        raise CalibrationError(str(error)) from error


def _provider_dict(p: Any) -> dict[str, Any]:
    from dataclasses import asdict

    values = asdict(p)
    values.pop("outages", None)
    return {k: v for k, v in values.items() if v is not None}


def _workload_dict(w: Any) -> dict[str, Any]:
    from dataclasses import asdict

    values = asdict(w)
    keep = {"type", "provider", "priority", "rate_per_s", "start_s", "end_s", "cost", "distinct_inputs"}
    values = {k: v for k, v in values.items() if k in keep and v is not None}
    cost = values["cost"]
    if cost["dist"] == "fixed":
        values["cost"] = {"dist": "fixed", "mean": cost["mean"], "output_fraction": cost["output_fraction"]}
    else:
        values["cost"] = {k: cost[k] for k in ("dist", "mean", "sigma", "output_fraction")}
    return values
