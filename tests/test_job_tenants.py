"""A job's tenant (``submit_job(tenant=...)``): every task of every stage, fallbacks included, is
queued in it, so weighted fair queuing between tenants counts jobs; it is stored with the job and
kept across a crash and ``recover()``. Before, a job's tasks all went to the default tenant."""

from __future__ import annotations

from typing import Any

import pytest

from aiqsim import JobSpec, JobStatus, QueueFullError, QuotaLimits, Scheduler, Stage
from aiqsim.scheduler import Tenant
from aiqsim.scheduler.arguments import SchedulerArgumentError, SchedulerArgumentTypeError
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse
from aiqsim.stores import MemoryStore
from tests.fakes import ScriptedProvider
from tests.runtimes import RUNTIMES, run_on

TENANTS = {"light": Tenant(weight=1), "heavy": Tenant(weight=3)}


class Recorder:
    """Serves each call in ``service_s`` and notes (tenant, payload) in call order."""

    def __init__(self, runtime: Any, name: str = "llm", service_s: float = 1.0) -> None:
        self.runtime = runtime
        self.name = name
        self.service_s = service_s
        self.calls: list[tuple[str | None, Any]] = []

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        self.calls.append((request.tenant, request.payload))
        await self.runtime.sleep(self.service_s)
        return ProviderResponse(result={"output": request.payload})


def draft(inputs: Any, results: Any) -> Any:
    return {"draft": inputs["n"]}


def polish(inputs: Any, results: Any) -> Any:
    return {"polish": results["draft"]["output"]}


SPEC = JobSpec(
    "edit", "1", [Stage("draft", "llm", build=draft), Stage("polish", "llm", after=("draft",), build=polish)]
)


@pytest.mark.parametrize("rt_name", RUNTIMES)
def test_two_tenants_jobs_weighted_1_to_3_share_a_lane_25_and_75_percent(rt_name: str) -> None:
    async def body(rt: Any) -> Any:
        provider = Recorder(rt)
        scheduler = Scheduler(rt, [provider], quotas={"llm": QuotaLimits(concurrency=1)}, tenants=TENANTS)
        handles = [
            scheduler.submit_job(SPEC, {"n": f"{tenant}-{n}"}, tenant=tenant)
            for n in range(40)
            for tenant in ("light", "heavy")
        ]
        async with scheduler:
            results = [await h.wait() for h in handles]
        return provider.calls, results, scheduler

    calls, results, scheduler = run_on(rt_name, body)
    assert all(job.status is JobStatus.SUCCEEDED for job in results)
    window = [tenant for tenant, _ in calls[:40]]  # both tenants backlogged all along
    assert window.count("light") == 10 and window.count("heavy") == 30
    assert {tenant for tenant, _ in calls} == {"light", "heavy"}  # no call went to the default tenant
    assert all(scheduler.jobs.get(job.id).tenant == job.tenant for job in results)
    for job in results:
        task_ids = [task_id for ids in job.stage_tasks.values() for task_id in ids]
        assert len(task_ids) == 2
        assert {scheduler.store.get(task_id).tenant for task_id in task_ids} == {job.tenant}


@pytest.mark.parametrize("rt_name", RUNTIMES)
def test_a_stages_fallback_task_is_queued_in_the_jobs_tenant(rt_name: str) -> None:
    spec = JobSpec("voice", "1", [Stage("tts", "tts", build=draft, fallback="tts_backup")])

    async def body(rt: Any) -> Any:
        primary = ScriptedProvider(rt, name="tts", latency_s=1.0, script={"x": ["invalid"]})
        backup = Recorder(rt, name="tts_backup")
        scheduler = Scheduler(rt, [primary, backup], tenants=TENANTS)
        job = await scheduler.submit_job(spec, {"n": "x"}, tenant="heavy").wait()
        stored = [scheduler.store.get(task_id).tenant for task_id in job.stage_tasks["tts"]]
        await scheduler.close()
        return job, stored, backup.calls

    job, stored, backup_calls = run_on(rt_name, body)
    assert job.status is JobStatus.SUCCEEDED and job.tenant == "heavy"
    assert stored == ["heavy", "heavy"]  # the failed primary's task and the fallback's
    assert [tenant for tenant, _ in backup_calls] == ["heavy"]


def test_a_bad_tenant_is_refused_and_no_job_is_stored() -> None:
    async def body(rt: Any) -> None:
        with_tenants = Scheduler(rt, [Recorder(rt)], tenants=TENANTS)
        with pytest.raises(SchedulerArgumentError, match=r"no tenant named 'nobody'.*No job was submitted"):
            with_tenants.submit_job(SPEC, {"n": 1}, tenant="nobody")
        with pytest.raises(SchedulerArgumentTypeError, match="tenant: expected a tenant's name"):
            with_tenants.submit_job(SPEC, {"n": 1}, tenant=3)  # type: ignore[arg-type]
        without = Scheduler(rt, [Recorder(rt)])
        with pytest.raises(SchedulerArgumentError, match="this scheduler has no tenants"):
            without.submit_job(SPEC, {"n": 1}, tenant="light")
        assert with_tenants.jobs.list() == [] and without.jobs.list() == []
        default = await with_tenants.submit_job(SPEC, {"n": 2}).wait()  # None: the default tenant
        assert default.status is JobStatus.SUCCEEDED and default.tenant is None
        await with_tenants.close()
        await without.close()

    run_on("simpy", body)


