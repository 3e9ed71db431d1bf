"""The crash-recovery suite for jobs: kill the scheduler right after every k-th store write.

A small pipeline workload (video -> script -> two TTS calls -> subtitle alignment, five jobs, one of
them double-clicked) runs on simulated providers with random 5xx failures and a shared billing
ledger. For each store and seed it is crashed after store write k, for every k the run makes (task
and job writes alike, recovery's own writes included), and restarted 1.5 s later on the same store:
a new scheduler with the job spec registered calls ``recover()``, which reconciles the tasks and
re-drives the unfinished jobs.

Invariants: no job is lost (every job whose submission returned, and every job in the store, ends
terminal); a succeeded job has every stage's result; a failed one names its stage; every task ends
terminal; and no stage key is billed twice by the providers (reconciliation by lookup, then task
dedup on the re-driven stages).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from aiqsim import (
    ExponentialBackoff,
    JobSpec,
    JobStatus,
    Priority,
    QuotaLimits,
    RetryPolicy,
    Scheduler,
    Stage,
)
from aiqsim.runtime import Cancelled, SimPyRuntime
from aiqsim.sim.config import ProviderConfig
from aiqsim.sim.crash import CrashingStore, SimulatedCrash
from aiqsim.sim.providers import ProviderLedger, SimulatedProvider
from aiqsim.stores import JsonFileStore, MemoryStore, SqliteStore


def video(inputs, results):
    poison = inputs["clip"] == "corrupt"  # a file the vision API chokes on: the job fails at "video"
    return {"input": f"video:{inputs['clip']}", "prompt_units": 50, "output_units": 40, "poison": poison}


def script(inputs, results):
    return {"input": f"script:{results['video']['input']}", "prompt_units": 40, "output_units": 80}


def paragraphs(inputs, results):
    return [
        {"input": f"tts:{inputs['clip']}:{i}", "prompt_units": 0, "output_units": 30 + 10 * i}
        for i in range(2)
    ]


def align(inputs, results):
    return {"input": f"align:{inputs['clip']}:{len(results['tts'])}", "prompt_units": 10, "output_units": 10}


PIPELINE = JobSpec(
    "edit",
    "1",
    [
        Stage("video", "vision", build=video),
        Stage("script", "llm", after=("video",), build=script),
        Stage("tts", "tts", after=("script",), build=paragraphs, fan_out=True),
        Stage("subtitles", "align", after=("tts", "script"), build=align),
    ],
)
ARRIVALS = [  # (time, job id, clip, priority)
    (0.0, "job-0", "a", Priority.INTERACTIVE),
    (0.2, "job-0-again", "a", Priority.INTERACTIVE),  # the double click
    (0.5, "job-1", "b", Priority.BACKGROUND),
    (1.0, "job-2", "c", Priority.INTERACTIVE),
    (1.6, "job-3", "d", Priority.BACKGROUND),
    (2.5, "job-4", "e", Priority.BACKGROUND),
    (2.7, "job-5", "corrupt", Priority.BACKGROUND),
]
RESTART_AFTER_S = 1.5


@dataclass
class Run:
    """One run of the workload with a crash after store write ``crash_after`` (None: no crash)."""

    store_kind: str
    seed: int
    directory: Path
    crash_after: int | None
    postgres: tuple[str, str] | None = None
    """(DSN, schema) of a PostgreSQL store, for ``store_kind="postgres"``."""
    lookup: bool = True
    """Whether the providers can look a key up (False: recovery fails orphans as interrupted)."""
    runtime: SimPyRuntime = field(default_factory=SimPyRuntime)
    ledger: ProviderLedger = field(default_factory=ProviderLedger)
    writes: list[int] = field(default_factory=lambda: [0])
    accepted: list[str] = field(default_factory=list)
    crashed_at_submit: list[str] = field(default_factory=list)
    crashes: int = 0
    incarnation: int = 0
    down: bool = False
    recovering: bool = False
    backlog: list[tuple[float, str, str, Priority]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.providers = [
            SimulatedProvider(
                self.runtime,
                ProviderConfig(
                    name=name,
                    latency_base_s=base,
                    latency_per_unit_s=0.002,
                    latency_sigma=0.3,
                    server_error_prob=0.15,
                    supports_lookup=self.lookup,
                ),
                random.Random(f"{self.seed}:{name}"),
                self.ledger,
            )
            for name, base in (("vision", 0.8), ("llm", 0.5), ("tts", 0.3), ("align", 0.2))
        ]
        self.crash_points = set() if self.crash_after is None else {self.crash_after}
        self.raw_store = self._open_store()
        self.scheduler = self._new_scheduler()

    def _open_store(self):
        if self.store_kind == "memory":  # the memory store survives a simulated crash: keep it
            kept = self.__dict__.get("raw_store")
            return kept if kept is not None else MemoryStore()
        if self.store_kind == "postgres":  # a new connection, as a restarted process opens
            from aiqsim.stores.postgres import PostgresStore

            assert self.postgres is not None
            return PostgresStore(self.postgres[0], schema=self.postgres[1])
        # No fsync: a simulated crash kills the process, not the machine (power loss is not tested here).
        path = self.directory / f"jobs.{self.store_kind}"
        return (
            SqliteStore(path, synchronous="OFF")
            if self.store_kind == "sqlite"
            else JsonFileStore(path, fsync=False)
        )

    def _new_scheduler(self) -> Scheduler:
        self.store = CrashingStore(
            self.raw_store, counter=self.writes, crash_points=self.crash_points, on_crash=self._crash
        )
        scheduler = Scheduler(
            self.runtime,
            self.providers,
            quotas={"llm": QuotaLimits(concurrency=2), "tts": QuotaLimits(concurrency=1)},
            store=self.store,
            retry=RetryPolicy(
                backoff=ExponentialBackoff(base_s=0.2, cap_s=2.0), max_attempts=4, attempt_timeout_s=30
            ),
            rng=random.Random(f"{self.seed}:scheduler:{self.incarnation}"),
        )
        scheduler.jobs.register(PIPELINE)  # what the restarted process knows: its job specs
        return scheduler

    def _crash(self) -> None:
        self.down = True
        self.crashes += 1
        self.store.dead = True
        self.scheduler.crash()
        self.runtime.spawn(self._restart_later(), name="restart")

    async def _restart_later(self) -> None:
        if self.store_kind != "memory":
            self.raw_store.close()
        await self.runtime.sleep(RESTART_AFTER_S)
        self.incarnation += 1
        self.raw_store = self._open_store()
        self.scheduler = self._new_scheduler()
        self.down = False
        self.recovering = True  # recover() awaits its lookups: the run is not over meanwhile
        try:
            await self.scheduler.recover()
        except SimulatedCrash:
            return  # crashed again while recovering: the next restart takes over
        finally:
            self.recovering = False
        backlog, self.backlog = self.backlog, []
        for arrival in backlog:
            self._offer(*arrival)

    def _offer(self, at: float, job_id: str, clip: str, priority: Priority) -> None:
        if self.down:
            self.backlog.append((at, job_id, clip, priority))
            return
        try:
            self.scheduler.submit_job(PIPELINE, {"clip": clip}, priority=priority, job_id=job_id)
        except SimulatedCrash:
            self.crashed_at_submit.append(job_id)  # the user saw an error; the store decides
            return
        self.accepted.append(job_id)

    async def _main(self) -> None:
        for at, job_id, clip, priority in ARRIVALS:
            await self.runtime.sleep(max(0.0, at - self.runtime.now()))
            self._offer(at, job_id, clip, priority)
        while self.down or self.recovering or self.scheduler.jobs.in_flight or self.scheduler.in_flight:
            await self.runtime.sleep(0.5)

    def execute(self) -> Run:
        try:
            self.runtime.run(self._main(), until=3600)
        except Cancelled:
            pass  # cut at the horizon: whatever is not terminal is reported by check_invariants
        if self.store_kind != "memory":
            self.raw_store.close()
            self.raw_store = self._open_store()
        self.jobs = {job.id: job for job in self.raw_store.list_jobs()}
        self.tasks = self.raw_store.list_by_status()
        if self.store_kind != "memory":
            self.raw_store.close()
        return self


def executions_per_key(run: Run) -> Counter:
    """Successful (billed) executions per key. A poison input is billed on each attempt by design (the
    server did the work before failing it): that is the retry policy's cost, not a crash's."""
    return Counter(e.key for e in run.ledger.executions if e.billed and e.outcome == "ok")


def check_invariants(run: Run) -> None:
    assert not [e for _, e in run.runtime.task_errors if not isinstance(e, SimulatedCrash)]
    for job_id in run.accepted:
        assert job_id in run.jobs, f"{job_id} was accepted and then lost"
    for job_id in run.crashed_at_submit:  # its first write (the insert) was made before the crash
        assert job_id in run.jobs, f"{job_id} was stored, then lost in the crash"
    for job in run.jobs.values():
        assert job.status.is_terminal, f"{job.id} ended {job.status.value}"
        if job.status is JobStatus.SUCCEEDED:
            assert set(job.results) == {"video", "script", "tts", "subtitles"}
            assert len(job.results["tts"]) == 2
        elif job.status is JobStatus.FAILED:
            assert job.failed_stage in {"video", "script", "tts", "subtitles"} and job.error
        elif job.status is JobStatus.DEDUPED:
            assert job.deduped_from is not None
    for record in run.tasks:
        assert record.status.is_terminal, f"task {record.id} ended {record.status.value}"
    assert max(executions_per_key(run).values(), default=0) <= 1, "a stage key was executed and billed twice"


SEEDS = {"memory": (0, 1, 2), "sqlite": (0,), "json": (0,)}


@pytest.mark.parametrize("store", ["memory", "sqlite", "json"])
def test_jobs_survive_a_crash_after_every_store_write(tmp_path: Path, store: str) -> None:
    crash_points = 0
    statuses: Counter = Counter()
    for seed in SEEDS[store]:
        clean = Run("memory", seed, tmp_path, None).execute()
        check_invariants(clean)
        assert clean.crashes == 0 and len(clean.jobs) == len(ARRIVALS)
        assert clean.jobs["job-0-again"].status is JobStatus.DEDUPED
        assert clean.jobs["job-5"].status is JobStatus.FAILED and clean.jobs["job-5"].failed_stage == "video"
        total = clean.writes[0]
        for k in range(1, total + 1):
            directory = tmp_path / f"{store}-{seed}-{k}"
            directory.mkdir()
            run = Run(store, seed, directory, k).execute()
            assert run.crashes == 1, (seed, k)
            check_invariants(run)
            statuses.update(job.status.value for job in run.jobs.values())
            crash_points += 1
    assert crash_points >= 60
    assert statuses["succeeded"] > 0 and statuses["failed"] > 0
    print(
        f"\n[{store}] {crash_points} crash points: 0 jobs lost, no stage billed twice; ends {dict(statuses)}"
    )


def test_without_lookup_recovery_fails_interrupted_stages_and_sends_no_stage_twice(tmp_path: Path) -> None:
    # No lookup, requeue_interrupted=False: an orphaned stage task fails as interrupted, and recovery
    # must not send it again. The job re-drive used to launch the stage anew: the new task claimed the
    # key its failed predecessor gave up, and the call was billed twice.
    crash_points = 0
    statuses: Counter = Counter()
    for seed in SEEDS["memory"]:
        total = Run("memory", seed, tmp_path, None, lookup=False).execute().writes[0]
        for k in range(1, total + 1):
            run = Run("memory", seed, tmp_path, k, lookup=False).execute()
            assert run.crashes == 1, (seed, k)
            assert all(job.status.is_terminal for job in run.jobs.values()), (seed, k)
            assert all(record.status.is_terminal for record in run.tasks), (seed, k)
            orphans = [r for r in run.tasks if r.error and "TaskInterruptedError" in r.error]
            restart = min((r.finished_at for r in orphans), default=float("inf"))
            job_created = {
                t: job.created_at for job in run.jobs.values() for ts in job.stage_tasks.values() for t in ts
            }
            runs: dict[str, list[str]] = {}
            for execution in run.ledger.executions:
                if execution.billed and execution.outcome == "ok":
                    runs.setdefault(execution.key, []).append(execution.task_id)
            for key, task_ids in runs.items():  # a job submitted after the restart is a new request
                assert all(job_created[t] >= restart for t in task_ids[1:]), (seed, k, key, task_ids)
            for job in run.jobs.values():
                if job.status is JobStatus.FAILED and "TaskInterruptedError" in (job.error or ""):
                    statuses["failed as interrupted"] += 1
            statuses.update(job.status.value for job in run.jobs.values())
            crash_points += 1
    assert crash_points >= 60 and statuses["failed as interrupted"] > 0
    print(f"\n[memory, no lookup] {crash_points} crash points: no stage sent twice; {dict(statuses)}")


def test_jobs_survive_a_crash_after_every_store_write_on_postgres(tmp_path: Path, postgres_dsn: str) -> None:
    """The same schedule on a PostgresStore (a real server), a fresh schema per crash point, at every
    eighth write: each run costs a schema and ~140 server round trips (every write took 3.5 min at
    load 7.5), and the orchestration is the same code the every-write variants above cover."""
    import psycopg

    crash_points = 0
    statuses: Counter = Counter()
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        clean = Run("memory", 0, tmp_path, None).execute()
        for k in range(1, clean.writes[0] + 1, 8):
            schema = f"jobcrash_{k}"
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            try:
                run = Run("postgres", 0, tmp_path, k, postgres=(postgres_dsn, schema)).execute()
            finally:
                admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            assert run.crashes == 1, k
            check_invariants(run)
            statuses.update(job.status.value for job in run.jobs.values())
            crash_points += 1
    assert crash_points >= 15 and statuses["succeeded"] > 0 and statuses["failed"] > 0
    print(
        f"\n[postgres] {crash_points} crash points: 0 jobs lost, no stage billed twice; ends {dict(statuses)}"
    )
