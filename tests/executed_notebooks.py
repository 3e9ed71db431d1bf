"""Each shipped notebook executed once per test session (FAST), shared by the tests that need it.

tests/test_notebooks.py checks the executed notebooks (tests/test_docs.py renders the notebooks
without executing them), so the suite executes every notebook once.

Cost and how it is kept down (the notebooks were the suite's largest single item):

- **Two kernels at a time.** The pytest process only waits while a kernel computes, so when the
  first notebook is asked for, every notebook the session needs (:func:`plan`, called by
  tests/conftest.py after collection) starts, :data:`WORKERS` at a time in threads, each on a
  fresh kernel of its own, slowest first. On 2 cores this keeps both busy;
  ``AIQSIM_TEST_NOTEBOOK_WORKERS=1`` restores one at a time. Nothing starts before a test asks,
  so the kernels never compete with the wall-clock tests of other files.
- **A temporary folder of its own, in memory.** Each kernel gets ``TMPDIR`` pointing at a fresh
  folder under ``/dev/shm`` (tests/memory_tmp.py: a tmpfs on Linux; the system temp dir
  elsewhere). The simulator's SQLite stores live under ``TMPDIR``; on tmpfs their ``fsync`` costs
  nothing, which made the crash-recovery notebook about 9 times faster, running the same code. The folder is
  also how :attr:`NotebookRun.leftovers` sees what a notebook forgot to delete.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # not POSIX: each worker executes the notebooks it needs
    fcntl = None  # type: ignore[assignment]

from memory_tmp import memory_backed_tmp_root

from aiqsim.lab.notebook_runs import run_notebook

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
WORKERS = max(1, int(os.environ.get("AIQSIM_TEST_NOTEBOOK_WORKERS", "2")))
"""Kernels executing at once (2: the CI machine's cores)."""

SLOWEST_FIRST = ("backoff_jitter_study", "02_retry_storms_and_backoff", "07_overload_protection")
"""Started first, so the last notebook to finish is a short one (measured; only the order depends on it)."""


@dataclass(frozen=True)
class NotebookRun:
    """One headless execution: the executed notebook, what it left in its ``TMPDIR``, and its wall time."""

    book: Any
    leftovers: tuple[str, ...]
    seconds: float


_lock = threading.Lock()
_runs: dict[Path, Future[NotebookRun]] = {}
_pool: ThreadPoolExecutor | None = None
_planned: list[Path] = []
_scratch: Path | None = None


def _execute(path: Path, tmpdir: Path, outdir: Path) -> NotebookRun:
    """The notebook executed here, or, under pytest-xdist, by whichever worker asked for it first."""
    shared = os.environ.get("AIQSIM_TEST_NOTEBOOKS_SHARED")  # tests/conftest.py makes it for -n N
    if not shared or fcntl is None:
        return _run(path, tmpdir, outdir)
    return _run_once_across_workers(Path(shared), path, tmpdir, outdir)


def _run_once_across_workers(shared: Path, path: Path, tmpdir: Path, outdir: Path) -> NotebookRun:
    """Each xdist worker is a session of its own, and both ask for the notebooks (their tests are
    spread over both): one lock file per notebook, the first to take it executes the notebook and
    leaves the run in ``shared``; the other waits on the lock, then reads it instead of executing
    the notebook a second time. A run that raised leaves nothing: the next asker executes it again
    and reports the same failure."""
    import json

    import nbformat

    result = shared / f"{path.stem}.run.json"
    with open(shared / f"{path.stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if result.exists():
            kept = json.loads(result.read_text(encoding="utf-8"))
            book = nbformat.reads(kept["book"], as_version=4)
            return NotebookRun(book, tuple(kept["leftovers"]), kept["seconds"])
        run = _run(path, tmpdir, outdir)
        temp = result.with_suffix(".tmp")
        book_text = nbformat.writes(run.book)
        temp.write_text(json.dumps({"book": book_text, "leftovers": run.leftovers, "seconds": run.seconds}))
        temp.replace(result)
        return run


def _run(path: Path, tmpdir: Path, outdir: Path) -> NotebookRun:
    started = time.perf_counter()
    # AIQSIM_NOTEBOOK_OUT: where a notebook keeps what its decision points at (default ./out), here
    # outside TMPDIR (what is left there is a leak) and outside the checkout
    env = {**os.environ, "TMPDIR": str(tmpdir), "AIQSIM_NOTEBOOK_OUT": str(outdir)}
    book = run_notebook(path, env=env)
    leftovers = tuple(sorted(entry.name for entry in tmpdir.iterdir()))
    return NotebookRun(book, leftovers, time.perf_counter() - started)


def _submit(paths: Iterable[Path]) -> None:
    """Queue each not yet queued notebook of ``paths`` (call with ``_lock`` held)."""
    global _pool, _scratch
    if _pool is None:
        _pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="notebook")
        _scratch = Path(tempfile.mkdtemp(prefix="aiqsim-test-notebooks-", dir=memory_backed_tmp_root()))
        atexit.register(shutil.rmtree, _scratch, ignore_errors=True)
    assert _scratch is not None
    for path in paths:
        path = path.resolve()
        if path not in _runs:
            tmpdir = _scratch / path.stem
            tmpdir.mkdir()
            outdir = _scratch / f"{path.stem}.out"
            outdir.mkdir()
            _runs[path] = _pool.submit(_execute, path, tmpdir, outdir)


def _slowest_first(paths: Iterable[Path]) -> list[Path]:
    def rank(path: Path) -> tuple[int, str]:
        return (
            SLOWEST_FIRST.index(path.stem) if path.stem in SLOWEST_FIRST else len(SLOWEST_FIRST),
            path.stem,
        )

    return sorted(set(paths), key=rank)


def plan(paths: Iterable[Path]) -> None:
    """The notebooks this session will ask for: all start together with the first one asked for."""
    with _lock:
        _planned[:] = _slowest_first([*_planned, *paths])


def run_of(path: Path) -> NotebookRun:
    """The notebook at ``path`` executed with ``FAST = True`` (raises if a cell fails); once per session."""
    with _lock:
        _submit([*_planned, path] if path.resolve() in {p.resolve() for p in _planned} else [path, *_planned])
        future = _runs[path.resolve()]
    return future.result()


def executed(path: Path) -> Any:
    """The executed notebook at ``path`` (see :func:`run_of`)."""
    return run_of(path).book


def shutdown() -> None:
    """Drop the notebooks not started yet (the session is over) and wait for the running ones."""
    with _lock:
        if _pool is not None:
            _pool.shutdown(wait=True, cancel_futures=True)


def printed(book: Any) -> str:
    """Everything the executed notebook ``book`` printed (its code cells' stream outputs), in order."""
    return "".join(
        output.get("text", "")
        for cell in book.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "stream"
    )
