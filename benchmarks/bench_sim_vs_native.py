"""The production scheduler on the SimPy runtime against a hand-written SimPy model of the same queue.

Scenario (identical in both): Poisson arrivals at 90% of capacity, provider latency lognormal
(mean 1 s, sigma 0.5), a concurrency limit of 8, FIFO. Both models draw arrivals and latencies
from the same two seeded streams in the same order, so they produce the same sample path; the
table shows the two mean waits to prove it.

- native: ``simpy.Resource(capacity=8)`` and one ``env.process`` generator per task with
  ``yield env.timeout(...)``: the least a SimPy model of this queue can do.
- scheduler: :class:`aiqsim.Scheduler` on :class:`aiqsim.SimPyRuntime` with a provider that
  sleeps the latency, ``QuotaLimits(concurrency=8)``, FIFO dispatch, the memory store and the
  production retry policy (attempt timeout on).

Measured: wall time and simulated tasks per wall second at 10k and 100k tasks (median of
three runs at 10k, one at 100k), the wall-time ratio (goal <= 1.5x), peak traced memory
(tracemalloc, separate runs), the scheduler's tasks/s with no failures and with 20% of calls
answered 429, and a cProfile of the scheduler's hot path.

Run: ``python benchmarks/bench_sim_vs_native.py`` (about a minute). Prints markdown tables.
"""

from __future__ import annotations

import cProfile
import gc
import math
import pstats
import random
import statistics
import sys
import time
import tracemalloc
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import simpy

from aiqsim import (
    FifoPolicy,
    ProviderRequest,
    ProviderResponse,
    QuotaLimits,
    RateLimitError,
    RetryPolicy,
    Scheduler,
    SimPyRuntime,
)
from aiqsim.runtime import Queue
from aiqsim.stores.memory import MemoryStore

SERVERS = 8
LATENCY_MEAN_S = 1.0
LATENCY_SIGMA = 0.5
UTILISATION = 0.9
ARRIVAL_RATE = UTILISATION * SERVERS / LATENCY_MEAN_S
RATE_LIMITED_AFTER_S = 0.05  # a 429 comes back quickly


def latency_draw(rng: random.Random) -> float:
    """Lognormal latency with mean ``LATENCY_MEAN_S`` (mu chosen so that E[X] is the mean)."""
    mu = math.log(LATENCY_MEAN_S) - LATENCY_SIGMA**2 / 2
    return rng.lognormvariate(mu, LATENCY_SIGMA)


@dataclass(frozen=True)
class Outcome:
    tasks: int
    mean_wait_s: float
    simulated_s: float
    provider_calls: int = 0


# ---------------------------------------------------------------------------- native SimPy


def run_native(tasks: int, seed: int) -> Outcome:
    env = simpy.Environment()
    servers = simpy.Resource(env, capacity=SERVERS)
    arrivals = random.Random(f"arrivals-{seed}")
    latencies = random.Random(f"latency-{seed}")
    total_wait = [0.0]

    def task(created: float):
        with servers.request() as slot:
            yield slot
            total_wait[0] += env.now - created
            yield env.timeout(latency_draw(latencies))

    def source():
        for _ in range(tasks):
            yield env.timeout(arrivals.expovariate(ARRIVAL_RATE))
            env.process(task(env.now))

    env.process(source())
    env.run()
    return Outcome(tasks, total_wait[0] / tasks, env.now)


# ---------------------------------------------------------------------------- the runtime alone


def run_coroutines(tasks: int, seed: int) -> Outcome:
    """The native model written as ``async def`` on :class:`SimPyRuntime` (a portable queue as the
    semaphore), without the scheduler: isolates what the coroutine driver itself costs."""
    runtime = SimPyRuntime()
    slots: Queue[None] = Queue(runtime)
    for _ in range(SERVERS):
        slots.put_nowait(None)
    arrivals = random.Random(f"arrivals-{seed}")
    latencies = random.Random(f"latency-{seed}")
    total_wait = [0.0]

    async def task(created: float) -> None:
        await slots.get()
        total_wait[0] += runtime.now() - created
        await runtime.sleep(latency_draw(latencies))
        slots.put_nowait(None)

    async def main() -> None:
        handles = []
        for _ in range(tasks):
            await runtime.sleep(arrivals.expovariate(ARRIVAL_RATE))
            handles.append(runtime.spawn(task(runtime.now())))
        for handle in handles:
            await handle

    runtime.run(main())
    return Outcome(tasks, total_wait[0] / tasks, runtime.now())


