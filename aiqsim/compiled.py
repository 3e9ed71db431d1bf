"""The optional compiled build: which modules it compiles, and a guard against stale ones.

aiqsim is pure Python, and that is what ``pip install aiqsim`` (or ``pip install -e .``) gives. For
long simulations the hot modules can also be compiled with Cython from the *same* source, unchanged:

    AIQSIM_COMPILE=1 pip install .

The build (``setup.py``) compiles :data:`COMPILED_MODULES` into extension modules that sit beside
their ``.py`` files, and writes :data:`MANIFEST_NAME`: the SHA-256 of each compiled module's source at
build time. Python imports an extension module in preference to the ``.py`` beside it, so an edited
source would otherwise be silently ignored; :func:`check_compiled_sources` (run on ``import aiqsim``)
refuses to go on when a compiled module no longer matches its source, and says how to mend it. The
rules are the same either way: no module here is a second copy of anything, the build only changes
how the one copy is executed (the test suite runs both and compares their results to the last bit).

A few hot classes have a ``.pxd`` beside their module (Cython's *augmenting* declarations): in the
compiled build they become extension types whose attributes are C fields, so their own methods read
``self.x`` without the generic lookup (~160 instructions, the type's method cache then the slot)
that every other attribute read costs compiled code (issue #19: 160k -> 142k instructions per M/M/c
customer with the read-once changes beside it). The fields hold Python objects (``cdef public
object``), so values, arithmetic and errors are the ``.py``'s; the one difference is that a field
never assigned reads ``None`` where the pure class raises ``AttributeError``, and none of those
classes reads a field before it sets it. Only plain classes qualify (no dataclass, no
``__class__`` swap); a ``.pxd`` is part of the module's digest (:func:`module_digest`).

``aiqsim --version`` says which build this is. ``python -P path/to/aiqsim/compiled.py [--clean]`` says
it too, and with ``--clean`` removes the compiled files from an editable checkout (their sources are
never touched); it runs by path, without importing aiqsim, because ``import aiqsim`` refuses a stale
build.

This module imports only the standard library at the top level: ``setup.py`` loads it by path, in
a build environment where aiqsim's dependencies are not installed.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "COMPILED_MODULES",
    "COMPILE_ENV",
    "MANIFEST_NAME",
    "BuildStatus",
    "build_compiled_tree",
    "build_status",
    "check_compiled_sources",
    "module_digest",
    "module_source",
    "source_digest",
    "source_manifest",
]

COMPILE_ENV = "AIQSIM_COMPILE"
"""Set to ``1`` when building (``AIQSIM_COMPILE=1 pip install .``) to compile :data:`COMPILED_MODULES`."""

MANIFEST_NAME = "_compiled_sources.json"
"""Written by the compiled build beside ``aiqsim/__init__.py``: ``{module: sha256 of its source}``."""

COMPILED_MODULES: tuple[str, ...] = (
    # the runtime that drives the scheduler's coroutines on SimPy, and its portable lock/queue
    "aiqsim.runtime.simpy_runtime",
    "aiqsim.runtime.sync",
    # the scheduler: submission, lanes, attempts, outcomes, claims, recovery bookkeeping
    "aiqsim.scheduler.scheduler",
    "aiqsim.scheduler.lanes",
    "aiqsim.scheduler.lane_pump",
    "aiqsim.scheduler.dispatch",
    "aiqsim.scheduler.attempts",
    "aiqsim.scheduler.outcomes",
    "aiqsim.scheduler.handles",
    "aiqsim.scheduler.claims",
    "aiqsim.scheduler.store_writes",
    "aiqsim.scheduler.rate_limit_scope",
    "aiqsim.scheduler.depth_limit",
    "aiqsim.scheduler.arguments",
    "aiqsim.scheduler.live",
    "aiqsim.scheduler.jobs",
    # the pure rules every call goes through
    "aiqsim.core.states",
    "aiqsim.core.task",
    "aiqsim.core.token_bucket",
    "aiqsim.core.usage",
    "aiqsim.core.failures",
    "aiqsim.core.backoff",
    "aiqsim.core.fingerprint",
    # the in-memory store and the stores' shared base
    "aiqsim.stores.memory",
    "aiqsim.stores.base",
    # the simulation lab's per-call work: simulated providers, workloads, crashes, metrics
    "aiqsim.sim.providers",
    "aiqsim.sim.workloads",
    "aiqsim.sim.crash",
    "aiqsim.sim.simulate",
    "aiqsim.sim.metrics",
    "aiqsim.sim.job_metrics",
    # streaming mode, where long runs spend their time: on-the-fly summary, timeline and sketches,
    # the window of recent keys, merged arrivals, the store's retention of finished tasks
    "aiqsim.sim.streaming",
    "aiqsim.sim.streaming_run",
    "aiqsim.sim.job_stream",
    "aiqsim.sim.recent_keys",
    "aiqsim.sim.arrival_stream",
    "aiqsim.stores.retention",
    "aiqsim.validation.mmc",
)
"""The modules the compiled build compiles: those a profile of ``simulate()`` on the shipped scenarios
and of the M/M/c check spends its time in (benchmarks/RESULTS.md). Everything else stays Python."""

PACKAGE_DIR = Path(__file__).resolve().parent


def source_digest(path: Path) -> str:
    """The SHA-256 (hex) of a source file's bytes: what the manifest records for each module."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def module_source(package_dir: Path, module: str) -> Path:
    """The ``.py`` of ``module`` in the package at ``package_dir``: ``aiqsim.scheduler.lanes`` ->
    ``package_dir/scheduler/lanes.py``. The build (``setup.py``) and the guard find sources alike."""
    return Path(package_dir, *module.split(".")[1:]).with_suffix(".py")


