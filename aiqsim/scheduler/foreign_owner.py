"""Waiting for a key owned by another process: wake on the store's announcement, else poll.

A duplicate of a task that another process (on this host or another) is running waits for that
run's outcome. A store that announces terminal transitions — :class:`~aiqsim.stores.PostgresStore`
sends ``NOTIFY`` in the transaction that makes a task terminal — lets the waiter sleep until one
happens, on a runtime that can wait on a file descriptor (``AsyncioRuntime.wait_readable``):
no polling, and the wake-up comes a network round trip after the owner's commit. Every other
combination (SQLite, JSON, the SimPy runtime) polls the store instead.

Both capabilities are optional and looked up by name, so stores and runtimes without them need
nothing.
"""

from __future__ import annotations

from typing import Any

from aiqsim.core.errors import StoreError
from aiqsim.runtime.protocol import Runtime
from aiqsim.stores.base import StoreClosedError, StoreCorruptError

FOREIGN_SAFETY_POLL_S = 5.0
"""With announcements, how often a waiter still looks at the store: a safety net for a lost
notification (a listener connection that dropped and reconnected), not the way it learns."""


def outage_may_pass(error: StoreError) -> bool:
    """Whether a watcher that could not read the owner's record should look again after a poll:
    yes when the store could not be reached (a database restart, a network cut: the store makes its
    connection again), no when it is closed or its record is corrupt (looking again cannot help).
    The waiters wait on meanwhile; :attr:`Scheduler.anomalies` counts ``"store_unreachable"``.
    When it cannot pass, the waiters stop waiting and resolve with the error
    (``"owner_unreadable"``): a duplicate must not wait for ever on a record nobody can read."""
    return not isinstance(error, StoreClosedError | StoreCorruptError)


def announces_changes(runtime: Runtime, store: Any) -> bool:
    """Whether ``store`` announces terminal transitions and ``runtime`` can wait for them."""
    return callable(getattr(store, "notification_fileno", None)) and callable(
        getattr(runtime, "wait_readable", None)
    )


async def store_change(runtime: Runtime, store: Any, timeout_s: float) -> None:
    """Return when ``store`` announces a terminal transition (any task), or after ``timeout_s``.

    The caller re-reads what it waits for afterwards: an announcement only says "look again".
    The store's listener starts on the first call; announcements read here are drained, which is
    fine because every waiter on the descriptor is woken together.
    """
    fileno = store.notification_fileno()
    try:
        await runtime.wait_for(runtime.wait_readable(fileno), timeout_s)  # type: ignore[attr-defined]
    except TimeoutError:
        pass
    store.drain_notifications()
