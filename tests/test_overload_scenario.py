"""Overload protection on the shipped outage scenario: the policies run inside the real scheduler."""

from __future__ import annotations

from pathlib import Path

from aiqsim.overload import BreakerState
from aiqsim.sim.scenario import load_scenario
from aiqsim.sim.simulate import simulate

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "provider_outage.toml"
OUTAGE_START, OUTAGE_END = 60.0, 120.0


def outage_amplification(result) -> float:
    """Provider attempts per task, over the tasks submitted while the provider was down."""
    tasks = result.tasks
    during = tasks[(tasks["created_at"] >= OUTAGE_START) & (tasks["created_at"] < OUTAGE_END)]
    calls = result.calls[result.calls["task_id"].isin(during["task_id"])]
    return len(calls) / len(during)


def test_retry_budgets_cut_amplification_during_the_outage() -> None:
    unprotected = simulate(SCENARIO)
    budget = simulate(SCENARIO, overrides={"overload.retry_budget": "token_bucket"})
    ratio = simulate(SCENARIO, overrides={"overload.retry_budget": "ratio"})
    base = outage_amplification(unprotected)
    assert base > 3.0  # five attempts, most of them into a dead provider
    assert outage_amplification(budget) < base / 2
    assert outage_amplification(ratio) < base / 2
    assert budget.summary["rejected_locally"] > 0 and unprotected.summary["rejected_locally"] == 0
    for result in (unprotected, budget, ratio):
        assert result.summary["tasks_lost"] == 0


def test_the_breaker_opens_during_the_outage_and_closes_after_it() -> None:
    scenario = load_scenario(SCENARIO, overrides={"overload.circuit_breaker": True})
    cooldown = scenario.overload.breaker_cooldown_s
    result = simulate(scenario)
    transitions = result.breaker_transitions()
    opened = [t.time for t in transitions if t.new is BreakerState.OPEN]
    closed = [t.time for t in transitions if t.new is BreakerState.CLOSED]
    assert opened and closed
    # opens within a couple of seconds of the first failures (threshold 5 within 10 s at 4 req/s)
    assert OUTAGE_START <= opened[0] <= OUTAGE_START + 3.0
    # never closes while the provider is down; closes on the first probe after it is back
    assert all(t >= OUTAGE_END for t in closed)
    assert closed[0] <= OUTAGE_END + cooldown + 3.0
    # while open, almost nothing reaches the dead provider
    calls = result.calls
    down = calls[(calls["start"] >= opened[0]) & (calls["start"] < OUTAGE_END)]
    unprotected = simulate(SCENARIO).calls
    unprotected_down = unprotected[(unprotected["start"] >= opened[0]) & (unprotected["start"] < OUTAGE_END)]
    assert len(down) * 10 < len(unprotected_down)
