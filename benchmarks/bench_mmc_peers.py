"""M/M/c per customer, side by side: bare SimPy, the runtime alone, Ciw and aiqsim's production scheduler.

The queue: Poisson arrivals (lambda = 7), exponential service (mu = 1), c = 8 servers, FIFO, an unbounded
queue; Erlang C gives the mean wait in queue Wq = 0.6353. Each model runs ``--customers`` customers
(100,000 by default) for seeds 0-4 (``--rounds``); every (model, seed) runs in a FRESH Python process
(``python bench_mmc_peers.py --worker MODEL SEED N``), so no model inherits another's heap, caches or
garbage. The worker measures ``time.process_time()`` around the model run only (imports excluded):
CPU time, which a loaded shared machine distorts far less than wall time.

Models:

- ``simpy``: ``simpy.Resource(env, 8)`` and one generator process per customer, the least a SimPy
  model of this queue can do.
- ``coroutines``: the same model as ``async def`` coroutines on :class:`aiqsim.SimPyRuntime`, with a
  portable queue of 8 tokens as the servers (what the runtime driver alone costs).
- ``ciw``: Ciw, a well-known Python queueing simulator (the ``peers`` extra; install it in a venv of
  its own: ciw 3.2.7 ships a top-level ``tests`` package that shadows this repository's tests).
- ``aiqsim``: the production :class:`aiqsim.Scheduler` in the :func:`aiqsim.validation.mmc.mmc_check`
  configuration (memory store, FIFO, ``QuotaLimits(concurrency=8)``, one attempt, no attempt timeout).
- ``aiqsim+timeout``: the same with the default 60 s attempt timeout on every call.

Each model's mean wait (customers after the first 10%) is checked against Erlang C with the 95%
t-interval over the seeds. ``calls / customer`` counts the function calls (Python and built-in) each
model makes per customer in one cProfile run (``--calls-customers``, 20,000 by default, seed 0): a
count that any machine reproduces exactly, which says where the CPU column's differences come from.
Prints one markdown table: min / median µs of CPU per customer, the ratios of the medians to SimPy's
and to Ciw's from this same run, and the load average before and after.

``--instructions N`` adds a second table: per customer, the instructions executed, the I1 and D1
cache misses and the mispredicted branches under ``valgrind --tool=cachegrind`` (its simulated
caches and predictor), from runs of 2,000 and 2,000 + N customers. Counts any machine with the same
Python build reproduces, whatever its load; they also show why CPU ratios exceed instruction ratios.

``--baseline REF`` adds aiqsim from an earlier commit (exported with ``git archive``, imported through
``PYTHONPATH``) in the ``mmc_check`` configuration, in the same rounds.

Run: ``python benchmarks/bench_mmc_peers.py`` (a few minutes) or ``--customers 20000`` for a quick look.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ARRIVAL_RATE = 7.0
SERVICE_RATE = 1.0
SERVERS = 8
WARMUP_SHARE = 0.1
MODELS = ("simpy", "coroutines", "ciw", "aiqsim", "aiqsim+timeout")
LABELS = {
    "simpy": "bare SimPy (`simpy.Resource(8)`)",
    "coroutines": "the same model as coroutines on `SimPyRuntime`",
    "ciw": "Ciw",
    "aiqsim": "aiqsim, `mmc_check` configuration",
    "aiqsim+timeout": "aiqsim with the default attempt timeout (60 s)",
}


# ---------------------------------------------------------------------------- the models (worker side)


def run_simpy(customers: int, seed: int) -> list[float]:
    import simpy

    env = simpy.Environment()
    servers = simpy.Resource(env, capacity=SERVERS)
    arrivals = random.Random(f"mmc-arrivals-{seed}")
    services = random.Random(f"mmc-service-{seed}")
    waits: list[float] = []

    def customer(created: float):  # type: ignore[no-untyped-def]
        with servers.request() as slot:
            yield slot
            waits.append(env.now - created)
            yield env.timeout(services.expovariate(SERVICE_RATE))

    def source():  # type: ignore[no-untyped-def]
        for _ in range(customers):
            yield env.timeout(arrivals.expovariate(ARRIVAL_RATE))
            env.process(customer(env.now))

    env.process(source())
    env.run()
    return waits


def run_coroutines(customers: int, seed: int) -> list[float]:
    from aiqsim import SimPyRuntime
    from aiqsim.runtime import Queue

    runtime = SimPyRuntime()
    slots: Queue[None] = Queue(runtime)
    for _ in range(SERVERS):
        slots.put_nowait(None)
    arrivals = random.Random(f"mmc-arrivals-{seed}")
    services = random.Random(f"mmc-service-{seed}")
    waits: list[float] = []

    async def customer(created: float) -> None:
        await slots.get()
        waits.append(runtime.now() - created)
        await runtime.sleep(services.expovariate(SERVICE_RATE))
        slots.put_nowait(None)

    async def main() -> None:
        handles = []
        for _ in range(customers):
            await runtime.sleep(arrivals.expovariate(ARRIVAL_RATE))
            handles.append(runtime.spawn(customer(runtime.now())))
        for handle in handles:
            await handle

    runtime.run(main())
    return waits


def run_ciw(customers: int, seed: int) -> list[float]:
    import ciw

    ciw.seed(seed)
    network = ciw.create_network(
        arrival_distributions=[ciw.dists.Exponential(rate=ARRIVAL_RATE)],
        service_distributions=[ciw.dists.Exponential(rate=SERVICE_RATE)],
        number_of_servers=[SERVERS],
    )
    simulation = ciw.Simulation(network)
    simulation.simulate_until_max_customers(customers, method="Finish")
    records = sorted(simulation.get_all_records(), key=lambda r: r.arrival_date)
    return [r.waiting_time for r in records]


def run_aiqsim(customers: int, seed: int, *, timeout: bool) -> list[float]:
    from aiqsim.validation.mmc import simulate_replication

    # no keyword without the timeout: a --baseline tree's simulate_replication may not have it
    extra = {"attempt_timeout_s": 60.0} if timeout else {}
    replication = simulate_replication(ARRIVAL_RATE, SERVICE_RATE, SERVERS, customers, seed, **extra)
    return [r.started_at - r.created_at for r in replication.records]  # type: ignore[operator]


_RUNNERS = {
    "simpy": run_simpy,
    "coroutines": run_coroutines,
    "ciw": run_ciw,
    "aiqsim": lambda n, s: run_aiqsim(n, s, timeout=False),
    "aiqsim+timeout": lambda n, s: run_aiqsim(n, s, timeout=True),
    "aiqsim@baseline": lambda n, s: run_aiqsim(n, s, timeout=False),
}
_IMPORTS = {"simpy": ["simpy"], "coroutines": ["aiqsim", "aiqsim.runtime"], "ciw": ["ciw"]}


def worker(model: str, seed: int, customers: int) -> None:
    """Run one model once in this (fresh) process; print CPU seconds and the mean wait as JSON."""
    runner = _RUNNERS[model]
    for name in _IMPORTS.get(model, ["aiqsim.validation.mmc"]):  # imports are not the model's cost
        importlib.import_module(name)
    started = time.process_time()
    waits = runner(customers, seed)
    cpu = time.process_time() - started
    kept = waits[int(len(waits) * WARMUP_SHARE) :]
    print(json.dumps({"cpu_s": cpu, "customers": len(waits), "mean_wait": statistics.fmean(kept)}))


def count_calls(model: str, customers: int) -> None:
    """Run one model once (seed 0) under cProfile; print the function calls per customer as JSON.

    A count, not a time: the same on any machine and under any load, so it explains the CPU
    column without its noise (every Python function and built-in call cProfile sees)."""
    import cProfile
    import pstats

    runner = _RUNNERS[model]
    for name in _IMPORTS.get(model, ["aiqsim.validation.mmc"]):
        importlib.import_module(name)
    profile = cProfile.Profile()
    profile.enable()
    runner(customers, 0)
    profile.disable()
    calls = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
    print(json.dumps({"calls_per_customer": calls / customers}))


# ---------------------------------------------------------------------------- the driver


def erlang_c_wait() -> float:
    from aiqsim.validation.mmc import expected_wait_in_queue

    return expected_wait_in_queue(ARRIVAL_RATE, SERVICE_RATE, SERVERS)


def run_this_script(
    model: str, arguments: list[str], trees: dict[str, str], *, under: list[str] | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """This script in a fresh process with ``arguments`` (a worker mode), ``under`` a command such as
    valgrind if given, from the temporary folder; ``trees[model]`` (a baseline's
    tree) first on the path for the models that run another tree's aiqsim."""
    environment = {**os.environ, **env}
    if model in trees:  # that tree's aiqsim shadows the installed one
        environment["PYTHONPATH"] = trees[model]
    return subprocess.run(
        [*(under or []), sys.executable, os.path.abspath(__file__), *arguments],
        capture_output=True,
        text=True,
        check=False,
        env=environment,
        cwd=tempfile.gettempdir(),
    )


