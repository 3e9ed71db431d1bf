"""The scheduler's one way of calling a store write: whatever goes wrong becomes a StoreWriteError.

A store should raise :class:`~aiqsim.stores.base.StoreWriteError` for a write it could not
persist, but a raw ``OSError`` (disk full, read-only file), an ``sqlite3`` error, a closed store
or an unknown id's ``KeyError`` may still come through. Such an error means the change is not
known to be durable, so it is wrapped here, with the change it lost named and the original kept
as ``__cause__``.

Two kinds pass untouched. ``ValueError`` and ``TypeError`` say the *data* cannot be stored (a
task id that already exists, a result that is not JSON): writing it again would fail again, so
they stay what they are and the caller treats them as its own error (``submit`` raises it, a
running task fails with it). ``BaseException`` (a cancellation, a simulated crash) means the
process is stopping and writes nothing more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from aiqsim.core.task import TaskRecord
from aiqsim.stores.base import StoreWriteError

T = TypeVar("T")

__all__ = ["describe_change", "persist", "persist_change"]


def describe_change(old: TaskRecord | None, new: TaskRecord) -> str:
    """``"task 'a1' (key 'k') running -> succeeded"``: the change a write was to persist."""
    before = "new" if old is None else old.status.value
    return f"task {new.id!r} (key {new.key!r}) {before} -> {new.status.value}"


def persist(what: str, write: Callable[..., T], *args: object) -> T:
    """Call ``write(*args)``; raise :class:`StoreWriteError` naming ``what`` if it was not persisted."""
    try:
        return write(*args)
    except (StoreWriteError, ValueError, TypeError):
        raise
    except Exception as error:
        raise StoreWriteError(what, error) from error


def persist_change(old: TaskRecord | None, new: TaskRecord, write: Callable[[TaskRecord], T]) -> T:
    """:func:`persist` for a task's change ``old -> new``: ``write(new)``; the description
    (:func:`describe_change`) is only built when the write fails. Every transition of every task
    is written through here, and formatting a message nobody reads was ~5% of a simulation."""
    try:
        return write(new)
    except (StoreWriteError, ValueError, TypeError):
        raise
    except Exception as error:
        raise StoreWriteError(describe_change(old, new), error) from error
