"""The crash-recovery invariants, as plain functions a test can call on its own records.

Each check takes plain data (task and job records from a store, counts of executions per key)
and raises :class:`InvariantViolation` whose message names the task, job or key that broke
the rule and what it did. They do not care how the data was produced: the crash driver
(:mod:`aiqsim.testing.crash_driver`) calls them after every crash case, and a SIGKILL test
(:mod:`aiqsim.testing.sigkill`) calls them on the store it finds after the last restart.

The rules:

- every task (and job) is terminal at the end: nothing is stranded ``queued`` or ``running``;
- none is lost: every task a caller was given a handle for is still in the store;
- no success without a result;
- each idempotency key is executed (billed) at most once -- where that can be promised, i.e.
  when the provider honours keys, or recovery can look up what it already did;
- work finished before a crash is not executed again after it (for jobs: a resumed job does
  not re-bill its finished stages);
- a job stage is billed under one key per element: a stage whose payload came out different when
  it was built again after a restart (a timestamp, a uuid, a dict built in set order) ran twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from aiqsim.core.errors import SchedulingError
from aiqsim.core.job import JobRecord
from aiqsim.core.task import TaskRecord, TaskStatus

__all__ = [
    "InvariantViolation",
    "check_all_terminal",
    "check_at_most_once",
    "check_finished_work_not_rerun",
    "check_job_stages_billed_once",
    "check_jobs_not_rebilled",
    "check_none_lost",
    "check_success_has_result",
]

_SHOWN = 5
"""How many offenders a message lists before it says how many more there are."""


class InvariantViolation(SchedulingError, AssertionError):
    """A crash-recovery guarantee was broken. An ``AssertionError`` too, so pytest reports it as a
    failed assertion; ``rule`` names the broken rule, ``offenders`` the ids or keys that broke it."""

    def __init__(self, rule: str, message: str, offenders: Collection[str] = ()) -> None:
        super().__init__(message)
        self.rule = rule
        self.offenders = tuple(offenders)


@dataclass(frozen=True, slots=True)
class _Listing:
    """The first few offenders as text, and how many were left out."""

    items: tuple[str, ...]
    total: int

    def __str__(self) -> str:
        text = "; ".join(self.items)
        more = self.total - len(self.items)
        return f"{text}; and {more} more" if more > 0 else text


def _listing(lines: Iterable[str]) -> _Listing:
    lines = list(lines)
    return _Listing(tuple(lines[:_SHOWN]), len(lines))


def check_all_terminal(tasks: Iterable[TaskRecord], jobs: Iterable[JobRecord] = ()) -> None:
    """Every task and job has reached a terminal state (succeeded, failed, cancelled, deduped)."""
    open_tasks = [t for t in tasks if not t.status.is_terminal]
    open_jobs = [j for j in jobs if not j.status.is_terminal]
    stuck = [f"task {t.id!r} (key {t.key!r}) is still {t.status.value}" for t in open_tasks]
    stuck += [f"job {j.id!r} ({j.name}) is still {j.status.value}" for j in open_jobs]
    if stuck:
        offenders = [t.id for t in open_tasks] + [j.id for j in open_jobs]
        raise InvariantViolation("all terminal", f"not every task ended: {_listing(stuck)}", offenders)


def check_none_lost(
    submitted: Iterable[str],
    tasks: Iterable[TaskRecord],
    *,
    submitted_jobs: Iterable[str] = (),
    jobs: Iterable[JobRecord] = (),
) -> None:
    """Every task id (and job id) a caller was handed back by ``submit`` is in the store."""
    stored = {t.id for t in tasks}
    stored_jobs = {j.id for j in jobs}
    lost = sorted(set(submitted) - stored)
    lost_jobs = sorted(set(submitted_jobs) - stored_jobs)
    lines = [f"task {task_id!r} was submitted but is not in the store" for task_id in lost]
    lines += [f"job {job_id!r} was submitted but is not in the store" for job_id in lost_jobs]
    if lines:
        raise InvariantViolation("none lost", f"work was lost: {_listing(lines)}", [*lost, *lost_jobs])


def check_success_has_result(tasks: Iterable[TaskRecord], jobs: Iterable[JobRecord] = ()) -> None:
    """A succeeded task has a result, and so has a task deduped from a succeeded one; a succeeded job
    has a result for every stage it ran.

    A task deduped from a *failed* owner shares that failure (its ``error`` is set, no result): it
    is not a success.
    """
    empty = [
        t
        for t in tasks
        if t.result is None
        and (t.status is TaskStatus.SUCCEEDED or (t.status is TaskStatus.DEDUPED and t.error is None))
    ]
    lines = [f"task {t.id!r} (key {t.key!r}) is {t.status.value} without a result" for t in empty]
    offenders = [t.id for t in empty]
    for job in jobs:
        if job.status is TaskStatus.SUCCEEDED:
            missing = sorted(stage for stage in job.stage_tasks if stage not in job.results)
            if missing or not job.results:
                lines.append(
                    f"job {job.id!r} ({job.name}) succeeded without results for {missing or 'any stage'}"
                )
                offenders.append(job.id)
    if lines:
        raise InvariantViolation(
            "no success without a result", f"success without a result: {_listing(lines)}", offenders
        )


def check_at_most_once(
    executions: Mapping[str, int] | Iterable[str],
    *,
    what: str = "executed",
    details: Mapping[str, str] | None = None,
) -> None:
    """Each idempotency key was executed (billed) at most once.

    ``executions`` is either a mapping key -> count or an iterable with one key per execution;
    ``details`` (key -> text) adds what is known of a repeated key's executions to the message.
    """
    counts = Counter(executions) if not isinstance(executions, Mapping) else Counter(dict(executions))
    repeated = sorted((key for key, n in counts.items() if n > 1), key=lambda key: (-counts[key], key))
    if repeated:
        details = details or {}
        lines = [
            f"key {key!r} was {what} {counts[key]} times" + (f" ({details[key]})" if key in details else "")
            for key in repeated
        ]
        raise InvariantViolation("at most once", f"work done more than once: {_listing(lines)}", repeated)


def check_finished_work_not_rerun(
    finished_before_crash: Mapping[str, str], executed_after_crash: Iterable[str]
) -> None:
    """No key whose task had succeeded in the store before a crash was executed again after it.

    ``finished_before_crash`` maps such keys to the id of the task that finished them;
    ``executed_after_crash`` has one key per execution that started after the crash.
    """
    again = Counter(key for key in executed_after_crash if key in finished_before_crash)
    if again:
        lines = [
            f"key {key!r} (task {finished_before_crash[key]!r}) had succeeded before the crash and was "
            f"executed {n} more time(s) after the restart"
            for key, n in sorted(again.items())
        ]
        raise InvariantViolation(
            "finished work not re-run", f"finished work ran again: {_listing(lines)}", sorted(again)
        )


def check_jobs_not_rebilled(
    jobs_at_crash: Iterable[JobRecord],
    tasks_at_crash: Iterable[TaskRecord],
    executed_after_crash: Iterable[str],
) -> None:
    """A job resumed after a crash does not re-bill the stages its record already held results for.

    ``jobs_at_crash`` and ``tasks_at_crash`` are the store's records at the moment of the crash;
    ``executed_after_crash`` has one key per execution that started after it.
    """
    key_of = {t.id: t.key for t in tasks_at_crash}
    after = Counter(executed_after_crash)
    lines, offenders = [], []
    for job in jobs_at_crash:
        for stage in sorted(job.results):
            for task_id in job.stage_tasks.get(stage, ()):
                key = key_of.get(task_id)
                if key is not None and after[key]:
                    lines.append(
                        f"job {job.id!r} ({job.name}) stage {stage!r} (task {task_id!r}, key {key!r}) had "
                        f"finished before the crash and was billed {after[key]} more time(s) after the "
                        "restart"
                    )
                    offenders.append(job.id)
    if lines:
        raise InvariantViolation(
            "jobs not re-billed", f"a resumed job re-billed a finished stage: {_listing(lines)}", offenders
        )


def check_job_stages_billed_once(
    jobs: Iterable[JobRecord],
    tasks: Iterable[TaskRecord],
    executed_keys: Iterable[str],
    *,
    fan_out: Callable[[JobRecord, str], bool] | None = None,
) -> None:
    """Each finished stage of a job was executed under at most one key per element.

    A stage's tasks are in ``job.stage_tasks``; a finished stage has one element (or, for a fan-out
    stage -- ``fan_out(job, stage)``, by default "its result is a list" -- one per item of its
    result). Executed under more keys than that, the stage ran twice with different payloads: its
    ``build`` is not deterministic, so a re-driven job could not find the first run under its key.
    """
    key_of = {t.id: t.key for t in tasks}
    executed = set(executed_keys)
    lines, offenders = [], []
    for job in jobs:
        for stage, task_ids in sorted(job.stage_tasks.items()):
            if stage not in job.results:
                continue  # never finished: how many elements it has is not known
            result = job.results[stage]
            many = fan_out(job, stage) if fan_out is not None else isinstance(result, list)
            elements = len(result) if many and isinstance(result, list) else 1
            billed = sorted({key_of[i] for i in task_ids if i in key_of and key_of[i] in executed})
            if len(billed) > elements:
                lines.append(
                    f"job {job.id!r} ({job.name}) stage {stage!r} was executed under {len(billed)} "
                    f"different keys for {elements} element(s) ({', '.join(repr(k[:12]) for k in billed)}): "
                    "its payload was built differently after the restart (is its build function "
                    "deterministic?), or it was sent to its fallback after a call that was done "
                    "but whose answer was lost"
                )
                offenders.append(job.id)
    if lines:
        raise InvariantViolation(
            "job stages billed once", f"a job stage ran twice: {_listing(lines)}", offenders
        )
