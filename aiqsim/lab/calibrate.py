"""Calibrate a scenario from call logs: fit the provider and the workload that production saw.

Input: one or more call logs (folders with ``tasks.csv``/``calls.csv`` or ``.parquet``, written by
:class:`aiqsim.scheduler.call_log.CallLog`, from production or from ``simulate()``). Output: an
ordinary scenario (:class:`~aiqsim.sim.config.Scenario`, TOML via :meth:`Calibration.to_toml`) whose
simulated providers and workloads reproduce the log, plus the fits and their diagnostics.

What is fitted, per provider (the family :class:`~aiqsim.sim.providers.SimulatedProvider` uses):

- **latency** ``L = (base + per_unit * x) * N``, ``x`` the output units (the usage when the
  provider reported no output split), ``N`` lognormal with mean 1 and log-sd ``sigma``. Estimator:
  since ``E[L | x] = base + per_unit * x`` and ``sd(L | x)`` is proportional to it, iteratively
  reweighted least squares on ``L`` with weights ``1 / fitted^2`` (the quasi-likelihood estimator for
  constant coefficient of variation; unbiased for the mean line, unlike least squares on ``log L``,
  which is biased by the unknown ``-sigma^2/2``). ``sigma`` is the standard deviation of
  ``log(L / fitted)``. The sample is the completed calls *and* the attempts the client cut off
  (outcome class ``timeout``: its attempt timeout, or its read timeout, fired first), the latter as
  right-censored observations, "latency at least the time waited": dropping them fitted the latency
  to the calls that happened to be fast (sigma 0.8 came out 0.67). Each cut-off is slow or a lost
  response in the proportions the fit implies, and the estimator above runs on the expected values
  of the latencies not seen (:func:`fit_censored_latency`, an EM algorithm); with nothing cut off it
  is exactly the completed calls' fit. The report's QQ plot compares the log residuals' (Kaplan-Meier)
  distribution with a normal.
- **server limits**: ``x-ratelimit-limit-{requests,tokens}`` when the log holds them (the mode over
  answers); without headers, where 429s start: the attempts the server admitted in the 60 s before
  each limit 429 (median over the 429s seen at the busiest times).
- **429s**: a 429 is the server limit when the answer said the window was spent (remaining requests
  < 1 or remaining tokens below the attempt's size), else random; ``rate_limit_prob`` = random 429s
  / attempts past the limit check, and their Retry-After (median) ``rate_limit_retry_after_s``.
- **failures** in the order the simulated server decides them: quota exhausted and invalid request
  among admitted attempts, 5xx among those, lost responses among the rest: the cut-off attempts
  beyond those the fitted latency's tail accounts for (``P(cut off) = p + (1 - p) P(L > waited)``).
  Counting every cut-off as lost made a slow, reliable provider lossy (0.13 where it was 0). Left
  out: a 5xx the client cut off before it came (the simulator sends it after half the latency)
  counts as a cut-off, so where the deadline cuts off many calls the 5xx rate is a little low (0.049
  for 0.05 with a 3 s deadline against a 1.6 s mean latency, sigma 0.8).

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np
import pandas as pd

from aiqsim.core.errors import ConfigurationError
from aiqsim.lab.calibrate_intervals import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    SMALL_SAMPLE,
    Interval,
    bootstrap,
    exact,
    format_intervals,
    poisson_rate,
    wilson,
)
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
    "CensoredLatencyFit",
    "LatencyFit",
    "LatencySample",
    "ProviderFit",
    "WorkloadFit",
    "calibrate",
    "check_arrival_bins",
    "fit_censored_latency",
    "fit_latency",
    "kaplan_meier",
    "latency_sample",
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

SLOW_CUT_OFFS_FLAG = 0.01
"""When the fitted latency's tail accounts for at least this share of a provider's attempts (attempts
the client cut off that are fitted as slow, not lost), calibration says so: their latency beyond the
time waited is the lognormal fit's extrapolation, which no completed call shows."""

POOR_FIT_DISPERSION = 2.0
"""Index of dispersion (variance / mean of arrivals per 10 s) above which arrivals are flagged as
burstier than Poisson."""
DISPERSION_WINDOW_S = 10.0
"""The windows arrivals are counted in for the dispersion check; only whole windows count."""


