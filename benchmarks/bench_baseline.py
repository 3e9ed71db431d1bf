"""``simulate()`` on every shipped scenario: this tree against a baseline commit, in the same run.

The baseline (``--ref``, by default the commit the speed work started from) is exported with
``git archive`` into a temporary folder, and each side runs in a FRESH process with ``PYTHONPATH``
pointing at its own tree (both import the same installed third-party packages). Rounds alternate
baseline / current, so a change in the machine's load hits both sides alike. Each worker first runs
every scenario once untimed (lazy imports, first-call caches), then times each scenario's
``simulate(path, seed=0)`` with ``time.process_time()`` (CPU time: far steadier than wall time on a
loaded shared machine), ``--repeat`` times in a row, and keeps the least (see :func:`worker`). Both
sides run the scenario files of the *current* tree, those the baseline shipped too (a newer scenario
may use keys the baseline cannot parse; the ones left out are named).

Prints one markdown table: per scenario min / median CPU ms on each side and the ratio of medians,
plus the total over all scenarios (with the ratio of the minima too), each round's own ratio of the
totals (min / median / max: the spread of the machine's noise), and the load average before and after.

Run: ``python benchmarks/bench_baseline.py [--ref REF] [--rounds 5] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_REF = "8cf6c81"  # main when the speed work started


def worker(repeat: int, scenarios: list[str]) -> None:
    """Time ``simulate`` on each scenario in this process; print {scenario: cpu_s} as JSON.

    Each scenario runs ``repeat`` times in a row and its figure is the least of them: on a shared
    machine a run is only ever slowed down (another process evicting the caches, a stolen core), so
    the least of a few back-to-back runs is the figure least disturbed (as ``timeit`` does)."""
    from aiqsim.sim import simulate

    for path in scenarios:  # warm-up: imports and caches, not measured
        simulate(path, seed=0)
    timings = {}
    for path in scenarios:
        runs = []
        for _ in range(repeat):
            started = time.process_time()
            simulate(path, seed=0)
            runs.append(time.process_time() - started)
        timings[Path(path).stem] = min(runs)
    print(json.dumps(timings))


def run_side(tree: Path, scenarios: list[str], repeat: int) -> dict[str, float]:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, bench_baseline; bench_baseline.worker(int(sys.argv[1]), sys.argv[2:])",
            str(repeat),
            *scenarios,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{Path(__file__).resolve().parent}"},
        check=False,
        cwd=tempfile.gettempdir(),
    )
    if done.returncode != 0:
        raise RuntimeError(f"worker on {tree} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def shared_scenarios(current: Path, baseline: Path) -> tuple[list[str], list[str]]:
    """The scenario files of ``current`` that ``baseline`` shipped too (paths), and the others (names).

    Only those are timed: a newer scenario may use keys the baseline's parser refuses.
    """
    shipped = sorted(current.glob("*.toml"))
    both = [str(path) for path in shipped if (baseline / path.name).exists()]
    return both, [path.stem for path in shipped if str(path) not in both]


def export(ref: str, into: Path) -> None:
    """The tree of commit ``ref`` written into the folder ``into`` (``git archive``), to import from.

    The other benchmarks that measure an earlier commit side by side export it with this too."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", default=DEFAULT_REF, help="the baseline commit (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of each scenario per round; the least counts (default 3)"
    )
    args = parser.parse_args()
    if args.rounds < 1 or args.repeat < 1:
        parser.error("--rounds and --repeat must be at least 1")
    with tempfile.TemporaryDirectory(prefix="aiqsim-baseline-") as folder:
        trees = {"baseline": Path(folder) / "baseline", "current": REPO}
        trees["baseline"].mkdir()
        export(args.ref, trees["baseline"])
        scenarios, skipped = shared_scenarios(REPO / "scenarios", trees["baseline"] / "scenarios")
        if skipped:
            print(f"  not in {args.ref}, left out: {', '.join(skipped)}", file=sys.stderr)
        sides: dict[str, list[dict[str, float]]] = {side: [] for side in trees}
        load_before = os.getloadavg()
        for round_ in range(args.rounds):
            order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
            for side in order:
                sides[side].append(run_side(trees[side], scenarios, args.repeat))
                print(f"  round {round_} {side}: {sum(sides[side][-1].values()):.3f} s", file=sys.stderr)
        load_after = os.getloadavg()
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    print(
        f"simulate(scenario, seed=0), CPU ms (time.process_time), {args.rounds} rounds alternating, "
        f"each side in a fresh process, each round the least of {args.repeat} runs per scenario. "
        f"Baseline {args.ref}, current {head}"
        f"{' (+ uncommitted changes)' if dirty else ''}. Load "
        f"average before {load_before[0]:.2f}, after {load_after[0]:.2f}.\n"
    )
    others = [side for side in sides if side != "baseline"]
    print(
        "| scenario | baseline min / median ms | "
        + " | ".join(f"{side} min / median ms | {side} speed-up (medians)" for side in others)
        + " |"
    )
    print("|---|---:|" + "---:|---:|" * len(others))
    names = list(sides["baseline"][0])
    for name in [*names, "total"]:

        def values(side: str, name: str = name) -> list[float]:
            if name == "total":
                return [sum(run.values()) * 1e3 for run in sides[side]]
            return [run[name] * 1e3 for run in sides[side]]

        base = values("baseline")
        cells = []
        for side in others:
            now = values(side)
            ratio = statistics.median(base) / statistics.median(now)
            on_minima = f" ({min(base) / min(now):.2f}x on the minima)" if name == "total" else ""
            cells.append(f"{min(now):.0f} / {statistics.median(now):.0f} | {ratio:.2f}x{on_minima}")
        label = f"**{name}**" if name == "total" else name
        print(f"| {label} | {min(base):.0f} / {statistics.median(base):.0f} | " + " | ".join(cells) + " |")
    for side in others:
        paired = paired_ratios(sides["baseline"], sides[side])
        print(
            f"\nTotal speed-up of {side} round by round (the sides of a round ran back to back): "
            "min / median "
            f"/ max {min(paired):.2f}x / {statistics.median(paired):.2f}x / {max(paired):.2f}x over "
            f"{len(paired)} rounds: the spread is the machine's noise, which a ratio of medians hides."
        )


def paired_ratios(baseline: list[dict[str, float]], current: list[dict[str, float]]) -> list[float]:
    """Each round's baseline total over its current total: the ratio of two runs made minutes apart,
    so a slow spell of the machine hits both (a ratio of the sides' medians pairs runs of different
    rounds)."""
    return [sum(base.values()) / sum(now.values()) for base, now in zip(baseline, current, strict=True)]


if __name__ == "__main__":
    main()
