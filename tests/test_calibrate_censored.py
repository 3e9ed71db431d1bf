"""Attempts the client cut off are censored latencies, not lost responses (review finding).

The scheduler gives up on an attempt after ``attempt_timeout_s``; the call log records it as a
``TimeoutError`` after exactly that wait. Calibration counted every such attempt as a lost response
(``timeout_prob``: the provider did the work and the answer never came) and fitted the latency on the
calls that finished in time, a right-truncated sample: a slow but reliable provider (``timeout_prob``
0, sigma 0.8, a 3 s deadline cutting off 13% of the attempts) came out with ``timeout_prob`` 0.13 and
sigma 0.67. Now a cut-off attempt is a latency of at least the time waited, or a lost response, in
the proportions the fitted latency's tail implies (:func:`aiqsim.lab.calibrate.fit_censored_latency`).

The logs are the simulator's own, seeded: a failure replays. Tolerances are 4 standard deviations of
the estimator over seeds, measured on these scenarios (30 seeds each, seeds 0-29, about 5,500 and
6,000 attempts a log; old estimator's means for comparison); for (a)'s ``timeout_prob``, which cannot
go below its true 0, the bound is the mean + 3.5 sd (0.03, above the 30 seeds' largest, 0.020).
Both recovery tests also passed on 40 other seeds (100-139).

=============  =====================================  =====================================
estimate       (a) lost 0, sigma 0.8, 13% cut off     (b) lost 0.1, sigma 0.8, 21% cut off
=============  =====================================  =====================================
sigma          mean 0.795, sd 0.0125 (old 0.666)      mean 0.802, sd 0.0138 (old 0.667)
per_unit_s     mean 0.00399, sd 0.00028 (old 0.00153) mean 0.00410, sd 0.00035 (old 0.00152)
base_s         mean 0.981, sd 0.033                   mean 0.993, sd 0.051
timeout_prob   mean 0.0053, sd 0.0070, max 0.020      fitted - realized: mean -0.0002,
               (old 0.126)                            sd 0.0098, max 0.019 (old 0.214)
=============  =====================================  =====================================
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from aiqsim.cli import main
from aiqsim.lab.calibrate import (
    CalibrationError,
    calibrate,
    fit_censored_latency,
    fit_latency,
    kaplan_meier,
    latency_sample,
)
from aiqsim.lab.calibration_report import _provider_rows
from aiqsim.sim import simulate

SCENARIO = """
[scenario]
name = "slow_provider"
seed = 1
duration_s = {duration_s}
drain_s = 600

[[providers]]
name = "llm"
latency_base_s = 1.0
latency_per_unit_s = 0.004
latency_sigma = {sigma}
timeout_prob = {timeout_prob}
server_error_prob = {server_error_prob}

[quotas.llm]
concurrency = 64

[retry]
strategy = "full_jitter"
base_s = 0.5
cap_s = 8
max_attempts = 6
attempt_timeout_s = {deadline_s}

[[workloads]]
type = "poisson"
provider = "llm"
rate_per_s = 2
[workloads.cost]
dist = "lognormal"
mean = 500
sigma = 0.6
output_fraction = 0.3
"""
"""About 150 output units a call: a mean latency near 1.6 s, so a 3 s deadline cuts off the slowest
13% of the calls at sigma 0.8."""


def _logged(
    folder: Path,
    seed: int,
    *,
    sigma: float = 0.8,
    timeout_prob: float = 0.0,
    server_error_prob: float = 0.0,
    deadline_s: float = 3.0,
    duration_s: float = 2400.0,
):
    """Simulate the scenario with these parameters on ``seed`` and write its call log under ``folder``;
    returns (the simulation's result, the log's folder)."""
    path = folder / "scenario.toml"
    path.write_text(
        SCENARIO.format(
            sigma=sigma,
            timeout_prob=timeout_prob,
            server_error_prob=server_error_prob,
            deadline_s=deadline_s,
            duration_s=duration_s,
        )
    )
    result = simulate(path, seed=seed)
    result.call_log.write(folder / "log")
    return result, folder / "log"


def _realized_lost(result) -> float:
    """The share of executions whose response the simulated provider lost (what ``timeout_prob`` drew)."""
    executed = [e for e in result.executions if e.outcome == "ok"]
    return sum(e.response_lost for e in executed) / len(executed)


# ---------------------------------------------------------------------- recovery on simulated logs
def test_a_slow_reliable_provider_is_not_fitted_as_a_lossy_one(tmp_path: Path) -> None:
    """(a) Nothing lost, a deadline cutting off 13% of the attempts: ``timeout_prob`` near 0 (it was
    0.13) and the latency's sigma and slope near the truth (0.67 and 0.0015 before)."""
    result, log = _logged(tmp_path, seed=11)
    assert _realized_lost(result) == 0
    calibration = calibrate(log)
    fit = calibration.providers["llm"]
    assert fit.counts["timeout"] > 0.10 * fit.attempts  # the deadline does cut off a good share
    assert fit.timeout_prob <= 0.03
    assert fit.latency.sigma == pytest.approx(0.8, abs=0.05)
    assert fit.latency.per_unit_s == pytest.approx(0.004, abs=0.0012)
    assert fit.latency.base_s == pytest.approx(1.0, abs=0.14)
    assert fit.latency.cut_off == fit.counts["timeout"]
    assert calibration.latency_fits["llm"].converged
    assert any("cut off by the client" in flag for flag in calibration.flags)


