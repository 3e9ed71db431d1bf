"""Waiting for a shared outcome: the one way task and job handles wait for completion.

A :class:`~aiqsim.scheduler.scheduler.Submission` and a :class:`~aiqsim.scheduler.jobs.JobHandle`
both hand their callers a view of one outcome that the scheduler resolves once, however many
callers wait on it. The outcome lives on the scheduler's in-process state of the work (an
:class:`OutcomeHolder`: a task's :class:`~aiqsim.scheduler.live.LiveTask`, a job's run), and a
future is made for it only when a caller waits before it is known: most simulated tasks are never
awaited one by one (a run ends with ``join()``), and a future per task was 1.8% of an M/M/c
customer's instructions. :func:`resolve` and :func:`resolve_with_error` are how the
scheduler ends an outcome; :func:`await_outcome` how a handle waits for it.

Each caller must wait through a future of its own: asyncio cancels the future a cancelled awaiter
was awaiting, so a caller that gave up (a timeout, a cancelled task) would otherwise cancel the
shared future under every other waiter. :func:`await_own` is that rule, and :class:`OutcomeHandle`
the handle shape built on it; all run on any runtime of the protocol (asyncio or SimPy), since
they only use :class:`~aiqsim.runtime.protocol.Future`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from aiqsim.core.errors import SchedulingError
from aiqsim.runtime.protocol import Future

R = TypeVar("R")

__all__ = [
    "OutcomeAlreadySetError",
    "OutcomeHandle",
    "OutcomeHolder",
    "PendingOutcome",
    "await_outcome",
    "await_own",
    "outcome_known",
    "relay",
    "resolve",
    "resolve_with_error",
]


class OutcomeHolder(Protocol):
    """Where one unit of work's outcome is kept until every handle has read it.

    ``outcome`` is the final value (never ``None`` once set), ``outcome_error`` the exception the
    work ended with instead; ``future`` is made by the first caller that has to wait, and resolved
    with the outcome when it comes. Only :func:`resolve` and :func:`resolve_with_error` set them.
    """

    future: Future[Any] | None
    outcome: Any
    outcome_error: BaseException | None


@dataclass(eq=False, slots=True)
class PendingOutcome:
    """The plain :class:`OutcomeHolder`: an outcome with nothing else kept beside it."""

    future: Future[Any] | None = None
    outcome: Any = None
    outcome_error: BaseException | None = None


class OutcomeAlreadySetError(SchedulingError, RuntimeError):
    """An outcome was resolved twice: a scheduler bug, raised rather than overwriting the first."""


def outcome_known(holder: OutcomeHolder) -> bool:
    """True once ``holder``'s outcome (a value or an exception) is set."""
    return holder.outcome is not None or holder.outcome_error is not None


def resolve(holder: OutcomeHolder, outcome: Any) -> None:
    """End ``holder`` with ``outcome`` (not ``None``) and wake whoever waits on it."""
    if holder.outcome is not None or holder.outcome_error is not None:
        raise OutcomeAlreadySetError(f"outcome already set; refused {outcome!r}")
    holder.outcome = outcome
    if holder.future is not None:
        holder.future.set_result(outcome)


def resolve_with_error(holder: OutcomeHolder, error: BaseException) -> None:
    """End ``holder`` with ``error``, which every handle's wait then raises."""
    if holder.outcome is not None or holder.outcome_error is not None:
        raise OutcomeAlreadySetError(f"outcome already set; refused {error!r}")
    holder.outcome_error = error
    if holder.future is not None:
        holder.future.set_exception(error)


async def await_outcome(holder: OutcomeHolder, new_future: Callable[[], Future[Any]]) -> Any:
    """``holder``'s outcome (or its exception raised), waiting for it if it is not known yet.

    A known outcome is returned without a future; otherwise the holder's shared future is made
    (once, by the first waiter) and awaited through a future of this caller's own (:func:`await_own`).
    """
    if holder.outcome is not None:
        return holder.outcome
    if holder.outcome_error is not None:
        raise holder.outcome_error
    future = holder.future
    if future is None:
        future = holder.future = new_future()
    return await await_own(future, new_future)


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

    ``id`` and ``key`` name the work; :meth:`done` and :meth:`wait` read its
    :class:`OutcomeHolder` (:func:`await_outcome`); ``await handle`` is :meth:`result`, which each
    subclass defines (it turns the final record into a value or raises the subclass's failure
    errors). ``new_future`` is the runtime's ``create_future``.
    """

    __slots__ = ("_holder", "_new_future", "id", "key")

    #: The name ``repr`` shows (kept per class so a subclass's repr does not change by accident).
    _repr_name: ClassVar[str] = "OutcomeHandle"

    def __init__(
        self,
        work_id: str,
        key: str,
        holder: OutcomeHolder,
        new_future: Callable[[], Future[Any]],
    ) -> None:
        self.id = work_id
        self.key = key
        self._holder = holder
        self._new_future = new_future

    def done(self) -> bool:
        """True once the work reached a terminal state in this scheduler (or its outcome was lost)."""
        holder = self._holder
        return holder.outcome is not None or holder.outcome_error is not None

    async def wait(self) -> R:
        """The final record; raises only what the scheduler ended the outcome with."""
        return await await_outcome(self._holder, self._new_future)  # type: ignore[no-any-return]

    async def result(self) -> Any:
        """The work's result, or its failure raised (defined by each kind of handle)."""
        raise NotImplementedError

    def __await__(self) -> Generator[Any, None, Any]:
        return self.result().__await__()

    def __repr__(self) -> str:
        return f"<{self._repr_name} {self.id} {'done' if self.done() else 'pending'}>"
