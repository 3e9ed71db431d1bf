"""Quota that comes back wakes the dispatcher only when some task waits for it.

A release (or a cancelled reservation) used to schedule a dispatch run on every call, also when
nothing was queued: a run that could only find nothing to start. The rule now
(``LaneDispatch._quota_returned``): wake when a task is queued or a retry waits for quota, else
note the slot as free so that the next submission wakes the dispatcher itself. What must not
change: when each call starts.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from aiqsim import Priority, QuotaLimits, RetryPolicy, Scheduler, SimPyRuntime, TaskStatus
from tests.fakes import ScriptedProvider
from tests.runtimes import ASYNCIO_LATENESS_S, RUNTIMES, run_on
from tests.scheduler_probes import count_dispatch_runs


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_calls_one_after_another_take_one_dispatch_run_each(
    runtime_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = count_dispatch_runs(monkeypatch)

    async def body(runtime: Any) -> list[float]:
        provider = ScriptedProvider(runtime, name="llm", latency_s=1.0)
        scheduler = Scheduler(
            runtime, [provider], quotas={"llm": QuotaLimits(concurrency=2)}, rng=random.Random(0)
        )
        start = runtime.now()
        for index in range(5):  # each call ends before the next is submitted: nothing ever waits
            await scheduler.submit("llm", {"input": f"c{index}"})
            await runtime.sleep(1.0)
        await scheduler.close()
        return [t - start for t, _, _ in provider.calls]

    starts = run_on(runtime_name, body)
    # the submission's wake-up starts each call; its release finds nothing waiting and runs nothing
    assert runs == ["llm"] * 5
    if runtime_name == "simpy":
        assert starts == [0.0, 2.0, 4.0, 6.0, 8.0]


def test_a_release_wakes_the_dispatcher_for_queued_work_and_for_a_waiting_retry() -> None:
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, name="llm", latency_s=1.0, script={"r": ["500", "ok"]})
    scheduler = Scheduler(
        runtime, [provider], quotas={"llm": QuotaLimits(concurrency=1)}, rng=random.Random(0)
    )

    async def body() -> dict[str, list[float]]:
        retried = scheduler.submit("llm", {"input": "r"})
        queued = scheduler.submit("llm", {"input": "q"})
        assert (await retried.wait()).status is TaskStatus.SUCCEEDED
        assert (await queued.wait()).status is TaskStatus.SUCCEEDED
        await scheduler.close()
        starts: dict[str, list[float]] = {}
        for t, name, _ in provider.calls:
            starts.setdefault(name, []).append(t)
        return starts

    starts = runtime.run(body())
    # r fails at 1 and backs off; q takes the slot its release freed at once; r's retry waits for
    # q's release at 2 (no call waits for a wake-up that never comes)
    assert starts["q"] == [1.0]
    assert starts["r"][0] == 0.0 and starts["r"][1] >= 2.0


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_a_slot_freed_while_nothing_waits_starts_the_next_submission_at_once(runtime_name: str) -> None:
    # "a" holds the one slot for longer than an asyncio timer may be late (ASYNCIO_LATENESS_S), so
    # that "b" is cancelled while it still waits even on a loaded machine: with a 1 s call (10 ms of
    # wall time) a 5 ms stall let "a" release first and "b" start (seen under two CPU hogs)
    holding_s = ASYNCIO_LATENESS_S + 10.0

    async def body(runtime: Any) -> dict[str, float]:
        provider = ScriptedProvider(runtime, name="llm", latency_s=holding_s)
        scheduler = Scheduler(
            runtime,
            [provider],
            quotas={"llm": QuotaLimits(concurrency=1)},
            retry=RetryPolicy(attempt_timeout_s=4 * holding_s),  # the call is slow, not stuck
            rng=random.Random(0),
        )
        start = runtime.now()
        first = scheduler.submit("llm", {"input": "a"})
        await runtime.sleep(0.25)
        waiting = scheduler.submit("llm", {"input": "b"}, priority=Priority.INTERACTIVE)  # no slot: it waits
        await runtime.sleep(0.25)
        assert scheduler.cancel(waiting.id)  # the queue is empty again while "a" holds the slot
        await first  # "a" releases at holding_s with nothing waiting
        await runtime.sleep(0.5)
        late = scheduler.submit("llm", {"input": "c"})
        await late
        await scheduler.close()
        return {name: t - start for t, name, _ in provider.calls}

    starts = run_on(runtime_name, body)
    assert set(starts) == {"a", "c"}
    if runtime_name == "simpy":
        assert starts == {"a": 0.0, "c": holding_s + 0.5}
    else:
        assert holding_s + 0.5 <= starts["c"] < holding_s + 0.5 + ASYNCIO_LATENESS_S
