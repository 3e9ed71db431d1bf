"""Each shipped notebook executed once per test session (FAST), shared by the tests that need it.

tests/test_notebooks.py checks the executed notebooks; tests/test_docs.py renders the same copies
into the documentation site, so the suite executes every notebook once, whichever file runs first.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from aiqsim.lab.notebook_runs import run_notebook

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


@functools.cache
def executed(path: Path) -> Any:
    """The notebook at ``path`` executed with ``FAST = True`` (raises if a cell fails)."""
    return run_notebook(path)
