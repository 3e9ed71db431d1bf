"""SIGKILL the scheduler process at random moments; restart it until the workload is done.

The worker (tests/helpers_store_worker.py, mode ``recover``) opens the store, calls
``Scheduler.recover(requeue_interrupted=True)``, submits what of the fixed workload the store
does not have yet, and waits. Its provider commits every execution to a ledger file, the
ground truth here. The parent kills it with SIGKILL at seeded random moments and restarts it.

Invariants, checked after every kill and at the end:
- the state file always loads;
- the store never shows success for work the provider did not do, nor without a result;
- at the end no task is lost: every workload id is in the store and terminal;
- with ``lookup`` each key ran at most once. Without it, a kill between the provider's
  execution and the store's record makes the restarted scheduler run the key again: such
  extra executions must come from killed processes only, and are counted and reported.
"""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import sys
from collections import Counter, defaultdict
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from aiqsim.core.states import transition
from aiqsim.core.task import TaskRecord, TaskStatus
from aiqsim.runtime import SimPyRuntime
from aiqsim.scheduler import ProviderRequest, ProviderResponse, Scheduler
from aiqsim.stores import TaskStore, open_store
from aiqsim.testing import WorkerRun, kill_and_restart
from tests.helpers_store_worker import WORKLOAD, connect_ledger, expected_result

WORKER = Path(__file__).with_name("helpers_store_worker.py")
KILL_WINDOW_S = 0.2
"""Kills land uniformly in this window after the worker reports the store open."""
LATENCY_SCALE = 3.0
"""Slows the worker's provider so the workload needs at least 1.44 s of provider sleeps (32 keys, two
at a time, two sleeps of >= 15 ms each, x3): more than the 6 kill windows add up to, so on however
fast a machine every wanted kill lands before the work is done."""
MAX_RUNS = 40


@dataclass
class Outcome:
    kills: int = 0
    runs: int = 0
    killed_pids: set[int] = field(default_factory=set)
    recoveries: list[dict[str, int]] = field(default_factory=list)


def read_ledger(path: Path) -> tuple[list[tuple[str, str, int]], dict[str, object]]:
    conn = sqlite3.connect(path)
    try:
        executions = conn.execute("SELECT key, task_id, pid FROM executions ORDER BY rowid").fetchall()
        results = {key: json.loads(text) for key, text in conn.execute("SELECT key, result FROM results")}
    finally:
        conn.close()
    return executions, results


def check_store(kind: str, store_path: Path, ledger_path: Path) -> dict[str, TaskStatus]:
    """The state file loads, and every success in it is backed by a real execution and a result."""
    _, results = read_ledger(ledger_path)
    store = open_store(kind, store_path)  # raises StoreCorruptError if a kill damaged it
    try:
        records = store.list_by_status()
    finally:
        store.close()
    for record in records:
        if record.status in (TaskStatus.SUCCEEDED, TaskStatus.DEDUPED):
            assert record.result is not None, record
            assert record.result == expected_result(record.key) == results.get(record.key), record
    return {record.id: record.status for record in records}


def run_with_kills(kind: str, lookup: bool, kills_wanted: int, seed: int, directory: Path) -> Outcome:
    """The kill loop of the public kit (:func:`aiqsim.testing.kill_and_restart`), with the store
    checked after every kill."""
    store_path, ledger_path = directory / f"tasks.{kind}", directory / "ledger.sqlite"
    connect_ledger(ledger_path).close()
    flag = "--lookup" if lookup else "--no-lookup"

    def command(number: int, rng: random.Random) -> list[str]:
        argv = [sys.executable, str(WORKER), "recover", "--kind", kind, "--store", str(store_path)]
        argv += ["--ledger", str(ledger_path), flag, "--seed", str(rng.randrange(2**31))]
        return [*argv, "--latency-scale", str(LATENCY_SCALE)]

    def after_kill(run: WorkerRun) -> None:
        assert run.returncode == -signal.SIGKILL
        check_store(kind, store_path, ledger_path)

    report = kill_and_restart(
        command,
        kills=kills_wanted,
        seed=seed,
        kill_window_s=KILL_WINDOW_S,
        ready_line="opened",
        max_runs=MAX_RUNS,
        after_kill=after_kill,
    )
    assert report.final.lines[-1:] == ["done"], report.final.stderr
    lines = [line for run in report.runs for line in run.lines]
    return Outcome(
        kills=report.kills,
        runs=len(report.runs),
        killed_pids=set(report.killed_pids),
        recoveries=[json.loads(line)["recovered"] for line in lines if line.startswith('{"recovered"')],
    )


VARIANTS = [
    pytest.param("sqlite", True, 6, id="sqlite-lookup"),
    pytest.param("json", True, 6, id="json-lookup"),
    pytest.param("sqlite", False, 5, id="sqlite-no-lookup"),
    pytest.param("json", False, 5, id="json-no-lookup"),
]


