"""Scenario files with known answers: the whole simulate() path against queueing theory.

tests/test_validation.py drives the production scheduler directly (M/M/c against Erlang C); these
run shipped scenario files (scenarios/theory/), so the loader, the Poisson workload, the simulated
provider's latency model and the quota's slots are checked along with the scheduler. Each check
uses fixed seeds: a failure replays exactly.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from aiqsim.sim.simulate import simulate
from aiqsim.validation.loss import erlang_b
from aiqsim.validation.mmc import t_quantile_975

THEORY = Path(__file__).resolve().parent.parent / "scenarios" / "theory"
SEEDS = range(1, 5)


def _interval(values: list[float]) -> tuple[float, float, float]:
    mean = statistics.fmean(values)
    half = t_quantile_975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def test_md1_mean_wait_is_the_pollaczek_khinchine_value() -> None:
    rho, service_s = 0.8, 1.0
    expected = rho * service_s / (2 * (1 - rho))  # 2.0 s
    waits = []
    for seed in SEEDS:
        result = simulate(THEORY / "md1_pollaczek_khinchine.toml", seed=seed)
        tasks = result.tasks
        assert (tasks.status == "succeeded").all() and result.summary["tasks_rejected"] == 0
        assert tasks.latency_s.sub(tasks.wait_s).round(9).eq(service_s).all()  # every call took 1 s
        settled = tasks[tasks.created_at > 0.1 * result.scenario.duration_s]  # past the empty start
        waits.append(float(settled.wait_s.mean()))
    mean, low, high = _interval(waits)
    assert low <= expected <= high, (waits, mean)
    assert abs(mean / expected - 1) < 0.05, waits


def test_a_limit_of_zero_refuses_the_erlang_b_share_of_arrivals() -> None:
    expected = erlang_b(4, 3.0)  # 0.2061
    shares = []
    for seed in SEEDS:
        summary = simulate(THEORY / "erlang_b_loss.toml", seed=seed).summary
        arrivals = summary["tasks_submitted"] + summary["tasks_rejected"]
        shares.append(summary["tasks_rejected"] / arrivals)
        assert summary["success_latency_p99_s"] == pytest.approx(1.0)  # what is accepted never waits
    mean, low, high = _interval(shares)
    assert low <= expected <= high, (shares, mean)
    assert abs(mean / expected - 1) < 0.05, shares
