"""The crash-recovery regression suite: kill the scheduler right after every k-th store write.

For each durable store and several seeds, a small scenario (double clicks, retryable errors,
a poison input) is crashed after store write k, for every k the run makes, and restarted on
the same store. Invariants: no task is lost, no task succeeds without a result, and no key
is executed (billed) twice by the provider, because recovery reconciles orphans with the
provider's record. With reconciliation disabled and orphans re-sent, the double executions
are the ones that fell between the provider's success and the store's record: they are
counted, not forbidden.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from pathlib import Path

import pytest

from aiqsim.core.task import TaskStatus
from aiqsim.sim.scenario import load_scenario
from aiqsim.sim.simulate import simulate

SCENARIO = """
[scenario]
name = "crash_suite"
seed = 0
duration_s = 6
drain_s = 600

[[providers]]
name = "llm"
kind = "llm"
latency_base_s = 0.4
latency_per_unit_s = 0.001
latency_sigma = 0.3
server_error_prob = 0.15
honours_idempotency = false
supports_lookup = true

[quotas.llm]
concurrency = 3

[retry]
strategy = "full_jitter"
base_s = 0.2
cap_s = 2
max_attempts = 4
attempt_timeout_s = 30

[store]
kind = "{store}"
requeue_interrupted = {requeue}
reconcile_on_restart = {reconcile}

[[workloads]]
type = "double_click"
provider = "llm"
priority = "interactive"
rate_per_s = 1.5
end_s = 6
clicks = 2
poison_fraction = 0.1

[[workloads]]
type = "poisson"
provider = "llm"
rate_per_s = 1.0
end_s = 6

[[crashes]]
after_writes = {k}
restart_after_s = 1.5
"""

SEEDS = (0, 1, 2, 3, 4)
STORES = ("memory", "sqlite", "json")


def scenario_file(
    tmp_path: Path, store: str, k: int, *, reconcile: bool = True, requeue: bool = False
) -> Path:
    path = tmp_path / f"crash_{store}_{k}.toml"
    text = SCENARIO.format(store=store, k=k, reconcile=str(reconcile).lower(), requeue=str(requeue).lower())
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def writes_without_crash(tmp_path: Path, seed: int) -> int:
    """How many store writes the run makes when nothing crashes (crash point beyond the end)."""
    result = simulate(_path(tmp_path, "memory", 10**6), seed=seed)
    assert result.summary["crashes"] == 0
    return result.store_writes


def executions_per_key(result) -> Counter:
    return Counter(e.key for e in result.executions if e.outcome == "ok")


def check_invariants(result) -> None:
    assert result.summary["tasks_lost"] == 0, "every submitted task ends terminal"
    for record in result.records:
        assert record.status.is_terminal
        if record.status is TaskStatus.SUCCEEDED:
            assert record.result is not None, f"{record.id} succeeded without a result"
    assert result.task_errors == []


@pytest.mark.parametrize("store", STORES)
def test_crash_after_every_store_write_loses_nothing_and_bills_each_key_once(
    tmp_path: Path, store: str
) -> None:
    crash_points = 0
    for seed in SEEDS:
        total = writes_without_crash(tmp_path, seed)
        for k in range(1, total + 1):
            result = simulate(_path(tmp_path, store, k), seed=seed)
            check_invariants(result)
            assert result.summary["crashes"] == 1, (seed, k)
            assert max(executions_per_key(result).values(), default=0) <= 1, (seed, k)
            crash_points += 1
    assert crash_points >= 150
    print(f"\n[{store}] {crash_points} crash points over seeds {SEEDS}: 0 lost, each key billed at most once")


def _path(tmp_path: Path, store: str, k: int, **flags) -> Path:
    directory = tmp_path / f"{store}-{k}"
    directory.mkdir(exist_ok=True)
    return scenario_file(directory, store, k, **flags)


def test_without_reconciliation_double_executions_happen_only_at_the_crash_gap(tmp_path: Path) -> None:
    doubles_without, doubles_with = 0, 0
    for seed in SEEDS:
        total = writes_without_crash(tmp_path, seed)
        for k in range(1, total + 1):
            blind = simulate(_path(tmp_path, "memory", k, reconcile=False, requeue=True), seed=seed)
            check_invariants(blind)
            doubles_without += sum(1 for n in executions_per_key(blind).values() if n > 1)
            assert max(executions_per_key(blind).values(), default=0) <= 2
            reconciled = simulate(_path(tmp_path, "memory", k, reconcile=True, requeue=True), seed=seed)
            check_invariants(reconciled)
            doubles_with += sum(1 for n in executions_per_key(reconciled).values() if n > 1)
    assert doubles_with == 0
    assert doubles_without > 0  # the gap is real: this is what reconciliation is for
    print(f"\n[memory] keys executed twice, all crash points: {doubles_without} blind re-send, 0 reconciled")


def test_the_crash_scenario_is_valid(tmp_path: Path) -> None:
    scenario = load_scenario(scenario_file(tmp_path, "sqlite", 5))
    assert scenario.crashes[0].after_writes == 5


@pytest.mark.parametrize("seed", SEEDS)
def test_a_crash_in_the_middle_of_a_json_write_is_recovered(tmp_path: Path, seed: int) -> None:
    path = _path(tmp_path, "json", 20)
    path.write_text(
        path.read_text().replace("restart_after_s = 1.5", "restart_after_s = 1.5\ntorn_write = true")
    )
    workdir = tmp_path / f"work-{seed}"
    workdir.mkdir()
    result = simulate(path, seed=seed, workdir=workdir)
    check_invariants(result)
    assert result.summary["crashes"] == 1
    assert result.torn_writes_recovered == 1
    assert list(workdir.glob(".tasks.json.tmp-*")) == []  # the half-written snapshot was cleaned up


def test_crash_after_every_store_write_on_postgres(tmp_path: Path, postgres_dsn: str) -> None:
    """The same crash schedule on a PostgresStore: each crash point gets a fresh schema, reopened
    (a new connection) at the restart as a restarted process would."""
    import psycopg

    from aiqsim.sim.simulate import run_scenario
    from aiqsim.stores.postgres import PostgresStore

    crash_points = 0
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        for seed in SEEDS[:3]:
            total = writes_without_crash(tmp_path, seed)
            for k in range(1, total + 1):
                schema = f"crash_{seed}_{k}"
                admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
                scenario = load_scenario(_path(tmp_path, "memory", k))
                try:
                    result = run_scenario(
                        scenario,
                        seed,
                        store_factory=lambda schema=schema: PostgresStore(postgres_dsn, schema=schema),
                    )
                finally:
                    admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
                check_invariants(result)
                assert result.summary["crashes"] == 1, (seed, k)
                assert max(executions_per_key(result).values(), default=0) <= 1, (seed, k)
                crash_points += 1
    assert crash_points >= 90
    seeds = SEEDS[:3]
    print(
        f"\n[postgres] {crash_points} crash points over seeds {seeds}: 0 lost, each key billed at most once"
    )
