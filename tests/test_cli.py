"""The command line as a user runs it: real subprocesses, exit codes, files, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent


def aiqsim(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiqsim", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_version() -> None:
    result = aiqsim("--version")
    assert result.returncode == 0 and result.stdout.startswith("aiqsim ")


def test_run_prints_the_summary_and_writes_tables_and_charts(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = aiqsim("run", "scenarios/double_click_storm.toml", "--seed", "4", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "tasks_deduped" in result.stdout and "latency_p99_s" in result.stdout
    for name in ("tasks.csv", "calls.csv", "timeline.csv", "summary.json"):
        assert (out / name).stat().st_size > 0
    for name in ("retry_storm_timeline.png", "latency_cdf.png", "cost_duplication.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seed"] == 4
    tasks = pd.read_csv(out / "tasks.csv")
    assert len(tasks) == summary["tasks_submitted"] + summary["tasks_rejected"]


def test_run_with_overrides_and_parquet(tmp_path: Path) -> None:
    out = tmp_path / "pq"
    result = aiqsim(
        "run", "scenarios/retry_storm_429.toml", "--set", "quotas.llm.requests_per_min=120",
        "--set", "quotas.llm.request_burst=1", "--out", str(out), "--format", "parquet", "--no-charts",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rate_limited"] == 0
    assert len(pd.read_parquet(out / "calls.parquet")) == summary["attempts"]


def test_validate_accepts_every_shipped_scenario() -> None:
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "scenarios").glob("*.toml"))
    result = aiqsim("validate", *files)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(": ok") == len(files)


def test_bad_input_gives_a_clear_message_and_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        (ROOT / "scenarios" / "retry_storm_429.toml").read_text().replace("base_s = 0.5", 'base_s = "fast"'),
        encoding="utf-8",
    )
    csv = str(tmp_path / "x.csv")
    cases = [
        (("validate", str(bad)), ["bad.toml", "retry.base_s", "number"]),
        (("run", str(bad)), ["bad.toml", "retry.base_s"]),
        (("run", "scenarios/retry_storm_429.toml", "--set", "retry.nope=1"), ["retry.nope"]),
        (("run", "scenarios/retry_storm_429.toml", "--set", "novalue"), ["KEY=VALUE"]),
        (("run", str(tmp_path / "missing.toml")), ["missing.toml"]),
        (("sweep", "scenarios/retry_storm_429.toml", "--grid", "retry.base_s", "--out", csv),
         ["KEY=V1,V2"]),
        (("sweep", "scenarios/retry_storm_429.toml", "--grid", "retry.base_s=1,-2", "--out", csv),
         ["retry.base_s", ">= 0"]),
    ]  # fmt: skip
    for args, fragments in cases:
        result = aiqsim(*args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr, args
        for fragment in fragments:
            assert fragment in result.stderr, (args, fragment, result.stderr)
    assert "fast" in bad.read_text()  # bad input is never rewritten


def test_sweep_writes_one_row_per_point_and_seed(tmp_path: Path) -> None:
    out = tmp_path / "sweep.csv"
    result = aiqsim(
        "sweep", "scenarios/double_click_storm.toml", "--grid", "retry.base_s=0.1,1.0",
        "--grid", "dispatch.policy=fifo,sjf", "--seeds", "2", "--out", str(out), "--engine", "serial",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    frame = pd.read_csv(out)
    assert len(frame) == 8
    assert set(frame["dispatch.policy"]) == {"fifo", "sjf"}
    assert set(frame["seed"]) == {0, 1}
