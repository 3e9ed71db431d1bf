"""Leases on a real PostgreSQL: a SIGKILLed worker's tasks are adopted by a live one, billed once.

Two worker processes share a PostgresStore and the local provider server (which does NOT honour
idempotency keys: a blind re-send would bill twice, so only reconciliation keeps bills single).
Worker A is killed with SIGKILL while its calls are in flight; worker B's LeaseKeeper sees A's
lease expire, adopts A's tasks exactly once, reconciles A's running orphans through the
server's lookup and runs A's queued tasks. Every task ends succeeded; no key is billed twice.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aiqsim.core.task import TaskStatus
from aiqsim.sim.config import ProviderConfig

WORKER = Path(__file__).with_name("helpers_lease_worker.py")


def _worker(dsn: str, schema: str, url: str, name: str, tasks: int, stay: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), "--dsn", dsn, "--schema", schema, "--url", url, "--worker", name,
         "--tasks", str(tasks), "--ttl", "1.5", "--stay-for-adoptions", str(stay)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_killed_workers_tasks_are_adopted_and_billed_once(postgres_dsn: str, seed: int) -> None:
    import psycopg

    from aiqsim.http.server import start_local_server
    from aiqsim.stores.postgres import PostgresStore

    rng = random.Random(seed)
    schema = f"lease_{os.getpid()}_{seed}"
    config = ProviderConfig(
        name="llm", latency_base_s=0.15, latency_per_unit_s=0.0, latency_sigma=0.3, honours_idempotency=False
    )
    try:
        with start_local_server(config, seed=seed) as server:
            victim = _worker(postgres_dsn, schema, server.url, "worker-a", 40, 0.0)
            assert victim.stdout.readline().strip() == "ready", victim.communicate(timeout=30)[1]  # type: ignore[union-attr]
            survivor = _worker(postgres_dsn, schema, server.url, "worker-b", 5, 6.0)
            assert survivor.stdout.readline().strip() == "ready", survivor.communicate(timeout=30)[1]  # type: ignore[union-attr]
            target = rng.randint(4, 20)  # kill A after this many of its calls were billed
            deadline = time.monotonic() + 60
            while sum(1 for e in server.ledger().bills if e.key.startswith("worker-a")) < target:
                assert time.monotonic() < deadline and victim.poll() is None
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.15))  # somewhere inside the next calls
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=10)
            out, err = survivor.communicate(timeout=120)
            assert survivor.returncode == 0, err[-3000:]
            summary = json.loads(out.strip().splitlines()[-1])
            ledger = server.ledger()
        with PostgresStore(postgres_dsn, schema=schema) as store:
            records = store.list_by_status()
            leases = store.leases()
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    adopted = [a for a in summary["adopted"] if a["worker"] == "worker-a"]
    assert len(adopted) == 1, summary  # adopted once, by the survivor
    # A may die before it has submitted all 40 (what it never submitted is nobody's task).
    assert sum(r.id.startswith("worker-b") for r in records) == 5
    assert target <= sum(r.id.startswith("worker-a") for r in records) <= 40
    assert all(r.status is TaskStatus.SUCCEEDED for r in records), [
        (r.id, r.status, r.error) for r in records
    ]
    taken_over = [r for r in records if r.id.startswith("worker-a") and r.worker == "worker-b"]
    report = adopted[0]
    assert len(taken_over) == report["completed"] + report["failed"] + report["resumed"] > 0
    assert ledger.duplicate_bills == 0, "a key was billed twice"
    assert {e.key for e in ledger.bills} == {r.key for r in records}
    assert leases == {}, leases  # both leases ended: B released its own, A's adoption was finished
    print(
        f"seed {seed}: killed A after {target} bills; B adopted A: {adopted[0]}; "
        f"{len(ledger.bills)} bills for {len(records)} keys, 0 duplicates"
    )
