"""Calibration says how sure it is: a 95% interval for every fitted parameter (CLI, report, the
scenario's comments), a small-sample flag, a dispersion check that a trailing partial window does not
fool, a latency split it does not invent, and a clear word when pointed at an `aiqsim run` folder.

Logs come from short seeded simulations (a second or two each)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from aiqsim.cli import main
from aiqsim.lab.calibrate import CalibrationError, calibrate
from aiqsim.lab.calibrate_intervals import SMALL_SAMPLE, bootstrap, poisson_rate, wilson
from aiqsim.sim import simulate

TRUTH = """
[scenario]
name = "truth"
seed = 5
duration_s = DURATION
drain_s = 300

[[providers]]
name = "llm"
latency_base_s = 0.5
latency_per_unit_s = 0.004
latency_sigma = 0.25
server_requests_per_min = SERVER
rate_limit_prob = RANDOM429
rate_limit_retry_after_s = 2.0
server_error_prob = 0.05

[quotas.llm]
concurrency = 200

[retry]
strategy = "full_jitter"
base_s = 1.0
cap_s = 20
max_attempts = 8

[[workloads]]
type = "poisson"
provider = "llm"
rate_per_s = 5
distinct_inputs = 2000
[workloads.cost]
dist = "lognormal"
mean = 300
sigma = 0.5
output_fraction = 0.3
"""


def _scenario(folder: Path, duration: float, *, server: int = 6000, random429: float = 0.08) -> Path:
    text = TRUTH.replace("DURATION", repr(duration)).replace("SERVER", str(server))
    path = folder / "truth.toml"
    path.write_text(text.replace("RANDOM429", repr(random429)))
    return path


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 600 tasks over 120 s: random 429s, 5xx, repeated inputs."""
    folder = tmp_path_factory.mktemp("intervals")
    simulate(_scenario(folder, 120), seed=1).call_log.write(folder / "log")
    return folder / "log"


PROVIDER_FIELDS = {
    "latency_base_s", "latency_per_unit_s", "latency_sigma", "server_requests_per_min", "rate_limit_prob",
    "rate_limit_retry_after_s", "server_error_prob", "timeout_prob", "quota_exhausted_prob",
    "invalid_request_prob",
}  # fmt: skip
WORKLOAD_FIELDS = {"rate_per_s", "cost.mean", "cost.sigma", "cost.output_fraction", "distinct_inputs"}


def test_every_fitted_parameter_has_an_interval_around_its_value(log: Path) -> None:
    result = calibrate(log)
    fit = result.providers["llm"]
    assert set(fit.intervals) == PROVIDER_FIELDS
    (workload,) = result.workloads
    assert set(workload.intervals) == WORKLOAD_FIELDS
    for interval in [*fit.intervals.values(), *workload.intervals.values()]:
        assert interval.low <= interval.value <= interval.high, interval
        assert interval.method and interval.n > 0
    # each interval is its own field's: the value it carries is the one the scenario got
    provider = result.scenario.providers[0]
    for key in PROVIDER_FIELDS - {"server_requests_per_min"}:
        assert fit.intervals[key].value == pytest.approx(getattr(provider, key), rel=1e-9, abs=1e-12), key
    # and the truth the log was simulated from is inside them (5% misses each is possible, but this
    # seed is fixed: a miss here means an interval far too narrow, not bad luck)
    truth = {"latency_base_s": 0.5, "latency_per_unit_s": 0.004, "latency_sigma": 0.25,
             "rate_limit_prob": 0.08, "server_error_prob": 0.05}  # fmt: skip
    for key, value in truth.items():
        assert fit.intervals[key].low <= value <= fit.intervals[key].high, (key, fit.intervals[key])
    assert workload.intervals["rate_per_s"].low <= 5 <= workload.intervals["rate_per_s"].high
    # the bootstrap is seeded: the same log, the same intervals
    assert calibrate(log).providers["llm"].intervals == fit.intervals


