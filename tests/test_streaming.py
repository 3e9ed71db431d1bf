"""Streaming result mode (``simulate(..., records="summary")``): the same summary as the full-record
mode, no per-task records kept, memory bounded by the key window."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from aiqsim.core.errors import ConfigurationError
from aiqsim.sim.arrival_stream import iter_arrivals
from aiqsim.sim.metrics import SUMMARY_KEYS
from aiqsim.sim.recent_keys import RecentKeys
from aiqsim.sim.scenario import load_scenario, parse_scenario, scenario_to_dict
from aiqsim.sim.simulate import run_scenario, simulate
from aiqsim.sim.streaming import (
    DEFAULT_RELATIVE_ERROR,
    ExactSum,
    RecordsNotKeptError,
    RelativeErrorHistogram,
)
from aiqsim.sim.workloads import generate_arrivals

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
PERCENTILE_KEYS = {key for key in SUMMARY_KEYS if "latency" in key or "failure_time" in key or "ttft" in key}


def assert_same_summary(full: dict[str, float], streamed: dict[str, float]) -> None:
    """Identical where exact; percentiles within the histogram's relative error."""
    assert list(streamed) == list(full)
    for key, exact in full.items():
        got = streamed[key]
        if isinstance(exact, float) and math.isnan(exact):
            assert math.isnan(got), key
        elif key in PERCENTILE_KEYS:
            assert got == pytest.approx(exact, rel=DEFAULT_RELATIVE_ERROR, abs=1e-12), key
        else:
            assert got == exact, key


@pytest.mark.parametrize(
    ("name", "seed", "window_s"),
    [
        ("double_click_storm", 0, 3600.0),
        ("double_click_storm", 3, 20.0),
        ("retry_storm_429", 1, 3600.0),
        ("retry_storm_429", 2, 30.0),
        ("timeout_duplicate_billing", 0, 30.0),
        ("crash_recovery", 4, 30.0),
        ("sjf_vs_fifo", 5, 3600.0),
        ("streaming_ttft", 2, 30.0),
    ],
)
def test_streaming_summary_and_timeline_match_full_mode(name: str, seed: int, window_s: float) -> None:
    # short windows make the store, the provider and the accumulators forget finished keys mid-run
    full = simulate(SCENARIOS / f"{name}.toml", seed=seed)
    streamed = simulate(SCENARIOS / f"{name}.toml", seed=seed, records="summary", key_window_s=window_s)
    assert_same_summary(full.summary, streamed.summary)
    assert full.summary["tasks_submitted"] > 100
    pd.testing.assert_frame_equal(full.timeline, streamed.timeline, check_dtype=False)


def test_streaming_result_keeps_no_per_task_records() -> None:
    result = simulate(SCENARIOS / "sjf_vs_fifo.toml", seed=0, records="summary")
    assert (result.records, result.executions, result.events, result.arrival_times) == ([], [], [], {})
    for table in ("tasks", "calls", "call_log", "jobs"):
        with pytest.raises(RecordsNotKeptError, match="records='full'"):
            getattr(result, table)
    assert isinstance(RecordsNotKeptError("x"), ConfigurationError | AttributeError)


def test_streaming_mode_refuses_what_it_does_not_cover() -> None:
    # job workloads and fleets are streamed (tests/test_streaming_jobs.py); a live run's providers are not
    with pytest.raises(ConfigurationError, match="providers supplied by the caller"):
        run_scenario(load_scenario(SCENARIOS / "sjf_vs_fifo.toml"), 0, records="summary", providers=[])
    with pytest.raises(ConfigurationError, match="records: expected 'full' or 'summary'"):
        simulate(SCENARIOS / "sjf_vs_fifo.toml", records="rows")
    with pytest.raises(ConfigurationError, match="key_window_s"):
        simulate(SCENARIOS / "sjf_vs_fifo.toml", records="summary", key_window_s=0)


def _steady(rate_per_s: float, duration_s: float, **workload: object) -> object:
    """A one-provider scenario with a Poisson (or given) workload, quick calls, no server limits."""
    return parse_scenario(
        {
            "scenario": {"name": "steady", "duration_s": duration_s, "drain_s": 120, "timeline_step_s": 10},
            "providers": [{"name": "llm", "kind": "llm", "latency_base_s": 0.2, "latency_sigma": 0.2}],
            "quotas": {"llm": {"concurrency": 64}},
            "workloads": [
                {"type": "poisson", "provider": "llm", "rate_per_s": rate_per_s, **workload},
            ],
        },
        source="steady",
    )


