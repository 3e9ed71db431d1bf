"""The optional compiled build (``AIQSIM_COMPILE=1``, :mod:`aiqsim.compiled`) runs the same rules.

The suite as a whole runs the pure-Python path. This module builds the compiled path from the same
checkout (Cython, once per test session, shared by the xdist workers) and checks that:

- every module listed in ``COMPILED_MODULES`` really is an extension module in that build;
- it gives bit-for-bit the results of the pure build: every shipped scenario's summary and tables for
  two seeds, its streamed summary and timeline, and the M/M/c validation's waits;
- the scheduler's, runtime's, states', simulation's and streaming mode's own tests pass against it;
- a compiled module whose source was edited afterwards is refused on ``import aiqsim``;
- without ``AIQSIM_COMPILE`` the build compiles nothing.

The stale-module guard's rules are also tested on fake package folders, with no compiler at all.
"""

from __future__ import annotations

import fcntl
import importlib.machinery
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aiqsim.compiled import (
    COMPILED_MODULES,
    MANIFEST_NAME,
    build_compiled_tree,
    build_status,
    check_compiled_sources,
    clean_compiled,
    module_digest,
    source_digest,
)
from aiqsim.errors import AiqsimError, StaleCompiledModulesError

REPO = Path(__file__).resolve().parent.parent
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


# ------------------------------------------------------------------ the guard, on fake package folders


def _fake_package(root: Path, *, compiled: tuple[str, ...], manifest: dict[str, str] | None) -> Path:
    package = root / "aiqsim"
    for name in COMPILED_MODULES:
        source = package / Path(*name.split(".")[1:]).with_suffix(".py")
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(f"# {name}\n")
    for name in compiled:
        (package / Path(*name.split(".")[1:])).with_name(name.rsplit(".", 1)[1] + SUFFIX).write_bytes(b"\0")
    if manifest is not None:
        (package / MANIFEST_NAME).write_text(json.dumps(manifest))
    return package


def _digests(package: Path) -> dict[str, str]:
    return {
        name: source_digest(package / Path(*name.split(".")[1:]).with_suffix(".py"))
        for name in COMPILED_MODULES
    }


def test_a_pure_install_passes_the_guard(tmp_path: Path) -> None:
    package = _fake_package(tmp_path, compiled=(), manifest=None)
    status = check_compiled_sources(package)
    assert not status.is_compiled and status.stale == () and status.manifest is None
    assert "pure Python" in status.describe()


def test_a_fresh_compiled_build_passes_the_guard(tmp_path: Path) -> None:
    package = _fake_package(tmp_path, compiled=COMPILED_MODULES[:3], manifest=None)
    (package / MANIFEST_NAME).write_text(json.dumps(_digests(package)))
    status = check_compiled_sources(package)
    assert status.compiled == COMPILED_MODULES[:3] and status.stale == ()
    assert status.manifest == package / MANIFEST_NAME


def test_an_edited_source_of_a_compiled_module_is_refused_by_name(tmp_path: Path) -> None:
    package = _fake_package(tmp_path, compiled=COMPILED_MODULES, manifest=None)
    (package / MANIFEST_NAME).write_text(json.dumps(_digests(package)))
    edited = COMPILED_MODULES[4]
    path = package / Path(*edited.split(".")[1:]).with_suffix(".py")
    path.write_text(path.read_text() + "x = 1\n")
    with pytest.raises(StaleCompiledModulesError) as refused:
        check_compiled_sources(package)
    message = str(refused.value)
    assert edited in message and "1 compiled aiqsim module(s)" in message
    assert "AIQSIM_COMPILE=1 pip install" in message and "--clean" in message
    assert isinstance(refused.value, ImportError) and isinstance(refused.value, AiqsimError)
    # an edit to a module that is not compiled is none of the guard's business
    other = package / "cli.py"
    other.write_text("edited\n")
    assert build_status(package).stale == (edited,)


