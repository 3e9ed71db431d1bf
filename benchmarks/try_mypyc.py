"""What compiling the scheduler with mypyc would buy on the M/M/c benchmark (issue #19's "bigger lever").

Not a build step of aiqsim: an experiment that a later session can repeat. It exports ``--ref``
(``HEAD`` by default) twice into a temporary folder; one copy stays pure Python, the other is compiled
with mypyc after the few changes mypyc needs and that the real code does not have:

- ``Scheduler`` is assembled from mixin classes (``scheduler/attempts.py``, ``claims.py``...); mypyc
  allows one non-trait base and needs every attribute a method reads declared on its class, so the
  copy merges the mixins' methods into ``Scheduler`` itself (each mixin module keeps its helpers);
- exception classes in compiled modules are made non-native (``mypyc_attr(native_class=False)``):
  mypyc cannot build a native class on two builtin bases such as ``ValueError`` and ``TypeError``;
- a construct mypyc 2.4 rejects (``reversed()`` over a tuple it types as ``Any``) is spelled
  differently;
- mypy's errors are ignored (``ignore_errors``): the expressions they concern are compiled as
  ``Any``. ``core/task.py`` stays interpreted (mypyc 2.4 generates C that does not compile for its
  ``IntEnum`` defaults).

Both copies then run ``aiqsim.validation.mmc.simulate_replication`` (the ``mmc_check``
configuration of ``bench_mmc_peers.py``: M/M/8, lambda 7, mu 1) in fresh processes, rounds
alternating; it prints min / median CPU µs per customer and the load average, and with
``--instructions`` also the instructions per customer under cachegrind (the difference between
2,000 and 12,000 customers, divided by 10,000: the same on any load).

Needs ``pip install mypy`` (mypyc comes with it), gcc and the Python headers. Run:
``python benchmarks/try_mypyc.py [--ref REF] [--rounds 5] [--customers 100000] [--instructions]``.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_baseline import export  # a sibling script: run as python benchmarks/try_mypyc.py

MIXINS = {
    "recovery": "Recovery",
    "claims": "ClaimRules",
    "depth_limit": "DepthLimit",
    "lanes": "LaneDispatch",
    "attempts": "AttemptLoop",
    "outcomes": "Outcomes",
}
COMPILED = [
    "scheduler/scheduler.py",
    *(f"scheduler/{module}.py" for module in MIXINS),
    "scheduler/lane_pump.py",
    "scheduler/dispatch.py",
    "scheduler/store_writes.py",
    "scheduler/live.py",
    "scheduler/handles.py",
    "scheduler/rate_limit_scope.py",
    "core/states.py",
    "core/token_bucket.py",
    "core/usage.py",
    "stores/memory.py",
]

WORKER = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from aiqsim.validation.mmc import simulate_replication
import aiqsim.scheduler.scheduler as compiled_or_not
customers = int(sys.argv[2])
started = time.process_time()
replication = simulate_replication(7.0, 1.0, 8, customers, 0)
cpu = time.process_time() - started
waits = [r.started_at - r.created_at for r in replication.records][customers // 10:]
print(json.dumps({"us": cpu / customers * 1e6, "mean_wait": sum(waits) / len(waits),
                  "compiled": compiled_or_not.__file__.endswith(".so")}))
"""


def _is_slots(node: ast.stmt) -> bool:
    return isinstance(node, ast.Assign) and any(
        isinstance(target, ast.Name) and target.id == "__slots__" for target in node.targets
    )


