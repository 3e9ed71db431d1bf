"""What a scheduler keeps in memory about a task that is not yet terminal in this process."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aiqsim.core.slot_init import compile_builder
from aiqsim.core.task import TaskRecord, TaskStatus
from aiqsim.runtime.protocol import Future, TaskHandle
from aiqsim.scheduler.dispatch import QueueItem
from aiqsim.scheduler.retry import RetryPolicy
from aiqsim.scheduler.streams import StreamChannel
from aiqsim.stores.base import StoreWriteError


@dataclass(eq=False, slots=True)
class LiveTask:
    """In-process state of a task that is not yet terminal here, and the
    :class:`~aiqsim.scheduler.handles.OutcomeHolder` its handles read (kept by them after the
    task leaves the scheduler's live set)."""

    record: TaskRecord
    future: Future[TaskRecord] | None = None
    """Made by the first handle that waits before the outcome is known (see aiqsim.scheduler.handles)."""
    queue_item: QueueItem | None = None
    runner: TaskHandle[None] | None = None
    started: bool = False
    cancel_requested: bool = False
    waiting_on: str | None = None
    finishing: bool = False
    """The terminal write is staged and waits for its group commit; the task can no longer change."""
    lost: StoreWriteError | None = None
    """Set when the task's record was rolled back before its runner started: it must not run."""
    retry: RetryPolicy | None = None  # this task's own policy (a job stage's), else the scheduler's
    outcome: TaskRecord | None = None
    """The terminal record, once durable (set by :func:`~aiqsim.scheduler.handles.resolve`)."""
    outcome_error: BaseException | None = None  # a StoreWriteError; typed as OutcomeHolder declares it
    """Why the outcome was lost instead (set by :func:`~aiqsim.scheduler.handles.resolve_with_error`)."""
    in_call: bool = False
    """A call of this task is at the provider now, its answer awaited (set by the attempt loop)."""
    last_attempt: bool = False
    """No attempt may start after the one at the provider (its job failed): a retry ends the task
    ``cancelled`` instead of being sent."""
    stream: StreamChannel | None = None
    """Set for a task submitted with ``stream=True``: where its attempt hands chunks to the caller
    (:mod:`aiqsim.scheduler.streams`)."""
    route: str | None = None
    """The route this task was submitted through (its retries may move among the route's providers:
    :mod:`aiqsim.scheduler.routes`); ``None`` for a task submitted to a provider."""


new_live_task: Callable[..., LiveTask] = compile_builder(LiveTask)
"""``LiveTask(...)`` without the cost of a class call (one per submission; see
:func:`aiqsim.core.slot_init.compile_builder`)."""


@dataclass(frozen=True, slots=True)
class UnpersistedChange:
    """A task whose change this process could not persist: what was lost, and the terminal record
    it was to write (``None`` unless it was an outcome), which the scheduler writes again in the
    background (or a later duplicate of its key writes late, whichever comes first)."""

    what: str
    outcome: TaskRecord | None
    before: TaskStatus | None = None
    """The status the store still holds (what the outcome's late write moves it from)."""