def test_retained_state_is_bounded_by_the_window_not_the_run() -> None:
    scenario = _steady(5.0, 400.0)
    stores = []
    result = run_scenario(
        scenario,
        1,
        records="summary",
        key_window_s=10.0,
        on_new_scheduler=lambda scheduler: stores.append(scheduler.store.inner),
    )
    tasks = result.summary["tasks_submitted"]
    assert tasks > 1_800 and result.summary["tasks_succeeded"] == tasks
    # ~5 tasks/s: the window holds ~50 tasks; the store is purged every half window (<= 1.5 windows)
    retained = result.streaming.summary.retained
    assert retained["tasks"] < 150 and retained["keys"] < 150, retained
    assert len(stores[0]) < 150
    full_stores = []
    run_scenario(scenario, 1, on_new_scheduler=lambda scheduler: full_stores.append(scheduler.store.inner))
    assert len(full_stores[0]) == tasks  # the default mode keeps every record


@pytest.mark.parametrize(("gap_s", "window_s", "deduped"), [(50.0, 100.0, 1), (50.0, 10.0, 0)])
def test_duplicates_inside_the_window_are_deduplicated_as_in_full_mode(
    gap_s: float, window_s: float, deduped: int
) -> None:
    # two submissions of one input, gap_s apart: the second dedups against the first's stored result
    # while the key is remembered, and runs (and bills) again once the window has forgotten it
    scenario = parse_scenario(
        {
            "scenario": {"name": "twice", "duration_s": 200, "drain_s": 60},
            "providers": [{"name": "llm", "kind": "llm", "latency_base_s": 0.5, "honours_idempotency": True}],
            "workloads": [
                {"type": "burst", "provider": "llm", "count": 2, "burst_s": 2 * gap_s, "distinct_inputs": 1}
            ],
        },
        source="twice",
    )
    full = simulate(scenario, seed=0)
    streamed = simulate(scenario, seed=0, records="summary", key_window_s=window_s)
    assert full.summary["tasks_deduped"] == 1
    assert streamed.summary["tasks_deduped"] == deduped
    assert streamed.summary["billed_calls"] == 2 - deduped
    if deduped:
        assert_same_summary(full.summary, streamed.summary)


def _crash_after_write(after_writes: int, store: str) -> Any:
    """Double clicks on an idempotent provider, the process killed right after store write
    ``after_writes`` (a submission's insert, a duplicate's, a terminal update, ...)."""
    return parse_scenario(
        {
            "scenario": {"name": "crash_mid_write", "duration_s": 20, "drain_s": 300},
            "providers": [
                {"name": "llm", "latency_base_s": 0.5, "latency_per_unit_s": 0.0, "honours_idempotency": True}
            ],
            "quotas": {"llm": {"concurrency": 4}},
            "workloads": [
                {"type": "double_click", "provider": "llm", "rate_per_s": 2, "clicks": 2, "click_gap_s": 0.2}
            ],
            "store": {"kind": store, "requeue_interrupted": True},
            "crashes": [{"after_writes": after_writes, "restart_after_s": 2}],
        },
        source="crash_mid_write",
    )


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_a_crash_right_after_a_store_write_streams_the_same_summary(store: str) -> None:
    # the write a crash follows lands in the store, but the dead process never emits its event:
    # a submission stored without its creation event, a task stored succeeded still running in
    # the event stream. Streaming mode used to count tasks_lost -1 or +1 for each of these.
    for after_writes in range(20, 36):
        scenario = _crash_after_write(after_writes, store)
        full = simulate(scenario, seed=0)
        streamed = simulate(scenario, seed=0, records="summary")
        assert full.summary["crashes"] == 1 and full.summary["tasks_lost"] == 0
        assert_same_summary(full.summary, streamed.summary)


def test_a_crash_that_loses_group_committed_submissions_streams_the_same_summary() -> None:
    # with group commit, the submissions staged when the process died were never stored, but their
    # creation events had been emitted: the stream counted 60 tasks (30 of them lost) where the
    # store, and so the full-record summary, has 30
    scenario = parse_scenario(
        {
            "scenario": {"name": "group_commit_crash", "duration_s": 30, "drain_s": 0},
            "providers": [
                {"name": "llm", "latency_base_s": 0.1, "latency_sigma": 1.5, "server_error_prob": 0.2}
            ],
            "quotas": {"llm": {"concurrency": 64}},
            "retry": {"max_attempts": 1},
            "workloads": [
                {"type": "burst", "provider": "llm", "count": 30, "start_s": 17.7},
                {"type": "burst", "provider": "llm", "count": 30, "start_s": 14.2, "priority": "interactive"},
            ],
            "store": {"kind": "sqlite", "group_commit": True},
            "crashes": [{"at_s": 3.8, "restart_after_s": 5}, {"after_writes": 50, "restart_after_s": 2}],
        },
        source="group_commit_crash",
    )
    full = simulate(scenario, seed=354)
    streamed = simulate(scenario, seed=354, records="summary")
    assert full.summary["crashes"] == 2 and full.summary["tasks_submitted"] == 30
    assert_same_summary(full.summary, streamed.summary)


