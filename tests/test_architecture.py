"""The one rule of the architecture, enforced: scheduling code never reads a real clock,
never imports an event loop and never uses the global ``random``.

Scheduler code talks only to the runtime protocol; if it imported asyncio or time, or
called ``random.random()``, it would silently break virtual time or reproducibility.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "aiqsim"

# Packages whose code must run unchanged on the SimPy virtual clock.
PURE_PACKAGES = ["core", "scheduler", "stores", "sim", "overload", "validation", "fleet"]
FORBIDDEN_MODULES = {"asyncio", "time", "datetime", "simpy", "threading", "trio", "anyio"}
# The simulation lab may import simpy (it builds the environment); nothing else may.
ALLOWED = {("sim", "simpy"), ("validation", "simpy")}
GLOBAL_RANDOM_FUNCTIONS = {
    "random",
    "uniform",
    "randint",
    "randrange",
    "choice",
    "choices",
    "shuffle",
    "sample",
    "gauss",
    "expovariate",
    "lognormvariate",
    "normalvariate",
    "seed",
    "getrandbits",
    "triangular",
}


def _python_files(subpackage: str) -> list[pathlib.Path]:
    root = PACKAGE / subpackage
    return sorted(root.rglob("*.py")) if root.exists() else []


def _violations(path: pathlib.Path, subpackage: str) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module.split(".")[0]]
            if modules[0] == "random" and any(a.name in GLOBAL_RANDOM_FUNCTIONS for a in node.names):
                found.append(f"{path}:{node.lineno}: imports a global random function")
        for module in modules:
            if module in FORBIDDEN_MODULES and (subpackage, module) not in ALLOWED:
                found.append(f"{path}:{node.lineno}: imports {module}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "random"
            and node.func.attr in GLOBAL_RANDOM_FUNCTIONS
        ):
            found.append(f"{path}:{node.lineno}: calls the global random.{node.func.attr}()")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Attribute)
            and isinstance(node.func.value.value, ast.Name)
            and node.func.value.value.id in {"np", "numpy"}
            and node.func.value.attr == "random"
            and node.func.attr not in {"default_rng", "Generator", "PCG64", "SeedSequence"}
        ):
            found.append(f"{path}:{node.lineno}: calls the global numpy.random.{node.func.attr}()")
    return found


@pytest.mark.parametrize("subpackage", PURE_PACKAGES)
def test_scheduling_code_has_no_clock_loop_or_global_random(subpackage: str) -> None:
    problems = [v for path in _python_files(subpackage) for v in _violations(path, subpackage)]
    assert problems == []


def test_the_checker_catches_what_it_claims(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import asyncio\nimport time as t\nfrom random import choice\nimport random\n"
        "import numpy as np\nx = random.random()\ny = np.random.rand()\n",
        encoding="utf-8",
    )
    problems = _violations(bad, "scheduler")
    assert len(problems) == 5, problems


def test_scheduler_package_is_checked() -> None:
    files = _python_files("scheduler")
    assert any(p.name == "scheduler.py" for p in files)


def test_the_call_log_writer_stays_light() -> None:
    """The call log is written on the production scheduler's path: no pandas (or numpy) there, and
    pyarrow only inside the function that writes Parquet when asked for (rooms.md: call log)."""
    path = PACKAGE / "scheduler" / "call_log.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top_level = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top_level |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            top_level.add(node.module.split(".")[0])
    anywhere = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert not {"pandas", "numpy"} & anywhere
    assert "pyarrow" not in top_level


# ---------------------------------------------------------------------------- the observability room
OBSERVABILITY_MAY_IMPORT = {"aiqsim.core", "aiqsim.scheduler", "aiqsim.observability"}
"""aiqsim.observability sits beside fleet/ and overload/: it reads the scheduler's public records and
nothing above it (the lab feeds it through simulate(sinks=...), never the other way round)."""
OBSERVABILITY_THIRD_PARTY = {"prometheus_client", "opentelemetry"}
BELOW_OBSERVABILITY = ["core", "runtime", "stores", "scheduler", "fleet", "overload"]
HEAVY = {"simpy", "numpy", "pandas", "matplotlib", "ipywidgets"}


def _imports(path: pathlib.Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names imported from it) for every absolute import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module, [alias.name for alias in node.names]))
    return found


def _observability_problems(path: pathlib.Path) -> list[str]:
    problems = []
    for line, module, names in _imports(path):
        top = module.split(".")[0]
        where = f"{path.name}:{line}"
        if top == "aiqsim":
            room = ".".join(module.split(".")[:2])
            if room not in OBSERVABILITY_MAY_IMPORT:
                problems.append(f"{where}: imports {module} (above the observability room)")
            private = [part for part in [*module.split("."), *names] if part.startswith("_")]
            if private:
                problems.append(f"{where}: imports a private name from {module}")
        elif top in HEAVY:
            problems.append(f"{where}: imports {top} (a production worker must not need it)")
    return problems


def test_observability_reads_only_public_scheduler_records() -> None:
    files = _python_files("observability")
    assert any(p.name == "prometheus.py" for p in files)
    assert [problem for path in files for problem in _observability_problems(path)] == []


def test_the_observability_checker_catches_what_it_claims(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import numpy\nfrom aiqsim.sim.metrics import summarize\n"
        "from aiqsim.scheduler.scheduler import _private\nfrom aiqsim.scheduler._lanes import x\n"
        "from aiqsim.scheduler.events import QuotaSample\n",
        encoding="utf-8",
    )
    assert len(_observability_problems(bad)) == 4, _observability_problems(bad)


@pytest.mark.parametrize("subpackage", BELOW_OBSERVABILITY)
def test_nothing_below_the_observability_room_imports_it(subpackage: str) -> None:
    found = [
        f"{path}:{line}"
        for path in _python_files(subpackage)
        for line, module, _ in _imports(path)
        if module.split(".")[:2] == ["aiqsim", "observability"]
    ]
    assert found == []


def test_the_optional_libraries_load_only_with_a_sink_that_needs_them() -> None:
    """``import aiqsim.observability`` (and the lab, which imports it) needs neither extra."""
    for path in _python_files("observability"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top_level = {
            (node.module if isinstance(node, ast.ImportFrom) else node.names[0].name).split(".")[0]
            for node in tree.body
            if isinstance(node, ast.Import | ast.ImportFrom) and getattr(node, "level", 0) == 0
        }
        assert not top_level & OBSERVABILITY_THIRD_PARTY, path
