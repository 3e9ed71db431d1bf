"""Interactive before background, against the M/M/c non-preemptive priority formula.

When a slot frees, the dispatcher starts the oldest waiting interactive task if there is one, else
the oldest background task; a running call is never interrupted. With Poisson arrivals per class
(``lambda_1`` interactive, ``lambda_2`` background), exponential service at one rate ``mu`` for
both and ``c`` slots, that is the M/M/c queue with non-preemptive priorities, whose mean wait in
queue of class ``k`` is (Cobham 1954; Gross & Harris, *Fundamentals of Queueing Theory*, 3rd ed.,
section 3.4.1)

    Wq_k = C(c, a) / (c * mu * (1 - sigma_{k-1}) * (1 - sigma_k)),
    sigma_k = sum_{i <= k} lambda_i / (c * mu),   a = sum_i lambda_i / mu,

``C`` being Erlang C. Averaged over the classes (weighted by their rates) it is the plain M/M/c
wait: priorities reorder the queue, they create no work. :func:`priority_check` runs the production
:class:`~aiqsim.scheduler.scheduler.Scheduler` on the virtual clock and compares each class.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import astuple, dataclass

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.task import Priority, TaskStatus
from aiqsim.core.token_bucket import QuotaLimits
from aiqsim.runtime.gc_tuning import relaxed_gc
from aiqsim.runtime.simpy_runtime import SimPyRuntime
from aiqsim.scheduler.dispatch import FifoPolicy
from aiqsim.scheduler.retry import RetryPolicy
from aiqsim.scheduler.scheduler import Scheduler
from aiqsim.stores.memory import MemoryStore
from aiqsim.validation.mmc import AntitheticRandom, ExponentialServiceProvider, erlang_c, t_interval_95

__all__ = [
    "ClassWait",
    "PriorityResult",
    "PriorityRun",
    "priority_check",
    "priority_waits",
    "simulate_priority_waits",
]

CLASSES = (Priority.INTERACTIVE, Priority.BACKGROUND)
"""The classes in priority order: ``arrival_rates`` are given in this order."""


def priority_waits(arrival_rates: Sequence[float], service_rate: float, servers: int) -> tuple[float, ...]:
    """Mean wait in queue of each class (highest priority first), M/M/c with non-preemptive priorities."""
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise ConfigurationError(f"servers must be an integer >= 1, got {servers!r}")
    if not service_rate > 0:
        raise ConfigurationError(f"service_rate must be > 0, got {service_rate!r}")
    if not arrival_rates or not all(rate >= 0 for rate in arrival_rates):
        raise ConfigurationError(f"arrival_rates must be rates >= 0, one per class, got {arrival_rates!r}")
    capacity = servers * service_rate
    total = sum(arrival_rates)
    if not total < capacity:
        raise ConfigurationError(
            f"the classes' total arrival rate {total:g} must be below the capacity {capacity:g} "
            f"({servers} slots x {service_rate:g}/s): the queue has no steady state otherwise"
        )
    waiting = erlang_c(servers, total / service_rate)
    waits = []
    sigma_before = 0.0
    for rate in arrival_rates:
        sigma = sigma_before + rate / capacity
        waits.append(waiting / (capacity * (1.0 - sigma_before) * (1.0 - sigma)))
        sigma_before = sigma
    return tuple(waits)


@dataclass(frozen=True, slots=True)
class PriorityRun:
    """One replication's means after the warm-up: each class's wait in queue, and the random inputs
    (service draws, gaps between arrivals, share of interactive arrivals) that drove it."""

    interactive_wait: float
    background_wait: float
    service: float
    interarrival: float
    interactive_share: float


def simulate_priority_waits(
    arrival_rates: tuple[float, float],
    service_rate: float,
    servers: int,
    arrivals: int,
    seed: int,
    *,
    warmup: int = 0,
    antithetic: bool = False,
) -> PriorityRun:
    """Mean wait in queue (``started_at - created_at``) of the interactive and the background tasks
    among ``arrivals`` (after the first ``warmup``), on the production scheduler with ``servers``
    slots and no depth limits. One Poisson stream of the total rate, each arrival interactive with
    probability ``lambda_1 / (lambda_1 + lambda_2)`` (the same as two independent streams).
    ``antithetic``: the mirror image of the plain run with the same seed (every uniform draw ``u``
    of the three input streams becomes ``1 - u``, :class:`~aiqsim.validation.mmc.AntitheticRandom`)."""
    if not 0 <= warmup < arrivals:
        raise ConfigurationError(f"warmup must be in [0, arrivals), got warmup={warmup}, arrivals={arrivals}")
    runtime = SimPyRuntime()
    stream = AntitheticRandom if antithetic else random.Random
    gaps = stream(f"priority-arrivals-{seed}")
    classes = stream(f"priority-classes-{seed}")
    provider = ExponentialServiceProvider(runtime, service_rate, stream(f"priority-service-{seed}"))
    store = MemoryStore()
    scheduler = Scheduler(
        runtime,
        [provider],
        quotas={provider.name: QuotaLimits(concurrency=servers)},
        store=store,
        dispatch=FifoPolicy(),
        retry=RetryPolicy(max_attempts=1, attempt_timeout_s=None),
        interactive_limit=None,
        background_limit=None,
        rng=random.Random(f"priority-scheduler-{seed}"),
    )
    total = sum(arrival_rates)
    interactive_share = arrival_rates[0] / total
    submitted: list[tuple[str, Priority]] = []
    drawn_gaps: list[float] = []

    async def feed() -> None:
        for index in range(arrivals):
            gap = gaps.expovariate(total)
            drawn_gaps.append(gap)
            await runtime.sleep(gap)
            priority = Priority.INTERACTIVE if classes.random() < interactive_share else Priority.BACKGROUND
            handle = scheduler.submit(provider.name, index, key=f"priority-{index}", priority=priority)
            submitted.append((handle.id, priority))
        await scheduler.join()
        await scheduler.close()

    with relaxed_gc():
        runtime.run(feed())
    waits: dict[Priority, list[float]] = {priority: [] for priority in CLASSES}
    for task_id, priority in submitted[warmup:]:
        record = store.get(task_id)
        if record is None or record.status is not TaskStatus.SUCCEEDED or record.started_at is None:
            raise RuntimeError(f"task {task_id} did not complete cleanly: {record!r}")
        waits[priority].append(record.started_at - record.created_at)
    if provider.calls != arrivals:
        raise RuntimeError(f"{arrivals} tasks made {provider.calls} provider calls; expected one each")
    kept = arrivals - warmup
    return PriorityRun(
        interactive_wait=statistics.fmean(waits[Priority.INTERACTIVE]),
        background_wait=statistics.fmean(waits[Priority.BACKGROUND]),
        service=statistics.fmean(provider.service_draws[warmup:]),
        interarrival=statistics.fmean(drawn_gaps[warmup:]),
        interactive_share=len(waits[Priority.INTERACTIVE]) / kept,
    )


def _pair_mean(pair: list[PriorityRun]) -> PriorityRun:
    """A seed's plain run and its mirror image, averaged field by field."""
    fields = zip(*(astuple(run) for run in pair), strict=True)
    return PriorityRun(*(statistics.fmean(values) for values in fields))


