"""Streaming mode with job workloads and fleets: CPU time and memory against the full-record mode.

Two measurements, each in FRESH processes (``--worker``) so one run's heap does not carry into the next:

- CPU time of :func:`aiqsim.sim.simulate.simulate` on the shipped job and fleet scenarios, full vs
  ``records="summary"`` (default key window), interleaved rounds; min / median per mode;
- peak RSS and retained bytes (tracemalloc, after the run with its result alive) of a steady job
  workload (4-stage jobs, ~6 calls each, 0.3 jobs/s, 30 s key window) at two lengths; the slope
  between them is the cost per job. The store is part of the peak (its retention policy purges finished
  tasks, jobs and keys after the key window, so it stays flat), not of the retained bytes (the store is
  gone after the run).

Run: ``python benchmarks/bench_streaming_jobs.py [--rounds 5] [--hours 1,4]``; prints markdown tables
with the load average at the start of each.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
SHIPPED = ("ai_edit_pipeline", "fleet_uneven_load")


def steady_jobs(duration_s: float) -> Any:
    """A steady job workload below every quota (so the jobs in progress do not pile up)."""
    from aiqsim.sim.scenario import parse_scenario

    def provider(name: str, **extra: Any) -> dict[str, Any]:
        return {"name": name, "kind": "llm", "latency_base_s": 0.3, "latency_sigma": 0.3, **extra}

    stages = [
        {"name": "s1", "provider": "a", "size": {"dist": "lognormal", "mean": 500, "sigma": 0.3}},
        {
            "name": "s2",
            "provider": "b",
            "after": ["s1"],
            "size": {"dist": "from_stage", "stage": "s1", "ratio": 2.0},
            "fanout": {"dist": "uniform", "low": 2, "high": 5},
            "fallback": "c",
        },
        {"name": "s3", "provider": "a", "after": ["s1"], "size": {"dist": "fixed", "mean": 100}},
        {"name": "s4", "provider": "c", "after": ["s2", "s3"], "size": {"dist": "fixed", "mean": 50}},
    ]
    hours = max(1, round(duration_s / 3600.0))
    return parse_scenario(
        {
            "scenario": {
                "name": "steady_jobs",
                "duration_s": duration_s,
                "drain_s": 600,
                "timeline_step_s": 60,
            },
            "providers": [
                provider("a", server_requests_per_min=240, server_error_prob=0.05, price_per_1k_units=0.01),
                provider("b", server_requests_per_min=120, server_error_prob=0.05, price_per_1k_units=0.02),
                provider("c", server_error_prob=0.01, price_per_1k_units=0.005),
            ],
            "quotas": {
                "a": {"requests_per_min": 200, "concurrency": 4},
                "b": {"requests_per_min": 100, "concurrency": 3},
                "c": {"concurrency": 4},
            },
            "retry": {"strategy": "full_jitter", "base_s": 0.5, "cap_s": 5, "max_attempts": 4},
            "jobs": [{"name": "j", "stages": stages}],
            "workloads": [  # one workload per hour: arrivals are generated an hour at a time
                {
                    "type": "poisson",
                    "job": "j",
                    "rate_per_s": 0.3,
                    "start_s": 3600.0 * h,
                    "end_s": min(duration_s, 3600.0 * (h + 1)),
                }
                for h in range(hours)
            ],
        },
        source="steady_jobs",
    )


def worker(kind: str, mode: str, arg: str) -> None:
    import gc
    import time
    import tracemalloc

    from aiqsim.sim.simulate import simulate

    window = {"key_window_s": 30.0} if mode == "summary" and kind == "steady" else {}
    scenario: Any = SCENARIOS / f"{arg}.toml" if kind == "shipped" else steady_jobs(float(arg) * 3600.0)
    trace = kind == "steady" and os.environ.get("BENCH_TRACE") == "1"
    if trace:
        tracemalloc.start(1)
    cpu = time.process_time()
    result = simulate(scenario, records=mode, **window)
    cpu = time.process_time() - cpu
    gc.collect()
    print(
        json.dumps(
            {
                "cpu_s": cpu,
                "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                "jobs": result.summary.get("jobs_submitted"),
                "retained_bytes": tracemalloc.get_traced_memory()[0] if trace else None,
            }
        )
    )


def run_worker(*args: str, trace: bool = False) -> dict[str, Any]:
    env = {**os.environ, "BENCH_TRACE": "1" if trace else "0"}
    out = subprocess.run(
        [sys.executable, __file__, "--worker", *args], check=True, capture_output=True, text=True, env=env
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hours", default="1,4", help="two lengths of the steady job workload (hours)")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    print(f"CPU time per run, {args.rounds} interleaved rounds (load average at start: {load()})\n")
    print("| scenario | full CPU s min / median | summary CPU s min / median |")
    print("|---|---|---|")
    for name in SHIPPED:
        times: dict[str, list[float]] = {"full": [], "summary": []}
        for _ in range(args.rounds):
            for mode in times:
                times[mode].append(run_worker("shipped", mode, name)["cpu_s"])
        cells = [f"{min(t):.2f} / {statistics.median(t):.2f}" for t in times.values()]
        print(f"| {name} | {cells[0]} | {cells[1]} |")
    low, high = (float(h) for h in args.hours.split(","))
    print(f"\nsteady job workload, 0.3 jobs/s (load average at start: {load()})\n")
    print("| mode | hours | jobs | peak RSS MB | retained MB (tracemalloc) |")
    print("|---|---|---|---|---|")
    for mode in ("summary", "full"):
        rows = []
        for hours in (low, high):
            peak = run_worker("steady", mode, str(hours))
            traced = run_worker("steady", mode, str(hours), trace=True)
            rows.append((hours, peak, traced))
            print(
                f"| {mode} | {hours:g} | {peak['jobs']:,} | {peak['maxrss_kb'] / 1024:.1f} | "
                f"{traced['retained_bytes'] / 2**20:.2f} |"
            )
        (_, p0, t0), (_, p1, t1) = rows
        jobs = p1["jobs"] - p0["jobs"]
        print(
            f"| {mode}: per job | | | {(p1['maxrss_kb'] - p0['maxrss_kb']) * 1024 / jobs:,.0f} B | "
            f"{(t1['retained_bytes'] - t0['retained_bytes']) / jobs:,.0f} B |"
        )


if __name__ == "__main__":
    main()