def test_a_key_window_shorter_than_a_retry_gap_keeps_the_running_task_key() -> None:
    # a lost response keeps the client waiting for its 10 s attempt timeout: with a 5 s window the
    # provider forgot the key of the task still running, so its retry drew the first attempt's
    # outcome again (lost again: 40 tasks failed, 0 in full mode) and was billed again (120
    # duplicate bills, 0 in full mode). A key in use by a live task is activity, as in the store.
    scenario = parse_scenario(
        {
            "scenario": {"name": "lost", "duration_s": 60, "drain_s": 600},
            "providers": [
                {
                    "name": "llm",
                    "latency_base_s": 0.5,
                    "latency_per_unit_s": 0.0,
                    "timeout_prob": 0.3,
                    "honours_idempotency": True,
                }
            ],
            "retry": {"attempt_timeout_s": 10, "max_attempts": 4, "base_s": 0.5, "cap_s": 2},
            "workloads": [{"type": "poisson", "provider": "llm", "rate_per_s": 2}],
        },
        source="lost",
    )
    full = simulate(scenario, seed=0)
    streamed = simulate(scenario, seed=0, records="summary", key_window_s=5.0)
    assert full.summary["timeouts"] > 20 and full.summary["tasks_failed"] == 0
    assert_same_summary(full.summary, streamed.summary)


def test_lazy_arrivals_are_the_generated_arrivals_in_the_same_order() -> None:
    day = scenario_to_dict(load_scenario(SCENARIOS / "long" / "day_at_100_per_s.toml"))
    day["scenario"]["duration_s"] = 3 * 3600
    day["workloads"] = day["workloads"][:3]
    for workload in day["workloads"]:
        workload["rate_per_s"] = 0.5  # three hourly workloads, small
    day["workloads"][1]["start_s"] = 1000.0  # overlapping the first: the merge must interleave them
    day["workloads"].append(
        {"type": "burst", "provider": "llm", "count": 50, "start_s": 1000.0, "burst_s": 5}
    )
    scenario = parse_scenario(day, source="day-slice")
    for seed in range(3):
        eager = generate_arrivals(scenario, random.Random(f"{seed}:workload"))
        lazy = list(iter_arrivals(scenario, random.Random(f"{seed}:workload")))
        assert len(eager) > 5_000
        assert lazy == eager


def test_day_scenario_is_100_calls_per_second_over_24_hours() -> None:
    day = load_scenario(SCENARIOS / "long" / "day_at_100_per_s.toml")
    assert day.duration_s == 86_400
    expected = sum(w.rate_per_s * ((w.end_s or day.duration_s) - w.start_s) for w in day.workloads)
    assert expected == pytest.approx(8_640_000)
    rates = [w.rate_per_s for w in day.workloads]
    assert min(rates) == pytest.approx(50) and max(rates) == pytest.approx(150)


# ---------------------------------------------------------------------- the accumulators alone
def test_exact_sum_is_fsum_in_any_order() -> None:
    rng = random.Random(7)
    terms = [rng.lognormvariate(-6, 2) * rng.choice((1, 1, 1e8)) for _ in range(2_000)]
    for _ in range(5):
        rng.shuffle(terms)
        total = ExactSum()
        for term in terms:
            total.add(term)
        assert total.value == math.fsum(terms)
    assert ExactSum().value == 0.0


@pytest.mark.parametrize("relative_error", [1e-3, 1e-2])
def test_histogram_percentiles_are_within_the_relative_error_of_numpy(relative_error: float) -> None:
    rng = random.Random(11)
    values = [rng.lognormvariate(0, 1.5) for _ in range(5_000)] + [0.0] * 30
    gone = values[:500]
    histogram = RelativeErrorHistogram(relative_error)
    for value in values:
        histogram.add(value)
    for value in gone:  # removal restores exactly the histogram of what is left
        histogram.remove(value)
    kept = values[500:]
    assert histogram.count == len(kept)
    qs = [0, 1, 25, 50, 90, 95, 99, 99.9, 100]
    for q, got in zip(qs, histogram.percentiles(qs), strict=True):
        exact = float(np.percentile(kept, q))
        assert abs(got - exact) <= relative_error * exact + 1e-15, q
    assert math.isnan(RelativeErrorHistogram().percentile(50))
    with pytest.raises(ConfigurationError):
        RelativeErrorHistogram(0)


