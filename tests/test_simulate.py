"""simulate(): the real scheduler on the virtual clock, its summary and DataFrames."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import pytest

from aiqsim.sim.metrics import SUMMARY_KEYS
from aiqsim.sim.scenario import load_scenario
from aiqsim.sim.simulate import _simulation_store, simulate

BASE = """
[scenario]
name = "unit"
seed = 3
duration_s = 40

[[providers]]
name = "llm"
kind = "llm"
latency_base_s = 0.5
latency_per_unit_s = 0.002
latency_sigma = 0.2
server_requests_per_min = 90
server_units_per_min = 90000
{provider_extra}

[quotas.llm]
concurrency = 6
{quota_extra}

[retry]
strategy = "full_jitter"
base_s = 0.5
cap_s = 10
max_attempts = 6
attempt_timeout_s = 8

[[workloads]]
type = "poisson"
provider = "llm"
rate_per_s = 2.0
end_s = 40
distinct_inputs = 60

[[workloads]]
type = "double_click"
provider = "llm"
priority = "interactive"
rate_per_s = 0.2
end_s = 40
clicks = 3
{extra}
"""


def write_scenario(tmp_path: Path, extra: str = "", provider_extra: str = "", quota_extra: str = "") -> Path:
    path = tmp_path / "unit.toml"
    text = BASE.format(extra=extra, provider_extra=provider_extra, quota_extra=quota_extra)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_summary_has_every_documented_key_and_consistent_counts(tmp_path: Path) -> None:
    result = simulate(write_scenario(tmp_path))
    s = result.summary
    assert set(SUMMARY_KEYS) <= set(s)
    terminal = s["tasks_succeeded"] + s["tasks_failed"] + s["tasks_cancelled"] + s["tasks_deduped"]
    assert terminal + s["tasks_lost"] == s["tasks_submitted"] > 50
    assert s["tasks_lost"] == 0
    assert s["tasks_deduped"] > 0  # repeated inputs and triple clicks share one run
    assert s["attempts"] == len(result.calls) == s["retries"] + result.calls["task_id"].nunique()
    assert s["rate_limited"] == int((result.calls["outcome"] == "rate_limited").sum())
    assert s["billed_calls"] == int(result.calls["billed"].sum())
    assert math.isclose(s["cost_total"], result.calls.loc[result.calls["billed"], "cost"].sum())
    assert s["success_latency_p50_s"] <= s["success_latency_p95_s"] <= s["success_latency_p99_s"]
    assert 0 < s["quota_utilization"] <= 1.05
    assert result.task_errors == []


def test_dataframes_have_one_row_per_task_and_per_attempt(tmp_path: Path) -> None:
    result = simulate(write_scenario(tmp_path))
    tasks, calls, timeline = result.tasks, result.calls, result.timeline
    assert len(tasks) == result.summary["tasks_submitted"]
    assert tasks["task_id"].is_unique
    assert {"status", "priority", "latency_s", "wait_s", "attempts"} <= set(tasks.columns)
    assert {"start", "end", "outcome", "billed", "cost", "decision"} <= set(calls.columns)
    assert (calls["end"] >= calls["start"]).all()
    assert timeline["attempts"].sum() == len(calls)
    assert timeline["rate_limited"].sum() == result.summary["rate_limited"]
    assert {"tokens_level", "in_flight", "queued_background"} <= set(timeline.columns)


def test_same_seed_same_run_and_another_seed_another_run(tmp_path: Path) -> None:
    path = write_scenario(tmp_path)
    first, again, other = simulate(path, seed=11), simulate(path, seed=11), simulate(path, seed=12)
    assert first.summary == again.summary
    assert first.tasks.equals(again.tasks)
    assert first.calls.equals(again.calls)
    assert other.summary != first.summary


def test_overrides_apply_with_validation(tmp_path: Path) -> None:
    path = write_scenario(tmp_path)
    slow = simulate(path, overrides={"quotas.llm.concurrency": 1})
    fast = simulate(path, overrides={"quotas.llm.concurrency": 12})
    assert slow.summary["success_latency_p99_s"] > fast.summary["success_latency_p99_s"]
    scenario = load_scenario(path)
    assert simulate(scenario, overrides={"quotas.llm.concurrency": 1}).summary == slow.summary


@pytest.mark.parametrize("honours", [False, True])
def test_lost_responses_bill_twice_only_when_the_provider_ignores_keys(tmp_path: Path, honours: bool) -> None:
    extra = f"timeout_prob = 0.3\nhonours_idempotency = {'true' if honours else 'false'}"
    result = simulate(write_scenario(tmp_path, provider_extra=extra))
    s = result.summary
    assert s["timeouts"] > 0
    if honours:
        assert s["duplicate_billed_calls"] == 0 and s["cost_duplicated"] == 0
    else:
        assert s["duplicate_billed_calls"] > 0 and s["cost_duplicated"] > 0


def test_a_crash_mid_run_loses_nothing(tmp_path: Path) -> None:
    extra = "[[crashes]]\nat_s = 15\nrestart_after_s = 4\n"
    result = simulate(write_scenario(tmp_path, extra=extra))
    s = result.summary
    assert s["crashes"] == 1 and len(result.recoveries) == 1
    assert s["tasks_lost"] == 0
    succeeded = result.tasks[result.tasks["status"] == "succeeded"]
    assert succeeded["task_id"].isin([r.id for r in result.records if r.result is not None]).all()
    assert s["max_executions_per_key"] <= 1 or result.recoveries[0].orphans_requeued > 0


def test_latency_counts_from_the_users_arrival_even_across_a_crash(tmp_path: Path) -> None:
    extra = "[[crashes]]\nat_s = 15\nrestart_after_s = 6\n"
    result = simulate(write_scenario(tmp_path, extra=extra))
    tasks = result.tasks
    during_downtime = tasks[(tasks["arrived_at"] > 15) & (tasks["arrived_at"] < 21)]
    assert len(during_downtime) > 0
    # their records were created at the restart, but their wait counts from the click
    assert (during_downtime["created_at"] >= 21 - 1e-9).all()
    started = during_downtime.dropna(subset=["wait_s"])
    assert len(started) > 0
    assert (started["wait_s"] >= 21 - started["arrived_at"] - 1e-9).all()


SHIPPED = Path(__file__).resolve().parent.parent / "scenarios"


@pytest.fixture(scope="module")
def storm_seed_1():
    """retry_storm_429 seed 1: 81 tasks fail after max_attempts and utilisation reads just above 1."""
    return simulate(SHIPPED / "retry_storm_429.toml", seed=1)


def test_success_latency_and_time_to_failure_are_reported_apart(storm_seed_1) -> None:
    s, tasks = storm_seed_1.summary, storm_seed_1.tasks
    succeeded = tasks.loc[tasks["status"].isin(["succeeded", "deduped"]), "latency_s"].to_numpy(float)
    failed = tasks.loc[tasks["status"] == "failed", "latency_s"].to_numpy(float)
    assert len(failed) > 10 and len(succeeded) > 10, "the storm must both fail and succeed tasks"
    for q in (50, 95, 99):
        assert s[f"success_latency_p{q}_s"] == pytest.approx(np.percentile(succeeded, q))
    for q in (50, 99):
        assert s[f"failure_time_p{q}_s"] == pytest.approx(np.percentile(failed, q))
    # the mixed percentile the old latency_p50_s reported is neither of the two
    mixed = np.percentile(np.concatenate([succeeded, failed]), 50)
    assert mixed != pytest.approx(s["success_latency_p50_s"])
    assert s["goodput_per_s"] == pytest.approx(len(succeeded) / s["sim_time_s"])
    for key in ("success_latency_p50_s", "failure_time_p50_s", "goodput_per_s"):
        assert "succeeded" in SUMMARY_KEYS[key] or "failed" in SUMMARY_KEYS[key], key


def test_quota_utilization_is_work_over_the_quota_rate_and_may_pass_one_by_one_window(storm_seed_1) -> None:
    scenario, calls, tasks = storm_seed_1.scenario, storm_seed_1.calls, storm_seed_1.tasks
    (provider,) = scenario.providers
    executed = calls[~calls["outcome"].isin(["rate_limited", "replay"])]
    span = executed["end"].max() - tasks["created_at"].min()
    rate_per_s = provider.server_requests_per_min / 60.0
    utilisation = storm_seed_1.summary["quota_utilization"]
    assert utilisation == pytest.approx(len(executed) / (rate_per_s * span))
    # the sliding 60 s window admitted a full minute's quota at the start: above 1, within one window
    assert 1.0 < utilisation <= 1.0 + 60.0 / span
    assert "may pass 1" in SUMMARY_KEYS["quota_utilization"]
    assert "60 s / span" in SUMMARY_KEYS["quota_utilization"]


@pytest.mark.parametrize("kind", ["sqlite", "json"])
def test_a_simulated_durable_store_skips_fsync_yet_holds_every_task_when_the_run_ends(
    tmp_path: Path, kind: str
) -> None:
    """A simulated crash is a process crash, which fsync does not guard against: the simulation
    opens its store without it (synchronous=OFF, no fsync per journal append), and the same store
    code still leaves every task on disk and gives the memory store's figures."""
    from aiqsim.core.task import TaskStatus
    from aiqsim.stores import JsonFileStore, SqliteStore

    crash = "[[crashes]]\nat_s = 15\nrestart_after_s = 4\n"
    store_file = tmp_path / f"kept.{kind}"
    on_disk = simulate(
        write_scenario(tmp_path, extra=f'{crash}\n[store]\nkind = "{kind}"\npath = "{store_file}"\n')
    )
    in_memory = simulate(write_scenario(tmp_path, extra=crash))
    assert on_disk.summary == in_memory.summary
    reopened = SqliteStore(store_file) if kind == "sqlite" else JsonFileStore(store_file)
    try:
        kept = reopened.list_by_status(*TaskStatus)
        assert sorted(r.id for r in kept) == sorted(r.id for r in on_disk.records)
        assert all(r.status.is_terminal for r in kept)
    finally:
        reopened.close()
    opened = _simulation_store(kind, tmp_path / f"probe.{kind}", group_commit=False)
    try:
        assert (opened.synchronous == "OFF") if kind == "sqlite" else (opened.fsync is False)
    finally:
        opened.close()