def run_worker(
    model: str, seed: int, customers: int, trees: dict[str, str], *, count: bool = False
) -> dict[str, float]:
    mode = (
        ["--count-calls", model, str(customers)] if count else ["--worker", model, str(seed), str(customers)]
    )
    done = run_this_script(model, mode, trees)
    if done.returncode != 0:
        raise RuntimeError(f"{model} seed {seed} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


INSTRUCTIONS_BASE = 2_000
"""Customers of the run whose counts are subtracted: what is left is the per-customer part (the
imports, the interpreter's start and the first customers' caches cancel out)."""


def cachegrind_counts(model: str, customers: int, trees: dict[str, str]) -> dict[str, int]:
    """Counts of one worker run of ``model`` (seed 0) under ``valgrind --tool=cachegrind``: the same
    on any machine with the same Python build, whatever its load (cachegrind simulates the caches)."""
    from cachegrind import COUNTS, cachegrind_command, read_counts  # a sibling script

    done = run_this_script(
        model,
        ["--worker", model, "0", str(customers)],
        trees,
        under=cachegrind_command(simulate_caches=True),
        PYTHONHASHSEED="0",
    )
    if done.returncode != 0:
        raise RuntimeError(f"{model} under cachegrind failed:\n{done.stderr[-2000:]}")
    return read_counts(done.stderr, tuple(COUNTS))


def print_instruction_table(models: list[str], extra: int, trees: dict[str, str]) -> None:
    """Per-customer counts under cachegrind: runs of ``INSTRUCTIONS_BASE`` and ``+ extra`` customers."""
    if shutil.which("valgrind") is None:
        print("\n--instructions needs valgrind on the PATH: its table is left out.")
        return
    rows = {}
    for model in models:
        small = cachegrind_counts(model, INSTRUCTIONS_BASE, trees)
        large = cachegrind_counts(model, INSTRUCTIONS_BASE + extra, trees)
        rows[model] = {name: (large[name] - small[name]) / extra for name in small}
        print(f"  {model} under cachegrind: {rows[model]}", file=sys.stderr)
    names = list(rows[models[0]])
    print(
        f"\nPer customer under cachegrind (valgrind's simulated caches and branch predictor): a run of "
        f"{INSTRUCTIONS_BASE + extra:,} customers minus one of {INSTRUCTIONS_BASE:,}, seed 0, divided by "
        f"{extra:,}. Counts, not time: the same on any machine with this Python build.\n"
    )
    print("| model | " + " | ".join(names) + " | instructions vs SimPy |")
    print("|---|" + "---:|" * (len(names) + 1))
    for model in models:
        ratio = (
            f"{rows[model]['instructions'] / rows['simpy']['instructions']:.2f}x" if "simpy" in rows else "-"
        )
        cells = " | ".join(f"{rows[model][name] / 1000:.1f}k" for name in names)
        print(f"| {LABELS[model]} | {cells} | {ratio} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--customers", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5, help="seeds 0..rounds-1 (>= 2 for a CI)")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset")
    parser.add_argument(
        "--baseline",
        metavar="REF",
        help="also run aiqsim (mmc_check configuration) from this commit, exported with git archive",
    )
    parser.add_argument(
        "--calls-customers",
        type=int,
        default=20_000,
        help="customers of the one cProfile run per model that counts function calls (0: no count)",
    )
    parser.add_argument(
        "--instructions",
        type=int,
        default=0,
        metavar="CUSTOMERS",
        help="also count instructions, cache misses and mispredicted branches per customer under "
        "cachegrind over this many customers (0: not; 10000 takes a few minutes per model)",
    )
    parser.add_argument("--worker", nargs=3, metavar=("MODEL", "SEED", "CUSTOMERS"), help=argparse.SUPPRESS)
    parser.add_argument("--count-calls", nargs=2, metavar=("MODEL", "CUSTOMERS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), int(args.worker[2]))
        return
    if args.count_calls:
        count_calls(args.count_calls[0], int(args.count_calls[1]))
        return
    models = [m for m in args.models.split(",") if m]
    if "ciw" in models and importlib.util.find_spec("ciw") is None:  # e.g. under run_all.py in a test venv
        print("Ciw is not installed (pip install -e '.[peers]' in a venv of its own): its row is left out.\n")
        models.remove("ciw")
    trees: dict[str, str] = {}
    if args.baseline:
        from bench_baseline import export  # a sibling script (this one runs from benchmarks/ too)

        trees["aiqsim@baseline"] = tempfile.mkdtemp(prefix="aiqsim-mmc-baseline-")
        export(args.baseline, Path(trees["aiqsim@baseline"]))
        models.append("aiqsim@baseline")
        LABELS["aiqsim@baseline"] = f"aiqsim at {args.baseline}, `mmc_check` configuration"
    from aiqsim.validation.mmc import t_quantile_975

    expected = erlang_c_wait()
    load_before = os.getloadavg()
    results: dict[str, list[dict[str, float]]] = {m: [] for m in models}
    for seed in range(args.rounds):  # rounds interleave the models, so load drifts hit all of them
        for model in models:
            results[model].append(run_worker(model, seed, args.customers, trees))
            print(f"  {model} seed {seed}: {results[model][-1]}", file=sys.stderr)
    load_after = os.getloadavg()
    calls = {
        m: run_worker(m, 0, args.calls_customers, trees, count=True)["calls_per_customer"]
        for m in (models if args.calls_customers > 0 else [])
    }
    median_us = {m: statistics.median(r["cpu_s"] for r in results[m]) / args.customers * 1e6 for m in models}
    print(
        f"M/M/{SERVERS}, lambda={ARRIVAL_RATE:g}, mu={SERVICE_RATE:g}, {args.customers:,} customers, seeds "
        f"0-{args.rounds - 1}, each run in a fresh process; CPU time (time.process_time). Python "
        f"{sys.version.split()[0]}. Load average before {load_before[0]:.2f}, after {load_after[0]:.2f}. "
        f"Erlang C Wq = {expected:.4f}.\n"
    )
    header = "| model | µs CPU / customer min | median | vs SimPy | vs Ciw | mean Wq (95% CI) |"
    header += " Erlang C in CI | calls / customer |"
    print(header)
    print("|---|---:|---:|---:|---:|---|---|---:|")
    for model in models:
        cpu = [r["cpu_s"] / args.customers * 1e6 for r in results[model]]
        waits = [r["mean_wait"] for r in results[model]]
        mean = statistics.fmean(waits)
        if len(waits) > 1:
            half = t_quantile_975(len(waits) - 1) * statistics.stdev(waits) / math.sqrt(len(waits))
            ci = f"{mean:.4f} ({mean - half:.4f}..{mean + half:.4f})"
            inside = mean - half <= expected <= mean + half
        else:
            ci, inside = f"{mean:.4f}", abs(mean / expected - 1) < 0.05
        vs_simpy = f"{median_us[model] / median_us['simpy']:.2f}x" if "simpy" in median_us else "-"
        vs_ciw = f"{median_us[model] / median_us['ciw']:.2f}x" if "ciw" in median_us else "-"
        print(
            f"| {LABELS[model]} | {min(cpu):.1f} | {median_us[model]:.1f} | {vs_simpy} | {vs_ciw} | {ci} | "
            f"{'yes' if inside else 'NO'} | {f'{calls[model]:.1f}' if model in calls else '-'} |"
        )
    if calls:
        print(
            f"\ncalls / customer: function calls (Python and built-in) that cProfile counts in one run of "
            f"{args.calls_customers:,} customers, seed 0, per customer; a count, so it does not depend on "
            "the machine or its load."
        )
    if args.instructions > 0:
        print_instruction_table(models, args.instructions, trees)
    for tree in set(trees.values()):
        shutil.rmtree(tree, ignore_errors=True)


if __name__ == "__main__":
    main()
