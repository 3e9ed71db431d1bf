"""The scheduler's one way of calling a store write: whatever goes wrong becomes a StoreWriteError.

A store should raise :class:`~aiqsim.stores.base.StoreWriteError` for a write it could not
persist, but a raw ``OSError`` (disk full, read-only file), an ``sqlite3`` error or a bug's
``KeyError`` may still come through. Any ``Exception`` out of a write means the change is not
known to be durable, so it is wrapped here, with the change it lost named and the original kept
as ``__cause__``. ``BaseException`` (a cancellation, a simulated crash) passes untouched: the
process is stopping and writes nothing more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from aiqsim.core.task import TaskRecord
from aiqsim.stores.base import StoreWriteError

T = TypeVar("T")

__all__ = ["describe_change", "persist"]


def describe_change(old: TaskRecord | None, new: TaskRecord) -> str:
    """``"task 'a1' (key 'k') running -> succeeded"``: the change a write was to persist."""
    before = "new" if old is None else old.status.value
    return f"task {new.id!r} (key {new.key!r}) {before} -> {new.status.value}"


def persist(what: str, write: Callable[..., T], *args: object) -> T:
    """Call ``write(*args)``; raise :class:`StoreWriteError` naming ``what`` if it fails in any way."""
    try:
        return write(*args)
    except StoreWriteError:
        raise
    except Exception as error:
        raise StoreWriteError(what, error) from error
