"""The depth limit against queueing theory: M/M/c/K blocking, and Erlang B for a limit of 0.

A scheduler with ``c`` concurrency slots and a depth limit of ``L`` waiting requests is an M/M/c/K
queue with ``K = c + L`` places, when arrivals are Poisson and service times exponential: an arrival
that finds all ``K`` places taken is refused (:class:`~aiqsim.scheduler.refusals.QueueFullError`).
The share of arrivals refused is the probability that the system is full,

    p_K = (a**K / (c! c**(K-c))) / (sum_{n<c} a**n / n!  +  sum_{c<=n<=K} a**n / (c! c**(n-c))),

with ``a = lambda / mu`` (Erlangs). A limit of 0 ("start at once or be refused") is the loss system
M/M/c/c, whose blocking probability is Erlang B. :func:`blocking_check` runs the production
:class:`~aiqsim.scheduler.scheduler.Scheduler` on the virtual clock and compares.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.task import Priority
from aiqsim.core.token_bucket import QuotaLimits
from aiqsim.runtime.simpy_runtime import SimPyRuntime
from aiqsim.scheduler.dispatch import FifoPolicy
from aiqsim.scheduler.retry import RetryPolicy
from aiqsim.scheduler.scheduler import QueueFullError, Scheduler
from aiqsim.stores.memory import MemoryStore
from aiqsim.validation.mmc import (
    ExponentialServiceProvider,
    check_erlang_arguments,
    check_rate,
    erlang_b,
    t_interval_95,
)

__all__ = ["BlockingResult", "blocking_check", "erlang_b", "mmck_blocking", "simulate_blocking"]


def _checked(servers: int, queue_limit: int, offered_load: float) -> None:
    check_erlang_arguments(servers, offered_load)  # the same servers and load as Erlang B and C
    if isinstance(queue_limit, bool) or not isinstance(queue_limit, int) or queue_limit < 0:
        raise ConfigurationError(f"queue_limit must be an integer >= 0, got {queue_limit!r}")


def mmck_blocking(arrival_rate: float, service_rate: float, servers: int, queue_limit: int) -> float:
    """The share of arrivals refused by an M/M/c/K queue with ``K = servers + queue_limit``.

    Defined for any load (a finite queue is always stable); ``queue_limit=0`` is :func:`erlang_b`.
    """
    check_rate("arrival_rate", arrival_rate, zero_allowed=True)
    check_rate("service_rate", service_rate, zero_allowed=False)
    offered = arrival_rate / service_rate
    _checked(servers, queue_limit, offered)
    servers = int(servers)  # a whole float (8.0) is a number of servers, as in Erlang B and C
    # Unnormalised state probabilities p_n / p_0, built by ratios so nothing overflows: each step
    # multiplies by a / min(n, c). Rescaled as they grow (only their ratios matter).
    term, total = 1.0, 1.0
    for n in range(1, servers + queue_limit + 1):
        term *= offered / min(n, servers)
        total += term
        if total > 1e300:
            term, total = term / total, 1.0
    return term / total


@dataclass(frozen=True, slots=True)
class BlockingResult:
    """Simulated against expected share of arrivals refused, for one M/M/c/(c+L) configuration.

    ``per_seed`` holds each replication's refused share (after the warm-up); the interval is the
    95% t-interval over them.
    """

    arrival_rate: float
    service_rate: float
    servers: int
    queue_limit: int
    arrivals: int
    seeds: tuple[int, ...]
    expected: float
    simulated: float
    ci_low: float
    ci_high: float
    per_seed: tuple[float, ...]

    @property
    def ci_contains_expected(self) -> bool:
        return self.ci_low <= self.expected <= self.ci_high


def simulate_blocking(
    arrival_rate: float,
    service_rate: float,
    servers: int,
    queue_limit: int,
    arrivals: int,
    seed: int,
    *,
    warmup: int = 0,
) -> float:
    """Share of ``arrivals`` (after the first ``warmup``) that the production scheduler refused,
    with ``servers`` concurrency slots and ``background_limit=queue_limit``, Poisson arrivals and
    exponential service times from streams derived from ``seed``."""
    runtime = SimPyRuntime()
    gaps = random.Random(f"mmck-arrivals-{seed}")
    provider = ExponentialServiceProvider(runtime, service_rate, random.Random(f"mmck-service-{seed}"))
    scheduler = Scheduler(
        runtime,
        [provider],
        quotas={provider.name: QuotaLimits(concurrency=servers)},
        store=MemoryStore(),
        dispatch=FifoPolicy(),
        retry=RetryPolicy(max_attempts=1),
        background_limit=queue_limit,
        rng=random.Random(f"mmck-scheduler-{seed}"),
    )
    refused = 0

    async def feed() -> None:
        nonlocal refused
        for index in range(arrivals):
            await runtime.sleep(gaps.expovariate(arrival_rate))
            try:
                scheduler.submit(provider.name, index, key=f"mmck-{index}", priority=Priority.BACKGROUND)
            except QueueFullError:
                if index >= warmup:
                    refused += 1
        await scheduler.join()
        await scheduler.close()

    runtime.run(feed())
    return refused / (arrivals - warmup)


def blocking_check(
    arrival_rate: float,
    service_rate: float,
    servers: int,
    queue_limit: int,
    *,
    arrivals: int = 20_000,
    seeds: range | tuple[int, ...] = range(5),
) -> BlockingResult:
    """Run :func:`simulate_blocking` once per seed and compare with :func:`mmck_blocking`."""
    expected = mmck_blocking(arrival_rate, service_rate, servers, queue_limit)
    warmup = arrivals // 10
    shares = tuple(
        simulate_blocking(arrival_rate, service_rate, servers, queue_limit, arrivals, seed, warmup=warmup)
        for seed in seeds
    )
    if len(shares) < 2:
        raise ConfigurationError("blocking_check needs at least two seeds for a confidence interval")
    mean, half = t_interval_95(shares)
    return BlockingResult(
        arrival_rate=arrival_rate,
        service_rate=service_rate,
        servers=servers,
        queue_limit=queue_limit,
        arrivals=arrivals,
        seeds=tuple(seeds),
        expected=expected,
        simulated=mean,
        ci_low=mean - half,
        ci_high=mean + half,
        per_seed=shares,
    )
