"""Job metrics: end-to-end latency, where a job's time went, what it cost, and the bottleneck stage.

Everything is derived from what a run already records: the job records (the store), the stage
task records, the scheduler's event stream (:class:`TaskTransition`, :class:`AttemptRecord`,
:class:`StageEvent`) and the simulated providers' ledger (billing). Nothing here schedules.

**Where a job's time went.** A job's latency (user arrival to terminal) is walked back along its
*critical path*: the stage that ended last, then whichever of the stages it waited for ended last,
and so on. Each stage on that path contributes its window (first submission of its calls to the
stage's end). Within the window the stage's *critical call* (the one that finished last; after a
fallback, the failed primary call and then its fallback call) is split into:

- ``queue_wait``: queued behind other calls of the same provider (from the call's creation until
  the provider's previous grant to another call; a quota that paces the queue shows up here too);
- ``quota_wait``: first in line, waiting for its own quota reservation (tokens, requests,
  concurrency) and any overload gate;
- ``retries``: from the first attempt's start to the last attempt's start (failed attempts,
  backoff, waiting for quota again), plus a failed last attempt;
- ``service``: the successful last attempt.

A deduplicated call is split as the run it shared. Time on the path not covered (the process
down after a crash, gaps between stages) is ``other``; the five parts add up to the latency.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from aiqsim.core.job import JobRecord
from aiqsim.core.task import DEDUPED, FAILED, Priority, TaskRecord
from aiqsim.scheduler.events import AttemptRecord, TaskTransition
from aiqsim.scheduler.job_events import StageEvent

if TYPE_CHECKING:
    import pandas as pd

    from aiqsim.sim.config import Scenario

PARTS = ("queue_wait", "quota_wait", "retries", "service", "other")
"""The parts a job's latency is split into (see the module docstring)."""

JOB_SUMMARY_KEYS: dict[str, str] = {
    "jobs_submitted": "job submissions the scheduler accepted (a job record exists)",
    "jobs_rejected": "job submissions refused at the door (queue depth limit)",
    "jobs_succeeded": "jobs that ended succeeded (every stage produced its result)",
    "jobs_failed": "jobs that ended failed (a stage failed, and its fallback too if any)",
    "jobs_cancelled": "jobs that ended cancelled",
    "jobs_deduped": "jobs that ended deduped (a double-click sharing another job's run)",
    "jobs_lost": "accepted jobs not terminal at the end of the run (should be 0)",
    "job_latency_p50_s": "median arrival-to-end time of succeeded jobs (s)",
    "job_latency_p95_s": "95th percentile arrival-to-end time of succeeded jobs (s)",
    "job_latency_p99_s": "99th percentile arrival-to-end time of succeeded jobs (s)",
    "job_time_to_failure_p50_s": "median arrival-to-failure time of failed jobs (s): how long a user waits "
    "to hear that it failed",
    "job_time_to_failure_p95_s": "95th percentile arrival-to-failure time of failed jobs (s)",
    "job_queue_wait_mean_s": "mean critical-path time of succeeded jobs queued behind other calls (s)",
    "job_quota_wait_mean_s": "mean critical-path time of succeeded jobs waiting for their own quota (s)",
    "job_retries_mean_s": "mean critical-path time of succeeded jobs lost to failed attempts and backoff (s)",
    "job_service_mean_s": "mean time succeeded jobs' successful calls took, on the critical path (s)",
    "bottleneck_stage": "the stage with the largest share of succeeded jobs' latency (critical-path time "
    "summed over jobs; '-' if no job succeeded)",
    "bottleneck_share": "that stage's share of the summed latency of succeeded jobs",
    "cost_per_job": "money billed for job calls / jobs that ran their own stages (not deduped)",
    "cost_per_succeeded_job": "money billed for job calls (failed jobs' included) / succeeded jobs",
    "duplicate_cost_per_job": "money billed for duplicate executions of job calls / jobs that ran their "
    "own stages",
}
"""Every job summary key with its definition (present when a scenario has job workloads)."""


