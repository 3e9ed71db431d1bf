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


# ------------------------------------------------------------------ rooms: private names, import cycles
#
# A room is a top-level part of the package (``aiqsim/core``, ``aiqsim/scheduler``, ``aiqsim/cli.py``...).
# Rooms meet through public seams: no module imports a private (``_underscore``) name, or a private
# module, of another room. And no module imports, even lazily inside a function, one that imports it
# back, directly or through others (the scheduler imported jobs, which imported the scheduler): a
# cycle hides which of two modules builds on the other. Imports under ``if TYPE_CHECKING:`` never
# run (annotations only) and are left out.


def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _room(module: str) -> str:
    """``aiqsim.scheduler.jobs`` -> ``scheduler``; ``aiqsim.cli`` -> ``cli``; ``aiqsim`` -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _run_time_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that may run: at module level or inside a function, not under
    ``if TYPE_CHECKING:`` (its ``else`` branch does run)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for alternative in child.orelse:
                    visit_node(alternative)
            else:
                visit_node(child)

    def visit_node(node: ast.AST) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If) and _is_type_checking(node):
            for alternative in node.orelse:
                visit_node(alternative)
        else:
            visit(node)

    visit(tree)
    return found


def _package_modules(root: pathlib.Path) -> dict[str, pathlib.Path]:
    return {_module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def _imported(
    module: str, path: pathlib.Path, node: ast.Import | ast.ImportFrom
) -> list[tuple[str, str | None]]:
    """``(module imported, name taken from it or None)`` for one import statement of ``module``."""
    if isinstance(node, ast.Import):
        return [(alias.name, None) for alias in node.names]
    if node.level:
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    return [(source, alias.name) for alias in node.names]


def _private_imports(root: pathlib.Path) -> list[str]:
    problems = []
    for module, path in _package_modules(root).items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for source, name in _imported(module, path, node):
                if source.split(".")[0] != root.name or _room(source) == _room(module):
                    continue
                private_module = any(_private(part) for part in source.split("."))
                if private_module or (name is not None and _private(name)):
                    shown = f"{source}.{name}" if name is not None else source
                    problems.append(f"{path}:{node.lineno}: {module} imports {shown} from another room")
    return problems


def _import_graph(root: pathlib.Path) -> dict[str, set[str]]:
    """Module -> the package modules it imports at run time (a ``from package import module``
    counts as importing that submodule, a ``from package import name`` as importing the package)."""
    modules = _package_modules(root)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges: set[str] = set()
        for node in _run_time_imports(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            for source, name in _imported(module, path, node):
                if name is not None and f"{source}.{name}" in modules:
                    edges.add(f"{source}.{name}")
                elif source in modules:
                    edges.add(source)
        edges.discard(module)
        graph[module] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_another_rooms_private_name() -> None:
    assert _private_imports(PACKAGE) == []


def test_the_import_graph_has_no_cycle() -> None:
    graph = _import_graph(PACKAGE)
    assert "aiqsim.scheduler.jobs" in graph and "aiqsim.scheduler.scheduler" in graph
    assert _cycles(graph) == []


def test_the_room_checks_catch_what_they_claim(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "pkg"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    for init in (root / "__init__.py", root / "a" / "__init__.py", root / "b" / "__init__.py"):
        init.write_text("", encoding="utf-8")
    (root / "a" / "one.py").write_text(
        "from typing import TYPE_CHECKING\nfrom pkg.b.two import _hidden\nif TYPE_CHECKING:\n"
        "    from pkg.b.three import Three\n\ndef later():\n    from pkg.a import two\n",
        encoding="utf-8",
    )
    (root / "a" / "two.py").write_text(
        "from . import one\nfrom pkg.a.one import _same_room\n", encoding="utf-8"
    )
    (root / "b" / "two.py").write_text("import pkg.a._secret\n_hidden = 1\n", encoding="utf-8")
    (root / "b" / "three.py").write_text("from pkg.a.one import later\nclass Three: ...\n", encoding="utf-8")
    problems = _private_imports(root)
    assert len(problems) == 2 and "pkg.b.two._hidden" in problems[0] and "pkg.a._secret" in problems[1]
    # a.one <-> a.two is a cycle (a lazy import counts); b.three -> a.one closes none, since a.one
    # imports b.three only under TYPE_CHECKING
    assert _cycles(_import_graph(root)) == [["pkg.a.one", "pkg.a.two"]]


def test_jobs_use_the_scheduler_only_through_its_public_api_and_the_job_host() -> None:
    """Jobs read ``scheduler._cost_estimate``, ``scheduler._held_by_gates`` and a dozen more of its
    private attributes; they now go through :class:`~aiqsim.scheduler.job_host.JobHost`."""
    path = PACKAGE / "scheduler" / "jobs.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        owner = node.value
        named = (
            owner.id
            if isinstance(owner, ast.Name)
            else owner.attr
            if isinstance(owner, ast.Attribute)
            else ""
        )
        if named == "scheduler":
            found.append(f"{path}:{node.lineno}: scheduler.{node.attr}")
    assert found == []


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


# ------------------------------------------------------------------ routes across deployments
ROUTING_RULES_MAY_IMPORT = {"aiqsim.core"}
"""The routing policies (aiqsim/core/routing.py) are pure functions of a frozen snapshot: they
import nothing above core (no lane, no runtime), and nothing heavy."""


def test_the_routing_rules_are_pure_and_read_only_their_snapshot() -> None:
    problems = []
    for line, module, _ in _imports(PACKAGE / "core" / "routing.py"):
        top = module.split(".")[0]
        if top == "aiqsim" and ".".join(module.split(".")[:2]) not in ROUTING_RULES_MAY_IMPORT:
            problems.append(f"routing.py:{line}: imports {module}")
        if top in HEAVY | FORBIDDEN_MODULES:
            problems.append(f"routing.py:{line}: imports {top}")
    assert problems == []
    # the scheduler's route table reads lanes only through their public fields, and no heavy library
    heavy = [m for _, m, _ in _imports(PACKAGE / "scheduler" / "routes.py") if m.split(".")[0] in HEAVY]
    assert heavy == []