# ---------------------------------------------------------------------------- scheduler on SimPy


class LatencyProvider:
    """Sleeps a lognormal latency; with ``rate_limited_prob`` > 0 answers some calls with a 429."""

    name = "llm"

    def __init__(self, runtime: SimPyRuntime, seed: int, rate_limited_prob: float = 0.0) -> None:
        self.runtime = runtime
        self.latencies = random.Random(f"latency-{seed}")
        self.rate_limited_prob = rate_limited_prob
        self.failures = random.Random(f"failures-{seed}") if rate_limited_prob else None
        self.calls = 0

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        self.calls += 1
        if self.failures is not None and self.failures.random() < self.rate_limited_prob:
            await self.runtime.sleep(RATE_LIMITED_AFTER_S)
            raise RateLimitError("429 too many requests")
        await self.runtime.sleep(latency_draw(self.latencies))
        return ProviderResponse(result=None)


class ForgetfulStore(MemoryStore):
    """A memory store whose ``update`` keeps nothing: isolates what persisting a transition costs."""

    def update(self, task: object) -> None:
        pass


def run_scheduler(
    tasks: int,
    seed: int,
    rate_limited_prob: float = 0.0,
    *,
    attempt_timeout: bool = True,
    store: MemoryStore | None = None,
) -> Outcome:
    runtime = SimPyRuntime()
    arrivals = random.Random(f"arrivals-{seed}")
    provider = LatencyProvider(runtime, seed, rate_limited_prob)
    store = store if store is not None else MemoryStore()
    retry = (
        RetryPolicy(max_attempts=10)
        if attempt_timeout
        else RetryPolicy(max_attempts=10, attempt_timeout_s=None)
    )
    scheduler = Scheduler(
        runtime,
        [provider],
        quotas={provider.name: QuotaLimits(concurrency=SERVERS)},
        store=store,
        dispatch=FifoPolicy(),
        retry=retry,
        rng=random.Random(f"scheduler-{seed}"),
        background_limit=None,  # the native model's queue is unbounded too
    )
    ids: list[str] = []

    async def main() -> None:
        for index in range(tasks):
            await runtime.sleep(arrivals.expovariate(ARRIVAL_RATE))
            ids.append(scheduler.submit(provider.name, index, key=f"t{index}", cost_estimate=0.0).id)
        await scheduler.join()
        await scheduler.close()

    runtime.run(main())
    if isinstance(store, ForgetfulStore):  # the records never changed: no waits to report
        return Outcome(tasks, math.nan, runtime.now(), provider.calls)
    waits = [store.get(task_id).started_at - store.get(task_id).created_at for task_id in ids]
    return Outcome(tasks, statistics.fmean(waits), runtime.now(), provider.calls)


# ---------------------------------------------------------------------------- measuring


def wall(fn: Callable[[], Outcome]) -> tuple[float, Outcome]:
    gc.collect()
    start = time.perf_counter()
    outcome = fn()
    return time.perf_counter() - start, outcome


def median_wall(fn: Callable[[], Outcome], repeat: int) -> tuple[float, Outcome]:
    samples = [wall(fn) for _ in range(repeat)]
    return statistics.median(s for s, _ in samples), samples[-1][1]


def peak_memory_mb(fn: Callable[[], Outcome]) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / 1e6


