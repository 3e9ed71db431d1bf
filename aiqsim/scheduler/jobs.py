"""Jobs: one user action as a pipeline (a DAG) of provider calls, on the one scheduler.

A :class:`JobSpec` names a pipeline and its :class:`Stage` s. ``scheduler.submit_job(spec, inputs)``
runs it: each stage, once the stages it comes ``after`` have succeeded, builds its payload from
the job's inputs and the earlier results (``build``, a plain function run inside the scheduler)
and runs as an ordinary scheduler task -- same quotas, dispatch, retries, idempotency, store and
recovery as any other call. A stage with ``fan_out=True`` builds a list and runs one task per
element (one TTS call per paragraph); its result is the list of results, in order.

Fan-out: a stage's build may give at most its ``max_fan_out`` elements (10,000 by default,
:data:`~aiqsim.scheduler.job_spec.DEFAULT_MAX_FAN_OUT`); more fails the job at that stage with
:class:`~aiqsim.scheduler.job_spec.FanOutLimitError` before any of its tasks is submitted (a build
returning an iterator is read one element past the cap, no further). A fan-out of more than
:data:`SUBMIT_BATCH` elements is submitted that many tasks at a time, the runtime running whatever
else is ready in between, so a large stage never holds the event loop for all its submissions.

A spec is known by its name and version: a changed pipeline needs a new version. A job submitted
with a spec whose name and version the last stored job had, but not its stages, is refused with
:class:`JobSpecError`; recovery fails an unfinished job whose registered spec changed with the same
message.

Idempotency, two levels:

- the *job* key is the fingerprint of the spec (name, version, each stage's definition, including
  the qualified names of its ``build`` and fallback functions) and the inputs. A duplicate of a
  finished job ends ``deduped`` with its results; a duplicate of a job in flight waits for it.
- each *stage task* key is the ordinary task fingerprint of its (kind, version, payload). So a
  re-run of a job -- after a crash, or a manual resubmission after a failure -- reuses every stage
  that already succeeded (task dedup: no second call, no second bill) and runs only the rest
  ("continue"). A job that cannot continue ends ``failed`` with ``failed_stage`` and ``error``
  saying which stage and why ("clearly say it failed").

States: a job uses the task vocabulary and transition table (:mod:`aiqsim.core.job`). It is
``queued`` from submission until its first stage is handed to the scheduler, ``running`` until
it ends; it ends ``succeeded`` when every stage did, ``failed`` when a stage failed (and its
fallback, if any, failed too), ``cancelled`` when cancelled (or when one of its stage tasks was
cancelled from outside, e.g. by ``scheduler.close()``), ``deduped`` when it shared another job's run.

Failure: when a stage fails, the job fails at once; its stage tasks still waiting in a dispatch
queue are cancelled, calls already in flight run to their end (their results are kept under
their keys, so a resubmitted job does not pay for them again).

Cancellation: :meth:`JobHandle.cancel` cancels the job's queued *and* running stage tasks.

Priority and the depth limit: stage tasks inherit the job's priority, so every stage of an
interactive job goes ahead of background work in each provider lane. The scheduler's per-priority
depth limit (``interactive_limit``/``background_limit``) counts a *job* once, not per stage: a job
occupies one place while it is queued or has any stage task waiting in a dispatch queue, and its
stage tasks are never refused for depth. ``submit_job`` raises :class:`QueueFullError` when the
priority is at its limit (plain tasks and jobs counted together); a plain ``submit`` sees the jobs
the same way.

Tenants: ``submit_job(tenant=...)`` (a tenant of the scheduler's ``tenants``) is stored with the job
and given to every task of every stage, fallbacks included, so weighted fair queuing between tenants
counts a job's calls as that tenant's (they went to the default tenant); a recovered job keeps it. A
tenant's ``max_queued`` refuses a new job (:class:`QueueFullError`) when the tenant has that many
tasks queued; a stage of a job already running is never refused for it (the job would fail half-way).

Recovery: give the specs that may be in the store to :class:`Jobs` (``Jobs(scheduler, specs=...)``
or :meth:`Jobs.register`; specs passed to ``submit_job`` are registered too). ``scheduler.recover()``
first reconciles the tasks as always, then re-drives every unfinished job it adopts: stages whose
results the job record holds are done; a stage whose tasks are all stored is picked up where it
was (tasks resumed by task recovery are waited for, ended ones count as they ended: a stage task
that recovery failed as interrupted fails the job and is not sent again, nor to the stage's
fallback); the others are submitted again, so finished ones dedup, in-flight ones are waited for,
and only the rest run. A job whose spec (name, version) is not registered, or whose registered
spec no longer matches the job's key, ends ``failed`` with that reason. A stage that had failed
over to its fallback before the crash goes on with its fallback tasks (its failed primaries are not
sent again), unless a fallback task was not stored before the crash: then the stage is submitted
again on its primary (a poison input is remembered and not sent twice).

Retries: a stage's ``retry`` policy replaces the scheduler's for its tasks (in this process; a
stage task resumed from the store by ``recover()`` runs under the scheduler's policy).

This module never imports asyncio, simpy or time: it runs on the runtime protocol like the
scheduler itself.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiqsim.core.errors import ConfigurationError, SchedulingError, StoreError
from aiqsim.core.failures import TaskInterruptedError, describe_error
from aiqsim.core.fingerprint import FingerprintError, fingerprint
from aiqsim.core.job import JobRecord, JobStatus, job_failure_message, job_transition, stage_status
from aiqsim.core.task import (
    CANCELLED,
    DEDUPED,
    FAILED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    Priority,
    TaskRecord,
    TaskStatus,
    random_id,
)
from aiqsim.runtime.protocol import Cancelled, Future, TaskHandle
from aiqsim.runtime.sync import Signal
from aiqsim.scheduler.arguments import SchedulerArgumentTypeError, UnknownNameError
from aiqsim.scheduler.foreign_owner import outage_may_pass, stop_waiting_on_unreadable
from aiqsim.scheduler.handles import OutcomeHandle, OutcomeHolder, resolve, resolve_with_error
from aiqsim.scheduler.job_events import JobTransition, StageEvent
from aiqsim.scheduler.job_host import JobHost
from aiqsim.scheduler.job_spec import DEFAULT_MAX_FAN_OUT, FanOutLimitError, JobSpec, JobSpecError, Stage
from aiqsim.scheduler.refusals import QueueFullError, SchedulerClosedError
from aiqsim.stores.base import LIVE_OWNER_STATUSES, StoreWriteError
from aiqsim.stores.job_store import JobStore, latest_job_of

if TYPE_CHECKING:
    from aiqsim.scheduler.depth_limit import Call
    from aiqsim.scheduler.live import LiveTask
    from aiqsim.scheduler.scheduler import Scheduler

__all__ = [
    "DEFAULT_MAX_FAN_OUT",
    "FanOutLimitError",
    "JobCancelledError",
    "JobFailedError",
    "JobHandle",
    "JobRecoveryReport",
    "JobSpec",
    "JobSpecError",
    "Jobs",
    "Stage",
]
"""The public job names: :mod:`aiqsim.scheduler` and :mod:`aiqsim` re-export exactly these (by
``import *`` and this list), so one list says what is public. ``keeps_jobs`` and ``recover_jobs``
are the scheduler's own hooks into this module, imported by name; the scheduler's side of the seam
is :class:`~aiqsim.scheduler.job_host.JobHost`, and this module never imports the scheduler's."""


