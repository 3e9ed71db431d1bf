"""Idempotency claims and duplicates: what happens to a task whose key is already owned.

The owner of a key runs; a duplicate of a finished owner ends ``deduped`` at once; a duplicate of an
owner in flight waits for its outcome (and lifts a lower-priority owner to its own class); an owner in
another process sharing the store is watched until it ends. :class:`ClaimRules` is one of the parts
:class:`~aiqsim.scheduler.scheduler.Scheduler` is made of: it reads and writes the scheduler's state
(``_live``, ``_waiters``, ``_watchers``), created in ``Scheduler.__init__``.
"""

from __future__ import annotations

from aiqsim.core.task import DEDUPED, SUCCEEDED, Priority, TaskRecord, TaskStatus
from aiqsim.scheduler.foreign_owner import (
    FOREIGN_SAFETY_POLL_S,
    announces_changes,
    outage_may_pass,
    stop_waiting_on_unreadable,
    store_change,
)
from aiqsim.scheduler.handles import outcome_known, resolve_with_error
from aiqsim.scheduler.live import LiveTask
from aiqsim.scheduler.store_writes import persist
from aiqsim.stores.base import StoreClosedError, StoreCorruptError, StoreError, StoreWriteError

SHARED_ENDINGS = (TaskStatus.SUCCEEDED, TaskStatus.FAILED)
"""How an owner's run may end for its waiting duplicates to share it. After any other ending
(cancelled, or the record purged) the key is free and the first waiter takes it over."""


