"""Where a shared-quota reservation's time goes: RedisQuota.try_reserve against a bare PING.

Measured in one run, interleaved (each iteration times a PING, an EVALSHA of a script that does
nothing, a ``try_reserve`` and its ``release``, on one client, so the machine's noise hits all four
alike), for one worker and for four worker processes at once on the same account:

- client-side latency, p50 / p99, of each; the reservation's cost over the PING of the same run;
- server-side time per call (Redis ``INFO commandstats``: ``usec_per_call`` of ``ping`` and
  ``evalsha``), which says how much of a reservation Redis itself spends running the script;
- what goes over the wire per reservation (the command counts of ``INFO commandstats``: EVALSHA
  only, or SCRIPT LOAD / EVAL each time too) and how many connections the run opened
  (``total_connections_received``): a script sent in full, or a new connection, per call would
  show there.

Server: a throwaway Redis started from this machine's binaries (tests/servers.py), so the command
counts are this run's alone; ``--url`` uses another (its counts then include anyone else's calls).
A loaded machine widens p99 of all four alike: read the differences.

Run: ``python benchmarks/bench_redis_reservation.py [--ops 5000] [--workers 4] [--url URL]`` from
the repository root.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiqsim.core.token_bucket import QuotaLimits

KINDS = ("ping", "noop script", "try_reserve", "release")
LIMITS = QuotaLimits(requests_per_min=1e12, tokens_per_min=1e15, concurrency=1_000_000)
"""Limits no run reaches: every reservation is granted, so each one runs the script's full path."""


@contextlib.contextmanager
def redis_url(given: str | None) -> Iterator[str]:
    if given:
        yield given
        return
    from tests.servers import redis_server

    with redis_server() as url:
        yield url


def one_worker(url: str, account: str, ops: int, start_at: float) -> dict[str, list[float]]:
    """``ops`` interleaved iterations; the latencies (s) of each kind of call."""
    from aiqsim.fleet import RedisQuota

    quota = RedisQuota(url, account, LIMITS, worker=f"bench-{os.getpid()}")
    client = quota._client  # the quota's own client and connection pool: the same round trip
    noop = client.register_script("return 1")
    noop(keys=[], args=[])  # loaded once, as the quota's scripts are on their first call
    first = quota.try_reserve(1.0, 0.0)
    assert first is not None
    quota.release(first, 0.0)
    while time.time() < start_at:  # the workers of a concurrent run start together
        time.sleep(0.001)
    timings: dict[str, list[float]] = {kind: [] for kind in KINDS}
    clock = time.perf_counter
    for n in range(ops):
        now = float(n + 1)
        t0 = clock()
        client.ping()
        t1 = clock()
        noop(keys=[], args=[])
        t2 = clock()
        reservation = quota.try_reserve(100.0, now)
        t3 = clock()
        assert reservation is not None, "the bench's limits must grant every reservation"
        quota.release(reservation, now)
        t4 = clock()
        timings["ping"].append(t1 - t0)
        timings["noop script"].append(t2 - t1)
        timings["try_reserve"].append(t3 - t2)
        timings["release"].append(t4 - t3)
    return timings


def server_side(url: str, ops: int) -> dict[str, tuple[float, float]]:
    """Redis's own time per call (µs, from INFO commandstats) of each script run alone, ``ops`` times,
    and the client-side p50 (µs) of the same calls: the difference is the client's share."""
    import redis

    from aiqsim.fleet import RedisQuota

    admin = redis.Redis.from_url(url)
    quota = RedisQuota(url, f"bench-alone-{uuid.uuid4().hex[:8]}", LIMITS, worker="alone")
    noop = quota._client.register_script("return 1")
    noop(keys=[], args=[])
    quota.release(quota.try_reserve(1.0, 0.0), 0.0)  # type: ignore[arg-type]
    clock = time.perf_counter
    out: dict[str, tuple[float, float]] = {}

    def phase(name: str, call: object) -> None:
        before = commandstats(admin).get("evalsha", (0, 0.0))
        latencies = []
        for n in range(ops):
            t0 = clock()
            call(n)  # type: ignore[operator]
            latencies.append(clock() - t0)
        after = commandstats(admin)["evalsha"]
        out[name] = ((after[1] - before[1]) / (after[0] - before[0]), pct(latencies, 0.5) * 1e6)

    held: list[object] = []
    phase("noop script", lambda n: noop(keys=[], args=[]))
    phase("try_reserve", lambda n: held.append(quota.try_reserve(100.0, float(n + 1))))
    phase("release", lambda n: quota.release(held[n], float(ops + 1)))  # type: ignore[arg-type]
    quota.reset()
    return out