def test_lost_responses_and_slow_calls_behind_one_deadline_are_told_apart(tmp_path: Path) -> None:
    """(b) 10% of responses lost and 5% 5xx, behind the same 3 s deadline: the lost share is the
    provider's (it was its double, 0.21), the latency the truth's, the 5xx rate unchanged."""
    result, log = _logged(tmp_path, seed=12, timeout_prob=0.1, server_error_prob=0.05)
    fit = calibrate(log).providers["llm"]
    assert fit.timeout_prob == pytest.approx(_realized_lost(result), abs=0.04)
    assert fit.timeout_prob == pytest.approx(0.1, abs=0.05)
    assert fit.latency.sigma == pytest.approx(0.8, abs=0.055)
    assert fit.latency.per_unit_s == pytest.approx(0.004, abs=0.0014)
    assert fit.latency.base_s == pytest.approx(1.0, abs=0.2)
    attempts_5xx = fit.counts["ok"] + fit.counts["timeout"] + fit.counts["server_error"]
    assert fit.server_error_prob == pytest.approx(0.05, abs=4 * math.sqrt(0.05 * 0.95 / attempts_5xx))
    lost = fit.latency.cut_off - fit.latency.slow_cut_offs
    assert fit.timeout_prob == pytest.approx(lost / (fit.counts["ok"] + fit.counts["timeout"]))


def test_without_cut_offs_the_fit_is_the_uncensored_one_exactly(tmp_path: Path) -> None:
    """(c) No attempt cut off (nothing lost, a 60 s deadline): the latency fit is the completed
    calls' IRLS fit (:func:`fit_latency`), bit for bit, and nothing is lost."""
    _, log = _logged(tmp_path, seed=13, sigma=0.3, deadline_s=60.0, duration_s=600.0)
    calibration = calibrate(log)
    fit = calibration.providers["llm"]
    assert "timeout" not in fit.counts and fit.latency.cut_off == 0
    sample = latency_sample(calibration.calls)
    assert (fit.latency.base_s, fit.latency.per_unit_s, fit.latency.sigma) == fit_latency(
        sample.x, sample.latency_s
    )
    assert fit.timeout_prob == 0.0 and fit.latency.slow_cut_offs == 0.0
    assert calibration.latency_fits["llm"].iterations == 0
    assert calibration.flags == []


def test_lost_responses_no_latency_can_explain_are_all_lost_as_before(tmp_path: Path) -> None:
    """(c) Cut-offs only from lost responses, behind a deadline no latency reaches (30 s against a
    1.6 s mean, sigma 0.3): the same answer as the uncensored fit within numeric noise (what the EM
    adds is the uncensored IRLS run to convergence: about 1e-8 relative, measured), and
    ``timeout_prob`` the share of cut-offs, as the old estimator counted it."""
    _, log = _logged(tmp_path, seed=14, sigma=0.3, timeout_prob=0.08, deadline_s=30.0, duration_s=600.0)
    calibration = calibrate(log)
    fit = calibration.providers["llm"]
    sample = latency_sample(calibration.calls)
    base, slope, sigma = fit_latency(sample.x, sample.latency_s)
    assert fit.latency.base_s == pytest.approx(base, rel=1e-6)
    assert fit.latency.per_unit_s == pytest.approx(slope, rel=1e-6)
    assert fit.latency.sigma == pytest.approx(sigma, rel=1e-6)
    assert fit.latency.slow_cut_offs < 1e-9
    old = fit.counts["timeout"] / (fit.counts["ok"] + fit.counts["timeout"])
    assert fit.timeout_prob == pytest.approx(old, rel=1e-9)
    assert calibration.flags == []


def test_the_fit_is_deterministic(tmp_path: Path) -> None:
    """No random draw and no clock in the fit: the same log gives the same numbers twice."""
    _, log = _logged(tmp_path, seed=15, timeout_prob=0.05, duration_s=600.0)
    first, second = calibrate(log).providers["llm"], calibrate(log).providers["llm"]
    assert first == second


