"""A fan-out stage is capped, and a large one is submitted without holding the event loop.

A build that returned ten million elements was not refused (``submit_job`` did not return within a
minute: a projected twenty minutes and 14 GiB), and a later stage fanning out to 20,000 held the
asyncio loop for 3.5 s in one step. A fan-out above its stage's ``max_fan_out`` (10,000 by default)
now fails the job at that stage before any of its tasks is submitted, and a large one is submitted
a batch at a time, letting the loop run in between.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest

from aiqsim import AsyncioRuntime, JobSpec, JobSpecError, JobStatus, Scheduler, SimPyRuntime, Stage
from aiqsim.scheduler.events import TaskTransition
from aiqsim.scheduler.job_spec import DEFAULT_MAX_FAN_OUT, FanOutLimitError
from aiqsim.scheduler.jobs import SUBMIT_BATCH
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse
from tests.fakes import ScriptedProvider


def seed(inputs: Any, results: Any) -> Any:
    return {"input": "seed", "n": inputs["n"]}


def listed(inputs: Any, results: Any) -> list[Any]:
    return [{"input": f"e{i}"} for i in range(inputs["n"])]


PULLED: list[int] = []


def endless(inputs: Any, results: Any) -> Iterator[Any]:
    """Ten million elements, lazily: counts how many were read."""
    for i in range(10**7):
        PULLED.append(i)
        yield {"input": f"e{i}"}


def run_job(spec: JobSpec, inputs: Any) -> tuple[Any, dict[str, ScriptedProvider]]:
    runtime = SimPyRuntime()
    providers = {name: ScriptedProvider(runtime, name=name, latency_s=1.0) for name in ("a", "b")}
    scheduler = Scheduler(runtime, list(providers.values()), rng=random.Random(7), background_limit=None)

    async def main() -> Any:
        return await scheduler.submit_job(spec, inputs).wait()

    return runtime.run(main()), providers


def test_a_fan_out_above_the_default_cap_fails_its_stage_before_any_task_is_submitted() -> None:
    assert DEFAULT_MAX_FAN_OUT == 10_000
    spec = JobSpec(
        "wide",
        "1",
        [Stage("a", "a", build=seed), Stage("fan", "b", after=("a",), build=listed, fan_out=True)],
    )
    record, providers = run_job(spec, {"n": DEFAULT_MAX_FAN_OUT + 1})
    assert record.status is JobStatus.FAILED and record.failed_stage == "fan"
    assert "FanOutLimitError" in record.error and "stage 'fan'" in record.error
    assert "10,001 elements" in record.error and "max_fan_out of 10,000" in record.error
    assert providers["b"].calls == [] and "fan" not in record.stage_tasks


def test_an_iterator_is_read_no_further_than_one_element_past_the_cap() -> None:
    PULLED.clear()
    spec = JobSpec("endless", "1", [Stage("fan", "b", build=endless, fan_out=True, max_fan_out=50)])
    record, providers = run_job(spec, {"n": 0})
    assert record.status is JobStatus.FAILED and record.failed_stage == "fan"
    assert "more than 50 elements" in record.error
    assert len(PULLED) == 51 and providers["b"].calls == []


def test_the_cap_is_the_stages_own() -> None:
    spec = JobSpec("small", "1", [Stage("fan", "b", build=listed, fan_out=True, max_fan_out=3)])
    assert run_job(spec, {"n": 3})[0].status is JobStatus.SUCCEEDED
    refused, _ = run_job(spec, {"n": 4})
    assert refused.status is JobStatus.FAILED and "4 elements" in refused.error
    for bad in (0, -1, 2.5, True, None):
        with pytest.raises(JobSpecError, match="max_fan_out must be a whole number >= 1"):
            Stage("fan", "b", fan_out=True, max_fan_out=bad)  # type: ignore[arg-type]
    assert issubclass(FanOutLimitError, JobSpecError)


class Instant:
    def __init__(self, name: str) -> None:
        self.name = name

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        return ProviderResponse(result=request.payload)


def test_a_large_later_fan_out_leaves_the_event_loop_free_between_batches() -> None:
    """20,000 submissions of a later stage, with a loop-lag probe (a coroutine that wakes every
    millisecond). Its noise floor is measured first on this machine, under the same kind of load
    (the loop busy with CPU work in short steps). Submitted in one step, the fan-out held the loop for
    as long as all its submissions took (3.1 s here): the probe never ran between the first and the
    last. Now it runs between the batches, and the longest hold stays far below that span."""
    size = 20_000
    spec = JobSpec(
        "wide",
        "1",
        [
            Stage("a", "a", build=seed),
            Stage("fan", "b", after=("a",), build=listed, fan_out=True, max_fan_out=size),
        ],
    )

    async def main() -> tuple[Any, float, float, list[tuple[int, float]]]:
        ticks = [0]
        lags: list[float] = []
        stop = asyncio.Event()

        async def probe() -> None:
            last = time.perf_counter()
            while not stop.is_set():
                await asyncio.sleep(0.001)
                now = time.perf_counter()
                lags.append(now - last - 0.001)
                last = now
                ticks[0] += 1

        async def busy(seconds: float) -> None:  # CPU work in 2 ms steps, as a batch of submissions is
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                step = time.perf_counter() + 0.002
                while time.perf_counter() < step:
                    pass
                await asyncio.sleep(0)

        probing = asyncio.create_task(probe())
        await busy(1.0)
        floor = max(lags)
        lags.clear()
        queued: list[tuple[int, float]] = []  # (probe ticks so far, when) per fan-out task queued

        def sink(event: Any) -> None:
            if isinstance(event, TaskTransition) and event.provider == "b" and event.old is None:
                queued.append((ticks[0], time.perf_counter()))

        scheduler = Scheduler(
            AsyncioRuntime(), [Instant("a"), Instant("b")], background_limit=None, events=sink
        )
        record = await scheduler.submit_job(spec, {"n": size}).wait()
        stop.set()
        await probing
        await scheduler.close()
        return record, floor, max(lags), queued

    record, floor, longest, queued = asyncio.run(main())
    assert record.status is JobStatus.SUCCEEDED and len(record.results["fan"]) == size
    assert len(queued) == size
    span = queued[-1][1] - queued[0][1]
    interleaved = len({tick for tick, _ in queued})
    print(
        f"{size} fan-out: longest loop hold {longest * 1000:.0f} ms (noise floor {floor * 1000:.0f} ms), "
        f"submissions over {span:.2f} s, the probe ran between them {interleaved - 1} times"
    )
    # was 1: every submission in one step. The probe wakes at least every few batches (a batch's
    # wake-up and the probe's timer share loop iterations with the dispatcher's work)
    assert interleaved >= size // SUBMIT_BATCH // 8
    assert longest < floor + span / 4, (longest, floor, span)