def _worker_entry(args: tuple[str, str, int, float]) -> dict[str, list[float]]:
    return one_worker(*args)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def commandstats(client: object) -> dict[str, tuple[int, float]]:
    """``{command: (calls, total µs in Redis)}`` so far (differences of two make one run's)."""
    stats = client.info("commandstats")  # type: ignore[attr-defined]
    return {name.removeprefix("cmdstat_"): (int(e["calls"]), float(e["usec"])) for name, e in stats.items()}


def run(url: str, workers: int, ops: int) -> tuple[dict[str, list[float]], dict[str, object]]:
    import redis

    admin = redis.Redis.from_url(url)
    account = f"bench-reservation-{uuid.uuid4().hex[:8]}"
    before = commandstats(admin)
    before_conns = int(admin.info("stats")["total_connections_received"])
    start_at = time.time() + 1.0 + 0.3 * workers
    jobs = [(url, account, ops, start_at)] * workers
    if workers == 1:
        results = [one_worker(*jobs[0])]
    else:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            results = pool.map(_worker_entry, jobs)
    after = commandstats(admin)
    stats = {
        name: (calls - before.get(name, (0, 0.0))[0], usec - before.get(name, (0, 0.0))[1])
        for name, (calls, usec) in after.items()
        if calls > before.get(name, (0, 0.0))[0] and name != "info"
    }
    conns = int(admin.info("stats")["total_connections_received"]) - before_conns
    with contextlib.suppress(Exception):
        admin.delete(*admin.keys(f"{{aiqsim:quota:{account}}}*"))
    merged: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for result in results:
        for kind in KINDS:
            merged[kind].extend(result[kind])
    return merged, {"stats": stats, "connections": conns}


def report(
    title: str, workers: int, ops: int, merged: dict[str, list[float]], extra: dict[str, object]
) -> None:
    print(f"\n### {title}: {workers} worker(s) x {ops} iterations\n")
    print("| call | p50 | p99 | p50 - ping p50 | p99 - ping p99 |")
    print("|---|---|---|---|---|")
    ping50, ping99 = pct(merged["ping"], 0.5), pct(merged["ping"], 0.99)
    for kind in KINDS:
        p50, p99 = pct(merged[kind], 0.5), pct(merged[kind], 0.99)
        print(
            f"| {kind} | {p50 * 1e6:,.0f} µs | {p99 * 1e6:,.0f} µs | "
            f"{(p50 - ping50) * 1e6:+,.0f} µs | {(p99 - ping99) * 1e6:+,.0f} µs |"
        )
    stats = extra["stats"]
    assert isinstance(stats, dict)
    reservations = workers * (ops + 1)
    print("\nServer side (INFO commandstats, this run's calls, setup included):\n")
    print("| command | calls | calls per reservation | µs per call in Redis |")
    print("|---|---|---|---|")
    for name in sorted(stats):
        calls, usec = stats[name]
        print(f"| {name} | {calls:,} | {calls / reservations:.3f} | {usec / calls:.2f} |")
    print(f"\nconnections opened during the run: {extra['connections']} (for {workers} worker(s))")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--url", help="an existing Redis (default: a throwaway one)")
    args = parser.parse_args()
    load = os.getloadavg()
    import redis

    print(
        f"redis-py {redis.__version__}, {os.cpu_count()} CPU(s), "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    with redis_url(args.url) as url:
        info = redis.Redis.from_url(url).info("server")
        print(f"Redis {info['redis_version']} on {url.split('@')[-1]}")
        for workers in (1, args.workers):
            merged, extra = run(url, workers, args.ops)
            title = "one worker" if workers == 1 else f"{workers} workers at once, one account"
            report(title, workers, args.ops, merged, extra)
        alone = server_side(url, min(args.ops, 2000))
        print("\n### Each script alone (one worker): Redis's time and the client's\n")
        print("| call | µs in Redis per call | client p50 | client p50 - Redis |")
        print("|---|---|---|---|")
        for name, (in_redis, client_p50) in alone.items():
            print(f"| {name} | {in_redis:.1f} µs | {client_p50:.0f} µs | {client_p50 - in_redis:.0f} µs |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