def merge_mixins(package: Path) -> None:
    """Move every mixin's methods into ``Scheduler`` and leave ``Name = object`` behind."""
    scheduler_path = package / "scheduler" / "scheduler.py"
    source = scheduler_path.read_text()
    methods: list[str] = []
    imports: list[str] = []
    for module, mixin in MIXINS.items():
        path = package / "scheduler" / f"{module}.py"
        text = path.read_text()
        tree = ast.parse(text)
        lines = text.split("\n")
        names: list[str] = []
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == mixin:
                # no docstring, and not the mixin's ``__slots__ = ()`` (the merged Scheduler keeps its own)
                body = [n for n in node.body if not isinstance(n, ast.Expr) and not _is_slots(n)]
                first = body[0]
                start = min([first.lineno, *(d.lineno for d in getattr(first, "decorator_list", []))])
                methods.append("\n".join(lines[start - 1 : node.end_lineno]))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.append(node.name)
            elif isinstance(node, ast.Assign):
                names += [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.append(node.target.id)
            elif isinstance(node, ast.Import | ast.ImportFrom | ast.If) and not (
                isinstance(node, ast.ImportFrom) and node.module == "__future__"
            ):
                imports.append(ast.get_source_segment(text, node) or "")
        if names:
            imports.append(f"from aiqsim.scheduler.{module} import {', '.join(names)}")
        for node in tree.body:  # the mixin itself becomes a plain alias
            if isinstance(node, ast.ClassDef) and node.name == mixin:
                start = node.lineno - 1 - len(node.decorator_list)
                lines = [*lines[:start], f"{mixin} = object", *lines[node.end_lineno :]]
        path.write_text("\n".join(lines))
        source = re.sub(rf"^from aiqsim\.scheduler\.{module} import {mixin}\n", "", source, flags=re.M)
    source = re.sub(r"^class Scheduler\([^)]*\):", "class Scheduler:", source, flags=re.M)
    future = source.index("\n", source.index("from __future__ import annotations")) + 1
    source = source[:future] + "\n".join(imports) + "\n" + source[future:]
    end = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Scheduler")
    lines = source.split("\n")
    lines = [*lines[: end.end_lineno], "", "\n".join(methods), *lines[end.end_lineno :]]
    scheduler_path.write_text("\n".join(lines))


def adapt_for_mypyc(package: Path) -> None:
    """Non-native exception classes, and the construct mypyc 2.4 rejects."""
    for relative in COMPILED:
        path = package / relative
        out: list[str] = []
        for line in path.read_text().split("\n"):
            match = re.match(r"^class \w+\((.*)\):", line)
            if match and re.search(r"Error|Exception|Deadlock", match.group(1)):
                out.append('@__import__("mypy_extensions").mypyc_attr(native_class=False)')
            out.append(line)
        text = "\n".join(out)
        text = text.replace(
            "for gate in reversed(self._early_gates):", "for gate in list(self._early_gates)[::-1]:"
        )
        path.write_text(text)


def build(ref: str, folder: Path) -> tuple[Path, Path]:
    pure, compiled = folder / "pure", folder / "mypyc"
    pure.mkdir()
    compiled.mkdir()
    export(ref, pure)
    export(ref, compiled)
    package = compiled / "aiqsim"
    merge_mixins(package)
    adapt_for_mypyc(package)
    (compiled / "mypy.ini").write_text(
        "[mypy]\nignore_missing_imports = True\n[mypy-aiqsim.*]\nignore_errors = True\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "mypyc", *(f"aiqsim/{m}" for m in COMPILED)],
        cwd=compiled,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0 or not list((package / "scheduler").glob("scheduler.*.so")):
        raise SystemExit(f"mypyc failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return pure, compiled


def run(tree: Path, customers: int, script: Path, *, instructions: bool = False) -> dict[str, float]:
    command = [sys.executable, str(script), str(tree), str(customers)]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    if instructions:
        from cachegrind import cachegrind_command  # a sibling script

        command = [*cachegrind_command(), *command]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tempfile.gettempdir(), env=env)
    if done.returncode != 0:
        raise SystemExit(f"{tree.name} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if instructions:
        from cachegrind import read_counts

        result["instructions"] = float(read_counts(done.stderr)["instructions"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", default="HEAD")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--customers", type=int, default=100_000)
    parser.add_argument("--instructions", action="store_true", help="also count instructions (cachegrind)")
    args = parser.parse_args()
    if importlib.util.find_spec("mypyc") is None:
        raise SystemExit("mypyc is not installed: pip install mypy")
    folder = Path(tempfile.mkdtemp(prefix="aiqsim-mypyc-"))
    try:
        pure, compiled = build(args.ref, folder)
        script = folder / "worker.py"
        script.write_text(WORKER)
        load_before = os.getloadavg()[0]
        rounds: dict[str, list[dict[str, float]]] = {"pure": [], "mypyc": []}
        for index in range(args.rounds):
            for name, tree in (("pure", pure), ("mypyc", compiled)):
                rounds[name].append(run(tree, args.customers, script))
                print(f"  round {index} {name}: {rounds[name][-1]}", file=sys.stderr)
        load_after = os.getloadavg()[0]
        assert rounds["mypyc"][0]["compiled"] and not rounds["pure"][0]["compiled"]
        print(
            f"M/M/8 (mmc_check configuration), {args.customers:,} customers, seed 0, {args.rounds} rounds "
            f"alternating, fresh processes, tree {args.ref}; load average {load_before:.2f} -> "
            f"{load_after:.2f}.\n"
        )
        print("| build | µs CPU / customer min | median | mean wait |")
        print("|---|---:|---:|---:|")
        for name, runs in rounds.items():
            cpu = [r["us"] for r in runs]
            print(f"| {name} | {min(cpu):.1f} | {statistics.median(cpu):.1f} | {runs[0]['mean_wait']!r} |")
        ratio = statistics.median(r["us"] for r in rounds["pure"]) / statistics.median(
            r["us"] for r in rounds["mypyc"]
        )
        print(f"\nmypyc speed-up (medians): {ratio:.2f}x")
        if args.instructions:
            per_customer = {}
            for name, tree in (("pure", pure), ("mypyc", compiled)):
                small, large = (run(tree, n, script, instructions=True) for n in (2_000, 12_000))
                per_customer[name] = (large["instructions"] - small["instructions"]) / 10_000
            print(
                f"instructions per customer: pure {per_customer['pure'] / 1e3:.1f}k, mypyc "
                f"{per_customer['mypyc'] / 1e3:.1f}k ({per_customer['pure'] / per_customer['mypyc']:.2f}x)"
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
