"""Peak memory per task of a full-record simulation: the M/M/8 replication at several sizes.

Each size runs in a FRESH process (``--worker N``) that reports its peak resident set size
(``resource.getrusage(...).ru_maxrss``); the bytes per task are the slope between two sizes, so the
interpreter and imports (the intercept) do not count. The run keeps every task record (the store),
the provider's draws and the submissions, as :func:`aiqsim.validation.mmc.simulate_replication`
does, so this is the cost that a streaming mode would remove.

Run: ``python benchmarks/bench_memory.py [--sizes 10000,100000] [--rounds 5]``; prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys


def worker(tasks: int) -> None:
    from aiqsim.validation.mmc import simulate_replication

    replication = simulate_replication(7.0, 1.0, 8, tasks, seed=0)
    assert len(replication.records) == tasks
    print(json.dumps({"maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))


def peak_kb(tasks: int) -> int:
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker", str(tasks)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])["maxrss_kb"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    load = os.getloadavg()[0]
    peaks = {n: [peak_kb(n) for _ in range(args.rounds)] for n in sizes}
    print(
        f"M/M/8 replication, full records; peak RSS of a fresh process, {args.rounds} rounds, "
        f"load {load:.2f}\n"
    )
    print("| tasks | peak RSS MB min / median |")
    print("|---:|---:|")
    for n in sizes:
        print(f"| {n:,} | {min(peaks[n]) / 1024:.1f} / {statistics.median(peaks[n]) / 1024:.1f} |")
    low, high = sizes[0], sizes[-1]
    slope = (statistics.median(peaks[high]) - statistics.median(peaks[low])) * 1024 / (high - low)
    print(f"\nBytes per task (slope of the medians, {low:,} -> {high:,}): {slope:,.0f}")


if __name__ == "__main__":
    main()