# ---------------------------------------------------------------------- reading
def read_call_log(location: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(tasks, calls) DataFrames of the call log in folder ``location`` (CSV or Parquet)."""
    folder = Path(location)
    if not folder.is_dir():
        raise CalibrationError(f"{folder}: not a call-log folder (expected tasks.csv and calls.csv in it)")
    if _is_run_output(folder):
        raise CalibrationError(
            f"{folder}: this is the output folder of `aiqsim run` (the simulator's tasks, calls, timeline "
            "and summary.json), not a call log. Calibration reads a call log: what the production "
            "scheduler saw, written by aiqsim.scheduler.call_log.CallLog, e.g. "
            "`log = CallLog(); Scheduler(..., events=log)` then `log.write(FOLDER)` (or stream with "
            "`CallLog(FOLDER)`); from a simulation: `simulate(scenario).call_log.write(FOLDER)`"
        )
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
        for column in _LATER_COLUMNS.get(name, ()):  # a log written before they existed: blank
            if column not in frame.columns:
                frame[column] = float("nan")
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise CalibrationError(f"{folder}/{name}: missing column(s) {', '.join(missing)}")
        _check_cells(frame, f"{folder}/{name}", _NUMBER_COLUMNS[name], _REQUIRED_COLUMNS[name])
        frames.append(frame)
    if frames[0].empty:
        raise CalibrationError(f"{folder}/tasks: no task rows: nothing to calibrate from")
    return frames[0], frames[1]


RUN_OUTPUT_MARKERS = ("summary.json", "timeline.csv", "timeline.parquet")
"""Files ``aiqsim run --out`` writes that no call log has."""


def _is_run_output(folder: Path) -> bool:
    """True for an ``aiqsim run --out`` folder: a run's summary or timeline beside tasks without
    the call log's ``submitted_at`` column (a call log saved into such a folder is still read)."""
    if not any((folder / name).is_file() for name in RUN_OUTPUT_MARKERS):
        return False
    tasks = folder / "tasks.csv"
    if not tasks.is_file():
        return True
    try:
        with tasks.open(encoding="utf-8", errors="replace") as handle:
            header = handle.readline()
    except OSError:
        return True
    return "submitted_at" not in header.split(",")


_NUMBER_COLUMNS: dict[str, tuple[str, ...]] = {
    "tasks": ("cost_estimate", "attempts", "submitted_at", "started_at", "finished_at", "latency_s"),
    "calls": (
        "attempt", "start", "end", "latency_s", "cost_estimate", "usage", "output_units", "retry_after_s",
        "delay_s", "first_token_s", "tokens_per_s", "limit_requests", "remaining_requests",
        "reset_requests_s", "limit_tokens", "remaining_tokens", "reset_tokens_s",
    ),
}  # fmt: skip
"""The columns of a call log that hold numbers (blank where there is none), per file."""

_LATER_COLUMNS: dict[str, tuple[str, ...]] = {"calls": ("first_token_s", "tokens_per_s")}
"""Columns added after the first call logs were written: read as blank when a log lacks them."""

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
    """``L = (base_s + per_unit_s * x) * lognormal(mean 1, sigma)`` fitted to ``n`` completed calls
    and ``cut_off`` attempts the client gave up on, the latter as right-censored observations (see
    :func:`fit_censored_latency`)."""

    base_s: float
    per_unit_s: float
    sigma: float
    n: int
    """Completed calls (outcome ``ok``): their latency was observed."""
    regressor: str
    """``output_units`` or ``usage``: what ``x`` was."""
    ks_distance: float
    """KS distance of the standardised log residuals from N(0, 1) (small is good); with cut-off
    attempts, of their Kaplan-Meier distribution (the cut-offs censored where they were cut off)."""
    cut_off: int = 0
    """Attempts with outcome class ``timeout`` (the client stopped waiting: its attempt timeout, or
    its HTTP read timeout), in the fit as "latency at least the time waited"."""
    slow_cut_offs: float = 0.0
    """How many of the ``cut_off`` attempts the fitted latency's upper tail accounts for (an expected
    count); the rest are lost responses (the provider fit's ``timeout_prob``)."""
    identifiable: bool = True
    """False when every completed call had the same ``x``: the log then shows only the mean latency
    at that ``x``, not how it splits into ``base_s`` and ``per_unit_s``; the fit keeps it all in
    ``base_s`` (``per_unit_s`` 0) and says so instead of choosing a split the data cannot support."""


def fit_latency(x: np.ndarray, latency: np.ndarray, *, iterations: int = 5) -> tuple[float, float, float]:
    """(base, per_unit, sigma) by IRLS with weights ``1/fitted^2`` (see the module docstring), from
    completed calls only: :func:`fit_censored_latency` is this estimator extended to the attempts
    the client cut off, and gives exactly this answer when there are none.

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
        base, slope = _weighted_line(x, y, weights)
        fitted = np.maximum(base + slope * x, 1e-12)
        weights = 1.0 / fitted**2
    log_residuals = np.log(y / np.maximum(base + slope * x, 1e-12))
    sigma = float(np.std(log_residuals, ddof=2)) if len(y) > 2 else 0.0
    return float(base), float(slope), sigma


def _weighted_line(x: np.ndarray, y: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    """One weighted least-squares step of the IRLS: (base, slope) of ``y ~ base + slope * x`` with
    ``weights``, a negative slope or base clipped to 0 and the other coefficient refitted."""
    design = np.column_stack([np.ones_like(x), x]) * np.sqrt(weights)[:, None]
    (base, slope), *_ = np.linalg.lstsq(design, y * np.sqrt(weights), rcond=None)
    return _clipped_line(base, slope, x, y, weights, lambda: float(np.average(y, weights=weights)))


def _clipped_line(
    base: float,
    slope: float,
    x: np.ndarray,
    y: np.ndarray,
    weights: np.ndarray,
    weighted_mean: Callable[[], float],
) -> tuple[float, float]:
    """The one rule for a fitted line the simulated provider cannot take: a negative slope becomes
    the flat line at the weighted mean (``weighted_mean()``), then a negative intercept 0 with the
    slope refitted through the origin."""
    if slope < 0:
        base, slope = weighted_mean(), 0.0
    if base < 0:
        base = 0.0
        slope = float(np.sum(weights * x * y) / max(np.sum(weights * x * x), 1e-300))
    return base, slope


# ---------------------------------------------------------------------- censored latency
@dataclass(frozen=True, slots=True, eq=False)
class CensoredLatencyFit:
    """What :func:`fit_censored_latency` fitted, with the sample it was fitted on.

    The latency model is the simulated provider's, ``L = (base_s + per_unit_s * x) * N`` with
    ``log N`` normal (mean ``residual_mean``, sd ``sigma``); an attempt the client cut off is either
    *slow* (its latency was beyond the time waited) or *lost* (the provider did the work and the
    response never came, share ``lost_share`` of all the attempts fitted).
    """

    base_s: float
    per_unit_s: float
    sigma: float
    residual_mean: float
    """Mean of ``log(L / (base_s + per_unit_s * x))``: ``-sigma^2/2`` when the noise has mean 1, as
    the model says; estimated, like ``sigma``, so that the fit without cut-offs is the old one."""
    lost_share: float
    """Share of the attempts fitted (completed + cut off) whose response was lost, in [0, 1)."""
    x: np.ndarray
    """The completed calls' regressor..."""
    latency_s: np.ndarray
    """...and their latencies (the rows kept: finite, latency > 0)."""
    cut_x: np.ndarray
    """The cut-off attempts' regressor (estimated: see :func:`latency_sample`)..."""
    waited_s: np.ndarray
    """...and how long the client waited for each before giving up: its latency was at least that."""
    slow_weights: np.ndarray
    """Per cut-off attempt, the probability (given the fit) that it was slow rather than lost."""
    iterations: int
    """EM iterations run (0: nothing was cut off, the uncensored fit is the answer)."""
    converged: bool
    ks_distance: float
    """KS distance of the standardised log residuals' Kaplan-Meier distribution from N(0, 1)."""

    @property
    def completed(self) -> int:
        """Completed calls fitted on."""
        return len(self.latency_s)

    @property
    def cut_off(self) -> int:
        """Cut-off attempts fitted on."""
        return len(self.waited_s)

    @property
    def slow_cut_offs(self) -> float:
        """How many cut-offs the latency's upper tail accounts for (expected count); the rest were lost."""
        return float(np.sum(self.slow_weights))

    def mean_s(self, x: np.ndarray) -> np.ndarray:
        """The fitted mean latency at regressor values ``x`` (floored at 1e-12 s, as the fit uses it)."""
        return np.maximum(self.base_s + self.per_unit_s * np.asarray(x, dtype=float), 1e-12)


EM_TOLERANCE = 1e-10
"""The censored fit stops when no parameter moves by more than this (relative, for the latency line;
absolute for sigma, the residual mean and the lost share) in an iteration."""
EM_MAX_ITERATIONS = 5000
"""The censored fit's iteration cap; reaching it is flagged. Measured: 70-80 iterations with 13-24% of
the attempts cut off, 170-250 with 30-50%, under 10 when the deadline is far beyond every latency."""


def fit_censored_latency(
    x: np.ndarray,
    latency: np.ndarray,
    cut_x: np.ndarray | None = None,
    waited: np.ndarray | None = None,
    *,
    tolerance: float = EM_TOLERANCE,
    max_iterations: int = EM_MAX_ITERATIONS,
) -> CensoredLatencyFit:
    """The latency model fitted to completed calls (``x``, ``latency``) *and* attempts the client cut
    off after waiting ``waited`` seconds (regressor ``cut_x``), with the share of lost responses.

    Why: an attempt cut off by the client's deadline says only that no answer came within the time
    waited. Dropping it fits the latency to the calls that happened to be fast (a right-truncated
    sample: sigma 0.8 came out 0.68), and counting it as a lost response makes a slow, reliable
    provider look lossy (``timeout_prob`` 0.14 fitted where it was 0). Here each cut-off is, under
    the fit, slow with probability ``S_i = P(L_i > waited_i)`` or lost with probability ``p``:
    ``P(cut off) = p + (1 - p) * S_i``, and a completed call has density ``(1 - p) * f(L_i)`` (Tobit
    likelihood with a lost-response mixture).

    How (an EM algorithm, numpy and :mod:`math` only):

    - **p step**: given the latency fit, ``p`` maximises ``n log(1 - p) + sum log(p + (1 - p) S_i)``
      (concave; safeguarded Newton; exactly 0 when the tail accounts for every cut-off).
    - **E step**: each cut-off's probability of being slow, ``w_i = (1 - p) S_i / (p + (1 - p) S_i)``,
      and the moments of its latency given ``L_i > waited_i`` (lognormal tail: truncated normal in logs).
    - **M step**: the estimator of :func:`fit_latency` on the completed data: one IRLS step for the
      line with each cut-off's conditional mean latency at weight ``w_i``, then the mean and sd of
      the log residuals with each cut-off's conditional moments at weight ``w_i`` (ddof 2, as there).

    The equations solved at convergence are those of :func:`fit_latency` with the unknown latencies
    replaced by their expectations under the fit, so they are unbiased at the truth (the estimator
    is consistent), and with nothing cut off they *are* :func:`fit_latency`'s: that answer is
    returned as it is (``iterations`` 0). Deterministic: no random draw, no clock.

    Raises :class:`CalibrationError` when fewer than 3 completed calls remain (every attempt cut
    off: the latency is only known to exceed the time waited, or the responses were lost, and no
    fit can tell which).
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(latency, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y) & (y > 0)
    x, y = x[keep], y[keep]
    cx = np.asarray([] if cut_x is None else cut_x, dtype=float)
    cw = np.asarray([] if waited is None else waited, dtype=float)
    if cx.shape != cw.shape:
        raise ConfigurationError(f"cut_x and waited differ in shape: {cx.shape} and {cw.shape}")
    if len(y) < 3:
        waits = cw[np.isfinite(cw)]  # a cut-off's regressor may be unknown: no completed call to take it from
        if len(waits) and len(y) == 0:
            raise CalibrationError(
                f"latency: every one of the {len(waits)} attempt(s) was cut off by the client (after "
                f"waiting {np.min(waits):.4g} to {np.max(waits):.4g} s) and none completed: the latency is "
                "only known to be longer than that, or the responses were lost, and no fit can tell "
                "which; calibrate from a log recorded with a longer attempt timeout"
            )
        cut = (
            f" ({len(waits)} more cut off by the client, which show only a lower bound)" if len(waits) else ""
        )
        raise CalibrationError(f"latency: {len(y)} successful call(s){cut}; at least 3 are needed for a fit")
    held = np.isfinite(cx) & np.isfinite(cw)  # a cut-off without a time waited tells nothing
    cx, cw = cx[held], np.maximum(cw[held], 1e-300)
    base, slope, sigma = fit_latency(x, y)
    residuals = np.log(y / np.maximum(base + slope * x, 1e-12))
    mean = float(np.mean(residuals))
    if len(cw) == 0:
        return CensoredLatencyFit(
            base, slope, sigma, mean, 0.0, x, y, cx, cw, np.empty(0), 0, True, _ks_normal(residuals)
        )
    # cut-offs with the same regressor and wait are alike: each distinct pair once, with its count
    pairs, inverse, counts = np.unique(
        np.column_stack([cx, cw]), axis=0, return_inverse=True, return_counts=True
    )
    cut = _CutOffs(pairs[:, 0], pairs[:, 1], counts.astype(float))
    state = _EmState(base, slope, mean, sigma, len(cw) / (len(y) + len(cw)))
    scale = max(float(np.max(y)), 1e-12)
    x_top = float(np.max(x))
    iterations, converged = 0, False
    while iterations < max_iterations and not converged:
        iterations += 1
        new = _em_step(state, x, y, cut)
        moved = max(
            abs(new.base - state.base) / scale,
            abs((new.base + new.slope * x_top) - (state.base + state.slope * x_top)) / scale,
            abs(new.sigma - state.sigma),
            abs(new.mean - state.mean),
            abs(new.lost - state.lost),
        )
        converged = moved <= tolerance
        state = new
    # the split of the cut-offs under the final fit
    bounds = np.log(cut.waited / np.maximum(state.base + state.slope * cut.x, 1e-12))
    log_slow = _log_normal_sf(_standardised(bounds, state.mean, state.sigma))
    lost = _lost_share(log_slow, len(y), cut.counts, state.lost)
    weights = _slow_weights(log_slow, lost)
    completed = np.log(y / np.maximum(state.base + state.slope * x, 1e-12))
    ks = _ks_censored(completed, bounds, weights * cut.counts, state.mean, state.sigma)
    return CensoredLatencyFit(
        state.base,
        state.slope,
        state.sigma,
        state.mean,
        lost,
        x,
        y,
        cx,
        cw,
        weights[inverse.ravel()],
        iterations,
        converged,
        ks,
    )


class _CutOffs(NamedTuple):
    """The distinct cut-offs of a fit: regressor, time waited, and how many attempts had both."""

    x: np.ndarray
    waited: np.ndarray
    counts: np.ndarray


class _EmState(NamedTuple):
    """The censored fit's parameters between iterations."""

    base: float
    slope: float
    mean: float
    sigma: float
    lost: float


def _em_step(state: _EmState, x: np.ndarray, y: np.ndarray, cut: _CutOffs) -> _EmState:
    """One iteration of :func:`fit_censored_latency`: the lost share given the latency, each cut-off's
    chance of being slow and its latency's moments beyond the time waited (E step), then the line by
    one IRLS step and the log residuals' mean and sd (M step), all with the slow cut-offs weighted in."""
    n = len(y)
    m_ok = np.maximum(state.base + state.slope * x, 1e-12)
    m_cut = np.maximum(state.base + state.slope * cut.x, 1e-12)
    standard = _standardised(np.log(cut.waited / m_cut), state.mean, state.sigma)
    log_slow = _log_normal_sf(standard)
    lost = _lost_share(log_slow, n, cut.counts, state.lost)
    weights = _slow_weights(log_slow, lost) * cut.counts
    use = weights > 0
    w, m_use = weights[use], m_cut[use]
    tail = _tail_moments(standard[use], log_slow[use], state.mean, state.sigma)
    # the line: the completed latencies and each slow cut-off's E[L | L > waited], IRLS weights 1/mean^2
    base, slope = _weighted_line_2x2(
        np.concatenate([x, cut.x[use]]),
        np.concatenate([y, m_use * tail.noise_mean]),
        np.concatenate([1.0 / m_ok**2, w / m_use**2]),
    )
    # the log residuals against the new line: a slow cut-off's E[r] and Var[r] beyond its bound
    r_ok = np.log(y / np.maximum(base + slope * x, 1e-12))
    r_cut = tail.log_mean + np.log(m_use / np.maximum(base + slope * cut.x[use], 1e-12))
    total = n + float(np.sum(w))
    mean = (float(np.sum(r_ok)) + float(np.sum(w * r_cut))) / total
    squares = float(np.sum((r_ok - mean) ** 2)) + float(np.sum(w * (tail.log_variance + (r_cut - mean) ** 2)))
    sigma = math.sqrt(max(squares, 0.0) / max(total - 2.0, 1.0))
    return _EmState(base, slope, mean, sigma, lost)


def _weighted_line_2x2(x: np.ndarray, y: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    """:func:`_weighted_line` from the 2x2 normal equations (centred), an order faster than
    ``lstsq`` where it is called every iteration; ``lstsq`` itself when every ``x`` is the same."""
    total = float(np.sum(weights))
    x_mean = float(np.sum(weights * x)) / total
    y_mean = float(np.sum(weights * y)) / total
    centred = x - x_mean
    spread = float(np.sum(weights * centred * centred))
    if not spread > 1e-12 * total * max(x_mean * x_mean, 1.0):
        base, slope = _weighted_line(x, y, weights)
        return float(base), float(slope)
    slope = float(np.sum(weights * centred * y)) / spread
    return _clipped_line(y_mean - slope * x_mean, slope, x, y, weights, lambda: y_mean)


class LatencySample(NamedTuple):
    """The attempts a provider's latency is fitted on, from its rows of a call log."""

    regressor: str
    """``output_units`` when the provider reported them for over 90% of completed calls, else ``usage``."""
    x: np.ndarray
    """The completed calls' regressor (their cost estimate where it is blank)..."""
    latency_s: np.ndarray
    """...and their latencies."""
    cut_x: np.ndarray
    """The cut-off attempts' regressor, which no answer reported: the same task's completed attempt's
    (the same request), else the attempt's cost estimate times the completed calls' median ratio of
    regressor to estimate, else the completed calls' median regressor..."""
    waited_s: np.ndarray
    """...and how long the client waited before cutting each off (its ``latency_s``)."""


def latency_sample(calls: pd.DataFrame) -> LatencySample:
    """One provider's completed calls (class ``ok``) and cut-off attempts (class ``timeout``: the
    client's attempt timeout or its own read timeout fired before any answer) in ``calls``."""
    ok = calls[calls["outcome_class"] == "ok"]
    use_output = ok["output_units"].notna().mean() > 0.9 if len(ok) else False
    regressor = "output_units" if use_output else "usage"
    done_x = ok[regressor].fillna(ok["cost_estimate"]).astype(float)
    cut = calls[calls["outcome_class"] == "timeout"]
    by_task = pd.Series(done_x.to_numpy(), index=ok["task_id"].to_numpy())
    by_task = by_task[np.isfinite(by_task.to_numpy())]
    same_task = cut["task_id"].map(by_task.groupby(level=0).first())
    estimates = ok["cost_estimate"].astype(float).to_numpy()
    usable = np.isfinite(done_x.to_numpy()) & np.isfinite(estimates) & (estimates > 0)
    ratio = float(np.median(done_x.to_numpy()[usable] / estimates[usable])) if usable.any() else math.nan
    finite = done_x.to_numpy()[np.isfinite(done_x.to_numpy())]
    typical = float(np.median(finite)) if len(finite) else math.nan
    cut_x = same_task.fillna(cut["cost_estimate"].astype(float) * ratio).fillna(typical)
    return LatencySample(
        regressor,
        done_x.to_numpy(float),
        ok["latency_s"].to_numpy(float),
        cut_x.to_numpy(float),
        cut["latency_s"].to_numpy(float),
    )


def _standardised(bound: np.ndarray, mean: float, sigma: float) -> np.ndarray:
    """``(bound - mean) / sigma``; with ``sigma`` 0 (every latency on its line), +inf above the mean
    (no latency gets past it) and -inf at or below it (every latency does)."""
    if sigma > 0:
        return (bound - mean) / sigma
    return np.where(bound > mean, np.inf, -np.inf)


_ERFC = np.frompyfunc(math.erfc, 1, 1)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_ASYMPTOTIC_FROM = 30.0
"""Where :func:`_log_normal_sf` switches from ``math.erfc`` (which underflows near z = 37.5) to the
asymptotic series (relative error below 1e-12 from here on)."""


def _log_normal_sf(z: np.ndarray) -> np.ndarray:
    """``log P(Z > z)`` for a standard normal ``Z``, elementwise, finite wherever ``z`` is: from
    ``math.erfc`` (full precision; below 0 as ``log1p`` of the other tail, so that a probability near
    1 keeps its digits) up to ``z = 30``, from the asymptotic series of the Mills ratio beyond.
    ``+inf`` gives ``-inf``, ``-inf`` gives 0."""
    z = np.asarray(z, dtype=float)
    out = np.zeros_like(z)
    far = z > _ASYMPTOTIC_FROM
    near = ~far & (z >= 0)
    below = (z < 0) & np.isfinite(z)  # log(1 - P(Z > -z)): exact where the probability is near 1
    out[near] = np.log(0.5 * _ERFC(z[near] / math.sqrt(2.0)).astype(float))
    out[below] = np.log1p(-0.5 * _ERFC(-z[below] / math.sqrt(2.0)).astype(float))
    big = z[far]
    with np.errstate(invalid="ignore", over="ignore"):
        inverse = 1.0 / (big * big)
        series = 1.0 - inverse * (1.0 - 3.0 * inverse * (1.0 - 5.0 * inverse * (1.0 - 7.0 * inverse)))
        out[far] = -0.5 * big * big - np.log(big) - _LOG_SQRT_2PI + np.log(series)
    return out


def _normal_cdf(z: np.ndarray) -> np.ndarray:
    """``P(Z <= z)`` for a standard normal ``Z``, elementwise (``math.erfc``: accurate in the tails)."""
    z = np.asarray(z, dtype=float)
    return (0.5 * _ERFC(-z / math.sqrt(2.0))).astype(float)


def _lost_share(log_slow: np.ndarray, completed: int, counts: np.ndarray, start: float) -> float:
    """The lost-response share ``p`` in [0, 1) that maximises ``completed * log(1 - p) + sum(counts_i *
    log(p + (1 - p) * S_i))``, ``S_i = exp(log_slow_i)`` the chance that a cut-off of kind ``i`` (seen
    ``counts_i`` times) was slow: 0 when the slope there is not positive (the tail accounts for every
    cut-off), else the slope's root by Newton's method kept inside a bisection bracket (the function
    is concave), from ``start``."""
    slow = np.exp(log_slow)
    with np.errstate(over="ignore"):
        slope_at_0 = float(np.sum(counts * np.expm1(-log_slow))) - completed  # sum (1 - S) / S - n
    if not slope_at_0 > 0:
        return 0.0
    low, high = 0.0, 1.0
    share = min(max(start, 1e-12), 1.0 - 1e-12)
    for _ in range(200):
        terms = (1.0 - slow) / (share + (1.0 - share) * slow)
        slope = float(np.sum(counts * terms)) - completed / (1.0 - share)
        if slope > 0:
            low = share
        else:
            high = share
        curvature = -float(np.sum(counts * terms * terms)) - completed / (1.0 - share) ** 2
        step = share - slope / curvature
        if not low < step < high:
            step = 0.5 * (low + high)
        if abs(step - share) <= 1e-15 + 1e-13 * share or high - low <= 1e-15:
            return step
        share = step
    return share


def _slow_weights(log_slow: np.ndarray, lost: float) -> np.ndarray:
    """Per cut-off, ``(1 - p) S / (p + (1 - p) S)``: the chance it was slow, not lost, being cut off."""
    if lost <= 0:
        return np.ones_like(log_slow)
    with np.errstate(over="ignore", divide="ignore"):
        odds_lost = lost / ((1.0 - lost) * np.exp(log_slow))  # inf where S underflows: certainly lost
    return 1.0 / (1.0 + odds_lost)


class _Tail(NamedTuple):
    log_mean: np.ndarray
    """``E[r | r > bound]`` of a log residual ``r ~ N(mean, sigma^2)``..."""
    log_variance: np.ndarray
    """...``Var[r | r > bound]``..."""
    noise_mean: np.ndarray
    """...and ``E[exp(r) | r > bound]``: the latency's conditional mean over the fitted mean line."""


def _tail_moments(standard: np.ndarray, log_slow: np.ndarray, mean: float, sigma: float) -> _Tail:
    """The moments of a log residual ``N(mean, sigma^2)`` beyond its standardised bound ``standard``
    (``log_slow``: the log of the chance of getting there, not -inf), from the inverse Mills ratio."""
    log_density = -0.5 * standard * standard - _LOG_SQRT_2PI
    mills = np.exp(log_density - log_slow)  # 0 at standard = -inf (nothing is known beyond the mean)
    product = np.multiply(standard, mills, out=np.zeros_like(mills), where=mills > 0)  # not -inf * 0
    log_variance = sigma * sigma * np.maximum(1.0 + product - mills * mills, 0.0)
    noise_mean = np.exp(mean + 0.5 * sigma * sigma + _log_normal_sf(standard - sigma) - log_slow)
    return _Tail(mean + sigma * mills, log_variance, noise_mean)


def kaplan_meier(
    events: np.ndarray, censored: np.ndarray, weights: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(sorted events, F just before each, F at each)``: the Kaplan-Meier distribution function of
    values observed at ``events`` and known only to exceed ``censored`` (each counted with its
    ``weights``, e.g. the chance it was slow rather than lost). A censored value equal to an event is
    at risk at it. Without censored values, ``F`` at the ``i``-th smallest event is ``i / n``."""
    events = np.asarray(events, dtype=float)
    censored = np.asarray(censored, dtype=float)
    weights = np.asarray(weights, dtype=float)
    values = np.concatenate([events, censored])
    mass = np.concatenate([np.ones_like(events), weights])
    is_censored = np.concatenate([np.zeros(len(events), bool), np.ones(len(censored), bool)])
    order = np.lexsort((is_censored, values))  # by value, events first at ties
    at_risk = np.cumsum(mass[order][::-1])[::-1]
    event_rows = ~is_censored[order]
    survival = np.cumprod(1.0 - 1.0 / at_risk[event_rows])
    after = 1.0 - survival
    before = np.concatenate([[0.0], after[:-1]])
    return values[order][event_rows], before, after


def _ks_censored(
    completed: np.ndarray, bounds: np.ndarray, weights: np.ndarray, mean: float, sigma: float
) -> float:
    """The KS distance from N(0, 1) of the log residuals' Kaplan-Meier distribution (``completed``
    observed; ``bounds`` the cut-offs' lower bounds, each counted ``weights`` times: how many were
    slow), standardised by the fit's mean and its sd without the ddof; :func:`_ks_normal` of the
    completed residuals when no cut-off counts (then the two are the same)."""
    if not np.sum(weights) > 0:
        return _ks_normal(completed)
    total = len(completed) + float(np.sum(weights))
    spread = sigma * math.sqrt(max(total - 2.0, 1.0) / total)
    if not spread > 1e-9:  # latencies on their line (to rounding): no shape to compare
        return 0.0
    values, before, after = kaplan_meier((completed - mean) / spread, (bounds - mean) / spread, weights)
    cdf = _normal_cdf(values)
    return float(max(np.max(after - cdf), np.max(cdf - before)))


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
    intervals: Mapping[str, Interval] = field(default_factory=dict)
    """A 95% interval for each fitted field, by its scenario key (``latency_base_s``, ...): see
    :mod:`aiqsim.lab.calibrate_intervals`."""


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
    intervals: Mapping[str, Interval] = field(default_factory=dict)
    """A 95% interval for each fitted field (``rate_per_s[i]`` per bin, ``cost.mean``, ...)."""


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
    latency_fits: Mapping[str, CensoredLatencyFit] = field(default_factory=dict, repr=False)
    """Per provider, its latency fit in full: the completed calls and cut-off attempts it was fitted
    on, and each cut-off's chance of having been slow rather than lost (the report draws them)."""

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
        return (
            "\n".join(f"# {line}".rstrip() for line in self.interval_lines()) + "\n\n" + dumps_toml(document)
        )

    def interval_lines(self) -> list[str]:
        """The fitted values with their 95% intervals, one per line by scenario key, and the flags:
        what the CLI prints and the scenario file's opening comments hold."""
        rows: dict[str, Interval] = {}
        for name, fit in self.providers.items():
            rows.update({f"providers.{name}.{key}": interval for key, interval in fit.intervals.items()})
        for w in self.workloads:
            label = f"workload {w.provider}/{w.priority}"
            rows.update({f"{label} {key}": interval for key, interval in w.intervals.items()})
        width = max((len(key) for key in rows), default=0)
        lines = [
            "Fitted values and their 95% intervals (value [low, high]; how; from how many observations):",
            *(f"  {line}" for line in format_intervals(rows, width=width)),
        ]
        if self.flags:
            lines += ["Flags:", *(f"  {flag}" for flag in self.flags)]
        return lines

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


def _limit_from_429s(calls: pd.DataFrame) -> tuple[float | None, pd.Series, np.ndarray]:
    """Without headers: a 429 at a time when the server had admitted (nearly) as many attempts in
    the last minute as it ever did is a limit 429; the limit is the median of those counts, and
    never below the most attempts the log shows admitted in one minute (the server let those
    through). A limit is fitted only if 429s are concentrated at such times
    (:data:`LIMIT_429_SHARE`, :data:`LIMIT_429_CONTRAST`); else they are random, and no limit is
    (a limit of 90/min was fitted where 96 had been admitted and every 429 was random). The third
    value: the admitted counts behind the limit (floored at the most admitted), for its interval."""
    none = (None, pd.Series(False, index=calls.index), np.array([]))
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
    return (
        limit,
        pd.Series(limited & near_full, index=calls.index),
        np.maximum(counts[at_busiest], most_admitted),
    )


def _fit_provider(
    name: str,
    calls: pd.DataFrame,
    flags: list[str],
    latency_fits: dict[str, CensoredLatencyFit],
    index: int = 0,
) -> ProviderFit:
    sent = calls[calls["outcome_class"] != "rejected_locally"]
    classes = sent["outcome_class"].value_counts().to_dict()
    sample = latency_sample(sent)
    try:
        fitted = fit_censored_latency(sample.x, sample.latency_s, sample.cut_x, sample.waited_s)
    except CalibrationError as error:
        raise CalibrationError(f"{name}: {error}") from None
    ks = fitted.ks_distance
    x_seen = sample.x[np.isfinite(sample.x)]
    identifiable = len(x_seen) > 1 and float(np.ptp(x_seen)) > 1e-9 * max(1.0, float(np.abs(x_seen).max()))
    base_s, per_unit_s = fitted.base_s, fitted.per_unit_s
    if not identifiable:  # only the mean at the one x seen is known: keep it whole in the base
        x0 = float(x_seen[0]) if len(x_seen) else 0.0
        base_s, per_unit_s = fitted.base_s + fitted.per_unit_s * x0, 0.0
        flags.append(
            f"{name}: the base/per-unit latency split is not identifiable: every completed call had "
            f"{sample.regressor} = {x0:g}, so the log shows only the mean latency at that size "
            f"({base_s:.4g} s), not how it grows with size; the scenario keeps it all in "
            "latency_base_s (latency_per_unit_s 0). Record calls of different sizes to fit the split"
        )
    latency = LatencyFit(
        base_s,
        per_unit_s,
        fitted.sigma,
        fitted.completed,
        sample.regressor,
        ks,
        fitted.cut_off,
        fitted.slow_cut_offs,
        identifiable,
    )
    latency_fits[name] = fitted
    if fitted.completed < SMALL_SAMPLE:
        flags.append(
            f"{name}: small sample: {fitted.completed} completed calls (< {SMALL_SAMPLE}); its fits are "
            "rough and even their 95% intervals understate the uncertainty (the bootstrap and score "
            f"intervals rest on large samples). Calibrate from a longer log"
        )
    if fitted.sigma < 1e-9 and fitted.completed > 1:
        flags.append(
            f"{name}: every completed call took exactly the latency its size predicts (sigma 0): the "
            "lognormal noise has nothing to fit (a synthetic or rounded log?)"
        )
    elif ks > POOR_FIT_LOG_RESIDUAL_KS:
        flags.append(
            f"{name}: latency residuals are not lognormal (KS distance {ks:.3f} > "
            f"{POOR_FIT_LOG_RESIDUAL_KS}); see the QQ plot"
        )
    if not fitted.converged:
        flags.append(
            f"{name}: the latency fit with the {fitted.cut_off} cut-off attempts did not settle in "
            f"{fitted.iterations} iterations; its latency and lost-response rate are approximate"
        )
    if fitted.slow_cut_offs >= SLOW_CUT_OFFS_FLAG * (fitted.completed + fitted.cut_off):
        flags.append(
            f"{name}: {fitted.cut_off} attempts were cut off by the client before any answer; the fitted "
            f"latency's tail beyond the time waited accounts for {fitted.slow_cut_offs:.1f} of them "
            f"(extrapolated from the lognormal fit), the other {fitted.cut_off - fitted.slow_cut_offs:.1f} "
            "are fitted as lost responses"
        )

    has_headers = sent["limit_requests"].notna().any() or sent["limit_tokens"].notna().any()
    if has_headers:
        rpm, upm = _mode(sent["limit_requests"]), _mode(sent["limit_tokens"])
        limit_mask = _limit_429_mask(sent)
        limits_from = "headers"
    else:
        rpm, limit_mask, busiest_counts = _limit_from_429s(sent)
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
    lost = max(classes.get("timeout", 0) - fitted.slow_cut_offs, 0.0)  # the cut-offs not slow
    after_checks = admitted - qe - inv
    executed = after_checks - s5

    def ratio(numerator: float, denominator: int) -> float:
        return min(float(numerator / denominator), 1.0) if denominator > 0 else 0.0

    retry_after = sent.loc[random_mask, "retry_after_s"].dropna()
    rng = np.random.default_rng([BOOTSTRAP_SEED, index])
    intervals = _latency_intervals(sample, fitted, identifiable, base_s, rng)
    if has_headers:
        for key, value, column in (
            ("server_requests_per_min", rpm, "limit_requests"),
            ("server_units_per_min", upm, "limit_tokens"),
        ):
            if value is not None:
                read = int(sent[column].notna().sum())
                intervals[key] = exact(value, "read from x-ratelimit headers, not estimated", read)
    elif rpm is not None:
        intervals["server_requests_per_min"] = bootstrap((busiest_counts,), np.median, rng, value=rpm)
    intervals["rate_limit_prob"] = wilson(random_429s, past_limit, ratio(random_429s, past_limit))
    if len(retry_after):
        intervals["rate_limit_retry_after_s"] = bootstrap(
            (retry_after.to_numpy(float),), np.median, rng, value=float(retry_after.median())
        )
    intervals["server_error_prob"] = wilson(s5, after_checks, ratio(s5, after_checks))
    intervals["timeout_prob"] = wilson(lost, executed - schema, ratio(lost, executed - schema))
    intervals["quota_exhausted_prob"] = wilson(qe, admitted, ratio(qe, admitted))
    intervals["invalid_request_prob"] = wilson(inv, admitted, ratio(inv, admitted))
    return ProviderFit(
        name=name,
        latency=latency,
        server_requests_per_min=rpm,
        server_units_per_min=upm,
        limits_from=limits_from,
        rate_limit_prob=ratio(random_429s, past_limit),
        rate_limit_retry_after_s=float(retry_after.median()) if len(retry_after) else None,
        server_error_prob=ratio(s5, after_checks),
        timeout_prob=ratio(lost, executed - schema),
        quota_exhausted_prob=ratio(qe, admitted),
        invalid_request_prob=ratio(inv, admitted),
        attempts=len(sent),
        limit_429s=limit_429s,
        random_429s=random_429s,
        counts={str(k): int(v) for k, v in classes.items()},
        intervals=intervals,
    )


BOOTSTRAP_EM_TOLERANCE = 1e-5
"""The censored fit's stopping rule on a bootstrap resample: looser than :data:`EM_TOLERANCE`, since
a resample's estimate only has to be far more precise than the spread between resamples (1e-5
against an interval some 5% wide), and it halves the iterations (34 against 75 on 1,400 attempts
with 15% cut off: a calibration's bootstrap then takes about 2 s there, not 4)."""


CENSORED_RESAMPLES = 100
"""Bootstrap resamples of a latency fit with cut-off attempts (each one an EM fit, ~10 ms on 1,400
attempts): fewer than :data:`~aiqsim.lab.calibrate_intervals.BOOTSTRAP_RESAMPLES`, so a calibration
stays about a second; the 2.5% / 97.5% percentiles of 100 resamples move by about a sixth of the
interval's width from one seed to another, enough to tell a tight fit from a loose one."""


def _latency_intervals(
    sample: LatencySample, fitted: CensoredLatencyFit, identifiable: bool, base_s: float, rng: Any
) -> dict[str, Interval]:
    """Bootstrap intervals of the latency fit: completed calls and cut-off attempts resampled apart
    (each keeps its size with its latency), the censored fit redone on each resample."""
    done = np.column_stack([sample.x, sample.latency_s])
    cut = np.column_stack([sample.cut_x, sample.waited_s])

    def refit(done: np.ndarray, cut: np.ndarray) -> tuple[float, float, float]:
        again = fit_censored_latency(
            done[:, 0], done[:, 1], cut[:, 0], cut[:, 1], tolerance=BOOTSTRAP_EM_TOLERANCE
        )
        if identifiable:
            return again.base_s, again.per_unit_s, again.sigma
        return again.base_s + again.per_unit_s * float(done[0, 0]), 0.0, again.sigma

    resamples = CENSORED_RESAMPLES if len(cut) else BOOTSTRAP_RESAMPLES
    base, per_unit, sigma = bootstrap(
        (done, cut), refit, rng, value=(base_s, fitted.per_unit_s if identifiable else 0.0, fitted.sigma),
        resamples=resamples,
    )  # fmt: skip
    if not identifiable:
        per_unit = Interval(0.0, math.nan, math.nan, "not identifiable: every call had the same size", base.n)
    return {"latency_base_s": base, "latency_per_unit_s": per_unit, "latency_sigma": sigma}


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
    provider: str,
    priority: str,
    tasks: pd.DataFrame,
    calls: pd.DataFrame,
    bins: int,
    flags: list[str],
    index: int = 0,
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
    window = DISPERSION_WINDOW_S
    if span >= 3 * window:
        # whole windows only: a trailing partial one (a log cut at 100.12 s has 0.12 s in its 11th)
        # holds a fraction of a window's arrivals against a whole window's expectation, and alone
        # made a Poisson log "burstier than Poisson" (dispersion 5.3)
        edges = start + window * np.arange(int(span // window) + 1)
        per_window = np.histogram(times, bins=edges)[0]
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
    if n < SMALL_SAMPLE:
        flags.append(
            f"{provider}/{priority}: small sample: {n} submissions (< {SMALL_SAMPLE}); the arrival rate, "
            "cost and duplicate fits are rough, and even their 95% intervals understate the uncertainty"
        )
    rng = np.random.default_rng([BOOTSTRAP_SEED, 1_000 + index])
    intervals: dict[str, Interval] = {}
    for i, count in enumerate(counts):
        intervals[f"rate_per_s[{i}]" if bins > 1 else "rate_per_s"] = poisson_rate(int(count), width)
    if dist == "fixed":
        intervals["cost.mean"] = exact(mean, "every task's cost estimate is the same", len(costs))
    else:
        positive = costs[costs > 0]
        intervals["cost.mean"] = bootstrap((positive,), np.mean, rng, value=mean)
        intervals["cost.sigma"] = bootstrap(
            (np.log(positive),), lambda v: np.std(v, ddof=1), rng, value=sigma
        )
    if len(ok):
        shares = (ok["output_units"] / ok["usage"]).to_numpy(float)
        intervals["cost.output_fraction"] = bootstrap(
            (shares,), np.median, rng, value=min(max(fraction, 0.0), 1.0)
        )
    distinct = _distinct_for(n, repeats)
    if distinct is not None:
        # parametric bootstrap: resampling the keys themselves would add repeats of its own; instead
        # draw n inputs uniformly from the fitted number, as the model says, and fit each draw again
        draws = np.arange(n)

        def distinct_for(_: np.ndarray) -> float:
            drawn = rng.integers(0, distinct, n)
            found = _distinct_for(n, n - len(np.unique(drawn)))
            return math.nan if found is None else float(found)

        intervals["distinct_inputs"] = replace(
            bootstrap((draws,), distinct_for, rng, value=float(distinct)),
            method=f"parametric bootstrap, {BOOTSTRAP_RESAMPLES} draws of {n} inputs",
        )
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
        distinct_inputs=distinct,
        dispersion=dispersion,
        intervals=intervals,
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
    latency_fits: dict[str, CensoredLatencyFit] = {}
    fits = {
        name_: _fit_provider(name_, group, flags, latency_fits, index)
        for index, (name_, group) in enumerate(calls.groupby("provider", sort=True))
    }
    workloads = [
        _fit_workload(p, prio, group, calls[calls["provider"] == p], arrival_bins, flags, index)
        for index, ((p, prio), group) in enumerate(tasks.groupby(["provider", "priority"], sort=True))
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
    return Calibration(scenario, fits, workloads, flags, tasks, calls, arrivals, inputs, latency_fits)


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
