"""A job stage that names a route (``route = "NAME"`` in ``[[jobs.stages]]``): its checks, its calls spread
over the route's deployments by the production scheduler's route, the per-deployment summary keys, the
quota check over every deployment, the JSON schema and the shipped scenario."""

from __future__ import annotations

import copy
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from aiqsim.core.errors import ConfigurationError
from aiqsim.sim.job_config import StageConfig
from aiqsim.sim.job_templates import job_spec
from aiqsim.sim.scenario import ScenarioError, load_scenario, parse_scenario, scenario_to_dict
from aiqsim.sim.scenario_schema import scenario_json_schema
from aiqsim.sim.simulate import simulate

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "scenarios" / "pipeline_over_deployments.toml"


def mapping() -> dict[str, Any]:
    """A two-stage job: ``draft`` on the provider ``writer``, then ``answer`` on the route ``gpt`` over
    ``east`` and ``west`` with weights 1:3. No failures, so every task is one call."""
    return {
        "scenario": {"name": "job_routes", "seed": 11, "duration_s": 300.0, "drain_s": 300.0},
        "providers": [
            {"name": "writer", "latency_base_s": 0.2},
            {"name": "east", "latency_base_s": 0.3, "price_per_1k_units": 0.01},
            {"name": "west", "latency_base_s": 0.3, "price_per_1k_units": 0.002},
            {"name": "voice", "kind": "tts"},
        ],
        "routes": [{"name": "gpt", "providers": ["east", "west"], "weights": {"east": 1, "west": 3}}],
        "jobs": [
            {
                "name": "pipeline",
                "stages": [
                    {"name": "draft", "provider": "writer"},
                    {"name": "answer", "route": "gpt", "after": ["draft"]},
                ],
            }
        ],
        "workloads": [{"type": "poisson", "job": "pipeline", "rate_per_s": 2.0}],
    }


def error_of(raw: dict[str, Any]) -> ScenarioError:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(raw, source="job_routes.toml")
    return caught.value


# --- the run ---------------------------------------------------------------------------------------


def test_a_routed_stage_splits_its_calls_by_the_weights() -> None:
    result = simulate(parse_scenario(mapping(), source="job_routes.toml"))
    s = result.summary
    assert s["jobs_submitted"] == s["jobs_succeeded"] == 605 and s["tasks_lost"] == 0
    calls = result.calls["provider"].value_counts().to_dict()
    # the first stage stays on its provider; every call of the routed stage goes to a deployment
    assert calls == {"writer": 605, "west": 443, "east": 162}
    # seeded, so exact; the behaviour claim is the share: a weighted draw is binomial, and p = 1/4 over
    # n = 605 calls has a standard deviation of sqrt(p (1 - p) / n) = 0.0176 (this run's 162/605 = 0.268
    # is 1.0 of them off); 4 of them (a 1 in 15,000 miss for another seed) bound it
    n, p = calls["east"] + calls["west"], 0.25
    assert abs(calls["east"] / n - p) <= 4 * math.sqrt(p * (1 - p) / n)
    assert s["deployment_east_call_share"] == calls["east"] / n
    assert s["deployment_west_call_share"] == calls["west"] / n
    assert s["deployment_east_cost"] > 0 and s["deployment_west_cost"] > 0
    rows = result.stage_breakdown()
    assert dict(zip(rows["stage"], rows["provider"], strict=True)) == {"draft": "writer", "answer": "gpt"}


def test_without_the_route_the_stage_runs_on_one_provider() -> None:
    # the test above fails on a loader that ignores route: here the same stage on a provider
    raw = mapping()
    raw["jobs"][0]["stages"][1] = {"name": "answer", "provider": "east", "after": ["draft"]}
    calls = simulate(parse_scenario(raw)).calls["provider"].value_counts().to_dict()
    assert calls == {"writer": 605, "east": 605}


def test_the_stage_becomes_a_production_stage_naming_the_route() -> None:
    scenario = parse_scenario(mapping())
    spec = job_spec(scenario.jobs[0], scenario)
    assert [stage.provider for stage in spec.stages] == ["writer", "gpt"]  # the scheduler resolves gpt
    assert scenario.jobs[0].stages[1].route == "gpt" and scenario.jobs[0].stages[1].provider is None


def test_both_result_modes_count_the_routed_stage_calls() -> None:
    scenario = parse_scenario(mapping())
    full = simulate(scenario).summary
    streamed = simulate(scenario, records="summary").summary
    for name in ("east", "west"):
        assert streamed[f"deployment_{name}_call_share"] == full[f"deployment_{name}_call_share"]
        assert streamed[f"deployment_{name}_cost"] == pytest.approx(full[f"deployment_{name}_cost"])


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_a_crash_mid_run_leaves_every_routed_job_terminal_and_bills_no_call_twice(store: str) -> None:
    # recovery re-drives the stored jobs through the same route: a resumed call keeps its deployment,
    # a stage submitted again dedups on its key (the same on every deployment)
    raw = mapping()
    for provider in raw["providers"]:
        provider["honours_idempotency"] = True
    raw["jobs"][0]["stages"][1]["fanout"] = {"dist": "fixed", "mean": 3}
    raw["store"] = {"kind": store}
    raw["crashes"] = [{"at_s": 4.0, "restart_after_s": 2.0}]
    raw["workloads"] = [{"type": "poisson", "job": "pipeline", "rate_per_s": 2.0, "count": 20}]
    result = simulate(parse_scenario(raw), seed=3)
    s = result.summary
    assert s["crashes"] == 1 and s["jobs_submitted"] == 20
    assert s["orphans_reconciled"] == 3  # the crash caught one job's 3 answer calls on west
    assert s["jobs_lost"] == 0 and s["tasks_lost"] == 0
    assert s["jobs_succeeded"] == 20
    assert s["duplicate_billed_calls"] == 0
    calls = result.calls[result.calls["billed"]]["provider"].value_counts().to_dict()
    assert calls["writer"] == 20 and calls["east"] + calls["west"] == 60  # 3 answer calls per job


