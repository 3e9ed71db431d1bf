"""What sharing a lane among tenants costs the dispatch, against today's dispatch (no tenants).

Two measurements, each interleaved round by round so machine load hits the modes alike:

- **queue**: the dispatch queue alone: ``ITEMS`` queue items pushed, then taken one by one with
  ``peek``/``pop`` (what the lane's dispatcher does per start), in the policy's own queue (FIFO,
  today's) and in a :class:`~aiqsim.scheduler.tenants.TenantQueue` of 1 and of 50 tenants (random
  weights from 1 to 5, items spread over the tenants at random): nanoseconds per item.
- **scheduler**: the production scheduler on the virtual clock (:class:`aiqsim.SimPyRuntime`, no
  wall-clock waits), ``TASKS`` tasks submitted at once to a lane of concurrency 8 whose calls take
  one virtual second, without tenants and with 50 tenants: tasks per CPU second of the whole run
  (submit, dispatch, attempt, store, outcome), so the share the tenant rule adds to a start.

Times are this process's CPU time (``time.process_time``): on a machine shared with other work the
wall clock counts their turns too, CPU time much less so.

Run: ``python benchmarks/bench_tenants.py [ROUNDS]`` (5 by default). Prints markdown tables with
the best (least time, most tasks/s) and the median per mode, the median of each round's ratio to
the no-tenants run of the same round, and the load average before and after.
"""

from __future__ import annotations

import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Callable

from aiqsim import ProviderRequest, ProviderResponse, QuotaLimits, Scheduler, SimPyRuntime
from aiqsim.scheduler import FifoPolicy, Tenant, TenantQueue
from aiqsim.scheduler.dispatch import QueueItem
from aiqsim.scheduler.retry import RetryPolicy

ITEMS = 50_000
TASKS = 20_000
TENANTS = 50


def tenants(count: int, rng: random.Random) -> dict[str, Tenant]:
    return {f"tenant-{n:02d}": Tenant(weight=rng.randint(1, 5)) for n in range(count)}


def queue_run(count: int) -> float:
    """Seconds per item to push ``ITEMS`` items and take them all (``count`` 0: the FIFO queue)."""
    rng = random.Random(1)
    names: list[str | None] = [None]
    if count:
        config = tenants(count, rng)
        names = list(config)
        queue = TenantQueue(FifoPolicy(), config)
    else:
        queue = FifoPolicy().new_queue()  # type: ignore[assignment]
    items = [QueueItem(f"t{n}", 1.0, 0.0, n, False, rng.choice(names)) for n in range(ITEMS)]
    gc.collect()
    start = time.process_time()
    for item in items:
        queue.push(item)
    peek, pop = queue.peek, queue.pop
    while (head := peek(0.0)) is not None:
        pop(head)
    return (time.process_time() - start) / ITEMS


class Instant:
    name = "llm"

    def __init__(self, runtime: SimPyRuntime) -> None:
        self.runtime = runtime

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        await self.runtime.sleep(1.0)
        return ProviderResponse(None)


def scheduler_run(count: int) -> float:
    """Tasks per CPU second of a backlog of ``TASKS`` tasks run on the virtual clock."""
    rng = random.Random(2)
    config = tenants(count, rng) if count else None
    names = list(config) if config else [None]
    runtime = SimPyRuntime()
    scheduler = Scheduler(
        runtime,
        [Instant(runtime)],
        quotas={"llm": QuotaLimits(concurrency=8)},
        tenants=config,
        retry=RetryPolicy(max_attempts=1, attempt_timeout_s=None),
        background_limit=None,
        rng=random.Random(3),
    )
    picks = [rng.choice(names) for _ in range(TASKS)]

    async def body() -> None:
        async with scheduler:
            for n, tenant in enumerate(picks):
                scheduler.submit("llm", n, cost_estimate=1.0, tenant=tenant)
            await scheduler.join()

    gc.collect()
    start = time.process_time()
    runtime.run(body())
    return TASKS / (time.process_time() - start)


def rounds_of(modes: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(rounds):
        for mode, run in modes.items():
            results[mode].append(run())
    return results


def table(
    title: str, unit: str, results: dict[str, list[float]], scale: float, higher_is_better: bool
) -> str:
    baseline = results["no tenants"]
    lines = [
        f"### {title}",
        "",
        f"| mode | best {unit} | median {unit} | median ratio to no tenants |",
        "|---|---|---|---|",
    ]
    for mode, values in results.items():
        ratios = [value / base for value, base in zip(values, baseline, strict=True)]
        best = max(values) if higher_is_better else min(values)
        lines.append(
            f"| {mode} | {best * scale:,.1f} | {statistics.median(values) * scale:,.1f} | "
            f"{statistics.median(ratios):.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    load_before = os.getloadavg()
    queues = rounds_of(
        {
            "no tenants": lambda: queue_run(0),
            "1 tenant": lambda: queue_run(1),
            "50 tenants": lambda: queue_run(TENANTS),
        },
        rounds,
    )
    schedulers = rounds_of(
        {"no tenants": lambda: scheduler_run(0), "50 tenants": lambda: scheduler_run(TENANTS)}, rounds
    )
    load_after = os.getloadavg()
    print(f"## Tenants: dispatch cost ({rounds} rounds, interleaved; python {sys.version.split()[0]})\n")
    print(
        table(
            f"queue: push + peek + pop of {ITEMS:,} items (ns per item; lower is better)",
            "ns",
            queues,
            1e9,
            False,
        )
    )
    print()
    print(
        table(
            f"scheduler: {TASKS:,} tasks on the virtual clock, concurrency 8 "
            "(tasks per CPU second; higher is better)",
            "tasks/s",
            schedulers,
            1.0,
            True,
        )
    )
    print(f"\nload average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min; 2 cores shared)")


if __name__ == "__main__":
    main()
