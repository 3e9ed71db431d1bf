"""Waiting for a shared outcome: the one way task and job handles wait for completion.

A :class:`~aiqsim.scheduler.scheduler.Submission` and a :class:`~aiqsim.scheduler.jobs.JobHandle`
both hand their callers a view of one future that the scheduler resolves once, however many
callers wait on it. Each caller must wait through a future of its own: asyncio cancels the
future a cancelled awaiter was awaiting, so a caller that gave up (a timeout, a cancelled task)
would otherwise cancel the shared future under every other waiter. :func:`await_own` is that
rule, and :class:`OutcomeHandle` the handle shape built on it; both run on any runtime of the
protocol (asyncio or SimPy), since they only use :class:`~aiqsim.runtime.protocol.Future`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, ClassVar, Generic, TypeVar

from aiqsim.runtime.protocol import Future

R = TypeVar("R")

__all__ = ["OutcomeHandle", "await_own", "relay"]


def relay(source: Future[Any], target: Future[Any]) -> None:
    """Copy a finished future's outcome (result or exception) into ``target`` unless it is done.

    A cancelled ``source`` is not copied: the shared futures handles wait on are never cancelled
    by the scheduler, and a cancelled awaiter has already given up on ``target``.
    """
    if target.done() or source.cancelled():
        return
    try:
        value = source.result()
    except Exception as error:  # the runtime protocol has no exception(): result() re-raises it
        target.set_exception(error)
    else:
        target.set_result(value)


async def await_own(future: Future[Any], new_future: Callable[[], Future[Any]] | None) -> Any:
    """Await a shared future through a future of one's own.

    asyncio cancels the future a cancelled awaiter was awaiting: each awaiter gets its own (from
    ``new_future``, the runtime's ``create_future``), so a caller that gives up cannot cancel the
    shared one. A finished future (or no ``new_future``) is awaited directly.
    """
    if future.done() or new_future is None:
        return await future
    waiter = new_future()
    future.add_done_callback(lambda done: relay(done, waiter))
    return await waiter


class OutcomeHandle(Generic[R]):
    """A caller's handle on one scheduled unit of work (a task or a job) and its final record.

    ``id`` and ``key`` name the work; :meth:`done` and :meth:`wait` look at the shared future
    through :func:`await_own`; ``await handle`` is :meth:`result`, which each subclass defines
    (it turns the final record into a value or raises the subclass's failure errors).
    """

    __slots__ = ("_future", "_new_future", "id", "key")

    #: The name ``repr`` shows (kept per class so a subclass's repr does not change by accident).
    _repr_name: ClassVar[str] = "OutcomeHandle"

    def __init__(
        self,
        work_id: str,
        key: str,
        future: Future[R],
        new_future: Callable[[], Future[R]] | None = None,
    ) -> None:
        self.id = work_id
        self.key = key
        self._future = future
        self._new_future = new_future

    def done(self) -> bool:
        """True once the work reached a terminal state in this scheduler (or its outcome was lost)."""
        return self._future.done()

    async def wait(self) -> R:
        """The final record; raises only what the scheduler resolved the shared future with."""
        return await await_own(self._future, self._new_future)

    async def result(self) -> Any:
        """The work's result, or its failure raised (defined by each kind of handle)."""
        raise NotImplementedError

    def __await__(self) -> Generator[Any, None, Any]:
        return self.result().__await__()

    def __repr__(self) -> str:
        return f"<{self._repr_name} {self.id} {'done' if self.done() else 'pending'}>"
