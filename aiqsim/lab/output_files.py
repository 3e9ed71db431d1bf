"""Writing a run's result files: the table formats on offer, and all-or-nothing publication.

Two promises of the command line live here:

- a table format that cannot be written is refused *before* any work (``--format parquet``
  without pyarrow used to run the whole simulation and then die with an ImportError);
- ``aiqsim run --out OUT`` replaces the files in ``OUT`` only when every one of them has been
  written: they are written into a staging folder first and then moved into place, so a
  failure half-way (a full disk, a folder where a file should go) leaves the earlier run's
  files as they were. A single output file (``sweep``, ``tune`` and ``calibrate`` outputs) is
  written the same way on its own: :func:`replaced_atomically`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

from aiqsim.core.errors import ConfigurationError
from aiqsim.files import OutputPathError, check_replaceable, replaced_atomically, write_text_atomically

__all__ = [
    "PARQUET_INSTALL",
    "TABLE_FORMATS",
    "OutputPathError",
    "TableFormatUnavailableError",
    "check_targets",
    "replaced_atomically",
    "require_table_format",
    "staged_directory",
    "write_text_atomically",
]

TABLE_FORMATS = ("csv", "parquet")
PARQUET_INSTALL = "pip install 'aiqsim[parquet]'"
"""The install command that provides what ``parquet`` tables need (pyarrow)."""


class TableFormatUnavailableError(ConfigurationError, ImportError):
    """A table format whose writer library is not installed; the message names the install command."""


def require_table_format(table_format: str) -> None:
    """Raise :class:`TableFormatUnavailableError` now if tables in ``table_format`` cannot be written.

    Parquet needs pyarrow (the ``parquet`` extra, which ``test`` includes); CSV needs nothing.
    """
    if table_format not in TABLE_FORMATS:
        raise ConfigurationError(f"table format: expected one of {TABLE_FORMATS}, got {table_format!r}")
    if table_format == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise TableFormatUnavailableError(
                f"parquet output needs pyarrow, which is not installed; install it with {PARQUET_INSTALL} "
                "(or choose csv)"
            ) from None


def check_targets(out: Path, names: Iterable[str]) -> None:
    """Refuse, before any work, output names in ``out`` that a result file must not replace (a folder,
    a device, a link: :func:`~aiqsim.files.check_replaceable`)."""
    for name in names:
        check_replaceable(out / name)


@contextlib.contextmanager
def staged_directory(out: Path) -> Iterator[Path]:
    """Yield an empty staging folder; on a clean exit, move every file in it into ``out``.

    The staging folder is a hidden folder inside ``out``, so the final moves are renames on one
    file system (atomic per file) and need no write permission on ``out``'s parent. The moves
    start only after every file was written and every target was checked; if the body raises,
    the staging folder is removed and ``out`` is left exactly as it was.
    """
    out.mkdir(parents=True, exist_ok=True)
    staging = out / f".aiqsim-staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        yield staging
        names = sorted(p.name for p in staging.iterdir())
        check_targets(out, names)
        moved: list[str] = []
        for name in names:
            try:
                os.replace(staging / name, out / name)
            except OSError as error:
                raise OutputPathError(
                    f"{out / name}: cannot replace it ({error.strerror or error}); "
                    f"replaced before this one: {', '.join(moved) or 'none'}"
                ) from None
            moved.append(name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
