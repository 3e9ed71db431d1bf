"""Tuning-lab speed: one re-run per shipped scenario (the widget's latency), and sweep scaling.

Measures, in one run on this machine:
- wall time of one ``simulate`` per shipped scenario (the live widget re-runs exactly this);
- the same sweep on 1 process vs 2 processes (ratio; goal >= 1.8x on 2 cores);
- Dask LocalCluster (2 workers) vs the local process pool on the same sweep (overhead ratio).

Run: ``python benchmarks/bench_lab.py`` (about a minute). Prints a markdown table.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from aiqsim.sim.simulate import simulate
from aiqsim.sim.sweep import sweep

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((ROOT / "scenarios").glob("*.toml"))
SWEEP_SCENARIO = ROOT / "scenarios" / "retry_storm_429.toml"
GRID = {"retry.base_s": [0.1, 0.25, 0.5, 1.0, 2.0, 4.0], "retry.strategy": ["exponential", "full_jitter"]}
SEEDS = range(4)


def timed(fn, repeat: int = 3) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    print("| scenario | one simulate (median of 3), s |")
    print("|---|---|")
    for path in SCENARIOS:
        print(f"| {path.stem} | {timed(lambda p=path: simulate(p)):.3f} |")
    runs = len(SEEDS) * 12
    one = timed(
        lambda: sweep(SWEEP_SCENARIO, GRID, SEEDS, engine="local", workers=1, progress=False), repeat=2
    )
    two = timed(
        lambda: sweep(SWEEP_SCENARIO, GRID, SEEDS, engine="local", workers=2, progress=False), repeat=2
    )
    dask = timed(
        lambda: sweep(SWEEP_SCENARIO, GRID, SEEDS, engine="dask", workers=2, progress=False), repeat=2
    )
    print()
    print(f"sweep of {runs} runs of {SWEEP_SCENARIO.stem} (median of 2):")
    print()
    print("| engine | wall s | ratio |")
    print("|---|---|---|")
    print(f"| local, 1 process | {one:.2f} | 1.00 |")
    print(f"| local, 2 processes | {two:.2f} | speed-up {one / two:.2f}x |")
    label = "dask LocalCluster, 2 workers (incl. cluster start)"
    print(f"| {label} | {dask:.2f} | {dask / two:.2f}x the local pool |")


if __name__ == "__main__":
    main()
