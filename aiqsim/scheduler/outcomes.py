"""Status changes: each one written, reported and, once durable, settled.

Every change of a task's status goes through :func:`aiqsim.core.states.transition`, is written to the
store, and is emitted as a :class:`~aiqsim.scheduler.events.TaskTransition`; a terminal one resolves
the submission once its write is durable. A change that could not be persisted follows one rule
(:meth:`Outcomes._lose`). :class:`Outcomes` is one of the parts
:class:`~aiqsim.scheduler.scheduler.Scheduler` is made of.

A terminal record that could not be written (the database was down when the call ended) is not
left to a restart: the task would stay ``running`` in the store for as long as its worker lives, its
lease renewed, so nobody adopts it, and a duplicate in another worker would wait on it for ever.
The scheduler writes it again in the background (:meth:`Outcomes._rewrite_outcomes`), after
:data:`REWRITE_FIRST_S`, then backing off to at most :data:`REWRITE_MAX_S` between tries, with a
:class:`~aiqsim.scheduler.events.StoreWriteFailed` event for each try that fails, until it is
written, the scheduler crashes (a lost lease: another worker adopts the task and reconciles it
with the provider) or closes (one last try; what is still unwritten is left to ``recover()``).
"""

from __future__ import annotations

from typing import Any

from aiqsim.core.failures import describe_error
from aiqsim.core.states import transition_with
from aiqsim.core.task import TaskRecord, TaskStatus
from aiqsim.runtime.protocol import Cancelled, Future, TaskHandle
from aiqsim.scheduler.events import StoreWriteFailed, new_task_transition
from aiqsim.scheduler.handles import outcome_known, resolve, resolve_with_error
from aiqsim.scheduler.live import LiveTask, UnpersistedChange
from aiqsim.scheduler.store_writes import describe_change, persist, persist_change
from aiqsim.stores.base import StoreWriteError

REWRITE_FIRST_S = 0.1
"""Seconds (scheduler time) from a lost terminal write to its first retry: a connection the store
makes again at once (a dropped socket) is written at the next try."""

REWRITE_MAX_S = 2.0
"""The longest wait between two retries of a lost terminal write: once the store is back, the
outcome reaches it (and a duplicate in another worker learns it) within about this long."""