@dataclass(frozen=True, slots=True)
class _Phases:
    """One call's life as phase boundaries (virtual times); ``None`` where it never got there."""

    created: float
    queue_end: float
    granted: float | None
    first_start: float | None
    last_start: float | None
    succeeded: bool
    finished: float | None


class LaneGrants:
    """One provider lane's grants (time, task id), in time order (ties: task id), for the question
    "when did the lane last grant another call, at or before ``t``?". Grants may be added out of
    order (a retry's grant is reported when its attempt ends); :meth:`prune` drops old ones."""

    __slots__ = ("owned", "times")

    def __init__(self, owned: Iterable[tuple[float, str]] = ()) -> None:
        self.owned: list[tuple[float, str]] = sorted(owned)
        self.times: list[float] = [time for time, _ in self.owned]

    def add(self, time: float, task_id: str) -> None:
        """One grant (kept in order)."""
        index = bisect.bisect_right(self.owned, (time, task_id))
        self.owned.insert(index, (time, task_id))
        self.times.insert(index, time)

    def previous(self, task_id: str, before: float) -> float | None:
        """The latest grant to a call other than ``task_id`` at or before ``before``."""
        index = bisect.bisect_right(self.times, before) - 1
        owned = self.owned
        while index >= 0:
            if owned[index][1] != task_id:
                return owned[index][0]
            index -= 1
        return None

    def prune(self, cutoff: float) -> None:
        """Drop the grants before ``cutoff`` but the latest of them: enough for every call whose own
        first grant is at or after ``cutoff`` (none of the dropped grants is its own)."""
        index = bisect.bisect_left(self.times, cutoff) - 1
        if index > 0:
            del self.owned[:index]
            del self.times[:index]

    def __len__(self) -> int:
        return len(self.owned)


class _Index:
    """Events and records of a run, indexed for the per-call phase split.

    ``tasks`` maps task ids to records (anything with ``id``, ``provider``, ``status``,
    ``created_at``, ``finished_at`` and ``deduped_from``), ``granted`` a task's first grant,
    ``attempts`` its attempt records, ``stage_events`` a (job, stage)'s events and ``lanes`` each
    provider's :class:`LaneGrants`. :meth:`from_events` builds them from a run's whole event list;
    the streaming mode (:mod:`aiqsim.sim.job_stream`) keeps them up to date as the run goes.
    """

    def __init__(
        self,
        tasks: Mapping[str, Any],
        granted: Mapping[str, float],
        attempts: Mapping[str, Sequence[AttemptRecord]],
        stage_events: Mapping[tuple[str, str], Sequence[StageEvent]],
        lanes: Mapping[str, LaneGrants],
    ) -> None:
        self.tasks = tasks
        self.granted = granted
        self.attempts = attempts
        self.stage_events = stage_events
        self.lanes = lanes

    @classmethod
    def from_events(cls, tasks: Mapping[str, TaskRecord], events: Sequence[Any]) -> _Index:
        """The index of a run's records and its whole event list."""
        granted: dict[str, float] = {}
        attempts: dict[str, list[AttemptRecord]] = defaultdict(list)
        stage_events: dict[tuple[str, str], list[StageEvent]] = defaultdict(list)
        owned: dict[str, list[tuple[float, str]]] = defaultdict(list)
        for event in events:
            if isinstance(event, TaskTransition) and event.old == "queued" and event.new == "running":
                granted.setdefault(event.task_id, event.time)
                owned[event.provider].append((event.time, event.task_id))
            elif isinstance(event, AttemptRecord):
                attempts[event.task_id].append(event)
                if event.attempt > 1:  # a retry's attempt got its reservation anew
                    owned[event.provider].append((event.start, event.task_id))
            elif isinstance(event, StageEvent):
                stage_events[(event.job_id, event.stage)].append(event)
        lanes = {provider: LaneGrants(grants) for provider, grants in owned.items()}
        return cls(tasks, granted, attempts, stage_events, lanes)

    def _previous_grant(self, provider: str, task_id: str, before: float) -> float | None:
        """The latest grant in ``provider``'s lane to another call at or before ``before``."""
        lane = self.lanes.get(provider)
        return None if lane is None else lane.previous(task_id, before)

    def phases(self, task: TaskRecord) -> _Phases:
        granted = self.granted.get(task.id)
        attempts = sorted(self.attempts.get(task.id, ()), key=lambda a: a.attempt)
        queue_end = task.created_at
        if granted is not None:
            previous = self._previous_grant(task.provider, task.id, granted)
            if previous is not None:
                queue_end = min(max(task.created_at, previous), granted)
        return _Phases(
            created=task.created_at,
            queue_end=queue_end,
            granted=granted,
            first_start=attempts[0].start if attempts else None,
            last_start=attempts[-1].start if attempts else None,
            succeeded=bool(attempts) and attempts[-1].outcome == "ok",
            finished=task.finished_at,
        )

    def owner(self, task: TaskRecord) -> TaskRecord:
        """The task whose run ``task`` shared (itself if it ran its own)."""
        seen = {task.id}
        while task.deduped_from is not None and task.deduped_from in self.tasks:
            task = self.tasks[task.deduped_from]
            if task.id in seen:
                break
            seen.add(task.id)
        return task


