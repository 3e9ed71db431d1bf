"""Crash recovery: reconcile what a stopped process left in the store, then resume it.

:class:`Recovery` (one of the parts :class:`~aiqsim.scheduler.scheduler.Scheduler` is made of) gives
the scheduler :meth:`~Recovery.recover`; the lookup of an orphan's key with retries is in
:mod:`aiqsim.scheduler.recovery_lookup`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from aiqsim.core.failures import TaskInterruptedError, describe_error
from aiqsim.core.states import transition
from aiqsim.core.task import TaskRecord, TaskStatus
from aiqsim.scheduler.arguments import SchedulerArgumentError, SchedulerArgumentTypeError, checked_worker_id
from aiqsim.scheduler.claims import SHARED_ENDINGS
from aiqsim.scheduler.live import LiveTask
from aiqsim.scheduler.provider import ProviderResponse, SupportsLookup
from aiqsim.scheduler.recovery_lookup import LookupRetry, lookup_all
from aiqsim.scheduler.store_writes import persist


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What :meth:`Scheduler.recover` found in the store after a restart.

    ``orphans_completed``: tasks found running whose work the provider had already done (completed
    from its record, no second call). ``orphans_failed``: running tasks failed as interrupted.
    ``orphans_requeued``: running tasks sent again (``requeue_interrupted``). ``queued_resumed``:
    queued owners put back in their queues. ``duplicates_reattached``: queued duplicates waiting on
    their owner again. ``left_to_other_workers``: tasks of other live workers, left alone.
    """

    orphans_completed: int
    orphans_failed: int
    orphans_requeued: int
    queued_resumed: int
    duplicates_reattached: int
    left_to_other_workers: int = 0
    """Queued or running tasks held by workers this recovery did not adopt (they were not touched)."""
    left_for_unknown_providers: int = 0
    """Queued or running tasks for providers this scheduler lacks, left as they were (``"leave"``)."""
    undecided: tuple[str, ...] = ()
    """Ids of orphans whose provider lookup kept failing: left ``running`` as they were (neither
    failed nor re-sent, since the provider may have done the work). Call ``recover()`` again later."""
    duplicates_settled: int = 0
    """Queued duplicates whose owner's run had ended (succeeded, or failed: also as interrupted by this
    recovery): they ended ``deduped`` with its result or error, as they would have in a live run."""