def test_intervals_are_printed_written_as_comments_and_reported(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, report = tmp_path / "cal.toml", tmp_path / "cal.html"
    assert main(["calibrate", str(log), "--out", str(out), "--report", str(report)]) == 0
    printed = capsys.readouterr().out
    fit = calibrate(log).providers["llm"]
    base = fit.intervals["latency_base_s"]
    line = next(line for line in printed.splitlines() if "providers.llm.latency_base_s" in line)
    assert f"= {base.value:.4g} [{base.low:.4g}, {base.high:.4g}]" in line and "bootstrap" in line
    text = out.read_text()
    assert "#   providers.llm.rate_limit_prob" in text and "Wilson score" in text
    assert "95% interval: latency_sigma" in report.read_text()
    # every fitted parameter, not just the ones named above, in all three places
    (workload,) = calibrate(log).workloads
    comments = [line for line in text.splitlines() if line.startswith("#")]
    shown = report.read_text()
    for key in fit.intervals:
        name = f"providers.llm.{key} "
        assert any(name in line for line in printed.splitlines()), f"{key} not printed"
        assert any(name in line for line in comments), f"{key} not in the scenario's comments"
        assert f"95% interval: {key}" in shown, f"{key} not in the report"
    for key in workload.intervals:
        name = f"workload llm/background {key} "
        assert any(name in line for line in printed.splitlines()), f"{key} not printed"
        assert any(name in line for line in comments), f"{key} not in the scenario's comments"
        assert f"{key} {workload.intervals[key]}" in shown, f"{key} not in the report"


def test_interval_arithmetic_matches_its_definitions() -> None:
    # Wilson: 0 of 40 is not "exactly 0": the upper end is z^2 / (n + z^2)
    zero = wilson(0, 40)
    assert zero.low == 0 and zero.high == pytest.approx(1.959963984540054**2 / (40 + 1.959963984540054**2))
    # none (or all) of n: the end is exactly 0 (or 1) for every n; 0 of 3 was [5.551e-17, 0.5615],
    # an interval that left out its own estimate
    for n in range(1, 300):
        assert wilson(0, n).low == 0.0 and wilson(n, n).high == 1.0, n
    ten = wilson(10, 100)
    assert (ten.low, ten.high) == pytest.approx((0.0552, 0.1744), abs=5e-4)  # textbook values
    rate = poisson_rate(100, 20.0)
    assert rate.value == 5 and rate.low < 5 < rate.high
    values = np.arange(100.0)
    first = bootstrap((values,), np.mean, np.random.default_rng(1), value=49.5)
    again = bootstrap((values,), np.mean, np.random.default_rng(1), value=49.5)
    assert first == again and first.low < 49.5 < first.high


def test_a_three_row_log_is_flagged_and_its_intervals_are_wide(log: Path, tmp_path: Path) -> None:
    tasks, calls = pd.read_csv(log / "tasks.csv"), pd.read_csv(log / "calls.csv")
    kept = tasks.iloc[:3]
    small = tmp_path / "three"
    small.mkdir()
    kept.to_csv(small / "tasks.csv", index=False)
    calls[calls["task_id"].isin(kept["task_id"])].to_csv(small / "calls.csv", index=False)
    result = calibrate(small)
    assert any(
        "small sample" in flag and f"< {SMALL_SAMPLE}" in flag and "llm:" in flag for flag in result.flags
    )
    assert any("small sample: 3 submissions" in flag for flag in result.flags)
    for interval in [*result.providers["llm"].intervals.values(), *result.workloads[0].intervals.values()]:
        assert math.isnan(interval.value) or interval.low <= interval.value <= interval.high, interval
    big = calibrate(log).providers["llm"].intervals
    for key in ("latency_base_s", "server_error_prob"):
        interval = result.providers["llm"].intervals[key]
        width = interval.high - interval.low
        assert math.isnan(width) or width > 3 * (big[key].high - big[key].low), (key, interval)


def test_a_trailing_partial_window_does_not_make_poisson_arrivals_bursty(tmp_path: Path) -> None:
    """Poisson arrivals at 5/s, the log cut 100.12 s after its first submission: the dispersion check
    counted a 10 s window holding 0.12 s of arrivals against a whole window's 50 expected, and
    flagged the log "burstier than Poisson" with dispersion 5.3."""
    simulate(_scenario(tmp_path, 110), seed=3).call_log.write(tmp_path / "full")
    tasks, calls = pd.read_csv(tmp_path / "full" / "tasks.csv"), pd.read_csv(tmp_path / "full" / "calls.csv")
    first = tasks["submitted_at"].min()
    kept = tasks[tasks["submitted_at"] - first <= 100.12]
    assert kept["submitted_at"].max() - first == pytest.approx(100.12, abs=0.005)  # the cut lands there
    cut = tmp_path / "cut"
    cut.mkdir()
    kept.to_csv(cut / "tasks.csv", index=False)
    calls[calls["task_id"].isin(kept["task_id"])].to_csv(cut / "calls.csv", index=False)
    result = calibrate(cut)
    assert not any("burstier" in flag for flag in result.flags), result.flags
    assert 0.5 < result.workloads[0].dispersion < 1.5


def test_one_call_size_leaves_the_latency_split_unidentified(log: Path, tmp_path: Path) -> None:
    tasks, calls = pd.read_csv(log / "tasks.csv"), pd.read_csv(log / "calls.csv")
    calls["output_units"] = calls["output_units"].where(calls["output_units"].isna(), 90)
    calls["end"] = calls["start"] + np.where(
        calls["outcome_class"] == "ok", 0.8, calls["end"] - calls["start"]
    )
    calls["latency_s"] = calls["end"] - calls["start"]
    same = tmp_path / "same"
    same.mkdir()
    tasks.to_csv(same / "tasks.csv", index=False)
    calls.to_csv(same / "calls.csv", index=False)
    result = calibrate(same)
    latency = result.providers["llm"].latency
    assert not latency.identifiable
    assert latency.per_unit_s == 0 and latency.base_s == pytest.approx(0.8)  # no split is invented
    assert any("not identifiable" in flag and "output_units = 90" in flag for flag in result.flags)
    assert math.isnan(result.providers["llm"].intervals["latency_per_unit_s"].low)
    # the same log with its real sizes does identify it
    assert calibrate(log).providers["llm"].latency.identifiable


def test_calibrate_on_an_aiqsim_run_folder_says_what_it_is(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = _scenario(tmp_path, 10)
    assert main(["run", str(scenario), "--out", str(tmp_path / "run"), "--no-charts"]) == 0
    capsys.readouterr()
    assert main(["calibrate", str(tmp_path / "run"), "--out", str(tmp_path / "x.toml")]) == 2
    err = capsys.readouterr().err
    assert "output folder of `aiqsim run`" in err and "CallLog" in err and ".write(" in err
    assert not (tmp_path / "x.toml").exists()
    with pytest.raises(CalibrationError, match="not a call log"):
        calibrate(tmp_path / "run")
    # a real call log saved in a folder that also holds a run's files is still read
    for name in ("tasks.csv", "calls.csv"):
        (tmp_path / "run" / name).write_bytes((log / name).read_bytes())
    assert calibrate(tmp_path / "run").providers["llm"].attempts > 0
