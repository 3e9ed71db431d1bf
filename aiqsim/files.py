"""Files replaced all or nothing: a new version is written beside the file, then renamed over it.

Used by every command that writes a single result file (``sweep``, ``tune``, ``calibrate``, replay
arrivals), so a failure half-way (a full disk, a file size limit) leaves the earlier file whole.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["replaced_atomically", "write_text_atomically"]


@contextlib.contextmanager
def replaced_atomically(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write to; on a clean exit, rename it to ``path``.

    Writing in place truncates an earlier file first, so a failure half-way (a full disk, a file
    size limit) would leave neither the old file nor the new one. The temporary file is in the same
    folder, so the rename is atomic: ``path`` is either the earlier file, whole, or the new one.
    If the body (or the rename) raises, the temporary file is removed and the error propagates.
    """
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield temp
        os.replace(temp, path)
    finally:
        with contextlib.suppress(OSError):
            temp.unlink(missing_ok=True)


def write_text_atomically(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through :func:`replaced_atomically`; raises ``OSError``."""
    with replaced_atomically(path) as temp:
        temp.write_text(text, encoding="utf-8")
