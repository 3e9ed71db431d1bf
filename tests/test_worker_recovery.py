"""Recovery leaves alone what is not this scheduler's: other workers' tasks, other providers' tasks.

Several schedulers share one SQLite file: a restarted worker adopts only its own tasks.

Two workers ("a" and "b") run on one SimPy clock, each with its own connection to the same
real SQLite file. When "a" dies and comes back, its recovery must reconcile a's orphans and
resume a's queue without touching b's running or queued tasks (b is alive and still running
them). Taking over a dead worker's tasks is an explicit ``recover(workers=[...])``.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from aiqsim.core.task import TaskRecord, TaskStatus
from aiqsim.core.token_bucket import QuotaLimits
from aiqsim.runtime import SimPyRuntime
from aiqsim.scheduler import ProviderRequest, ProviderResponse, RecoveryReport, Scheduler
from aiqsim.stores import SqliteStore

LATENCY_S = 2.0
TASKS_PER_WORKER = 6
SLOTS = 2


class CountingProvider:
    """Sleeps, then records one execution of the key (the ground truth for double runs)."""

    name = "llm"

    def __init__(self, runtime: SimPyRuntime, executions: Counter[str]) -> None:
        self.runtime = runtime
        self.executions = executions

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        await self.runtime.sleep(LATENCY_S)
        self.executions[request.idempotency_key] += 1
        return ProviderResponse(result={"echo": request.payload})

    async def lookup(self, key: str) -> ProviderResponse | None:
        return None  # this provider cannot tell: orphans are requeued or failed


def worker(
    runtime: SimPyRuntime, path: Path, executions: Counter[str], worker_id: str, seed: int
) -> Scheduler:
    return Scheduler(
        runtime,
        [CountingProvider(runtime, executions)],
        store=SqliteStore(path),
        quotas={"llm": QuotaLimits(concurrency=SLOTS)},
        rng=random.Random(seed),
        worker_id=worker_id,
    )


def two_workers(tmp_path: Path) -> tuple[Path, SimPyRuntime, Counter[str], Scheduler, Scheduler]:
    """Workers "a" and "b" on one clock, each with its own connection to the same SQLite file."""
    path = tmp_path / "shared.sqlite"
    runtime = SimPyRuntime()
    executions: Counter[str] = Counter()
    return (
        path,
        runtime,
        executions,
        worker(runtime, path, executions, "a", 1),
        worker(runtime, path, executions, "b", 2),
    )


def submit_all(scheduler: Scheduler, prefix: str) -> list[str]:
    return [
        scheduler.submit("llm", f"{prefix}{n}", task_id=f"{prefix}{n}").id for n in range(TASKS_PER_WORKER)
    ]


def of_worker(records: list[TaskRecord], prefix: str) -> list[TaskRecord]:
    return [record for record in records if record.id.startswith(prefix)]


def test_a_restarted_worker_adopts_its_own_tasks_and_leaves_the_live_ones_alone(tmp_path: Path) -> None:
    path, runtime, executions, a, b = two_workers(tmp_path)
    observed: dict[str, object] = {}

    async def main() -> None:
        submit_all(a, "a")
        submit_all(b, "b")
        await runtime.sleep(1.0)  # both workers have SLOTS tasks running, the rest queued
        a.crash()
        await runtime.sleep(0.5)
        before = of_worker(b.store.list_by_status(), "b")
        restarted = worker(runtime, path, executions, "a", seed=3)
        observed["report"] = await restarted.recover(requeue_interrupted=True)
        observed["b untouched"] = of_worker(b.store.list_by_status(), "b") == before
        await restarted.join()
        await b.join()
        await restarted.close()
        await b.close()

    runtime.run(main())
    assert observed["report"] == RecoveryReport(
        orphans_completed=0,
        orphans_failed=0,
        orphans_requeued=SLOTS,
        queued_resumed=TASKS_PER_WORKER - SLOTS,
        duplicates_reattached=0,
        left_to_other_workers=TASKS_PER_WORKER,  # b: SLOTS running + the rest queued, all alive
    )
    assert observed["b untouched"] is True
    with SqliteStore(path) as store:
        records = store.list_by_status()
    assert len(records) == 2 * TASKS_PER_WORKER
    assert all(r.status is TaskStatus.SUCCEEDED for r in records), [(r.id, r.status) for r in records]
    assert {r.worker for r in of_worker(records, "a")} == {"a"}
    assert {r.worker for r in of_worker(records, "b")} == {"b"}
    # every key ran exactly once: b's running calls were not requeued behind its back
    assert sorted(executions.values()) == [1] * (2 * TASKS_PER_WORKER)


def test_a_worker_without_an_id_takes_every_running_task_for_an_orphan(tmp_path: Path) -> None:
    """Why worker ids exist: the single-user default reconciles b's live calls too, and they run twice."""
    path, runtime, executions, a, b = two_workers(tmp_path)

    async def main() -> RecoveryReport:
        submit_all(a, "a")
        submit_all(b, "b")
        await runtime.sleep(1.0)
        a.crash()
        anonymous = worker(runtime, path, executions, None, seed=3)
        report = await anonymous.recover(requeue_interrupted=True)
        await anonymous.join()
        await b.join()
        return report

    report = runtime.run(main())
    assert report.left_to_other_workers == 0
    assert report.orphans_requeued == 2 * SLOTS  # a's and b's running tasks
    assert max(executions.values()) == 2  # b's in-flight calls ran twice: once in b, once adopted


