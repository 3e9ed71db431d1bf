"""Does TPE beat random search of the same budget? (issue #17: "Tune finds, on a scenario with a known
optimum from an exhaustive grid, a setting within 5% of the grid's best objective using <= 25% of the
grid's evaluations; it beats random search of the same budget across 5 seeds.")

The scenario and grid are tests/test_tune.py's: the retry-storm scenario cut to 60 s, 120 settings
(3 strategies x 4 caps x 10 bases), objective ``rate_limited`` (fewest 429s) under
``success_latency_p95_s <= 10``, one replication seed (seed 0) so each setting has one exact value and
the grid's optimum is known. For each optimiser seed, TPE and random search get the same number of
trials (the budget) on the same grid; a search's result is the best feasible objective it found,
scored against the grid: regret = found / grid best - 1 (0 means it found the optimum). Next to the
random-search runs, random search's *exact* expected best for the budget, from the grid
(:mod:`aiqsim.lab.search_baseline`): a few random runs only sample it.

Run: ``python benchmarks/bench_tune.py [SEEDS] [BUDGET ...]`` (default 5 seeds, budgets 15 and 30 = 12.5%
and 25% of the grid). Prints the grid's best, a markdown table per budget with each seed's result,
and the load average.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from aiqsim.lab.search_baseline import random_search_best_distribution, random_search_expected_best
from aiqsim.lab.tune import tune
from aiqsim.sim.sweep import sweep

ROOT = Path(__file__).resolve().parent.parent
STORM = ROOT / "scenarios" / "retry_storm_429.toml"
GRID = {
    "retry.strategy": ["exponential", "full_jitter", "decorrelated_jitter"],
    "retry.cap_s": [5, 10, 20, 40],
    "retry.base_s": [0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.2, 2, 3, 5],
}
OBJECTIVE, METRIC, BOUND = "rate_limited", "success_latency_p95_s", 10.0


def main() -> int:
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    budgets = [int(b) for b in sys.argv[2:]] or [15, 30]
    params = [f"{key}={','.join(map(str, values))}" for key, values in GRID.items()]
    before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "storm.toml"
        path.write_text(STORM.read_text().replace("duration_s = 120", "duration_s = 60"))
        start = time.perf_counter()
        grid = sweep(path, GRID, seeds=[0], engine="serial", progress=False)
        grid_s = time.perf_counter() - start
        feasible = grid[grid[METRIC] <= BOUND]
        best = float(feasible[OBJECTIVE].min())
        values = np.sort(feasible[OBJECTIVE].to_numpy(float))
        within5 = int((values <= 1.05 * best).sum())
        print(f"grid: {len(grid)} settings in {grid_s:.1f} s, {len(feasible)} feasible, best {OBJECTIVE} = "
              f"{best:g}; {within5} feasible settings within 5% of it (a random draw hits one with "
              f"p = {within5 / len(grid):.3f})\n")  # fmt: skip
        for budget in budgets:
            rows = []
            for seed in range(seeds):
                found = {}
                for sampler in ("tpe", "random"):
                    result = tune(
                        path, params, objective=OBJECTIVE, constraints=[f"{METRIC}<={BOUND:g}"],
                        trials=budget, seeds=1, seed=seed, sampler=sampler, progress=False,
                    )  # fmt: skip
                    value = result.best_values[OBJECTIVE] if result.feasible else float("inf")
                    distinct = int((~result.trials["repeat"]).sum())
                    found[sampler] = (value, distinct)
                rows.append((seed, found))
            print(
                f"budget {budget} trials ({budget / len(grid):.1%} of the grid), {seeds} optimiser seeds:\n"
            )
            print("| seed | TPE best | TPE regret | TPE distinct settings | random best | random regret "
                  "| random distinct settings | better |")  # fmt: skip
            print("|---:|---:|---:|---:|---:|---:|---:|---|")
            for seed, found in rows:
                (t, td), (r, rd) = found["tpe"], found["random"]
                verdict = "TPE" if t < r else "random" if r < t else "tie"
                print(f"| {seed} | {t:g} | {t / best - 1:+.1%} | {td} | {r:g} | {r / best - 1:+.1%} | {rd} | "
                      f"{verdict} |")  # fmt: skip
            tpe = [found["tpe"][0] for _, found in rows]
            rnd = [found["random"][0] for _, found in rows]
            ok = (grid[METRIC] <= BOUND).tolist()
            expected = random_search_expected_best(grid[OBJECTIVE].tolist(), ok, budget)
            distribution, _ = random_search_best_distribution(grid[OBJECTIVE].tolist(), ok, budget)
            hit = sum(p for value, p in distribution if value <= 1.05 * best)
            wins = sum(t < r for t, r in zip(tpe, rnd, strict=True))
            ties = sum(t == r for t, r in zip(tpe, rnd, strict=True))
            print(f"\nmean best: TPE {statistics.mean(tpe):.1f}, random {statistics.mean(rnd):.1f}; "
                  f"TPE within 5% of the grid best in {sum(t <= 1.05 * best for t in tpe)}/{seeds} seeds, "
                  f"random in {sum(r <= 1.05 * best for r in rnd)}/{seeds}; TPE better in {wins}, tie in "
                  f"{ties}, worse in {seeds - wins - ties}")  # fmt: skip
            print(f"random search of {budget} trials, exactly: expected best {expected:.2f} (regret "
                  f"{expected / best - 1:+.2%}), within 5% of the grid best with p = {hit:.3f}; TPE mean "
                  f"regret {statistics.mean(tpe) / best - 1:+.2%} (sd over seeds "
                  f"{statistics.stdev(tpe) / best if len(tpe) > 1 else 0:.2%})\n")  # fmt: skip
    after = os.getloadavg()
    print(f"load average {before[0]:.2f} before, {after[0]:.2f} after (1 min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
