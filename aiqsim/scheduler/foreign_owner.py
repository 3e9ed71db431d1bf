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

from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol, TypeVar

from aiqsim.core.errors import StoreError
from aiqsim.core.failures import describe_error
from aiqsim.runtime.protocol import Runtime
from aiqsim.scheduler.events import OwnerUnreadable
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


class _Duplicate(Protocol):
    """What :func:`stop_waiting_on_unreadable` needs of a duplicate (a live task, a job's run)."""

    waiting_on: str | None

    @property
    def record(self) -> Any: ...


D = TypeVar("D", bound=_Duplicate)


def stop_waiting_on_unreadable(
    owner_id: str,
    error: StoreError,
    waiters: dict[str, list[str]],
    duplicates: Mapping[str, D],
    *,
    kind: Literal["task", "job"],
    now: float,
    emit: Callable[[OwnerUnreadable], None] | None,
) -> list[D]:
    """The duplicates that stop waiting on ``owner_id``, whose record cannot be read and reading it
    again cannot help (:func:`outage_may_pass` said no): the rule tasks and jobs share.

    Takes the waiters of ``owner_id`` out of ``waiters``; each still in ``duplicates`` and still
    waiting on it stops waiting (``waiting_on`` cleared) and is told to the event sink ``emit`` as an
    :class:`~aiqsim.scheduler.events.OwnerUnreadable` of ``kind`` (before any of them ends: a sink
    sees why first). The caller ends the duplicates returned, each kind its own way, and counts the
    anomaly."""
    stopped = []
    for waiter_id in waiters.pop(owner_id, ()):
        waiter = duplicates.get(waiter_id)
        if waiter is None or waiter.waiting_on != owner_id:
            continue
        waiter.waiting_on = None
        stopped.append(waiter)
        if emit is not None:
            emit(OwnerUnreadable(now, kind, waiter_id, waiter.record.key, owner_id, describe_error(error)))
    return stopped


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
