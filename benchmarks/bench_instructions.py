"""Instructions executed by ``simulate()`` on the shipped scenarios: two trees compared under cachegrind.

CPU time on a shared 2-core machine moves by 10-30% between rounds, so a change worth 1-2% cannot be
seen in it. The count of instructions executed is deterministic (with ``PYTHONHASHSEED=0``, identical
trees differ by a few million of ~7.5 billion) and moves with any change in the Python work. It is
not time -- a cache miss costs more than an add -- so use it next to ``bench_baseline.py``'s CPU
times, not instead of them.

Each side runs in a fresh process under ``valgrind --tool=cachegrind --cache-sim=no`` (~50x slower:
about one minute per side), with ``PYTHONPATH`` at its own tree: import ``aiqsim.sim`` and
``simulate(path, seed=0)`` once on every ``scenarios/*.toml`` of the current tree that the baseline
shipped too (as ``bench_baseline.py`` does: a newer scenario may use keys the baseline cannot parse;
those left out are named). A third run that
only imports gives the part both sides share, so the difference is also stated as a share of the
``simulate()`` part. A tree's ``.pyc`` files are written by an untimed import first (compiling them
would count).

Run: ``python benchmarks/bench_instructions.py [--ref REF]`` (``REF`` defaults to ``HEAD``; the other
side is the working tree). Needs ``valgrind`` on the PATH.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench_baseline import export, shared_scenarios  # sibling scripts: run this file as a script
from cachegrind import cachegrind_command, read_counts

REPO = Path(__file__).resolve().parent.parent

SIMULATE_ALL = (
    "import sys\nfrom aiqsim.sim import simulate\nfor path in sys.argv[1:]:\n    simulate(path, seed=0)\n"
)
IMPORT_ONLY = "from aiqsim.sim import simulate\n"


def instructions(tree: Path, program: str, scenarios: Sequence[str] = ()) -> int:
    """Instructions ``program`` (given the ``scenarios`` paths as arguments) executes with ``tree``
    first on ``PYTHONPATH`` (cachegrind's ``I refs``)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    subprocess.run([sys.executable, "-c", IMPORT_ONLY], env=env, check=True, cwd=tempfile.gettempdir())
    done = subprocess.run(
        [*cachegrind_command(), sys.executable, "-c", program, *scenarios],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=tempfile.gettempdir(),
    )
    return read_counts(done.stderr)["instructions"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", default="HEAD", help="the commit to compare the working tree with")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed")
    with tempfile.TemporaryDirectory(prefix="aiqsim-instructions-") as folder:
        baseline = Path(folder)
        export(args.ref, baseline)
        scenarios, skipped = shared_scenarios(REPO / "scenarios", baseline / "scenarios")
        if skipped:
            print(f"not in {args.ref}, left out: {', '.join(skipped)}")
        shared = instructions(baseline, IMPORT_ONLY)
        before = instructions(baseline, SIMULATE_ALL, scenarios)
        after = instructions(REPO, SIMULATE_ALL, scenarios)
    change = after - before
    print(f"import only: {shared / 1e6:,.0f}M instructions")
    print(f"{args.ref}: {before / 1e6:,.0f}M   working tree: {after / 1e6:,.0f}M")
    print(
        f"change: {change / 1e6:+,.0f}M ({change / before:+.2%} of the whole run, "
        f"{change / (before - shared):+.2%} of the simulate() part)"
    )


if __name__ == "__main__":
    main()