def test_a_tenants_max_queued_refuses_a_new_job_never_a_stage_of_a_running_one() -> None:
    """A job's tasks count toward its tenant's ``max_queued`` as any of the tenant's tasks do; the
    limit refuses a new job at the door (QueueFullError naming the tenant, nothing stored), and never
    a stage of a job already running (that stage would fail the job half-way)."""

    def pieces(inputs: Any, results: Any) -> Any:
        return [{"piece": n} for n in range(3)]

    spec = JobSpec("split", "1", [Stage("fan", "llm", build=pieces, fan_out=True)])
    tenants = {"light": Tenant(max_queued=2), "heavy": Tenant()}

    async def body(rt: Any) -> Any:
        scheduler = Scheduler(rt, [Recorder(rt)], quotas={"llm": QuotaLimits(concurrency=1)}, tenants=tenants)
        job = scheduler.submit_job(spec, {"n": 1}, tenant="light")  # a fan-out of 3 in a tenant of 2
        with pytest.raises(QueueFullError, match=r"tenant 'light': 3 of its tasks.*no job was submitted"):
            scheduler.submit_job(spec, {"n": 2}, tenant="light")
        other = scheduler.submit_job(spec, {"n": 3}, tenant="heavy")
        results = [await job.wait(), await other.wait()]
        stored = len(scheduler.jobs.list())
        await scheduler.close()
        return results, stored

    results, stored = run_on("simpy", body)
    assert [job.status for job in results] == [JobStatus.SUCCEEDED] * 2
    assert len(results[0].results["fan"]) == 3 and stored == 2


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_jobs_tenant_survives_a_crash_and_recover(kind: str, tmp_path: Any) -> None:
    """The first process dies with the jobs' first-stage calls out; the next one (on the same store;
    a file store closed and opened again) recovers the jobs, requeueing the interrupted calls, and
    submits each second stage itself, in the tenant the job record kept: the calls share the lane
    1:3, and every task of every job is in its job's tenant."""
    from aiqsim.stores import open_store

    memory = MemoryStore()

    def store() -> Any:
        return memory if kind == "memory" else open_store("sqlite", tmp_path / "tasks.sqlite")

    async def body(rt: Any) -> Any:
        s = store()
        before = Scheduler(rt, [Recorder(rt)], store=s, tenants=TENANTS)
        ids = [
            before.submit_job(SPEC, {"n": f"{tenant}-{n}"}, tenant=tenant).id
            for n in range(8)
            for tenant in ("light", "heavy")
        ]
        await rt.sleep(0.5)  # every draft call out: no polish task exists yet
        before.crash()
        if kind != "memory":
            s.close()
            s = store()
        provider = Recorder(rt)
        after = Scheduler(
            rt, [provider], store=s, quotas={"llm": QuotaLimits(concurrency=1)}, tenants=TENANTS
        )
        after.jobs.register(SPEC)
        await after.recover(requeue_interrupted=True)
        async with after:
            await after.join()
        jobs = [after.jobs.get(job_id) for job_id in ids]
        tenants = [[s.get(t).tenant for ids in job.stage_tasks.values() for t in ids] for job in jobs]
        if kind != "memory":
            s.close()
        return provider.calls, jobs, tenants

    calls, jobs, tenants = run_on("simpy", body)
    assert all(job.status is JobStatus.SUCCEEDED for job in jobs)
    assert [job.tenant for job in jobs] == ["light", "heavy"] * 8
    assert all(set(kept) == {job.tenant} for job, kept in zip(jobs, tenants, strict=True))
    window = [tenant for tenant, _ in calls[:16]]  # both tenants backlogged all along
    assert window.count("light") == 4 and window.count("heavy") == 12
    assert len(calls) == 32  # each draft again (requeued), then each polish


@pytest.mark.parametrize("tenants_after", [{"heavy": Tenant(weight=3)}, None], ids=["one-removed", "none"])
def test_a_recovered_job_whose_tenant_was_removed_runs_on_in_the_default_tenant(tenants_after: Any) -> None:
    """A job recovered by a process not given its tenant (taken out of the config, or tenants no
    longer used) runs its next stages as a recovered task of an unknown tenant does: in the default
    tenant, its records keeping the tenant's name. Before, every next stage's submission was refused
    ("no tenant named 'light'") and a job half done failed for a configuration change."""
    memory = MemoryStore()

    async def body(rt: Any) -> Any:
        before = Scheduler(rt, [Recorder(rt)], store=memory, tenants=TENANTS)
        ids = [before.submit_job(SPEC, {"n": f"{t}-{n}"}, tenant=t).id for n in range(2) for t in TENANTS]
        await rt.sleep(0.5)  # every draft call out: no polish task exists yet
        before.crash()
        provider = Recorder(rt)
        after = Scheduler(rt, [provider], store=memory, tenants=tenants_after)
        after.jobs.register(SPEC)
        await after.recover(requeue_interrupted=True)
        async with after:
            await after.join()
        jobs = [after.jobs.get(job_id) for job_id in ids]
        tenants = [
            [getattr(memory.get(t), "tenant", "-") for v in job.stage_tasks.values() for t in v]
            for job in jobs
        ]
        return provider.calls, jobs, tenants

    calls, jobs, tenants = run_on("simpy", body)
    assert [(job.status, job.error) for job in jobs] == [(JobStatus.SUCCEEDED, None)] * 4
    assert [job.tenant for job in jobs] == ["light", "heavy"] * 2
    assert all(set(kept) == {job.tenant} for job, kept in zip(jobs, tenants, strict=True))
    assert len(calls) == 8  # each draft again (requeued), then each polish
