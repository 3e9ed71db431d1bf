"""What a crash test costs: wall time per crash case of aiqsim.testing's CrashDriver, per store kind.

Scenario: the crash suite's workload as a user writes it (12 interactive requests, double clicks, a
poison input, 15% server errors, lookup), crashed after every store write of one seed (about 31
cases), on the memory, JSON and SQLite stores. Each case builds a runtime, the providers and a fresh
store, runs the scheduler until the crash, restarts with ``recover()``, finishes and checks the
invariants. Measured: wall time per case, min and median over ``ROUNDS`` rounds (read the min under
load: load only ever adds time), and what that means for a test's budget: cases per second.

Run: ``python benchmarks/bench_testing_kit.py`` (under a minute). Prints a markdown table and the load
average.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from aiqsim import QuotaLimits
from aiqsim.testing import CrashDriver, CrashOptions, Life, StoreFactory

ROUNDS = 5


async def workload(life: Life) -> None:
    gaps = life.world.rng("arrivals")
    for n in range(12):
        document = n // 2
        payload = {
            "input": f"doc-{document}",
            "prompt_units": 20,
            "output_units": 40,
            "poison": document == 4,
        }
        life.submit("llm", payload, task_id=f"click-{n}")
        await life.runtime.sleep(gaps.expovariate(2.0))
    await life.join()


def providers(world):  # type: ignore[no-untyped-def]
    return [
        world.simulated_provider(
            "llm", latency_base_s=0.4, latency_sigma=0.3, server_error_prob=0.15, supports_lookup=True
        )
    ]


def one_round(kind: str) -> tuple[float, int]:
    """(wall seconds, cases) of one full crash run of seed 0 on a fresh store of ``kind``."""
    with tempfile.TemporaryDirectory() as directory:
        driver = CrashDriver(CrashOptions(seeds=(0,)), store=StoreFactory(kind, Path(directory)))
        start = time.perf_counter()
        report = driver.run(
            workload,
            providers=providers,
            scheduler_options={"quotas": {"llm": QuotaLimits(concurrency=3)}, "interactive_limit": None},
            at_most_once=True,
        )
        return time.perf_counter() - start, report.cases


def main() -> None:
    rows = []
    for kind in ("memory", "json", "sqlite"):
        per_case = []
        cases = 0
        for _ in range(ROUNDS):
            wall, cases = one_round(kind)
            per_case.append(wall / cases)
        low, mid = min(per_case), statistics.median(per_case)
        rows.append((kind, cases, low * 1000, mid * 1000, 1 / mid))
    one, five, fifteen = os.getloadavg()
    print(f"{ROUNDS} rounds, seed 0, every crash point; load average {one:.2f} / {five:.2f} / {fifteen:.2f}")
    print()
    print("| store | cases per run | min ms per case | median ms per case | cases per s (median) |")
    print("|---|---|---|---|---|")
    for kind, cases, low, mid, rate in rows:
        print(f"| {kind} | {cases} | {low:.1f} | {mid:.1f} | {rate:.1f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
