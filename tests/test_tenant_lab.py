"""Tenants in the lab: [tenants.NAME] and workloads' tenant = in scenario files, per-tenant summary keys
in both result modes, and the noisy tenant's effect with and without fair sharing."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from aiqsim.cli import format_summary
from aiqsim.sim.scenario import ScenarioError, load_scenario, parse_scenario, scenario_to_dict
from aiqsim.sim.simulate import simulate
from aiqsim.sim.tenant_metrics import TENANT_KEYS, tenant_key_meaning

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
NOISY = SCENARIOS / "noisy_tenant.toml"


def mapping(**extra: object) -> dict:
    base: dict = {
        "scenario": {"name": "t", "duration_s": 20},
        "providers": [{"name": "llm", "latency_base_s": 1.0, "latency_per_unit_s": 0.0}],
        "quotas": {"llm": {"concurrency": 2}},
        "tenants": {"acme": {"weight": 1}, "globex": {"weight": 3, "max_queued": 50}},
        "workloads": [
            {"type": "poisson", "provider": "llm", "tenant": "acme", "rate_per_s": 4.0},
            {"type": "poisson", "provider": "llm", "tenant": "globex", "rate_per_s": 4.0},
        ],
    }
    base.update(extra)
    return base


def test_tenants_and_workload_tenants_load_and_round_trip() -> None:
    scenario = parse_scenario(mapping(), "t.toml")
    assert scenario.tenants["globex"].weight == 3.0 and scenario.tenants["globex"].max_queued == 50
    assert [w.tenant for w in scenario.workloads] == ["acme", "globex"]
    assert parse_scenario(scenario_to_dict(scenario), "t.toml") == scenario


@pytest.mark.parametrize(
    ("change", "key", "expected"),
    [
        ({"tenants": {"acme": {"weight": 0}}}, "tenants.acme.weight", "a number > 0"),
        ({"tenants": {"acme": {"weight": "nan"}}}, "tenants.acme.weight", "a number > 0"),
        ({"tenants": {"acme": {"max_queued": -1}}}, "tenants.acme.max_queued", "an integer >= 0"),
        ({"tenants": {"acme": {"share": 1}}}, "tenants.acme.share", "unknown key"),
        ({"tenants": {"1x": {}}}, "tenants.1x", "a name"),
        ({"tenants": {"acme": 3}}, "tenants.acme", "expected"),
        ({"tenants": {}}, "workloads[0].tenant", "none declared"),
    ],
)
def test_bad_tenant_settings_name_the_file_the_key_and_what_was_expected(
    change: dict, key: str, expected: str
) -> None:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(mapping(**change), "bad.toml")
    assert caught.value.file == "bad.toml" and caught.value.key_path == key
    assert expected in str(caught.value)


def test_a_workload_naming_an_undeclared_tenant_is_refused() -> None:
    values = mapping()
    values["workloads"][1]["tenant"] = "initech"
    with pytest.raises(ScenarioError, match=r"workloads\[1\]\.tenant.*\(acme, globex\).*initech"):
        parse_scenario(values, "bad.toml")


def test_without_tenants_the_summary_has_no_tenant_keys() -> None:
    summary = simulate(SCENARIOS / "sjf_vs_fifo.toml").summary
    assert not any(key.startswith("tenant_") for key in summary)


def test_per_tenant_keys_agree_between_the_two_result_modes() -> None:
    full = simulate(NOISY).summary
    streamed = simulate(NOISY, records="summary").summary
    for name in ("acme", "globex"):
        share = f"tenant_{name}_service_share"
        p99 = f"tenant_{name}_success_latency_p99_s"
        assert streamed[share] == full[share]
        assert math.isclose(streamed[p99], full[p99], rel_tol=0.02)
    assert math.isclose(full["tenant_acme_service_share"] + full["tenant_globex_service_share"], 1.0)
    table = format_summary(full)
    assert "tenant globex: 99th percentile" in table
    assert set(TENANT_KEYS) == {"success_latency_p99_s", "service_share"}
    assert tenant_key_meaning("tenant_my-co_service_share").startswith("tenant my-co:")


def test_the_noisy_tenant_does_not_slow_the_quiet_one_unless_fair_sharing_is_off() -> None:
    scenario = load_scenario(NOISY)
    fair = simulate(scenario)
    fifo_scenario = dataclasses.replace(
        scenario,
        tenants={},
        workloads=tuple(dataclasses.replace(w, tenant=None) for w in scenario.workloads),
    )
    fifo = simulate(fifo_scenario).tasks
    assert fair.tasks["tenant"].value_counts().to_dict().keys() == {"acme", "globex"}
    assert fifo["tenant"].isna().all()
    quiet_fifo_p99 = fifo[fifo["task_id"].str.startswith("w1-")]["latency_s"].quantile(0.99)
    quiet_fair_p99 = fair.summary["tenant_globex_success_latency_p99_s"]
    assert quiet_fair_p99 < 3.0  # one 1 s call, plus the wait for a slot to free
    assert quiet_fifo_p99 > 100 * quiet_fair_p99
    assert fair.summary["tenant_acme_success_latency_p99_s"] > 100  # acme waits behind its own backlog


def test_a_tenants_max_queued_refuses_its_surplus_at_the_door() -> None:
    result = simulate(NOISY, overrides={"tenants.acme.max_queued": 10})
    rejected = result.tasks[result.tasks["status"] == "rejected"]
    assert len(rejected) > 0 and (rejected["tenant"] == "acme").all()
    assert rejected["error"].str.contains("tenant 'acme'").all()
    assert result.summary["tenant_globex_success_latency_p99_s"] < 3.0