def test_compiled_modules_without_a_manifest_or_missing_from_it_are_stale(tmp_path: Path) -> None:
    package = _fake_package(tmp_path / "a", compiled=COMPILED_MODULES[:2], manifest=None)
    assert build_status(package).stale == COMPILED_MODULES[:2]
    package = _fake_package(tmp_path / "b", compiled=COMPILED_MODULES[:2], manifest=None)
    (package / MANIFEST_NAME).write_text("{not json")
    assert build_status(package).stale == COMPILED_MODULES[:2]
    package = _fake_package(tmp_path / "c", compiled=COMPILED_MODULES[:2], manifest=None)
    (package / MANIFEST_NAME).write_text(
        json.dumps({COMPILED_MODULES[0]: _digests(package)[COMPILED_MODULES[0]]})
    )
    assert build_status(package).stale == (COMPILED_MODULES[1],)


def test_an_edited_pxd_makes_its_compiled_module_stale(tmp_path: Path) -> None:
    """A ``.pxd`` (the compiled build's C layout of some classes) is part of what a build was made from."""
    package = _fake_package(tmp_path, compiled=COMPILED_MODULES, manifest=None)
    laid_out = COMPILED_MODULES[3]
    layout = (package / Path(*laid_out.split(".")[1:])).with_suffix(".pxd")
    layout.write_text("cdef class A:\n    cdef public object x\n")
    assert module_digest(package, laid_out) != _digests(package)[laid_out]  # the .py's alone
    (package / MANIFEST_NAME).write_text(
        json.dumps({name: module_digest(package, name) for name in COMPILED_MODULES})
    )
    assert build_status(package).stale == ()
    layout.write_text("cdef class A:\n    cdef public object x, y\n")
    assert build_status(package).stale == (laid_out,)
    layout.unlink()  # a layout removed since the build: stale too
    assert build_status(package).stale == (laid_out,)


def test_clean_removes_the_compiled_files_and_keeps_every_source(tmp_path: Path) -> None:
    package = _fake_package(tmp_path, compiled=COMPILED_MODULES, manifest={})
    sources = sorted(p.relative_to(package) for p in package.rglob("*.py"))
    removed = clean_compiled(package)
    assert len(removed) == len(COMPILED_MODULES) + 1
    assert sorted(p.relative_to(package) for p in package.rglob("*.py")) == sources
    assert not list(package.rglob(f"*{SUFFIX}")) and not (package / MANIFEST_NAME).exists()
    assert not build_status(package).is_compiled


def test_every_listed_module_exists_and_the_list_has_no_repeats() -> None:
    assert len(set(COMPILED_MODULES)) == len(COMPILED_MODULES)
    for name in COMPILED_MODULES:
        assert (REPO / Path(*name.split("."))).with_suffix(".py").is_file(), name


def test_this_checkout_runs_pure_python() -> None:
    """The suite tests the pure path: a compiled module left in the checkout would shadow its source."""
    status = build_status()
    assert not status.is_compiled, status.describe()


def test_without_the_switch_setup_py_compiles_nothing(tmp_path: Path) -> None:
    shutil.copytree(REPO / "aiqsim", tmp_path / "aiqsim", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "setup.py", tmp_path / "setup.py")
    env = {k: v for k, v in os.environ.items() if k != "AIQSIM_COMPILE"}
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert not list((tmp_path / "aiqsim").rglob(f"*{SUFFIX}"))
    assert not (tmp_path / "aiqsim" / MANIFEST_NAME).exists()


# ------------------------------------------------------------------ the real compiled build


BUILD_C_FLAGS = "-O1 -g0"