def _intervals(phases: _Phases) -> list[tuple[str, float, float]]:
    """The call's phases as (part, start, end) intervals."""
    end = phases.finished if phases.finished is not None else math.inf
    out = [("queue_wait", phases.created, phases.queue_end)]
    if phases.granted is None:
        return out
    first = phases.first_start if phases.first_start is not None else end
    out.append(("quota_wait", phases.queue_end, first))
    if phases.first_start is None or phases.last_start is None:
        return out
    if phases.succeeded:
        out.append(("retries", phases.first_start, phases.last_start))
        out.append(("service", phases.last_start, end))
    else:
        out.append(("retries", phases.first_start, end))
    return out


def _split_stage(index: _Index, task_ids: Sequence[str], start: float, end: float) -> dict[str, float]:
    """Split the stage window [start, end] over its critical call chain (see the module docstring)."""
    parts = dict.fromkeys(PARTS, 0.0)
    tasks = [index.tasks[t] for t in task_ids if t in index.tasks]
    finished = [t for t in tasks if t.finished_at is not None]
    chain: list[TaskRecord] = []
    if finished:
        current = max(finished, key=lambda t: (t.finished_at, t.status is not FAILED))
        chain.append(current)
        while current.created_at > start + 1e-9:
            before = [
                t for t in finished
                if t is not current and t not in chain and abs(t.finished_at - current.created_at) <= 1e-9
            ]  # fmt: skip
            if not before:
                break
            current = before[0]
            chain.append(current)
    for task in chain:
        owner = index.owner(task)
        low = max(start, task.created_at)
        high = min(end, task.finished_at if task.finished_at is not None else end)
        for part, a, b in _intervals(index.phases(owner)):
            a, b = max(a, low), min(b, high)
            if b > a:
                parts[part] += b - a
    parts["other"] = max(0.0, (end - start) - sum(parts[p] for p in PARTS if p != "other"))
    return parts


def _stage_windows(index: _Index, job: JobRecord) -> dict[str, tuple[float, float]]:
    windows: dict[str, tuple[float, float]] = {}
    for stage in job.stage_tasks:
        events = index.stage_events.get((job.id, stage), [])
        starts = [e.time for e in events if e.event == "submitted"]
        ends = [e.time for e in events if e.event in ("succeeded", "failed", "cancelled")]
        if not starts:
            tasks = [index.tasks[t] for t in job.stage_tasks[stage] if t in index.tasks]
            starts = [t.created_at for t in tasks]
        if not ends:
            ends = [index.tasks[t].finished_at for t in job.stage_tasks[stage] if t in index.tasks]
            ends = [e for e in ends if e is not None]
        if starts and ends:
            windows[stage] = (min(starts), max(ends))
    return windows


