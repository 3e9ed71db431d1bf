"""The crash-recovery regression suite: kill the scheduler right after every k-th store write.

For each durable store and several seeds, a small scenario (double clicks, retryable errors,
a poison input) is crashed after store write k, for every k the run makes, and restarted on
the same store. Invariants: no task is lost, no task succeeds without a result, and no key
is executed (billed) twice by the provider, because recovery reconciles orphans with the
provider's record. With reconciliation disabled and orphans re-sent, the double executions
are the ones that fell between the provider's success and the store's record: they are
counted, not forbidden.

The invariants are checked with the public test kit's functions (:mod:`aiqsim.testing.invariants`),
and the last test runs the same workload as a user would, through the kit's pytest fixtures
(``aiqsim_crash`` x ``aiqsim_store``): the kit's crash driver, on every store kind.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from aiqsim.core.backoff import FullJitter
from aiqsim.core.task import Priority
from aiqsim.core.token_bucket import QuotaLimits
from aiqsim.scheduler.retry import RetryPolicy
from aiqsim.sim.scenario import load_scenario
from aiqsim.sim.simulate import simulate
from aiqsim.testing import Life, check_all_terminal, check_at_most_once, check_success_has_result

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
    check_all_terminal(result.records)
    check_success_has_result(result.records)
    assert result.task_errors == []


def billed_at_most_once(result, seed: int, k: int) -> None:
    """Each key executed at most once (the kit's check), the case named if it fails."""
    try:
        check_at_most_once(executions_per_key(result))
    except AssertionError as broken:
        broken.add_note(f"seed {seed}, crash after store write #{k}")
        raise


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
            billed_at_most_once(result, seed, k)
            crash_points += 1
    assert crash_points >= 150
    print(f"\n[{store}] {crash_points} crash points over seeds {SEEDS}: 0 lost, each key billed at most once")


def _path(tmp_path: Path, store: str, k: int, **flags) -> Path:
    directory = tmp_path / f"{store}-{k}"
    directory.mkdir(exist_ok=True)
    return scenario_file(directory, store, k, **flags)


def group_commit_scenario(tmp_path: Path, k: int) -> Path:
    """The crash scenario on SQLite with group commit: a crash loses every write not yet flushed."""
    path = _path(tmp_path, "sqlite", k)
    text = path.read_text().replace("[store]\n", "[store]\ngroup_commit = true\ncommit_window_s = 0.05\n")
    path.write_text(text)
    return path


def test_crash_after_every_store_write_with_sqlite_group_commit_loses_nothing_and_bills_each_key_once(
    tmp_path: Path,
) -> None:
    crash_points = 0
    for seed in SEEDS:
        total = simulate(group_commit_scenario(tmp_path, 10**6), seed=seed).store_writes
        for k in range(1, total + 1):
            result = simulate(group_commit_scenario(tmp_path, k), seed=seed)
            check_invariants(result)
            assert result.summary["crashes"] == 1, (seed, k)
            assert max(executions_per_key(result).values(), default=0) <= 1, (seed, k)
            crash_points += 1
    assert crash_points >= 150
    print(f"\n[sqlite group commit] {crash_points} crash points: 0 lost, each key billed at most once")


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


def test_without_lookup_and_without_requeue_recovery_sends_nothing_twice_at_any_crash_point(
    tmp_path: Path,
) -> None:
    # The README's promise for requeue_interrupted=False without a lookup: the orphan fails as
    # interrupted and recovery sends nothing twice. A double click queued behind the orphan used to
    # claim the key once recovery had failed its owner, and send it again. (A click that arrives
    # after the restart is a new request for a failed key, which runs again, as it would live.)
    crash_points = interrupted = new_requests_run_again = 0
    for seed in SEEDS:
        total = writes_without_crash(tmp_path, seed)
        for k in range(1, total + 1):
            result = simulate(_path(tmp_path, "memory", k, reconcile=False, requeue=False), seed=seed)
            assert result.summary["tasks_lost"] == 0 and result.task_errors == []
            check_all_terminal(result.records)
            orphans = [r for r in result.records if r.error and "TaskInterruptedError" in r.error]
            restart = min((r.finished_at for r in orphans), default=math.inf)
            created = {r.id: r.created_at for r in result.records}
            runs: dict[str, list[str]] = {}
            for execution in result.executions:
                if execution.outcome == "ok":
                    runs.setdefault(execution.key, []).append(execution.task_id)
            for key, task_ids in runs.items():
                for task_id in task_ids[1:]:
                    assert created[task_id] >= restart, (seed, k, key, task_ids)  # not sent again by recovery
                    new_requests_run_again += 1
            interrupted += len(orphans)
            crash_points += 1
    assert crash_points >= 150 and interrupted > 0  # orphans were failed, not re-sent
    print(
        f"\n[memory, no lookup, no requeue] {crash_points} crash points: recovery sent nothing twice; "
        f"{new_requests_run_again} request(s) made after a restart ran a failed key again"
    )


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
                billed_at_most_once(result, seed, k)
                crash_points += 1
    assert crash_points >= 90
    seeds = SEEDS[:3]
    print(
        f"\n[postgres] {crash_points} crash points over seeds {seeds}: 0 lost, each key billed at most once"
    )


# ---------------------------------------------------------------------------------------------
# The same workload through the public kit, as a user writes it (aiqsim.testing, pytest fixtures)


async def crash_suite_workload(life: Life) -> None:
    """Double clicks (each document asked for twice), a poison input and Poisson-like gaps, the
    ids stable across restarts; the gaps come from a stream seeded by the case, the same each life."""
    gaps = life.world.rng("arrivals")
    for n in range(12):
        document = n // 2  # the second of each pair is a double click of the first
        payload = {
            "input": f"doc-{document}",
            "prompt_units": 20,
            "output_units": 40,
            "poison": document == 4,
        }
        life.submit("llm", payload, task_id=f"click-{n}", priority=Priority.INTERACTIVE)
        await life.runtime.sleep(gaps.expovariate(2.0))
    await life.join()


def crash_suite_provider(world):  # type: ignore[no-untyped-def]
    return [
        world.simulated_provider(
            "llm",
            latency_base_s=0.4,
            latency_per_unit_s=0.001,
            latency_sigma=0.3,
            server_error_prob=0.15,
            honours_idempotency=False,
            supports_lookup=True,
        )
    ]


def test_the_kit_crash_driver_on_every_store(aiqsim_crash, aiqsim_store) -> None:
    driver = aiqsim_crash.on(aiqsim_store)
    if aiqsim_store.durable and driver.options.sample is None:
        # every point in memory (above: every point on every store through simulate()); a seeded
        # sample on the file stores, where each case's fsyncs cost ~0.2 s on a loaded machine
        driver.options = dataclasses.replace(driver.options, sample=10)
    report = driver.run(
        crash_suite_workload,
        providers=crash_suite_provider,
        scheduler_options={
            "quotas": {"llm": QuotaLimits(concurrency=3)},
            "retry": RetryPolicy(
                backoff=FullJitter(base_s=0.2, cap_s=2), max_attempts=4, attempt_timeout_s=30
            ),
            "interactive_limit": None,
        },
        recover_options={"requeue_interrupted": False},
        at_most_once=True,
    )
    assert report.cases > len(report.seeds)
    print(f"\n[kit, {aiqsim_store.kind}] {report}")
