"""What routing a call across deployments costs the dispatch, against today's dispatch (no routes).

Three routes (three models), each over three deployments: nine providers in all. Two measurements,
each interleaved round by round so machine load hits the modes alike:

- **submit**: ``TASKS`` submissions on the virtual clock (:class:`aiqsim.SimPyRuntime`), spread over
  the three models: today each names its provider (the deployment picked by the caller, round
  robin), with routes each names its route and the route's policy picks the deployment (the frozen
  snapshot of the route's lanes built, the pure rule applied). CPU microseconds per submission.
- **scheduler**: the same submissions run to the end (dispatch, attempt, store, outcome), each
  deployment of concurrency 8 with calls of one virtual second: tasks per CPU second of the whole
  run, so the share the route choice adds to a task's whole life.

Times are this process's CPU time (``time.process_time``), not wall time: on a machine shared with
other work the wall clock counts their turns too.

With tenants (the last two modes), 50 tenants of weights 1 to 5 share each lane and the submissions
name them in turn: 3 routes x 50 tenants against today's dispatch (no routes, no tenants).

Run: ``python benchmarks/bench_routes.py [ROUNDS]`` (5 by default). Prints markdown tables with the
best (lowest time, highest rate) and median per mode, the median of each round's ratio to today's
run of the same round, and the load average before and after.
"""

from __future__ import annotations

import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Callable

from aiqsim import ProviderRequest, ProviderResponse, QuotaLimits, Route, Scheduler, SimPyRuntime
from aiqsim.scheduler import Tenant
from aiqsim.scheduler.retry import RetryPolicy

TASKS = 20_000
TENANTS = 50
MODELS = ("gpt-4o", "gpt-4o-mini", "embed")
REGIONS = ("east", "west", "openai")


class Instant:
    def __init__(self, runtime: SimPyRuntime, name: str) -> None:
        self.runtime = runtime
        self.name = name

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        await self.runtime.sleep(1.0)
        return ProviderResponse(None)


Mode = tuple[str | None, int]
"""(route policy or ``None``: today's provider named by the caller; tenants: 0 for none)."""


def _scheduler(runtime: SimPyRuntime, policy: str | None, tenants: int) -> Scheduler:
    names = [f"{model}@{region}" for model in MODELS for region in REGIONS]
    routes = None
    if policy is not None:
        routes = {
            model: Route([f"{model}@{region}" for region in REGIONS], policy=policy, weights=[3, 2, 1])
            for model in MODELS
        }
    return Scheduler(
        runtime,
        [Instant(runtime, name) for name in names],
        quotas={name: QuotaLimits(concurrency=8) for name in names},
        routes=routes,
        tenants={f"tenant-{n:02d}": Tenant(weight=1 + n % 5) for n in range(tenants)} if tenants else None,
        retry=RetryPolicy(max_attempts=1, attempt_timeout_s=None),
        background_limit=None,
        rng=random.Random(3),
    )


def _targets(policy: str | None, tenants: int) -> list[tuple[str, str | None]]:
    """Each submission's ``provider=`` (a route, or today a deployment picked round robin) and tenant."""
    names = [f"tenant-{n % tenants:02d}" if tenants else None for n in range(TASKS)]
    if policy is not None:
        return [(MODELS[n % 3], names[n]) for n in range(TASKS)]
    return [(f"{MODELS[n % 3]}@{REGIONS[(n // 3) % 3]}", names[n]) for n in range(TASKS)]


def submit_run(mode: Mode) -> float:
    """Seconds per submission of ``TASKS`` tasks (nothing dispatched yet: the clock does not move)."""
    runtime = SimPyRuntime()
    scheduler = _scheduler(runtime, *mode)
    targets = _targets(*mode)
    elapsed = 0.0

    async def body() -> None:
        nonlocal elapsed
        submit = scheduler.submit
        gc.collect()
        start = time.process_time()
        for n, (target, tenant) in enumerate(targets):
            if tenant is None:
                submit("chat", n, provider=target, cost_estimate=1.0)
            else:
                submit("chat", n, provider=target, cost_estimate=1.0, tenant=tenant)
        elapsed = time.process_time() - start
        await scheduler.close()

    runtime.run(body())
    return elapsed / TASKS


def scheduler_run(mode: Mode) -> float:
    """Tasks per CPU second of the whole run of ``TASKS`` tasks on the virtual clock."""
    runtime = SimPyRuntime()
    scheduler = _scheduler(runtime, *mode)
    targets = _targets(*mode)

    async def body() -> None:
        async with scheduler:
            for n, (target, tenant) in enumerate(targets):
                if tenant is None:
                    scheduler.submit("chat", n, provider=target, cost_estimate=1.0)
                else:
                    scheduler.submit("chat", n, provider=target, cost_estimate=1.0, tenant=tenant)
            await scheduler.join()

    gc.collect()
    start = time.process_time()
    runtime.run(body())
    return TASKS / (time.process_time() - start)


MODES: dict[str, Mode] = {
    "today (provider named)": (None, 0),
    "3 routes, weighted": ("weighted", 0),
    "3 routes, least_loaded": ("least_loaded", 0),
    "3 routes, lowest_latency": ("lowest_latency", 0),
    "3 routes, cheapest": ("cheapest", 0),
    f"today x {TENANTS} tenants": (None, TENANTS),
    f"3 routes x {TENANTS} tenants, least_loaded": ("least_loaded", TENANTS),
}


def rounds_of(run: Callable[[Mode], float], rounds: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(rounds):
        for mode, setting in MODES.items():
            results[mode].append(run(setting))
    return results


def table(
    title: str, unit: str, results: dict[str, list[float]], scale: float, higher_is_better: bool
) -> str:
    baseline = results["today (provider named)"]
    lines = [
        f"### {title}",
        "",
        f"| mode | best {unit} | median {unit} | median ratio to today |",
        "|---|---|---|---|",
    ]
    for mode, values in results.items():
        ratios = [value / base for value, base in zip(values, baseline, strict=True)]
        best = max(values) if higher_is_better else min(values)
        lines.append(
            f"| {mode} | {best * scale:,.2f} | {statistics.median(values) * scale:,.2f} | "
            f"{statistics.median(ratios):.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    load_before = os.getloadavg()
    submits = rounds_of(submit_run, rounds)
    runs = rounds_of(scheduler_run, rounds)
    load_after = os.getloadavg()
    print(f"## Routes: dispatch cost ({rounds} rounds, interleaved; python {sys.version.split()[0]})\n")
    print(
        table(
            f"submit: {TASKS:,} submissions (us per submission; lower is better)", "us", submits, 1e6, False
        )
    )
    print()
    print(
        table(
            f"scheduler: {TASKS:,} tasks on the virtual clock, 9 deployments of concurrency 8 "
            "(tasks/s; higher is better)",
            "tasks/s",
            runs,
            1.0,
            True,
        )
    )
    print(f"\nload average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min; 2 cores shared)")


if __name__ == "__main__":
    main()
