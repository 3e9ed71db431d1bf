"""The command line as a user runs it: real subprocesses, exit codes, files, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent


def _reject_non_json(token: str) -> None:
    raise AssertionError(f"summary.json holds {token}, which is not JSON")


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
    summary = json.loads((out / "summary.json").read_text(), parse_constant=_reject_non_json)
    assert summary["seed"] == 4
    tasks = pd.read_csv(out / "tasks.csv")
    assert len(tasks) == summary["tasks_submitted"] + summary["tasks_rejected"]


def test_run_a_pipeline_scenario_prints_job_metrics_and_writes_jobs_csv(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = aiqsim("run", "scenarios/ai_edit_pipeline.toml", "--out", str(out), "--no-charts")
    assert result.returncode == 0, result.stderr
    for key in ("job_latency_p50_s", "job_time_to_failure_p50_s", "bottleneck_stage", "cost_per_job"):
        assert key in result.stdout
    assert "ai_edit.tts" in result.stdout  # the per-stage breakdown
    summary = json.loads((out / "summary.json").read_text(), parse_constant=_reject_non_json)
    jobs = pd.read_csv(out / "jobs.csv")
    assert len(jobs) == summary["jobs_submitted"] + summary["jobs_rejected"]
    assert (jobs["status"] == "succeeded").sum() == summary["jobs_succeeded"]
    assert summary["bottleneck_stage"] == "tts"
    succeeded = jobs[jobs["status"] == "succeeded"]
    parts = succeeded[["queue_wait_s", "quota_wait_s", "retries_s", "service_s", "other_s"]].sum(axis=1)
    assert (parts - succeeded["latency_s"]).abs().max() < 1e-6  # the split adds up to the latency


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


def test_bad_output_paths_fail_before_any_simulation(tmp_path: Path) -> None:
    a_file = tmp_path / "afile"
    a_file.write_text("keep me", encoding="utf-8")
    result = aiqsim("run", "scenarios/retry_storm_429.toml", "--out", str(a_file))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "exists and is not a directory" in result.stderr
    assert "tasks_submitted" not in result.stdout  # refused before simulating
    assert a_file.read_text(encoding="utf-8") == "keep me"
    result = aiqsim(
        "sweep", "scenarios/retry_storm_429.toml", "--grid", "retry.base_s=1", "--out", str(tmp_path)
    )
    assert result.returncode == 2 and "is a directory" in result.stderr


def test_validate_reports_every_bad_file_and_checks_the_rest(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[scenario\n", encoding="utf-8")
    result = aiqsim("validate", str(bad), "scenarios/retry_storm_429.toml")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "bad.toml" in result.stderr and "line 1" in result.stderr
    assert "retry_storm_429.toml: ok" in result.stdout


def test_sweep_checks_every_combination_and_bad_options_up_front(tmp_path: Path) -> None:
    out = str(tmp_path / "s.csv")
    cases = [
        (("--grid", "retry.base_s=0.5,5", "--grid", "retry.cap_s=2,8"), ["cap_s >= base_s"]),
        (("--grid", "retry.base_s=0.5", "--workers", "-1"), ["--workers"]),
        (("--grid", "retry.base_s=0.1", "--grid", "retry.base_s=0.2"), ["given twice"]),
        (("--grid", "retry.base_s=0.1", "--address", "tcp://127.0.0.1:1"), ["--engine dask"]),
    ]
    for extra, fragments in cases:
        result = aiqsim("sweep", "scenarios/retry_storm_429.toml", *extra, "--out", out, "--engine", "serial")
        assert result.returncode == 2 and "Traceback" not in result.stderr, (extra, result.stderr)
        for fragment in fragments:
            assert fragment in result.stderr, (extra, result.stderr)
    assert not Path(out).exists()


def test_a_scenario_without_arrivals_says_so_and_still_writes_tables(tmp_path: Path) -> None:
    scenario = tmp_path / "empty.toml"
    scenario.write_text(
        (ROOT / "scenarios" / "retry_storm_429.toml")
        .read_text()
        .replace("rate_per_s = 3", "rate_per_s = 0.00001"),
        encoding="utf-8",
    )
    out = tmp_path / "out"
    result = aiqsim("run", str(scenario), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "produced no arrivals" in result.stderr
    assert "task_id" in (out / "tasks.csv").read_text().splitlines()[0]
