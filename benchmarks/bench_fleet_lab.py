"""What a simulated fleet costs: wall time of one ``simulate`` of ``fleet_uneven_load`` by fleet size.

The same offered load (3 requests/s for 180 s against 120 requests/min) is served by 1, 4 and 16
workers, with a shared and a split quota; and once with every shared concurrency slot taken most of
the time (``quotas.llm.concurrency = 2``), where waiting workers poll the shared pool every
``fleet.slot_poll_s`` (0.02 s) — the price of the polling, in virtual-clock events.

Run: ``python benchmarks/bench_fleet_lab.py`` (about a minute). Prints a markdown table with
min/median over 5 rounds and the load average before and after.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from aiqsim.sim.simulate import simulate

FLEET = Path(__file__).resolve().parent.parent / "scenarios" / "fleet_uneven_load.toml"
ROUNDS = 5
CASES = [
    ("1 worker (no fleet)", {"fleet.workers": 1, "fleet.routing": "round_robin"}),
    ("4 workers, shared", {}),
    ("4 workers, split", {"fleet.quota": "split"}),
    ("16 workers, shared, even", {"fleet.workers": 16, "fleet.routing": "round_robin"}),
    ("4 workers, shared, 2 slots (polling)", {"quotas.llm.concurrency": 2}),
]


def main() -> None:
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print()
    print("| case | tasks | min s | median s | fleet_utilization |")
    print("|---|---|---|---|---|")
    for label, overrides in CASES:
        samples = []
        for _ in range(ROUNDS):
            start = time.perf_counter()
            result = simulate(FLEET, overrides=overrides)
            samples.append(time.perf_counter() - start)
        utilization = result.summary.get("fleet_utilization", float("nan"))
        tasks = result.summary["tasks_submitted"]
        low, mid = min(samples), statistics.median(samples)
        print(f"| {label} | {tasks} | {low:.3f} | {mid:.3f} | {utilization:.3f} |")
    print()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
