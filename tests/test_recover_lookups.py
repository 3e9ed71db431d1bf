"""recover() with flaky lookups: one failed lookup no longer stops the recovery.

Before, the first lookup that raised propagated out of ``recover()``: every other orphan stayed
``running`` and startup was blocked. Now each lookup is retried with backoff within a bound, the
other orphans are reconciled, and those still undecided are reported and left as they were.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from aiqsim import ConstantBackoff, MemoryStore, Priority, Scheduler, SimPyRuntime, TaskRecord, TaskStatus
from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import ServerError
from aiqsim.core.states import transition
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse
from aiqsim.scheduler.recovery_lookup import LookupRetry
from tests.runtimes import RUNTIMES, run_on


class FlakyLookups:
    """``lookup`` fails ``failures[key]`` times (``-1``: always; ``"hang"``: never answers), then
    answers from ``done``."""

    name = "llm"

    def __init__(self, runtime, done: dict[str, str], failures: dict[str, object]) -> None:
        self.runtime = runtime
        self.done = done
        self.failures = failures
        self.lookups: Counter[str] = Counter()
        self.lookup_times: list[tuple[float, str]] = []

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        return ProviderResponse(result=f"fresh:{request.idempotency_key}")

    async def lookup(self, key: str) -> ProviderResponse | None:
        self.lookups[key] += 1
        self.lookup_times.append((self.runtime.now(), key))
        plan = self.failures.get(key, 0)
        if plan == "hang":
            await self.runtime.sleep(10**6)
        if plan == -1 or (isinstance(plan, int) and self.lookups[key] <= plan):
            raise ServerError("lookup unavailable", status=503)
        result = self.done.get(key)
        return None if result is None else ProviderResponse(result=result)


def orphan(task_id: str) -> TaskRecord:
    record = TaskRecord(
        id=task_id,
        key=f"key-{task_id}",
        kind="llm",
        provider="llm",
        priority=Priority.BACKGROUND,
        cost_estimate=1.0,
        created_at=0.0,
        updated_at=0.0,
        payload={"input": task_id},
    )
    return record


def store_with_orphans(*ids: str) -> MemoryStore:
    store = MemoryStore()
    for task_id in ids:
        record = orphan(task_id)
        store.insert_and_claim(record)
        store.update(transition(record, TaskStatus.RUNNING, 0.0))  # a process died running it
    return store


@pytest.mark.parametrize("rt_name", RUNTIMES)
def test_a_failing_lookup_does_not_stop_the_others_and_is_reported_undecided(rt_name: str) -> None:
    async def body(rt):
        store = store_with_orphans("flaky", "broken", "done", "never")
        provider = FlakyLookups(
            rt,
            done={"key-flaky": "from provider", "key-done": "from provider"},
            failures={"key-flaky": 2, "key-broken": -1},
        )
        scheduler = Scheduler(rt, [provider], store=store, rng=random.Random(1))
        report = await scheduler.recover(lookup_retry=LookupRetry(attempts=3, backoff=ConstantBackoff(1.0)))
        statuses = {r.id: r.status for r in store.list_by_status()}
        await scheduler.close()
        return report, statuses, dict(provider.lookups)

    report, statuses, lookups = run_on(rt_name, body)
    assert report.undecided == ("broken",)
    assert (report.orphans_completed, report.orphans_failed) == (2, 1)
    assert statuses == {
        "flaky": TaskStatus.SUCCEEDED,  # answered on its third try
        "broken": TaskStatus.RUNNING,  # left as it was: the provider may have done the work
        "done": TaskStatus.SUCCEEDED,
        "never": TaskStatus.FAILED,  # the provider answered: it has no record, so interrupted
    }
    assert lookups == {"key-flaky": 3, "key-broken": 3, "key-done": 1, "key-never": 1}


def test_lookup_retries_back_off_on_the_runtime_clock_and_a_hung_lookup_times_out() -> None:
    runtime = SimPyRuntime()
    store = store_with_orphans("broken", "hung")
    provider = FlakyLookups(runtime, done={}, failures={"key-broken": -1, "key-hung": "hang"})
    scheduler = Scheduler(runtime, [provider], store=store)
    retry = LookupRetry(attempts=3, backoff=ConstantBackoff(2.0), timeout_s=5.0)

    async def body():
        return await scheduler.recover(lookup_retry=retry)

    report = runtime.run(body())
    assert report.undecided == ("broken", "hung")
    # looked up side by side: broken at 0, 2, 4; hung: three 5 s timeouts with 2 s between them
    assert sorted(provider.lookup_times) == [
        (0.0, "key-broken"),
        (0.0, "key-hung"),
        (2.0, "key-broken"),
        (4.0, "key-broken"),
        (7.0, "key-hung"),
        (14.0, "key-hung"),
    ]
    assert runtime.now() == 19.0


@pytest.mark.parametrize(("concurrency", "took_s"), [(1, 40 * 5.0), (16, 3 * 5.0), (64, 5.0)])
def test_hung_lookups_hold_a_restart_for_one_timeout_per_round_of_concurrency(
    concurrency: int, took_s: float
) -> None:
    """recover() looked orphans up one after another: a provider whose lookups hung held the restart
    for orphans x attempts x timeout_s (32 min for 16 orphans with the defaults). 40 orphans, one
    5 s attempt each: ceil(40 / concurrency) rounds of 5 s."""
    runtime = SimPyRuntime()
    ids = [f"o{n:02d}" for n in range(40)]
    store = store_with_orphans(*ids)
    provider = FlakyLookups(runtime, done={}, failures={f"key-{i}": "hang" for i in ids})
    scheduler = Scheduler(runtime, [provider], store=store)
    retry = LookupRetry(attempts=1, timeout_s=5.0, concurrency=concurrency)

    report = runtime.run(scheduler.recover(lookup_retry=retry))
    assert runtime.now() == took_s
    assert report.undecided == tuple(ids)  # in the store's order, whatever order they answered in
    assert sorted(key for _, key in provider.lookup_times) == sorted(f"key-{i}" for i in ids)


def test_recovery_cancelled_during_its_lookups_stops_them_all() -> None:
    runtime = SimPyRuntime()
    ids = [f"o{n}" for n in range(5)]
    store = store_with_orphans(*ids)
    stopped: list[str] = []

    class Hangs(FlakyLookups):
        async def lookup(self, key: str):
            try:
                return await super().lookup(key)
            except BaseException:
                stopped.append(key)
                raise

    provider = Hangs(runtime, done={}, failures={f"key-{i}": "hang" for i in ids})
    scheduler = Scheduler(runtime, [provider], store=store)

    async def body():
        recovery = runtime.spawn(scheduler.recover(lookup_retry=LookupRetry(attempts=1, timeout_s=None)))
        await runtime.sleep(1.0)
        recovery.cancel()
        await runtime.sleep(1.0)
        return recovery

    recovery = runtime.run(body())
    assert recovery.cancelled()
    assert sorted(stopped) == sorted(f"key-{i}" for i in ids)  # no lookup left hanging
    assert all(store.get(i).status is TaskStatus.RUNNING for i in ids)  # nothing decided, nothing written


def test_a_second_recover_decides_what_the_first_left_undecided() -> None:
    runtime = SimPyRuntime()
    store = store_with_orphans("broken")
    provider = FlakyLookups(runtime, done={"key-broken": "from provider"}, failures={"key-broken": 2})
    scheduler = Scheduler(runtime, [provider], store=store)

    async def body():
        first = await scheduler.recover(lookup_retry=LookupRetry(attempts=2, backoff=ConstantBackoff(1.0)))
        second = await scheduler.recover(lookup_retry=LookupRetry(attempts=2, backoff=ConstantBackoff(1.0)))
        return first, second

    first, second = runtime.run(body())
    assert first.undecided == ("broken",) and second.undecided == ()
    assert second.orphans_completed == 1
    assert store.get("broken").result == "from provider"


def test_lookup_retry_checks_its_bounds() -> None:
    with pytest.raises(ConfigurationError, match="attempts"):
        LookupRetry(attempts=0)
    with pytest.raises(ConfigurationError, match="timeout_s"):
        LookupRetry(timeout_s=0)
    for concurrency in (0, 1.5, True, None):
        with pytest.raises(ConfigurationError, match="concurrency must be an integer >= 1"):
            LookupRetry(concurrency=concurrency)


@pytest.mark.parametrize("answer", [{"result": "a dict"}, "text", 42])
def test_a_lookup_answering_no_provider_response_leaves_the_orphan_undecided(answer: object) -> None:
    """An adapter bug, like a call() returning no ProviderResponse: once, not retried, and reported;
    the orphan stays running (its work may be done) and the other orphans are reconciled. It used
    to raise a bare AttributeError out of recover(), leaving every orphan as it was."""
    runtime = SimPyRuntime()
    store = store_with_orphans("odd", "done")

    class OddLookups(FlakyLookups):
        async def lookup(self, key: str):
            self.lookups[key] += 1
            return answer if key == "key-odd" else ProviderResponse(result="from provider")

    provider = OddLookups(runtime, done={}, failures={})

    async def body():
        scheduler = Scheduler(runtime, [provider], store=store)
        report = await scheduler.recover(lookup_retry=LookupRetry(attempts=3, backoff=ConstantBackoff(1.0)))
        await scheduler.close()
        return report

    report = runtime.run(body())
    assert report.undecided == ("odd",) and report.orphans_completed == 1
    assert store.get("odd").status is TaskStatus.RUNNING and store.get("done").status is TaskStatus.SUCCEEDED
    assert provider.lookups["key-odd"] == 1