def critical_path(
    windows: Mapping[str, tuple[float, float]], after: Mapping[str, Sequence[str]]
) -> list[str]:
    """Stage names on the critical path, first to last: from the stage that ended last, back
    through the latest-ending stage each waited for."""
    if not windows:
        return []
    current = max(windows, key=lambda name: windows[name][1])
    path = [current]
    while True:
        deps = [d for d in after.get(current, ()) if d in windows]
        if not deps:
            break
        current = max(deps, key=lambda name: windows[name][1])
        path.append(current)
    return path[::-1]


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else math.nan


def job_rows(
    scenario: Scenario,
    jobs: Iterable[JobRecord],
    tasks: Iterable[TaskRecord],
    events: Sequence[Any],
    executions: Sequence[Any],
    arrivals: Mapping[str, float] | None = None,
) -> list[dict[str, Any]]:
    """One plain row per job (the ``jobs`` DataFrame's data); see :func:`jobs_frame` for the columns."""
    arrivals = arrivals or {}
    index = _Index.from_events({t.id: t for t in tasks}, events)
    shape = JobShape(scenario)
    calls: Counter[str] = Counter()
    costs: dict[str, list[float]] = defaultdict(list)
    duplicates: dict[str, list[float]] = defaultdict(list)
    seen_keys: set[str] = set()
    for e in sorted(executions, key=lambda e: e.start):  # the earliest start of a key is the original
        calls[e.task_id] += 1
        if not e.billed:
            continue
        costs[e.task_id].append(e.cost)
        if e.key in seen_keys:
            duplicates[e.task_id].append(e.cost)
        else:
            seen_keys.add(e.key)
    return [
        job_row(job, index, shape, arrivals.get(job.id, job.created_at), calls, costs, duplicates)
        for job in jobs
    ]


class JobShape:
    """Each job template's stage names (declaration order) and dependencies, for :func:`job_row`."""

    def __init__(self, scenario: Scenario) -> None:
        self.after = {t.name: {stage.name: stage.after for stage in t.stages} for t in scenario.jobs}
        self.stage_names = {template.name: [s.name for s in template.stages] for template in scenario.jobs}


def job_row(
    job: JobRecord,
    index: _Index,
    shape: JobShape,
    arrived: float,
    calls: Mapping[str, int],
    costs: Mapping[str, Sequence[float]],
    duplicates: Mapping[str, Sequence[float]],
) -> dict[str, Any]:
    """One job's row: ``calls`` counts each task's provider executions, ``costs`` lists the money
    billed for each, ``duplicates`` the part of it billed for a key already billed before. Costs are
    exactly rounded sums (:func:`math.fsum`), so a row does not depend on the order of its terms."""
    latency = None if job.finished_at is None else job.finished_at - arrived
    task_ids = [t for ids in job.stage_tasks.values() for t in ids]
    row: dict[str, Any] = {
        "job_id": job.id,
        "key": job.key,
        "name": job.name,
        "priority": Priority(job.priority).name.lower(),
        "status": job.status.value,
        "arrived_at": arrived,
        "created_at": job.created_at,
        "finished_at": job.finished_at,
        "latency_s": latency,
        "failed_stage": job.failed_stage,
        "error": job.error,
        "deduped_from": job.deduped_from,
        "stage_calls": len(task_ids),
        "attempts": sum(calls.get(t, 0) for t in task_ids),
        "cost": math.fsum(cost for t in task_ids for cost in costs.get(t, ())),
        "cost_duplicated": math.fsum(cost for t in task_ids for cost in duplicates.get(t, ())),
    }
    windows = _stage_windows(index, job)
    path = critical_path(windows, shape.after.get(job.name, {}))
    totals = dict.fromkeys(PARTS, 0.0)
    on_path: dict[str, float] = {}
    for name in shape.stage_names.get(job.name, list(job.stage_tasks)):
        window = windows.get(name)
        row[f"{name}_s"] = None if window is None else window[1] - window[0]
        if window is None or name not in path:
            for part in PARTS[:-1]:
                row[f"{name}_{part}_s"] = None
            continue
        parts = _split_stage(index, job.stage_tasks.get(name, ()), *window)
        on_path[name] = window[1] - window[0]
        for part in PARTS[:-1]:
            row[f"{name}_{part}_s"] = parts[part]
        for part in PARTS:
            totals[part] += parts[part]
    if latency is not None and job.status is not DEDUPED:
        totals["other"] += max(0.0, latency - sum(on_path.values()))
    for part in PARTS:
        row[f"{part}_s"] = totals[part] if job.status is not DEDUPED else None
    row["critical_path"] = ">".join(path)
    row["slowest_stage"] = max(on_path, key=lambda n: on_path[n]) if on_path else None
    return row


