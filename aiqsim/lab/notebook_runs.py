"""Executing the shipped notebooks headless, the way the test suite and the documentation build do.

Each notebook in ``notebooks/`` has one cell tagged ``parameters``; :func:`run_notebook` inserts a
cell after it (``FAST = True`` by default, which shrinks the sweeps to CI size while every code path
still runs) and executes the notebook on a fresh kernel in its own folder. The suite checks the
result (tests/test_notebooks.py) and the documentation site renders it (docs/hooks.py), so the
charts on the site are the ones a test has just produced.

A headless run never waits without a bound: each cell has :data:`CELL_TIMEOUT_S` to finish and, once
the kernel has replied, :data:`IOPUB_TIMEOUT_S` for its remaining output and its "idle" status. Either
limit reached raises an error that names the notebook and the cell, instead of a stalled run.

Needs ``nbclient`` (installed by the ``test`` and ``docs`` extras); imported only when used.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiqsim.core.errors import ConfigurationError

__all__ = ["CELL_TIMEOUT_S", "FAST_PARAMETERS", "IOPUB_TIMEOUT_S", "run_notebook"]

FAST_PARAMETERS = "FAST = True"
"""The cell the suite and the docs build insert after a notebook's ``parameters`` cell."""

CELL_TIMEOUT_S = 300
"""Seconds one cell may run before the run fails with nbclient's ``CellTimeoutError`` naming it.

Half the test suite's per-test limit (pytest-timeout, 600 s), so that a stuck cell fails as an
error that says which cell, not as a test killed while waiting for the notebook. A FAST cell takes
seconds: the slowest measured, the jitter study's sweep, 10 s on an idle 2-core machine."""

IOPUB_TIMEOUT_S = 30
"""Seconds to wait, after a cell's reply, for the rest of its output and the kernel's "idle" status.

nbclient's default is 4 s and, past it, to log a warning and go on: the cell's late outputs are then
dropped without an error, and read as missing charts or a missing decision much later. Here a late
"idle" is an error naming the cell (``raise_on_iopub_timeout``). A kernel sends "idle" right after its
reply: over 46 runs of the quickstart, two at a time beside two CPU hogs, the gap was at most 15 ms,
so 30 s is reached only by a kernel that has stopped sending."""


def run_notebook(
    path: str | Path,
    *,
    parameters: str = FAST_PARAMETERS,
    timeout_s: int = CELL_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
) -> Any:
    """Execute the notebook at ``path`` with ``parameters`` injected; return the executed notebook.

    ``timeout_s`` bounds each cell (:data:`CELL_TIMEOUT_S` by default). ``env`` is the kernel's whole
    environment (default: this process's), e.g. to give each run a ``TMPDIR`` of its own so that
    what a notebook leaves behind can be seen.

    Raises :class:`~aiqsim.core.errors.ConfigurationError` if no cell is tagged ``parameters`` (a
    headless run needs it to shrink the notebook); nbclient's ``CellExecutionError`` (with the
    failing cell and its traceback) if a cell raises, ``CellTimeoutError`` if a cell or its output
    outlasts its limit and ``DeadKernelError`` if the kernel dies. Each of these carries a note
    naming the notebook and the cell (its number among the code cells and its first line).
    ``KeyboardInterrupt`` if the run is stopped by Ctrl-C (or SIGTERM), its kernel shut down.
    """
    import nbformat
    from jupyter_client.manager import AsyncKernelManager

    path = Path(path)
    book = nbformat.read(path, as_version=4)
    tagged = [i for i, cell in enumerate(book.cells) if "parameters" in cell.metadata.get("tags", [])]
    if not tagged:
        raise ConfigurationError(f"{path.name} has no cell tagged 'parameters'")
    book.cells.insert(tagged[0] + 1, nbformat.v4.new_code_cell(parameters))
    running: list[int] = []

    def started(cell: Any, cell_index: int, **_: Any) -> None:
        running[:] = [cell_index]

    # The kernel talks over Unix sockets in a folder of its own, not TCP on 127.0.0.1: a TCP port is picked
    # free and bound later, so on a machine where many kernels start at once two can pick the same one and a
    # client then waits forever for replies that went to another kernel.
    # The manager is the asynchronous one, as nbclient's own default: nbclient waits for a cell's reply, its
    # output and the kernel's liveness in three asyncio tasks, and a blocking manager's client made each
    # wait block the whole loop. Its output reader then sat in a poll without a timeout until the next
    # message, so the cell timeout and the dead-kernel check never ran: a kernel that died, a cell that
    # never finished or an "idle" that never came hung the run for good instead of failing it.
    with tempfile.TemporaryDirectory(prefix="aiqsim-kernel-", dir=_socket_parent()) as sockets:
        manager = AsyncKernelManager(kernel_name="python3", transport="ipc", ip=str(Path(sockets) / "kernel"))
        client = _interruptible_client_class()(
            book,
            km=manager,
            timeout=timeout_s,
            iopub_timeout=IOPUB_TIMEOUT_S,
            raise_on_iopub_timeout=True,
            kernel_name="python3",
            resources={"metadata": {"path": str(path.parent)}},
            on_cell_execute=started,
        )
        try:
            # cleanup_kc: shut the kernel down afterwards. nbclient keeps a kernel it did not create
            # itself (ours: km=manager) alive, so every executed notebook used to leave an idle kernel
            # (~200 MB) running until this process exited.
            client.execute(cleanup_kc=True, **({} if env is None else {"env": dict(env)}))
        except Exception as error:
            if running:
                error.add_note(_where(path, book, running[0], tagged[0] + 1))
            if client.signalled:  # the kernel was shut down for a Ctrl-C: its death is not the news
                interrupt = KeyboardInterrupt(f"{path.name}: run stopped by a signal (Ctrl-C)")
                interrupt.__notes__ = getattr(error, "__notes__", [])
                raise interrupt from error
            raise
    if client.signalled:
        raise KeyboardInterrupt(f"{path.name}: run stopped by a signal (Ctrl-C)")
    return book