@pytest.fixture(scope="session")
def compiled_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout compiled once per test session, in a folder the xdist workers share (a lock
    lets one worker build while the other waits).

    Under xdist the base temp's parent is this session's own folder; without xdist (``-n 0``) it
    is the folder of every session, where an earlier session's build of older sources would be
    found and tested, so the tree goes under this session's base temp instead."""
    if shutil.which(os.environ.get("CC", "cc")) is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the compiled build cannot be made here")
    pytest.importorskip("Cython", reason="the compiled build needs Cython (the test extra installs it)")
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    tree = shared / "aiqsim-compiled"
    with open(shared / "aiqsim-compiled.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = tree / "built"
        if not done.exists():
            if tree.exists():
                shutil.rmtree(tree)
            # -O1 -g0: these tests check what the compiled code does, not how fast it runs, and
            # the C compiles take a third of the time of CPython's -O3 -g (46 s instead of 127 s
            # on 2 cores; the rules' tests below run as fast against either). The benchmarks
            # build at the default, as `pip install` does.
            build_compiled_tree(REPO, tree, c_flags=BUILD_C_FLAGS)
            done.write_text("ok\n")
    return tree


def _isolated_env(tree: Path | None) -> dict[str, str]:
    """An environment whose interpreters import aiqsim from ``tree`` (None: this checkout), and this
    checkout's ``tests`` helpers after it. ``PYTHONSAFEPATH`` keeps the working directory (this
    checkout, whose ``aiqsim`` is the pure one) off the front of ``sys.path``, in every subprocess."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree or REPO), str(REPO)])
    env["PYTHONSAFEPATH"] = "1"
    return env


def _python(tree: Path | None, code: str, *, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter that imports aiqsim from ``tree`` (None: this checkout)."""
    return subprocess.run(
        [sys.executable, "-c", code],
        env=_isolated_env(tree),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_every_listed_module_is_compiled_in_the_build(compiled_tree: Path) -> None:
    done = _python(
        compiled_tree,
        "import importlib, json, aiqsim.compiled as c\n"
        "print(json.dumps({n: importlib.import_module(n).__file__ for n in c.COMPILED_MODULES}))",
    )
    assert done.returncode == 0, done.stderr
    files = json.loads(done.stdout)
    for name, path in files.items():
        assert path.endswith(SUFFIX) and path.startswith(str(compiled_tree)), (name, path)
    # the classes a .pxd lays out are extension types in the build (their attributes C fields), and
    # plain classes in this checkout: a .pxd the build ignored would lose that without a word
    laid_out = sorted(
        (str(path.relative_to(REPO).with_suffix("")).replace(os.sep, "."), match[1])
        for path in (REPO / "aiqsim").rglob("*.pxd")
        for match in re.finditer(r"^cdef class (\w+)", path.read_text(), re.MULTILINE)
    )
    assert len(laid_out) >= 6, laid_out
    probe = (
        "import importlib, json, sys\n"
        f"names = {laid_out!r}\n"
        "heap = [getattr(importlib.import_module(m), c).__flags__ & (1 << 9) for m, c in names]\n"
        "print(json.dumps([bool(flag) for flag in heap]))"
    )
    heap_types = {tree: _python(tree, probe) for tree in (None, compiled_tree)}
    assert all(done.returncode == 0 for done in heap_types.values()), heap_types
    assert json.loads(heap_types[None].stdout) == [True] * len(laid_out)  # plain classes when pure
    assert json.loads(heap_types[compiled_tree].stdout) == [False] * len(laid_out)
    version = _python(compiled_tree, "from aiqsim.cli import main; main(['--version'])")
    assert f"compiled: {len(COMPILED_MODULES)} of {len(COMPILED_MODULES)} modules" in version.stdout


IMPORTED_FROM = "import aiqsim.scheduler.lanes as _m; print(_m.__file__)\n"

RESULTS_DIGEST = r"""
import hashlib, json, sys
from pathlib import Path
from aiqsim.sim import simulate
from aiqsim.validation.mmc import simulate_replication

digests = {}
for path in sorted(Path("scenarios").glob("*.toml")):
    for seed in (0, 1):
        result = simulate(path, seed=seed)
        parts = [json.dumps(result.summary, sort_keys=True, default=repr)]
        for table in ("tasks", "calls", "timeline", "jobs"):
            frame = getattr(result, table)
            parts.append(frame.to_csv(float_format=repr) if frame is not None else "-")
        digests[f"{path.stem}@{seed}"] = hashlib.sha256("\n".join(parts).encode()).hexdigest()
    # streaming mode (records="summary"): its summary and timeline, computed on the fly
    streamed = simulate(path, seed=0, records="summary")
    parts = [json.dumps(streamed.summary, sort_keys=True, default=repr)]
    timeline = streamed.timeline
    parts.append(timeline.to_csv(float_format=repr) if timeline is not None else "-")
    digests[f"{path.stem}@stream"] = hashlib.sha256("\n".join(parts).encode()).hexdigest()
for seed in (0, 1):
    records = simulate_replication(7.0, 1.0, 8, 3000, seed, attempt_timeout_s=60.0).records
    waits = [repr(r.started_at - r.created_at) for r in records]
    digests[f"mmc@{seed}"] = hashlib.sha256(",".join(waits).encode()).hexdigest()
print(json.dumps(digests))
"""


@pytest.mark.slow
def test_the_compiled_build_gives_the_pure_builds_results_to_the_last_bit(compiled_tree: Path) -> None:
    pure = _python(None, IMPORTED_FROM + RESULTS_DIGEST, timeout=600)
    compiled = _python(compiled_tree, IMPORTED_FROM + RESULTS_DIGEST, timeout=600)
    assert pure.returncode == 0, pure.stderr
    assert compiled.returncode == 0, compiled.stderr
    # each side really ran the build it stands for
    pure_origin, pure_out = pure.stdout.split("\n", 1)
    compiled_origin, compiled_out = compiled.stdout.split("\n", 1)
    assert pure_origin.endswith("lanes.py") and pure_origin.startswith(str(REPO)), pure_origin
    assert compiled_origin.endswith(SUFFIX), compiled_origin
    assert compiled_origin.startswith(str(compiled_tree)), compiled_origin
    pure_digests, compiled_digests = json.loads(pure_out), json.loads(compiled_out)
    assert len(pure_digests) >= 3 * 9 + 2
    differing = sorted(k for k in pure_digests if pure_digests[k] != compiled_digests.get(k))
    assert not differing, f"the compiled build's results differ from the pure build's on {differing}"


# the rules' own tests, run against the compiled build (each file imports aiqsim from PYTHONPATH)
RULE_TESTS = (
    "tests/test_states.py",
    "tests/test_token_bucket.py",
    "tests/test_backoff.py",
    "tests/test_failures.py",
    "tests/test_fingerprint.py",
    "tests/test_runtime.py",
    "tests/test_deadline_wheel.py",
    "tests/test_dispatch_queues.py",
    "tests/test_scheduler.py",
    "tests/test_scheduler_edges.py",
    "tests/test_scheduler_parity.py",
    "tests/test_handles.py",
    "tests/test_jobs.py",
    "tests/test_jobs_parity.py",
    "tests/test_crash_suite.py",
    "tests/test_validation.py",
    "tests/test_simulate.py",
    "tests/test_shipped_scenarios.py",
    "tests/test_streaming.py",
    "tests/test_streaming_jobs.py",
)


@pytest.mark.slow
def test_the_rules_own_tests_pass_against_the_compiled_build(compiled_tree: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "-o", "addopts=", *RULE_TESTS],
        env=_isolated_env(compiled_tree),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    tail = done.stdout[-4000:]
    assert done.returncode == 0, tail + done.stderr[-2000:]
    # the run imported the compiled build (tests/conftest.py's report header says which)
    listed = len(COMPILED_MODULES)
    expected = f"aiqsim under test: compiled build, {listed} of {listed} modules compiled"
    assert f"{expected} ({compiled_tree / 'aiqsim'})" in done.stdout, done.stdout[:3000]
    assert " passed" in tail and " failed" not in tail and " error" not in tail, tail


def test_an_edited_source_in_a_compiled_build_stops_import_aiqsim(
    compiled_tree: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "tree"
    shutil.copytree(compiled_tree / "aiqsim", copy / "aiqsim")
    source = copy / "aiqsim" / "scheduler" / "lanes.py"
    source.write_text(source.read_text() + "\n# an edit made after the build\n")
    done = _python(copy, "import aiqsim")
    assert done.returncode != 0
    assert "StaleCompiledModulesError" in done.stderr and "aiqsim.scheduler.lanes" in done.stderr
    # the by-path status and clean work without importing aiqsim, and clean leaves a pure package
    status = subprocess.run(
        [sys.executable, "-P", str(copy / "aiqsim" / "compiled.py")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert status.returncode == 1 and "stale: aiqsim.scheduler.lanes" in status.stdout
    cleaned = subprocess.run(
        [sys.executable, "-P", str(copy / "aiqsim" / "compiled.py"), "--clean"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert cleaned.returncode == 0, cleaned.stderr
    done = _python(copy, "import aiqsim.scheduler.lanes as m, aiqsim.compiled as c; print(m.__file__)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("lanes.py")
