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
from aiqsim.validation.mmc import erlang_c, expected_wait_in_queue, t_interval_95
from aiqsim.validation.priority import priority_waits

THEORY = Path(__file__).resolve().parent.parent / "scenarios" / "theory"
SEEDS = range(1, 5)


def _interval(values: list[float]) -> tuple[float, float, float]:
    mean, half = t_interval_95(values)
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


def test_mmc_with_exponential_calls_waits_as_erlang_c_says() -> None:
    # M/M/4 at 75% load: P(wait) = C(4, 3) = 0.5094, Wq = C / (c mu - lambda) = 0.5094 s. The chance
    # of waiting is the tight check (about 1.3% standard error per seed here); the mean wait of a
    # queue this loaded spreads far more between seeds (about 14%), so its bound is looser.
    chance, mean_wait = erlang_c(4, 3.0), erlang_c(4, 3.0) / (4 * 1.0 - 3.0)
    waited, waits, services = [], [], []
    for seed in SEEDS:
        result = simulate(THEORY / "mmc_erlang_c.toml", seed=seed)
        tasks = result.tasks
        assert (tasks.status == "succeeded").all()
        settled = tasks[tasks.created_at > 0.1 * result.scenario.duration_s]
        waited.append(float((settled.wait_s > 1e-9).mean()))
        waits.append(float(settled.wait_s.mean()))
        services.append(float((settled.latency_s - settled.wait_s).mean()))
    for values, expected, tolerance in (
        (waited, chance, 0.04),
        (waits, mean_wait, 0.15),
        (services, 1.0, 0.03),
    ):
        mean, low, high = _interval(values)
        assert low <= expected <= high, (values, expected)
        assert abs(mean / expected - 1) < tolerance, (values, expected)


def test_two_priority_classes_wait_as_the_non_preemptive_priority_formula_says() -> None:
    # M/M/2, interactive 0.5/s before background 0.9/s: either class waits when both slots are busy
    # (Erlang C, 0.5765), and the mean waits are Cobham's 0.384 s and 1.281 s; one FIFO queue
    # for both would give 0.961 s to each, outside the interactive interval.
    chance = erlang_c(2, 1.4)
    expected = dict(zip(("interactive", "background"), priority_waits((0.5, 0.9), 1.0, 2), strict=True))
    waited: dict[str, list[float]] = {"interactive": [], "background": []}
    waits: dict[str, list[float]] = {"interactive": [], "background": []}
    for seed in SEEDS:
        result = simulate(THEORY / "priority_two_classes.toml", seed=seed)
        tasks = result.tasks
        assert (tasks.status == "succeeded").all()
        settled = tasks[tasks.created_at > 0.1 * result.scenario.duration_s]
        for name, group in settled.groupby("priority"):
            waited[str(name)].append(float((group.wait_s > 1e-9).mean()))
            waits[str(name)].append(float(group.wait_s.mean()))
    for name in ("interactive", "background"):
        mean, low, high = _interval(waited[name])
        assert low <= chance <= high and abs(mean / chance - 1) < 0.05, (name, waited[name], chance)
        mean, low, high = _interval(waits[name])
        assert low <= expected[name] <= high, (name, waits[name], expected[name])
    mean, low, high = _interval(waits["interactive"])
    assert abs(mean / expected["interactive"] - 1) < 0.1
    assert not low <= expected_wait_in_queue(1.4, 1.0, 2) <= high  # a single FIFO queue is told apart


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


def test_latency_dist_is_checked_where_it_is_written() -> None:
    from aiqsim.sim.scenario import ScenarioError, parse_scenario

    base = {
        "scenario": {"name": "x", "duration_s": 10.0},
        "workloads": [{"type": "poisson", "provider": "p", "rate_per_s": 1.0}],
    }
    exponential = parse_scenario({**base, "providers": [{"name": "p", "latency_dist": "exponential"}]})
    assert exponential.provider("p").latency_dist == "exponential"
    with pytest.raises(
        ScenarioError,
        match=r"providers\[0\]\.latency_sigma: expected 0 \(unset\) with latency_dist = \"exponential\"",
    ):
        parse_scenario(
            {**base, "providers": [{"name": "p", "latency_dist": "exponential", "latency_sigma": 0.5}]}
        )
    with pytest.raises(ScenarioError, match=r"providers\[0\]\.latency_dist"):
        parse_scenario({**base, "providers": [{"name": "p", "latency_dist": "gamma"}]})


def test_exponential_noise_has_mean_one_and_the_exponential_quantiles() -> None:
    from aiqsim.sim.providers import exponential_noise

    assert exponential_noise(0.0) == 0.0
    assert exponential_noise(0.5) == pytest.approx(math.log(2.0))
    assert exponential_noise(1 - math.exp(-3.0)) == pytest.approx(3.0)
    draws = [exponential_noise((i + 0.5) / 100_000) for i in range(100_000)]  # a fine quadrature
    assert statistics.fmean(draws) == pytest.approx(1.0, rel=1e-3)
