"""Sweeps: deterministic rows per (point, seed), identical across engines, failures reported."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from aiqsim.sim.simulate import simulate
from aiqsim.sim.sweep import SweepError, grid_points, sweep

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "retry_storm_429.toml"
GRID = {"retry.strategy": ["exponential", "full_jitter"], "quotas.llm.requests_per_min": [100, 200]}


def test_grid_points_are_the_ordered_cartesian_product() -> None:
    points = grid_points({"a": [1, 2], "b": ["x", "y", "z"]})
    assert points[:4] == [{"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 1, "b": "z"}, {"a": 2, "b": "x"}]
    assert len(points) == 6
    with pytest.raises(ValueError, match="must be a list"):
        grid_points({"a": "oops"})


def test_one_row_equals_simulate_with_the_same_point_and_seed() -> None:
    rows = sweep(SCENARIO, GRID, seeds=[0, 1], engine="serial", progress=False)
    assert len(rows) == 8
    assert list(rows.columns[:3]) == ["retry.strategy", "quotas.llm.requests_per_min", "seed"]
    row = rows[(rows["retry.strategy"] == "full_jitter") & (rows["quotas.llm.requests_per_min"] == 200)]
    row = row[row["seed"] == 1].iloc[0]
    direct = simulate(
        SCENARIO, seed=1, overrides={"retry.strategy": "full_jitter", "quotas.llm.requests_per_min": 200}
    ).summary
    for key, value in direct.items():
        assert row[key] == pytest.approx(value, nan_ok=True), key


def test_local_processes_and_dask_give_the_same_rows_as_serial() -> None:
    serial = sweep(SCENARIO, GRID, seeds=[0, 1], engine="serial", progress=False)
    local = sweep(SCENARIO, GRID, seeds=[0, 1], engine="local", workers=2, progress=False)
    pd.testing.assert_frame_equal(serial, local)
    dask = sweep(SCENARIO, GRID, seeds=[0, 1], engine="dask", workers=2, progress=False)
    pd.testing.assert_frame_equal(serial, dask)


def test_failing_runs_are_reported_with_their_point_and_seed() -> None:
    with pytest.raises(SweepError) as caught:
        sweep(SCENARIO, {"retry.base_s": [0.5, -1.0]}, seeds=[0, 1], engine="serial", progress=False)
    error = caught.value
    assert [(f.point, f.seed) for f in error.failures] == [
        ({"retry.base_s": -1.0}, 0),
        ({"retry.base_s": -1.0}, 1),
    ]
    assert "retry.base_s" in str(error) and "seed=1" in str(error)
    assert len(error.results) == 2  # the good runs are kept


def test_progress_is_shown_on_the_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    sweep(SCENARIO, {"retry.base_s": [0.5]}, seeds=[0, 1], engine="serial", progress=True)
    err = capsys.readouterr().err
    assert "2/2" in err and "sweep retry_storm_429" in err


def test_progress_counts_the_failed_runs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SweepError):
        sweep(SCENARIO, {"retry.base_s": [-1.0]}, seeds=[0, 1], engine="serial", progress=True)
    err = capsys.readouterr().err
    assert "2/2" in err and "failed=2" in err


def test_no_progress_output_when_switched_off(capsys: pytest.CaptureFixture[str]) -> None:
    sweep(SCENARIO, {"retry.base_s": [0.5]}, seeds=[0], engine="serial", progress=False)
    assert capsys.readouterr().err == ""


def test_the_sweep_does_not_import_the_lab() -> None:
    """rooms.md: sim/ sits below lab/; the progress bar is tqdm's, not a lab module's."""
    import ast
    import importlib

    module = importlib.import_module("aiqsim.sim.sweep")  # aiqsim.sim.sweep is also the function
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imports = [node for node in ast.walk(tree) if isinstance(node, ast.Import)]
    imported |= {alias.name for node in imports for alias in node.names}
    assert not any(name and name.startswith("aiqsim.lab") for name in imported)


def test_a_dask_address_where_nobody_listens_fails_after_the_connect_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib

    sweep_module = importlib.import_module("aiqsim.sim.sweep")  # aiqsim.sim.sweep is also a function
    monkeypatch.setattr(sweep_module, "DASK_CONNECT_TIMEOUT_S", 1.0)  # 10 s in use: shortened here
    with pytest.raises(Exception, match=r"Timed out trying to connect to tcp://127\.0\.0\.1:1 after 1 s"):
        sweep(SCENARIO, GRID, seeds=[0], engine="dask", address="tcp://127.0.0.1:1", progress=False)