class JobFailedError(SchedulingError):
    """Raised by awaiting a :class:`JobHandle` whose job failed; names the stage and the reason."""

    def __init__(self, record: JobRecord) -> None:
        super().__init__(f"job {record.id!r} ({record.name}) failed: {record.error}")
        self.record = record
        self.stage = record.failed_stage


class JobCancelledError(SchedulingError):
    """Raised by awaiting a :class:`JobHandle` whose job was cancelled."""

    def __init__(self, record: JobRecord) -> None:
        super().__init__(f"job {record.id!r} ({record.name}) was cancelled")
        self.record = record


class JobHandle(OutcomeHandle[JobRecord]):
    """What ``submit_job`` returns. ``await handle`` gives ``{stage: result}`` or raises.

    :class:`JobFailedError` (with the stage and reason) or :class:`JobCancelledError`.
    :meth:`wait` gives the final job record and never raises for a job failure.
    """

    __slots__ = ("_jobs",)
    _repr_name = "JobHandle"

    def __init__(self, jobs: Jobs, job_id: str, key: str, run: OutcomeHolder) -> None:
        super().__init__(job_id, key, run, jobs.scheduler.runtime.create_future)
        self._jobs = jobs

    async def result(self) -> dict[str, Any]:
        """``{stage name: result}``; raises :class:`JobFailedError` or :class:`JobCancelledError`."""
        record = await self.wait()
        if record.status is CANCELLED:
            raise JobCancelledError(record)
        if record.status is FAILED or record.error is not None:
            raise JobFailedError(record)
        return dict(record.results)

    def cancel(self) -> bool:
        """Cancel the job and its queued and running stage tasks; False if it is not live here."""
        return self._jobs.cancel(self.id)


@dataclass(frozen=True, slots=True)
class JobRecoveryReport:
    """What the jobs step of recovery found: jobs re-driven, duplicates waiting again, jobs
    failed because their spec is unknown (or changed), jobs of other workers left alone."""

    resumed: int
    reattached: int
    failed_unknown_spec: int
    left_to_other_workers: int = 0


@dataclass(eq=False)
class _StagePhase:
    """A stage in progress: its tasks still out (id -> element index) and the outcomes so far."""

    stage: Stage
    outcomes: list[TaskRecord | None]
    pending: dict[str, int] = field(default_factory=dict)
    fallback: bool = False
    launching: bool = False
    primary_error: str | None = None


@dataclass(eq=False)
class _JobRun:
    """In-process state of a job that is not yet terminal here."""

    record: JobRecord
    spec: JobSpec | None
    future: Future[JobRecord] | None = None  # the OutcomeHolder fields (aiqsim.scheduler.handles)
    outcome: JobRecord | None = None
    outcome_error: BaseException | None = None
    done: set[str] = field(default_factory=set)
    phases: dict[str, _StagePhase] = field(default_factory=dict)
    task_ids: list[str] = field(default_factory=list)
    waiting_on: str | None = None
    finished: bool = False
    stopping: bool = False
    """Its ending is decided (its stage tasks are being stopped before its terminal write, or every
    result is in): their endings do not advance it, and a cancel comes too late."""


SUBMIT_BATCH = 256
"""A stage submits up to this many tasks in one step; a larger fan-out submits them this many at a
time, letting the runtime run everything else that is ready in between (``sleep(0)``)."""

_SHARED_JOB_ENDINGS = (JobStatus.SUCCEEDED, JobStatus.FAILED)
"""How a job may end for its waiting duplicates to share it; after any other ending the key is free."""