@pytest.mark.parametrize(("kind", "lookup", "kills_wanted"), VARIANTS)
def test_sigkill_at_random_moments_loses_nothing(
    kind: str, lookup: bool, kills_wanted: int, tmp_path: Path
) -> None:
    seed = {"sqlite": 101, "json": 202}[kind] + (0 if lookup else 1)
    outcome = run_with_kills(kind, lookup, kills_wanted, seed, tmp_path)
    assert outcome.kills == kills_wanted

    statuses = check_store(kind, tmp_path / f"tasks.{kind}", tmp_path / "ledger.sqlite")
    workload_ids = {task_id for task_id, _ in WORKLOAD}
    assert set(statuses) == workload_ids  # nothing lost, nothing invented
    assert all(status.is_terminal for status in statuses.values()), statuses
    store = open_store(kind, tmp_path / f"tasks.{kind}")
    try:
        failed = store.list_by_status(TaskStatus.FAILED)
        owners = {key: store.owner_of(key) for _, key in WORKLOAD}
    finally:
        store.close()
    # recover(requeue_interrupted=True) requeues every orphan in one write: no task may end failed.
    assert failed == [], failed

    executions, _ = read_ledger(tmp_path / "ledger.sqlite")
    runs_by_key: dict[str, list[int]] = defaultdict(list)
    for key, _, pid in executions:
        runs_by_key[key].append(pid)
    for key, owner in owners.items():
        if owner is not None and owner.status is TaskStatus.SUCCEEDED:
            assert runs_by_key[key], f"{key} succeeded without ever executing"
    repeats = {key: pids for key, pids in runs_by_key.items() if len(pids) > 1}
    for key, pids in repeats.items():
        assert len(set(pids)) == len(pids), f"{key} ran twice in one process: {pids}"
        assert set(pids[:-1]) <= outcome.killed_pids, f"{key} re-ran although no kill interrupted it: {pids}"
    if lookup:
        assert not repeats, f"lookup should prevent every re-execution: {repeats}"
    extra = sum(len(pids) - 1 for pids in repeats.values())
    completed = sum(r["orphans_completed"] for r in outcome.recoveries)
    requeued = sum(r["orphans_requeued"] for r in outcome.recoveries)
    print(
        f"\n[{kind} lookup={lookup}] kills={outcome.kills} runs={outcome.runs} executions={len(executions)} "
        f"keys={len(runs_by_key)} re-executions={extra} orphans completed by lookup={completed} "
        f"orphans requeued={requeued} interrupted-failed={len(failed)} "
        f"status counts={dict(Counter(s.value for s in statuses.values()))}"
    )


# ---------------------------------------------------------------------------- a deterministic kill
class ProcessDiedError(BaseException):
    """Stands in for SIGKILL at one exact point (the write before it is already durable).

    A ``BaseException``, like :class:`aiqsim.sim.crash.SimulatedCrash`: a dead process is not a
    failed write, and the scheduler turns any ``Exception`` out of a store write into
    ``StoreWriteError``."""


class DieAfterWrite:
    """A store proxy that persists an ``update``, then 'dies' if the record matches ``when``.

    Killing right after the orphan's first recovery write is the moment that matters: whatever
    that write says is what the next process finds.
    """

    def __init__(self, store: TaskStore, when: Callable[[TaskRecord], bool]) -> None:
        self._store = store
        self._when = when

    def update(self, task: TaskRecord) -> None:
        self._store.update(task)
        if self._when(task):
            raise ProcessDiedError(f"killed right after writing {task.id} as {task.status.value}")

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)


class InstantEcho:
    name = "llm"

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        return ProviderResponse(result=expected_result(request.idempotency_key))


@pytest.mark.parametrize("kind", ["sqlite", "json"])
def test_kill_between_failing_and_requeueing_an_orphan_still_requeues_it(kind: str, tmp_path: Path) -> None:
    path = tmp_path / f"tasks.{kind}"
    orphan = TaskRecord(id="o1", key="key-o1", kind="llm", provider="llm")
    with closing(open_store(kind, path)) as store:
        store.insert_and_claim(orphan)
        store.update(transition(orphan, TaskStatus.RUNNING, 1.0))  # the process died while it ran

    def life(store: TaskStore) -> None:
        runtime = SimPyRuntime()

        async def main() -> None:
            scheduler = Scheduler(runtime, [InstantEcho()], store=store, rng=random.Random(0))
            await scheduler.recover(requeue_interrupted=True)
            await scheduler.join()
            await scheduler.close()

        runtime.run(main())

    with closing(open_store(kind, path)) as store, pytest.raises(ProcessDiedError):
        life(DieAfterWrite(store, lambda record: record.id == "o1"))  # type: ignore[arg-type]  # recovery's first write
    with closing(open_store(kind, path)) as store:
        life(store)
        assert store.get("o1").status is TaskStatus.SUCCEEDED  # type: ignore[union-attr]
