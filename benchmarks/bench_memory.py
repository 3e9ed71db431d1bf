"""Peak memory per task of a full-record simulation: the M/M/8 replication at several sizes.

Each size runs in a FRESH process (``--worker N``) that reports its peak resident set size
(``resource.getrusage(...).ru_maxrss``); the bytes per task are the slope between two sizes, so the
interpreter and imports (the intercept) do not count. The run keeps every task record (the store),
the provider's draws and the submissions, as :func:`aiqsim.validation.mmc.simulate_replication`
does, so this is the cost that a streaming mode would remove.

Run: ``python benchmarks/bench_memory.py [--sizes 10000,100000] [--rounds 5]``; prints a markdown table.

``--simulate MODE`` (``summary`` or ``full``) measures :func:`aiqsim.sim.simulate.simulate` instead, on a
steady 100 calls/s workload of N tasks (one Poisson workload per simulated hour, as in
``scenarios/long/day_at_100_per_s.toml``): peak RSS per size and the slope in bytes per task; the streaming
mode (``summary``) should keep the slope near zero. ``--tracemalloc`` also reports the bytes still
allocated when the run has returned (the result alive, after a full collection): what the run retains.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
from typing import Any


def worker(tasks: int) -> None:
    from aiqsim.validation.mmc import simulate_replication

    replication = simulate_replication(7.0, 1.0, 8, tasks, seed=0)
    assert len(replication.records) == tasks
    print(json.dumps({"maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))


RATE_PER_S = 100.0
HOUR_S = 3600.0


def steady_scenario(tasks: int, workload_s: float = HOUR_S) -> Any:
    """About ``tasks`` arrivals at 100/s, one Poisson workload per ``workload_s`` (default an hour).

    Streaming mode generates a workload's arrivals when it starts (~0.9 KB each until submitted), so
    the workload's length, not the run's, sets that part of the peak: shorter workloads, lower peak."""
    from aiqsim.sim.scenario import parse_scenario

    duration = tasks / RATE_PER_S
    hours = max(1, math.ceil(duration / workload_s))
    workloads = [
        {
            "type": "poisson",
            "provider": "llm",
            "rate_per_s": RATE_PER_S,
            "start_s": h * workload_s,
            "end_s": min(duration, (h + 1) * workload_s),
            "cost": {"dist": "lognormal", "mean": 2076, "sigma": 0.8, "output_fraction": 0.0135},
        }
        for h in range(hours)
    ]
    return parse_scenario(
        {
            "scenario": {
                "name": f"steady_{tasks}", "duration_s": duration, "drain_s": 600, "timeline_step_s": 60
            },
            "providers": [
                {"name": "llm", "kind": "llm", "latency_base_s": 0.2, "latency_per_unit_s": 0.0002,
                 "latency_sigma": 0.3, "rate_limit_prob": 0.01, "rate_limit_retry_after_s": 1,
                 "honours_idempotency": True}
            ],
            "quotas": {"llm": {"concurrency": 256}},
            "workloads": workloads,
        },
        source="bench_memory",
    )  # fmt: skip


def simulate_worker(mode: str, tasks: int, trace: bool, key_window_s: float, workload_s: float) -> None:
    import gc
    import time
    import tracemalloc

    from aiqsim.sim.simulate import simulate

    scenario = steady_scenario(tasks, workload_s)
    if trace:
        tracemalloc.start(1)
    cpu = time.process_time()
    window = {"key_window_s": key_window_s} if mode == "summary" else {}
    result = simulate(scenario, records=mode, **window)
    cpu = time.process_time() - cpu
    gc.collect()
    retained = tracemalloc.get_traced_memory()[0] if trace else None
    print(
        json.dumps(
            {
                "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                "tasks": result.summary["tasks_submitted"],
                "cpu_s": cpu,
                "retained_bytes": retained,
            }
        )
    )


def run_worker(*args: str) -> dict:
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), *args], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def peak_kb(tasks: int) -> int:
    return run_worker("--worker", str(tasks))["maxrss_kb"]


def simulate_main(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    extra = ["--key-window", str(args.key_window), "--workload-s", str(args.workload_s)]
    extra += ["--tracemalloc"] if args.tracemalloc else []
    rows = {}
    for n in sizes:
        load = os.getloadavg()
        rows[n] = [run_worker("--sim-worker", args.simulate, str(n), *extra) for _ in range(args.rounds)]
        print(
            f"# {n:,} tasks done; load average at its start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
            file=sys.stderr,
        )
    print(
        f"simulate(records={args.simulate!r}"
        + (f", key_window_s={args.key_window:g}" if args.simulate == "summary" else "")
        + "), steady 100 calls/s in "
        f"{args.workload_s:g} s workloads; "
        f"fresh process per run, {args.rounds} rounds\n"
    )
    print("| tasks | peak RSS MB min / median | CPU s median | retained MB (tracemalloc) |")
    print("|---:|---:|---:|---:|")
    for n in sizes:
        peaks = [r["maxrss_kb"] / 1024 for r in rows[n]]
        kept = [r["retained_bytes"] for r in rows[n] if r["retained_bytes"] is not None]
        kept_mb = f"{statistics.median(kept) / 1e6:.1f}" if kept else "-"
        print(
            f"| {rows[n][0]['tasks']:,} | {min(peaks):.1f} / {statistics.median(peaks):.1f} | "
            f"{statistics.median(r['cpu_s'] for r in rows[n]):.1f} | {kept_mb} |"
        )
    low, high = sizes[0], sizes[-1]
    med = {n: statistics.median(r["maxrss_kb"] for r in rows[n]) * 1024 for n in (low, high)}
    print(
        f"\nPeak RSS bytes per task (slope of the medians, {low:,} -> {high:,}): "
        f"{(med[high] - med[low]) / (high - low):,.0f}"
    )
    if args.tracemalloc:
        kept = {n: statistics.median(r["retained_bytes"] for r in rows[n]) for n in (low, high)}
        print(f"Retained bytes per task (tracemalloc slope): {(kept[high] - kept[low]) / (high - low):,.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--simulate", choices=("summary", "full"), help="measure simulate() in this mode")
    parser.add_argument("--tracemalloc", action="store_true", help="with --simulate: report retained bytes")
    parser.add_argument(
        "--key-window",
        type=float,
        default=3600.0,
        help="with --simulate summary: key_window_s (default 3600)",
    )
    parser.add_argument(
        "--workload-s", type=float, default=HOUR_S, help="with --simulate: length of each Poisson workload"
    )
    parser.add_argument("--sim-worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    if args.sim_worker:
        simulate_worker(
            args.sim_worker[0], int(args.sim_worker[1]), args.tracemalloc, args.key_window, args.workload_s
        )
        return
    if args.simulate:
        simulate_main(args)
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
