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


PURE_HTTP_MODULES = ("profiles.py", "vendor_headers.py", "error_bodies.py", "status.py", "headers.py")
"""The provider profiles and the classifier that reads them: pure functions of (status, headers,
body, now), so the same rules serve HttpProvider, the SDK mappers and any other transport."""


@pytest.mark.parametrize("module", PURE_HTTP_MODULES)
def test_the_provider_profile_classifier_is_pure(module: str) -> None:
    tree = ast.parse((PACKAGE / "http" / module).read_text(encoding="utf-8"))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert not imported & {"httpx", "asyncio", "time", "datetime", "socket", "simpy", "numpy", "pandas"}