def test_a_routed_stage_round_trips() -> None:
    scenario = parse_scenario(mapping(), source="job_routes.toml")
    written = scenario_to_dict(scenario)
    assert written["jobs"][0]["stages"][1]["route"] == "gpt"
    assert "provider" not in written["jobs"][0]["stages"][1]
    assert "route" not in written["jobs"][0]["stages"][0]
    assert parse_scenario(written, source="job_routes.toml") == scenario


# --- the checks ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "key_path", "fragments"),
    [
        (
            lambda stage: stage.update(route="nope"),
            "jobs[0].stages[1].route",
            ("expected the name of a [[routes]] entry (gpt)", 'got "nope"'),
        ),
        (
            lambda stage: stage.update(provider="east"),
            "jobs[0].stages[1].provider",
            ("does not apply with route = 'gpt'", "give one of provider or route"),
        ),
        (
            lambda stage: stage.pop("route"),
            "jobs[0].stages[1].provider",
            ("missing", "declared provider (writer, east, west, voice)", "[[routes]] entry (gpt)"),
        ),
        (lambda stage: stage.update(route="1gpt"), "jobs[0].stages[1].route", ("expected a name",)),
    ],
    ids=["unknown route", "provider and route", "neither", "not a name"],
)
def test_a_bad_stage_target_names_the_file_key_and_the_declared_routes(
    change: Any, key_path: str, fragments: tuple[str, ...]
) -> None:
    raw = mapping()
    change(raw["jobs"][0]["stages"][1])
    error = error_of(raw)
    assert error.key_path == key_path
    assert str(error).startswith(f"job_routes.toml: {key_path}: ")
    for fragment in fragments:
        assert fragment in str(error), (fragment, str(error))


def test_a_stage_route_with_no_routes_declared_says_so() -> None:
    raw = mapping()
    del raw["routes"]
    error = error_of(raw)
    assert error.key_path == "jobs[0].stages[1].route" and "(none declared)" in str(error)


@pytest.mark.parametrize("small", ["east", "west"])
def test_a_fixed_size_must_fit_the_quota_of_every_deployment_of_the_route(small: str) -> None:
    raw = mapping()
    raw["quotas"] = {"east": {"units_per_min": 5000}, "west": {"units_per_min": 5000}}
    raw["quotas"][small]["unit_burst"] = 100
    raw["jobs"][0]["stages"][1]["size"] = {"dist": "fixed", "mean": 400}
    error = error_of(raw)
    assert error.key_path == "jobs[0].stages[1].size.mean"
    assert f"the client quota of {small!r} can never grant more" in str(error)
    assert "got 400 per call" in str(error)
    raw["quotas"][small]["unit_burst"] = 400  # both can grant it: accepted
    parse_scenario(raw)


def test_a_stage_record_takes_exactly_one_of_provider_or_route() -> None:
    assert StageConfig("a", route="gpt").target == "gpt"
    assert StageConfig("a", "llm").target == "llm"
    for kwargs in ({}, {"provider": "llm", "route": "gpt"}):
        with pytest.raises(ConfigurationError, match="exactly one of provider or route"):
            StageConfig("a", **kwargs)


# --- the JSON schema agrees ------------------------------------------------------------------------

VALIDATOR = jsonschema.Draft7Validator(scenario_json_schema())


def test_the_schema_accepts_a_routed_stage_and_refuses_both_or_neither() -> None:
    assert list(VALIDATOR.iter_errors(mapping())) == []
    both, neither, unknown = mapping(), mapping(), mapping()
    both["jobs"][0]["stages"][1]["provider"] = "east"
    del neither["jobs"][0]["stages"][1]["route"]
    unknown["jobs"][0]["stages"][1]["route"] = "nope"
    for document in (both, neither):
        assert list(VALIDATOR.iter_errors(copy.deepcopy(document))) != []
        error_of(document)
    # a route that no [[routes]] entry has is a cross-reference: the loader's alone
    assert list(VALIDATOR.iter_errors(unknown)) == []
    error_of(unknown)


# --- the shipped scenario --------------------------------------------------------------------------


def test_aiqsim_validate_accepts_the_shipped_scenario() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "aiqsim", "validate", str(SHIPPED)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert ": ok" in result.stdout


def test_the_shipped_scenario_spreads_its_answer_stage_over_both_deployments() -> None:
    scenario = load_scenario(SHIPPED)
    assert scenario.jobs[0].stages[1].route == "gpt"
    result = simulate(scenario)
    s = result.summary
    assert s["tasks_lost"] == 0 and s["jobs_failed"] == 0
    calls = result.calls["provider"].value_counts().to_dict()
    n = calls["east"] + calls["west"]
    assert n >= s["jobs_submitted"]  # one answer per job, retries on top
    assert abs(s["deployment_east_call_share"] - 0.25) <= 4 * math.sqrt(0.25 * 0.75 / n)
    assert s["bottleneck_stage"] == "answer"
