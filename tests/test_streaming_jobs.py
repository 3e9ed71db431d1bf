"""Streaming mode (``records="summary"``) with job workloads and fleets: the job and fleet summary keys
equal the full-record mode's, memory stays flat in the number of jobs."""

from __future__ import annotations

import gc
import math
import random
import tracemalloc
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from aiqsim.scheduler.events import AttemptRecord, TaskTransition
from aiqsim.sim.arrival_stream import iter_job_arrivals
from aiqsim.sim.fleet_metrics import WORKER_KEYS
from aiqsim.sim.job_metrics import JOB_SUMMARY_KEYS, LaneGrants, job_rows, summarize_jobs
from aiqsim.sim.job_stream import StreamingJobs
from aiqsim.sim.job_workloads import generate_job_arrivals
from aiqsim.sim.metrics import SUMMARY_KEYS
from aiqsim.sim.scenario import load_scenario, parse_scenario, scenario_to_dict
from aiqsim.sim.simulate import run_scenario, simulate
from aiqsim.sim.streaming import DEFAULT_RELATIVE_ERROR, RecordsNotKeptError
from aiqsim.sim.streaming_run import StreamingRun

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
PERCENTILE_KEYS = {
    *(key for key in SUMMARY_KEYS if "latency" in key or "failure_time" in key),
    *(key for key in JOB_SUMMARY_KEYS if key.startswith(("job_latency_p", "job_time_to_failure_p"))),
}


def is_percentile(key: str) -> bool:
    return (
        key in PERCENTILE_KEYS
        or (key.startswith("worker") and key.endswith("_latency_p95_s"))
        or (key.startswith("deployment_") and key.endswith("_latency_p99_s"))
    )


def assert_same_summary(full: dict[str, Any], streamed: dict[str, Any]) -> None:
    """Every key identical, but latency percentiles: within the histogram's relative error."""
    assert list(streamed) == list(full)
    for key, exact in full.items():
        got = streamed[key]
        if isinstance(exact, float) and math.isnan(exact):
            assert isinstance(got, float) and math.isnan(got), key
        elif is_percentile(key):
            assert got == pytest.approx(exact, rel=DEFAULT_RELATIVE_ERROR, abs=1e-12), key
        else:
            assert got == exact, (key, exact, got)


def quick_jobs(duration_s: float = 600.0, rate_per_s: float = 0.5, timeline_step_s: float = 5.0) -> Any:
    """Jobs of four stages on three providers (a fan-out with a fallback, two stages in parallel),
    with 429s, server errors, lost responses behind a 3 s attempt timeout, rejected inputs and
    double-clicks: a small run that goes through every path of the job accounting."""

    def provider(name: str, **extra: Any) -> dict[str, Any]:
        return {"name": name, "kind": "llm", "latency_base_s": 0.3, "latency_sigma": 0.3, **extra}

    return parse_scenario(
        {
            "scenario": {
                "name": "quick_jobs",
                "duration_s": duration_s,
                "drain_s": 600,
                "timeline_step_s": timeline_step_s,
            },
            "providers": [
                provider(
                    "a",
                    server_requests_per_min=240,
                    rate_limit_prob=0.05,
                    server_error_prob=0.05,
                    timeout_prob=0.02,
                    honours_idempotency=True,
                    price_per_1k_units=0.01,
                ),
                provider(
                    "b",
                    latency_per_unit_s=0.0005,
                    server_requests_per_min=120,
                    server_error_prob=0.05,
                    invalid_request_prob=0.03,
                    price_per_1k_units=0.02,
                ),
                # a heavy latency tail: some calls outlive their 3 s attempt timeout, billed after a retry
                provider(
                    "c",
                    latency_base_s=0.6,
                    latency_sigma=1.2,
                    server_error_prob=0.01,
                    price_per_1k_units=0.005,
                ),
            ],
            "quotas": {
                "a": {"requests_per_min": 200, "concurrency": 4},
                "b": {"requests_per_min": 100, "concurrency": 3},
                "c": {"concurrency": 4},
            },
            "retry": {
                "strategy": "full_jitter",
                "base_s": 0.5,
                "cap_s": 5,
                "max_attempts": 4,
                "attempt_timeout_s": 3,
            },
            "jobs": [
                {
                    "name": "j",
                    "stages": [
                        {
                            "name": "s1",
                            "provider": "a",
                            "size": {"dist": "lognormal", "mean": 500, "sigma": 0.3},
                        },
                        {
                            "name": "s2",
                            "provider": "b",
                            "after": ["s1"],
                            "size": {"dist": "from_stage", "stage": "s1", "ratio": 2.0},
                            "fanout": {"dist": "uniform", "low": 2, "high": 5},
                            "fallback": "c",
                        },
                        {
                            "name": "s3",
                            "provider": "a",
                            "after": ["s1"],
                            "size": {"dist": "fixed", "mean": 100},
                        },
                        {
                            "name": "s4",
                            "provider": "c",
                            "after": ["s2", "s3"],
                            "size": {"dist": "fixed", "mean": 50},
                        },
                    ],
                }
            ],
            "workloads": [
                {"type": "poisson", "job": "j", "rate_per_s": rate_per_s, "priority": "background"},
                {
                    "type": "double_click",
                    "job": "j",
                    "rate_per_s": rate_per_s / 10,
                    "clicks": 2,
                    "click_gap_s": 0.3,
                    "priority": "interactive",
                },
            ],
        },
        source="quick_jobs",
    )


