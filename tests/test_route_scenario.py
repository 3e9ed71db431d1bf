"""Routes in the lab: ``[[routes]]`` and ``route =`` in scenario files, their checks, the
per-deployment summary keys, overrides of a route's weights and tuning them."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest

from aiqsim.core.errors import ConfigurationError
from aiqsim.sim.route_metrics import DEPLOYMENT_KEYS, deployment_key_meaning
from aiqsim.sim.scenario import (
    ScenarioError,
    load_scenario,
    parse_scenario,
    scenario_to_dict,
)
from aiqsim.sim.simulate import simulate

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "scenarios" / "multi_deployment_tenants.toml"


def mapping(**route: Any) -> dict[str, Any]:
    """Two llm deployments and a tts provider; one route ``gpt`` over the llm ones."""
    return {
        "scenario": {"name": "routes", "seed": 4, "duration_s": 60.0, "drain_s": 300.0},
        "providers": [
            {"name": "east", "latency_base_s": 0.5, "price_per_1k_units": 0.01},
            {"name": "west", "latency_base_s": 1.0, "price_per_1k_units": 0.002},
            {"name": "voice", "kind": "tts"},
        ],
        "quotas": {"east": {"concurrency": 4}, "west": {"concurrency": 4}},
        "routes": [
            {"name": "gpt", "providers": ["east", "west"], "policy": "weighted", **route},
        ],
        "workloads": [
            {"type": "poisson", "route": "gpt", "rate_per_s": 3.0, "cost": {"dist": "fixed", "mean": 200.0}}
        ],
    }


def error_of(raw: dict[str, Any]) -> ScenarioError:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(raw, source="routes.toml")
    return caught.value


@pytest.mark.parametrize(
    ("change", "key_path", "fragment"),
    [
        (
            lambda m: m["routes"][0].update(providers=["east", "nowhere"]),
            "routes[0].providers[1]",
            "declared",
        ),
        (lambda m: m["routes"][0].update(providers=["east", "voice"]), "routes[0].providers", "one kind"),
        (lambda m: m["routes"][0].update(weights={"east": 1, "west": 0}), "routes[0].weights.west", "> 0"),
        (lambda m: m["routes"][0].update(weights={"east": 1, "west": -1}), "routes[0].weights.west", "> 0"),
        (lambda m: m["routes"][0].update(weights={"east": 1}), "routes[0].weights.west", "missing"),
        (
            lambda m: m["routes"][0].update(weights={"east": 1, "west": 1, "x": 1}),
            "routes[0].weights.x",
            "one of",
        ),
        (lambda m: m["routes"][0].update(name="east"), "routes[0].name", "no provider has"),
        (lambda m: m["routes"][0].update(policy="fastest"), "routes[0].policy", "least_loaded"),
        (
            lambda m: m["routes"][0].update(retry_elsewhere="yes"),
            "routes[0].retry_elsewhere",
            "true or false",
        ),
        (lambda m: m["routes"].append(dict(m["routes"][0])), "routes[1].name", "unique"),
        (lambda m: m["workloads"][0].update(route="nope"), "workloads[0].route", "[[routes]]"),
        (
            lambda m: m["workloads"][0].update(provider="east"),
            "workloads[0].provider",
            "one of provider or route",
        ),
    ],
)
def test_a_bad_route_is_refused_naming_the_file_and_key(change: Any, key_path: str, fragment: str) -> None:
    raw = mapping()
    change(raw)
    error = error_of(raw)
    assert error.key_path == key_path
    assert str(error).startswith(f"routes.toml: {key_path}: ")
    assert fragment in str(error)


def test_a_route_scenario_round_trips_and_reads_its_weights() -> None:
    scenario = parse_scenario(mapping(weights={"east": 1, "west": 3}), source="routes.toml")
    assert scenario.route("gpt").weights == {"east": 1.0, "west": 3.0}
    assert scenario.workloads[0].target == "gpt" and scenario.workloads[0].provider == ""
    assert parse_scenario(copy.deepcopy(scenario_to_dict(scenario)), source="routes.toml") == scenario


def test_the_summary_has_each_deployments_share_p99_and_cost() -> None:
    scenario = parse_scenario(mapping(weights={"east": 1, "west": 3}), source="routes.toml")
    result = simulate(scenario, seed=1)
    s = result.summary
    shares = [s["deployment_east_call_share"], s["deployment_west_call_share"]]
    assert math.fsum(shares) == pytest.approx(1.0)
    assert s["deployment_west_call_share"] == pytest.approx(0.75, abs=0.06)  # ~180 calls at 1:3
    assert math.fsum([s["deployment_east_cost"], s["deployment_west_cost"]]) == pytest.approx(s["cost_total"])
    calls = result.calls
    for name in ("east", "west"):
        assert s[f"deployment_{name}_call_share"] == pytest.approx((calls["provider"] == name).mean())
        mine = result.tasks[(result.tasks["provider"] == name) & (result.tasks["status"] == "succeeded")]
        assert s[f"deployment_{name}_success_latency_p99_s"] == pytest.approx(
            mine["latency_s"].quantile(0.99)
        )
    # the slower deployment (1 s base) answers slower at the 99th percentile
    assert s["deployment_west_success_latency_p99_s"] > s["deployment_east_success_latency_p99_s"]
    for key in ("call_share", "success_latency_p99_s", "cost"):
        assert deployment_key_meaning(f"deployment_east_{key}") == f"deployment east: {DEPLOYMENT_KEYS[key]}"
    assert deployment_key_meaning("deployment_east_nothing") == ""


def test_a_weight_is_overridden_per_provider_and_moves_the_share() -> None:
    light = simulate(SHIPPED, seed=3, overrides={"routes.gpt.weights.cheap": 0.25}).summary
    heavy = simulate(SHIPPED, seed=3, overrides={"routes.gpt.weights.cheap": 3}).summary
    assert light["deployment_cheap_call_share"] == pytest.approx(0.2, abs=0.04)  # 0.25 / 1.25
    assert heavy["deployment_cheap_call_share"] == pytest.approx(0.75, abs=0.04)  # 3 / 4
    assert heavy["cost_total"] < light["cost_total"]  # cheap is cheaper per unit
    with pytest.raises(ScenarioError, match=r"routes\[0\]\.weights\.nope"):
        load_scenario(SHIPPED, {"routes.gpt.weights.nope": 1})


def test_tune_accepts_a_route_weight_as_a_parameter() -> None:
    from aiqsim.lab.tune import tune

    with pytest.raises(ConfigurationError, match=r"routes\[0\]\.weights\.cheap"):  # checked before any trial
        tune(SHIPPED, ["routes.gpt.weights.cheap=-1:1"], trials=1, seeds=1, progress=False)
    try:
        import optuna  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigurationError, match="tuning needs Optuna"):  # the key passed its check
            tune(SHIPPED, ["routes.gpt.weights.cheap=0.1:3:log"], trials=1, seeds=1, progress=False)
        return
    result = tune(
        SHIPPED,
        ["routes.gpt.weights.cheap=0.1:3:log"],
        constraints=["success_latency_p99_s<=8"],
        trials=3,
        seeds=1,
        progress=False,
    )
    assert 0.1 <= result.best_params["routes.gpt.weights.cheap"] <= 3


def test_every_policy_runs_the_shipped_scenario() -> None:
    for policy in ("weighted", "least_loaded", "lowest_latency", "most_headroom", "cheapest"):
        s = simulate(
            SHIPPED, seed=2, overrides={"routes.gpt.policy": policy, "scenario.duration_s": 60}
        ).summary
        assert s["tasks_lost"] == 0 and s["tasks_succeeded"] > 200, policy
        assert s["deployment_fast_call_share"] + s["deployment_cheap_call_share"] == pytest.approx(1.0)


def test_both_result_modes_report_the_deployment_keys() -> None:
    full = simulate(SHIPPED, seed=5).summary
    streamed = simulate(SHIPPED, seed=5, records="summary").summary
    keys = [key for key in full if key.startswith("deployment_")]
    assert len(keys) == 6 and keys == [key for key in streamed if key.startswith("deployment_")]
    for key in keys:
        if key.endswith("_p99_s"):  # within the streaming histogram's relative error (0.1%)
            assert streamed[key] == pytest.approx(full[key], rel=0.005), key
        else:  # counts and exactly rounded sums: the same to the last bit
            assert streamed[key] == full[key], key
