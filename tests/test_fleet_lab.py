"""The fleet in the lab: N real schedulers on one SimPy runtime, a shared or a split quota.

Everything runs the production Scheduler; these tests check what the [fleet] section changes (and
that without it nothing changes), and what the fleet metrics say about shared vs split quotas.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.fleet_quota import SharedMultiQuota, WorkerCappedQuota, split_quota_limits
from aiqsim.core.token_bucket import MultiQuota, QuotaLimits
from aiqsim.sim import simulate
from aiqsim.sim.fleet_metrics import FLEET_SUMMARY_KEYS, fleet_key_meaning
from aiqsim.sim.fleet_routing import fleet_worker_index
from aiqsim.sim.scenario import ScenarioError, load_scenario, parse_scenario, scenario_to_dict
from aiqsim.sim.simulate import run_scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
FLEET = SCENARIOS / "fleet_uneven_load.toml"
SHIPPED = sorted(p for p in SCENARIOS.glob("*.toml") if not p.stem.startswith("fleet_"))
SEEDS = (16, 1, 2)


# --- workers = 1 is the single scheduler of before ----------------------------------------------


def _same(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all(
        (math.isnan(a[k]) and math.isnan(b[k]))
        if isinstance(a[k], float) and math.isnan(a[k])
        else a[k] == b[k]
        for k in a
    )


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_one_worker_with_every_fleet_option_gives_the_results_of_no_fleet_section(path: Path) -> None:
    """A [fleet] of one worker must not route, split or share anything: same summary, tasks, calls.

    (The shipped scenarios' summaries, tasks and calls were also compared with the code before the
    fleet existed, by running both: byte-identical.)"""
    plain = simulate(path)
    one = simulate(
        path,
        overrides={
            "fleet.workers": 1,
            "fleet.quota": "split",
            "fleet.routing": "weighted",
            "fleet.weights": [3.0],
            "fleet.slot_poll_s": 0.5,
        },
    )
    assert _same(plain.summary, one.summary)
    assert not set(FLEET_SUMMARY_KEYS) & set(plain.summary)
    pd.testing.assert_frame_equal(plain.tasks, one.tasks)
    pd.testing.assert_frame_equal(plain.calls, one.calls)
    assert set(plain.tasks["worker"].dropna()) <= {0}


def test_one_worker_gets_a_private_quota_and_no_worker_id() -> None:
    schedulers = []
    scenario = load_scenario(FLEET, overrides={"fleet.workers": 1, "fleet.routing": "round_robin"})
    run_scenario(scenario, 0, on_new_scheduler=schedulers.append)
    assert len(schedulers) == 1
    assert type(schedulers[0].quota("llm")) is MultiQuota
    assert schedulers[0].worker_id is None


# --- N workers: who gets which quota object -----------------------------------------------------


def test_shared_workers_hold_the_same_quota_object_and_split_workers_their_own_share() -> None:
    shared, split = [], []
    run_scenario(
        load_scenario(FLEET, overrides={"scenario.duration_s": 10}), 0, on_new_scheduler=shared.append
    )
    run_scenario(
        load_scenario(FLEET, overrides={"scenario.duration_s": 10, "fleet.quota": "split"}),
        0,
        on_new_scheduler=split.append,
    )
    assert [s.worker_id for s in shared] == ["worker-0", "worker-1", "worker-2", "worker-3"]
    assert isinstance(shared[0].quota("llm"), SharedMultiQuota)
    assert all(s.quota("llm") is shared[0].quota("llm") for s in shared)
    assert len({id(s.quota("llm")) for s in split}) == 4
    assert [s.quota("llm").limits.concurrency for s in split] == [2, 2, 2, 2]
    assert all(s.quota("llm").limits.requests_per_min == 29 for s in split)


def test_split_shares_add_up_to_the_account() -> None:
    limits = QuotaLimits(requests_per_min=120, tokens_per_min=9000, concurrency=10, request_burst=2)
    shares = split_quota_limits(limits, 4)
    assert [s.concurrency for s in shares] == [3, 3, 2, 2]
    assert sum(s.requests_per_min for s in shares) == pytest.approx(120)
    assert sum(s.tokens_per_min for s in shares) == pytest.approx(9000)
    assert all(s.request_burst == 1.0 for s in shares)  # 2 / 4 rounds up to the one-request floor
    assert all(s.token_burst is None for s in shares)  # the default: a minute of the share
    assert split_quota_limits(QuotaLimits(requests_per_min=60), 3)[0].request_burst == 20
    few = split_quota_limits(QuotaLimits(concurrency=2), 3)
    assert [s.concurrency for s in few] == [1, 1, 1]
    assert split_quota_limits(limits, 1) == [limits]
    for bad in (0, -1, 2.5, True, "4"):
        with pytest.raises(ConfigurationError, match="workers"):
            split_quota_limits(limits, bad)  # type: ignore[arg-type]


def test_a_shared_concurrency_pool_is_never_exceeded_and_frees_slots_across_workers() -> None:
    """One slot shared by 3 workers: a worker whose own release never comes must still get the slot
    another worker frees (without polling its dispatcher would wait for ever: tasks lost)."""
    result = simulate(
        FLEET,
        overrides={
            "scenario.duration_s": 30,
            "quotas.llm.concurrency": 1,
            "fleet.workers": 3,
            "fleet.routing": "round_robin",
        },
    )
    s = result.summary
    assert s["tasks_lost"] == 0
    assert s["tasks_succeeded"] == s["tasks_submitted"] > 30
    assert set(result.tasks["worker"]) == {0, 1, 2}
    calls = result.calls.sort_values("start")
    ends: list[float] = []
    for start, end in zip(calls["start"], calls["end"], strict=True):
        ends = [e for e in ends if e > start + 1e-9]
        assert not ends, f"two calls in flight at {start} with one shared slot"
        ends.append(end)


def test_shared_quota_polls_instead_of_waiting_for_ever() -> None:
    quota = SharedMultiQuota(QuotaLimits(concurrency=1), slot_poll_s=0.25)
    assert quota.try_reserve(1, 0.0) is not None
    assert quota.time_until(1, 0.0) == 0.25
    private = MultiQuota(QuotaLimits(concurrency=1))
    private.try_reserve(1, 0.0)
    assert math.isinf(private.time_until(1, 0.0))
    for bad in (0, -1, math.inf, math.nan, True):
        with pytest.raises(ConfigurationError, match="slot_poll_s"):
            SharedMultiQuota(QuotaLimits(), slot_poll_s=bad)


# --- routing -------------------------------------------------------------------------------------


def test_round_robin_deals_arrivals_in_turn_and_weighted_follows_the_weights() -> None:
    even = simulate(FLEET, overrides={"scenario.duration_s": 60, "fleet.routing": "round_robin"})
    counts = even.tasks["worker"].value_counts().sort_index().tolist()
    assert len(counts) == 4 and max(counts) - min(counts) <= 1
    uneven = simulate(FLEET, overrides={"scenario.duration_s": 120})
    n = len(uneven.tasks)
    shares = uneven.tasks["worker"].value_counts(normalize=True).sort_index()
    for worker, weight in enumerate((8 / 12, 2 / 12, 1 / 12, 1 / 12)):
        sd = math.sqrt(weight * (1 - weight) / n)
        assert abs(shares[worker] - weight) < 4 * sd, (worker, shares[worker], weight)
    # the same seed replays the same routing
    again = simulate(FLEET, overrides={"scenario.duration_s": 120})
    assert uneven.tasks["worker"].tolist() == again.tasks["worker"].tolist()


# --- shared vs split under uneven load -----------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_shared_quota_uses_the_limit_and_a_static_split_wastes_it_under_uneven_load(seed: int) -> None:
    shared = simulate(FLEET, seed=seed).summary
    split = simulate(FLEET, seed=seed, overrides={"fleet.quota": "split"}).summary
    assert shared["fleet_offered_load"] > 1.2  # saturated: more offered than the account admits
    assert shared["fleet_utilization"] >= 0.95
    assert shared["wasted_capacity"] <= 0.05
    assert split["fleet_utilization"] <= shared["fleet_utilization"] - 0.15
    assert split["wasted_capacity"] >= 0.15
    assert split["worker0_latency_p95_s"] > 2 * shared["worker0_latency_p95_s"]
    for s in (shared, split):
        assert s["tasks_lost"] == 0
        per_worker = sum(s[f"worker{i}_utilization"] for i in range(4))
        assert per_worker == pytest.approx(s["fleet_utilization"])
        assert sum(s[f"worker{i}_offered_share"] for i in range(4)) == pytest.approx(1.0)


def test_an_even_load_wastes_little_even_with_a_split() -> None:
    """The waste of a split comes from the uneven routing, not from splitting as such."""
    split_even = simulate(FLEET, overrides={"fleet.quota": "split", "fleet.routing": "round_robin"}).summary
    split_uneven = simulate(FLEET, overrides={"fleet.quota": "split"}).summary
    assert split_even["wasted_capacity"] < split_uneven["wasted_capacity"] - 0.1


def test_every_fleet_summary_key_has_a_meaning() -> None:
    summary = simulate(FLEET, overrides={"scenario.duration_s": 20}).summary
    fleet_keys = [k for k in summary if k in FLEET_SUMMARY_KEYS or k.startswith("worker")]
    assert len(fleet_keys) == len(FLEET_SUMMARY_KEYS) + 3 * 4
    assert all(fleet_key_meaning(k) for k in fleet_keys)
    assert fleet_key_meaning("worker2_utilization").startswith("worker 2: ")
    assert fleet_key_meaning("latency_p50_s") == ""


# --- validation ----------------------------------------------------------------------------------


BAD_FLEETS = [
    ({"fleet.workers": 0}, "fleet.workers", "an integer >= 1"),
    ({"fleet.workers": "4"}, "fleet.workers", "an integer >= 1"),
    ({"fleet.workers": 2.5}, "fleet.workers", "an integer >= 1"),
    ({"fleet.workers": 1001}, "fleet.workers", "at most 1000"),
    ({"fleet.quota": "both"}, "fleet.quota", '"shared", "split"'),
    ({"fleet.routing": "random"}, "fleet.routing", '"round_robin", "weighted"'),
    ({"fleet.weights": [1, 2, 3]}, "fleet.weights", "one weight per worker (4)"),
    ({"fleet.weights": [1, 2, 0, 1]}, "fleet.weights", "numbers > 0"),
    ({"fleet.weights": "8,2,1,1"}, "fleet.weights", "an array"),
    ({"fleet.slot_poll_s": 0}, "fleet.slot_poll_s", ">= 0.001"),
    ({"fleet.slot_poll_s": 1e-300}, "fleet.slot_poll_s", ">= 0.001"),  # spun for ever
    ({"fleet.workerz": 2}, "fleet.workerz", "fleet has no key 'workerz'"),
]


@pytest.mark.parametrize(("overrides", "path", "message"), BAD_FLEETS, ids=[str(c[0]) for c in BAD_FLEETS])
def test_bad_fleet_values_are_refused_naming_the_key(overrides: dict, path: str, message: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        load_scenario(FLEET, overrides=overrides)
    assert caught.value.key_path == path
    assert message in caught.value.message


def test_weighted_routing_without_weights_is_refused() -> None:
    raw = scenario_to_dict(load_scenario(FLEET))
    del raw["fleet"]["weights"]
    with pytest.raises(
        ScenarioError, match=r"fleet\.weights: expected one weight per worker \(4\) .* got none"
    ):
        parse_scenario(raw, source="x.toml")


def test_crashes_in_a_fleet_are_refused_for_now() -> None:
    with pytest.raises(ScenarioError) as caught:
        load_scenario(SCENARIOS / "crash_recovery.toml", overrides={"fleet.workers": 2})
    assert caught.value.key_path == "crashes"
    assert "not simulated in a fleet" in caught.value.message
    assert load_scenario(SCENARIOS / "crash_recovery.toml", overrides={"fleet.workers": 1}).crashes


def test_a_split_that_could_never_grant_a_task_is_refused() -> None:
    raw = scenario_to_dict(load_scenario(FLEET))
    raw["quotas"]["llm"]["units_per_min"] = 600  # 150 units per worker, tasks of 200
    parse_scenario(raw, source="x.toml")  # shared: one task fits the account's 600
    raw["fleet"]["quota"] = "split"
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(raw, source="x.toml")
    assert caught.value.key_path == "fleet.quota"
    assert "150 units" in caught.value.message and "200 units" in caught.value.message


def test_the_fleet_section_round_trips() -> None:
    scenario = load_scenario(FLEET)
    assert scenario.fleet.weights == (8.0, 2.0, 1.0, 1.0)
    assert parse_scenario(scenario_to_dict(scenario), source=scenario.source or "") == scenario


# --- a worker's own concurrency cap --------------------------------------------------------------


def test_worker_concurrency_caps_each_worker_on_top_of_the_shared_quota() -> None:
    result = simulate(
        FLEET,
        overrides={
            "scenario.duration_s": 60,
            "quotas.llm.concurrency": "none",
            "providers.llm.latency_base_s": 4.0,
            "fleet.routing": "round_robin",
            "fleet.worker_concurrency": 2,
        },
    )
    assert result.summary["tasks_lost"] == 0
    calls = result.calls.merge(result.tasks[["task_id", "worker"]], on="task_id")
    peak_fleet = 0
    for worker, mine in [(None, calls), *calls.groupby("worker")]:
        edges = sorted([(s, 1) for s in mine["start"]] + [(e, -1) for e in mine["end"]])
        level = peak = 0
        for _, step in edges:  # at equal times an end (-1) sorts before a start (+1)
            level += step
            peak = max(peak, level)
        if worker is None:
            peak_fleet = peak
        else:
            assert peak <= 2, (worker, peak)
    assert peak_fleet > 2  # the cap is per worker, not for the fleet


def test_worker_capped_quota_waits_for_its_own_release_and_delegates_the_rest() -> None:
    shared = SharedMultiQuota(QuotaLimits(requests_per_min=60, request_burst=5, concurrency=3))
    a, b = WorkerCappedQuota(shared, 1), WorkerCappedQuota(shared, 2)
    first = a.try_reserve(1, 0.0)
    assert first is not None and a.try_reserve(1, 0.0) is None
    assert math.isinf(a.time_until(1, 0.0))  # its own release will wake it
    assert b.try_reserve(1, 0.0) is not None and b.try_reserve(1, 0.0) is not None
    assert shared.in_flight == 3 and b.time_until(1, 0.0) == math.inf  # b's own two slots are taken
    a.release(first, 1.0)
    assert a.in_flight == 0 and shared.in_flight == 2
    b.pause_until(10.0)
    assert a.time_until(1, 1.0) == pytest.approx(9.0)  # a 429 seen by one pauses the other
    assert a.levels(1.0)[2] == 0 and b.levels(1.0)[2] == 2
    with pytest.raises(ConfigurationError, match="concurrency"):
        WorkerCappedQuota(shared, 0)


def test_job_workloads_run_in_a_fleet_with_every_job_finished() -> None:
    path = SCENARIOS / "ai_edit_pipeline.toml"
    overrides = {"scenario.duration_s": 200}
    alone = simulate(path, overrides=overrides).summary
    for quota in ("shared", "split"):
        fleet = simulate(path, overrides={**overrides, "fleet.workers": 3, "fleet.quota": quota})
        assert fleet.summary["jobs_submitted"] == alone["jobs_submitted"]  # the same arrivals, routed
        assert fleet.summary["jobs_lost"] == 0 and fleet.summary["tasks_lost"] == 0
        assert set(fleet.tasks["worker"]) == {0, 1, 2}


def test_worker_ids_map_to_indexes_and_foreign_ids_to_none() -> None:
    assert [fleet_worker_index(w) for w in (None, "worker-0", "worker-12")] == [0, 0, 12]
    foreign = ("host-a/worker-1", "worker-", "worker-x", "worker-\u0663")  # the last: an Arabic-Indic 3
    assert [fleet_worker_index(w) for w in foreign] == [None] * 4