JOB_COLUMNS = [
    "job_id", "key", "name", "priority", "status", "arrived_at", "created_at", "finished_at", "latency_s",
    "failed_stage", "error", "deduped_from", "stage_calls", "attempts", "cost", "cost_duplicated",
    *(f"{part}_s" for part in PARTS), "critical_path", "slowest_stage",
]  # fmt: skip
"""Columns every ``jobs`` DataFrame has; per-stage columns ``{stage}_s`` (the stage's window) and
``{stage}_{part}_s`` (its critical-path split, empty when off the path) follow them."""


def jobs_frame(rows: Sequence[Mapping[str, Any]], rejected: Iterable[Mapping[str, Any]] = ()) -> pd.DataFrame:
    """One row per job (rejected submissions included with status ``rejected``), by arrival."""
    import pandas as pd

    extra: list[str] = []
    for row in rows:
        extra.extend(k for k in row if k not in JOB_COLUMNS and k not in extra)
    frame = pd.DataFrame([*rows, *rejected], columns=[*JOB_COLUMNS, *extra])
    if not frame.empty:
        frame = frame.sort_values(["arrived_at", "job_id"], kind="stable").reset_index(drop=True)
    return frame


class JobTotals:
    """The job summary's running totals, fed one job row at a time (:meth:`add`).

    Both result modes use it: full mode over the rows of :func:`job_rows`, streaming mode
    (:mod:`aiqsim.sim.job_stream`) over each job's row as the job is done, after which the row is
    dropped. Memory: a few numbers per template stage and the two latency sinks, nothing per job.
    Sums are exactly rounded (:class:`~aiqsim.sim.streaming.ExactSum`) and means are those sums over
    counts, so the figures do not depend on the order the jobs come in. ``latencies``/``failures``
    take ``add(value)`` (a list's ``append`` in full mode, a histogram in streaming mode).
    """

    def __init__(self, scenario: Scenario, latencies: Any, failures: Any) -> None:
        from aiqsim.sim.streaming import ExactSum

        self.scenario = scenario
        self.latencies = latencies
        self.failures = failures
        self.counts: Counter[str] = Counter()
        self.ran = 0
        self.cost = ExactSum()
        self.duplicated = ExactSum()
        self.total_latency = ExactSum()
        """Summed latency of succeeded jobs (the denominator of each stage's share)."""
        self.parts = {part: ExactSum() for part in PARTS[:-1]}
        self.succeeded = 0
        self.stages: dict[tuple[str, str], list[Any]] = {
            (template.name, stage.name): [0, ExactSum(), *(ExactSum() for _ in PARTS[:-1])]
            for template in scenario.jobs
            for stage in template.stages
        }
        """(job, stage) -> [jobs on the critical path, critical time, then each part's sum]."""

    def add(self, row: Mapping[str, Any]) -> None:
        """Count one job's row (see :func:`job_row`)."""
        status = row["status"]
        self.counts[status] += 1
        if status != "deduped":
            self.ran += 1
        self.cost.add(row["cost"])
        self.duplicated.add(row["cost_duplicated"])
        latency = row["latency_s"]
        if latency is None:
            return
        if status == "failed":
            self.failures.add(latency)
        if status != "succeeded":
            return
        self.latencies.add(latency)
        self.succeeded += 1
        self.total_latency.add(latency)
        for part in PARTS[:-1]:
            self.parts[part].add(row[f"{part}_s"])
        for (job, stage), sums in self.stages.items():
            if job != row["name"] or row.get(f"{stage}_service_s") is None:
                continue
            values = [row[f"{stage}_{part}_s"] for part in PARTS[:-1]]
            sums[0] += 1
            sums[1].add(math.fsum(values))
            for total, value in zip(sums[2:], values, strict=True):
                total.add(value)

    def stage_breakdown(self) -> list[dict[str, Any]]:
        """Per template stage over succeeded jobs: summed critical-path time, its share of the summed
        latency, and the mean of each part. The first entry with the largest share is the bottleneck."""
        total = self.total_latency.value
        out = []
        for template in self.scenario.jobs:
            for stage in template.stages:
                on_path, time, *parts = self.stages[(template.name, stage.name)]
                entry: dict[str, Any] = {
                    "job": template.name,
                    "stage": stage.name,
                    "provider": stage.target,
                    "jobs_on_critical_path": on_path,
                    "critical_time_s": time.value,
                    "share": time.value / total if total > 0 else math.nan,
                }
                for part, summed in zip(PARTS[:-1], parts, strict=True):
                    entry[f"{part}_mean_s"] = summed.value / on_path if on_path else math.nan
                out.append(entry)
        return out

    def summary(self, *, rejected: int, percentile: Any) -> dict[str, Any]:
        """:data:`JOB_SUMMARY_KEYS` (``percentile(sink, q)``: a sink's q-th percentile, NaN if empty)."""
        counts = self.counts
        shares = [b for b in self.stage_breakdown() if not math.isnan(b["share"])]
        top = max(shares, key=lambda b: b["share"]) if shares else None
        cost = self.cost.value

        def mean(part: str) -> float:
            return self.parts[part].value / self.succeeded if self.succeeded else math.nan

        return {
            "jobs_submitted": sum(counts.values()),
            "jobs_rejected": rejected,
            "jobs_succeeded": counts["succeeded"],
            "jobs_failed": counts["failed"],
            "jobs_cancelled": counts["cancelled"],
            "jobs_deduped": counts["deduped"],
            "jobs_lost": counts["queued"] + counts["running"],
            "job_latency_p50_s": percentile(self.latencies, 50),
            "job_latency_p95_s": percentile(self.latencies, 95),
            "job_latency_p99_s": percentile(self.latencies, 99),
            "job_time_to_failure_p50_s": percentile(self.failures, 50),
            "job_time_to_failure_p95_s": percentile(self.failures, 95),
            "job_queue_wait_mean_s": mean("queue_wait"),
            "job_quota_wait_mean_s": mean("quota_wait"),
            "job_retries_mean_s": mean("retries"),
            "job_service_mean_s": mean("service"),
            "bottleneck_stage": top["stage"] if top is not None else "-",
            "bottleneck_share": top["share"] if top is not None else math.nan,
            "cost_per_job": cost / self.ran if self.ran else math.nan,
            "cost_per_succeeded_job": cost / counts["succeeded"] if counts["succeeded"] else math.nan,
            "duplicate_cost_per_job": self.duplicated.value / self.ran if self.ran else math.nan,
        }


class _Values(list):  # type: ignore[type-arg]
    """A list with ``add`` (the full mode's exact latency sink)."""

    add = list.append


def _totals(scenario: Scenario, rows: Iterable[Mapping[str, Any]]) -> JobTotals:
    totals = JobTotals(scenario, _Values(), _Values())
    for row in rows:
        totals.add(row)
    return totals


def stage_breakdown(rows: Sequence[Mapping[str, Any]], scenario: Scenario) -> list[dict[str, Any]]:
    """Per template stage over succeeded jobs: summed critical-path time, its share of the summed
    latency, and the mean of each part. The first entry with the largest share is the bottleneck."""
    return _totals(scenario, rows).stage_breakdown()


def summarize_jobs(scenario: Scenario, rows: Sequence[Mapping[str, Any]], *, rejected: int) -> dict[str, Any]:
    """Compute :data:`JOB_SUMMARY_KEYS` from the job rows (see :func:`job_rows`)."""
    return _totals(scenario, rows).summary(rejected=rejected, percentile=_percentile)
