"""``aiqsim calibrate LOG --arrivals replay`` ("replay the log, or a fitted Poisson/burst
model"): the calibrated scenario's workloads replay the log's own submit times from a CSV kept next
to the scenario, `aiqsim validate` accepts it, and a run of it submits exactly what the log shows.
Also the notebook form of the calibration report (``--report report.ipynb``)."""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from aiqsim.cli import main
from aiqsim.core.errors import ConfigurationError
from aiqsim.lab.calibrate import CalibrationError, calibrate
from aiqsim.sim import simulate
from aiqsim.sim.scenario import ScenarioError, load_scenario
from aiqsim.sim.workloads import generate_arrivals

SCENARIO = """
[scenario]
name = "bursty"
seed = 2
duration_s = 60

[[providers]]
name = "llm"
latency_base_s = 0.3
latency_per_unit_s = 0.001
server_requests_per_min = 240
rate_limit_prob = 0.05

[[workloads]]
type = "burst"
provider = "llm"
count = 40
start_s = 5
burst_s = 2
distinct_inputs = 25

[[workloads]]
type = "poisson"
provider = "llm"
priority = "interactive"
rate_per_s = 1.5
[workloads.cost]
dist = "lognormal"
mean = 300
sigma = 0.5
"""
"""A burst on top of Poisson traffic, with repeated inputs: what a fitted Poisson model smooths away."""


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    folder = tmp_path_factory.mktemp("replay")
    (folder / "bursty.toml").write_text(SCENARIO)
    simulate(folder / "bursty.toml", seed=7).call_log.write(folder / "log")
    return folder / "log", pd.read_csv(folder / "log" / "tasks.csv")


def _submits(tasks: pd.DataFrame) -> dict[str, np.ndarray]:
    return {p: np.sort(g["submitted_at"].to_numpy(float)) for p, g in tasks.groupby("priority")}