# ---------------------------------------------------------------------- degenerate inputs
def test_a_log_where_every_attempt_was_cut_off_is_a_calibration_error(tmp_path: Path) -> None:
    """Every attempt cut off (a 5 s latency behind a 1 s deadline): nothing can tell slow from lost,
    so the error says so, naming the provider and the time waited; no NaN reaches a scenario."""
    path = tmp_path / "scenario.toml"
    path.write_text(
        SCENARIO.format(sigma=0.0, timeout_prob=0.0, server_error_prob=0.0, deadline_s=1.0, duration_s=30)
        .replace("latency_base_s = 1.0", "latency_base_s = 5.0")
        .replace("max_attempts = 6", "max_attempts = 2")
    )
    simulate(path, seed=3).call_log.write(tmp_path / "log")
    with pytest.raises(
        CalibrationError, match=r"llm: latency: every one of the \d+ attempt\(s\) was cut off"
    ):
        calibrate(tmp_path / "log")


def test_latencies_without_spread_fit_sigma_0_and_their_lost_share(tmp_path: Path) -> None:
    """Every latency the same (sigma 0, no per-unit term) and 10% of responses lost behind a 3 s
    deadline: sigma 0, every cut-off lost (no latency reaches the deadline), nothing NaN."""
    path = tmp_path / "scenario.toml"
    path.write_text(
        SCENARIO.format(
            sigma=0.0, timeout_prob=0.1, server_error_prob=0.0, deadline_s=3.0, duration_s=300
        ).replace("latency_per_unit_s = 0.004", "latency_per_unit_s = 0.0")
    )
    result = simulate(path, seed=4)
    result.call_log.write(tmp_path / "log")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no division by zero or invalid value on the way
        calibration = calibrate(tmp_path / "log")
    fit = calibration.providers["llm"]
    assert fit.latency.base_s + fit.latency.per_unit_s * 150 == pytest.approx(1.0)
    assert fit.latency.sigma == pytest.approx(0.0, abs=1e-9)
    assert fit.latency.slow_cut_offs == 0.0
    assert fit.timeout_prob == pytest.approx(_realized_lost(result), rel=1e-9)
    assert fit.timeout_prob == pytest.approx(
        fit.counts["timeout"] / (fit.counts["ok"] + fit.counts["timeout"])
    )


def _finite(fitted) -> bool:
    values = [fitted.base_s, fitted.per_unit_s, fitted.sigma, fitted.residual_mean, fitted.lost_share]
    return all(map(math.isfinite, [*values, fitted.ks_distance, *fitted.slow_weights]))


@pytest.mark.parametrize(
    ("x", "latency", "cut_x", "waited", "message"),
    [
        (
            [],
            [],
            [10, 20],
            [3.0, 3.0],
            r"every one of the 2 attempt\(s\) was cut off by the client \(after waiting 3 to 3 s\)",
        ),
        ([10], [1.0], [10], [3.0], r"1 successful call\(s\) \(1 more cut off by the client"),
        ([10], [1.0], [], [], r"1 successful call\(s\); at least 3"),
        ([], [], [], [], r"0 successful call\(s\); at least 3"),
    ],
)
def test_too_few_completed_calls_is_a_calibration_error(
    x: list[float], latency: list[float], cut_x: list[float], waited: list[float], message: str
) -> None:
    with pytest.raises(CalibrationError, match=message):
        fit_censored_latency(np.array(x), np.array(latency), np.array(cut_x), np.array(waited))