def test_taking_over_a_dead_workers_tasks_is_explicit(tmp_path: Path) -> None:
    path, runtime, executions, a, b = two_workers(tmp_path)
    reports: list[RecoveryReport] = []

    async def main() -> None:
        submit_all(a, "a")
        submit_all(b, "b")
        await runtime.sleep(1.0)
        b.crash()  # b's host is gone for good
        reports.append(await a.recover(requeue_interrupted=True))  # a alone: nothing of its own to do
        reports.append(await a.recover(requeue_interrupted=True, workers=["b"]))
        await a.join()
        await a.close()

    runtime.run(main())
    own, takeover = reports
    assert (own.orphans_requeued, own.queued_resumed, own.left_to_other_workers) == (0, 0, TASKS_PER_WORKER)
    assert (takeover.orphans_requeued, takeover.queued_resumed) == (SLOTS, TASKS_PER_WORKER - SLOTS)
    assert takeover.left_to_other_workers == 0  # a's own live tasks are not "other workers'" either
    with SqliteStore(path) as store:
        records = store.list_by_status()
    assert all(r.status is TaskStatus.SUCCEEDED for r in records)
    assert {r.worker for r in records} == {"a"}  # b's tasks now say who holds them
    assert sorted(executions.values()) == [1] * (2 * TASKS_PER_WORKER)


def test_worker_ids_are_checked(tmp_path: Path) -> None:
    runtime = SimPyRuntime()
    with pytest.raises(ValueError, match="worker_id must be a non-empty string"):
        Scheduler(runtime, [CountingProvider(runtime, Counter())], worker_id="")
    scheduler = Scheduler(runtime, [CountingProvider(runtime, Counter())], worker_id="a")
    with pytest.raises(TypeError, match=r"not one string: use \['b'\]"):
        runtime.run(scheduler.recover(workers="b"))  # type: ignore[arg-type]


class NamedProvider(CountingProvider):
    def __init__(self, runtime: SimPyRuntime, executions: Counter[str], name: str) -> None:
        super().__init__(runtime, executions)
        self.name = name


def crash_with_llm_and_tts_work(path: Path) -> None:
    """Leave a store with llm and tts tasks running and queued, as a killed process would."""
    runtime = SimPyRuntime()
    executions: Counter[str] = Counter()
    providers = [NamedProvider(runtime, executions, "llm"), NamedProvider(runtime, executions, "tts")]
    scheduler = Scheduler(
        runtime,
        providers,
        store=SqliteStore(path),
        quotas={"llm": QuotaLimits(concurrency=1), "tts": QuotaLimits(concurrency=1)},
        rng=random.Random(1),
    )

    async def main() -> None:
        for n in range(3):
            scheduler.submit("llm", f"l{n}", task_id=f"llm-{n}")
            scheduler.submit("tts", f"t{n}", task_id=f"tts-{n}")
        await runtime.sleep(0.5)
        scheduler.crash()

    runtime.run(main())


def test_recovery_refuses_to_guess_about_tasks_for_a_provider_it_was_not_given(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite"
    crash_with_llm_and_tts_work(path)
    with SqliteStore(path) as store:
        before = store.list_by_status()
    runtime = SimPyRuntime()
    llm_only = Scheduler(runtime, [NamedProvider(runtime, Counter(), "llm")], store=SqliteStore(path))
    with pytest.raises(
        ValueError, match=r"3 unfinished task\(s\) for provider\(s\) \['tts'\].*nothing was recovered"
    ):
        runtime.run(llm_only.recover(requeue_interrupted=True))
    llm_only.store.close()
    with SqliteStore(path) as store:
        assert store.list_by_status() == before  # nothing written, the llm orphan included


def test_recovery_can_leave_other_providers_tasks_for_a_scheduler_that_has_them(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite"
    crash_with_llm_and_tts_work(path)
    runtime = SimPyRuntime()
    executions: Counter[str] = Counter()
    llm_only = Scheduler(runtime, [NamedProvider(runtime, executions, "llm")], store=SqliteStore(path))

    async def main() -> RecoveryReport:
        report = await llm_only.recover(requeue_interrupted=True, unknown_providers="leave")
        await llm_only.join()
        return report

    report = runtime.run(main())
    assert (report.orphans_requeued, report.queued_resumed, report.left_for_unknown_providers) == (1, 2, 3)
    with SqliteStore(path) as store:
        statuses = {r.id: r.status for r in store.list_by_status()}
    assert {k: v for k, v in statuses.items() if k.startswith("llm")} == dict.fromkeys(
        ["llm-0", "llm-1", "llm-2"], TaskStatus.SUCCEEDED
    )
    assert statuses["tts-0"] is TaskStatus.RUNNING  # untouched: a tts worker will reconcile it
    assert [statuses[f"tts-{n}"] for n in (1, 2)] == [TaskStatus.QUEUED, TaskStatus.QUEUED]
    with pytest.raises(ValueError, match="unknown_providers must be 'raise' or 'leave'"):
        runtime.run(llm_only.recover(unknown_providers="fail"))