def test_a_replayed_scenario_submits_the_logs_arrivals_exactly(
    logged: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    log, tasks = logged
    out = tmp_path / "scenario" / "mine.toml"
    out.parent.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "aiqsim", "calibrate", str(log), "--out", str(out), "--arrivals", "replay"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert main(["validate", str(out)]) == 0
    document = tomllib.loads(out.read_text())
    assert {w["type"] for w in document["workloads"]} == {"replay"}
    # kept next to the scenario and named relative to it: the folder can move
    for workload in document["workloads"]:
        assert not Path(workload["arrivals"]).is_absolute()
        assert (out.parent / workload["arrivals"]).is_file()
    moved = tmp_path / "moved"
    shutil.move(out.parent, moved)
    scenario = load_scenario(moved / "mine.toml")

    origin = tasks["submitted_at"].min()
    want = {p: times - origin for p, times in _submits(tasks).items()}
    arrivals = generate_arrivals(scenario, random.Random(0))
    assert len(arrivals) == len(tasks)
    for priority, times in want.items():
        got = np.sort([a.time for a in arrivals if a.priority == priority])
        assert np.array_equal(got, times)  # exactly: offsets go through the CSV by repr
    # a run of it: the same submissions, and the repeated inputs repeat (same keys -> deduplicated)
    result = simulate(moved / "mine.toml", seed=1)
    rerun = result.call_log.as_dicts()[0]
    replayed = pd.DataFrame(rerun)
    for priority, times in want.items():
        got = np.sort(replayed.loc[replayed["priority"] == priority, "submitted_at"].to_numpy(float))
        assert np.array_equal(got, times)
    assert (replayed["status"] == "deduped").sum() == (tasks["status"] == "deduped").sum() > 0


def test_fitted_arrivals_stay_the_default_and_bad_replay_arguments_are_refused(
    logged: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    log, _ = logged
    fitted = calibrate(log)
    assert {w.type for w in fitted.scenario.workloads} == {"poisson"}
    with pytest.raises(ConfigurationError, match="replay_dir"):
        calibrate(log, arrivals="replay")
    with pytest.raises(ConfigurationError, match="duration_s"):
        calibrate(log, arrivals="replay", replay_dir=tmp_path, duration_s=100)
    with pytest.raises(ConfigurationError, match="arrivals"):
        calibrate(log, arrivals="poisson")  # type: ignore[arg-type]


def test_a_broken_arrivals_file_is_named_by_validate(
    logged: tuple[Path, pd.DataFrame], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log, _ = logged
    result = calibrate(log, arrivals="replay", replay_dir=tmp_path, replay_stem="mine.arrivals")
    result.write(tmp_path / "mine.toml")
    (csv_path,) = tmp_path.glob("mine.arrivals.llm.interactive.csv")
    lines = csv_path.read_text().splitlines()
    csv_path.write_text("\n".join([*lines[:3], "soon,1,2,x", *lines[3:]]) + "\n")
    assert main(["validate", str(tmp_path / "mine.toml")]) == 2
    error = capsys.readouterr().err
    assert "mine.arrivals.llm.interactive.csv" in error and "line 4" in error
    csv_path.unlink()
    with pytest.raises(ScenarioError, match="no such file"):
        load_scenario(tmp_path / "mine.toml")


def _edited_log(log: Path, folder: Path, edit) -> Path:
    """A copy of the call log at ``log`` in ``folder`` whose tasks table ``edit`` changed."""
    shutil.copytree(log, folder)
    tasks = edit(pd.read_csv(folder / "tasks.csv"))
    tasks.to_csv(folder / "tasks.csv", index=False)
    return folder


def _with_uncalled_provider(tasks: pd.DataFrame) -> pd.DataFrame:
    """Three tasks of a provider "img" that never reached a call (cancelled before dispatch)."""
    extra = tasks.head(3).copy()
    extra["task_id"], extra["key"] = ["x1", "x2", "x3"], ["k1", "k2", "k3"]
    extra["provider"], extra["status"], extra["attempts"] = "img", "cancelled", 0
    extra[["started_at", "finished_at", "latency_s"]] = np.nan
    return pd.concat([tasks, extra], ignore_index=True)


def _with_huge_task(tasks: pd.DataFrame) -> pd.DataFrame:
    """One task whose cost estimate (1e13 units) no replayed arrival may carry (at most 1e12)."""
    tasks.loc[len(tasks) // 2, "cost_estimate"] = 1e13
    return tasks


def test_a_failed_replay_calibration_writes_nothing(
    logged: tuple[Path, pd.DataFrame], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the arrivals CSVs were rewritten before the calibrated scenario was checked, so a failed run
    # replaced the previous run's arrivals under its unchanged scenario; now every check comes first
    log, _ = logged
    out = tmp_path / "out" / "mine.toml"
    out.parent.mkdir()
    assert main(["calibrate", str(log), "--out", str(out), "--arrivals", "replay"]) == 0
    before = {path.name: path.read_bytes() for path in out.parent.iterdir()}
    assert len(before) == 3  # the scenario and one arrivals CSV per priority
    capsys.readouterr()

    uncalled = _edited_log(log, tmp_path / "uncalled", _with_uncalled_provider)
    assert main(["calibrate", str(uncalled), "--out", str(out), "--arrivals", "replay"]) == 2
    error = capsys.readouterr().err  # was a KeyError: 'img'
    assert f"{uncalled}: provider 'img' has 3 task(s)" in error and "nothing was written" in error
    assert {path.name: path.read_bytes() for path in out.parent.iterdir()} == before

    huge = _edited_log(log, tmp_path / "huge", _with_huge_task)
    assert main(["calibrate", str(huge), "--out", str(out), "--arrivals", "replay"]) == 2
    error = capsys.readouterr().err  # names the file it would have written, not a staging copy
    assert "cost_estimate" in error and "nothing was written" in error
    assert str(out.parent.resolve() / "mine.arrivals.llm.") in error and "aiqsim-calibrate-" not in error
    assert {path.name: path.read_bytes() for path in out.parent.iterdir()} == before


def test_a_provider_with_tasks_but_no_calls_is_named_in_fitted_mode_too(
    logged: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    log, _ = logged
    uncalled = _edited_log(log, tmp_path / "uncalled", _with_uncalled_provider)
    with pytest.raises(
        CalibrationError, match=r"uncalled: provider 'img' has 3 task\(s\) in tasks but no call"
    ):
        calibrate([log, uncalled])  # was "workloads[0].provider: expected the name of a declared provider"


@pytest.mark.notebook
def test_the_report_as_a_notebook_opens_and_runs_headless(
    logged: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    from aiqsim.lab.calibration_report import write_calibration_report
    from aiqsim.lab.notebook_runs import run_notebook

    log, _ = logged
    calibration = calibrate(log, arrival_bins=2)
    path = write_calibration_report(calibration, tmp_path / "report.ipynb")
    book = nbformat.read(path, as_version=4)
    nbformat.validate(book)
    text = "".join(cell.source for cell in book.cells if cell.cell_type == "markdown")
    assert "## Flags" in text and "Provider llm" in text and "Workload llm/background" in text
    drawn = [o for cell in book.cells if cell.cell_type == "code" for o in cell.outputs]
    # one chart per provider and per workload, already drawn when the report was written
    assert sum("image/png" in o.get("data", {}) for o in drawn) == 1 + len(calibration.workloads)
    # and "Run all" redraws them from the logs, named in the cell tagged "parameters"
    executed = run_notebook(path, parameters=f"LOGS = [{str(log)!r}]", timeout_s=300)
    outputs = [o for cell in executed.cells if cell.cell_type == "code" for o in cell.outputs]
    assert [o for o in outputs if o.get("output_type") == "error"] == []
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 1 + len(calibration.workloads)
