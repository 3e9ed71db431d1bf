"""Store-side throughput of group commit: SqliteStore writes per second, FULL sync.

Each task makes the three writes the scheduler makes for it (insert and claim, running,
succeeded with a result). ``per-write`` is the default store: every write its own transaction
and WAL fsync. ``group N`` is ``SqliteStore(group_commit=True)`` with ``flush()`` after every N
writes -- what a scheduler flushing one commit window of N transitions pays. Rounds rotate over
the modes so load bursts hit all of them alike; min and median over ``--rounds``.

This is the store's ceiling, not the scheduler's throughput: the scheduler adds its own work per
task and the window it chooses (measured on the scheduler side of #21).

Run: ``python benchmarks/bench_store_group_commit.py`` (~30 s). Prints markdown with the load
average, since the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from aiqsim.core.states import transition
from aiqsim.core.task import TaskRecord, TaskStatus
from aiqsim.stores import SqliteStore


def run(path: Path, tasks: int, group: int | None) -> float:
    """Writes per second for ``tasks`` tasks (three writes each) on a fresh store file."""
    store = SqliteStore(path, group_commit=group is not None)
    writes = 0
    start = time.perf_counter()
    for n in range(tasks):
        record = TaskRecord(
            id=f"t{n}", key=f"k{n}", kind="llm", provider="llm", payload={"prompt": "summarise " * 20}
        )
        store.insert_and_claim(record)
        running = transition(record, TaskStatus.RUNNING, 1.0)
        store.update(running)
        store.update(transition(running, TaskStatus.SUCCEEDED, 2.0, result={"text": "ok " * 30}))
        writes += 3
        if group is not None and writes % group < 3:
            store.flush()
    store.flush()
    elapsed = time.perf_counter() - start
    store.close()
    return writes / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--groups", type=int, nargs="*", default=[8, 64, 192])
    args = parser.parse_args()
    modes: list[int | None] = [None, *args.groups]
    samples: dict[int | None, list[float]] = {mode: [] for mode in modes}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as directory:
        for round_no in range(args.rounds):
            for mode in modes:
                path = Path(directory) / f"r{round_no}-{mode}.sqlite"
                samples[mode].append(run(path, args.tasks, mode))
    load_after = os.getloadavg()
    print(
        f"{args.tasks} tasks x 3 writes per run, synchronous=FULL, {args.rounds} rounds; load average "
        f"before {load_before[0]:.2f} / after {load_after[0]:.2f} (1 min), 2 cores\n"
    )
    base = statistics.median(samples[None])
    print("| mode | writes/s min | writes/s median | median vs per-write |")
    print("|---|---:|---:|---:|")
    for mode, values in samples.items():
        name = "per-write" if mode is None else f"group {mode}"
        median = statistics.median(values)
        print(f"| {name} | {min(values):,.0f} | {median:,.0f} | {median / base:.1f}x |")


if __name__ == "__main__":
    main()
