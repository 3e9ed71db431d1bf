"""What a job costs the scheduler: N three-stage jobs against the same 3N calls submitted as plain tasks.

Scenario (SimPy runtime, memory store, three unconstrained providers with a fixed 1 s latency):

- jobs: N jobs of a chain ``a -> b -> c``, one job per 0.1 s of virtual time; each stage's payload is
  built from the job's inputs and the previous result, so the orchestration does all its work
  (build, submit, job-record writes, completion hook).
- tasks: the same 3N calls as plain ``submit``s, each chain driven by a coroutine that awaits one
  call and submits the next: what a user would write without jobs.

Both produce the same calls at the same virtual times (checked). Measured: wall time, min and median
over ``ROUNDS`` interleaved rounds, and the ratio (jobs / tasks): the orchestration's overhead per call.
Under load read the min: load only ever adds time.

Run: ``python benchmarks/bench_jobs.py [N]`` (a few seconds). Prints a markdown table and the load average.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time

from aiqsim import JobSpec, ProviderRequest, ProviderResponse, Scheduler, SimPyRuntime, Stage
from aiqsim.stores.memory import MemoryStore

ROUNDS = 5
SPACING_S = 0.1
LATENCY_S = 1.0


class Fixed:
    """A provider that answers after a fixed latency."""

    def __init__(self, runtime: SimPyRuntime, name: str) -> None:
        self.runtime = runtime
        self.name = name

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        await self.runtime.sleep(LATENCY_S)
        return ProviderResponse(result={"out": request.payload["in"]})


def step_a(inputs, results):
    return {"in": f"a{inputs['n']}"}


def step_b(inputs, results):
    return {"in": f"b{results['a']['out']}"}


def step_c(inputs, results):
    return {"in": f"c{results['b']['out']}"}


SPEC = JobSpec(
    "bench",
    "1",
    [
        Stage("a", "pa", build=step_a),
        Stage("b", "pb", after=("a",), build=step_b),
        Stage("c", "pc", after=("b",), build=step_c),
    ],
)


def scheduler_for(runtime: SimPyRuntime) -> Scheduler:
    providers = [Fixed(runtime, name) for name in ("pa", "pb", "pc")]
    return Scheduler(runtime, providers, store=MemoryStore(), rng=random.Random(0), interactive_limit=None)


def run_jobs(n: int) -> float:
    runtime = SimPyRuntime()
    scheduler = scheduler_for(runtime)

    async def main() -> float:
        handles = []
        for i in range(n):
            handles.append(scheduler.submit_job(SPEC, {"n": i}))
            await runtime.sleep(SPACING_S)
        for handle in handles:
            await handle.wait()
        return runtime.now()

    return runtime.run(main())


def run_tasks(n: int) -> float:
    runtime = SimPyRuntime()
    scheduler = scheduler_for(runtime)

    async def chain(i: int) -> None:
        a = await scheduler.submit("pa", {"in": f"a{i}"})
        b = await scheduler.submit("pb", {"in": f"b{a['out']}"})
        await scheduler.submit("pc", {"in": f"c{b['out']}"})

    async def main() -> float:
        chains = []
        for i in range(n):
            chains.append(runtime.spawn(chain(i)))
            await runtime.sleep(SPACING_S)
        for handle in chains:
            await handle
        return runtime.now()

    return runtime.run(main())


def virtual_end(n: int) -> float:
    """When both runs end: the submitting loop sleeps n spacings; the last chain ends three latencies
    after its start at (n - 1) spacings, whichever is later."""
    return max(n * SPACING_S, (n - 1) * SPACING_S + 3 * LATENCY_S)


def timed(n: int) -> tuple[list[float], list[float]]:
    """Wall times of both variants, rounds interleaved so that a change of machine load hits both."""
    jobs: list[float] = []
    tasks: list[float] = []
    for _ in range(ROUNDS):
        for fn, walls in ((run_jobs, jobs), (run_tasks, tasks)):
            start = time.perf_counter()
            end = fn(n)
            walls.append(time.perf_counter() - start)
            assert abs(end - virtual_end(n)) < 1e-6, (fn.__name__, end)  # the same calls at the same times
    return jobs, tasks


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    jobs, tasks = timed(n)
    load = os.getloadavg()
    print(f"{n} jobs x 3 stages vs {3 * n} chained tasks, {ROUNDS} rounds interleaved, load {load[0]:.2f}")
    print("| variant | min wall s | median wall s | calls per wall s (median) |")
    print("|---|---|---|---|")
    for name, walls in (("jobs", jobs), ("plain tasks", tasks)):
        median = statistics.median(walls)
        print(f"| {name} | {min(walls):.3f} | {median:.3f} | {3 * n / median:,.0f} |")
    best = min(jobs) / min(tasks)
    typical = statistics.median(jobs) / statistics.median(tasks)
    print(f"ratio jobs / tasks: min {best:.2f}x, median {typical:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
