"""One scheduler, two clocks: the same scenario on SimPy and on asyncio gives the same outcome."""

from __future__ import annotations

import random

import pytest

from aiqsim import (
    AsyncioRuntime,
    ExponentialBackoff,
    Priority,
    QuotaLimits,
    RetryPolicy,
    Route,
    Scheduler,
    SimPyRuntime,
    TaskStatus,
)
from aiqsim.core.failures import PoisonInputError
from tests.fakes import ScriptedProvider

SCRIPT = {
    "a": ["ok"],
    "b": ["429:2.9", "ok"],  # Retry-After off the 1 s grid: no same-instant ties
    "c": ["500", "500", "ok"],
    "p": ["schema"],
    "f": ["invalid"],
    "h": ["hang"],
}
# (submit time, task id, input); "d" is submitted twice (a double click), "x" is cancelled while queued.
# No two waiters ever compete for one free slot at the same scheduler instant (with "p" before "f",
# c's and p's retries both became ready at t = 7.15 for one slot, and on asyncio the winner was
# decided by wall-clock jitter), so the live run follows the simulated timeline, only later.
SUBMISSIONS = [
    (0.0, "t-a", "a"),
    (0.25, "t-b", "b"),
    (0.5, "t-c", "c"),
    (0.75, "t-f", "f"),
    (1.0, "t-d1", "d"),
    (1.05, "t-d2", "d"),
    (1.25, "t-p", "p"),
    (1.5, "t-h", "h"),
    (1.75, "t-x", "x"),
]
CANCEL_QUEUED_AT = 1.8
CANCEL_RUNNING_AT = 14.0


def run_parity_scenario(runtime):
    provider = ScriptedProvider(runtime, latency_s=1.0, script=SCRIPT)
    scheduler = Scheduler(
        runtime,
        [provider],
        quotas={"llm": QuotaLimits(concurrency=2)},
        retry=RetryPolicy(
            backoff=ExponentialBackoff(base_s=1.0, cap_s=8.0),
            max_attempts=4,
            attempt_timeout_s=30,
            rate_limit_scope="lane",  # the timeline below was laid out around b's lane-wide pause
        ),
        rng=random.Random(7),
    )

    async def main():
        # Scenario time starts when main() does (asyncio's loop start-up is not part of the
        # script), and every step sleeps until its time on that clock rather than for a fixed
        # interval, so a late wake-up on a loaded machine does not push every later step back.
        origin = runtime.now()

        async def sleep_until(at):
            await runtime.sleep(at - (runtime.now() - origin))

        handles = {}
        for at, task_id, name in SUBMISSIONS:
            await sleep_until(at)
            handles[task_id] = scheduler.submit(
                "llm", {"input": name}, task_id=task_id, cost_estimate=10, priority=Priority.BACKGROUND
            )
        await sleep_until(CANCEL_QUEUED_AT)
        assert scheduler.cancel("t-x")
        await sleep_until(CANCEL_RUNNING_AT)
        assert scheduler.cancel("t-h")
        records = {task_id: await h.wait() for task_id, h in handles.items()}
        await scheduler.close()
        return records, origin

    records, origin = runtime.run(main())
    calls = {name: provider.calls_for(name) for name in "abcdpfhx"}
    return records, calls, provider, origin


EXPECTED = {
    "t-a": (TaskStatus.SUCCEEDED, 1),
    "t-b": (TaskStatus.SUCCEEDED, 2),
    "t-c": (TaskStatus.SUCCEEDED, 3),
    "t-p": (TaskStatus.FAILED, 3),
    "t-d1": (TaskStatus.SUCCEEDED, 1),
    "t-d2": (TaskStatus.DEDUPED, 0),
    "t-f": (TaskStatus.FAILED, 1),
    "t-h": (TaskStatus.CANCELLED, 1),
    "t-x": (TaskStatus.CANCELLED, 0),
}
EXPECTED_CALLS = {"a": 1, "b": 2, "c": 3, "d": 1, "p": 3, "f": 1, "h": 1, "x": 0}


def test_simpy_run_matches_the_script_exactly() -> None:
    records, calls, provider, _ = run_parity_scenario(SimPyRuntime())
    assert {tid: (r.status, r.attempts) for tid, r in records.items()} == EXPECTED
    assert calls == EXPECTED_CALLS
    assert records["t-d2"].result == records["t-d1"].result == {"output": "done:d"}
    assert records["t-d2"].deduped_from == "t-d1"
    assert records["t-p"].error.startswith("SchemaViolationError")
    assert provider.cancelled == ["h"]
    # b's 429 (Retry-After 2.9 s at t=1.25) paused the whole lane: nobody started in (1.25, 4.15).
    starts = [t for t, _, _ in provider.calls]
    assert not any(1.25 < t < 4.15 - 1e-9 for t in starts)
    assert records["t-b"].finished_at == pytest.approx(5.15)


PARITY_SCALE = 0.25
"""One scheduler second lasts 250 ms of wall time: the script takes about 2 s."""