SOCKET_PATH_MAX = 100
"""Longest path in bytes of a kernel's socket: the OS keeps a Unix socket's path in ``sun_path`` (108
bytes on Linux, 104 on macOS, the final NUL included); a longer one fails the run at once with pyzmq's
``ZMQError: File name too long``."""

_SOCKET_NAME = "/aiqsim-kernel-xxxxxxxx/kernel-99"  # a socket's path below its parent, at its longest


def _socket_parent() -> str | None:
    """Where the folder of the kernel's sockets goes: the temporary folder (``None``) when its path
    leaves room for them, else ``/tmp`` (a CI's or a sandbox's ``TMPDIR`` can be a long path)."""
    fits = [
        folder
        for folder in (tempfile.gettempdir(), "/tmp")
        if len(os.fsencode(folder + _SOCKET_NAME)) <= SOCKET_PATH_MAX
        and os.path.isdir(folder)
        and os.access(folder, os.W_OK | os.X_OK)
    ]
    if not fits:
        raise ConfigurationError(
            f"no folder for the kernel's sockets: the temporary folder {tempfile.gettempdir()} is too long a "
            f"path (a socket's may have {SOCKET_PATH_MAX} bytes) and /tmp is not writable; set TMPDIR to a "
            "shorter one"
        )
    return None if fits[0] == tempfile.gettempdir() else fits[0]


def _interruptible_client_class() -> type:
    """nbclient's ``NotebookClient``, safe to stop with Ctrl-C.

    nbclient handles SIGINT and SIGTERM itself, on its event loop: it shuts the kernel down and goes
    on, so the running cell then fails with ``DeadKernelError`` and the run's own clean-up, a second
    one, failed on nbclient's ``assert self.km is not None``. The run ended in a bare
    ``AssertionError``, and a test session or a docs build went on to the next notebook. Here the
    clean-up runs once however often it is asked for, and :attr:`signalled` tells
    :func:`run_notebook` to raise ``KeyboardInterrupt``.
    """
    import asyncio

    from nbclient import NotebookClient

    class _InterruptibleClient(NotebookClient):
        signalled = False
        _cleanup: Any = None

        @property
        def _async_cleanup_kernel_future(self) -> Any:  # set by nbclient's signal handler only
            return self._cleanup

        @_async_cleanup_kernel_future.setter
        def _async_cleanup_kernel_future(self, future: Any) -> None:
            self.signalled = True

        async def _async_cleanup_kernel(self) -> None:
            if self._cleanup is None:
                self._cleanup = asyncio.ensure_future(super()._async_cleanup_kernel())
            await self._cleanup

    return _InterruptibleClient


def _where(path: Path, book: Any, index: int, injected: int) -> str:
    """``in 01_quickstart.ipynb, code cell 12 (`from aiqsim.lab.widgets import TuningPanel`)``: the
    cell as a reader of the stored notebook counts it (the injected parameters cell not counted)."""
    code = [i for i, cell in enumerate(book.cells) if cell.cell_type == "code" and i != injected]
    cell = book.cells[index]
    first = next((line for line in cell.source.splitlines() if line.strip()), "")
    number = f"code cell {code.index(index) + 1}" if index in code else "the injected parameters cell"
    return f"in {path.name}, {number} of {len(code)} (`{first[:80]}`)"
