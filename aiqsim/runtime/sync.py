"""Lock, queue and signal built once on the runtime's future, portable to both runtimes.

asyncio cancels the future a cancelled waiter was awaiting, SimPy leaves it pending; so
every primitive here removes a cancelled waiter itself and, if a permit had already been
handed to it, passes the permit on. Both runtimes are single-threaded, so plain Python
state is safe between awaits.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Generic, TypeVar

from aiqsim.runtime.protocol import Cancelled, Future, Runtime

T = TypeVar("T")


class Lock:
    """A FIFO mutual-exclusion lock."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._locked = False
        self._waiters: deque[Future[Any]] = deque()

    def locked(self) -> bool:
        return self._locked

    async def acquire(self) -> None:
        if not self._locked and not self._waiters:
            self._locked = True
            return
        waiter = self._runtime.create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except Cancelled:
            if waiter.done() and not waiter.cancelled():
                # ownership was handed to us just before the cancel: hand it on
                self._locked = False
                self._wake_next()
            else:
                self._remove(waiter)
            raise
        # ownership was transferred by release(): _locked is still True

    def release(self) -> None:
        if not self._locked:
            raise RuntimeError("Lock.release() on an unlocked lock")
        self._locked = False
        self._wake_next()

    def _wake_next(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._locked = True
                waiter.set_result(None)
                return

    def _remove(self, waiter: Future[Any]) -> None:
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass

    async def __aenter__(self) -> Lock:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()


class Queue(Generic[T]):
    """An unbounded FIFO queue whose ``get`` waits for an item."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._items: deque[T] = deque()
        self._getters: deque[Future[Any]] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def put_nowait(self, item: T) -> None:
        self._items.append(item)
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)
                return

    def get_nowait(self) -> T:
        if not self._items:
            raise IndexError("queue is empty")
        return self._items.popleft()

    async def get(self) -> T:
        while not self._items:
            getter = self._runtime.create_future()
            self._getters.append(getter)
            try:
                await getter
            except Cancelled:
                try:
                    self._getters.remove(getter)
                except ValueError:
                    pass
                if getter.done() and not getter.cancelled() and self._items:
                    self._wake_one()  # our wake-up was spent: pass it on
                raise
        return self._items.popleft()

    def _wake_one(self) -> None:
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)
                return


class Signal:
    """A level-less wake-up: ``wait`` suspends until the next ``notify`` (or a timeout).

    Used by dispatchers to sleep until "something changed" (a submission, a release, a
    cancellation) or until a computed time, whichever comes first.
    """

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._waiters: list[Future[Any]] = []

    def notify(self) -> None:
        """Wake every current waiter."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self, timeout: float | None = None) -> bool:
        """Return True if notified, False if ``timeout`` passed first."""
        waiter = self._runtime.create_future()
        self._waiters.append(waiter)
        if timeout is None:  # an idle dispatcher's wait: no wait_for layer (``wait_for(x, None)`` is x)
            try:
                await waiter
            except Cancelled:
                self._discard(waiter)
                raise
            return True
        try:
            await self._runtime.wait_for(waiter, timeout)
        except TimeoutError:
            self._discard(waiter)
            return False
        except Cancelled:
            self._discard(waiter)
            raise
        return True

    def _discard(self, waiter: Future[Any]) -> None:
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass
