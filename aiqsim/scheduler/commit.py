"""Group commit, the scheduler side: flush a deferring store's staged writes once per short window.

A store whose ``deferred_commit`` is true (``SqliteStore(path, group_commit=True)``) only
*stages* each write in an open transaction (its own reads see it) and makes everything staged
durable in one transaction and one fsync when ``flush()`` is called; a failed flush rolls all of
it back and raises :class:`~aiqsim.stores.base.StoreWriteError`. Transitions arriving within
``window_s`` of one another then share one fsync, which is what lets a durable store keep up
with a fast provider.

Durability is unchanged because the scheduler waits for the flush that covers a write at every
point where the write must be durable (see :class:`~aiqsim.scheduler.Scheduler`): a provider call
is sent only after its ``running`` write is committed, a submission resolves only after its
terminal write is committed, and ``Submission.accepted()`` resolves once the submission's own
record is. This module only keeps the batches: who wrote into the open one, who waits for it,
and one timer per open batch. What to do with the tasks of a failed batch is the scheduler's rule.

A failed flush is taken as the loss of every write of its batch. That errs on the safe side: a
store may raise from ``flush()`` for writes an earlier failure had already rolled back even
though it committed the later ones (``SqliteStore`` does, after SQLite drops the open
transaction under a failed write); their tasks are then reported lost although their records
are durable, which a resubmission of the key or ``recover()`` sorts out, and never the reverse.

Futures handed out resolve with ``None`` (committed) or with the :class:`StoreWriteError`
(rolled back) as their *value*, never as an exception: nobody is obliged to look at them, and a
failure nobody awaited must not turn into an "exception was never retrieved" warning.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiqsim.core.errors import ConfigurationError
from aiqsim.runtime.protocol import Future, Runtime, TaskHandle
from aiqsim.stores.base import StoreWriteError

DEFAULT_COMMIT_WINDOW_S = 0.002
"""Two milliseconds: short next to a provider call, long enough to gather a burst of transitions."""

__all__ = ["DEFAULT_COMMIT_WINDOW_S", "GroupCommit", "check_commit_window", "defers_commits"]


def defers_commits(store: Any) -> bool:
    """Whether ``store`` stages writes until ``flush()`` (the group-commit interface)."""
    return bool(getattr(store, "deferred_commit", False))


def check_commit_window(window_s: float) -> float:
    """A commit window is a finite number of seconds >= 0 (0: flush at the next step of the loop)."""
    if (
        isinstance(window_s, bool)
        or not isinstance(window_s, int | float)
        or not 0 <= window_s < float("inf")
    ):
        raise ConfigurationError(f"commit_window_s must be a finite number of seconds >= 0, got {window_s!r}")
    return float(window_s)


class GroupCommit:
    """The open batch of staged writes of one deferring store, and its flush timer.

    ``staged(task_id)`` is called after every write the scheduler stages; the first write of a
    batch starts a timer that flushes the batch ``window_s`` later. ``durable()`` gives a future
    for the flush covering every write staged so far. On a failed flush, every waiter gets the
    error and ``on_failure(task_ids, error)`` hears which tasks had writes in the batch.
    """

    def __init__(
        self,
        runtime: Runtime,
        store: Any,
        window_s: float,
        on_failure: Callable[[frozenset[str], StoreWriteError], None],
    ) -> None:
        self.runtime = runtime
        self.store = store
        self.window_s = check_commit_window(window_s)
        self._on_failure = on_failure
        self._writers: set[str] = set()
        self._waiters: list[Future[StoreWriteError | None]] = []
        self._dirty = False
        self._timer: TaskHandle[None] | None = None
        self.flushes = 0
        """Flushes made (committed or not)."""
        self.failed_flushes = 0
        """Flushes that failed and rolled their batch back."""

    @property
    def pending(self) -> bool:
        """Whether writes are staged and not yet flushed."""
        return self._dirty

    def staged(self, task_id: str | None) -> None:
        """A write was staged (on behalf of ``task_id``, if a task's); make sure a flush will follow."""
        if task_id is not None:
            self._writers.add(task_id)
        self._dirty = True
        if self._timer is None:
            self._timer = self.runtime.spawn(self._flush_later(), name="group-commit")

    def durable(self) -> Future[StoreWriteError | None]:
        """A new future: resolved with ``None`` once every write staged so far is committed, or with
        the :class:`StoreWriteError` of the flush that rolled them back. Each caller gets its own
        future, so a caller that is cancelled cannot cancel anyone else's wait."""
        future: Future[StoreWriteError | None] = self.runtime.create_future()
        if self._dirty:
            self._waiters.append(future)
        else:
            future.set_result(None)
        return future

    async def _flush_later(self) -> None:
        await self.runtime.sleep(self.window_s)
        self._timer = None
        self.flush()

    def flush(self) -> None:
        """Flush the open batch now (nothing to do when nothing is staged)."""
        if not self._dirty:
            return
        waiters, self._waiters = self._waiters, []
        writers, self._writers = frozenset(self._writers), set()
        self._dirty = False
        self.flushes += 1
        outcome: StoreWriteError | None = None
        try:
            self.store.flush()
        except Exception as error:  # whatever it is, nothing staged is known to be durable
            self.failed_flushes += 1
            if isinstance(error, StoreWriteError):
                outcome = error
            else:
                outcome = StoreWriteError(f"group commit of the writes of {len(writers)} task(s)", error)
                outcome.__cause__ = error
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(outcome)
        if outcome is not None:
            self._on_failure(writers, outcome)

    def stop(self, *, flush: bool) -> None:
        """Stop the timer; with ``flush``, first commit what is staged (a clean close). Without it
        (a crash) the staged writes are left to the store, which loses them when it is closed."""
        if flush:
            self.flush()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