# ---------------------------------------------------------------------- shipped scenarios
@pytest.mark.parametrize(
    ("seed", "window_s"),
    [(0, 3600.0), (1, 3600.0), (2, 3600.0), (0, 300.0), (2, 300.0), (1, 20.0)],
)
def test_ai_edit_pipeline_streams_the_same_job_summary(seed: int, window_s: float) -> None:
    # its video calls take ~60 s and its jobs minutes: a window shorter than that forgets only keys
    # no live task holds (the store and the providers keep a live task's key), so the run is unchanged
    full = simulate(SCENARIOS / "ai_edit_pipeline.toml", seed=seed)
    streamed = simulate(
        SCENARIOS / "ai_edit_pipeline.toml", seed=seed, records="summary", key_window_s=window_s
    )
    assert_same_summary(full.summary, streamed.summary)
    assert set(JOB_SUMMARY_KEYS) <= set(streamed.summary)
    s = full.summary
    assert s["jobs_submitted"] > 100 and s["jobs_failed"] > 0 and s["jobs_deduped"] > 0
    assert s["duplicate_cost_per_job"] > 0  # timed-out calls billed twice: the duplicate path is exercised
    pd.testing.assert_frame_equal(full.timeline, streamed.timeline, check_dtype=False)


@pytest.mark.parametrize(
    ("seed", "window_s", "overrides"),
    [
        (0, 3600.0, {}),
        (1, 30.0, {}),
        (2, 30.0, {}),
        (0, 30.0, {"fleet.quota": "split"}),
        (1, 30.0, {"fleet.routing": "round_robin"}),
    ],
)
def test_fleet_uneven_load_streams_the_same_fleet_summary(
    seed: int, window_s: float, overrides: dict[str, Any]
) -> None:
    path = SCENARIOS / "fleet_uneven_load.toml"
    full = simulate(path, seed=seed, overrides=overrides)
    streamed = simulate(path, seed=seed, overrides=overrides, records="summary", key_window_s=window_s)
    assert_same_summary(full.summary, streamed.summary)
    workers = full.summary["fleet_workers"]
    assert workers == 4 and all(f"worker{i}_{k}" in streamed.summary for i in range(4) for k in WORKER_KEYS)
    assert full.summary["fleet_utilization"] > 0.5


@pytest.mark.parametrize(("seed", "window_s"), [(0, 3600.0), (1, 30.0)])
def test_pipeline_over_deployments_streams_the_same_job_and_deployment_summary(
    seed: int, window_s: float
) -> None:
    # a job stage on a route: its calls counted per deployment by both result modes alike
    path = SCENARIOS / "pipeline_over_deployments.toml"
    full = simulate(path, seed=seed)
    streamed = simulate(path, seed=seed, records="summary", key_window_s=window_s)
    assert_same_summary(full.summary, streamed.summary)
    assert set(JOB_SUMMARY_KEYS) <= set(streamed.summary)
    assert 0 < full.summary["deployment_east_call_share"] < full.summary["deployment_west_call_share"]


def test_every_shipped_scenario_with_jobs_or_a_fleet_is_covered_here() -> None:
    # a new shipped scenario with jobs or a fleet must be added to the parametrisations above
    found = set()
    for path in SCENARIOS.glob("*.toml"):
        scenario = load_scenario(path)
        if scenario.fleet.workers > 1 or any(w.job is not None for w in scenario.workloads):
            found.add(path.stem)
    assert found == {"ai_edit_pipeline", "fleet_uneven_load", "pipeline_over_deployments"}


