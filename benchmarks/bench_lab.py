"""Tuning-lab speed: one re-run per shipped scenario (the widget's latency), and sweep scaling.

Measures, in one run on this machine:
- wall time of one ``simulate`` per shipped scenario (the live widget re-runs exactly this);
- the same sweep on 1 process vs 2 processes (ratio; goal >= 1.8x on 2 cores);
- Dask LocalCluster (2 workers) vs the local process pool on the same sweep (overhead ratio).

Run: ``python benchmarks/bench_lab.py`` (a few minutes). Prints a markdown table.
"""

from __future__ import annotations

import os
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


ROUNDS = 5


def seconds(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def min_median(values: list[float], digits: int = 2) -> str:
    return f"{min(values):.{digits}f} / {statistics.median(values):.{digits}f}"


def main() -> None:
    load_before = os.getloadavg()[0]
    print(f"| scenario | one simulate, s, min / median of {ROUNDS} |")
    print("|---|---|")
    for path in SCENARIOS:
        walls = [seconds(lambda p=path: simulate(p)) for _ in range(ROUNDS)]
        print(f"| {path.stem} | {min_median(walls, 3)} |")
    runs = len(SEEDS) * 12
    engines = {
        "one": lambda: sweep(SWEEP_SCENARIO, GRID, SEEDS, engine="local", workers=1, progress=False),
        "two": lambda: sweep(SWEEP_SCENARIO, GRID, SEEDS, engine="local", workers=2, progress=False),
        "dask": lambda: sweep(SWEEP_SCENARIO, GRID, SEEDS, engine="dask", workers=2, progress=False),
    }
    walls: dict[str, list[float]] = {name: [] for name in engines}
    speedups: list[float] = []
    dask_overheads: list[float] = []
    for round_no in range(ROUNDS):  # interleaved: a load burst hits every engine of a round alike
        order = list(engines) if round_no % 2 == 0 else list(reversed(engines))
        this_round = {name: seconds(engines[name]) for name in order}
        for name, wall in this_round.items():
            walls[name].append(wall)
        speedups.append(this_round["one"] / this_round["two"])
        dask_overheads.append(this_round["dask"] / this_round["two"])
    print()
    print(
        f"sweep of {runs} runs of {SWEEP_SCENARIO.stem}, {ROUNDS} interleaved rounds, min / median; "
        f"load average before {load_before:.2f}, after {os.getloadavg()[0]:.2f}:"
    )
    print()
    print("| engine | wall s | ratio, per round |")
    print("|---|---|---|")
    print(f"| local, 1 process | {min_median(walls['one'])} | 1.00 |")
    print(f"| local, 2 processes | {min_median(walls['two'])} | speed-up {min_median(speedups)}x |")
    label = "dask LocalCluster, 2 workers (incl. cluster start)"
    print(f"| {label} | {min_median(walls['dask'])} | {min_median(dask_overheads)}x the local pool |")


if __name__ == "__main__":
    main()