def module_digest(package_dir: Path, module: str) -> str:
    """What the manifest records for ``module``: the SHA-256 of its ``.py``, or, when a ``.pxd`` sits
    beside it, of both. A ``.pxd`` gives some of the module's classes a C layout in the compiled build
    (``cdef class``: their attributes in C fields, which their own methods read without a lookup); it
    changes no behaviour, but a build from an older one is not this source's build."""
    source = module_source(package_dir, module)
    layout = source.with_suffix(".pxd")
    if not layout.exists():
        return source_digest(source)
    return hashlib.sha256(source.read_bytes() + b"\0" + layout.read_bytes()).hexdigest()


def source_manifest(package_dir: Path) -> dict[str, str]:
    """``{module: SHA-256 of its source}`` (:func:`module_digest`) for :data:`COMPILED_MODULES`: what
    the build writes to :data:`MANIFEST_NAME` and the guard compares against."""
    return {name: module_digest(package_dir, name) for name in COMPILED_MODULES}


def _extension_files(package_dir: Path, module: str) -> list[Path]:
    stem = module_source(package_dir, module).with_suffix("")
    return [
        Path(f"{stem}{suffix}")
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
        if Path(f"{stem}{suffix}").exists()
    ]


@dataclass(frozen=True)
class BuildStatus:
    """What is installed: which modules are compiled, and which of them no longer match their source."""

    compiled: tuple[str, ...]
    """Modules for which an extension module is present (Python imports it instead of the ``.py``)."""
    stale: tuple[str, ...]
    """Compiled modules whose ``.py`` changed since the build, or that the manifest does not list."""
    manifest: Path | None
    """The manifest that was read, or ``None`` when there is none (a pure install)."""

    @property
    def is_compiled(self) -> bool:
        return bool(self.compiled)

    def describe(self) -> str:
        if not self.compiled:
            return "aiqsim: pure Python (no compiled modules)"
        lines = [f"aiqsim: compiled build, {len(self.compiled)} of {len(COMPILED_MODULES)} modules compiled"]
        lines += [f"  stale: {name}" for name in self.stale]
        return "\n".join(lines)


def build_status(package_dir: Path = PACKAGE_DIR) -> BuildStatus:
    """Which of :data:`COMPILED_MODULES` are compiled in the package at ``package_dir``, and which are stale.

    Reads only the file system (a few ``stat`` calls and, when compiled, the sources' bytes): it
    imports nothing, so it can run before any compiled module is loaded."""
    compiled = tuple(name for name in COMPILED_MODULES if _extension_files(package_dir, name))
    manifest_path = package_dir / MANIFEST_NAME
    if not compiled:
        return BuildStatus((), (), manifest_path if manifest_path.exists() else None)
    try:
        recorded = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        recorded = {}
    stale = []
    for name in compiled:
        source = module_source(package_dir, name)
        digest = recorded.get(name) if isinstance(recorded, dict) else None
        if digest is None or (source.exists() and module_digest(package_dir, name) != digest):
            stale.append(name)
    return BuildStatus(compiled, tuple(stale), manifest_path if recorded else None)