def profile_hot_path(tasks: int) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    run_scheduler(tasks, seed=0)
    profiler.disable()
    stats = pstats.Stats(profiler)
    by_module: dict[str, float] = defaultdict(float)
    rows = []
    total = 0.0
    for (filename, line, function), (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        module = "/".join(filename.replace("\\", "/").split("/")[-2:])
        by_module[module] += own
        total += own
        rows.append((own, calls, cumulative, f"{module}:{line}({function})"))
    print(f"\ncProfile of the scheduler on SimPy, {tasks:,} tasks (own time; profiler overhead included):\n")
    print("| module | share of own time |")
    print("|---|---|")
    for module, own in sorted(by_module.items(), key=lambda kv: -kv[1])[:10]:
        print(f"| {module} | {own / total:.1%} |")
    print("\n| function | calls | own s | cumulative s |")
    print("|---|---|---|---|")
    for own, calls, cumulative, name in sorted(rows, reverse=True)[:15]:
        print(f"| {name} | {calls:,} | {own:.3f} | {cumulative:.3f} |")


def main() -> None:
    profile = "--no-profile" not in sys.argv
    print(
        f"Scenario: {SERVERS} slots, Poisson arrivals at {UTILISATION:.0%} load, lognormal latency "
        f"(mean {LATENCY_MEAN_S:g} s, sigma {LATENCY_SIGMA:g}), FIFO. Python {sys.version.split()[0]}, "
        f"simpy {simpy.__version__}.\n"
    )
    print("| tasks | model | wall s | simulated tasks / wall s | mean wait s (same path) | peak MB |")
    print("|---|---|---|---|---|---|")
    ratios = {}
    for tasks, repeat in ((10_000, 3), (100_000, 1)):
        native_s, native = median_wall(lambda t=tasks: run_native(t, seed=1), repeat)
        coro_s, coro = median_wall(lambda t=tasks: run_coroutines(t, seed=1), repeat)
        sched_s, sched = median_wall(lambda t=tasks: run_scheduler(t, seed=1), repeat)
        native_mb = peak_memory_mb(lambda t=tasks: run_native(t, seed=1))
        coro_mb = peak_memory_mb(lambda t=tasks: run_coroutines(t, seed=1))
        sched_mb = peak_memory_mb(lambda t=tasks: run_scheduler(t, seed=1))
        ratios[tasks] = (sched_s / native_s, sched_mb / native_mb, coro_s / native_s)
        for label, seconds, outcome, mb in (
            ("native SimPy", native_s, native, native_mb),
            ("same model as coroutines on SimPyRuntime (runtime only)", coro_s, coro, coro_mb),
            ("Scheduler on SimPyRuntime", sched_s, sched, sched_mb),
        ):
            print(
                f"| {tasks:,} | {label} | {seconds:.2f} | {tasks / seconds:,.0f} | "
                f"{outcome.mean_wait_s:.4f} | {mb:.1f} |"
            )
    print(
        "\n| tasks | wall-time ratio scheduler / native (goal <= 1.5x) | peak-memory ratio "
        "| runtime only: coroutines / native |"
    )
    print("|---|---|---|---|")
    for tasks, (time_ratio, memory_ratio, runtime_ratio) in ratios.items():
        print(f"| {tasks:,} | {time_ratio:.2f}x | {memory_ratio:.1f}x | {runtime_ratio:.2f}x |")

    print("\n| scheduler on SimPy, 10,000 tasks | wall s | tasks / wall s | provider calls |")
    print("|---|---|---|---|")
    for label, probability in (("no failures", 0.0), ("20% of calls answered 429", 0.2)):
        seconds, outcome = median_wall(
            lambda p=probability: run_scheduler(10_000, seed=2, rate_limited_prob=p), 3
        )
        print(f"| {label} | {seconds:.2f} | {10_000 / seconds:,.0f} | {outcome.provider_calls:,} |")
    where_the_time_goes(10_000)
    if profile:
        profile_hot_path(20_000)


def where_the_time_goes(tasks: int) -> None:
    """Microseconds per task for the native model, the runtime alone and the scheduler with parts removed.

    An ablation, not a profile: each row is a whole run, so the differences are what each part
    costs without the profiler's per-call overhead.
    """
    rows = [
        ("native SimPy", lambda: run_native(tasks, seed=1)),
        ("runtime only (same model as coroutines)", lambda: run_coroutines(tasks, seed=1)),
        ("Scheduler, as benchmarked above", lambda: run_scheduler(tasks, seed=1)),
        (
            "Scheduler without the attempt timeout",
            lambda: run_scheduler(tasks, seed=1, attempt_timeout=False),
        ),
        (
            "Scheduler without the timeout, transitions not persisted",
            lambda: run_scheduler(tasks, seed=1, attempt_timeout=False, store=ForgetfulStore()),
        ),
    ]
    print(f"\nWhere the time goes, {tasks:,} tasks (median of 5 whole runs each):\n")
    print("| model | us / task | vs native |")
    print("|---|---|---|")
    native_us = None
    for label, fn in rows:
        seconds, _ = median_wall(fn, 5)
        us = seconds / tasks * 1e6
        native_us = native_us if native_us is not None else us
        print(f"| {label} | {us:.1f} | {us / native_us:.2f}x |")


if __name__ == "__main__":
    main()
