"""A real worker process for the multi-process and SIGKILL store tests (not a test module).

It runs the real :class:`~aiqsim.scheduler.Scheduler` on :class:`~aiqsim.runtime.AsyncioRuntime`
against a real store file, with a fake provider whose every execution is committed to a
separate SQLite *ledger*. The ledger is the ground truth the parent test checks the store
against: which keys ran, how often, in which process.

Modes:
    race      submit the same keys as the other racing processes, wait, print a summary.
    recover   open the store, ``recover()``, submit what of the fixed workload the store lacks,
              wait for everything; the parent SIGKILLs it at random moments and restarts it.
              ``--worker-id`` and ``--prefix`` let several such workers share one store, each
              with its own tasks; ``--latency-scale`` slows one down.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import sys
import time
from dataclasses import asdict
from pathlib import Path

from aiqsim.core.token_bucket import QuotaLimits
from aiqsim.runtime import AsyncioRuntime
from aiqsim.scheduler import ProviderRequest, ProviderResponse, RetryPolicy, Scheduler
from aiqsim.stores import open_store

LEDGER_SCHEMA = """
CREATE TABLE IF NOT EXISTS executions (
    key TEXT NOT NULL, task_id TEXT NOT NULL, pid INTEGER NOT NULL, t REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, result TEXT NOT NULL);
