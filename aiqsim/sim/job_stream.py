"""The job keys (:func:`aiqsim.sim.job_metrics.summarize_jobs`) in streaming mode.

:class:`StreamingJobs` follows the run's events (job transitions, stage events, task transitions,
attempt records) and the provider ledger's executions, keeps what each job *in progress* needs,
and when a job is done computes its row with the full-record mode's own code
(:func:`~aiqsim.sim.job_metrics.job_row` over the same :class:`~aiqsim.sim.job_metrics._Index`
structure, kept up to date instead of built from a list), adds it to a
:class:`~aiqsim.sim.job_metrics.JobTotals` and forgets it. Every job key is therefore identical
to the full-record mode's, but the latency percentiles, which come from a
:class:`~aiqsim.sim.streaming.RelativeErrorHistogram` (within its relative error). ``result.jobs``
and ``stage_breakdown()`` still need the rows and raise ``RecordsNotKeptError``.

**When a job's row is final.** A job is *settled* once the job is terminal, each of its stage
tasks is terminal, the provider has recorded every call those tasks made (a timed-out call is
recorded, and billed, when the server finishes it) and the key window has passed since the last of
these (calls cancelled mid-flight are recorded by the server without any attempt record: the window
is their grace). Its critical-path split also reads, for each of its calls, the lane's latest
grant to another call before its own, and a retry's grant is reported only when that attempt ends:
so a settled job also waits until every lane's *watermark* (the earliest time a grant not yet
reported can have, i.e. the last reported attempt end of each task running in the lane, or now)
has passed its calls' grants. With that, the row equals the full-record row whatever the window
(tests/test_streaming_jobs.py settles with a ~0 grace). What the window does bound is the state
shared between jobs: a call deduplicated against a call of a job settled more than ``window_s``
before, or a key billed again that long after its original, is not recognised as such -- the rule
of the task accumulators (:mod:`aiqsim.sim.streaming`), whose store and providers forget those keys
after the window anyway.

**Memory.** The jobs in progress (their tasks, attempts, stage events), the lanes' grants since
the oldest unsettled call, and for ``window_s`` after a job settles its tasks' phases and owners
(a later double-click's calls are deduplicated against them) -- flat in the number of jobs. The
store's own job table is purged with its tasks by :class:`~aiqsim.stores.retention.RetentionPolicy`
(the key window as both TTLs), so it too holds only the jobs of the last ~1.5 windows.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from aiqsim.core.job import JobRecord
from aiqsim.core.task import Priority, TaskStatus
from aiqsim.scheduler.events import AttemptRecord, TaskTransition
from aiqsim.scheduler.job_events import JobTransition, StageEvent
from aiqsim.sim.config import Scenario
from aiqsim.sim.job_metrics import JobShape, JobTotals, LaneGrants, _Index, _Phases, job_row
from aiqsim.sim.recent_keys import RecentKeys
from aiqsim.sim.streaming import DEFAULT_RELATIVE_ERROR, RelativeErrorHistogram

_TERMINAL = frozenset({"succeeded", "failed", "cancelled", "deduped"})
_STATUS = {status.value: status for status in TaskStatus}


class _TaskView:
    """What a job's row reads of one stage task (the :class:`~aiqsim.core.task.TaskRecord` fields
    :func:`~aiqsim.sim.job_metrics.job_row` uses), plus the provider calls it made and had recorded."""

    __slots__ = (
        "calls",
        "created_at",
        "deduped_from",
        "finished_at",
        "id",
        "job_id",
        "key",
        "phases",
        "provider",
        "recorded",
        "status",
    )

    def __init__(self, task_id: str, job_id: str, key: str, provider: str, created_at: float) -> None:
        self.id = task_id
        self.job_id = job_id
        self.key = key
        self.provider = provider
        self.created_at = created_at
        self.finished_at: float | None = None
        self.status = TaskStatus.QUEUED
        self.deduped_from: str | None = None
        self.calls = 0
        """Provider calls its attempt records say were sent."""
        self.recorded = 0
        """Provider executions recorded for it (a call is recorded once the server is done)."""
        self.phases: _Phases | None = None
        """Its phases, fixed when its job settled (a later duplicate's owner is read from here)."""


class _JobView:
    __slots__ = (
        "created_at",
        "error",
        "failed_stage",
        "finished_at",
        "id",
        "key",
        "name",
        "priority",
        "stage_tasks",
        "status",
    )

    def __init__(self, e: JobTransition) -> None:
        self.id = e.job_id
        self.key = e.key
        self.name = e.name
        self.priority = e.priority
        self.created_at = e.time
        self.status = e.new
        self.finished_at: float | None = None
        self.failed_stage: str | None = None
        self.error: str | None = None
        self.stage_tasks: dict[str, list[str]] = {}

    def record(self) -> JobRecord:
        return JobRecord(
            id=self.id,
            key=self.key,
            name=self.name,
            version="",
            priority=Priority(self.priority),
            status=_STATUS[self.status],
            created_at=self.created_at,
            finished_at=self.finished_at,
            stage_tasks=self.stage_tasks,
            failed_stage=self.failed_stage,
            error=self.error,
        )


def _stored_job_transition(record: JobRecord, old: str | None, new: str, time: float) -> JobTransition:
    """The transition event of a job change found in the store (:meth:`StreamingJobs.reconcile`)."""
    return JobTransition(
        time,
        record.id,
        record.key,
        record.name,
        int(record.priority),
        old,
        new,
        record.failed_stage,
        record.error,
    )


class _SettledIndex(_Index):
    """The live index; a task whose job settled answers with the phases fixed then."""

    def phases(self, task: Any) -> _Phases:
        fixed = getattr(task, "phases", None)
        return fixed if fixed is not None else super().phases(task)


class StreamingJobs:
    """The job summary keys as the run goes (see the module docstring)."""

    def __init__(
        self, scenario: Scenario, window_s: float, relative_error: float = DEFAULT_RELATIVE_ERROR
    ) -> None:
        self.window_s = window_s
        self.totals = JobTotals(
            scenario, RelativeErrorHistogram(relative_error), RelativeErrorHistogram(relative_error)
        )
        self.shape = JobShape(scenario)
        self.rejected_count = 0
        self.now = 0.0
        self._arrivals: dict[str, float] = {}
        self._arrived: dict[str, float] = {}
        self._jobs: dict[str, _JobView] = {}
        self._tasks: dict[str, _TaskView] = {}
        self._task_job: dict[str, str] = {}
        """Stage task id -> job id, from the stage events (sent before the tasks are submitted)."""
        self._granted: dict[str, float] = {}
        self._attempts: dict[str, list[AttemptRecord]] = {}
        self._stage_events: dict[tuple[str, str], list[StageEvent]] = {}
        self._lanes: dict[str, LaneGrants] = {}
        self._running: dict[str, dict[str, float]] = {}
        """Provider -> running task -> the earliest time its next unreported grant can have."""
        self._unsettled_grants: dict[str, dict[str, float]] = {}
        """Provider -> granted stage task of a job not settled yet -> its first grant."""
        self._owner: dict[str, str] = {}
        """Idempotency key -> the stage task that last succeeded with it (a duplicate's owner)."""
        self._billed: dict[str, tuple[float, str, float]] = {}
        """Idempotency key -> (start, task, cost) of its original billed execution (earliest start)."""
        self._calls: dict[str, int] = {}
        self._costs: dict[str, list[float]] = {}
        self._duplicates: dict[str, list[float]] = {}
        self._done: deque[str] = deque()
        """Terminal jobs, in the order they ended, waiting to settle."""
        self._settled_tasks: RecentKeys[str] = RecentKeys(window_s)
        self._keys: RecentKeys[str] = RecentKeys(window_s)
        self._live_keys: dict[str, int] = {}
        """Idempotency key -> stage tasks of unsettled jobs with it (their keys are never forgotten)."""
        self._next_sweep = 0.0
        self._sweep_every = max(min(window_s / 4.0, 10.0), 1e-3)
        self.index = _SettledIndex(
            self._tasks, self._granted, self._attempts, self._stage_events, self._lanes
        )

    # ------------------------------------------------------------------ inputs
    def arrival(self, job_id: str, time: float) -> None:
        """A user submitted job ``job_id`` at ``time`` (its latency counts from here)."""
        self._arrivals[job_id] = time

    def rejected(self, job_id: str) -> None:
        """The scheduler refused job ``job_id`` at the door: no job record exists."""
        self._arrivals.pop(job_id, None)
        self.rejected_count += 1

    def event(self, event: Any) -> None:
        """Consume one scheduler event (job transitions, stage events, task transitions, attempts)."""
        kind = type(event)
        if kind is TaskTransition:
            self._transition(event)
        elif kind is AttemptRecord:
            self._attempt(event)
            self._tick(event.end)
            return
        elif kind is StageEvent:
            self._stage(event)
        elif kind is JobTransition:
            self._job(event)
        else:
            return
        self._tick(event.time)

    def reconcile(self, store: Any) -> None:
        """After a simulated crash, take in the job writes whose events the dead process never
        emitted (:meth:`~aiqsim.sim.streaming_run.StreamingRun.reconcile`), as the full-record rows
        read the job records: a job stored without its creation event (its arrival is still pending
        here; one without a record was never stored and is dropped), a job stored in a state its
        events never announced, stage tasks stored without their stage event, and a live job whose
        insert was staged for a group commit the crash lost (dropped: the store never had it)."""
        for job_id in list(self._arrivals):
            record = store.get_job(job_id)
            if record is None:
                del self._arrivals[job_id]
            else:
                self._job(_stored_job_transition(record, None, "queued", record.created_at))
        for job in list(self._jobs.values()):
            record = store.get_job(job.id)
            if record is None:
                if job.status not in _TERMINAL:  # staged for a group commit the crash lost: never stored
                    del self._jobs[job.id]
                    self._arrived.pop(job.id, None)
                continue  # a terminal one was purged by retention: it settled long ago
            for stage, task_ids in record.stage_tasks.items():
                if job.stage_tasks.get(stage) != task_ids:
                    job.stage_tasks[stage] = list(task_ids)
                    for task_id in task_ids:
                        self._task_job[task_id] = job.id
            if record.status.value != job.status:
                self._job(_stored_job_transition(record, job.status, record.status.value, record.updated_at))

    def _job(self, e: JobTransition) -> None:
        job = self._jobs.get(e.job_id)
        if job is None:
            job = self._jobs[e.job_id] = _JobView(e)
            self._arrived[e.job_id] = self._arrivals.pop(e.job_id, e.time)
        was_done = job.status in _TERMINAL
        job.status = e.new
        job.failed_stage, job.error = e.stage, e.error
        if e.new in _TERMINAL:
            job.finished_at = e.time
            if not was_done:
                self._done.append(e.job_id)
        else:
            job.finished_at = None

    def _stage(self, e: StageEvent) -> None:
        job = self._jobs.get(e.job_id)
        if job is None:
            return
        self._stage_events.setdefault((e.job_id, e.stage), []).append(e)
        if e.event in ("submitted", "fallback"):
            job.stage_tasks[e.stage] = [*job.stage_tasks.get(e.stage, []), *e.task_ids]
            for task_id in e.task_ids:
                self._task_job[task_id] = e.job_id

    def _transition(self, e: TaskTransition) -> None:
        task_id, provider, new = e.task_id, e.provider, e.new
        running = self._running.get(provider)
        if running is None:
            running = self._running[provider] = {}
        if new == "running":
            running[task_id] = e.time
        else:
            running.pop(task_id, None)
        if e.old == "queued" and new == "running":
            lane = self._lanes.get(provider)
            if lane is None:
                lane = self._lanes[provider] = LaneGrants()
            lane.add(e.time, task_id)
        task = self._task_view(e)
        if task is None:
            return
        if e.old == "queued" and new == "running" and task_id not in self._granted:
            self._granted[task_id] = e.time
            self._unsettled_grants.setdefault(provider, {})[task_id] = e.time
        self._set_status(task, e)

    def stored(self, e: TaskTransition) -> None:
        """A stage task's state found in the store after a simulated crash, whose event the dead
        process never emitted (:meth:`~aiqsim.sim.streaming_run.StreamingRun.reconcile`). The
        full-record rows read a task's status and end from its record but its grants and attempts
        from the events, so only the status is taken: no grant, no running attempt."""
        running = self._running.get(e.provider)
        if running is not None and e.new != "running":
            running.pop(e.task_id, None)
        task = self._task_view(e)
        if task is not None:
            self._set_status(task, e)
        self._tick(e.time)

    def _task_view(self, e: TaskTransition) -> _TaskView | None:
        """The view of stage task ``e.task_id`` (made at its first event), None outside jobs."""
        job_id = self._task_job.get(e.task_id)
        if job_id is None:
            return None
        task = self._tasks.get(e.task_id)
        if task is None:
            task = self._tasks[e.task_id] = _TaskView(e.task_id, job_id, e.key, e.provider, e.time)
            self._live_keys[e.key] = self._live_keys.get(e.key, 0) + 1
        return task

    def _set_status(self, task: _TaskView, e: TaskTransition) -> None:
        """Take ``e``'s status (and end, and owner of its key) into ``task``'s view."""
        new = e.new
        task.status = _STATUS[new]
        task.finished_at = e.time if new in _TERMINAL else None
        if new == "succeeded":
            self._owner[e.key] = task.id
            self._keys.touch(e.key, e.time)
        elif new == "deduped":
            task.deduped_from = self._owner.get(e.key)

    def _attempt(self, e: AttemptRecord) -> None:
        running = self._running.get(e.provider)
        if running is not None and e.task_id in running:
            running[e.task_id] = e.end  # its next attempt (a new grant) starts after this one ended
        if e.attempt > 1:
            lane = self._lanes.get(e.provider)
            if lane is None:
                lane = self._lanes[e.provider] = LaneGrants()
            lane.add(e.start, e.task_id)
        task = self._tasks.get(e.task_id)
        if task is None:
            return
        self._attempts.setdefault(e.task_id, []).append(e)
        if e.decision != "rejected":  # refused by a gate: never sent
            task.calls += 1

    def execution(self, x: Any) -> None:
        """Consume one provider ledger record (billing and call counts of the stage tasks)."""
        task = self._tasks.get(x.task_id)
        if task is None:
            self._tick(x.end)
            return
        task.recorded += 1
        self._calls[x.task_id] = self._calls.get(x.task_id, 0) + 1
        if x.billed:
            self._costs.setdefault(x.task_id, []).append(x.cost)
            first = self._billed.get(x.key)
            if first is None:
                self._billed[x.key] = (x.start, x.task_id, x.cost)
            elif x.start < first[0]:  # an earlier start is the original: the former one was a duplicate
                self._billed[x.key] = (x.start, x.task_id, x.cost)
                if first[1] in self._tasks:
                    self._duplicates.setdefault(first[1], []).append(first[2])
            else:
                self._duplicates.setdefault(x.task_id, []).append(x.cost)
            self._keys.touch(x.key, x.end)
        self._tick(x.end)

    # ------------------------------------------------------------------ settling
    def _tick(self, now: float) -> None:
        if now > self.now:
            self.now = now
        if self.now >= self._next_sweep:
            self._next_sweep = self.now + self._sweep_every
            self._sweep()

    def _watermarks(self) -> dict[str, float]:
        """Per lane, the earliest time a grant not reported yet can have."""
        now = self.now
        return {
            provider: min(running.values(), default=now) if running else now
            for provider, running in self._running.items()
        }

    def _settleable(self, job_id: str, marks: dict[str, float]) -> bool:
        job = self._jobs[job_id]
        if job.status not in _TERMINAL or job.finished_at is None:
            return True  # back to a live state (a recovered job): dropped from the queue
        last = job.finished_at
        for ids in job.stage_tasks.values():
            for task_id in ids:
                task = self._tasks.get(task_id)
                if task is None:
                    continue
                if task.finished_at is None or task.recorded < task.calls:
                    return False
                last = max(last, task.finished_at)
                for member in (task, self.index.owner(task)):
                    granted = self._granted.get(member.id)
                    if granted is not None and not marks.get(member.provider, self.now) > granted:
                        return False
        return self.now - last >= self.window_s

    def _sweep(self) -> None:
        """Settle the terminal jobs whose rows are final; forget what the window no longer needs."""
        marks = self._watermarks()
        waiting: deque[str] = deque()
        while self._done:
            job_id = self._done.popleft()
            job = self._jobs.get(job_id)
            if job is None:
                continue
            if job.finished_at is not None and self.now - job.finished_at < self.window_s:
                waiting.append(job_id)  # jobs end in queue order: none after this one can settle yet
                waiting.extend(self._done)
                self._done.clear()
                break
            if not self._settleable(job_id, marks):
                waiting.append(job_id)
            elif job.status in _TERMINAL:
                self._settle(job)
        self._done = waiting
        for task_id in self._settled_tasks.expired(self.now):
            task = self._tasks.pop(task_id, None)
            if task is not None:
                self._task_job.pop(task_id, None)
        for key in self._keys.expired(self.now):
            if key in self._live_keys:  # a call of an unsettled job has it: a duplicate may still come
                self._keys.touch(key, self.now)
                continue
            self._owner.pop(key, None)
            self._billed.pop(key, None)
        for provider, lane in self._lanes.items():
            cutoff = min(self._unsettled_grants.get(provider, {}).values(), default=math.inf)
            lane.prune(min(cutoff, marks.get(provider, self.now)))

    def _settle(self, job: _JobView) -> None:
        """Count ``job``'s row, fix its tasks' phases and drop the rest of its state."""
        arrived = self._arrived.pop(job.id, job.created_at)
        record = job.record()
        self.totals.add(
            job_row(record, self.index, self.shape, arrived, self._calls, self._costs, self._duplicates)
        )
        del self._jobs[job.id]
        for stage, ids in job.stage_tasks.items():
            self._stage_events.pop((job.id, stage), None)
            for task_id in ids:
                task = self._tasks.get(task_id)
                if task is None:
                    self._task_job.pop(task_id, None)
                    continue
                task.phases = self.index.phases(task)
                live = self._live_keys[task.key] - 1
                if live:
                    self._live_keys[task.key] = live
                else:
                    del self._live_keys[task.key]
                self._granted.pop(task_id, None)
                self._attempts.pop(task_id, None)
                self._calls.pop(task_id, None)
                self._costs.pop(task_id, None)
                self._duplicates.pop(task_id, None)
                self._unsettled_grants.get(task.provider, {}).pop(task_id, None)
                self._settled_tasks.touch(task_id, self.now)

    # ------------------------------------------------------------------ output
    @property
    def retained(self) -> dict[str, int]:
        """How many entries each per-job / per-task structure holds now (for memory checks)."""
        return {
            "jobs": len(self._jobs),
            "tasks": len(self._tasks),
            "attempts": len(self._attempts),
            "stage_events": len(self._stage_events),
            "lane_grants": sum(len(lane) for lane in self._lanes.values()),
            "keys": len(self._billed) + len(self._owner),
        }

    def summary(self, sim_time_s: float) -> dict[str, Any]:
        """The job keys at the end of the run: every job not settled yet is counted as it stands."""
        self.now = max(self.now, sim_time_s)
        for job in sorted(self._jobs.values(), key=lambda j: j.created_at):
            self._settle(job)
        self._done.clear()
        return self.totals.summary(
            rejected=self.rejected_count,
            percentile=lambda h, q: h.percentile(q) if h.count else math.nan,
        )