def test_fleet_with_refusals_and_duplicates_streams_the_same_fleet_summary() -> None:
    # refused submissions count as offered load, tasks deduplicated against another do not
    data = scenario_to_dict(load_scenario(SCENARIOS / "fleet_uneven_load.toml"))
    data["dispatch"]["background_limit"] = 15
    data["dispatch"]["interactive_limit"] = 15
    data["workloads"].append(
        {"type": "double_click", "provider": "llm", "rate_per_s": 0.5, "clicks": 3, "click_gap_s": 0.2}
    )
    scenario = parse_scenario(data, source="fleet_refusals")
    for seed in (0, 1):
        full = simulate(scenario, seed=seed)
        streamed = simulate(scenario, seed=seed, records="summary", key_window_s=30.0)
        assert full.summary["tasks_rejected"] > 20 and full.summary["tasks_deduped"] > 20
        assert_same_summary(full.summary, streamed.summary)


def test_jobs_on_a_fleet_stream_the_same_summary() -> None:
    scenario = parse_scenario(
        {**scenario_to_dict(quick_jobs(duration_s=300.0)), "fleet": {"workers": 2, "quota": "split"}},
        source="quick_jobs_fleet",
    )
    full = simulate(scenario, seed=3)
    streamed = simulate(scenario, seed=3, records="summary", key_window_s=60.0)
    assert full.summary["jobs_submitted"] > 100 and full.summary["fleet_workers"] == 2
    assert_same_summary(full.summary, streamed.summary)


# ---------------------------------------------------------------------- settling a job's row
def _streamed_with_job_grace(scenario: Any, seed: int, grace_s: float) -> tuple[Any, dict[str, int]]:
    """A streaming run whose job accounting settles jobs ``grace_s`` after they end (the store and the
    providers keep the default hour, so the run itself is the full-record run); also the largest
    per-job state held at any sweep."""
    streaming = StreamingRun(scenario, 3600.0)
    jobs = streaming.jobs = StreamingJobs(scenario, grace_s)
    most: dict[str, int] = {}
    sweep = jobs._sweep

    def watched_sweep() -> None:
        sweep()
        for name, count in jobs.retained.items():
            most[name] = max(most.get(name, 0), count)

    jobs._sweep = watched_sweep  # type: ignore[method-assign]
    return run_scenario(scenario, seed, streaming=streaming), most


@pytest.mark.parametrize(("name", "seed"), [("quick_jobs", 0), ("quick_jobs", 1), ("ai_edit_pipeline", 2)])
def test_a_job_row_is_final_when_it_settles_whatever_the_window(name: str, seed: int) -> None:
    # with a ~0 grace a job settles as soon as its calls are recorded and the lanes' grant
    # watermark has passed its grants: a retry's grant reported late (its attempt ends after other
    # jobs end) or a timed-out call recorded by the server after the task failed must not be missed
    scenario = quick_jobs() if name == "quick_jobs" else load_scenario(SCENARIOS / f"{name}.toml")
    full = simulate(scenario, seed=seed)
    streamed, most = _streamed_with_job_grace(scenario, seed, 1e-3)
    assert_same_summary(full.summary, streamed.summary)
    assert full.summary["retries"] > 30 and full.summary["timeouts"] > 0
    # settled jobs are gone: what is held is the jobs in progress, not the run's
    assert most["jobs"] < full.summary["jobs_submitted"] / 4, most
    assert most["stage_events"] < full.summary["jobs_submitted"], most


def _crashing(data: dict[str, Any]) -> Any:
    """``data`` crashed twice: recovery re-drives the stored jobs and requeues the calls the dead
    process was running. The in-memory store outlives the process as an external one would; the
    accounting reads events, not the store, and a SQLite file made these runs 20x slower."""
    data["store"] = {"kind": "memory", "requeue_interrupted": True, "reconcile_on_restart": True}
    data["crashes"] = [{"at_s": 150, "restart_after_s": 5}, {"at_s": 320, "restart_after_s": 20}]
    return parse_scenario(data, source="crashing_jobs")


@pytest.mark.parametrize(
    ("name", "seed", "grace_s"),
    [("quick_jobs", 0, None), ("ai_edit_pipeline", 1, None), ("quick_jobs", 1, 1e-3)],
)
def test_jobs_through_crashes_and_recovery_stream_the_same_summary(
    name: str, seed: int, grace_s: float | None
) -> None:
    base = quick_jobs(duration_s=400.0) if name == "quick_jobs" else load_scenario(SCENARIOS / f"{name}.toml")
    scenario = _crashing(scenario_to_dict(base))
    full = simulate(scenario, seed=seed)
    if grace_s is None:
        streamed = simulate(scenario, seed=seed, records="summary")
    else:
        streamed, _ = _streamed_with_job_grace(scenario, seed, grace_s)
    assert full.summary["crashes"] == 2 and full.summary["jobs_submitted"] > 100
    assert_same_summary(full.summary, streamed.summary)