"""

# The SIGKILL workload: 32 keys, 8 of them submitted a second time right after the next key,
# so some duplicates are waiting on an owner in flight when the process dies. At two calls at
# a time of ~50 ms each, a whole run takes about a second.
DUPLICATED_KEYS = (1, 4, 9, 14, 17, 22, 25, 30)
WORKLOAD_KEYS = [k for n in range(32) for k in ((n, n - 1) if n - 1 in DUPLICATED_KEYS else (n,))]
WORKLOAD = [(f"w{n:02d}", f"key{k:02d}") for n, k in enumerate(WORKLOAD_KEYS)]
RECOVER_LATENCY_S = (0.015, 0.035)
"""Each half of a call (request, response) sleeps this long in ``recover`` mode."""


def expected_result(key: str) -> dict[str, str]:
    """What the fake provider returns for ``key`` (deterministic, so reruns agree)."""
    return {"echo": key}


def connect_ledger(path: str | Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.executescript(LEDGER_SCHEMA)
    return conn


class LedgerProvider:
    """Sleeps (request in flight), commits the execution to the ledger, sleeps (response in flight).

    A kill during the second sleep is the dangerous window: the work is done and billed but
    the scheduler has not recorded it.
    """

    name = "llm"

    def __init__(
        self, ledger: sqlite3.Connection, rng: random.Random, latency_s: tuple[float, float]
    ) -> None:
        self.ledger = ledger
        self.rng = rng
        self.latency_s = latency_s

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        await asyncio.sleep(self.rng.uniform(*self.latency_s))
        result = expected_result(request.idempotency_key)
        self.ledger.execute("BEGIN IMMEDIATE")
        self.ledger.execute(
            "INSERT INTO executions (key, task_id, pid, t) VALUES (?, ?, ?, ?)",
            (request.idempotency_key, request.task_id, os.getpid(), time.time()),
        )
        self.ledger.execute(
            "INSERT INTO results (key, result) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET result = excluded.result",
            (request.idempotency_key, json.dumps(result)),
        )
        self.ledger.execute("COMMIT")
        await asyncio.sleep(self.rng.uniform(*self.latency_s))
        return ProviderResponse(result=result)


class LookupLedgerProvider(LedgerProvider):
    """The same provider, able to answer "did you already do this key?" from the ledger."""

    async def lookup(self, idempotency_key: str) -> ProviderResponse | None:
        row = self.ledger.execute("SELECT result FROM results WHERE key = ?", (idempotency_key,)).fetchone()
        return None if row is None else ProviderResponse(result=json.loads(row[0]))


def say(message: object) -> None:
    print(message if isinstance(message, str) else json.dumps(message), flush=True)


def open_race_store(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    if args.kind == "postgres":
        from aiqsim.stores.postgres import PostgresStore

        return PostgresStore(args.store, schema=args.schema)
    return open_store(args.kind, args.store)


async def race(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    store = open_race_store(args)
    provider = LedgerProvider(connect_ledger(args.ledger), rng, (0.005, 0.02))
    scheduler = Scheduler(
        AsyncioRuntime(),
        [provider],
        quotas={"llm": QuotaLimits(concurrency=4)},
        store=store,
        rng=rng,
        duplicate_poll_s=args.poll,
    )
    say("ready")
    go = Path(args.go)
    while not go.exists():  # start together with the other racers
        await asyncio.sleep(0.002)
    keys = [f"key{n:02d}" for n in range(args.keys)]
    rng.shuffle(keys)
    handles = []
    for key in keys:
        for copy in range(args.repeat):
            task_id = f"{args.name}-{key}" + (f"-{copy}" if args.repeat > 1 else "")
            handles.append(scheduler.submit("llm", {"key": key}, key=key, task_id=task_id))
            await asyncio.sleep(rng.uniform(0.0, 0.004 / args.repeat))
    records = [await handle.wait() for handle in handles]
    await scheduler.close()
    store.close()
    say({"name": args.name, "pid": os.getpid(), "statuses": sorted(r.status.value for r in records)})


async def recover(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    store = open_store(args.kind, args.store)
    say("opened")
    ledger = connect_ledger(args.ledger)
    provider_class = LookupLedgerProvider if args.lookup else LedgerProvider
    latency = tuple(bound * args.latency_scale for bound in RECOVER_LATENCY_S)
    scheduler = Scheduler(
        AsyncioRuntime(),
        [provider_class(ledger, rng, latency)],  # type: ignore[arg-type]
        quotas={"llm": QuotaLimits(concurrency=2)},
        store=store,
        rng=rng,
        retry=RetryPolicy(attempt_timeout_s=10.0 * args.latency_scale),
        worker_id=args.worker_id,
    )
    report = await scheduler.recover(requeue_interrupted=True)
    say({"recovered": asdict(report), "pid": os.getpid()})
    for task_id, key in WORKLOAD:
        task_id, key = args.prefix + task_id, args.prefix + key
        if store.get(task_id) is None:
            scheduler.submit("llm", {"key": key}, key=key, task_id=task_id)
            await asyncio.sleep(0.003)
    await scheduler.join()
    await scheduler.close()
    store.close()
    say("done")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    modes = parser.add_subparsers(dest="mode", required=True)
    racer = modes.add_parser("race")
    racer.add_argument("--store", required=True)
    racer.add_argument("--ledger", required=True)
    racer.add_argument("--name", required=True)
    racer.add_argument("--keys", type=int, default=30)
    racer.add_argument("--seed", type=int, default=0)
    racer.add_argument("--go", required=True)
    racer.add_argument("--kind", choices=["sqlite", "postgres"], default="sqlite")
    racer.add_argument("--schema", default="aiqsim", help="PostgreSQL schema (with --kind postgres)")
    racer.add_argument("--repeat", type=int, default=1, help="identical submissions of each key")
    racer.add_argument("--poll", type=float, default=0.02, help="duplicate_poll_s of the scheduler")
    worker = modes.add_parser("recover")
    worker.add_argument("--kind", choices=["sqlite", "json"], required=True)
    worker.add_argument("--store", required=True)
    worker.add_argument("--ledger", required=True)
    worker.add_argument("--lookup", action=argparse.BooleanOptionalAction, default=True)
    worker.add_argument("--seed", type=int, default=0)
    worker.add_argument("--worker-id", default=None)
    worker.add_argument("--prefix", default="", help="prepended to the workload's task ids and keys")
    worker.add_argument("--latency-scale", type=float, default=1.0)
    args = parser.parse_args(argv)
    asyncio.run(race(args) if args.mode == "race" else recover(args))


if __name__ == "__main__":
    sys.exit(main())
