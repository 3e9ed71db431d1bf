"""benchmarks/bench_baseline.py times only the scenarios the baseline commit shipped too."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_baseline.py"


def _bench_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_baseline_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_scenario_newer_than_the_baseline_is_left_out_and_named(tmp_path: Path) -> None:
    current, baseline = tmp_path / "current", tmp_path / "baseline"
    current.mkdir()
    baseline.mkdir()
    for name in ("a.toml", "b.toml", "new.toml"):
        (current / name).write_text("")
    for name in ("a.toml", "b.toml", "gone.toml"):
        (baseline / name).write_text("")
    both, skipped = _bench_module().shared_scenarios(current, baseline)
    assert both == [str(current / "a.toml"), str(current / "b.toml")]
    assert skipped == ["new"]


def test_each_round_is_paired_with_its_own_other_side() -> None:
    baseline = [{"a": 2.0, "b": 2.0}, {"a": 9.0, "b": 3.0}]
    current = [{"a": 1.0, "b": 1.0}, {"a": 3.0, "b": 3.0}]
    assert _bench_module().paired_ratios(baseline, current) == [2.0, 2.0]
