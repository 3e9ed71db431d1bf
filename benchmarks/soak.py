"""A long soak of the production path: does the worker's memory level off?

One worker process — the real Scheduler on AsyncioRuntime, HttpProvider, SqliteStore with a
retention policy — drives the local provider server (``aiqsim serve``, in a process of its own)
at a steady rate for ``--minutes``, with random 429s, 5xx and lost responses. Every minute it
samples its own resident memory (VmRSS), live Python objects (``gc.get_objects``), open file
descriptors, asyncio tasks, tasks finished in the minute and rows in the store.

At the end it fits a line to RSS over the second half of the run (after warm-up: caches,
allocator arenas and the store's page cache fill first) and prints the slope in MB per hour
with the first-half slope beside it: growth that levels off has a second-half slope near zero;
a leak keeps its slope. Objects and fds are reported the same way.

Run: ``python benchmarks/soak.py --minutes 30 --rate 50`` (about 30 minutes; 90,000 tasks).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from aiqsim import AsyncioRuntime, QuotaLimits, RetryPolicy, Scheduler, SqliteStore
from aiqsim.http import HttpProvider
from aiqsim.stores.retention import RetentionPolicy, purge_periodically

SCENARIO = """
[scenario]
name = "soak"
seed = 1
duration_s = 60

[[providers]]
name = "llm"
latency_base_s = 0.05
latency_per_unit_s = 0.0001
latency_sigma = 0.3
rate_limit_prob = 0.05
rate_limit_retry_after_s = 1.0
server_error_prob = 0.02
timeout_prob = 0.005
honours_idempotency = true

[[workloads]]
type = "poisson"
provider = "llm"
rate_per_s = 1
"""


def rss_mb() -> float:
    text = Path("/proc/self/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", text).group(1)) / 1024  # type: ignore[union-attr]


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (minute, value) points, per hour."""
    if len(points) < 2:
        return float("nan")
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return 60 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else float("nan")


async def soak(url: str, store_path: Path, minutes: float, rate: float) -> list[dict[str, float]]:
    runtime = AsyncioRuntime()
    provider = HttpProvider("llm", url, lookup_path="/lookup/{key}")
    store = SqliteStore(store_path)
    scheduler = Scheduler(
        runtime,
        [provider],
        quotas={"llm": QuotaLimits(concurrency=32)},
        store=store,
        retry=RetryPolicy(attempt_timeout_s=5.0),
        rng=random.Random(0),
    )
    provider.attach_to(scheduler)
    # Finished tasks older than 2 minutes leave the store (keys after 5): the store stays bounded too.
    policy = RetentionPolicy(finished_ttl_s=120, keys_ttl_s=300, interval_s=30)
    purger = runtime.spawn(purge_periodically(store, runtime, policy), name="retention")
    rng = random.Random(1)
    samples: list[dict[str, float]] = []
    finished_before = 0
    n = 0
    start = time.monotonic()
    next_sample = start
    async with scheduler:
        while (now := time.monotonic()) - start < minutes * 60:
            scheduler.submit("llm", {"input": f"soak-{n}", "prompt_units": 20, "output_units": 20})
            n += 1
            if now >= next_sample:
                finished = n - scheduler.in_flight
                samples.append(
                    {
                        "minute": (now - start) / 60,
                        "rss_mb": rss_mb(),
                        "objects": len(gc.get_objects()),
                        "fds": len(os.listdir("/proc/self/fd")),
                        "asyncio_tasks": len(asyncio.all_tasks()),
                        "finished_per_min": finished - finished_before,
                        "store_rows": len(store),
                        "in_flight": scheduler.in_flight,
                    }
                )
                finished_before = finished
                print(" ".join(f"{k}={v:,.1f}" for k, v in samples[-1].items()), flush=True)
                next_sample += 60
            await asyncio.sleep(rng.expovariate(rate))
        await scheduler.join()
    purger.cancel()
    await provider.aclose()
    store.close()
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=50.0, help="tasks per second")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scenario = Path(tmp) / "soak.toml"
        scenario.write_text(textwrap.dedent(SCENARIO), encoding="utf-8")
        server = subprocess.Popen(
            [sys.executable, "-m", "aiqsim", "serve", str(scenario), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            url = None
            for line in server.stdout:  # type: ignore[union-attr]
                match = re.search(r"(http://127\.0\.0\.1:\d+)/v1", line)
                if match:
                    url = match.group(1)
                    break
            if url is None:
                raise SystemExit("aiqsim serve did not print its URL")
            load = os.getloadavg()
            samples = asyncio.run(soak(url, Path(tmp) / "tasks.sqlite3", args.minutes, args.rate))
        finally:
            server.terminate()
            server.wait(timeout=30)
    half = len(samples) // 2
    print(f"\nsoak: {args.minutes:g} min at {args.rate:g} tasks/s, load average at start {load[0]:.2f}")
    print("| figure | first half, per hour | second half, per hour | last sample |")
    print("|---|---|---|---|")
    for key, unit in (
        ("rss_mb", "MB"),
        ("objects", ""),
        ("fds", ""),
        ("asyncio_tasks", ""),
        ("store_rows", ""),
    ):
        first = slope_per_hour([(s["minute"], s[key]) for s in samples[1:half]])
        second = slope_per_hour([(s["minute"], s[key]) for s in samples[half:]])
        print(f"| {key} | {first:+,.1f} {unit} | {second:+,.1f} {unit} | {samples[-1][key]:,.0f} |")
    per_min = [s["finished_per_min"] for s in samples[1:]]
    if per_min:
        low, middle = min(per_min), statistics.median(per_min)
        print(f"| tasks finished per minute (min / median) | {low:,.0f} / {middle:,.0f} | | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