class ClaimRules:
    """Who runs a key: the claim of an idempotency key, duplicates waiting on its owner, priority
    inheritance, and the watch on an owner in another process."""

    __slots__ = ()

    def _follow_owner(self, live: LiveTask, owner: TaskRecord) -> None:
        record = live.record
        task_id = record.id
        if owner.id == task_id:
            self._enqueue(live)
            waiting = self._waiters.get(task_id)
            if waiting:  # waiters attached before this owner was live here (recovery order)
                priorities = [self._live[w].record.priority for w in waiting if w in self._live]
                if priorities:
                    self._inherit_priority(live, min(priorities))
        elif owner.status is SUCCEEDED:
            self._finish(live, DEDUPED, result=owner.result, deduped_from=owner.id)
        elif owner.id in self._unpersisted and owner.id not in self._live:
            self._follow_unpersisted(live, owner)  # its run ended here, unrecorded: never wait for it
        else:
            live.waiting_on = owner.id
            self._waiters.setdefault(owner.id, []).append(record.id)
            owner_live = self._live.get(owner.id)
            if owner_live is not None:
                self._inherit_priority(owner_live, record.priority)
            elif owner.id not in self._watchers:
                self._watchers[owner.id] = self.runtime.spawn(
                    self._watch_foreign_owner(owner.id), name=f"watch-{owner.id}"
                )

    def _follow_unpersisted(self, live: LiveTask, owner: TaskRecord) -> None:
        """``live`` duplicates a key whose owner's run ended in this process without its outcome
        reaching the store (which still says ``owner.status``). Write that outcome now (the disk
        may have room again) and follow the key as usual: a success dedups, a failure frees the
        key. If it cannot be written (or there is no outcome to write: the lost change was the
        ``running`` one), the duplicate resolves with ``StoreWriteError`` at once."""
        outcome = self._unpersisted[owner.id].outcome
        if outcome is not None and owner.id not in self._healing:
            try:
                self._write(outcome, owner)
            except StoreWriteError:
                pass
            else:
                del self._unpersisted[owner.id]  # written: nothing left for the background retries
                self._emit_transition(owner.status, outcome)
                self._healing.add(owner.id)  # a store that still says otherwise cannot loop us
                try:
                    self._claim_and_follow(live)
                finally:
                    self._healing.discard(owner.id)
                return
        self._lose_duplicate(live, owner.id)

    def _claim_and_follow(self, live: LiveTask) -> None:
        """Claim ``live``'s key for it (it is stored already) and follow whoever owns the key."""
        record = live.record
        try:
            owner = persist(f"claim of key {record.key!r} by task {record.id!r}", self.store.claim, record)
        except StoreWriteError as error:
            self._lose(live, error)
            return
        self._staged(record.id)
        self._follow_owner(live, owner)

    def _would_promote(self, owner_id: str, priority: Priority) -> bool:
        """Whether a duplicate of ``priority`` would move its owner, queued here, into a higher queue."""
        return self._promoted_owner(owner_id, priority) is not None

    def _promoted_owner(self, owner_id: str, priority: Priority) -> LiveTask | None:
        """The queued task a duplicate of ``priority`` would move into its higher class (see
        :meth:`_inherit_priority`): its live owner, or, when that owner is itself a duplicate
        waiting on another task, the task it waits on; ``None`` when nothing would move."""
        owner = self._live.get(owner_id)
        for _ in range(len(self._live)):  # a chain of waits, never a cycle: bounded all the same
            if owner is None or owner.waiting_on is None or priority >= owner.record.priority:
                break
            owner = self._live.get(owner.waiting_on)
        if owner is None or owner.queue_item is None or priority >= owner.record.priority:
            return None
        return owner

    def _inherit_priority(self, owner: LiveTask, priority: Priority) -> None:
        """Raise a live owner to its waiter's priority, so no waiter waits behind a lower class.

        Without this, an interactive duplicate of a queued background task waits for the
        background backlog ahead of its owner (priority inversion through dedup). A queued owner
        moves to the waiter's queue (behind the work already queued there); a running owner waiting
        for a retry ticket has its ticket moved; a running owner in backoff asks for its next ticket
        in the new class; an owner whose call is in flight has nothing to move. The new priority is
        the owner's from then on (its record carries it, persisted with its next transition; after
        a crash, :meth:`recover` re-attaches the waiter and the owner inherits again). An owner that
        is itself a duplicate waiting on another task (a job's stage task whose call another task
        makes) passes the priority on to that task.
        """
        old = owner.record.priority
        if priority >= old:
            return
        owner.record = owner.record.evolve(priority=priority)
        if (
            owner.waiting_on is not None
        ):  # itself a duplicate (a job's stage on a shared call): its owner moves
            upstream = self._live.get(owner.waiting_on)
            if upstream is not None:
                self._inherit_priority(upstream, priority)
            return
        lane = self._lanes[owner.record.provider]
        if owner.queue_item is not None:
            lane.queues[old].pop(owner.queue_item)
            self._queued[old] -= 1
            owner.queue_item = None
            self._enqueue(owner)
        else:
            tickets = lane.retries[old]
            for ticket in tickets:
                if ticket.task_id == owner.record.id and not ticket.removed and not ticket.future.done():
                    tickets.remove(ticket)
                    lane.retries[priority].append(ticket)
                    lane.pump.wake()
                    break

    def _resolve_waiters(self, owner_id: str, owner: TaskRecord | None) -> None:
        """The run of ``owner_id`` ended (``owner`` is its terminal record): share it with the
        duplicates waiting on it. ``owner`` is ``None`` when the record is gone from the store (a
        retention purge took it, and its key, between two polls of another process's run): there is
        nothing to share, and the key is free, as after a cancelled owner."""
        waiter_ids = self._waiters.pop(owner_id, ())
        for waiter_id in waiter_ids:
            waiter = self._live.get(waiter_id)
            if waiter is None or waiter.waiting_on != owner_id:
                continue
            waiter.waiting_on = None
            if owner is not None and owner.status in SHARED_ENDINGS:
                self._share_ending(waiter, owner)
            else:  # the owner was cancelled (or purged): the first waiter takes over the key
                self._claim_and_follow(waiter)

    def _share_ending(self, waiter: LiveTask, owner: TaskRecord) -> None:
        """``waiter`` duplicated ``owner``, whose run ended in one of :data:`SHARED_ENDINGS`: it ends
        ``deduped`` with that run's result or error. Used when a live owner ends, and by recovery for a
        duplicate that was waiting when the process stopped (whose owner recovery may have failed as
        interrupted: claiming the key instead would send the call again)."""
        self._finish(waiter, DEDUPED, result=owner.result, error=owner.error, deduped_from=owner.id)

    def _stop_waiting_on(self, owner_id: str, error: StoreError) -> None:
        """The record of ``owner_id``, a run in another process, cannot be read and reading it again
        cannot help (a corrupt record, a closed store). Rather than wait for ever, each duplicate
        waiting on it leaves this process: an :class:`~aiqsim.scheduler.events.OwnerUnreadable`
        event says so (:func:`~aiqsim.scheduler.foreign_owner.stop_waiting_on_unreadable`), its
        submission resolves with an error of the same kind, and its stored record stays ``queued``
        for :meth:`recover` to decide once the store can be read. :attr:`anomalies` counts
        ``"owner_unreadable"``."""
        self.anomalies["owner_unreadable"] += 1
        kind = StoreClosedError if isinstance(error, StoreClosedError) else StoreCorruptError
        stopped = stop_waiting_on_unreadable(
            owner_id, error, self._waiters, self._live, kind="task", now=self.runtime.now(), emit=self.events
        )
        for waiter in stopped:
            waiter_id = waiter.record.id
            if self._live.get(waiter_id) is not waiter:  # ended meanwhile (an earlier one's job failing)
                continue
            del self._live[waiter_id]
            lost = kind(
                f"task {waiter_id!r} duplicates task {owner_id!r} of another process, whose "
                f"record cannot be read ({error}); its own record stays queued for recover()"
            )
            if not outcome_known(waiter):
                resolve_with_error(waiter, lost)
            if self._jobs is not None:
                self._jobs.task_lost(waiter_id, lost)
        if not self._live:
            self._idle.notify()

    async def _watch_foreign_owner(self, owner_id: str) -> None:
        """Wait until the run of a key owned by another process is terminal.

        A store that announces terminal transitions (PostgreSQL's ``NOTIFY``) on a runtime that can
        wait on a descriptor wakes the watcher when one happens, anywhere in the fleet; it looks at
        the store then, and otherwise only every ``max(FOREIGN_SAFETY_POLL_S, duplicate_poll_s)``
        as a safety net. Otherwise it polls every
        ``duplicate_poll_s`` (see :func:`~aiqsim.scheduler.foreign_owner.store_change`).
        """
        notified = announces_changes(self.runtime, self.store)
        listening = False
        try:
            while True:
                try:
                    if notified and not listening:
                        self.store.notification_fileno()  # listen first, then look: nothing falls between
                        listening = True
                    elif not notified:
                        await self.runtime.sleep(self.duplicate_poll_s)
                    owner = self.store.get(owner_id)  # after LISTEN began: no announcement is missed
                    if owner is None or owner.status.is_terminal:
                        break
                    if notified:
                        safety_poll = max(FOREIGN_SAFETY_POLL_S, self.duplicate_poll_s)
                        await store_change(self.runtime, self.store, safety_poll)
                except StoreError as error:
                    if not outage_may_pass(error):
                        self._stop_waiting_on(owner_id, error)
                        return
                    self.anomalies["store_unreachable"] += 1  # look again (listening anew) after a poll
                    listening = False
                    await self.runtime.sleep(self.duplicate_poll_s)
        finally:
            self._watchers.pop(owner_id, None)
        self._resolve_waiters(owner_id, owner)