class Recovery:
    """Reconciliation of the store after a restart (:meth:`recover`)."""

    __slots__ = ()

    async def recover(
        self,
        *,
        requeue_interrupted: bool = False,
        use_lookup: bool = True,
        workers: Iterable[str | None] | None = None,
        unknown_providers: str = "raise",
        lookup_retry: LookupRetry | None = None,
    ) -> RecoveryReport:
        """Reconcile the store after a restart; call once before submitting new work.

        Tasks found ``running`` are orphans of the dead process. If their provider can look
        up the idempotency key and already did the work, the task is completed from the
        provider's record (no second call, no second bill); otherwise it fails with
        :class:`~aiqsim.core.failures.TaskInterruptedError`, or is requeued when
        ``requeue_interrupted``. Queued tasks resume: owners go back to their queues and
        duplicates wait for their owner again, or, if the owner's run has ended (an orphan failed
        here included), end ``deduped`` with its result or error, as they would have live.
        ``use_lookup=False`` skips the provider lookup (to measure what reconciliation saves).

        Which tasks are adopted: with ``workers``, those held by any of these worker ids (``None``
        in it stands for tasks written without one); otherwise, for a scheduler with a
        ``worker_id``, its own; otherwise every task in the store (a store with one user).
        Adopted tasks carry this scheduler's ``worker_id`` from then on. Tasks held by other
        workers are not touched: their processes are alive and still running them.

        Recovery trusts that each worker id is held by one live process at a time, and that a
        dead worker's tasks (``workers=["its-id"]``) are taken over by one process only. A takeover
        cut short by a crash is finished with ``workers=["its-id", own_id]`` (what was already
        taken over carries this worker's id). A store written before worker ids has tasks without
        one: give ``workers=[None, own_id]`` once to adopt them.

        Unfinished tasks for a provider this scheduler was not given raise
        :class:`~aiqsim.scheduler.arguments.SchedulerArgumentError` (a ``ValueError``) before
        anything is written (``unknown_providers="raise"``); with ``"leave"`` they stay in the
        store as they are, for a scheduler that has the provider, and are counted in the report.

        A lookup that fails or hangs is retried with backoff (``lookup_retry``, see
        :class:`~aiqsim.scheduler.recovery_lookup.LookupRetry`; 4 attempts by default) and never
        stops the recovery of the other orphans. An orphan whose lookups all failed is left
        ``running``, untouched (not failed: the provider may have done, and billed, the work), and
        its id is listed in ``RecoveryReport.undecided``; call ``recover()`` again once the provider
        answers. A store write that fails raises :class:`~aiqsim.stores.base.StoreWriteError`
        (the orphans already reconciled stay reconciled).
        """
        if unknown_providers not in ("raise", "leave"):
            raise SchedulerArgumentError(
                f"unknown_providers must be 'raise' or 'leave', got {unknown_providers!r}; "
                "nothing was recovered"
            )
        adopted = self._adopted_workers(workers)

        def ours(record: TaskRecord) -> bool:
            return adopted is None or record.worker in adopted or record.id in requeued_ids

        requeued_ids: set[str] = set()
        unknown = self._unknown_provider_tasks(ours)
        if unknown and unknown_providers == "raise":
            names = sorted({record.provider for record in unknown.values()})
            raise SchedulerArgumentError(
                f"providers: the store holds {len(unknown)} unfinished task(s) for provider(s) {names} "
                f"that this scheduler was not given (it has {sorted(self._lanes)}); nothing was recovered. "
                "Add those providers, or pass unknown_providers='leave' to leave the tasks in the store"
            )
        completed = failed = requeued = resumed = reattached = settled = left = 0
        undecided: list[str] = []
        retry = lookup_retry if lookup_retry is not None else LookupRetry()
        me = self.worker_id
        orphans: list[TaskRecord] = []
        for orphan in self.store.list_by_status(TaskStatus.RUNNING):
            if orphan.id in self._live or orphan.id in unknown:
                continue  # running here, in this process (not an orphan), or not ours to run
            if not ours(orphan):
                left += 1
                continue
            orphans.append(orphan)
        asked = [
            (orphan, provider)
            for orphan in orphans
            if use_lookup and (provider := self._lookup_of(orphan)) is not None
        ]
        answers = await lookup_all(self.runtime, [(p, orphan.key) for orphan, p in asked], retry, self.rng)
        outcomes = {orphan.id: answer for (orphan, _), answer in zip(asked, answers, strict=True)}
        for orphan in orphans:  # in the store's order, whatever order the lookups answered in
            response: ProviderResponse | None = None
            outcome = outcomes.get(orphan.id)
            if outcome is not None:
                if not outcome.decided:
                    undecided.append(orphan.id)
                    continue
                response = outcome.response
            now = self.runtime.now()
            if response is not None:
                done = transition(orphan, TaskStatus.SUCCEEDED, now, result=response.result, worker=me)
                self._write(done)
                self._emit_transition(TaskStatus.RUNNING, done)
                completed += 1
                continue
            error = describe_error(TaskInterruptedError("process stopped while the task was running"))
            done = transition(orphan, TaskStatus.FAILED, now, error=error, worker=me)
            if requeue_interrupted:
                # running -> failed -> queued through the table, but one write: a crash between two
                # writes would strand the task in failed.
                again = transition(done, TaskStatus.QUEUED, now)
                self._write(again)
                self._emit_transition(TaskStatus.RUNNING, done)
                self._emit_transition(TaskStatus.FAILED, again)
                requeued_ids.add(again.id)
                requeued += 1
            else:
                self._write(done)
                self._emit_transition(TaskStatus.RUNNING, done)
                failed += 1
        for queued in self.store.list_by_status(TaskStatus.QUEUED):
            if queued.id in self._live or queued.id in unknown:
                continue
            if not ours(queued):  # requeued orphans are ours, whatever worker they came from
                left += 1
                continue
            if queued.worker != me:  # taken over from another worker: say so in the store first
                queued = queued.evolve(worker=me)
                self._write(queued)
            live = LiveTask(record=queued)
            if queued.route is not None and self._routes is not None:  # its retries may move again
                live.route = self._routes.route_of(queued)
            ended = self.store.owner_of(queued.key)
            if ended is not None and ended.id != queued.id and ended.status in SHARED_ENDINGS:
                # a duplicate that was waiting when the process stopped, on an owner whose run has
                # ended since (failed above as interrupted, say): it shares that ending, as it would
                # have live. Claiming the key would send the call again.
                self._live[queued.id] = live
                self._share_ending(live, ended)
                settled += 1
                continue
            owner = persist(f"claim of key {queued.key!r} by task {queued.id!r}", self.store.claim, queued)
            self._staged(queued.id)
            self._live[queued.id] = live
            if owner.id == queued.id:
                resumed += queued.id not in requeued_ids  # requeued orphans are counted once, above
            else:
                reattached += 1
            self._follow_owner(live, owner)
        if self._live:
            self._ensure_started()
        from aiqsim.scheduler.jobs import recover_jobs  # jobs build on this module

        self.job_recovery = await recover_jobs(
            self, self._jobs, adopted
        )  # re-drive jobs once their tasks are settled
        if self._commit is not None:  # what recovery wrote is durable before it reports it
            lost = await self._commit.durable()
            if lost is not None:
                raise lost
        return RecoveryReport(
            completed, failed, requeued, resumed, reattached, left, len(unknown), tuple(undecided), settled
        )

    def _lookup_of(self, orphan: TaskRecord) -> SupportsLookup | None:
        """The provider that can say whether it did ``orphan``'s work, if its provider can."""
        lane = self._lanes.get(orphan.provider)
        if lane is not None and isinstance(lane.provider, SupportsLookup):
            return lane.provider
        return None

    def _unknown_provider_tasks(self, ours: Callable[[TaskRecord], bool]) -> dict[str, TaskRecord]:
        """Running and queued tasks that recovery would adopt but that name no provider of ours."""
        return {
            record.id: record
            for record in self.store.list_by_status(TaskStatus.RUNNING, TaskStatus.QUEUED)
            if record.provider not in self._lanes and record.id not in self._live and ours(record)
        }

    def _adopted_workers(self, workers: Iterable[str | None] | None) -> frozenset[str | None] | None:
        """The worker ids whose tasks :meth:`recover` takes on (``None``: every task)."""
        if isinstance(workers, str):
            raise SchedulerArgumentTypeError(
                f"workers takes a collection of worker ids, not one string: use [{workers!r}]; "
                "nothing was recovered"
            )
        if workers is not None:
            if not isinstance(workers, Iterable):
                raise SchedulerArgumentTypeError(
                    f"workers takes a collection of worker ids (None: tasks without one), got {workers!r}; "
                    "nothing was recovered"
                )
            refused = "nothing was recovered"
            return frozenset(checked_worker_id(worker, "each of workers", refused) for worker in workers)
        if self.worker_id is not None:
            return frozenset({self.worker_id})
        return None