class Jobs:
    """The jobs orchestrator of one :class:`~aiqsim.scheduler.Scheduler` (``scheduler.jobs``).

    ``specs``: the job specs this process can run; recovery re-drives a stored job only if its
    (name, version) is registered here (see the module docstring). Creating a ``Jobs`` attaches
    it to the scheduler: ``scheduler.submit_job`` and ``scheduler.recover`` then use it.
    """

    def __init__(self, scheduler: Scheduler, specs: Iterable[JobSpec] = ()) -> None:
        store = scheduler.store
        if not keeps_jobs(store):
            raise ConfigurationError(
                f"{type(store).__name__} keeps no jobs (it lacks the JobStore methods); use a store "
                "from aiqsim.stores"
            )
        self.scheduler = scheduler
        self.store: JobStore = store
        self._specs: dict[tuple[str, str], JobSpec] = {}
        self._runs: dict[str, _JobRun] = {}
        self._waiters: dict[str, list[str]] = {}
        self._watchers: dict[str, TaskHandle[None]] = {}
        self._stage_tasks: dict[str, tuple[str, str]] = {}  # task id -> (job id, stage name)
        self._idle = Signal(scheduler.runtime)
        self._crashed = False
        self._unchanged: set[tuple[str, str]] = set()
        """The (name, version) of the specs whose last stored job was found to be theirs (one read
        each, at their first submission here: :meth:`_check_unchanged`)."""
        for spec in specs:
            self.register(spec)
        self._host: JobHost = scheduler.attach_jobs(self)
        """The scheduler's seam for jobs (:mod:`aiqsim.scheduler.job_host`): its private rules, by name."""

    # ------------------------------------------------------------------ public API
    def register(self, spec: JobSpec) -> None:
        """Make ``spec`` known (for recovery). A different spec under the same name and version
        raises :class:`JobSpecError`: bump the version when a pipeline changes."""
        if not isinstance(spec, JobSpec):
            raise JobSpecError(f"expected a JobSpec, got {type(spec).__name__}")
        known = self._specs.get((spec.name, spec.version))
        if known is not None and known is not spec and known.identity() != spec.identity():
            raise JobSpecError(
                f"a different JobSpec is already registered as {spec.name!r} version {spec.version!r}; "
                "give the changed pipeline a new version"
            )
        missing = spec.providers() - set(self.scheduler.providers) - set(self.scheduler.routes)
        if missing:
            raise JobSpecError(
                f"job {spec.name!r} uses provider(s) {sorted(missing)} that this scheduler lacks "
                f"(it has {sorted(self.scheduler.providers)}, routes {sorted(self.scheduler.routes)})"
            )
        self._specs[(spec.name, spec.version)] = spec

    @property
    def specs(self) -> list[JobSpec]:
        """The registered specs."""
        return list(self._specs.values())

    @property
    def in_flight(self) -> int:
        """Jobs submitted here that are not yet terminal."""
        return len(self._runs)

    def submit(
        self,
        spec: JobSpec,
        inputs: Any,
        *,
        priority: Priority = Priority.BACKGROUND,
        job_id: str | None = None,
        tenant: str | None = None,
    ) -> JobHandle:
        """Start a job (see :meth:`Scheduler.submit_job`)."""
        scheduler = self.scheduler
        closed = self._host.closed_reason()
        if closed is not None:
            raise SchedulerClosedError(closed)
        if job_id is not None and (type(job_id) is not str or not job_id):
            # a number was stored as is in memory and as text in SQLite: get_job() then differed
            raise SchedulerArgumentTypeError(
                f"job_id: expected a non-empty string or None, got {job_id!r}; no job was submitted"
            )
        tenant_limit = self._host.check_tenant(tenant)
        self.register(spec)
        self._check_unchanged(spec)
        priority = Priority(priority)
        key = spec.key(inputs)
        existing = self.store.job_owner_of(key)
        is_duplicate = existing is not None and existing.status in LIVE_OWNER_STATUSES
        if self._host.depth_limit(priority) is None:  # the rule: depth_limit.py
            limit = None
        elif is_duplicate:  # queues nothing of its own, unless it lifts its owner's queued calls
            assert existing is not None
            limit = self._host.refusing_job_limit(
                lambda: self._promoted_calls(existing.id, priority), priority
            )
        else:
            limit = self._host.refusing_job_limit(lambda: self._first_calls(spec, inputs, priority), priority)
        if limit is not None:
            raise QueueFullError(
                f"too many {priority.name.lower()} requests: {self.depth(priority)} already queued, jobs "
                f"counted once (limit {limit}); try again later"
            )
        if tenant_limit is not None and not is_duplicate:  # its stage tasks are never refused mid-way
            queued = scheduler.queued_for(tenant)
            if queued >= tenant_limit:
                raise QueueFullError(
                    f"tenant {tenant!r}: {queued} of its tasks already queued (its max_queued is "
                    f"{tenant_limit}); no job was submitted. Retry later, or raise Tenant(max_queued=...)"
                )
        now = scheduler.runtime.now()
        record = JobRecord(
            id=job_id if job_id is not None else self._new_job_id(),
            key=key,
            name=spec.name,
            version=spec.version,
            priority=priority,
            created_at=now,
            updated_at=now,
            inputs=inputs,
            worker=scheduler.worker_id,
            tenant=tenant,
        )
        owner = self.store.insert_and_claim_job(record)
        self._host.staged()
        run = _JobRun(record=record, spec=spec)
        self._runs[record.id] = run
        self._emit(None, record)
        self._host.ensure_started()
        with self._unpersisted(run):
            self._follow_owner(run, owner)
        return JobHandle(self, record.id, key, run)

    def _check_unchanged(self, spec: JobSpec) -> None:
        """Refuse ``spec`` when the last job stored under its name and version was submitted with
        another spec (its inputs do not give its key under this one): a pipeline changed without a new
        version. The job key holds the spec, so the changed one ran as a new job next to the finished
        one (two finished jobs for the same inputs); recovery fails an unfinished one with the same
        message. Read once per (name, version) in this process."""
        if (spec.name, spec.version) in self._unchanged:
            return
        latest = latest_job_of(self.store, spec.name, spec.version)
        if latest is not None and spec.key(latest.inputs) != latest.key:
            raise JobSpecError(changed_spec_problem(spec, latest) + "; no job was submitted")
        self._unchanged.add((spec.name, spec.version))

    def handle(self, job_id: str) -> JobHandle | None:
        """A handle for a job live in this scheduler (e.g. one re-driven by recovery)."""
        run = self._runs.get(job_id)
        if run is None:
            return None
        return JobHandle(self, job_id, run.record.key, run)

    def get(self, job_id: str) -> JobRecord | None:
        """The stored record of a job (live or not)."""
        return self.store.get_job(job_id)

    def list(self, *statuses: JobStatus) -> list[JobRecord]:
        """Stored job records in any of ``statuses`` (all when none given)."""
        return self.store.list_jobs(*statuses)

    def stage_states(self, job_id: str) -> dict[str, TaskStatus | None]:
        """Each stage's state now, from its task records (``None``: not started); the input of
        :func:`~aiqsim.core.job.derive_job_status`. An id not in the store raises
        :class:`~aiqsim.scheduler.arguments.UnknownNameError` (a ``KeyError``)."""
        record = self.store.get_job(job_id)
        if record is None:
            raise UnknownNameError(f"job_id: no job {job_id!r} in the store")
        spec = self._specs.get((record.name, record.version))
        names = [s.name for s in spec.stages] if spec is not None else list(record.stage_tasks)
        run = self._runs.get(job_id)
        tasks = self.scheduler.store
        states: dict[str, TaskStatus | None] = {}
        for name in names:
            phase = run.phases.get(name) if run is not None else None
            if name in record.results:
                states[name] = SUCCEEDED
            elif phase is not None:  # live here: each element's current task (its fallback's, once taken)
                current = {index: task_id for task_id, index in phase.pending.items()}
                parts: list[TaskStatus | None] = []
                for index, outcome in enumerate(phase.outcomes):
                    task = tasks.get(current[index]) if index in current else outcome
                    parts.append(None if task is None else task.status)
                states[name] = stage_status(parts)
            elif record.status is CANCELLED:  # a stage it had started was stopped with it
                states[name] = CANCELLED if record.stage_tasks.get(name) else None
            elif record.status.is_terminal:
                states[name] = FAILED if name == record.failed_stage else None
            else:  # another process's job: what its stage tasks say
                found = [tasks.get(task_id) for task_id in record.stage_tasks.get(name, ())]
                states[name] = stage_status([task.status for task in found if task is not None])
        return states

    def cancel(self, job_id: str) -> bool:
        """Cancel a live job: its queued and running stage tasks are cancelled, the job ends
        ``cancelled``. False if the job is not live here."""
        run = self._runs.get(job_id)
        if run is None or run.finished or run.stopping or run.record.status.is_terminal or self._crashed:
            return False  # (ending already: a sink told of its last step cancels too late)
        if run.waiting_on is not None:
            waiters = self._waiters.get(run.waiting_on)
            if waiters and job_id in waiters:
                waiters.remove(job_id)
            run.waiting_on = None
        with self._unpersisted(run):
            self._stop_stages(run, cancel_running=True)
            self._finish(run, CANCELLED)
        return True

    def depth(self, priority: Priority, starting: Collection[str] = ()) -> int:
        """Queued requests of ``priority`` as the depth limit counts them: plain queued tasks,
        plus each unfinished job that is queued or has a stage task waiting in a queue, once.
        The queued tasks in ``starting`` (they start in this instant) are left out."""
        live = self._host.live
        held = self._host.held_by_gates(priority)  # first attempts a gate holds back: they wait
        queued_stage_tasks = 0
        waiting_jobs: set[str] = set()
        for task_id, (job_id, _) in self._stage_tasks.items():
            task = live.get(task_id)
            if task is not None and task.queue_item is not None and task.record.priority is priority:
                queued_stage_tasks += 1
                if task_id not in starting:
                    waiting_jobs.add(job_id)
        plain_held = 0
        for task_id in held:
            stage = self._stage_tasks.get(task_id)
            if stage is None:
                plain_held += 1
            else:
                waiting_jobs.add(stage[0])
        plain_starting = sum(1 for task_id in starting if task_id not in self._stage_tasks)
        for run in self._runs.values():  # a duplicate waiting for its owner holds no place, as for tasks
            record = run.record
            if record.priority is priority and record.status is QUEUED and run.waiting_on is None:
                waiting_jobs.add(record.id)
        return (
            self._host.queued(priority) - queued_stage_tasks - plain_starting + len(waiting_jobs) + plain_held
        )

    def _promoted_calls(self, owner_id: str, priority: Priority) -> list[Call]:
        """What a duplicate job of ``priority`` queues, as the depth limit asks it: nothing, unless
        its owner job is live here in a lower class; then each of the owner's queued stage tasks
        that it would move into its class (:meth:`_inherit_priority`) stands for itself there, as a
        duplicate task does for its owner (``DepthLimit._promoted_call``)."""
        owner = self._runs.get(owner_id)
        if owner is None or owner.finished or priority >= owner.record.priority:
            return []
        calls = (self._host.promoted_call(task_id, priority) for task_id, _ in self._live_stage_tasks(owner))
        return [call for call in calls if call is not None]

    def _first_calls(self, spec: JobSpec, inputs: Any, priority: Priority) -> list[Call]:
        """What a new job of ``spec`` and ``priority`` would queue at once, as the depth limit
        asks it (:data:`~aiqsim.scheduler.depth_limit.Call`): one call per stage without ``after``,
        one per element for a fan-out. A stage whose build or cost raises is left out: the job
        fails there without queueing it. A call that duplicates a live owner (queued, running or
        succeeded) or an earlier call of the list queues nothing of its own, as a duplicate
        ``submit`` does not, and is left out too, unless it would move its queued owner into the
        job's higher class: it then stands for that owner there.

        A stage that would end in the submit's own instant (an empty fan-out, or every call a
        duplicate of a call that already succeeded) launches the stages after it in that instant
        too: their calls are listed as well, built from the results those stages would have."""
        scheduler = self.scheduler
        calls: list[Call] = []
        keys: set[str] = set()
        ended: dict[str, Any] = {}  # the stages that would end in this instant, with their results
        listed: set[str] = set()
        more = True
        while more:  # stages in an order that respects ``after`` (the spec has no cycle)
            more = False
            for stage in spec.stages:
                if stage.name in listed or any(name not in ended for name in stage.after):
                    continue
                listed.add(stage.name)
                more = True
                try:
                    payloads = self._build(stage, inputs, ended)
                    results: list[Any] = []  # of the calls that already succeeded
                    for payload in payloads:
                        key = stage_task_key(stage, payload)
                        owner = scheduler.store.owner_of(key)
                        if owner is not None and owner.status is SUCCEEDED:
                            results.append(owner.result)  # dedups at once: nothing queued, nothing to wait
                            continue
                        if key in keys:
                            continue
                        keys.add(key)
                        if owner is not None and owner.status in LIVE_OWNER_STATUSES:
                            promoted = self._host.promoted_call(owner.id, priority)
                            if promoted is not None:
                                calls.append(promoted)
                            continue
                        cost = stage.cost(payload) if callable(stage.cost) else stage.cost
                        calls.append(self._host.new_call(stage.provider, stage.task_kind, payload, cost))
                    if len(results) == len(payloads):  # every call already done: the stage ends now
                        ended[stage.name] = results if stage.fan_out else results[0]
                except Exception:  # reported by the launch, which runs the same code
                    continue
        return calls

    async def join(self) -> None:
        """Wait until every job submitted here is terminal, or the scheduler crashed (its jobs are
        then left to ``recover()``)."""
        while self._runs and not (self._crashed or self._host.crashed):
            await self._idle.wait()

    # ------------------------------------------------------------------ scheduler hooks
    async def close(self, *, cancel_pending: bool) -> None:
        """Called by ``Scheduler.close`` before it stops taking work: cancel live jobs, or let them finish."""
        if cancel_pending:
            for job_id in list(self._runs):
                self.cancel(job_id)
        await self.join()

    def crash(self) -> None:
        """Called by ``Scheduler.crash``: every job coroutine stops where it is, nothing more is written."""
        self._crashed = True
        for watcher in self._watchers.values():
            watcher.cancel()
        self._watchers.clear()
        self._idle.notify()  # a join() under way returns: no job finishes here any more

    async def recover(self, adopted: frozenset[str | None] | None = None) -> JobRecoveryReport:
        """Re-drive the unfinished jobs of the store; called by ``Scheduler.recover`` after the tasks.

        ``adopted``: the worker ids whose jobs to take on (``None``: every job), as for tasks.
        """
        resumed = reattached = unknown = left = 0
        me = self.scheduler.worker_id
        for stored in self.store.list_jobs(QUEUED, RUNNING):
            if stored.id in self._runs:
                continue
            if adopted is not None and stored.worker not in adopted:
                left += 1
                continue
            record = stored if stored.worker == me else stored.evolve(worker=me)
            spec = self._specs.get((record.name, record.version))
            problem = None
            if spec is None:
                problem = (
                    f"no JobSpec {record.name!r} version {record.version!r} is registered in the "
                    "recovering process (pass it to Jobs(scheduler, specs=[...]))"
                )
            elif spec.key(record.inputs) != record.key:
                problem = changed_spec_problem(spec, record)
            if problem is not None:
                self._fail_stored(record, problem)
                unknown += 1
                continue
            if record is not stored:
                self._write(record)
            run = _JobRun(record=record, spec=spec)
            self._runs[record.id] = run
            for stage_name, stage_ids in record.stage_tasks.items():
                for task_id in stage_ids:
                    self._stage_tasks[task_id] = (record.id, stage_name)
            if record.status is RUNNING:
                with self._unpersisted(run):
                    self._start(run)
                resumed += 1
                continue
            ended = self.store.job_owner_of(record.key)
            if ended is not None and ended.id != record.id and ended.status in _SHARED_JOB_ENDINGS:
                # a duplicate that was waiting when the process stopped, on a job that has ended
                # since (failed above, say): it shares that ending; claiming would run it again
                reattached += 1
                with self._unpersisted(run):
                    self._share_ending(run, ended)
                continue
            owner = self.store.claim_job(record)
            self._host.staged()
            if owner.id == record.id:
                resumed += 1
            else:
                reattached += 1
            with self._unpersisted(run):
                self._follow_owner(run, owner)
        if self._runs:
            self._host.ensure_started()
        return JobRecoveryReport(resumed, reattached, unknown, left)

    # ------------------------------------------------------------------ claims and duplicates
    def _follow_owner(self, run: _JobRun, owner: JobRecord) -> None:
        record = run.record
        if owner.id == record.id:
            self._start(run)
        elif owner.status is SUCCEEDED:
            self._finish(run, DEDUPED, results=dict(owner.results), deduped_from=owner.id)
        else:
            run.waiting_on = owner.id
            self._waiters.setdefault(owner.id, []).append(record.id)
            owner_run = self._runs.get(owner.id)
            if owner_run is not None:
                self._inherit_priority(owner_run, record.priority)
            elif owner.id not in self._watchers:
                self._watchers[owner.id] = self.scheduler.runtime.spawn(
                    self._watch_foreign_owner(owner.id), name=f"watch-job-{owner.id}"
                )

    def _inherit_priority(self, owner: _JobRun, priority: Priority) -> None:
        """Raise a live owner job to its duplicate's priority, as a task is raised
        (:meth:`~aiqsim.scheduler.claims.ClaimRules._inherit_priority`): its live stage tasks move to
        the duplicate's class, and its later stages are submitted in it. Without this an interactive
        double click of a job waited for the background backlog ahead of its owner's calls."""
        if priority >= owner.record.priority or owner.finished:
            return
        owner.record = owner.record.evolve(priority=priority)  # persisted with the job's next write
        for _, task in self._live_stage_tasks(owner):
            self._host.inherit_priority(task, priority)

    def _live_stage_tasks(self, run: _JobRun) -> list[tuple[str, LiveTask]]:
        """``run``'s stage tasks live in this scheduler: those it submitted or picked up, and those its
        record names (a stage task that recovery resumed before its stage was re-driven)."""
        live = self._host.live
        recorded = [task_id for ids in run.record.stage_tasks.values() for task_id in ids]
        return [
            (task_id, live[task_id])
            for task_id in dict.fromkeys([*run.task_ids, *recorded])
            if task_id in live
        ]

    def _share_ending(self, waiter: _JobRun, owner: JobRecord) -> None:
        """``waiter`` duplicated ``owner``, whose run ended succeeded or failed: it ends ``deduped``
        with that run's results or failure (when the owner ends live, and in recovery for a
        duplicate that was waiting when the process stopped)."""
        self._finish(
            waiter,
            DEDUPED,
            results=dict(owner.results),
            error=owner.error,
            failed_stage=owner.failed_stage,
            deduped_from=owner.id,
        )

    def _resolve_waiters(self, owner_id: str, owner: JobRecord | None) -> None:
        """Share the ended run of ``owner_id`` with the duplicate jobs waiting on it; ``owner`` is
        ``None`` when a retention purge took the record (and its key) first: the key is free."""
        for waiter_id in self._waiters.pop(owner_id, ()):
            waiter = self._runs.get(waiter_id)
            if waiter is None or waiter.waiting_on != owner_id:
                continue
            waiter.waiting_on = None
            with self._unpersisted(waiter):
                if owner is not None and owner.status in _SHARED_JOB_ENDINGS:
                    self._share_ending(waiter, owner)
                else:  # the owner was cancelled (or purged): the first waiter takes the key over
                    claimed = self.store.claim_job(waiter.record)
                    self._host.staged()
                    self._follow_owner(waiter, claimed)

    def _stop_waiting_on(self, owner_id: str, error: StoreError) -> None:
        """The record of ``owner_id``, a job of another process, cannot be read and reading it again
        cannot help (a corrupt record, a closed store): each duplicate job waiting on it is told to
        the event sink (:class:`~aiqsim.scheduler.events.OwnerUnreadable`, by the rule duplicate
        tasks follow too: :func:`~aiqsim.scheduler.foreign_owner.stop_waiting_on_unreadable`), then
        ends here as a store failure does (:meth:`_abandon`), instead of waiting for ever; its stored
        record stays as it was for ``recover()``. :attr:`Scheduler.anomalies` counts
        ``"owner_unreadable"``."""
        self.scheduler.anomalies["owner_unreadable"] += 1
        events = self.scheduler.events
        emit = None if events is None else lambda event: self._send(events, event)
        now = self.scheduler.runtime.now()
        for waiter in stop_waiting_on_unreadable(
            owner_id, error, self._waiters, self._runs, kind="job", now=now, emit=emit
        ):
            self._abandon(waiter, error)

    async def _watch_foreign_owner(self, owner_id: str) -> None:
        """Poll the store for a job owned by another process until that run is terminal (through
        an outage of the store: :func:`~aiqsim.scheduler.foreign_owner.outage_may_pass`)."""
        try:
            while True:
                await self.scheduler.runtime.sleep(self.scheduler.duplicate_poll_s)
                try:
                    owner = self.store.get_job(owner_id)
                except StoreError as error:
                    if not outage_may_pass(error):
                        self._stop_waiting_on(owner_id, error)
                        return
                    self.scheduler.anomalies["store_unreachable"] += 1
                    continue
                if owner is None or owner.status.is_terminal:
                    break
        finally:
            self._watchers.pop(owner_id, None)
        self._resolve_waiters(owner_id, owner)

    # ------------------------------------------------------------------ running a job
    # Stage progress is driven synchronously from the scheduler's task completions
    # (``task_finished``), not by coroutines awaiting them: the next stage of a job is in its
    # provider's queue in the same instant the previous one ends, before any dispatcher looks
    # for work, so an interactive job never lets background work take the slot between stages.
    def _start(self, run: _JobRun) -> None:
        """Hand a job that owns its key to the scheduler: every stage whose inputs are ready."""
        assert run.spec is not None
        run.done = {name for name in run.record.results if name in {s.name for s in run.spec.stages}}
        if len(run.done) == len(run.spec.stages):  # every result was recorded before a crash
            if run.record.status is QUEUED:
                self._move(run, RUNNING)
            self._finish(run, SUCCEEDED)
            return
        self._launch_ready(run)  # the first stage's write also moves the job to running

    def _launch_ready(self, run: _JobRun) -> None:
        """Launch every stage not yet started whose ``after`` stages have all succeeded."""
        assert run.spec is not None
        for stage in run.spec.stages:
            if run.finished:
                return
            if stage.name in run.done or stage.name in run.phases:
                continue
            if all(dep in run.done for dep in stage.after):
                self._launch_stage(run, stage)

    def _launch_stage(self, run: _JobRun, stage: Stage) -> None:
        try:
            payloads = self._build(stage, run.record.inputs, run.record.results)
        except FanOutLimitError as error:
            self._fail(run, stage.name, f"fan-out refused: {describe_error(error)}")
            return
        except Exception as error:
            self._fail(run, stage.name, f"build raised {describe_error(error)}")
            return
        phase = _StagePhase(stage=stage, outcomes=[None] * len(payloads))
        run.phases[stage.name] = phase
        recorded = run.record.stage_tasks.get(stage.name, ())
        if not self._resume_phase(run, phase, payloads, recorded):
            self._cancel_unfollowed(stage, payloads, recorded)
            self._submit_phase(run, phase, stage, list(enumerate(payloads)), fallback=False)

    def _cancel_unfollowed(self, stage: Stage, payloads: list[Any], recorded: Iterable[str]) -> None:
        """The stage is submitted again on its primary: cancel the tasks its job record names that
        recovery resumed here and that the new submissions will not follow (a fallback task stored
        before the crash while another of the stage's was not). Still queued (recovery resumes no
        call), they are cancelled before any call; left alone they would run and bill the stage's
        element on the fallback as well as on the primary (found by a review agent's crash sweep)."""
        recorded = list(recorded)
        if not recorded:  # a first launch: nothing to cancel (20,000 keys took 0.4 s to compute)
            return
        try:
            keys = {stage_task_key(stage, payload) for payload in payloads}
        except FingerprintError:
            keys = set()
        live = self._host.live
        for task_id in recorded:
            task = live.get(task_id)
            if task is not None and task.record.key not in keys:
                self.scheduler.cancel(task_id)

    def _resume_phase(
        self, run: _JobRun, phase: _StagePhase, payloads: list[Any], recorded: Iterable[str]
    ) -> bool:
        """Pick up a stage that recovery found under way, from the tasks its job record names.

        Only when the record names one task per payload, each stored and either live here (resumed
        by task recovery: waited for) or ended (counted as it ended, as :meth:`task_finished` would
        have: an orphan failed as interrupted fails the stage and is not sent again), and, for a
        stage that had failed over, after them one fallback task per failed one, each stored too:
        the fallback is picked up where it was (its primary is not sent again). Otherwise (no tasks
        yet, a task not stored before the crash, one left undecided or held elsewhere) returns
        False: the stage is submitted again and the task keys sort out what already ran. A stored
        task whose key is not the rebuilt payload's means the stage's ``build`` is not
        deterministic: the stored tasks are followed (nothing is sent twice) and a
        ``"rebuilt_differently"`` :class:`StageEvent` and an anomaly say so.
        """
        task_ids = list(recorded)
        if not task_ids or len(task_ids) < len(payloads):
            return False
        live = self._host.live
        stored: list[TaskRecord] = []
        for task_id in task_ids:
            record = live[task_id].record if task_id in live else self.store.get(task_id)
            if record is None or (task_id not in live and not record.status.is_terminal):
                return False
            stored.append(record)
        stored, fallback_tasks = stored[: len(payloads)], stored[len(payloads) :]
        task_ids = task_ids[: len(payloads)]
        replaced: set[int] = set()  # elements whose fallback task stands for them
        if fallback_tasks:
            taken = self._resume_fallback(run, phase, stored, fallback_tasks)
            if taken is None:
                return False
            replaced = taken
        ended = {record.id: record for record in stored if record.id not in live}
        stage = phase.stage
        try:
            changed = [
                r.id for r, p in zip(stored, payloads, strict=True) if r.key != stage_task_key(stage, p)
            ]
        except FingerprintError:  # the rebuilt payload has no key at all: certainly not the stored one
            changed = task_ids
        if changed:
            self.scheduler.anomalies["job_build_changed"] += 1
            self._emit_stage(
                run,
                stage.name,
                "rebuilt_differently",
                tuple(changed),
                f"stage {stage.name!r} built a different payload after the restart than its stored "
                "task(s) were submitted with, which were followed (is its build function deterministic?)",
            )
        for index, task_id in enumerate(task_ids):
            if index in replaced:
                continue  # its fallback task's outcome stands for it (_resume_fallback)
            if task_id in ended:
                phase.outcomes[index] = ended[task_id]
            else:
                phase.pending[task_id] = index
                run.task_ids.append(task_id)
        if not phase.pending:
            self._phase_done(run, phase)
        return True

    def _resume_fallback(
        self, run: _JobRun, phase: _StagePhase, primaries: list[TaskRecord], fallbacks: list[TaskRecord]
    ) -> set[int] | None:
        """The stage had failed over before the crash: ``primaries`` (all ended) are followed by one
        fallback task per failed primary, in element order, as :meth:`_phase_done` submitted them.
        Put the phase in its fallback state, each failed element waiting on (or holding the
        outcome of) its fallback task; returns those elements. ``None`` when the stored tasks are
        not that shape."""
        live = self._host.live
        failed = [index for index, record in enumerate(primaries) if not _succeeded(record)]
        if (
            phase.stage.fallback_stage() is None
            or len(failed) != len(fallbacks)
            or any(record.id in live for record in primaries)
        ):
            return None
        phase.fallback = True
        phase.primary_error = _error_of(primaries[failed[0]])
        for index, record in zip(failed, fallbacks, strict=True):
            if record.id in live:
                phase.pending[record.id] = index
                run.task_ids.append(record.id)
            else:
                phase.outcomes[index] = record
        return set(failed)

    def _submit_phase(
        self,
        run: _JobRun,
        phase: _StagePhase,
        target: Stage,
        items: list[tuple[int, Any]],
        *,
        fallback: bool,
    ) -> None:
        """Submit one task per ``(element index, payload)`` on ``target``'s provider.

        Task ids are drawn (from the scheduler's rng, as ``submit`` would) and written into the
        job record *before* the tasks exist, so a task that ends inside ``submit`` (a duplicate
        of a finished call) is already known as this stage's when it reports back.
        """
        phase.fallback = fallback
        phase.launching = True
        if len(items) > SUBMIT_BATCH:  # in steps, letting everything else run in between
            name = f"job {run.record.id} stage {phase.stage.name}: submissions"
            self.scheduler.runtime.spawn(self._submit_in_steps(run, phase, target, items), name=name)
            return
        ids = [self._new_task_id() for _ in items]
        self._record_tasks(run, phase, ids)
        if self._submit_tasks(run, phase, target, ids, items):
            self._launched(run, phase)

    async def _submit_in_steps(
        self, run: _JobRun, phase: _StagePhase, target: Stage, items: list[tuple[int, Any]]
    ) -> None:
        """:meth:`_submit_phase` of a large fan-out: the task ids are drawn, then the tasks submitted,
        :data:`SUBMIT_BATCH` at a time, with a ``sleep(0)`` after each batch, so the runtime runs
        whatever else is ready in between (20,000 submissions in one step held the asyncio loop for
        3.5 s: no answer was read, no lease renewed). It stops when the job ends meanwhile (a
        cancel, a failure) or the scheduler crashed. The ids are in the job record before the first
        task exists, as a small stage's are; an error no step expected fails the job at this stage."""
        sleep = self.scheduler.runtime.sleep
        batches = range(0, len(items), SUBMIT_BATCH)
        try:
            ids: list[str] = []
            for start in batches:
                ids.extend(self._new_task_id() for _ in items[start : start + SUBMIT_BATCH])
                await sleep(0)
                if self._launch_stopped(run):
                    return
            with self._unpersisted(run):
                self._record_tasks(run, phase, ids)
            for start in batches:
                if start:
                    await sleep(0)
                    if self._launch_stopped(run):
                        return
                chunk = slice(start, start + SUBMIT_BATCH)
                with self._unpersisted(run):
                    if not self._submit_tasks(run, phase, target, ids[chunk], items[chunk]):
                        return
            with self._unpersisted(run):
                self._launched(run, phase)
        except Cancelled:
            raise
        except Exception as error:  # never a silent end: the job says where it stopped
            if not self._launch_stopped(run):
                with self._unpersisted(run):
                    self._fail(run, phase.stage.name, f"submission failed: {describe_error(error)}")

    def _launch_stopped(self, run: _JobRun) -> bool:
        """Whether a stage's submissions in steps must stop: the job ended, or the scheduler crashed."""
        return run.finished or self._crashed or self._host.crashed

    def _record_tasks(self, run: _JobRun, phase: _StagePhase, ids: list[str]) -> None:
        """Write the stage's new task ids into the job record (one write) before the tasks exist."""
        scheduler = self.scheduler
        stage = phase.stage
        fallback = phase.fallback
        stage_tasks = {name: list(v) for name, v in run.record.stage_tasks.items()}
        stage_tasks[stage.name] = [*stage_tasks.get(stage.name, []), *ids]
        now = scheduler.runtime.now()
        old = run.record
        if old.status is QUEUED:  # one write: queued -> running with its first stage's tasks
            self._write(job_transition(old, RUNNING, now, stage_tasks=stage_tasks), run)
            self._emit(old.status, run.record)
        else:
            self._write(old.evolve(stage_tasks=stage_tasks, updated_at=now), run)
        self._emit_stage(run, stage.name, "fallback" if fallback else "submitted", tuple(ids))

    def _submit_tasks(
        self, run: _JobRun, phase: _StagePhase, target: Stage, ids: list[str], items: list[tuple[int, Any]]
    ) -> bool:
        """Submit one task per ``(element index, payload)`` under the ids drawn for them; False when a
        submission was refused (the job failed at this stage)."""
        scheduler = self.scheduler
        stage = phase.stage
        for task_id, (index, _) in zip(ids, items, strict=True):
            phase.pending[task_id] = index
            self._stage_tasks[task_id] = (run.record.id, stage.name)
        try:
            for task_id, (_, payload) in zip(ids, items, strict=True):
                if run.finished:
                    break
                cost = target.cost(payload) if callable(target.cost) else target.cost
                scheduler.submit(
                    target.task_kind,
                    payload,
                    provider=target.provider,
                    priority=run.record.priority,
                    tenant=run.record.tenant,
                    cost_estimate=cost,
                    version=target.version,
                    key=stage_task_key(target, payload),
                    task_id=task_id,
                    job_stage=True,
                    retry=target.retry,
                )
                run.task_ids.append(task_id)
        except Cancelled:
            raise
        except Exception as error:
            phase.launching = False
            what = "fallback submission" if phase.fallback else "submission"
            self._fail(run, stage.name, f"{what} refused: {describe_error(error)}")
            return False
        return True

    def _launched(self, run: _JobRun, phase: _StagePhase) -> None:
        """Every task of the phase was submitted: if all already ended, the phase is done."""
        phase.launching = False
        if not run.finished and not phase.pending:
            self._phase_done(run, phase)

    def _new_job_id(self) -> str:
        """A job id from the scheduler's rng that the store does not hold yet (see :meth:`_new_task_id`)."""
        while True:
            job_id = f"job-{random_id(self.scheduler.rng)}"
            if self.store.get_job(job_id) is None:
                return job_id

    def _new_task_id(self) -> str:
        """A task id drawn from the scheduler's rng (as ``submit`` draws one) that the store does not
        hold yet: a restarted process seeded like its predecessor draws the same ids again."""
        scheduler = self.scheduler
        while True:
            task_id = random_id(scheduler.rng)
            if task_id not in self._stage_tasks and scheduler.store.get(task_id) is None:
                return task_id

    def _waiting_stage(self, task_id: str) -> tuple[_JobRun, _StagePhase] | None:
        """The live job and the stage phase that wait for task ``task_id``, if any does."""
        owner = self._stage_tasks.get(task_id)
        if owner is None:
            return None
        run = self._runs.get(owner[0])
        if run is None or run.finished or run.stopping:
            return None
        phase = run.phases.get(owner[1])
        if phase is None or task_id not in phase.pending:
            return None
        return run, phase

    def task_finished(self, record: TaskRecord) -> None:
        """Called by the scheduler each time a task ends: advance the job it is a stage of, if any."""
        waiting = self._waiting_stage(record.id)
        if waiting is None:
            return
        run, phase = waiting
        phase.outcomes[phase.pending.pop(record.id)] = record
        if not phase.pending and not phase.launching:
            with self._unpersisted(run):
                self._phase_done(run, phase)

    def task_lost(self, task_id: str, error: StoreError) -> None:
        """Called by the scheduler when a task leaves it with no terminal record (its change could
        not be persisted, or the run it duplicates cannot be read): the job it is a stage of ends
        here as when its own write fails (:meth:`_abandon`) instead of waiting for ever for a
        stage that will not end; ``recover()`` re-drives it from what the store holds."""
        waiting = self._waiting_stage(task_id)
        if waiting is not None:
            self._abandon(waiting[0], error)

    def _phase_done(self, run: _JobRun, phase: _StagePhase) -> None:
        """Every task of a stage (or of its fallback) ended: fall back, fail, or record the result."""
        stage = phase.stage
        outcomes = [record for record in phase.outcomes if record is not None]
        if any(record.status is CANCELLED for record in outcomes):
            self._cancel_from_stage(run, stage.name)
            return
        failed = [i for i, record in enumerate(phase.outcomes) if record is None or not _succeeded(record)]
        fallback = stage.fallback_stage()
        # an orphan recovery failed as interrupted may have been done and billed: sending its work
        # to the fallback would bill the stage twice, as sending it again would (recover() docs)
        interrupted = any(_interrupted(phase.outcomes[i]) for i in failed)
        if failed and fallback is not None and not phase.fallback and not interrupted:
            phase.primary_error = _error_of(phase.outcomes[failed[0]])
            try:
                if fallback.build is None:
                    alternatives = [phase.outcomes[i].payload for i in failed]  # type: ignore[union-attr]
                else:
                    built = self._build(fallback, run.record.inputs, run.record.results, stage)
                    alternatives = [built[i] for i in failed]
            except Exception as error:
                self._fail(run, stage.name, f"fallback build raised {describe_error(error)}")
                return
            self._submit_phase(
                run, phase, fallback, list(zip(failed, alternatives, strict=True)), fallback=True
            )
            return
        if failed:
            reason = _error_of(phase.outcomes[failed[0]])
            if phase.fallback:
                assert fallback is not None
                reason = f"{phase.primary_error}; fallback {fallback.provider!r} failed too: {reason}"
            self._fail(run, stage.name, reason)
            return
        results = [record.result for record in outcomes]
        result: Any = results if stage.fan_out else results[0]
        del run.phases[stage.name]
        self._write(
            run.record.evolve(
                results={**run.record.results, stage.name: result}, updated_at=self.scheduler.runtime.now()
            ),
            run,
        )
        run.done.add(stage.name)
        assert run.spec is not None
        last = len(run.done) == len(run.spec.stages)
        if last:  # every result is in: a cancel from the sink below comes too late
            run.stopping = True
        self._emit_stage(run, stage.name, "succeeded", tuple(record.id for record in outcomes))
        if last:
            self._finish(run, SUCCEEDED)
        else:
            self._launch_ready(run)  # (launches nothing if the sink cancelled the job)

    def _build(
        self, stage: Stage, inputs: Any, results: Mapping[str, Any], primary: Stage | None = None
    ) -> list[Any]:
        """The stage's payloads (one per task); raises what ``build`` raised, or ``TypeError``."""
        fan_out = (primary or stage).fan_out
        # a build gets copies all the way down: one that edits what it is given (results["a"]["x"] = ...)
        # changed stage a's stored result in a memory store, and not in a durable one
        payload = inputs if stage.build is None else stage.build(*copy.deepcopy((inputs, dict(results))))
        if not fan_out:
            return [payload]
        limit = (primary or stage).max_fan_out
        name = (primary or stage).name
        if isinstance(payload, list | tuple):
            if len(payload) > limit:
                raise FanOutLimitError(name, len(payload), limit)
            return list(payload)
        if isinstance(payload, Iterator):  # read one element past the cap, no further
            elements = list(itertools.islice(payload, limit + 1))
            if len(elements) > limit:
                raise FanOutLimitError(name, None, limit)
            return elements
        raise TypeError(
            f"a fan-out stage's build must return a list or an iterator, got {type(payload).__name__}"
        )

    def _fail(self, run: _JobRun, stage: str, reason: str) -> None:
        if run.finished:
            return
        if run.record.status is QUEUED:
            self._move(run, RUNNING)
        message = job_failure_message(stage, reason)
        run.stopping = True  # the failure is decided: a cancel from the sink below comes too late
        self._emit_stage(run, stage, "failed", (), message)
        self._stop_stages(run, cancel_running=False)
        self._finish(run, FAILED, failed_stage=stage, error=message)

    def _cancel_from_stage(self, run: _JobRun, stage: str) -> None:
        """A stage task was cancelled from outside (``scheduler.cancel``, ``close``): so is the job."""
        run.stopping = True
        self._emit_stage(run, stage, "cancelled", ())
        self._stop_stages(run, cancel_running=True)
        self._finish(run, CANCELLED, failed_stage=stage)

    def _stop_stages(self, run: _JobRun, *, cancel_running: bool) -> None:
        """Stop an ending job's stage tasks, before its terminal write: a crash between the two
        leaves a job that recovery ends again, not a terminal job whose queued tasks it would send.

        Queued tasks and waiting duplicates are cancelled. Running ones too with ``cancel_running``;
        without it (the job failed), a call at the provider finishes and is kept, but no attempt
        starts after it, and a task between attempts (a backoff, a wait for quota) is cancelled."""
        run.stopping = True
        for task_id, task in self._live_stage_tasks(run):
            if cancel_running or not task.in_call:
                self.scheduler.cancel(task_id)
            else:
                task.last_attempt = True

    def _fail_stored(self, record: JobRecord, problem: str) -> None:
        """Fail a stored job that recovery cannot run, in one write (queued -> running -> failed)."""
        now = self.scheduler.runtime.now()
        message = f"job cannot continue: {problem}"
        moved = record
        if moved.status is QUEUED:
            moved = job_transition(moved, RUNNING, now)
        done = job_transition(moved, FAILED, now, error=message)
        self._write(done)
        self._emit(record.status, done)

    # ------------------------------------------------------------------ transitions
    @contextlib.contextmanager
    def _unpersisted(self, run: _JobRun) -> Iterator[None]:
        """Around each step that writes a job: if the store refuses a write, end the job here.

        The handle must not wait forever for a job whose progress cannot be recorded. It resolves
        ``failed`` in this process, saying the store failed and that the stored record stops at
        the last write that succeeded, from which ``recover()`` re-drives the job.
        """
        try:
            yield
        except StoreError as error:
            if self._crashed or self._host.crashed:
                raise
            self._abandon(run, error)

    def _abandon(self, run: _JobRun, error: StoreError) -> None:
        if run.finished:
            return
        run.finished = True
        self._runs.pop(run.record.id, None)
        now = self.scheduler.runtime.now()
        old = run.record
        record = old if old.status is not QUEUED else job_transition(old, RUNNING, now)
        if not record.status.is_terminal:
            failed = "store write failed" if isinstance(error, StoreWriteError) else "store failed"
            message = (
                f"{failed}: {describe_error(error)}; this job's later progress was not "
                "persisted (recover() re-drives it from the last write that succeeded)"
            )
            record = job_transition(record, FAILED, now, error=message)
        run.record = record
        self._emit(old.status, record)
        resolve(run, record)
        if record.id in self._waiters:
            self._resolve_waiters(record.id, record)
        if not self._runs:
            self._idle.notify()

    def _write(self, record: JobRecord, run: _JobRun | None = None) -> None:
        """Persist ``record`` (and make it ``run``'s record); a crashed process writes nothing."""
        if self._crashed or self._host.crashed:
            raise Cancelled()
        self.store.update_job(record)
        self._host.staged()  # with a store that defers commits, a flush follows
        if run is not None:
            run.record = record

    def _move(self, run: _JobRun, status: JobStatus, **changes: Any) -> JobRecord:
        old = run.record
        record = job_transition(old, status, self.scheduler.runtime.now(), **changes)
        self._write(record, run)
        self._emit(old.status, record)
        return record

    def _finish(self, run: _JobRun, status: JobStatus, **changes: Any) -> None:
        record = self._move(run, status, **changes)
        run.finished = True
        for task_ids in record.stage_tasks.values():
            for task_id in task_ids:
                self._stage_tasks.pop(task_id, None)
        # with a store that defers commits, the job ends once its terminal write is durable
        self._host.when_durable(lambda lost: self._settle(run, record, lost))

    def _settle(self, run: _JobRun, record: JobRecord, lost: StoreWriteError | None) -> None:
        """The terminal ``record`` is durable (``lost`` is None): the handle resolves with it and the
        duplicates waiting on the job share it, as a task's submission resolves only after its
        terminal write is committed. A flush that rolled it back (``lost``) resolves the handle with
        that error instead; the stored job stays where its last durable write left it, for recover()."""
        self._runs.pop(record.id, None)
        if lost is None:
            resolve(run, record)
            if record.id in self._waiters:
                self._resolve_waiters(record.id, record)
        else:
            resolve_with_error(run, lost)
            for waiter_id in self._waiters.pop(record.id, ()):
                waiter = self._runs.get(waiter_id)
                if waiter is not None and waiter.waiting_on == record.id:
                    waiter.waiting_on = None
                    self._abandon(waiter, lost)
        if not self._runs:
            self._idle.notify()

    # ------------------------------------------------------------------ observability
    def _emit(self, old: JobStatus | None, record: JobRecord) -> None:
        events = self.scheduler.events
        if events is not None:
            self._send(
                events,
                JobTransition(
                    time=record.updated_at,
                    job_id=record.id,
                    key=record.key,
                    name=record.name,
                    priority=int(record.priority),
                    old=None if old is None else old.value,
                    new=record.status.value,
                    stage=record.failed_stage,
                    error=record.error,
                ),
            )

    def _emit_stage(
        self, run: _JobRun, stage: str, event: str, task_ids: tuple[str, ...], error: str | None = None
    ) -> None:
        events = self.scheduler.events
        if events is not None:
            self._send(
                events, StageEvent(self.scheduler.runtime.now(), run.record.id, stage, event, task_ids, error)
            )

    def _send(self, events: Any, event: Any) -> None:
        """Give ``event`` to the sink. Its events are sent in the middle of a job's steps: a sink that
        raises must not cut one short (the job was left stored but never run, or finished but never
        resolved), so the error is handed to the runtime as a failing callback of its own, which
        reports it (``SimPyRuntime.task_errors``, asyncio's exception handler), and the job goes on."""
        try:
            events(event)
        except Exception as error:

            def report(failure: Exception = error) -> None:  # bound now: `error` is unset after except
                raise failure

            self.scheduler.runtime.call_soon(report, name=f"job event sink ({type(event).__name__})")


