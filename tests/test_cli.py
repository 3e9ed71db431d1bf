"""The command line as a user runs it: real subprocesses, exit codes, files, no tracebacks."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

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


def aiqsim_each(cases: list[tuple[tuple[str, ...], list[str]]]) -> list[subprocess.CompletedProcess[str]]:
    """:func:`aiqsim` for the arguments of each case, two processes at a time (in the cases' order).

    Each case is a real ``python -m aiqsim`` process, most of whose time is importing; two at once
    keep both of the CI machine's cores busy. The cases write nothing (each is refused up front).
    """
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda case: aiqsim(*case[0]), cases))


def test_version() -> None:
    result = aiqsim("--version")
    assert result.returncode == 0 and result.stdout.startswith("aiqsim ")


def test_run_prints_the_summary_and_writes_tables_and_charts(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = aiqsim("run", "scenarios/double_click_storm.toml", "--seed", "4", "--out", str(out))
    assert result.returncode == 0, result.stderr
    for key in ("tasks_deduped", "success_latency_p99_s", "failure_time_p50_s", "goodput_per_s"):
        assert key in result.stdout
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
    for (args, fragments), result in zip(cases, aiqsim_each(cases), strict=True):
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr, args
        for fragment in fragments:
            assert fragment in result.stderr, (args, fragment, result.stderr)
    assert "fast" in bad.read_text()  # bad input is never rewritten


def test_a_max_attempts_no_retry_policy_takes_is_refused_by_name_without_a_traceback(tmp_path: Path) -> None:
    """``1e308`` is whole (a float that large has no fraction) but no attempt count: the file and
    ``--set`` are refused as the policy refuses it, naming the file and the key."""
    huge = tmp_path / "huge.toml"
    text = (ROOT / "scenarios" / "retry_storm_429.toml").read_text(encoding="utf-8")
    huge.write_text(re.sub(r"(?m)^max_attempts = \d+$", "max_attempts = 1e308", text), encoding="utf-8")
    assert "max_attempts = 1e308" in huge.read_text(encoding="utf-8")
    cases = [
        (("validate", str(huge)), ["huge.toml", "retry.max_attempts", "an integer >= 1", "1e+308"]),
        (("run", "scenarios/retry_storm_429.toml", "--set", "retry.max_attempts=1e308"),
         ["retry.max_attempts", "an integer >= 1"]),
        (("run", "scenarios/retry_storm_429.toml", "--set", f"retry.max_attempts={2**63 + 1}"),
         ["retry.max_attempts", "an integer >= 1"]),
    ]  # fmt: skip
    for (args, fragments), result in zip(cases, aiqsim_each(cases), strict=True):
        assert result.returncode == 2 and "Traceback" not in result.stderr, (args, result.stderr)
        for fragment in fragments:
            assert fragment in result.stderr, (args, fragment, result.stderr)


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


def test_validate_refuses_unusable_store_paths_and_checks_the_rest(tmp_path: Path) -> None:
    """Regression: a NUL in store.path, or a name too long for the file system, passed the loader
    and crashed validate (and run) with a raw ValueError / OSError traceback."""
    nul = _scenario_with(
        tmp_path / "nul.toml", "[retry]", '[store]\nkind = "sqlite"\npath = "a\\u0000b"\n\n[retry]'
    )
    long_name = tmp_path / ("a" * 300)
    too_long = _scenario_with(
        tmp_path / "long.toml", "[retry]", f'[store]\nkind = "sqlite"\npath = "{long_name}"\n\n[retry]'
    )
    result = aiqsim("validate", str(nul), str(too_long), "scenarios/retry_storm_429.toml")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 2, errors
    assert "nul.toml: store.path: expected a file path" in errors[0] and "NUL character" in errors[0]
    assert "long.toml: store.path:" in errors[1] and "too long" in errors[1]
    assert "retry_storm_429.toml: ok" in result.stdout
    run = aiqsim("run", str(too_long))
    assert run.returncode == 2 and "Traceback" not in run.stderr and "store.path" in run.stderr
    assert "simulating" not in run.stderr  # refused before any work


@pytest.mark.parametrize(
    "args",
    [("run", "scenarios/retry_storm_429.toml"), ("schema",), ("validate", "scenarios/retry_storm_429.toml")],
)
def test_a_closed_pipe_ends_the_command_quietly(args: tuple[str, ...]) -> None:
    """Regression: ``aiqsim run x.toml | head -1`` ended with a BrokenPipeError traceback."""
    process = subprocess.Popen(
        [sys.executable, "-m", "aiqsim", *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before the first line
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=300) == 141, stderr  # 128 + SIGPIPE, as for a program SIGPIPE ended
    assert "Traceback" not in stderr and "Exception ignored" not in stderr and "error" not in stderr, stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_an_error_writing_stdout_is_one_line_and_status_1() -> None:
    """Regression: ``aiqsim schema > /dev/full`` ended with an OSError traceback."""
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "aiqsim", "schema"], cwd=ROOT, stdout=full, stderr=subprocess.PIPE,
            text=True, timeout=300, check=False,
        )  # fmt: skip
    assert result.returncode == 1
    message = "aiqsim schema: error: cannot write to standard output (No space left on device)\n"
    assert result.stderr == message


def test_output_cut_short_by_a_file_size_limit_is_an_error_not_a_truncated_success(tmp_path: Path) -> None:
    """Regression: ``ulimit -f 1; aiqsim schema > file`` exited 0 with the first 1,024 bytes: for a
    large write BufferedWriter reports a short count, which TextIOWrapper ignores."""
    import resource

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.RLIM_INFINITY))

    target = tmp_path / "schema.json"
    with target.open("w") as handle:
        result = subprocess.run(
            [sys.executable, "-m", "aiqsim", "schema"], cwd=ROOT, stdout=handle, stderr=subprocess.PIPE,
            text=True, timeout=300, check=False, preexec_fn=limit_file_size,
        )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert result.stderr == "aiqsim schema: error: cannot write to standard output (File too large)\n"


def test_sweep_checks_every_combination_and_bad_options_up_front(tmp_path: Path) -> None:
    out = str(tmp_path / "s.csv")
    cases = [
        (("--grid", "retry.base_s=0.5,5", "--grid", "retry.cap_s=2,8"), ["cap_s >= base_s"]),
        (("--grid", "retry.base_s=0.5", "--workers", "-1"), ["--workers"]),
        (("--grid", "retry.base_s=0.1", "--grid", "retry.base_s=0.2"), ["given twice"]),
        (("--grid", "providers.llm.timeout_prob=0,1", "--grid", "providers[0].timeout_prob=0.1,0.2"),
         ["providers[0].timeout_prob: addresses the same field as providers.llm.timeout_prob"]),
        (("--grid", "retry.base_s=0.1", "--address", "tcp://127.0.0.1:1"), ["--engine dask"]),
        (("--grid", "retry.base_s=0.1", "--engine", "dask", "--address", "bogus://x"),
         ["--address bogus://x: unknown address scheme 'bogus'"]),
        (("--grid", "retry.base_s=0.1", "--engine", "dask", "--address", "tcp://"),
         ["--address tcp://: expected e.g. tcp://HOST:PORT"]),
        (("--grid", "retry.base_s=0.1", "--engine", "dask", "--address", "tcp://127.0.0.1"),
         ["--address tcp://127.0.0.1: missing port number", "expected e.g. tcp://HOST:PORT"]),
        (("--grid", "retry.base_s=0.1", "--engine", "dask", "--address", "127.0.0.1:abc"),
         ["--address 127.0.0.1:abc: invalid literal"]),
    ]  # fmt: skip
    for extra, fragments in cases:  # extra last: its --engine wins
        result = aiqsim("sweep", "scenarios/retry_storm_429.toml", "--out", out, "--engine", "serial", *extra)
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


NO_PYARROW = (
    "import sys; sys.modules['pyarrow'] = None  # as if pyarrow were not installed\n"
    "from aiqsim.cli import main; sys.exit(main(sys.argv[1:]))"
)


def aiqsim_without_pyarrow(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a real subprocess in which ``import pyarrow`` fails, as on a machine without it."""
    return subprocess.run(
        [sys.executable, "-c", NO_PYARROW, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_parquet_without_pyarrow_is_refused_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "pq"
    result = aiqsim_without_pyarrow(
        "run", "scenarios/retry_storm_429.toml", "--out", str(out), "--format", "parquet"
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr  # one line
    assert "pyarrow" in result.stderr and "pip install 'aiqsim[parquet]'" in result.stderr
    assert "simulating" not in result.stderr and result.stdout == ""  # before any simulation
    assert not out.exists()
    table = tmp_path / "sweep.parquet"
    result = aiqsim_without_pyarrow(
        "sweep", "scenarios/retry_storm_429.toml", "--grid", "retry.base_s=1", "--seeds", "1",
        "--engine", "serial", "--out", str(table),
    )  # fmt: skip
    assert result.returncode == 2 and "pip install 'aiqsim[parquet]'" in result.stderr, result.stderr
    assert "sweep" not in result.stdout and not table.exists()
    # CSV needs no pyarrow: the same shim runs a CSV sweep to the end
    result = aiqsim_without_pyarrow(
        "sweep", "scenarios/double_click_storm.toml", "--grid", "retry.base_s=1", "--seeds", "1",
        "--engine", "serial", "--out", str(tmp_path / "ok.csv"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_an_output_that_cannot_be_written_leaves_the_earlier_files_untouched(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "tasks.csv").write_text("earlier run\n", encoding="utf-8")
    (out / "calls.csv").mkdir()  # a folder where the run writes a file
    result = aiqsim("run", "scenarios/retry_storm_429.toml", "--out", str(out), "--no-charts")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "calls.csv" in result.stderr and "is a directory" in result.stderr
    assert "tasks_submitted" not in result.stdout  # refused before simulating
    assert (out / "tasks.csv").read_text(encoding="utf-8") == "earlier run\n"
    assert sorted(p.name for p in out.iterdir()) == ["calls.csv", "tasks.csv"]  # no staging left behind


def special_outputs(folder: Path) -> dict[str, str]:
    """A FIFO, a symbolic link and (where this process may make one) a device node, by name."""
    made = {}
    os.mkfifo(folder / "fifo.csv")
    made["fifo.csv"] = "a device or special file"
    (folder / "target.csv").write_text("the link's target\n", encoding="utf-8")
    (folder / "link.csv").symlink_to(folder / "target.csv")
    made["link.csv"] = "a symbolic link"
    try:
        os.mknod(folder / "null.csv", 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # like /dev/null
        made["null.csv"] = "a device or special file"
    except PermissionError:
        pass
    return made


def test_an_output_path_that_is_no_regular_file_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    """--out over a device, a FIFO or a link used to put a plain file in its place (as root, over
    /dev/null itself) and exit 0; each is now refused before anything is written."""
    made = special_outputs(tmp_path)
    sweep = ("sweep", "scenarios/sjf_vs_fifo.toml", "--seeds", "1", "--engine", "serial", "--out")
    results = aiqsim_each([((*sweep, str(tmp_path / name)), []) for name in made])
    for (name, kind), result in zip(made.items(), results, strict=True):
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert f"{name}: is {kind}" in result.stderr and "Nothing was written" in result.stderr
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo.csv").st_mode)
    assert (tmp_path / "link.csv").is_symlink() and (
        tmp_path / "target.csv"
    ).read_text() == "the link's target\n"
    if "null.csv" in made:
        assert stat.S_ISCHR(os.lstat(tmp_path / "null.csv").st_mode)


def test_a_run_refuses_an_output_folder_holding_a_special_file_where_it_writes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "summary.json")
    result = aiqsim("run", "scenarios/retry_storm_429.toml", "--out", str(out), "--no-charts")
    assert result.returncode == 2 and "summary.json: is a device or special file" in result.stderr
    assert stat.S_ISFIFO(os.lstat(out / "summary.json").st_mode)
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]


def test_staged_outputs_move_into_place_only_when_all_were_written(tmp_path: Path) -> None:
    from aiqsim.lab.output_files import OutputPathError, staged_directory

    out = tmp_path / "out"
    out.mkdir()
    (out / "a.csv").write_text("old a", encoding="utf-8")
    # the body fails half-way: nothing moves
    with pytest.raises(OSError, match="disk full"), staged_directory(out) as staging:
        (staging / "a.csv").write_text("new a", encoding="utf-8")
        raise OSError("disk full")
    assert (out / "a.csv").read_text(encoding="utf-8") == "old a"
    # a folder appears at one target while the files are written: refused, nothing moves
    with pytest.raises(OutputPathError, match=r"b\.csv: is a directory"), staged_directory(out) as staging:
        (staging / "a.csv").write_text("new a", encoding="utf-8")
        (staging / "b.csv").write_text("new b", encoding="utf-8")
        (out / "b.csv").mkdir()
    assert (out / "a.csv").read_text(encoding="utf-8") == "old a"
    (out / "b.csv").rmdir()
    # all written: all moved, staging gone
    with staged_directory(out) as staging:
        (staging / "a.csv").write_text("new a", encoding="utf-8")
        (staging / "b.csv").write_text("new b", encoding="utf-8")
    assert sorted(p.name for p in out.iterdir()) == ["a.csv", "b.csv"]
    assert (out / "a.csv").read_text(encoding="utf-8") == "new a"


def _scenario_with(path: Path, old: str, new: str) -> Path:
    text = (ROOT / "scenarios" / "retry_storm_429.toml").read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new), encoding="utf-8")
    return path


def test_more_bad_input_is_refused_up_front_with_one_message(tmp_path: Path) -> None:
    huge = _scenario_with(tmp_path / "huge.toml", "rate_per_s = 3", "rate_per_s = 1e12")
    missing = tmp_path / "missing" / "dir" / "x.sqlite"
    stored = _scenario_with(
        tmp_path / "stored.toml", "[retry]", f'[store]\nkind = "sqlite"\npath = "{missing}"\n\n[retry]'
    )
    deep = tmp_path / "deep.toml"
    deep.write_text('[scenario]\nname = "x"\ndescription = ' + "[" * 500 + "]" * 500 + "\n")
    csv = tmp_path / "x.csv"
    cases = [
        (("sweep", "scenarios/retry_storm_429.toml", "--grid", "retry.base_s=1", "--seeds", "1000000000",
          "--engine", "serial", "--out", str(csv)), ["1,000,000,000 runs", "at most 100,000"]),
        (("sweep", "scenarios/retry_storm_429.toml", "--grid", "retry.base_s=1,2", "--seeds", "60000",
          "--out", str(csv)), ["120,000 runs", "at most 50,000 seeds"]),
        (("compare", "scenarios/retry_storm_429.toml", "--time-scale", "inf"),
         ["--time-scale inf", "finite"]),
        (("compare", "scenarios/retry_storm_429.toml", "--time-scale", "nan"),
         ["--time-scale nan", "finite"]),
        (("validate", str(huge)), ["workloads[0]", "rate_per_s", "at most 2,000,000"]),
        (("run", str(huge)), ["workloads[0]", "at most 2,000,000"]),
        (("run", "scenarios/retry_storm_429.toml", "--set", "store.kind=sqlite", "--set",
          f"store.path={missing}"), ["store.path", str(missing), "does not exist"]),
        (("validate", str(stored)), ["store.path", "does not exist"]),
        (("validate", str(deep)), [str(deep), "nesting too deep"]),
        (("run", "scenarios/retry_storm_429.toml", "--set", "retry.base_s=" + "[" * 600 + "]" * 600),
         ["retry.base_s", "nesting too deep"]),
    ]  # fmt: skip
    for (args, fragments), result in zip(cases, aiqsim_each(cases), strict=True):
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        one_line = result.stderr.strip().count("\n") == 0
        assert "Traceback" not in result.stderr and one_line, (args, result.stderr)
        assert "simulating" not in result.stderr and "live run" not in result.stderr, args  # before any work
        for fragment in fragments:
            assert fragment in result.stderr, (args, fragment, result.stderr)
    assert not csv.exists() and not missing.parent.exists()


def test_sweep_refuses_runs_that_would_share_one_store_file_before_any_run(tmp_path: Path) -> None:
    db = tmp_path / "sweep.db"
    stored = _scenario_with(
        tmp_path / "stored.toml", "[retry]", f'[store]\nkind = "sqlite"\npath = "{db}"\n\n[retry]'
    )
    csv = tmp_path / "s.csv"
    cases = [
        (("--seeds", "4", "--engine", "local", "--workers", "2"), ["store.path", "4 sweep runs would share"]),
        (("--seeds", "1", "--grid", "retry.base_s=0.5,1"), ["2 sweep runs would share"]),
        (("--seeds", "1", "--grid", f"store.path={tmp_path / 'a.db'},{tmp_path / '.' / 'a.db'}"),
         ["a.db", "2 sweep runs would share"]),
        (("--seeds", "1", "--grid", f"store.path={tmp_path / 'stored.toml'}"),
         ["stored.toml already exists"]),
    ]  # fmt: skip
    for extra, fragments in cases:
        result = aiqsim("sweep", str(stored), "--out", str(csv), "--engine", "serial", *extra)
        assert result.returncode == 2 and "Traceback" not in result.stderr, (extra, result.stderr)
        for fragment in fragments:
            assert fragment in result.stderr, (extra, fragment, result.stderr)
        assert "sweep retry_storm_429" not in result.stderr  # no progress bar: no run started
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stored.toml"]  # no store file, no CSV
    # one run per store file is a sweep like any other
    grid = f"store.path={tmp_path / 'a.db'},{tmp_path / 'b.db'}"
    result = aiqsim(
        "sweep", str(stored), "--out", str(csv), "--engine", "serial", "--seeds", "1", "--grid", grid
    )
    assert result.returncode == 0, result.stderr
    assert len(pd.read_csv(csv)) == 2 and (tmp_path / "a.db").exists() and (tmp_path / "b.db").exists()


def test_summary_json_writes_a_non_finite_value_as_null(tmp_path: Path) -> None:
    """Regression: an infinite cost made json.dumps raise after the run, and no summary was written."""
    from aiqsim.cli import write_outputs
    from aiqsim.sim.simulate import simulate

    result = simulate(_scenario_with(tmp_path / "s.toml", "duration_s = 120", "duration_s = 5"))
    result.summary["cost_total"] = float("inf")
    result.summary["cost_duplicated"] = float("-inf")
    write_outputs(result, tmp_path / "out", charts=False)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text(), parse_constant=_reject_non_json)
    assert summary["cost_total"] is None and summary["cost_duplicated"] is None
    assert summary["tasks_submitted"] == result.summary["tasks_submitted"]


def test_a_failed_command_leaves_no_output_folder_it_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: `run --out` and `sweep --out` created their folders up front and left them, empty,
    when the command then failed; and a sweep none of whose runs worked wrote a 1-byte partial file."""
    import importlib

    from aiqsim import cli

    sweep_module = importlib.import_module("aiqsim.sim.sweep")

    small = _scenario_with(tmp_path / "s.toml", "duration_s = 120", "duration_s = 5")
    empty = tmp_path / "empty.toml"
    empty.write_text('[scenario]\nname = "e"\n', encoding="utf-8")
    assert cli.main(["sweep", str(empty), "--out", str(tmp_path / "new" / "sub" / "s.csv")]) == 2
    assert "empty.toml: providers: missing" in capsys.readouterr().err
    kept = tmp_path / "kept"
    kept.mkdir()
    assert cli.main(["sweep", str(empty), "--out", str(kept / "s.csv")]) == 2  # a folder that was there stays

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError("boom")

    monkeypatch.setattr(sweep_module, "run_point", fail)
    assert (
        cli.main(
            [
                "sweep",
                str(small),
                "--seeds",
                "2",
                "--engine",
                "serial",
                "--out",
                str(tmp_path / "n" / "s.csv"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "2 sweep run(s) failed" in err and "no run worked; nothing was written" in err
    monkeypatch.setattr(cli, "write_outputs", fail)  # the run works, writing its files fails
    assert cli.main(["run", str(small), "--no-charts", "--out", str(tmp_path / "o" / "out")]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "cannot write (boom)" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.toml", "kept", "s.toml"]


def test_a_folder_where_jobs_csv_goes_is_refused_before_the_run(tmp_path: Path) -> None:
    """Regression: the up-front check left out jobs.csv, so this failed only after the simulation."""
    out = tmp_path / "out"
    (out / "jobs.csv").mkdir(parents=True)
    result = aiqsim("run", "scenarios/ai_edit_pipeline.toml", "--out", str(out), "--no-charts")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "jobs.csv: is a directory" in result.stderr
    assert "simulating" not in result.stderr and result.stdout == ""
    assert [p.name for p in out.iterdir()] == ["jobs.csv"]


def test_paths_the_os_refuses_are_clear_errors_without_a_traceback(tmp_path: Path) -> None:
    """Before: a file name longer than the OS allows, or a ``~user`` with no such user, in a
    command-line path or a scenario's trace path ended the command with a raw OSError or
    RuntimeError traceback (review)."""
    too_long = "a" * 300
    source = (ROOT / "scenarios" / "azure_trace_replay.toml").read_text(encoding="utf-8")
    scenarios = []
    for name, trace in (("long", "b" * 5000), ("tilde", "~no_such_user_zz/x.csv")):
        edited = "\n".join(
            f'trace = "{trace}"' if line.startswith("trace = ") else line for line in source.splitlines()
        )
        assert edited != source
        scenarios.append(tmp_path / f"{name}.toml")
        scenarios[-1].write_text(edited, encoding="utf-8")
    cases = [
        (
            (
                "sweep",
                "scenarios/retry_storm_429.toml",
                "--grid",
                "retry.base_s=1",
                "--out",
                f"{tmp_path}/{too_long}.csv",
            ),
            [],
        ),
        (("calibrate", f"{tmp_path}/{too_long}", "--out", f"{tmp_path}/fitted.toml"), []),
        (("validate", str(scenarios[0])), []),
        (("validate", str(scenarios[1])), []),
    ]
    long_out, long_log, long_trace, tilde_trace = aiqsim_each(cases)
    for result in (long_out, long_log, long_trace, tilde_trace):
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "File name too long" in long_out.stderr and "File name too long" in long_log.stderr
    assert "workloads[0].trace" in long_trace.stderr and "File name too long" in long_trace.stderr
    assert "workloads[0].trace" in tilde_trace.stderr and "home directory" in tilde_trace.stderr
    assert sorted(tmp_path.iterdir()) == sorted(scenarios)  # nothing written


@pytest.mark.skipif(
    not Path("/proc/self").is_dir(), reason="needs Linux's /proc: a folder no file can be made in"
)
def test_an_out_folder_that_cannot_take_a_file_is_refused_before_any_simulation() -> None:
    """Before: a folder that exists but cannot take a file (a read-only file system, where even
    root's permission checks pass) was found only when the results were written, after the whole
    run or sweep (review); the README promises the refusal before any long work starts."""
    run, swept = aiqsim_each(
        [
            (("run", "scenarios/retry_storm_429.toml", "--out", "/proc"), []),
            (
                (
                    "sweep",
                    "scenarios/retry_storm_429.toml",
                    "--grid",
                    "retry.base_s=1,2",
                    "--out",
                    "/proc/x.csv",
                ),
                [],
            ),
        ]
    )
    for result in (run, swept):
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert "cannot write in the directory" in result.stderr and "nothing was run" in result.stderr
        assert "simulating" not in result.stderr and "tasks_submitted" not in result.stdout
