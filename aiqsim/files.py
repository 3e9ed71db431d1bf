"""Files replaced all or nothing: a new version is written beside the file, then renamed over it.

Used by every command that writes a single result file (``sweep``, ``tune``, ``calibrate``, replay
arrivals), so a failure half-way (a full disk, a file size limit) leaves the earlier file whole.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from aiqsim.core.errors import ConfigurationError

__all__ = ["OutputPathError", "check_replaceable", "replaced_atomically", "write_text_atomically"]


class OutputPathError(ConfigurationError):
    """An output path that cannot receive a result file (a folder, a device or a link in its place,
    no permission); nothing was written there."""


def check_replaceable(path: Path) -> None:
    """Refuse a ``path`` that exists and is not a regular file, before anything is written.

    A result file is written beside its path and renamed over it: over a device (``/dev/null``), a
    FIFO or a symbolic link that rename would put a plain file in its place (the link itself, not
    its target), and over a folder it fails. None of them is a file a result should replace.
    """
    try:
        mode = os.lstat(path).st_mode
    except OSError:  # absent (written new) or unreadable (the write says why)
        return
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        kind, fix = "a directory", "remove or rename it"
    elif stat.S_ISLNK(mode):
        kind, fix = "a symbolic link", "give the path of its target, or a new file"
    else:
        kind, fix = "a device or special file (not a regular file)", "give the path of a regular or new file"
    raise OutputPathError(f"{path}: is {kind}, where a result file is written; {fix}. Nothing was written")


@contextlib.contextmanager
def replaced_atomically(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write to; on a clean exit, rename it to ``path``.

    Writing in place truncates an earlier file first, so a failure half-way (a full disk, a file
    size limit) would leave neither the old file nor the new one. The temporary file is in the same
    folder, so the rename is atomic: ``path`` is either the earlier file, whole, or the new one.
    If the body (or the rename) raises, the temporary file is removed and the error propagates.
    A ``path`` that is no regular file is refused first (:func:`check_replaceable`).
    """
    check_replaceable(path)
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield temp
        check_replaceable(path)  # again: the work may have taken a while
        os.replace(temp, path)
    finally:
        with contextlib.suppress(OSError):
            temp.unlink(missing_ok=True)


def write_text_atomically(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through :func:`replaced_atomically`; raises ``OSError``."""
    with replaced_atomically(path) as temp:
        temp.write_text(text, encoding="utf-8")
