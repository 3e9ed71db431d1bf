"""The runtime protocol: the only things scheduler code may ask of its event loop.

The scheduler is ``async def`` code written against :class:`Runtime`. Two
implementations exist: :class:`aiqsim.runtime.AsyncioRuntime` (real time) and
:class:`aiqsim.runtime.SimPyRuntime` (virtual time on a ``simpy.Environment``). Both
are single-threaded, so the portable primitives in :mod:`aiqsim.runtime.sync` need no
locking of their own.

Cancellation is delivered as :class:`Cancelled` on both runtimes (it *is*
``asyncio.CancelledError``, a ``BaseException``, so ``except Exception`` never swallows it).
"""

from __future__ import annotations

from asyncio import CancelledError as Cancelled
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, Protocol, TypeVar, runtime_checkable

from aiqsim.core.errors import SchedulingError

T = TypeVar("T")

__all__ = ["Cancelled", "DeadlineExceeded", "Future", "Runtime", "ScheduledCall", "TaskHandle"]


class DeadlineExceeded(SchedulingError, TimeoutError):
    """:meth:`Runtime.wait_for`'s own deadline passed (the awaited work was cancelled).

    A ``TimeoutError``, so ``except TimeoutError`` still catches it; a class of its own so that a
    caller can tell the deadline it set from a ``TimeoutError`` the awaited work raised itself (the
    scheduler names the provider and the attempt timeout in a task's error)."""


@runtime_checkable
class Future(Protocol[T]):
    """A one-shot result slot that coroutines can await."""

    def done(self) -> bool: ...
    def cancelled(self) -> bool: ...
    def set_result(self, value: T) -> None: ...
    def set_exception(self, exc: BaseException) -> None: ...
    def result(self) -> T: ...
    def add_done_callback(self, fn: Callable[[Any], None]) -> None: ...
    def __await__(self) -> Generator[Any, None, T]: ...


@runtime_checkable
class TaskHandle(Protocol[T]):
    """A spawned coroutine: awaitable for its result, cancellable."""

    def cancel(self) -> bool: ...
    def done(self) -> bool: ...
    def cancelled(self) -> bool: ...
    def result(self) -> T: ...
    def __await__(self) -> Generator[Any, None, T]: ...


@runtime_checkable
class ScheduledCall(Protocol):
    """A callback scheduled by :meth:`Runtime.call_later`; ``cancel`` keeps it from running."""

    def cancel(self) -> None: ...


@runtime_checkable
class Runtime(Protocol):
    """Clock, sleep, futures, tasks, timeouts and callbacks: everything the scheduler needs from a loop."""

    def now(self) -> float:
        """Seconds on this runtime's clock (virtual under SimPy)."""
        ...

    def sleep(self, seconds: float) -> Awaitable[None]:
        """Suspend the calling coroutine for ``seconds``."""
        ...

    def create_future(self) -> Future[Any]:
        """A new pending one-shot future."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> TaskHandle[T]:
        """Start ``coro`` concurrently; it first runs after the caller yields."""
        ...

    def wait_for(self, awaitable: Awaitable[T], timeout: float | None) -> Awaitable[T]:
        """Await ``awaitable`` for at most ``timeout`` seconds, else cancel it and raise
        :class:`DeadlineExceeded` (a ``TimeoutError``)."""
        ...

    def call_soon(self, callback: Callable[[], None], *, name: str | None = None) -> None:
        """Run ``callback()`` after everything already scheduled for now (asyncio's ``call_soon``).

        An exception it raises is reported as the runtime reports a failed task nobody awaits
        (SimPy: ``task_errors``, under ``name``; asyncio: the loop's exception handler)."""
        ...

    def call_later(
        self, delay: float, callback: Callable[[], None], *, name: str | None = None
    ) -> ScheduledCall:
        """Run ``callback()`` ``delay`` seconds from now (at once for ``delay <= 0``), unless cancelled."""
        ...

    def cancelling(self) -> bool:
        """Whether the calling task has been asked to stop (its ``cancel()`` was called).

        Tells a task's own cancellation from a :class:`Cancelled` raised by the code it awaited:
        the scheduler fails a task whose provider raises one unasked, instead of reporting a
        cancellation nobody requested. ``False`` outside a task."""
        ...
