"""Where the suite keeps its temporary files: in memory (tmpfs) when the machine has one.

The suite writes real SQLite and JSON stores, and each committed transaction fsyncs. On a disk a
fsync costs milliseconds (more on a loaded CI machine); on tmpfs it returns at once, while every
line of the store code, every file and every rename stays the same. Nothing in the suite tests
power loss (a crash test kills a process, or simulates it, and the page cache survives either), so
the fsync's wait proves nothing there; the crash-recovery notebook ran 9x faster on tmpfs.

``AIQSIM_TEST_TMP=disk`` keeps the system temp dir (e.g. to look at a failure's files after a reboot).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

SHM = Path("/dev/shm")


def memory_backed_tmp_root() -> Path:
    """``/dev/shm`` where it is a writable folder (a tmpfs on Linux) and not opted out, else the temp dir."""
    if os.environ.get("AIQSIM_TEST_TMP", "").strip().lower() != "disk" and _writable_dir(SHM):
        return SHM
    return Path(tempfile.gettempdir())


def _writable_dir(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)
