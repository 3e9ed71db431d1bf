"""simulate(): the real scheduler on the virtual clock, its summary and DataFrames."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest

from aiqsim.sim.metrics import SUMMARY_KEYS
from aiqsim.sim.scenario import load_scenario
from aiqsim.sim.simulate import simulate

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
    assert s["latency_p50_s"] <= s["latency_p95_s"] <= s["latency_p99_s"]
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
    assert slow.summary["latency_p99_s"] > fast.summary["latency_p99_s"]
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