BILLED_AFTER_THE_CLIENT_GAVE_UP = """
[scenario]
name = "slow-server"
seed = 1
duration_s = 20.0
drain_s = 2000.0

[[providers]]
name = "p"
latency_base_s = 30.0
latency_per_unit_s = 0.0
latency_sigma = 0.0
price_per_1k_units = 2.0

[quotas.p]
concurrency = 1000

[retry]
strategy = "constant"
base_s = 0.5
cap_s = 30.0
max_attempts = 3
attempt_timeout_s = 10.0

[dispatch]
background_limit = "none"
interactive_limit = "none"

[[workloads]]
type = "poisson"
provider = "p"
rate_per_s = 2.0
[workloads.cost]
dist = "fixed"
mean = 500
"""


@pytest.mark.parametrize("records", ["full", "summary"])
def test_calls_the_server_finishes_after_the_last_task_ended_are_billed(tmp_path: Path, records: str) -> None:
    """Every call takes 30 s server-side and the client gives up after 10 s: each task sends three,
    each done and billed (1.0 apiece). The run stopped when the last task failed, before the server
    finished its last calls: ~half of the billed calls were missing from attempts, billed_calls and
    cost_total (found by a review against known answers)."""
    path = tmp_path / "slow.toml"
    path.write_text(BILLED_AFTER_THE_CLIENT_GAVE_UP)
    result = simulate(path, seed=3, records=records)
    s = result.summary
    tasks = s["tasks_submitted"]
    assert tasks > 20 and s["tasks_failed"] == tasks
    assert s["attempts"] == s["billed_calls"] == 3 * tasks
    assert s["cost_total"] == pytest.approx(3.0 * tasks)
    # the run still ends when its last task did (arrival + 3 x 10 s + 2 x 0.5 s), not when the server's
    # last call does (20 s later)
    assert s["sim_time_s"] < 20.0 + 31.0 + 1e-9


def test_a_crash_timer_the_run_never_reached_leaves_no_unawaited_coroutine() -> None:
    """``--set scenario.duration_s=1e-300`` on the crash scenario printed "coroutine '_Run._crash_at'
    was never awaited": the run ended before the timer's first step and nobody closed it."""
    import gc
    import warnings

    scenario = Path(__file__).resolve().parent.parent / "scenarios" / "crash_recovery.toml"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        simulate(scenario, seed=0, overrides={"scenario.duration_s": 1e-300})
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]
