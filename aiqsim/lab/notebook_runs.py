"""Executing the shipped notebooks headless, the way the test suite and the documentation build do.

Each notebook in ``notebooks/`` has one cell tagged ``parameters``; :func:`run_notebook` inserts a
cell after it (``FAST = True`` by default, which shrinks the sweeps to CI size while every code path
still runs) and executes the notebook on a fresh kernel in its own folder. The suite checks the
result (tests/test_notebooks.py) and the documentation site renders it (docs/hooks.py), so the
charts on the site are the ones a test has just produced.

Needs ``nbclient`` (installed by the ``test`` and ``docs`` extras); imported only when used.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiqsim.core.errors import ConfigurationError

__all__ = ["FAST_PARAMETERS", "run_notebook"]

FAST_PARAMETERS = "FAST = True"
"""The cell the suite and the docs build insert after a notebook's ``parameters`` cell."""


def run_notebook(
    path: str | Path,
    *,
    parameters: str = FAST_PARAMETERS,
    timeout_s: int = 600,
    env: Mapping[str, str] | None = None,
) -> Any:
    """Execute the notebook at ``path`` with ``parameters`` injected; return the executed notebook.

    ``env`` is the kernel's whole environment (default: this process's), e.g. to give each run a
    ``TMPDIR`` of its own so that what a notebook leaves behind can be seen.

    Raises :class:`~aiqsim.core.errors.ConfigurationError` if no cell is tagged ``parameters`` (a
    headless run needs it to shrink the notebook), and nbclient's
    ``CellExecutionError`` (with the failing cell and its traceback) if a cell raises.
    """
    import nbformat
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    path = Path(path)
    book = nbformat.read(path, as_version=4)
    tagged = [i for i, cell in enumerate(book.cells) if "parameters" in cell.metadata.get("tags", [])]
    if not tagged:
        raise ConfigurationError(f"{path.name} has no cell tagged 'parameters'")
    book.cells.insert(tagged[0] + 1, nbformat.v4.new_code_cell(parameters))
    # The kernel talks over Unix sockets in a folder of its own, not TCP on 127.0.0.1: a TCP port is picked
    # free and bound later, so on a machine where many kernels start at once two can pick the same one and a
    # client then waits forever for replies that went to another kernel.
    with tempfile.TemporaryDirectory(prefix="aiqsim-kernel-") as sockets:
        manager = KernelManager(kernel_name="python3", transport="ipc", ip=str(Path(sockets) / "kernel"))
        client = NotebookClient(
            book,
            km=manager,
            timeout=timeout_s,
            kernel_name="python3",
            resources={"metadata": {"path": str(path.parent)}},
        )
        # cleanup_kc: shut the kernel down afterwards. nbclient keeps a kernel it did not create
        # itself (ours: km=manager) alive, so every executed notebook used to leave an idle kernel
        # (~200 MB) running until this process exited.
        client.execute(cleanup_kc=True, **({} if env is None else {"env": dict(env)}))
    return book
