"""Jobs in the lab: scenario files describe them, simulate() runs them through the scheduler's jobs
API, and the job metrics match cases computable by hand (chain = sum, parallel = max, a quota-bound
stage is the bottleneck, cost per job from the price list)."""

from __future__ import annotations

import copy
import math
import re
from typing import Any

import pytest

from aiqsim.sim.job_templates import stage_payloads
from aiqsim.sim.job_workloads import generate_job_arrivals
from aiqsim.sim.scenario import ScenarioError, apply_overrides, parse_scenario, scenario_to_dict
from aiqsim.sim.simulate import simulate

EPS = 1e-9


def provider(name: str, latency_s: float, **extra: Any) -> dict[str, Any]:
    """A deterministic provider: every call takes exactly ``latency_s`` and never fails."""
    return {"name": name, "latency_base_s": latency_s, "latency_per_unit_s": 0.0, **extra}


def scenario(stages: list[dict[str, Any]], providers: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """One job template ``edit`` submitted once at t = 1 (a burst of one), everything else default."""
    mapping: dict[str, Any] = {
        "scenario": {"name": "jobs_by_hand", "duration_s": 10, "drain_s": 600},
        "providers": providers,
        "jobs": [{"name": "edit", "stages": stages}],
        "workloads": [{"type": "burst", "job": "edit", "count": 1, "start_s": 1.0}],
        "dispatch": {"interactive_limit": "none"},
    }
    mapping.update(extra)
    return mapping


def run(mapping: dict[str, Any], seed: int = 0):
    return simulate(parse_scenario(mapping, source="case.toml"), seed=seed)


def only_job(result) -> dict[str, Any]:
    assert len(result.jobs) == 1
    return result.jobs.iloc[0].to_dict()


THREE = [provider("p1", 1.0), provider("p2", 2.0), provider("p3", 3.0)]


def test_a_chain_of_stages_takes_the_sum_of_their_latencies() -> None:
    stages = [
        {"name": "a", "provider": "p1"},
        {"name": "b", "provider": "p2", "after": ["a"]},
        {"name": "c", "provider": "p3", "after": ["b"]},
    ]
    result = run(scenario(stages, THREE))
    job = only_job(result)
    assert job["status"] == "succeeded"
    assert job["latency_s"] == pytest.approx(1.0 + 2.0 + 3.0, abs=EPS)
    assert (job["a_s"], job["b_s"], job["c_s"]) == pytest.approx((1.0, 2.0, 3.0), abs=EPS)
    assert job["critical_path"] == "a>b>c"
    assert job["service_s"] == pytest.approx(6.0, abs=EPS)
    for part in ("queue_wait_s", "quota_wait_s", "retries_s", "other_s"):
        assert job[part] == pytest.approx(0.0, abs=EPS), part
    s = result.summary
    assert s["jobs_succeeded"] == 1 and s["jobs_lost"] == 0
    assert s["job_latency_p50_s"] == pytest.approx(6.0, abs=EPS)
    assert s["bottleneck_stage"] == "c" and s["bottleneck_share"] == pytest.approx(3.0 / 6.0)


def test_independent_stages_take_the_time_of_the_slowest() -> None:
    stages = [
        {"name": "a", "provider": "p1"},
        {"name": "b", "provider": "p2"},
        {"name": "c", "provider": "p3"},
    ]
    job = only_job(run(scenario(stages, THREE)))
    assert job["latency_s"] == pytest.approx(3.0, abs=EPS)
    assert job["critical_path"] == "c"
    assert job["service_s"] == pytest.approx(3.0, abs=EPS)
    assert job["a_service_s"] is None or math.isnan(job["a_service_s"])  # off the critical path


def test_a_diamond_takes_the_longest_path() -> None:
    stages = [
        {"name": "a", "provider": "p1"},
        {"name": "b", "provider": "p2", "after": ["a"]},
        {"name": "c", "provider": "p3", "after": ["a"]},
        {"name": "d", "provider": "p1", "after": ["b", "c"]},
    ]
    job = only_job(run(scenario(stages, THREE)))
    assert job["latency_s"] == pytest.approx(1.0 + max(2.0, 3.0) + 1.0, abs=EPS)
    assert job["critical_path"] == "a>c>d"


def test_a_quota_bound_stage_is_the_bottleneck_and_its_wait_splits_into_queue_and_quota() -> None:
    # a 5 s stage, then 3 TTS calls (0.5 s each) on a client quota of 6 requests/min with a
    # burst of 1: the calls are granted at +0, +10 and +20 s, so the stage takes 20.5 s. Its last call
    # waits 10 s behind the second (queue) and then 10 s for its own token (quota).
    stages = [
        {"name": "script", "provider": "llm"},
        {
            "name": "tts",
            "provider": "tts",
            "after": ["script"],
            "size": {"dist": "fixed", "mean": 300},
            "fanout": {"dist": "fixed", "mean": 3},
        },
    ]
    providers = [provider("llm", 5.0), provider("tts", 0.5, kind="tts")]
    quotas = {"tts": {"requests_per_min": 6, "request_burst": 1}}
    result = run(scenario(stages, providers, quotas=quotas))
    job = only_job(result)
    assert job["stage_calls"] == 1 + 3
    assert job["tts_s"] == pytest.approx(20.5, abs=EPS)
    assert job["latency_s"] == pytest.approx(25.5, abs=EPS)
    assert job["tts_queue_wait_s"] == pytest.approx(10.0, abs=EPS)
    assert job["tts_quota_wait_s"] == pytest.approx(10.0, abs=EPS)
    assert job["tts_service_s"] == pytest.approx(0.5, abs=EPS)
    assert job["slowest_stage"] == "tts"
    s = result.summary
    assert s["bottleneck_stage"] == "tts"
    assert s["bottleneck_share"] == pytest.approx(20.5 / 25.5)
    # without the quota the same job takes 5 + 0.5 s and the script stage is the bottleneck
    free = run(scenario(stages, providers)).summary
    assert free["job_latency_p50_s"] == pytest.approx(5.5, abs=EPS)
    assert free["bottleneck_stage"] == "script"


def test_retries_are_their_own_part_of_a_stage() -> None:
    # p2's server takes 1 request a minute: of stage b's two calls, one runs at once (2 s); the other
    # gets a 429 with Retry-After 60 s, waits it out (strategy none: the delay is the Retry-After)
    # and then runs: 60 s of retries, 2 s of service. The job takes 1 + 62 s.
    stages = [
        {"name": "a", "provider": "p1"},
        {"name": "b", "provider": "p2", "after": ["a"], "fanout": {"dist": "fixed", "mean": 2}},
    ]
    providers = [provider("p1", 1.0), provider("p2", 2.0, server_requests_per_min=1)]
    retry = {"strategy": "none", "base_s": 0.0, "max_attempts": 3}
    result = run(scenario(stages, providers, retry=retry))
    job = only_job(result)
    assert job["status"] == "succeeded"
    assert job["latency_s"] == pytest.approx(63.0, abs=1e-6)
    assert job["b_retries_s"] == pytest.approx(60.0, abs=1e-6)
    assert job["b_service_s"] == pytest.approx(2.0, abs=1e-6)
    assert job["retries_s"] == pytest.approx(60.0, abs=1e-6)
    assert job["attempts"] == 1 + 3
    assert result.summary["job_retries_mean_s"] == pytest.approx(60.0, abs=1e-6)


def test_a_job_that_cannot_continue_fails_naming_its_stage() -> None:
    stages = [{"name": "a", "provider": "p1"}, {"name": "b", "provider": "p2", "after": ["a"]}]
    providers = [provider("p1", 1.0), provider("p2", 2.0, quota_exhausted_prob=1.0)]
    result = run(scenario(stages, providers))
    job = only_job(result)
    assert job["status"] == "failed" and job["failed_stage"] == "b"
    assert "stage 'b'" in job["error"]
    assert result.summary["jobs_failed"] == 1
    assert result.summary["job_time_to_failure_p50_s"] == pytest.approx(1.0, abs=EPS)  # b fails at once


def test_cost_per_job_is_the_price_list_applied_to_the_stage_sizes() -> None:
    stages = [
        {
            "name": "script",
            "provider": "llm",
            "size": {"dist": "fixed", "mean": 2000, "output_fraction": 0.5},
        },
        {
            "name": "tts",
            "provider": "tts",
            "after": ["script"],
            "size": {"dist": "from_stage", "stage": "script", "ratio": 3.0},
            "fanout": {"dist": "fixed", "mean": 4},
        },
    ]
    providers = [
        provider("llm", 1.0, price_per_1k_units=0.01),
        provider("tts", 1.0, kind="tts", price_per_1k_units=0.02),
    ]
    result = run(scenario(stages, providers))
    job = only_job(result)
    # script: 2000 tokens (1000 output) -> tts: 3 * 1000 characters over 4 calls of 750
    expected = 2000 * 0.01 / 1000 + 3000 * 0.02 / 1000
    assert job["cost"] == pytest.approx(expected)
    assert job["cost_duplicated"] == 0.0
    assert result.summary["cost_per_job"] == pytest.approx(expected)
    units = sorted(result.calls[result.calls.provider == "tts"]["units"])
    assert units == [750, 750, 750, 750]


def test_lost_responses_show_as_duplicate_cost_of_the_job() -> None:
    stages = [{"name": "a", "provider": "p1", "size": {"dist": "fixed", "mean": 1000}}]
    providers = [provider("p1", 1.0, timeout_prob=1.0, price_per_1k_units=0.01)]
    retry = {"strategy": "none", "base_s": 0.0, "max_attempts": 3, "attempt_timeout_s": 5}
    result = run(scenario(stages, providers, retry=retry))
    job = only_job(result)
    # three executions billed (0.01 each), every response lost: two of them are duplicates
    assert job["status"] == "failed"
    assert job["cost"] == pytest.approx(0.03)
    assert job["cost_duplicated"] == pytest.approx(0.02)
    assert result.summary["job_time_to_failure_p50_s"] == pytest.approx(3 * 5.0, abs=EPS)
    assert math.isnan(result.summary["job_latency_p50_s"])  # no job succeeded


def test_a_fallback_takes_the_failed_calls_and_the_stage_time_includes_both() -> None:
    stages = [
        {"name": "tts", "provider": "tts", "fallback": "backup", "fanout": {"dist": "fixed", "mean": 2}}
    ]
    providers = [
        provider("tts", 1.0, kind="tts", invalid_request_prob=1.0),
        provider("backup", 2.0, kind="tts"),
    ]
    result = run(scenario(stages, providers))
    job = only_job(result)
    assert job["status"] == "succeeded"
    # the invalid request is refused at once (t = 0), the backup call takes 2 s
    assert job["latency_s"] == pytest.approx(2.0, abs=EPS)
    assert job["stage_calls"] == 2 + 2
    without = run(scenario([{**stages[0], "fallback": "none"}], providers))
    assert only_job(without)["status"] == "failed"


def test_double_clicked_jobs_dedup_and_bill_nothing() -> None:
    stages = [{"name": "a", "provider": "p1"}, {"name": "b", "provider": "p2", "after": ["a"]}]
    mapping = scenario(stages, THREE)
    mapping["workloads"] = [
        {
            "type": "double_click",
            "job": "edit",
            "count": 4,
            "rate_per_s": 0.5,
            "clicks": 3,
            "click_gap_s": 0.2,
        }
    ]
    result = run(mapping)
    s = result.summary
    assert s["jobs_submitted"] == 12 and s["jobs_succeeded"] == 4 and s["jobs_deduped"] == 8
    assert s["duplicate_billed_calls"] == 0
    deduped = result.jobs[result.jobs.status == "deduped"]
    assert (deduped["cost"] == 0).all()


def test_jobs_refused_at_the_door_are_rejected_rows_counted_once_per_job() -> None:
    # five interactive jobs at once, each fanning out to 3 calls on one slow lane; the interactive
    # depth limit of 2 counts a waiting job once (not its 3 calls): 2 accepted, 3 rejected.
    stages = [{"name": "a", "provider": "p1", "fanout": {"dist": "fixed", "mean": 3}}]
    mapping = scenario(stages, [provider("p1", 10.0)], quotas={"p1": {"concurrency": 1}})
    mapping["dispatch"] = {"interactive_limit": 2}
    mapping["workloads"] = [{"type": "burst", "job": "edit", "count": 5, "priority": "interactive"}]
    result = run(mapping)
    s = result.summary
    assert (s["jobs_submitted"], s["jobs_rejected"]) == (2, 3)
    assert s["jobs_succeeded"] == 2
    rejected = result.jobs[result.jobs.status == "rejected"]
    assert len(rejected) == 3 and rejected["error"].str.contains("QueueFullError").all()


@pytest.mark.parametrize("store", ["memory", "json", "sqlite"])
def test_a_crash_mid_run_leaves_every_job_terminal_and_bills_no_stage_twice(store: str) -> None:
    stages = [
        {"name": "a", "provider": "p1"},
        {"name": "b", "provider": "p2", "after": ["a"], "fanout": {"dist": "fixed", "mean": 3}},
    ]
    providers = [provider("p1", 1.0, honours_idempotency=True), provider("p2", 2.0, honours_idempotency=True)]
    mapping = scenario(
        stages, providers, crashes=[{"at_s": 4.0, "restart_after_s": 2.0}], store={"kind": store}
    )
    mapping["workloads"] = [{"type": "poisson", "job": "edit", "rate_per_s": 2.0, "count": 10}]
    result = run(mapping, seed=3)
    s = result.summary
    assert s["crashes"] == 1
    assert s["jobs_submitted"] == 10  # arrivals while the process was down are submitted after the restart
    assert s["jobs_lost"] == 0 and s["tasks_lost"] == 0
    assert s["jobs_succeeded"] + s["jobs_failed"] + s["jobs_deduped"] == s["jobs_submitted"]
    assert s["duplicate_billed_calls"] == 0


def test_job_runs_replay_exactly_for_a_seed() -> None:
    path = "scenarios/ai_edit_pipeline.toml"
    overrides = {"scenario.duration_s": 200}
    first = simulate(path, seed=5, overrides=overrides)
    again = simulate(path, seed=5, overrides=overrides)
    assert first.jobs.equals(again.jobs)
    other = simulate(path, seed=6, overrides=overrides)
    assert not first.jobs["latency_s"].equals(other.jobs["latency_s"])


# --- building payloads ------------------------------------------------------------------------


def test_stage_payloads_split_the_units_evenly_and_keep_labels_distinct() -> None:
    parsed = parse_scenario(
        scenario(
            [
                {"name": "script", "provider": "llm"},
                {
                    "name": "tts",
                    "provider": "tts",
                    "after": ["script"],
                    "size": {"dist": "from_stage", "stage": "script", "ratio": 2.5},
                    "fanout": {"dist": "uniform", "low": 2, "high": 5},
                },
            ],
            [provider("llm", 1.0), provider("tts", 1.0, kind="tts")],
        )
    )
    stage = parsed.jobs[0].stages[1]
    inputs = {"input": "x", "units": {"script": 10}, "fanout": {"script": 1, "tts": 3}}
    payloads = stage_payloads(stage, "tts", inputs, {"script": {"output_units": 4}})
    assert [p["output_units"] for p in payloads] == [4, 3, 3]  # 2.5 * 4 = 10 characters over 3 calls
    assert [p["prompt_units"] for p in payloads] == [0, 0, 0]
    assert len({p["input"] for p in payloads}) == 3


def test_job_arrivals_draw_once_per_action_and_the_clicks_share_it() -> None:
    stages = [{"name": "a", "provider": "p1", "size": {"dist": "lognormal", "mean": 500, "sigma": 0.8}}]
    mapping = scenario(stages, THREE, scenario={"name": "x", "duration_s": 100})
    mapping["workloads"] = [{"type": "double_click", "job": "edit", "rate_per_s": 0.5, "clicks": 2}]
    arrivals = generate_job_arrivals(parse_scenario(mapping), seed=1)
    by_action: dict[str, list[Any]] = {}
    for arrival in arrivals:
        by_action.setdefault(arrival.action, []).append(arrival)
    assert all(len(clicks) == 2 for clicks in by_action.values())
    assert all(clicks[0].inputs == clicks[1].inputs for clicks in by_action.values())
    sizes = {clicks[0].inputs["units"]["a"] for clicks in by_action.values()}
    assert len(sizes) > len(by_action) // 2  # drawn per action, not one size for all
    assert [a.inputs for a in arrivals] == [
        a.inputs for a in generate_job_arrivals(parse_scenario(mapping), 1)
    ]


# --- validation -------------------------------------------------------------------------------

BASE_STAGES = [
    {"name": "script", "provider": "p1"},
    {
        "name": "tts",
        "provider": "p2",
        "after": ["script"],
        "size": {"dist": "from_stage", "stage": "script", "ratio": 4.0},
    },
]

MISTAKES = [
    (
        "jobs[0].stages[1].provider",
        lambda m: m["jobs"][0]["stages"][1].update(provider="gpt"),
        ["p1, p2, p3"],
    ),
    (
        "jobs[0].stages[0].after",
        lambda m: m["jobs"][0]["stages"][0].update(after=["tts"]),
        ["declared before this one", "none: this is the first stage", '"tts"'],
    ),
    (
        "jobs[0].stages[1].size.stage",
        lambda m: m["jobs"][0]["stages"][1].update(after=[]),
        ["one of the stages this stage waits for", '"script"'],
    ),
    (
        "jobs[0].stages[1].size.mean",
        lambda m: m["jobs"][0]["stages"][1]["size"].update(mean=3),
        ["does not apply to a from_stage stage size"],
    ),
    (
        "jobs[0].stages[1].fallback",
        lambda m: m["jobs"][0]["stages"][1].update(fallback="p2"),
        ["other than the stage's own"],
    ),
    (
        "jobs[0].stages[1].name",
        lambda m: m["jobs"][0]["stages"][1].update(name="script", after=[]),
        ["unique within the job", "stages[0]"],
    ),
    ("jobs[0].stages", lambda m: m["jobs"][0].update(stages=[]), ["at least one [[jobs.stages]]"]),
    (
        "jobs[0].stages[0].after",
        lambda m: m["jobs"][0]["stages"][0].update(after="script"),
        ["an array of names"],
    ),
    (
        "workloads[0].job",
        lambda m: m["workloads"][0].update(job="render"),
        ["[[jobs]] template (edit)", '"render"'],
    ),
    (
        "workloads[0].provider",
        lambda m: m["workloads"][0].update(provider="p1"),
        ["does not apply to a job workload", "keys for a burst job workload"],
    ),
    (
        "workloads[0].job",
        lambda m: m["workloads"][0].update(type="trace", trace="azure_code"),
        ["does not apply to a trace workload"],
    ),
    (
        "workloads[0].provider",
        lambda m: m["workloads"][0].pop("job"),
        ["missing", "or job = a [[jobs]] name"],
    ),
    (
        "jobs[0].stages[0].fanout.high",
        lambda m: m["jobs"][0]["stages"][0].update(fanout={"dist": "uniform", "low": 4, "high": 2}),
        ["a number >= low (4)"],
    ),
    (
        "jobs[0].stages[0].size.mean",
        lambda m: m.update(quotas={"p1": {"units_per_min": 100}}),
        ["at most 100 units", "got 500 per call"],
    ),
    # a job workload's arrival count is checked from its arithmetic when the scenario is read, as a
    # task workload's is (generation would refuse it only after drawing two million arrivals)
    (
        "workloads[0]",
        lambda m: m["workloads"][0].update(type="poisson", rate_per_s=1e6) or m["workloads"][0].pop("count"),
        ["arrivals; at most 2,000,000 fit"],
    ),
    (
        "workloads[0]",
        lambda m: m["workloads"][0].update(count=2_000_001),
        ["count is 2,000,001; at most 2,000,000 arrivals fit"],
    ),
    (  # each click of a double click submits a job
        "workloads[0].clicks",
        lambda m: m["workloads"][0].update(type="double_click", clicks=2_000_001),
        ["clicks 2,000,001 times count 1 means", "at most 2,000,000 fit"],
    ),
    (
        "workloads[0].start_s",
        lambda m: m["workloads"][0].update(start_s=1e9),
        ["expected a number < scenario.duration_s"],
    ),
]


@pytest.mark.parametrize(("key_path", "mutation", "fragments"), MISTAKES, ids=[m[0] for m in MISTAKES])
def test_job_mistakes_name_the_key_path_and_what_was_expected(key_path, mutation, fragments) -> None:
    mapping = scenario(copy.deepcopy(BASE_STAGES), THREE)
    mutation(mapping)
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(mapping, source="case.toml")
    assert caught.value.key_path == key_path, str(caught.value)
    assert str(caught.value).startswith(f"case.toml: {key_path}: ")
    for fragment in fragments:
        assert fragment in str(caught.value), (fragment, str(caught.value))


def test_a_job_workloads_listed_keys_are_only_those_it_takes() -> None:
    """The keys a refused one lists for a job workload are each accepted there: ``route`` is refused
    on a job workload (its stages name the providers) and was listed all the same; ``tenant`` is taken."""
    mapping = scenario(copy.deepcopy(BASE_STAGES), THREE)
    mapping["workloads"][0].update(provider="p1")
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(mapping, source="case.toml")
    listed = str(caught.value).split("keys for a burst job workload: ")[1].split(", ")
    assert "route" not in listed and "provider" not in listed and "tenant" in listed, listed
    for key in listed:  # each listed key is refused by nothing but its own value's checks
        trial = scenario(copy.deepcopy(BASE_STAGES), THREE)
        trial["workloads"][0][key] = "x"
        with pytest.raises(ScenarioError) as refused:
            parse_scenario(trial, source="case.toml")
        assert "does not apply" not in str(refused.value), (key, str(refused.value))


def test_job_scenarios_round_trip_and_take_overrides_by_name() -> None:
    parsed = parse_scenario(scenario(copy.deepcopy(BASE_STAGES), THREE), source="case.toml")
    assert parse_scenario(scenario_to_dict(parsed), source="case.toml") == parsed
    changed = apply_overrides(
        scenario_to_dict(parsed), {"jobs.edit.stages.tts.fallback": "p3", "jobs[0].stages.tts.size.ratio": 2}
    )
    again = parse_scenario(changed, source="case.toml")
    assert again.jobs[0].stages[1].fallback == "p3"
    assert again.jobs[0].stages[1].size.ratio == 2.0
    with pytest.raises(
        ScenarioError, match=re.escape("no jobs[0].stages entry named 'voice'; declared: script, tts")
    ):
        apply_overrides(scenario_to_dict(parsed), {"jobs.edit.stages.voice.fallback": "p3"})


def test_a_live_run_over_http_sizes_later_stages_from_earlier_results_as_the_simulation_does() -> None:
    # Regression: live HTTP providers returned the chat text as the result, so a from_stage size saw
    # no output units and every later stage shrank to 1 unit (a pipeline's live cost was a quarter).
    from aiqsim.http.live import run_live

    stages = [
        {"name": "script", "provider": "p1", "size": {"dist": "fixed", "mean": 1000, "output_fraction": 0.5}},
        {
            "name": "tts",
            "provider": "p2",
            "after": ["script"],
            "size": {"dist": "from_stage", "stage": "script"},
        },
    ]
    parsed = parse_scenario(scenario(stages, [provider("p1", 1.0), provider("p2", 1.0, kind="tts")]))
    simulated = simulate(parsed)
    live = run_live(parsed, time_scale=0.05)
    assert only_job(live)["status"] == "succeeded"
    for result in (simulated, live):
        assert list(result.calls[result.calls.provider == "p2"]["units"]) == [500]


def test_compare_shows_the_job_numbers_of_both_runs() -> None:
    from aiqsim.http.live import compare_sim_and_live

    stages = [{"name": "a", "provider": "p1"}, {"name": "b", "provider": "p2", "after": ["a"]}]
    frame = compare_sim_and_live(parse_scenario(scenario(stages, THREE)), time_scale=0.05)
    assert frame.loc["jobs_succeeded", "simulated"] == frame.loc["jobs_succeeded", "live"] == 1
    assert frame.loc["job_latency_p50_s", "simulated"] == pytest.approx(3.0, abs=EPS)
    assert frame.loc["job_latency_p50_s", "live"] > 0  # wall clock (first connections, load): not compared


def test_a_job_workloads_tenant_reaches_every_task_of_its_jobs() -> None:
    """A job workload's ``tenant`` goes to ``submit_job(tenant=...)``: two job workloads weighted 1:3
    share the lane 25/75 while both are backlogged."""
    from aiqsim.sim.simulate import run_scenario

    mapping = scenario([{"name": "a", "provider": "p1"}], [provider("p1", 1.0)])
    mapping["scenario"]["duration_s"] = 2
    mapping["quotas"] = {"p1": {"concurrency": 1}}
    mapping["tenants"] = {"acme": {"weight": 1}, "globex": {"weight": 3}}
    mapping["workloads"] = [
        {"type": "burst", "job": "edit", "count": 40, "start_s": 1.0, "tenant": "acme"},
        {"type": "burst", "job": "edit", "count": 40, "start_s": 1.0, "tenant": "globex"},
    ]
    result = run_scenario(parse_scenario(mapping, source="case.toml"), 0)
    tasks = result.tasks.sort_values("started_at")
    assert tasks["tenant"].value_counts().to_dict() == {"acme": 40, "globex": 40}
    window = list(tasks["tenant"][:40])  # both tenants backlogged all along
    assert window.count("acme") == 10 and window.count("globex") == 30