def _sensitivities(
    arrival_rates: tuple[float, float], service_rate: float, servers: int
) -> tuple[tuple[float, float, float], ...]:
    """Per class, how the formula's wait moves with the mean service time, the mean gap between
    arrivals and the interactive share (central differences): the control-variate coefficients."""
    total = sum(arrival_rates)
    service, gap, share = 1.0 / service_rate, 1.0 / total, arrival_rates[0] / total

    def waits(mean_service: float, mean_gap: float, interactive: float) -> tuple[float, ...]:
        rate = 1.0 / mean_gap
        return priority_waits((rate * interactive, rate * (1.0 - interactive)), 1.0 / mean_service, servers)

    point = (service, gap, share)
    slopes: list[list[float]] = [[], []]
    for axis in range(3):
        step = point[axis] * 1e-6
        up = list(point)
        down = list(point)
        up[axis] += step
        down[axis] -= step
        high, low = waits(*up), waits(*down)
        for index in range(2):
            slopes[index].append((high[index] - low[index]) / (2 * step))
    return tuple((s[0], s[1], s[2]) for s in slopes)


@dataclass(frozen=True, slots=True)
class ClassWait:
    """One class's expected and simulated mean wait in queue, with the 95% t-interval over the seeds."""

    priority: Priority
    arrival_rate: float
    expected: float
    simulated: float
    ci_low: float
    ci_high: float
    per_seed: tuple[float, ...]

    @property
    def ci_contains_expected(self) -> bool:
        return self.ci_low <= self.expected <= self.ci_high


