"""``metrics.summarize`` counts in one pass what its definitions state one figure at a time.

The summary walks the executions and the events once each; here every figure so computed is
recomputed straight from its definition (one pass per figure) on real simulated runs whose
figures are not zero, so a slip in the shared pass shows.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from aiqsim.core.task import TaskStatus
from aiqsim.scheduler.events import AttemptRecord
from aiqsim.sim import simulate

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


@pytest.mark.parametrize(
    "name", ["timeout_duplicate_billing", "retry_storm_429", "double_click_storm", "provider_outage"]
)
def test_one_pass_figures_equal_their_definitions(name: str) -> None:
    result = simulate(SCENARIOS / f"{name}.toml", seed=1)
    executions, events, records = result.executions, result.events, result.records
    attempts = [e for e in events if isinstance(e, AttemptRecord)]
    per_key = Counter(e.key for e in executions if e.outcome not in ("rate_limited", "replay"))
    expected = {
        "attempts": len(executions),
        "retries": len(executions) - len({e.task_id for e in executions}),
        "rate_limited": sum(1 for e in executions if e.outcome == "rate_limited"),
        "billed_calls": sum(1 for e in executions if e.billed),
        "timeouts": sum(1 for e in attempts if e.outcome in ("ProviderTimeoutError", "TimeoutError")),
        "rejected_locally": sum(1 for e in attempts if e.decision == "rejected"),
        "max_executions_per_key": max(per_key.values(), default=0),
        "tasks_lost": sum(1 for r in records if not r.status.is_terminal),
    }
    assert {key: result.summary[key] for key in expected} == expected


def test_the_scenarios_exercise_the_figures() -> None:
    # Without this the comparison above could pass on zeros alone.
    summaries = [
        simulate(SCENARIOS / f"{name}.toml", seed=1).summary
        for name in ("timeout_duplicate_billing", "retry_storm_429")
    ]
    for key in ("retries", "rate_limited", "timeouts", "billed_calls"):
        assert any(summary[key] > 0 for summary in summaries), key
    assert any(summary["max_executions_per_key"] > 1 for summary in summaries)


def test_time_to_first_token_is_arrival_to_the_first_token_of_the_answer_kept() -> None:
    result = simulate(SCENARIOS / "streaming_ttft.toml", seed=1, overrides={"retry.first_token_timeout_s": 3})
    ok = {e.task_id: e for e in result.events if isinstance(e, AttemptRecord) and e.outcome == "ok"}
    assert not any(isinstance(e, AttemptRecord) and e.decision == "lookup" for e in result.events)
    arrivals = result.arrival_times
    ttfts = [
        ok[r.id].start + ok[r.id].first_token_s - arrivals[r.id]
        for r in result.records
        if r.status is TaskStatus.SUCCEEDED
    ]
    assert len(ttfts) == result.summary["tasks_succeeded"] > 100
    assert result.summary["ttft_p50_s"] == np.percentile(ttfts, 50)
    assert result.summary["ttft_p99_s"] == np.percentile(ttfts, 99)
    retried = [r.id for r in result.records if r.status is TaskStatus.SUCCEEDED and r.attempts > 1]
    assert retried, "a first-token deadline makes some tasks wait through a second attempt"
    # a retried task's first token counts from arrival: through the abandoned attempt's 3 s
    assert all(ok[task].start + ok[task].first_token_s - arrivals[task] > 3.0 for task in retried)


def test_without_the_stream_model_the_time_to_first_token_is_nan() -> None:
    summary = simulate(SCENARIOS / "timeout_duplicate_billing.toml", seed=1).summary
    assert math.isnan(summary["ttft_p50_s"]) and math.isnan(summary["ttft_p99_s"])


def test_a_cut_stream_completed_from_the_providers_record_counts_its_own_first_token() -> None:
    result = simulate(
        SCENARIOS / "streaming_ttft.toml", seed=1, overrides={"providers.llm.supports_lookup": True}
    )
    settled = {
        e.task_id: e.start + e.first_token_s - result.arrival_times[e.task_id]
        for e in result.events
        if isinstance(e, AttemptRecord) and e.decision == "lookup"
    }
    assert settled, "some cut streams were completed by lookup"
    succeeded = [r.id for r in result.records if r.status is TaskStatus.SUCCEEDED]
    assert set(settled) <= set(succeeded)
    ok = {e.task_id: e for e in result.events if isinstance(e, AttemptRecord) and e.outcome == "ok"}
    ttfts = [
        settled[t] if t in settled else ok[t].start + ok[t].first_token_s - result.arrival_times[t]
        for t in succeeded
    ]
    assert result.summary["ttft_p99_s"] == np.percentile(ttfts, 99)