def changed_spec_problem(spec: JobSpec, stored: JobRecord) -> str:
    """Why ``spec`` may not run ``stored``'s pipeline: it has its name and version, not its stages."""
    return (
        f"the JobSpec {spec.name!r} version {spec.version!r} given here differs from the one job "
        f"{stored.id!r} was submitted with (its key does not match): a changed pipeline needs a new version"
    )


def stage_task_key(stage: Stage, payload: Any) -> str:
    """The idempotency key of a stage task: the task fingerprint of its kind, payload and version."""
    return fingerprint(stage.task_kind, payload, version=stage.version)


def _error_of(record: TaskRecord | None) -> str:
    return "the task never started" if record is None else str(record.error)


def _interrupted(record: TaskRecord | None) -> bool:
    """A stage task that ``recover()`` failed as interrupted: its call was in flight when the process
    stopped, and may have been done (and billed) without its answer being kept."""
    return record is not None and record.error is not None and record.error.startswith(_INTERRUPTED)


_INTERRUPTED = f"{TaskInterruptedError.__name__}:"
"""How the error of a task recovery failed as interrupted begins (``describe_error``)."""


def _succeeded(record: TaskRecord) -> bool:
    """A stage task that produced a result (its own, or a finished owner's through dedup)."""
    return record.status in (SUCCEEDED, DEDUPED) and record.error is None


async def recover_jobs(
    scheduler: Scheduler, jobs: Jobs | None, adopted: frozenset[str | None] | None
) -> JobRecoveryReport | None:
    """The jobs step of ``Scheduler.recover``: re-drive unfinished jobs (None if the store keeps none).

    ``jobs``: the scheduler's orchestrator, if it has one. Without one, one is created when the
    store holds unfinished jobs, so that every one of them ends terminal: without registered specs
    they end ``failed``, saying so.
    """
    if jobs is None:
        store = scheduler.store
        if not keeps_jobs(store) or not store.list_jobs(QUEUED, RUNNING):  # type: ignore[attr-defined]
            return None
        jobs = Jobs(scheduler)
    return await jobs.recover(adopted)


def keeps_jobs(store: object) -> bool:
    """Whether ``store`` has a job table: it implements :class:`JobStore`, and so does the store it
    wraps, if it is a wrapper with an ``inner`` store (e.g. :class:`~aiqsim.sim.crash.CrashingStore`)."""
    return isinstance(store, JobStore) and isinstance(getattr(store, "inner", store), JobStore)