def test_asyncio_run_matches_simpy_statuses_calls_and_times() -> None:
    sim_records, sim_calls, _, _ = run_parity_scenario(SimPyRuntime())
    live_records, live_calls, _, origin = run_parity_scenario(AsyncioRuntime(time_scale=PARITY_SCALE))
    assert {t: (r.status, r.attempts) for t, r in live_records.items()} == {
        t: (r.status, r.attempts) for t, r in sim_records.items()
    }
    assert live_calls == sim_calls
    for task_id, sim in sim_records.items():
        # Timers never fire early, so the live run can only lag the simulation: tight below (every
        # latency, backoff and Retry-After was waited in full), looser above, because late wake-ups
        # add up along a retry chain on a loaded machine (1 scheduler-second = 250 ms of wall time;
        # measured: at most 0.055 scheduler-seconds, idle or with CPU hogs on both cores).
        lag = live_records[task_id].finished_at - origin - sim.finished_at
        assert -0.01 <= lag <= 1.0, (task_id, lag)


def test_a_poison_key_is_remembered_and_not_sent_again() -> None:
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, script={"p": ["schema"]})
    fallback_calls = []

    async def fallback(record):
        fallback_calls.append(record.id)
        return {"output": "fallback"}

    async def main():
        scheduler = Scheduler(runtime, [provider], retry=RetryPolicy(backoff=ExponentialBackoff(0.1, 1.0)))
        first = await scheduler.submit("llm", {"input": "p"}).wait()
        second = await scheduler.submit("llm", {"input": "p"}).wait()
        with_fallback = Scheduler(runtime, [provider], store=scheduler.store, poison_fallback=fallback)
        third = await with_fallback.submit("llm", {"input": "p"}).wait()
        return first, second, third

    first, second, third = runtime.run(main())
    assert first.status is TaskStatus.FAILED and first.attempts == 3
    assert second.status is TaskStatus.FAILED and second.attempts == 0
    assert second.error.startswith(PoisonInputError.__name__)
    assert third.status is TaskStatus.SUCCEEDED and third.result == {"output": "fallback"}
    assert provider.calls_for("p") == 3
    assert len(fallback_calls) == 1


# ---------------------------------------------------------------- routes across deployments
ROUTE_SCALE = 0.05
"""Under asyncio, one scheduler second lasts 50 ms in the route parity run (about 3 s in all)."""


def run_route_parity(runtime):
    """Every routing policy, one route each over the same two deployments, in two waves: each wave
    submitted in one instant (the choices read the lanes as that instant left them), the second once
    the first has finished (``lowest_latency`` has measured both). Input "r" fails once on east: its
    retry moves to west. Returns (task id -> (status, attempts, provider)) and the calls per deployment."""
    east = ScriptedProvider(runtime, name="east", latency_s=1.0, script={"r": ["500", "ok"]})
    west = ScriptedProvider(runtime, name="west", latency_s=2.0)
    routes = {
        "weighted": Route(["east", "west"], policy="weighted", weights=[1, 3]),
        "least_loaded": Route(["east", "west"], policy="least_loaded"),
        "lowest_latency": Route(["east", "west"], policy="lowest_latency"),
        "most_headroom": Route(["east", "west"], policy="most_headroom"),
        "cheapest": Route(["east", "west"], policy="cheapest", prices=[1.0, 0.2]),
    }
    scheduler = Scheduler(
        runtime,
        [east, west],
        quotas={"east": QuotaLimits(concurrency=4), "west": QuotaLimits(concurrency=2)},
        routes=routes,
        retry=RetryPolicy(
            backoff=ExponentialBackoff(base_s=0.5, cap_s=0.5), max_attempts=3, attempt_timeout_s=None
        ),
        rng=random.Random(5),
    )

    async def main():
        origin = runtime.now()
        handles = {}
        for wave, at in enumerate((0.0, 40.0)):
            await runtime.sleep(at - (runtime.now() - origin))
            for route in routes:
                for n in range(5):
                    task_id = f"{route}-{wave}-{n}"
                    name = "r" if (route, wave, n) == ("least_loaded", 0, 0) else task_id
                    handles[task_id] = scheduler.submit(route, {"input": name}, task_id=task_id)
        records = {task_id: await handle.wait() for task_id, handle in handles.items()}
        await scheduler.close()
        return records

    records = runtime.run(main())
    outcomes = {task_id: (r.status, r.attempts, r.provider) for task_id, r in records.items()}
    return outcomes, (len(east.calls), len(west.calls))


def test_every_routing_policy_chooses_alike_on_both_clocks() -> None:
    sim, sim_calls = run_route_parity(SimPyRuntime())
    live, live_calls = run_route_parity(AsyncioRuntime(time_scale=ROUTE_SCALE))
    assert live == sim
    assert live_calls == sim_calls
    assert sim["least_loaded-0-0"] == (TaskStatus.SUCCEEDED, 2, "west")  # failed on east, retried on west
    assert all(status is TaskStatus.SUCCEEDED for status, _, _ in sim.values())
    # the second wave of lowest_latency goes to east, measured faster (1 s against 2 s)
    assert {sim[f"lowest_latency-1-{n}"][2] for n in range(5)} == {"east"}
    # cheapest: no free slot on either (what waits takes them), so the least loaded per slot: west's
    # 5 waiting / 2 slots against east's 15 / 4, until west's load passes east's
    assert [sim[f"cheapest-0-{n}"][2] for n in range(5)] == ["west", "west", "west", "east", "east"]
    assert sim_calls == (34, 17)  # 50 tasks and r's retry