class Outcomes:
    """Every status change written and reported, and the one rule for a change that could not be persisted."""

    __slots__ = ()

    def _write(self, record: TaskRecord, old: TaskRecord | None = None) -> None:
        """Persist ``record`` (raises :class:`StoreWriteError` naming the change if it fails)."""
        if self._crashed:
            raise Cancelled()
        persist_change(old, record, self.store.update)
        commit = self._commit
        if commit is not None:  # _staged, inlined: this runs on every transition
            commit.staged(record.id)

    def _staged(self, task_id: str | None) -> None:
        """Tell the group commit (if the store defers commits) that a write of ``task_id`` is staged."""
        if self._commit is not None:
            self._commit.staged(task_id)

    def _move(self, live: LiveTask, status: TaskStatus, **changes: Any) -> TaskRecord:
        old = live.record
        record = transition_with(old, status, self.runtime.now(), changes)  # changes: our own kwargs dict
        self._write(record, old)
        live.record = record
        if self.events is not None:  # checked here too: no call at all without a sink (hot path)
            self._emit_transition(old.status, record)
        return record

    def _finish(self, live: LiveTask, status: TaskStatus, **changes: Any) -> None:
        """Write the terminal state; resolve the submission once that write is durable.

        A failed write (or group commit) resolves the submission with ``StoreWriteError`` instead.
        """
        old = live.record
        record = transition_with(old, status, self.runtime.now(), changes)  # changes: our own kwargs dict
        try:
            self._write(record, old)
        except StoreWriteError as error:
            self._lose(live, error, outcome=record)
            return
        live.record = record
        try:
            if self.events is not None:
                self._emit_transition(old.status, record)
        finally:  # also when the sink broke: the outcome stands and is still delivered
            if self._commit is None:
                self._settle(live, record)
            else:
                live.finishing = True
                committed = self._commit.durable()  # now: the flush that covers this very write
                live.runner = self.runtime.spawn(
                    self._settle_when_durable(
                        live, record, committed, describe_change(old, record), old.status
                    ),
                    name=f"commit-{record.id}",
                )

    async def _settle_when_durable(
        self,
        live: LiveTask,
        record: TaskRecord,
        committed: Future[StoreWriteError | None],
        lost: str,
        before: TaskStatus,
    ) -> None:
        """Resolve a finished task once the flush covering its terminal write is done. A coroutine,
        not a callback, so that a crash or a failing event sink stops it like any task; a crash
        (``crash()`` cancels it) leaves the handle unresolved, as for a killed process."""
        error = await committed
        if error is None:
            self._settle(live, record)
        else:
            self._lose(live, error, lost, outcome=record, before=before)

    def _settle(self, live: LiveTask, record: TaskRecord) -> None:
        """The terminal record is durable: resolve the submission and its duplicates' waits."""
        task_id, every_live = record.id, self._live
        del every_live[task_id]
        resolve(live, record)
        if task_id in self._waiters:
            self._resolve_waiters(task_id, record)
        jobs = self._jobs
        if jobs is not None:  # a job's next stage is queued in this same instant
            jobs.task_finished(record)
        if not every_live:
            self._idle.notify()

    def _lose(
        self,
        live: LiveTask,
        error: StoreWriteError,
        lost: str | None = None,
        *,
        outcome: TaskRecord | None = None,
        before: TaskStatus | None = None,
    ) -> None:
        """The one rule for a task whose change could not be persisted ("Failed store writes" in the
        :class:`~aiqsim.scheduler.scheduler.Scheduler` docs).

        The submission resolves with ``error``; the task leaves its queue or its owner's wait
        list; duplicates waiting on it resolve with a ``StoreWriteError`` of their own. Quota held
        by a running attempt is the caller's to give back. The store keeps the task's last
        persisted state for :meth:`recover`; ``outcome`` (the terminal record that was not
        written) is kept so that it is written again in the background (:meth:`_rewrite_outcomes`)
        or by a later duplicate of the key (:meth:`_follow_unpersisted`); ``before`` is the status
        the store still holds (by default the live record's: the change was never applied here).
        """
        record = live.record
        if self._live.get(record.id) is not live:
            return  # already resolved (e.g. a rolled-back batch and its own failed wait)
        del self._live[record.id]
        what = lost if lost is not None else error.what
        self._unpersisted[record.id] = UnpersistedChange(
            what, outcome, before if before is not None else record.status
        )
        self.store_write_failures += 1
        if live.queue_item is not None:
            lane = self._lanes[record.provider]
            lane.queues[record.priority].pop(live.queue_item)
            self._queued[record.priority] -= 1
            live.queue_item = None
            lane.pump.wake()
        if live.waiting_on is not None:
            waiters = self._waiters.get(live.waiting_on)
            if waiters and record.id in waiters:
                waiters.remove(record.id)
            live.waiting_on = None
        if self.events is not None:
            self.events(
                StoreWriteFailed(
                    time=self.runtime.now(),
                    task_id=record.id,
                    key=record.key,
                    provider=record.provider,
                    lost=what,
                    error=describe_error(error),
                )
            )
        if not outcome_known(live):
            resolve_with_error(live, error)
        for waiter_id in self._waiters.pop(record.id, ()):
            waiter = self._live.get(waiter_id)
            if waiter is not None and waiter.waiting_on == record.id:
                waiter.waiting_on = None
                self._lose_duplicate(waiter, record.id)
        if self._jobs is not None:  # a job's stage that will not end here: the job must not wait on it
            self._jobs.task_lost(record.id, error)
        if outcome is not None:
            self._rewrite_later()
        if not self._live:
            self._idle.notify()

    def _rewrite_later(self) -> None:
        """Make sure the coroutine that writes lost outcomes again is running (see the module docs)."""
        if self._rewriter is None and not self._crashed:
            own: list[TaskHandle[None]] = []  # the new rewriter's own handle: its ownership token
            self._rewriter = self.runtime.spawn(self._rewrite_outcomes(own), name="rewrite-outcomes")
            own.append(self._rewriter)  # before it first runs (spawned work starts once we yield)

    async def _rewrite_outcomes(self, own: list[TaskHandle[None]]) -> None:
        """Write every lost terminal record again until none is left: a try after
        :data:`REWRITE_FIRST_S`, then twice as long after each try that failed, up to
        :data:`REWRITE_MAX_S`; back to the first delay once a write went through.

        ``own`` holds this rewriter's handle: when it ends it forgets :attr:`_rewriter` only if
        that is still itself. A rewriter cancelled by :meth:`_last_rewrite` ends later, at its next
        step; a write lost in between starts a new one, which the old one's ``finally`` used to
        forget: the new one then ran on unseen (never cancelled by the close, a second one started
        beside it by the next loss)."""
        delay = REWRITE_FIRST_S
        try:
            while not self._crashed and self._outcomes_to_rewrite():
                await self.runtime.sleep(delay)
                delay = REWRITE_FIRST_S if await self._rewrite_pending() else min(REWRITE_MAX_S, 2 * delay)
        finally:
            if own and self._rewriter is own[0]:
                self._rewriter = None

    def _outcomes_to_rewrite(self) -> list[str]:
        return [task_id for task_id, change in self._unpersisted.items() if change.outcome is not None]

    async def _rewrite_pending(self) -> bool:
        """One try at each lost terminal record, oldest first; stops at the first that fails (the
        store is still away). True when every one was written."""
        for task_id in self._outcomes_to_rewrite():
            change = self._unpersisted.get(task_id)
            if self._crashed:
                return False
            if change is None or change.outcome is None:
                continue  # written meanwhile (a duplicate of its key wrote it late)
            outcome = change.outcome
            try:
                persist(change.what, self.store.update, outcome)
                if self._commit is not None:
                    self._commit.staged(task_id)
                    failed = await self._commit.durable()
                    if failed is not None:
                        raise failed
            except StoreWriteError as error:
                self._report_rewrite_failed(outcome, change.what, error)
                return False
            except (ValueError, TypeError) as error:  # the data itself cannot be stored: never will be
                self._report_rewrite_failed(outcome, change.what, error)
                self._unpersisted[task_id] = UnpersistedChange(change.what, None, change.before)
                continue
            if self._unpersisted.get(task_id) is change:
                del self._unpersisted[task_id]
            self._emit_transition(change.before, outcome)
        return True

    def _report_rewrite_failed(self, outcome: TaskRecord, what: str, error: BaseException) -> None:
        if self.events is not None:
            self.events(
                StoreWriteFailed(
                    time=self.runtime.now(),
                    task_id=outcome.id,
                    key=outcome.key,
                    provider=outcome.provider,
                    lost=f"{what} (written again later)",
                    error=describe_error(error),
                )
            )

    async def _last_rewrite(self) -> None:
        """On a clean close: one more try at the lost outcomes, then stop retrying (what is still
        unwritten stays ``running`` in the store, for ``recover()``)."""
        if self._rewriter is not None:
            self._rewriter.cancel()
            self._rewriter = None
        if self._outcomes_to_rewrite() and not self._crashed:
            await self._rewrite_pending()

    def _lose_duplicate(self, live: LiveTask, owner_id: str) -> None:
        """``live`` shares the run of ``owner_id``, whose outcome this process could not persist."""
        what = self._unpersisted[owner_id].what
        error = StoreWriteError(
            f"task {live.record.id!r} is a duplicate of task {owner_id!r}, whose change was not "
            f"persisted ({what}); recover() after a restart reconciles it"
        )
        self._lose(live, error)

    def _batch_lost(self, task_ids: frozenset[str], error: StoreWriteError) -> None:
        """A group commit failed: every task with a write in it that is not itself waiting on that
        commit (those see the error and call :meth:`_lose` themselves) is lost now."""
        for task_id in sorted(task_ids):
            live = self._live.get(task_id)
            if live is None or live.finishing:
                continue
            if live.runner is not None:
                if live.started:
                    continue  # waits on its running write's commit and resolves itself
                live.lost = error  # dispatched, not started: _run gives its reservation back
            self._lose(live, error, f"task {task_id!r}: {live.record.status.value} record rolled back")

    def _emit_transition(self, old: TaskStatus | None, record: TaskRecord) -> None:
        # positional, in TaskTransition's field order: this runs several times per call; ``_value_``
        # is the enum's plain value (``.value`` goes through a descriptor, measurably slower here)
        if self.events is not None:
            self.events(
                new_task_transition(
                    record.updated_at,
                    record.id,
                    record.key,
                    record.provider,
                    int(record.priority),
                    None if old is None else old._value_,
                    record.status._value_,
                    record.attempts,
                    record.cost_estimate,
                    record.tenant,
                )
            )