@pytest.mark.parametrize(
    ("after_writes", "store"),
    [(13, "memory"), (31, "memory"), (40, "memory"), (43, "memory"), (175, "memory"), (185, "group_commit")],
)
def test_jobs_through_a_crash_right_after_a_store_write_stream_the_same_summary(
    after_writes: int, store: str
) -> None:
    # the crash swallows the event of the write it follows: a stage task stored without its
    # creation event (13, 40), one stored succeeded that the events leave running (43), a job
    # stored succeeded that the events leave running (31, 175). Before, the streamed summary had
    # tasks_lost -1 or +1, or jobs_lost 1, where the full-record summary (read from the store) had 0.
    # With group commit (185), a job whose insert was staged when the process died was never
    # stored, but its creation event was emitted: jobs_submitted and jobs_lost were one too many.
    data = scenario_to_dict(quick_jobs(duration_s=120.0))
    data["store"] = {"kind": "memory", "requeue_interrupted": after_writes % 2 == 0}
    if store == "group_commit":
        data["store"].update(kind="sqlite", group_commit=True)
    data["crashes"] = [{"after_writes": after_writes, "restart_after_s": 3}]
    scenario = parse_scenario(data, source="crash_mid_write_jobs")
    full = simulate(scenario, seed=after_writes)
    streamed = simulate(scenario, seed=after_writes, records="summary")
    assert full.summary["crashes"] == 1 and full.summary["tasks_lost"] == full.summary["jobs_lost"] == 0
    assert_same_summary(full.summary, streamed.summary)


def test_lane_grants_answer_the_previous_grant_and_prune_what_no_call_needs() -> None:
    lane = LaneGrants([(5.0, "b"), (1.0, "a"), (3.0, "c")])
    lane.add(4.0, "a")  # a retry's grant, reported late
    assert lane.previous("c", 4.5) == 4.0
    assert lane.previous("a", 4.0) == 3.0  # its own grants are skipped
    assert lane.previous("x", 0.5) is None
    lane.prune(4.5)  # keeps the latest grant before the cutoff for calls granted from 4.5 on
    assert lane.owned == [(4.0, "a"), (5.0, "b")]
    assert lane.previous("b", 5.0) == 4.0


# ---------------------------------------------------------------------- full mode's own sums
def test_full_mode_job_summary_does_not_depend_on_the_order_of_the_jobs() -> None:
    # exact sums make the streaming mode (jobs in the order they settle) agree to the last bit
    result = simulate(SCENARIOS / "ai_edit_pipeline.toml", seed=1)
    rows = job_rows(
        result.scenario,
        result.job_records,
        result.records,
        result.events,
        result.executions,
        result.arrival_times,
    )
    expected = summarize_jobs(result.scenario, rows, rejected=0)
    rng = random.Random(5)
    for _ in range(5):
        rng.shuffle(rows)
        assert summarize_jobs(result.scenario, rows, rejected=0) == expected


# ---------------------------------------------------------------------- what is not kept
def test_streaming_job_result_keeps_no_job_rows() -> None:
    result = simulate(SCENARIOS / "ai_edit_pipeline.toml", seed=0, records="summary")
    assert (result.job_records, result.rejected_jobs) == ([], [])
    for table in ("jobs", "tasks"):
        with pytest.raises(RecordsNotKeptError, match="records='full'"):
            getattr(result, table)
    with pytest.raises(RecordsNotKeptError, match="stage_breakdown"):
        result.stage_breakdown()
    assert result.summary["bottleneck_stage"] == "tts"


def test_lazy_job_arrivals_are_the_generated_job_arrivals_in_the_same_order() -> None:
    data = scenario_to_dict(quick_jobs(duration_s=900.0))
    data["workloads"].append(
        {"type": "poisson", "job": "j", "rate_per_s": 0.3, "start_s": 100.0, "priority": "background"}
    )
    data["workloads"].append({"type": "burst", "job": "j", "count": 20, "start_s": 100.0, "burst_s": 5})
    data["workloads"].insert(0, {"type": "poisson", "provider": "a", "rate_per_s": 0.2})  # a call workload
    scenario = parse_scenario(data, source="job-arrivals")
    for seed in range(3):
        eager = generate_job_arrivals(scenario, seed)
        lazy = list(iter_job_arrivals(scenario, seed))
        assert len(eager) > 500
        assert lazy == eager


