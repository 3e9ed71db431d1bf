"""Does TPE beat random search of the same budget? ("Tune finds, on a scenario with a known
optimum from an exhaustive grid, a setting within 5% of the grid's best objective using <= 25% of the
grid's evaluations; it beats random search of the same budget across 5 seeds.")

Two problems, each with its whole grid evaluated (the known optimum):

- ``storm`` (tests/test_tune.py's): the retry-storm scenario cut to 60 s, 120 settings (3 strategies x 4
  caps x 10 bases), objective ``rate_limited`` under ``success_latency_p95_s <= 10``. An easy grid for
  random search (1 setting in 8 is within 5% of the optimum).
- ``mix`` (scenarios/tuning/rate_limited_mix.toml): the shape of real retry/bucket tuning, 1,008 settings
  over four interacting parameters: ``retry.base_s`` (8 values, log-spaced 0.05-6.4 s) x
  ``quotas.llm.request_burst`` (7, log-spaced 1-64) x ``quotas.llm.concurrency`` (6) x
  ``dispatch.policy`` (3); objective ``success_latency_p95_s`` under ``tasks_failed <= 0``. The grid's
  results are cached in benchmarks/data/ (keyed by a hash of the scenario text and the grid), since
  simulating it takes minutes.

Each setting is run with one replication seed (seed 0), so it has one exact value and the grid's optimum
is known; tune() with ``seeds=1`` uses the same seed (common random numbers). For each optimiser seed,
TPE and random search get the same number of trials (the budget) on the same grid; a search's result is
the best feasible objective it found, scored against the grid: regret = found / grid best - 1 (0 means it
found the optimum). Next to the random-search runs, random search's *exact* expected best for the budget,
from the grid (:mod:`aiqsim.lab.search_baseline`): a few random runs only sample it.

TPE's settings are tune()'s: ``multivariate=True`` (a joint density over the parameters, so it can model
interactions such as burst x retry base), ``startup_trials`` random start-up trials (Optuna's default is
10 whatever the budget; ``--startup N`` sets it). ``group=True`` is not used: it only matters for
conditional search spaces, and these are fixed. ``constant_liar`` is not used: tune() runs trials one
after the other (a trial's replication seeds run in parallel), so no trial is sampled while another is
pending.

Run: ``python benchmarks/bench_tune.py [--problem storm|mix] [--seeds N] [--startup N] [--from-grid]
[--no-random-runs] [BUDGET ...]``
(default: storm, 5 seeds, budgets 15 and 30). Prints the grid's best, a markdown table per budget with
each seed's result, and the load average.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from aiqsim.lab.search_baseline import random_search_best_distribution, random_search_expected_best
from aiqsim.lab.tune import tune
from aiqsim.sim.sweep import sweep

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True)
class Problem:
    """A scenario, its grid, the objective (minimised) and one ``metric <= bound`` constraint."""

    scenario: Path
    text: Callable[[str], str]
    """The scenario text as run (e.g. cut shorter)."""
    grid: dict[str, list[object]]
    objective: str
    metric: str
    bound: float
    cache: bool


PROBLEMS = {
    "storm": Problem(
        ROOT / "scenarios" / "retry_storm_429.toml",
        lambda text: text.replace("duration_s = 120", "duration_s = 60"),
        {
            "retry.strategy": ["exponential", "full_jitter", "decorrelated_jitter"],
            "retry.cap_s": [5, 10, 20, 40],
            "retry.base_s": [0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.2, 2, 3, 5],
        },
        "rate_limited",
        "success_latency_p95_s",
        10.0,
        cache=False,
    ),
    "mix": Problem(
        ROOT / "scenarios" / "tuning" / "rate_limited_mix.toml",
        lambda text: text,
        {
            "retry.base_s": [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4],
            "quotas.llm.request_burst": [1, 2, 4, 8, 16, 32, 64],
            "quotas.llm.concurrency": [2, 3, 4, 6, 8, 16],
            "dispatch.policy": ["fifo", "sjf", "sjf_aging"],
        },
        "success_latency_p95_s",
        "tasks_failed",
        0.0,
        cache=True,
    ),
}


def grid_cache(name: str, problem: Problem, text: str) -> Path:
    """Where the grid's results for this scenario text and grid are cached (a new name when either
    changes, so a stale cache is never read)."""
    key = hashlib.sha256(json.dumps([text, problem.grid], sort_keys=True).encode()).hexdigest()[:12]
    return DATA / f"tune_grid_{name}_{key}.csv"


def evaluate_grid(name: str, problem: Problem, path: Path) -> tuple[pd.DataFrame, str]:
    """Every grid point at replication seed 0 (from the cache in benchmarks/data/ when it holds this
    scenario text and grid); and a note on where it came from and how long it took."""
    cached = grid_cache(name, problem, path.read_text())
    columns = [*problem.grid, problem.objective, problem.metric]
    if problem.cache and cached.exists():
        return pd.read_csv(cached), f"cached in {cached.relative_to(ROOT)}"
    start = time.perf_counter()
    load = os.getloadavg()[0]
    grid = sweep(path, problem.grid, seeds=[0], engine="serial", progress=False)
    took = time.perf_counter() - start
    note = f"simulated in {took:.0f} s (serial, load average {load:.2f} at the start)"
    if problem.cache:
        DATA.mkdir(exist_ok=True)
        grid[columns].to_csv(cached, index=False)
        note += f", cached in {cached.relative_to(ROOT)}"
    return grid[columns], note


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("budgets", nargs="*", type=int)
    parser.add_argument("--problem", choices=sorted(PROBLEMS), default="storm")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--startup", type=int, default=None, help="TPE start-up trials (default: tune()'s)")
    parser.add_argument("--no-random-runs", action="store_true", help="only the exact random baseline")
    parser.add_argument(
        "--from-grid",
        action="store_true",
        help="trials read their result from the evaluated grid instead of simulating (the same values: "
        "one replication seed, seed 0); for sweeps over optimiser settings in seconds",
    )
    args = parser.parse_args()
    problem = PROBLEMS[args.problem]
    objective, metric, bound = problem.objective, problem.metric, problem.bound
    params = [f"{key}={','.join(map(str, values))}" for key, values in problem.grid.items()]
    before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / problem.scenario.name
        path.write_text(problem.text(problem.scenario.read_text()))
        grid, note = evaluate_grid(args.problem, problem, path)
        budgets = args.budgets or [len(grid) // 8, len(grid) // 4]
        if args.from_grid:
            from aiqsim.lab import tune as tune_module

            keys = list(problem.grid)
            table = {tuple(row[k] for k in keys): row for _, row in grid.iterrows()}

            def from_grid(self: object, point: dict[str, object], seeds: list[int]) -> list[object]:
                row = table[tuple(point[k] for k in keys)]
                return [({objective: float(row[objective]), metric: float(row[metric])}, None) for _ in seeds]

            tune_module._Runner.run = from_grid  # type: ignore[method-assign]
        ok = (grid[metric] <= bound).tolist()
        feasible = grid[grid[metric] <= bound]
        best = float(feasible[objective].min())
        values = np.sort(feasible[objective].to_numpy(float))
        within5 = int((values <= 1.05 * best).sum())
        print(f"grid ({args.problem}): {len(grid)} settings {note}; {len(feasible)} feasible, best "
              f"{objective} = {best:g}; {within5} feasible settings within 5% of it (a random draw hits "
              f"one with p = {within5 / len(grid):.4f})\n")  # fmt: skip
        for budget in budgets:
            rows = []
            start = time.perf_counter()
            for seed in range(args.seeds):
                found = {}
                for sampler in ("tpe",) if args.no_random_runs else ("tpe", "random"):
                    result = tune(
                        path, params, objective=objective, constraints=[f"{metric}<={bound:g}"],
                        trials=budget, seeds=1, seed=seed, sampler=sampler, progress=False,
                        startup_trials=args.startup,
                    )  # fmt: skip
                    value = result.best_values[objective] if result.feasible else float("inf")
                    distinct = int((~result.trials["repeat"]).sum())
                    found[sampler] = (value, distinct)
                found.setdefault("random", (float("nan"), 0))
                rows.append((seed, found))
            took = time.perf_counter() - start
            expected = random_search_expected_best(grid[objective].tolist(), ok, budget)
            distribution, _ = random_search_best_distribution(grid[objective].tolist(), ok, budget)
            hit = sum(p for value, p in distribution if value <= 1.05 * best)
            print(f"budget {budget} trials ({budget / len(grid):.1%} of the grid), {args.seeds} optimiser "
                  f"seeds, TPE start-up trials {args.startup or 'default'}, {took:.0f} s:\n")  # fmt: skip
            print("| seed | TPE best | TPE regret | TPE distinct settings | P(random worse) | random best "
                  "| random regret | better |")  # fmt: skip
            print("|---:|---:|---:|---:|---:|---:|---:|---|")
            n = len(grid)
            for seed, found in rows:
                (t, td), (r, _) = found["tpe"], found["random"]
                # random search of the budget is strictly worse than t when every draw misses the
                # feasible points at least as good as t (exact, from the grid)
                as_good = sum(good and value <= t for value, good in zip(grid[objective], ok, strict=True))
                random_worse = ((n - as_good) / n) ** budget
                verdict = "-" if r != r else "TPE" if t < r else "random" if r < t else "tie"
                print(f"| {seed} | {t:g} | {t / best - 1:+.1%} | {td} | {random_worse:.3f} | {r:g} | "
                      f"{r / best - 1:+.1%} | {verdict} |")  # fmt: skip
            tpe = [found["tpe"][0] for _, found in rows]
            rnd = [found["random"][0] for _, found in rows if found["random"][0] == found["random"][0]]
            wins = sum(found["tpe"][0] < found["random"][0] for _, found in rows)
            ties = sum(found["tpe"][0] == found["random"][0] for _, found in rows)
            if rnd:
                print(f"\nmean best: TPE {statistics.mean(tpe):.3f}, random runs {statistics.mean(rnd):.3f}; "
                      f"within 5% of the grid best: TPE {sum(t <= 1.05 * best for t in tpe)}/{len(tpe)}, "
                      f"random runs {sum(r <= 1.05 * best for r in rnd)}/{len(rnd)}; TPE better in {wins}, "
                      f"tie in {ties}, worse in {len(rnd) - wins - ties}")  # fmt: skip
            else:
                print(f"\nmean best: TPE {statistics.mean(tpe):.3f}; within 5% of the grid best: TPE "
                      f"{sum(t <= 1.05 * best for t in tpe)}/{len(tpe)}")  # fmt: skip
            print(f"random search of {budget} trials, exactly: expected best {expected:.3f} (regret "
                  f"{expected / best - 1:+.2%}), within 5% of the grid best with p = {hit:.3f}; TPE mean "
                  f"regret {statistics.mean(tpe) / best - 1:+.2%} (sd over seeds "
                  f"{statistics.stdev(tpe) / best if len(tpe) > 1 else 0:.2%}), median "
                  f"{statistics.median(tpe) / best - 1:+.2%}\n")  # fmt: skip
    after = os.getloadavg()
    print(f"load average {before[0]:.2f} before, {after[0]:.2f} after (1 min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