@dataclass(frozen=True, slots=True)
class PriorityResult:
    """:func:`priority_check`'s answer: one :class:`ClassWait` per class, interactive first."""

    service_rate: float
    servers: int
    arrivals: int
    seeds: tuple[int, ...]
    classes: tuple[ClassWait, ...]

    @property
    def ci_contains_expected(self) -> bool:
        return all(wait.ci_contains_expected for wait in self.classes)


def priority_check(
    arrival_rates: tuple[float, float],
    service_rate: float,
    servers: int,
    *,
    arrivals: int = 20_000,
    seeds: range | tuple[int, ...] = range(5),
) -> PriorityResult:
    """Run :func:`simulate_priority_waits` twice per seed, the plain run and its mirror image (the
    first 10% of arrivals are a warm-up), and compare each class with :func:`priority_waits`.

    Each seed's wait is corrected by control variates, as :func:`~aiqsim.validation.mmc.mmc_check`
    does: a run whose service draws happened to be long, whose arrivals came close together or
    that drew more interactive work waits longer, so ``slope * (input mean - its expectation)`` is
    taken off, with the formula's own slopes. The inputs are the random draws, never what the
    scheduler recorded, and each correction has expectation zero: it narrows the interval without
    being able to hide a scheduler error."""
    expected = priority_waits(arrival_rates, service_rate, servers)
    seeds = tuple(seeds)
    if len(seeds) < 2:
        raise ConfigurationError("priority_check needs at least two seeds for a confidence interval")
    warmup = arrivals // 10
    runs = [
        _pair_mean(
            [
                simulate_priority_waits(
                    arrival_rates, service_rate, servers, arrivals, seed, warmup=warmup, antithetic=mirror
                )
                for mirror in (False, True)
            ]
        )
        for seed in seeds
    ]
    total = sum(arrival_rates)
    centre = (1.0 / service_rate, 1.0 / total, arrival_rates[0] / total)
    slopes = _sensitivities(arrival_rates, service_rate, servers)
    classes = []
    for index, priority in enumerate(CLASSES):
        per_seed = []
        for run in runs:
            measured = run.interactive_wait if index == 0 else run.background_wait
            inputs = (run.service, run.interarrival, run.interactive_share)
            correction = sum(g * (x - c) for g, x, c in zip(slopes[index], inputs, centre, strict=True))
            per_seed.append(measured - correction)
        mean, half = t_interval_95(per_seed)
        classes.append(
            ClassWait(
                priority=priority,
                arrival_rate=arrival_rates[index],
                expected=expected[index],
                simulated=mean,
                ci_low=mean - half,
                ci_high=mean + half,
                per_seed=tuple(per_seed),
            )
        )
    return PriorityResult(
        service_rate=service_rate, servers=servers, arrivals=arrivals, seeds=seeds, classes=tuple(classes)
    )
