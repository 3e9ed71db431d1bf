"""What a class call costs against a generated builder, and a task id's two formattings.

CPython 3.11 does not specialise calling a class: ``Reservation(requests=..., tokens=..., slots=...)``
packs its arguments into a tuple and a dict before ``__init__`` runs, where the builder
:func:`aiqsim.core.slot_init.compile_builder` makes is called like any function. Task ids are
formatted by :func:`aiqsim.core.task.random_id` (the same string as ``f"{bits:016x}"``).

Each case runs ``--number`` times per repeat, ``--repeats`` repeats in this process (timeit, which
turns the collector off); prints ns per call min / median, the ratio of the medians, and the load
average before and after. Run: ``python benchmarks/bench_builders.py``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import timeit

from aiqsim.core.slot_init import compile_builder
from aiqsim.core.task import random_id
from aiqsim.core.token_bucket import Reservation

PAIRS = (
    (
        "Reservation, keyword arguments",
        "Reservation(requests=1.0, tokens=0.0, slots=1)",
        "new_reservation(requests=1.0, tokens=0.0, slots=1)",
    ),
    ("a task id from the rng", 'f"{rng.getrandbits(64):016x}"', "random_id(rng)"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--number", type=int, default=200_000)
    args = parser.parse_args()
    names = {
        "Reservation": Reservation,
        "new_reservation": compile_builder(Reservation),
        "rng": random.Random(19),
        "random_id": random_id,
    }
    before = os.getloadavg()[0]
    rows = []
    for what, old, new in PAIRS:
        times = {}
        for stmt in (old, new):
            runs = timeit.repeat(stmt, globals=names, number=args.number, repeat=args.repeats)
            times[stmt] = [run / args.number * 1e9 for run in runs]
        rows.append((what, old, new, times))
    after = os.getloadavg()[0]
    print(f"{args.repeats} repeats of {args.number:,} calls, ns per call; load {before:.2f} -> {after:.2f}\n")
    print("| what | before: min / median | builder or random_id: min / median | speed-up (medians) |")
    print("|---|---:|---:|---:|")
    for what, old, new, times in rows:
        old_median, new_median = statistics.median(times[old]), statistics.median(times[new])
        print(
            f"| {what} | {min(times[old]):.0f} / {old_median:.0f} | {min(times[new]):.0f} / {new_median:.0f} "
            f"| {old_median / new_median:.2f}x |"
        )


if __name__ == "__main__":
    main()