@pytest.mark.parametrize(
    ("x", "latency", "cut_x", "waited", "lost", "slow"),
    [
        # every latency on one line (sigma 0): cut off after the line's latency -> lost, before -> slow
        ([5] * 10, [2.0] * 10, [5] * 3, [3.0] * 3, 3 / 13, [0.0] * 3),
        ([5] * 10, [2.0] * 10, [5] * 3, [1.0] * 3, 0.0, [1.0] * 3),
        ([5] * 10, [2.0] * 10, [5] * 3, [2.0] * 3, 0.0, [1.0] * 3),  # cut off exactly at the latency
        ([1, 2, 3, 4, 5] * 2, [2.0] * 10, [3] * 3, [3.0] * 3, 3 / 13, [0.0] * 3),
        # one cut-off the line cannot reach (lost), one it must (slow, unless lost as well: p = 1/6)
        ([1, 2, 3, 4, 5], [1.1, 1.2, 1.3, 1.4, 1.5], [1, 10], [5.0, 1.2], 1 / 6, [0.0, 5 / 6]),
        # a wait of 0 s tells nothing; one of 1e15 s no latency reaches
        ([1, 2, 3, 4], [1.0, 1.5, 1.2, 2.0], [1, 2], [0.0, 0.0], 0.0, [1.0, 1.0]),
        ([1, 2, 3, 4], [1.0, 1.5, 1.2, 2.0], [1, 2], [1e15, 1e15], 1 / 3, [0.0, 0.0]),
    ],
)
def test_degenerate_samples_fit_finite_numbers(
    x: list[float],
    latency: list[float],
    cut_x: list[float],
    waited: list[float],
    lost: float,
    slow: list[float],
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fitted = fit_censored_latency(np.array(x), np.array(latency), np.array(cut_x), np.array(waited))
    assert _finite(fitted)
    assert fitted.converged
    assert fitted.lost_share == pytest.approx(lost, abs=1e-9)
    assert fitted.slow_weights == pytest.approx(slow, abs=1e-9)


def test_cut_offs_with_no_time_or_regressor_are_left_out() -> None:
    x, latency = np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 1.5, 1.2, 2.0])
    fitted = fit_censored_latency(x, latency, np.array([1.0, np.nan]), np.array([np.nan, 2.0]))
    assert fitted.cut_off == 0 and _finite(fitted)
    assert (fitted.base_s, fitted.per_unit_s, fitted.sigma) == fit_latency(x, latency)


def test_without_cut_offs_the_censored_fit_is_fit_latency() -> None:
    rng = np.random.default_rng(5)
    x = rng.uniform(0, 400, 500)
    latency = (0.25 + 0.002 * x) * np.exp(0.4 * rng.standard_normal(len(x)) - 0.08)
    fitted = fit_censored_latency(x, latency)
    assert (fitted.base_s, fitted.per_unit_s, fitted.sigma) == fit_latency(x, latency)
    assert fitted.lost_share == 0.0 and fitted.iterations == 0 and fitted.cut_off == 0


# ---------------------------------------------------------------------- the pieces
def test_the_normal_tail_is_accurate_far_out() -> None:
    """``log P(Z > z)`` to full precision where ``erfc`` underflows (the censored likelihood of a wait
    far beyond every latency): against scipy, which is a test dependency only."""
    stats = pytest.importorskip("scipy.stats")
    from aiqsim.lab.calibrate import _log_normal_sf

    z = np.concatenate([np.linspace(-40, 40, 801), [29.999, 30.0, 30.001, 100.0, 1e4]])
    assert _log_normal_sf(z) == pytest.approx(stats.norm.logsf(z), rel=1e-12, abs=1e-300)
    assert _log_normal_sf(np.array([np.inf, -np.inf])).tolist() == [-np.inf, 0.0]


def test_kaplan_meier_without_censoring_is_the_empirical_distribution() -> None:
    values, before, after = kaplan_meier(np.array([3.0, 1.0, 2.0, 4.0]), np.array([]), np.array([]))
    assert values.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert after == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert before == pytest.approx([0.0, 0.25, 0.5, 0.75])


def test_kaplan_meier_spreads_a_censored_value_over_the_values_above_it() -> None:
    # 1, 2+, 3, 4: the mass of "more than 2" goes to 3 and 4 (3/8 each); half a count, half as much
    _, _, after = kaplan_meier(np.array([1.0, 3.0, 4.0]), np.array([2.0]), np.array([1.0]))
    assert after == pytest.approx([0.25, 0.625, 1.0])
    _, _, after = kaplan_meier(np.array([1.0, 3.0, 4.0]), np.array([2.0]), np.array([0.5]))
    assert after == pytest.approx([1 / 3.5, 1 - (2.5 / 3.5) * 0.5, 1.0])


# ---------------------------------------------------------------------- what the user reads
def test_the_report_and_the_cli_say_the_fit_includes_the_cut_off_attempts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, log = _logged(tmp_path, seed=16, timeout_prob=0.05, duration_s=300.0)
    calibration = calibrate(log)
    fit = calibration.providers["llm"]
    rows = dict(_provider_rows(calibration, "llm"))
    assert (
        f"fitted on {fit.latency.n} completed calls and {fit.latency.cut_off} attempts cut off"
        in rows["latency"]
    )
    assert "as censored" in rows["latency"]
    assert rows["lost responses (timeouts)"].startswith(
        f"{fit.timeout_prob:.4g}: of the {fit.latency.cut_off}"
    )
    assert main(["calibrate", str(log), "--out", str(tmp_path / "fitted.toml")]) == 0
    printed = capsys.readouterr().out
    assert f"({fit.latency.n} completed + {fit.latency.cut_off} cut off, censored)" in printed
    assert f"lost {fit.timeout_prob:.3g}" in printed