# ---------------------------------------------------------------------- memory
def _retained_bytes(scenario: Any, records: str) -> tuple[int, int]:
    """(jobs, bytes still traced after the run with its result alive), like benchmarks/bench_memory.py."""
    gc.collect()
    tracemalloc.start()
    try:
        result = simulate(scenario, seed=0, records=records, key_window_s=30.0)
        gc.collect()
        return result.summary["jobs_submitted"], tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def _most_held(scenario: Any) -> dict[str, int]:
    """The largest per-job state the job accounting held at any sweep of a 30 s-window streaming run."""
    streaming = StreamingRun(scenario, 30.0)
    assert streaming.jobs is not None
    jobs, most = streaming.jobs, {}
    sweep = jobs._sweep

    def watched_sweep() -> None:
        sweep()
        for name, count in jobs.retained.items():
            most[name] = max(most.get(name, 0), count)

    jobs._sweep = watched_sweep  # type: ignore[method-assign]
    run_scenario(scenario, 0, streaming=streaming)
    return most


def test_streaming_memory_is_flat_in_the_number_of_jobs() -> None:
    # N and 4N jobs (~6 calls each) at the same rate, in one timeline bin (the timeline grows with
    # the run's length over its step, by design). The full-record mode keeps every job's records and
    # rows (~19 KB per job here: the measurement sees growth); streaming mode's retained bytes grow
    # only by the latency histograms filling their log buckets (bounded, ~7,000 per histogram) and
    # by dict capacity, and what its job accounting holds is the jobs in progress, not the run's
    # 0.33 jobs/s keeps provider b (100 requests/min, ~3.5 calls per job) below its quota: a steady state
    short, long = (quick_jobs(d, rate_per_s=0.3, timeline_step_s=4_000.0) for d in (300.0, 1_200.0))
    _retained_bytes(quick_jobs(duration_s=50.0), "summary")  # imports and caches out of the way
    (n, streamed_n), (n4, streamed_4n) = _retained_bytes(short, "summary"), _retained_bytes(long, "summary")
    (_, full_n), (_, full_4n) = _retained_bytes(short, "full"), _retained_bytes(long, "full")
    assert n > 80 and n4 > 3.5 * n
    per_job_full = (full_4n - full_n) / (n4 - n)
    per_job_streamed = (streamed_4n - streamed_n) / (n4 - n)
    assert per_job_full > 10_000, per_job_full
    assert per_job_streamed < per_job_full / 10, (per_job_streamed, per_job_full)
    held_n, held_4n = _most_held(short), _most_held(long)
    for name in ("jobs", "tasks", "attempts", "stage_events", "lane_grants"):
        assert held_4n[name] <= 1.5 * held_n[name] + 10, (name, held_n, held_4n)
        assert held_4n[name] < n4 * 6 / 8, (name, held_4n)  # far from the run's ~6 calls per job


def test_cli_run_stream_runs_the_job_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    from aiqsim.cli import main

    assert main(["run", str(SCENARIOS / "ai_edit_pipeline.toml"), "--stream"]) == 0
    out, err = capsys.readouterr()
    full = simulate(SCENARIOS / "ai_edit_pipeline.toml")
    assert "jobs_succeeded" in out and "bottleneck_stage" in out
    assert str(full.summary["jobs_succeeded"]) in out
    assert "streaming run: wall" in err
    # the per-stage table comes from the streaming totals, as exact as the full mode's
    from aiqsim.cli import format_stage_breakdown

    assert format_stage_breakdown(full) in out


def test_attempts_and_transitions_of_tasks_outside_jobs_are_ignored() -> None:
    # the accumulators are fed every event of the run: calls outside any job leave no per-task state
    jobs = StreamingJobs(quick_jobs(), 10.0)
    jobs.event(TaskTransition(1.0, "t1", "k1", "a", 1, None, "queued", 0))
    jobs.event(TaskTransition(1.5, "t1", "k1", "a", 1, "queued", "running", 0))
    jobs.event(AttemptRecord("t1", "k1", "a", 1, 1.5, 2.0, "ok", "done", 1.0, 1.0, None, None))
    jobs.event(TaskTransition(2.0, "t1", "k1", "a", 1, "running", "succeeded", 1))
    assert jobs.retained["tasks"] == 0 and jobs.retained["attempts"] == 0
    assert jobs.summary(10.0)["jobs_submitted"] == 0
