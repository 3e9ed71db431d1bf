"""The cycle collector's time in a failure-heavy run: this tree against an earlier commit, side by side.

A failed call whose traceback holds frames that hold the error leaves garbage only the cycle
collector frees. ``scenarios/provider_outage.toml`` fails ~1,000 calls with 503s; each
side (``--ref``, exported with ``git archive``, and the working tree) runs it in a fresh process: one
untimed run (imports, caches), then one timed ``simulate(path, seed=0)`` during which
``gc.callbacks`` sum the CPU time of every collection. Rounds alternate the sides.

Prints min / median over the rounds of the collector's CPU ms and of the run's CPU ms, the objects
the cycle collector finds after one run whose result is still alive (a count: the same on any
machine) and the load average.

Run: ``python benchmarks/bench_failure_garbage.py [--ref a18d6ca] [--rounds 7]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_baseline import export  # a sibling script: run as python benchmarks/bench_failure_garbage.py

REPO = Path(__file__).resolve().parent.parent
SCENARIO = REPO / "scenarios" / "provider_outage.toml"

WORKER = """
import gc, json, sys, time
sys.path.insert(0, sys.argv[1])
from aiqsim.sim import simulate
simulate(sys.argv[2], seed=0)
spent, started = [], [0.0]
def timed(phase, info):
    if phase == "start":
        started[0] = time.process_time()
    else:
        spent.append(time.process_time() - started[0])
gc.collect()
gc.callbacks.append(timed)
began = time.process_time()
simulate(sys.argv[2], seed=0)
cpu = time.process_time() - began
gc.callbacks.remove(timed)
gc.collect()
gc.disable()
gc.set_debug(gc.DEBUG_SAVEALL)
result = simulate(sys.argv[2], seed=0)  # kept alive: what it holds is not garbage
gc.collect()
print(json.dumps({"gc_ms": sum(spent) * 1e3, "cpu_ms": cpu * 1e3, "garbage": len(gc.garbage)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", default="a18d6ca", help="the earlier commit (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="aiqsim-garbage-"))
    try:
        baseline = folder / "baseline"
        baseline.mkdir()
        export(args.ref, baseline)
        worker = folder / "worker.py"
        worker.write_text(WORKER)
        sides = {args.ref: baseline, "working tree": REPO}
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
        load_before = os.getloadavg()[0]
        for _ in range(args.rounds):
            for name, tree in sides.items():
                done = subprocess.run(
                    [sys.executable, str(worker), str(tree), str(SCENARIO)],
                    capture_output=True,
                    text=True,
                    cwd=tempfile.gettempdir(),
                )
                if done.returncode != 0:
                    raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
                runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
        load_after = os.getloadavg()[0]
        print(
            f"simulate(provider_outage, seed=0), {args.rounds} rounds alternating, fresh processes, CPU "
            f"time; load average {load_before:.2f} -> {load_after:.2f}.\n"
        )
        print("| tree | collector ms min / median | run ms min / median | cyclic garbage objects |")
        print("|---|---:|---:|---:|")
        for name, results in runs.items():
            gc_ms = [r["gc_ms"] for r in results]
            cpu_ms = [r["cpu_ms"] for r in results]
            print(
                f"| {name} | {min(gc_ms):.1f} / {statistics.median(gc_ms):.1f} | "
                f"{min(cpu_ms):.0f} / {statistics.median(cpu_ms):.0f} | {int(results[0]['garbage']):,} |"
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
