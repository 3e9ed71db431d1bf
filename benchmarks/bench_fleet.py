"""The fleet's shared parts on loopback: PostgresStore vs SqliteStore, RedisQuota vs MultiQuota.

Measured in one run, side by side, single process:

- store claims per second (``insert_and_claim`` of a new key: one transaction each) and
  transitions per second (``update`` queued -> running -> succeeded with a result), on
  PostgreSQL (synchronous_commit on, the server's default) and SQLite (WAL, synchronous=FULL);
- shared-quota reservation latency (p50 / p99 of one ``try_reserve`` + ``release`` pair, two Redis
  round trips) and throughput, against the in-process :class:`MultiQuota` it replaces.

Servers: ``AIQSIM_TEST_POSTGRES_DSN`` / ``AIQSIM_TEST_REDIS_URL`` if set, else throwaway ones
started from this machine's binaries (tests/servers.py). Rounds alternate the systems so noise
hits both alike; figures are min / median over rounds with the load average.

Run: ``python benchmarks/bench_fleet.py [--rounds 5] [--ops 1000]`` from the repository root.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiqsim.core.states import transition
from aiqsim.core.task import TaskRecord, TaskStatus
from aiqsim.core.token_bucket import MultiQuota, QuotaLimits
from aiqsim.stores import SqliteStore


@contextlib.contextmanager
def server(env: str, start: Callable[[], contextlib.AbstractContextManager[str]]) -> Iterator[str]:
    if os.environ.get(env):
        yield os.environ[env]
        return
    with start() as address:
        yield address


def _task(n: int, round_no: int) -> TaskRecord:
    return TaskRecord(
        id=f"r{round_no}-t{n:06d}",
        key=f"r{round_no}-k{n:06d}",
        kind="llm",
        provider="llm",
        payload={"prompt": f"summarise document {n}", "max_tokens": 256},
    )


def store_round(store: object, ops: int, round_no: int) -> tuple[float, float]:
    """(claims per second, transitions per second) for ``ops`` tasks on ``store``."""
    tasks = [_task(n, round_no) for n in range(ops)]
    start = time.perf_counter()
    for task in tasks:
        store.insert_and_claim(task)  # type: ignore[attr-defined]
    claims = ops / (time.perf_counter() - start)
    start = time.perf_counter()
    for n, task in enumerate(tasks):
        running = transition(task, TaskStatus.RUNNING, n + 0.5)
        store.update(running)  # type: ignore[attr-defined]
        store.update(transition(running, TaskStatus.SUCCEEDED, n + 1.0, result={"text": "ok"}))  # type: ignore[attr-defined]
    transitions = 2 * ops / (time.perf_counter() - start)
    return claims, transitions


def quota_round(quota: object, ops: int) -> tuple[list[float], float]:
    """Latencies (s) of reserve+release pairs, and pairs per second."""
    latencies = []
    start = time.perf_counter()
    for n in range(ops):
        t0 = time.perf_counter()
        reservation = quota.try_reserve(1.0, float(n))  # type: ignore[attr-defined]
        assert reservation is not None
        quota.release(reservation, float(n))  # type: ignore[attr-defined]
        latencies.append(time.perf_counter() - t0)
    return latencies, ops / (time.perf_counter() - start)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ops", type=int, default=1000)
    args = parser.parse_args()
    from aiqsim.fleet import RedisQuota
    from aiqsim.stores.postgres import PostgresStore
    from tests.servers import postgres_server, redis_server

    load = os.getloadavg()
    results: dict[str, list[tuple[float, float]]] = {"sqlite": [], "postgres": []}
    quota_lat: dict[str, list[float]] = {"local": [], "redis": []}
    quota_rate: dict[str, list[float]] = {"local": [], "redis": []}
    limits = QuotaLimits(requests_per_min=1e9, tokens_per_min=1e12, concurrency=64)
    with (
        server("AIQSIM_TEST_POSTGRES_DSN", postgres_server) as dsn,
        server("AIQSIM_TEST_REDIS_URL", redis_server) as url,
        tempfile.TemporaryDirectory() as tmp,
    ):
        pg = PostgresStore(dsn, schema="bench_fleet")
        pg.drop()
        pg.close()
        pg = PostgresStore(dsn, schema="bench_fleet")
        lite = SqliteStore(Path(tmp) / "tasks.sqlite3")
        shared = RedisQuota(url, "bench-fleet", limits, redefine=True)  # the bench sets the account up
        shared.reset()
        local = MultiQuota(limits)
        for round_no in range(args.rounds):
            results["sqlite"].append(store_round(lite, args.ops, round_no))
            results["postgres"].append(store_round(pg, args.ops, round_no))
            for name, quota in (("local", local), ("redis", shared)):
                lat, rate = quota_round(quota, args.ops)
                quota_lat[name].extend(lat)
                quota_rate[name].append(rate)
        pg.drop()
        pg.close()
        lite.close()
    print(f"{args.rounds} rounds x {args.ops} ops, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n")
    print("| store | claims/s min / median | transitions/s min / median |")
    print("|---|---|---|")
    for name, rows in results.items():
        claims, trans = [r[0] for r in rows], [r[1] for r in rows]
        print(
            f"| {name} | {min(claims):,.0f} / {statistics.median(claims):,.0f} | "
            f"{min(trans):,.0f} / {statistics.median(trans):,.0f} |"
        )
    ratio_c = statistics.median(r[0] for r in results["postgres"]) / statistics.median(
        r[0] for r in results["sqlite"]
    )
    ratio_t = statistics.median(r[1] for r in results["postgres"]) / statistics.median(
        r[1] for r in results["sqlite"]
    )
    print(f"\npostgres / sqlite (median, same run): claims {ratio_c:.2f}x, transitions {ratio_t:.2f}x\n")
    print("| quota | reserve+release p50 | p99 | pairs/s min / median |")
    print("|---|---|---|---|")
    for name in ("local", "redis"):
        lat = quota_lat[name]
        print(
            f"| {name} | {pct(lat, 0.5) * 1e6:,.1f} µs | {pct(lat, 0.99) * 1e6:,.1f} µs | "
            f"{min(quota_rate[name]):,.0f} / {statistics.median(quota_rate[name]):,.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
