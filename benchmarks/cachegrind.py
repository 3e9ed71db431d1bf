"""Counting a benchmark's work under valgrind's cachegrind: the one command line and the one reader.

Counts, not time: the same run gives the same counts on any machine with the same Python build,
whatever its load. Without address-space randomisation (``setarch -R``, when present) hash tables
of objects hashed by address probe alike from run to run; otherwise the counts spread by ~1%.
"""

from __future__ import annotations

import re
import shutil

COUNTS = {
    "instructions": re.compile(r"I\s+refs:\s+([\d,]+)"),
    "I1 misses": re.compile(r"I1\s+misses:\s+([\d,]+)"),
    "D1 misses": re.compile(r"D1\s+misses:\s+([\d,]+)"),
    "mispredicted branches": re.compile(r"Mispredicts:\s+([\d,]+)"),
}
"""What cachegrind's summary says, by name (all but ``instructions`` need ``simulate_caches``)."""


ONE_THREAD = ("OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1", "MKL_NUM_THREADS=1")
"""NumPy's BLAS starts a pool of threads at import that spin while they wait for work: their
instructions are counted too, by however long they spun (seen: 2,164M to 2,294M for one run of
2,000 M/M/c customers, 6%). With one thread there is no pool: the same run gave the same count
to within 2,000 instructions three times."""


def cachegrind_command(*, simulate_caches: bool = False) -> list[str]:
    """The words to put before a command to run it under cachegrind (the summary goes to stderr)."""
    no_aslr = ["setarch", "-R"] if shutil.which("setarch") else []
    simulation = ["--cache-sim=yes", "--branch-sim=yes"] if simulate_caches else ["--cache-sim=no"]
    return [
        "env",
        *ONE_THREAD,
        *no_aslr,
        "valgrind",
        "--tool=cachegrind",
        *simulation,
        "--cachegrind-out-file=/dev/null",
    ]


def read_counts(stderr: str, names: tuple[str, ...] = ("instructions",)) -> dict[str, int]:
    """The counts ``names`` from cachegrind's summary in ``stderr``; ``RuntimeError`` if one is missing."""
    counts = {}
    for name in names:
        found = COUNTS[name].search(stderr)
        if found is None:
            raise RuntimeError(f"cachegrind printed no {name!r}:\n{stderr[-2000:]}")
        counts[name] = int(found.group(1).replace(",", ""))
    return counts
