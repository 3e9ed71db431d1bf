"""recover() with flaky lookups (issue #13): one failed lookup no longer stops the recovery.

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
    # broken: at 0, 2, 4; hung: three 5 s timeouts with 2 s between them, from t=4
    assert provider.lookup_times == [
        (0.0, "key-broken"),
        (2.0, "key-broken"),
        (4.0, "key-broken"),
        (4.0, "key-hung"),
        (11.0, "key-hung"),
        (18.0, "key-hung"),
    ]
    assert runtime.now() == 23.0


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