def check_compiled_sources(package_dir: Path = PACKAGE_DIR) -> BuildStatus:
    """Refuse to import a compiled module that no longer matches its source.

    A pure install (no extension modules) passes at the cost of a few ``stat`` calls. Raises
    :class:`~aiqsim.core.errors.StaleCompiledModulesError` naming each stale module and the two ways
    to mend it: rebuild, or remove the compiled files and run the Python source."""
    status = build_status(package_dir)
    if status.stale:
        from aiqsim.core.errors import StaleCompiledModulesError

        names = ", ".join(status.stale)
        raise StaleCompiledModulesError(
            f"{len(status.stale)} compiled aiqsim module(s) no longer match their source: {names}. "
            "Python would import the compiled code and silently ignore the edited .py. Rebuild with "
            f"`{COMPILE_ENV}=1 pip install -e .` (or without -e), or remove the compiled files with "
            f"`{Path(sys.executable).name} -P {package_dir / 'compiled.py'} --clean` "
            "to run the Python source. "
            "Nothing was imported."
        )
    return status


def clean_compiled(package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """Remove the extension modules of :data:`COMPILED_MODULES` and the manifest; return what went.

    For an editable checkout that was compiled in place; the ``.py`` sources are never touched."""
    removed = []
    for name in COMPILED_MODULES:
        for path in _extension_files(package_dir, name):
            path.unlink()
            removed.append(path)
    manifest = package_dir / MANIFEST_NAME
    if manifest.exists():
        manifest.unlink()
        removed.append(manifest)
    return removed


def build_compiled_tree(
    checkout: Path, into: Path, *, jobs: int | None = None, c_flags: str | None = None
) -> Path:
    """Copy the checkout's ``aiqsim`` package and ``setup.py`` into ``into`` and compile it there.

    Returns ``into``, a folder to put on ``PYTHONPATH`` in front of everything else. Used by the test
    suite (which runs the compiled build against the pure one) and the benchmarks (which time both in
    the same run); needs Cython and a C compiler. Raises ``RuntimeError`` with the compiler's output
    when the build fails, and when it leaves a listed module uncompiled or stale.

    ``c_flags`` go to the C compiler after the interpreter's own (``-O3 -g`` on CPython), so they
    win: the suite, which checks what the compiled code *does*, builds at ``-O1 -g0`` in a third of
    the time; the benchmarks, which time it, keep the default (``None``), as ``pip install`` does."""
    checkout, into = Path(checkout), Path(into)
    into.mkdir(parents=True, exist_ok=True)
    shutil.copytree(
        checkout / "aiqsim",
        into / "aiqsim",
        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", MANIFEST_NAME),
        dirs_exist_ok=True,
    )
    shutil.copy2(checkout / "setup.py", into / "setup.py")
    command = [
        sys.executable,
        "setup.py",
        "-q",
        "build_ext",
        "--inplace",
        f"--parallel={jobs or os.cpu_count() or 1}",
    ]
    env = {**os.environ, COMPILE_ENV: "1"}
    if c_flags is not None:
        env["CFLAGS"] = f"{env.get('CFLAGS', '')} {c_flags}".strip()
    done = subprocess.run(command, cwd=into, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"the compiled build failed (exit {done.returncode}) in {into}:\n"
            f"{done.stdout[-3000:]}{done.stderr[-6000:]}"
        )
    status = build_status(into / "aiqsim")
    if len(status.compiled) != len(COMPILED_MODULES) or status.stale:
        raise RuntimeError(f"the compiled build in {into} is incomplete:\n{status.describe()}")
    return into


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -P aiqsim/compiled.py",
        description="Say which build of aiqsim this is (pure or compiled).",
    )
    parser.add_argument(
        "--clean",
        action="store_true",
        help="remove the compiled modules (an editable checkout compiled in place)",
    )
    args = parser.parse_args(argv)
    if args.clean:
        removed = clean_compiled()
        print(f"removed {len(removed)} compiled file(s) from {PACKAGE_DIR}")
        return 0
    status = build_status()
    print(status.describe())
    return 1 if status.stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
