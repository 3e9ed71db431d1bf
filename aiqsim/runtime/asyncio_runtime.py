"""The production runtime: asyncio in real (optionally scaled) time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any, TypeVar

from aiqsim.core.numeric import check_time_scale
from aiqsim.runtime.protocol import DeadlineExceeded

T = TypeVar("T")


class _OwnTimeout(Exception):
    """A TimeoutError the awaited work raised itself, carried past ``asyncio.wait_for``.

    Python 3.11 raises wait_for's own timeout as ``TimeoutError`` from a ``CancelledError``, and so
    does an ``asyncio.timeout()`` inside the work (an SDK's read timeout): the two looked alike, and
    a provider's own 50 ms timeout was reported as the scheduler's 60 s attempt timeout."""

    def __init__(self, error: TimeoutError) -> None:
        super().__init__()
        self.error = error


class _EndedWhenCancelled:
    """What the awaited work ended with after it was asked to cancel (it returned what it had, or
    its cleanup raised): ``asyncio.wait_for`` would pass that outcome on, where SimPyRuntime says
    the timeout wins, as it should (the answer is late). A result, not an exception: when the
    cancel came from outside, wait_for drops it unread, and an exception nobody read is logged."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


def _cancel_requested() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _marking_own_timeouts(awaitable: Awaitable[T]) -> T | _EndedWhenCancelled:
    """Await ``awaitable`` inside wait_for's task, marking the two outcomes wait_for cannot tell."""
    try:
        result = await awaitable
    except asyncio.CancelledError:
        raise
    except Exception as error:
        if _cancel_requested():
            return _EndedWhenCancelled(error)
        if isinstance(error, TimeoutError):
            raise _OwnTimeout(error) from None
        raise
    if _cancel_requested():
        return _EndedWhenCancelled(None)
    return result


_WAIT_FOR_CODE = asyncio.wait_for.__code__


def _free_wait_for_frame(error: BaseException) -> None:
    """Clear the locals of ``asyncio.wait_for``'s frame in ``error``'s traceback.

    On Python 3.11 that frame holds the task it ran the work in, and the task holds the failure
    whose traceback holds the frame: every failed or timed-out attempt was a cycle only the
    collector freed (tests/test_gc_tuning.py shows why that matters). The frame has returned; its
    locals are of no use to anyone reading the traceback."""
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is _WAIT_FOR_CODE:
            try:
                tb.tb_frame.clear()
            except RuntimeError:  # still running (not the case once it raised): left alone
                pass
            return
        tb = tb.tb_next


class AsyncioRuntime:
    """Runs the scheduler on the running asyncio loop.

    ``time_scale`` maps scheduler seconds to wall seconds: with 0.01, a 30 s backoff
    sleeps 0.3 s of wall time, and :meth:`now` reports scheduler seconds. This lets a
    scenario written in provider time run live against a real server in a short test.
    Use 1.0 (the default) in production.
    """

    def __init__(self, *, time_scale: float = 1.0, loop: asyncio.AbstractEventLoop | None = None) -> None:
        check_time_scale(time_scale)
        self.time_scale = float(time_scale)
        self._loop = loop
        self._origin = time.monotonic()
        self._readers: dict[int, list[asyncio.Future[None]]] = {}

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def now(self) -> float:
        """Scheduler seconds since this runtime was created (asyncio's loop clock is ``time.monotonic``)."""
        return (time.monotonic() - self._origin) / self.time_scale

    def sleep(self, seconds: float) -> Awaitable[None]:
        return asyncio.sleep(max(0.0, seconds) * self.time_scale)

    def create_future(self) -> asyncio.Future[Any]:
        return self.loop.create_future()

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        return self.loop.create_task(coro, name=name)

    def cancelling(self) -> bool:
        task = asyncio.current_task()
        return task is not None and task.cancelling() > 0

    async def wait_for(self, awaitable: Awaitable[T], timeout: float | None) -> T:
        if timeout is None:
            return await awaitable
        task = asyncio.current_task()
        requested = task.cancelling() if task is not None else 0
        delay = max(0.0, timeout) * self.time_scale
        try:
            if delay <= 0:  # wait_for cancels the work before it runs: nothing of its own to tell
                return await asyncio.wait_for(awaitable, 0)
            outcome = await asyncio.wait_for(_marking_own_timeouts(awaitable), delay)
        except _OwnTimeout as own:  # the awaited work's own TimeoutError, not this deadline's
            _free_wait_for_frame(own)
            # ``own`` becomes the error's __context__ and this frame joins its traceback: neither may
            # hold the error, or every provider timeout (a cut stream is one) lives on in a cycle
            # only the collector frees.
            error, own.error = own.error, None
            try:
                raise error from error.__cause__
            finally:
                del error  # (dropping the name is the point)
        except TimeoutError as error:
            _free_wait_for_frame(error)
            # say which deadline, as SimPyRuntime does ("timed out after 60 s (virtual)")
            raise DeadlineExceeded(f"timed out after {timeout:g} s") from error.__cause__
        except BaseException as error:  # the work's failure (or a cancellation), passed on as is
            _free_wait_for_frame(error)
            raise
        finally:
            # Python 3.11's wait_for drops a cancellation of this task that arrives in the same
            # loop iteration as the inner outcome (it returns/raises that outcome instead).
            # Deliver it, as SimPyRuntime and Python >= 3.12 do.
            if task is not None and task.cancelling() > requested:
                raise asyncio.CancelledError()
        if type(outcome) is _EndedWhenCancelled:  # the timeout wins over what the cancelled work did
            raise DeadlineExceeded(f"timed out after {timeout:g} s") from outcome.error
        return outcome

    def call_soon(self, callback: Callable[[], None], *, name: str | None = None) -> None:
        """``loop.call_soon``: an exception ``callback`` raises goes to the loop's exception handler."""
        self.loop.call_soon(callback)

    def call_later(
        self, delay: float, callback: Callable[[], None], *, name: str | None = None
    ) -> asyncio.TimerHandle:
        """``loop.call_later`` in scheduler seconds (scaled by ``time_scale``)."""
        return self.loop.call_later(max(0.0, delay) * self.time_scale, callback)

    def wait_readable(self, fileno: int) -> Awaitable[None]:
        """Resolve when the file descriptor ``fileno`` has data to read (e.g. a PostgreSQL ``LISTEN``
        connection that received a notification). Optional runtime capability: real I/O exists only
        on this runtime, so scheduler code checks for it and falls back to polling elsewhere.

        Several waiters may wait on one descriptor; all are woken together.
        """
        future: asyncio.Future[None] = self.loop.create_future()
        waiters = self._readers.setdefault(fileno, [])
        # Registered anew on every wait: the descriptor may have been closed since, and its number
        # taken by a new socket (a LISTEN connection made again), which the loop's selector would
        # otherwise never watch (seen in review: woken only by the safety poll).
        self.loop.remove_reader(fileno)
        self.loop.add_reader(fileno, self._readable, fileno)
        waiters.append(future)
        future.add_done_callback(partial(self._forget_reader, fileno))
        return future

    def _readable(self, fileno: int) -> None:
        self.loop.remove_reader(fileno)
        for future in self._readers.pop(fileno, ()):
            if not future.done():
                future.set_result(None)

    def _forget_reader(self, fileno: int, future: asyncio.Future[None]) -> None:
        """A wait that was cancelled (a timeout) stops watching: no waiter, no registration left."""
        if not future.cancelled():
            return
        waiters = self._readers.get(fileno)
        if waiters is None or future not in waiters:
            return
        waiters.remove(future)
        if not waiters:
            del self._readers[fileno]
            self.loop.remove_reader(fileno)

    def run(self, coro: Coroutine[Any, Any, T], *, until: float | None = None) -> T:
        """Run ``coro`` as the main task on a fresh event loop and return its result.

        With ``until`` (scheduler seconds on this runtime's clock), the main task is cancelled at
        that time and :class:`~aiqsim.runtime.protocol.Cancelled` propagates, as on
        :meth:`SimPyRuntime.run <aiqsim.runtime.SimPyRuntime.run>`.
        """

        async def _main() -> T:
            loop = self._loop = asyncio.get_running_loop()
            main = loop.create_task(coro)
            if until is not None:
                loop.call_at(self._origin + until * self.time_scale, main.cancel)
            return await main

        return asyncio.run(_main())