def test_histogram_orders_negative_zero_and_positive_values() -> None:
    histogram = RelativeErrorHistogram()
    for value in (-2.0, -1.0, 0.0, 1.0, 2.0):
        histogram.add(value)
    assert histogram.percentiles([0, 50, 100]) == pytest.approx([-2.0, 0.0, 2.0], rel=1e-3)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_histogram_refuses_a_value_that_is_not_a_finite_number(value: float) -> None:
    # a NaN was counted as a zero (the median of 1, NaN, 3 came out ~1 where numpy says NaN) and
    # an infinity raised OverflowError from math.ceil; neither is a latency
    histogram = RelativeErrorHistogram()
    histogram.add(1.0)
    with pytest.raises(ConfigurationError, match="finite"):
        histogram.add(value)
    assert histogram.count == 1 and histogram.percentile(50) == pytest.approx(1.0, rel=2e-3)


def test_recent_keys_forget_keys_silent_for_the_window() -> None:
    keys: RecentKeys[str] = RecentKeys(10.0)
    keys.touch("a", 0.0)
    keys.touch("b", 5.0)
    keys.touch("a", 8.0)  # a is active again: its window restarts
    assert keys.expired(15.0) == []
    assert keys.expired(15.5) == ["b"]
    assert "a" in keys and len(keys) == 1
    assert keys.expired(18.0) == []
    assert keys.expired(18.1) == ["a"]
    assert len(keys) == 0


def test_cli_run_stream_prints_the_summary_and_what_the_run_cost(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from aiqsim.cli import main

    assert main(["run", str(SCENARIOS / "sjf_vs_fifo.toml"), "--stream", "--key-window", "60"]) == 0
    out, err = capsys.readouterr()
    full = simulate(SCENARIOS / "sjf_vs_fifo.toml")
    assert "tasks_succeeded" in out and str(full.summary["tasks_succeeded"]) in out
    assert "streaming run: wall" in err and "peak RSS" in err and "MB" in err
    assert "86,400" not in err  # the bar counts this scenario's horizon
    assert main(["run", str(SCENARIOS / "sjf_vs_fifo.toml"), "--stream", "--out", str(tmp_path / "x")]) == 2
    assert "--out with --stream" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


BAD_WINDOW = "--key-window: expected a finite number of seconds >= 1 (how long a key is remembered)"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--stream", "--key-window", "0"], f"{BAD_WINDOW}, got 0.0"),
        (["--stream", "--key-window", "1e-6"], f"{BAD_WINDOW}, got 1e-06"),  # purged every 0.5 µs: hung
        (["--stream", "--key-window", "nan"], f"{BAD_WINDOW}, got nan"),
        (["--stream", "--key-window=-5"], f"{BAD_WINDOW}, got -5.0"),
        (["--key-window", "60"], "--key-window only applies with --stream"),
    ],
)
def test_cli_run_refuses_a_bad_or_ignored_key_window_before_simulating(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    """Regression: the error named key_window_s and came after "simulating...", and without --stream
    the flag was silently ignored."""
    from aiqsim.cli import main

    assert main(["run", str(SCENARIOS / "sjf_vs_fifo.toml"), *argv]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"aiqsim run: error: {message}") and err.count("\n") == 1  # one line
    assert out == "" and "simulating" not in err  # before any work


def test_progress_bar_reports_the_virtual_clock_without_tqdm() -> None:
    import io

    from aiqsim.lab.run_progress import ProgressBar

    stream = io.StringIO()
    bar = ProgressBar(stream, use_tqdm=False)
    bar(0.0, 200.0)
    bar(200.0, 200.0)
    bar.close()
    lines = stream.getvalue()
    assert "simulated 0 / 200 s (  0.0%)" in lines and "simulated 200 / 200 s (100.0%)" in lines
    assert lines.endswith("\n")


def test_the_day_scenario_is_not_among_the_scenarios_every_test_runs_in_full_mode() -> None:
    # tests/test_shipped_scenarios.py and the benchmarks run every scenarios/*.toml with full records;
    # 8.64M tasks there would take hours and ~23 GB, so the day lives in scenarios/long/
    assert not list(SCENARIOS.glob("day_at_100_per_s*.toml"))
    text = (SCENARIOS / "long" / "day_at_100_per_s.toml").read_text(encoding="utf-8")
    assert text.startswith("#:schema ../scenario.schema.json\n") and "--stream" in text
