"""A streamed task's chunks, handed from its attempt to the caller as they arrive.

``submit(..., stream=True)`` gives the task a :class:`StreamChannel`. The attempt loop runs the
task's attempts through the provider's ``stream()`` (when it has one) and pushes each
:class:`~aiqsim.scheduler.provider.StreamChunk` into the channel the moment it arrives; the caller
reads them with ``async for chunk in submission.stream()`` (:func:`stream_chunks`). The scheduler
keeps everything else it owns for any task: the quota is reserved before the attempt and reconciled
with the usage the stream ends with, and an attempt that fails before its first chunk is retried
without the caller seeing anything of it.

The rules the caller sees:

- Chunks flow from one attempt only: the first one that delivered a chunk. Once a chunk was handed
  over, a failure of that attempt is a cut (:class:`~aiqsim.core.failures.StreamCutError`, billed):
  the iterator raises :class:`StreamInterruptedError` after the chunks received. The task itself goes
  on under the scheduler's cut rule (a provider ``lookup``, a re-send under an honoured idempotency
  key, else it fails saying the answer was billed and cut): ``await submission`` tells its outcome.
- A task that is not streamed chunk by chunk (its provider has no ``stream()``, it is a duplicate of
  a key another submission runs, it was resumed by ``recover()``) yields its whole result as one
  chunk once it succeeded. So a duplicate submission never streams live: it gets the owner's result.
- A task that fails or is cancelled before any chunk makes the iterator raise what ``await
  submission`` raises (``TaskFailedError``, ``TaskCancelledError``, ``StoreWriteError``).
- The chunks are buffered (a slow reader never holds the provider's connection or the quota); one
  reader per task: a second ``stream()`` on the same task raises :class:`StreamAlreadyReadError`.

Runtime-agnostic: waiting uses only the runtime's futures, so it runs on asyncio and SimPy alike.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiqsim.core.errors import SchedulingError
from aiqsim.runtime.protocol import Future
from aiqsim.scheduler.handles import OutcomeHolder, outcome_known
from aiqsim.scheduler.provider import StreamChunk

__all__ = ["StreamAlreadyReadError", "StreamChannel", "StreamInterruptedError", "stream_chunks"]


class StreamInterruptedError(SchedulingError):
    """The streamed attempt stopped after some chunks reached the caller (the server billed it).

    ``cut`` is the attempt's :class:`~aiqsim.core.failures.StreamCutError`, ``chunks`` how many chunks
    were handed over. The task is not over: ``await submission`` gives the whole answer when the
    scheduler recovered it (``lookup``, or a re-send under an honoured idempotency key), or raises the
    task's failure."""

    def __init__(self, task_id: str, cut: BaseException, chunks: int) -> None:
        super().__init__(
            f"task {task_id!r}: the stream was cut after {chunks} chunk(s) ({cut}); the answer was "
            "billed. Await the submission for the task's outcome (recovered by lookup or an "
            "idempotent re-send, else failed)"
        )
        self.task_id = task_id
        self.cut = cut
        self.chunks = chunks

    def __reduce__(self) -> tuple[type[StreamInterruptedError], tuple[str, BaseException, int]]:
        return type(self), (self.task_id, self.cut, self.chunks)  # picklable across processes


class StreamAlreadyReadError(SchedulingError, RuntimeError):
    """``stream()`` was called a second time on one task: its chunks go to one reader."""


class StreamChannel:
    """The buffer between a streamed task's attempt (the writer) and its one reader."""

    __slots__ = ("_items", "_new_future", "_waiter", "completed", "delivered", "interrupted", "open", "taken")

    def __init__(self, new_future: Callable[[], Future[Any]]) -> None:
        self._new_future = new_future
        self._items: deque[StreamChunk] = deque()
        self._waiter: Future[Any] | None = None
        self.delivered = 0
        """Chunks pushed so far (by the one attempt that streamed)."""
        self.open = True
        """Whether chunks are still taken: closed once the streaming attempt ended (done or cut)."""
        self.completed = False
        """The streaming attempt ended with its response: every chunk is in."""
        self.interrupted: BaseException | None = None
        """The cut that ended the streaming attempt after its first chunk, if one did."""
        self.taken = False

    @property
    def started(self) -> bool:
        """Whether a chunk reached the caller's buffer (a later failure is a cut)."""
        return self.delivered > 0

    def push(self, chunk: StreamChunk) -> None:
        """Hand ``chunk`` to the reader (ignored once the streaming attempt ended)."""
        if not self.open:
            return
        self._items.append(chunk)
        self.delivered += 1
        self.wake()

    def complete(self) -> None:
        """The streaming attempt ended with its response: no more chunks."""
        self.open = False
        self.completed = True
        self.wake()

    def interrupt(self, cut: BaseException) -> None:
        """The streaming attempt was cut after its first chunk: no more chunks from any attempt."""
        if not self.open:
            return
        self.open = False
        self.interrupted = cut
        self.wake()

    def drop_cut_tracebacks(self) -> None:
        """Called when the task is over: the cut (and the failures chained to it) keep their messages
        and attributes but lose their tracebacks. Those hold the frames of the attempt that pushed into
        this channel, and the frames hold the channel (and the task), which holds the cut: a cycle per
        cut stream that only the collector would free."""
        seen: set[int] = set()
        error = self.interrupted
        pending = [] if error is None else [error]
        while pending:
            error = pending.pop()
            if id(error) in seen:
                continue
            seen.add(id(error))
            error.__traceback__ = None
            pending.extend(link for link in (error.__cause__, error.__context__) if link is not None)

    def wake(self) -> None:
        """Wake the reader, if it waits."""
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def wait(self) -> Future[Any]:
        """A future resolved at the next change (a chunk, the end, a cut, the task's outcome)."""
        if self._waiter is None:
            self._waiter = self._new_future()
        return self._waiter


async def stream_chunks(
    task_id: str,
    holder: OutcomeHolder,
    channel: StreamChannel | None,
    new_future: Callable[[], Future[Any]],
    result: Callable[[], Awaitable[Any]],
) -> AsyncIterator[StreamChunk]:
    """The chunks of the task held by ``holder`` (rules: the module docstring). ``result`` is the
    handle's ``result`` (the whole answer, or the task's failure raised)."""
    if channel is None:  # not streamed: the whole result, once known, as one chunk
        yield StreamChunk(await result())
        return
    if channel.taken:
        raise StreamAlreadyReadError(
            f"task {task_id!r}: its stream is already being read; one reader per task"
        )
    channel.taken = True
    if not outcome_known(holder):  # the task's end wakes the reader too (a failure before any chunk)
        if holder.future is None:
            holder.future = new_future()
        holder.future.add_done_callback(lambda _done: channel.wake())
    items = channel._items
    while True:
        while items:
            yield items.popleft()
        if channel.interrupted is not None:
            raise StreamInterruptedError(task_id, channel.interrupted, channel.delivered)
        if channel.completed:
            return
        if outcome_known(holder):
            answer = await result()  # raises the task's failure
            if channel.delivered == 0:
                yield StreamChunk(answer)
            return
        await channel.wait()
