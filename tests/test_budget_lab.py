"""The lab's [budget] table: validation naming file, key and what was expected; the budget in a
simulated run (the summary's spend and refused_by_budget, both record modes); the schema."""

from __future__ import annotations

import math
import tomllib
from typing import Any

import pytest

from aiqsim.sim.scenario import ScenarioError, parse_scenario, scenario_to_dict
from aiqsim.sim.scenario_schema import scenario_json_schema
from aiqsim.sim.simulate import simulate

BASE = """
[scenario]
name = "budget"
seed = 3
duration_s = 60
drain_s = 600

[[providers]]
name = "llm"
latency_base_s = 0.5
price_per_1k_units = 2.0

[[workloads]]
type = "poisson"
provider = "llm"
rate_per_s = 2
[workloads.cost]
dist = "fixed"
mean = 1000
"""
"""Every task is 1,000 units at 2.0 per 1,000: it costs 2.0."""


def scenario(budget: str, source: str = "budget.toml") -> Any:
    return parse_scenario(tomllib.loads(BASE + "\n[budget]\n" + budget), source=source)


def test_a_run_spends_no_more_than_its_budget_and_counts_what_it_refused() -> None:
    result = simulate(scenario("per_day = 50.0"))
    s = result.summary
    assert s["spend"] == pytest.approx(50.0)  # 25 tasks of 2.0 fit; the day is not over by the end
    assert s["spend"] == pytest.approx(s["cost_total"])  # the budget's default prices are the bill's
    assert s["tasks_succeeded"] == 25
    assert s["refused_by_budget"] == s["tasks_failed"] == s["tasks_submitted"] - 25 > 0
    assert s["rejected_locally"] == s["refused_by_budget"]
    errors = result.tasks[result.tasks["status"] == "failed"]["error"]
    assert errors.str.startswith("BudgetExceeded: budget per_day spent").all()
    streamed = simulate(scenario("per_day = 50.0"), records="summary").summary
    assert (streamed["spend"], streamed["refused_by_budget"]) == (s["spend"], s["refused_by_budget"])


def test_the_budget_resets_each_day_and_prices_can_be_given() -> None:
    s = simulate(scenario("per_day = 10.0\nday_s = 20\nprices = { llm = 0.001 }")).summary
    # 1.0 per task: 10 a day, three days of arrivals in the 60 s run
    assert s["tasks_succeeded"] == 30 and s["spend"] == pytest.approx(30.0)
    assert s["cost_total"] == pytest.approx(60.0)  # what the provider billed, at its own price
    none = simulate(scenario("")).summary
    assert none["spend"] == 0 and none["refused_by_budget"] == 0 and none["tasks_failed"] == 0


@pytest.mark.parametrize(
    ("budget", "key", "expected"),
    [
        ("per_day = -1.0", "budget.per_day", 'expected a number >= 0 or "none", got -1'),
        ("per_day = nan", "budget.per_day", 'expected a number >= 0 or "none", got nan'),
        ("per_tenant_per_day = -5", "budget.per_tenant_per_day", "expected a number >= 0"),
        ("prices = { gpt = 1.0 }", "budget.prices.gpt", "expected a declared provider's name (one of: llm)"),
        (
            "prices = { llm = -0.5 }",
            "budget.prices.llm",
            "expected a number >= 0 (the price per unit), got -0.5",
        ),
        (
            "prices = { llm = nan }",
            "budget.prices.llm",
            "expected a number >= 0 (the price per unit), got nan",
        ),
        ("prices = 3", "budget.prices", "expected a table of provider name = price per unit"),
        ("day_s = 0", "budget.day_s", "expected a number > 0"),
        ("per_week = 3", "budget.per_week", "unknown key; expected one of: per_day, per_tenant_per_day"),
    ],
)
def test_bad_budget_keys_name_the_file_the_key_and_what_was_expected(
    budget: str, key: str, expected: str
) -> None:
    with pytest.raises(ScenarioError) as caught:
        scenario(budget)
    text = str(caught.value)
    assert "budget.toml" in text and key in text and expected in text, text


def test_the_budget_round_trips_and_is_in_the_schema() -> None:
    parsed = scenario("per_day = 5.0\nper_tenant_per_day = 1.0\nprices = { llm = 0.25 }\nday_s = 3600")
    assert parse_scenario(scenario_to_dict(parsed), source=parsed.source) == parsed
    assert parsed.budget.prices == {"llm": 0.25} and parsed.budget.day_s == 3600.0
    node = scenario_json_schema()["properties"]["budget"]
    assert set(node["properties"]) == {"per_day", "per_tenant_per_day", "prices", "day_s"}
    assert node["properties"]["prices"]["additionalProperties"] == {"type": "number", "minimum": 0}
    assert math.isclose(node["properties"]["day_s"]["default"], 86_400.0)


def test_prometheus_counts_the_budget_as_the_summary_does() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from aiqsim.observability import PrometheusMetrics
    from aiqsim.scheduler.events import BudgetCharged, BudgetRefused

    metrics = PrometheusMetrics(prometheus_client.CollectorRegistry())
    result = simulate(scenario("per_day = 50.0"), sinks=[metrics])
    s = result.summary
    assert metrics.value("aiqsim_budget_spend_total", provider="llm") == pytest.approx(s["spend"])
    assert metrics.value("aiqsim_budget_refused_total", budget="per_day") == s["refused_by_budget"] > 0
    refusals = [e for e in result.events if isinstance(e, BudgetRefused)]
    assert len(refusals) == s["refused_by_budget"]
    assert {e.resets_at for e in refusals} == {86_400.0}  # the day resets a day after the run's start
    assert math.fsum(e.billed for e in result.events if isinstance(e, BudgetCharged)) == pytest.approx(50.0)
