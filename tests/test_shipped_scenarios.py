"""Every shipped scenario runs, and its summary shows the phenomenon it is about."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiqsim.sim.scenario import load_scenario
from aiqsim.sim.simulate import simulate
from aiqsim.sim.workloads import read_trace

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def run(name: str, **overrides):
    return simulate(SCENARIOS / f"{name}.toml", overrides=overrides or None)


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.toml")), ids=lambda p: p.stem)
def test_every_shipped_scenario_runs_clean(path: Path) -> None:
    result = simulate(path)
    assert result.summary["tasks_lost"] == 0
    assert result.summary["tasks_submitted"] > 0
    assert result.task_errors == []
    assert load_scenario(path).description.strip(), "each scenario says what it shows"


def test_double_click_storm_bills_one_call_per_distinct_input() -> None:
    result = run("double_click_storm")
    s = result.summary
    distinct_inputs = result.tasks["key"].nunique()
    assert s["tasks_deduped"] > 0
    assert s["billed_calls"] == distinct_inputs
    assert s["duplicate_billed_calls"] == 0


def test_retry_storm_emerges_from_the_server_quota_and_client_pacing_removes_it() -> None:
    storm = run("retry_storm_429").summary
    assert storm["rate_limited"] > storm["tasks_submitted"]  # more 429s than tasks: a storm
    assert storm["attempts"] > 2 * storm["tasks_submitted"]
    assert storm["tasks_failed"] > 0
    # A client bucket at the server's rate (burst 1, so no 60 s window ever sees more) sends nothing
    # the server will refuse: the same work, no 429s, no failures.
    paced = run(
        "retry_storm_429", **{"quotas.llm.requests_per_min": 120, "quotas.llm.request_burst": 1}
    ).summary
    assert paced["rate_limited"] == 0 and paced["tasks_failed"] == 0
    assert paced["attempts"] == paced["tasks_submitted"]
    assert paced["quota_utilization"] > 0.98


def test_lost_responses_bill_twice_unless_the_provider_honours_the_key() -> None:
    ignored = run("timeout_duplicate_billing").summary
    honoured = run("timeout_duplicate_billing", **{"providers.llm.honours_idempotency": True}).summary
    assert (
        ignored["timeouts"] > 0 and ignored["duplicate_billed_calls"] > 0 and ignored["cost_duplicated"] > 0
    )
    assert honoured["timeouts"] > 0 and honoured["duplicate_billed_calls"] == 0


def test_crash_recovery_reconciles_orphans_instead_of_billing_them_again() -> None:
    reconciled = run("crash_recovery").summary
    assert reconciled["crashes"] == 1 and reconciled["tasks_lost"] == 0
    assert reconciled["orphans_reconciled"] > 0
    assert reconciled["max_executions_per_key"] == 1
    blind = run(
        "crash_recovery",
        **{
            "store.reconcile_on_restart": False,
            "store.requeue_interrupted": True,
            "providers.llm.honours_idempotency": False,
        },
    ).summary
    assert blind["tasks_lost"] == 0 and blind["orphans_requeued"] > 0
    assert blind["duplicate_billed_calls"] > 0


def test_sjf_unblocks_small_jobs_and_aging_bounds_the_big_one() -> None:
    def waits(policy: str):
        tasks = run("sjf_vs_fifo", **{"dispatch.policy": policy}).tasks
        big = tasks.loc[tasks["cost_estimate"].idxmax()]
        small = tasks[tasks["cost_estimate"] < 50_000]
        return big["wait_s"], small["wait_s"].quantile(0.95)

    big_fifo, small_fifo = waits("fifo")
    big_sjf, small_sjf = waits("sjf")
    big_aged, _ = waits("sjf_aging")
    assert small_sjf < small_fifo / 5
    assert big_sjf >= big_fifo
    max_wait = load_scenario(SCENARIOS / "sjf_vs_fifo.toml").dispatch.max_wait_s
    refill_s = 100_000 / (60_000 / 60)
    assert big_aged <= max_wait + refill_s


def test_interactive_work_stays_fast_while_background_saturates() -> None:
    s = run("interactive_vs_background").summary
    assert s["interactive_success_latency_p99_s"] * 10 < s["background_success_latency_p99_s"]


def test_trace_replay_reproduces_the_trace_window() -> None:
    scenario = load_scenario(SCENARIOS / "azure_trace_replay.toml")
    workload = scenario.workloads[0]
    rows = [r for r in read_trace("azure_code") if r.offset_s / workload.speedup < scenario.duration_s]
    result = simulate(scenario)
    assert result.summary["tasks_submitted"] == len(rows)
    assert result.tasks["cost_estimate"].sum() == sum(r.context_tokens + r.generated_tokens for r in rows)


def test_ai_edit_pipeline_finds_the_tts_quota_as_the_bottleneck_and_quota_there_buys_latency() -> None:
    # Two seeds each: the claims the scenario's description makes must hold beyond one draw.
    for seed in (0, 1):
        base = simulate(SCENARIOS / "ai_edit_pipeline.toml", seed=seed).summary
        assert base["jobs_lost"] == 0 and base["tasks_lost"] == 0
        assert base["jobs_succeeded"] > 0.8 * base["jobs_submitted"]
        assert base["jobs_deduped"] > 0  # the double-clicks
        assert base["bottleneck_stage"] == "tts"
        more_tts = simulate(
            SCENARIOS / "ai_edit_pipeline.toml",
            seed=seed,
            overrides={"quotas.tts.requests_per_min": 80, "providers.tts.server_requests_per_min": 80},
        ).summary
        more_llm = simulate(
            SCENARIOS / "ai_edit_pipeline.toml",
            seed=seed,
            overrides={"quotas.llm.units_per_min": 160000, "providers.llm.server_units_per_min": 160000},
        ).summary
        tts_gain = base["job_latency_p50_s"] - more_tts["job_latency_p50_s"]
        llm_gain = base["job_latency_p50_s"] - more_llm["job_latency_p50_s"]
        assert tts_gain > 0.2 * base["job_latency_p50_s"]
        assert tts_gain > 3 * max(llm_gain, 0.0)
        fallback = simulate(
            SCENARIOS / "ai_edit_pipeline.toml",
            seed=seed,
            overrides={"jobs.ai_edit.stages.tts.fallback": "tts_backup"},
        ).summary
        assert fallback["jobs_failed"] < base["jobs_failed"]


def test_streaming_ttft_fails_cut_streams_rather_than_bill_them_twice() -> None:
    s = run("streaming_ttft").summary
    uncut = run("streaming_ttft", **{"providers.llm.stream_cut_prob": 0.0}).summary
    looked_up = run("streaming_ttft", **{"providers.llm.supports_lookup": True}).summary
    assert 0 < s["ttft_p50_s"] < s["ttft_p99_s"] < s["success_latency_p99_s"]
    assert 0.02 * s["tasks_submitted"] < s["tasks_failed"] < 0.1 * s["tasks_submitted"]  # the 5% cut
    assert uncut["tasks_failed"] < s["tasks_failed"] / 4
    assert looked_up["tasks_failed"] <= uncut["tasks_failed"]  # completed from the provider's record
    assert s["duplicate_billed_calls"] <= uncut["duplicate_billed_calls"] + 2  # a cut is not re-sent


def test_multi_deployment_the_cheap_deployment_saturates_past_its_share() -> None:
    even = run("multi_deployment_tenants").summary
    heavy = run("multi_deployment_tenants", **{"routes.gpt.weights.cheap": 3}).summary
    assert 0.45 < even["deployment_cheap_call_share"] < 0.55
    assert even["deployment_fast_success_latency_p99_s"] < even["deployment_cheap_success_latency_p99_s"]
    assert heavy["cost_total"] < even["cost_total"]  # a third of the price per token
    assert heavy["success_latency_p99_s"] > 3 * even["success_latency_p99_s"]  # 3 calls/s > its ~2.7/s
    assert even["tasks_failed"] == 0  # a 5xx moved its retry to the other deployment
