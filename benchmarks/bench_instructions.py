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
those left out are named). A run on each tree that only imports gives that tree's import cost; the
rest is its ``simulate()`` part, and the two parts are compared. Each tree is compiled first
(``compileall``, :func:`compile_tree`): compiling inside a counted run would count.

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


def compile_tree(tree: Path) -> None:
    """Write the ``.pyc`` of every module of ``tree``'s ``aiqsim`` (``compileall``), so that no counted
    run compiles any of them.

    An untimed import does not do it where ``PYTHONDONTWRITEBYTECODE`` is set (it is, on this
    project's machines): a freshly exported baseline then compiled all of aiqsim inside each counted
    run (~800M instructions) while the working tree, compiled earlier, did not, and the import-only
    count, taken on the baseline, was subtracted from both sides: every change against a baseline
    looked far larger than it was (-22.7% of the simulate() part against f91afa3 instead of -2.0%).
    ``compileall`` writes them whatever that variable says."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(tree / "aiqsim")],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def instructions(tree: Path, program: str, scenarios: Sequence[str] = ()) -> int:
    """Instructions ``program`` (given the ``scenarios`` paths as arguments) executes with ``tree``
    first on ``PYTHONPATH`` (cachegrind's ``I refs``)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    compile_tree(tree)
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
        imports_before = instructions(baseline, IMPORT_ONLY)
        before = instructions(baseline, SIMULATE_ALL, scenarios)
        imports_after = instructions(REPO, IMPORT_ONLY)
        after = instructions(REPO, SIMULATE_ALL, scenarios)
    change = after - before
    part_before, part_after = before - imports_before, after - imports_after
    print(
        f"import only: {imports_before / 1e6:,.0f}M ({args.ref}), {imports_after / 1e6:,.0f}M (working tree)"
    )
    print(f"{args.ref}: {before / 1e6:,.0f}M   working tree: {after / 1e6:,.0f}M")
    print(
        f"simulate() part (the run minus its tree's import): {part_before / 1e6:,.0f}M -> "
        f"{part_after / 1e6:,.0f}M, {part_after / part_before - 1:+.2%} "
        f"({part_before / part_after:.2f}x fewer); whole run {change / before:+.2%}"
    )


if __name__ == "__main__":
    main()
