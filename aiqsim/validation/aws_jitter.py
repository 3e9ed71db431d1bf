"""The "Exponential Backoff And Jitter" study (Marc Brooker, AWS Architecture Blog, 2015), rerun
with aiqsim's own backoff objects on the SimPy runtime.

The blog's model, as in its published simulator: one optimistic-concurrency (OCC) server holds a
single versioned row. Every client starts at t = 0, reads the version, then writes it back; the
write succeeds only if the version is unchanged (the server then increments it) and that client
is done. A failed write makes the client back off, then read and write again.

Each call is **four network hops**, each taking ``|Normal(10 ms, sd 2 ms)|`` independently, as in
the blog's simulator: the read request (the server reads the version when it arrives), the read
response, the write request (the server compares and increments when it arrives) and the write
response. After a failed write response the client sleeps its backoff before sending the next
read request. *Calls* counts writes (the server's work); *time* is when the last client receives
its successful write response.

Retry numbering follows the blog's simulator too: the delay after the ``k``-th failed write is
``strategy.delay(k, ...)`` with ``k`` starting at 1, so the first exponential ceiling is
``2 * base_s`` (10 ms with the blog's 5 ms base). Decorrelated jitter is fed its previous delay.

This validates the backoff objects of :mod:`aiqsim.core.backoff`, not the scheduler: each client
is a plain coroutine on :class:`~aiqsim.runtime.SimPyRuntime` that sleeps with ``runtime.sleep``.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pandas as pd

from aiqsim.core.backoff import BackoffStrategy, backoff_from_name
from aiqsim.core.errors import ConfigurationError
from aiqsim.runtime.simpy_runtime import SimPyRuntime

__all__ = [
    "ALL_STRATEGIES",
    "HOPS_PER_CALL",
    "OccRun",
    "OccServer",
    "aws_jitter_study",
    "run_occ_contention",
]

ALL_STRATEGIES: tuple[str, ...] = (
    "none",
    "exponential",
    "equal_jitter",
    "full_jitter",
    "decorrelated_jitter",
)
"""The five strategies of the blog, by their :data:`aiqsim.core.backoff.BACKOFF_STRATEGIES` names."""

HOPS_PER_CALL = 4
"""Network hops per read-then-write call: read request, read response, write request, write response."""

NETWORK_MEAN_S = 0.010
NETWORK_SD_S = 0.002


class OccServer:
    """A single row with a version number, written under optimistic concurrency control."""

    def __init__(self) -> None:
        self.version = 0
        self.writes = 0
        self.failed_writes = 0

    def read(self) -> int:
        """The current version of the row."""
        return self.version

    def write(self, expected_version: int) -> bool:
        """Write the row if nobody did since ``expected_version`` was read; True on success."""
        self.writes += 1
        if expected_version != self.version:
            self.failed_writes += 1
            return False
        self.version += 1
        return True


@dataclass(frozen=True, slots=True)
class OccRun:
    """One contention run: every client updated the row exactly once."""

    clients: int
    strategy: str
    calls: int
    failed_calls: int
    time_s: float


def run_occ_contention(
    clients: int,
    strategy: BackoffStrategy,
    seed: int,
    *,
    network_mean_s: float = NETWORK_MEAN_S,
    network_sd_s: float = NETWORK_SD_S,
) -> OccRun:
    """Run ``clients`` OCC clients against one server until each has written once.

    Network delays and backoff jitter come from two streams derived from ``seed``; the network
    stream does not depend on the strategy, so strategies compared at one seed see the same
    network (common random numbers).
    """
    if clients < 1:
        raise ConfigurationError(f"clients must be >= 1, got {clients}")
    runtime = SimPyRuntime()
    network = random.Random(f"occ-network-{clients}-{seed}")
    jitter = random.Random(f"occ-jitter-{clients}-{seed}")
    server = OccServer()
    finished_at: list[float] = []

    def hop() -> float:
        return abs(network.normalvariate(network_mean_s, network_sd_s))

    async def client() -> None:
        failures = 0
        previous_delay: float | None = None
        while True:
            await runtime.sleep(hop())  # read request reaches the server
            version = server.read()
            await runtime.sleep(hop())  # read response reaches the client
            await runtime.sleep(hop())  # write request reaches the server
            succeeded = server.write(version)
            await runtime.sleep(hop())  # write response reaches the client
            if succeeded:
                finished_at.append(runtime.now())
                return
            failures += 1
            previous_delay = strategy.delay(failures, jitter, previous_delay)
            await runtime.sleep(previous_delay)

    async def everyone() -> None:
        handles = [runtime.spawn(client(), name=f"client-{index}") for index in range(clients)]
        for handle in handles:
            await handle

    runtime.run(everyone())
    if len(finished_at) != clients:
        raise RuntimeError(f"only {len(finished_at)} of {clients} clients finished")
    return OccRun(
        clients=clients,
        strategy=strategy.name,
        calls=server.writes,
        failed_calls=server.failed_writes,
        time_s=max(finished_at),
    )


def _strategy(spec: str | BackoffStrategy, base_s: float, cap_s: float) -> BackoffStrategy:
    if isinstance(spec, str):
        return backoff_from_name(spec, base_s=base_s, cap_s=cap_s)
    return spec


def aws_jitter_study(
    clients: Iterable[int] = (10, 50, 100),
    strategies: Sequence[str | BackoffStrategy] = ALL_STRATEGIES,
    runs: int = 100,
    seed: int = 0,
    base_s: float = 0.005,
    cap_s: float = 2.0,
) -> pd.DataFrame:
    """Rerun the blog's study: mean work and completion time per (clients, strategy).

    Strategies are names (built with the blog's 5 ms base and 2 s cap unless ``base_s`` /
    ``cap_s`` say otherwise) or ready :class:`~aiqsim.core.backoff.BackoffStrategy` objects.
    Returns one row per (clients, strategy) with columns ``clients, strategy, calls_mean,
    calls_std, time_ms_mean, time_ms_std, runs``, in the order given.
    """
    if runs < 1:
        raise ConfigurationError(f"runs must be >= 1, got {runs}")
    built = [_strategy(spec, base_s, cap_s) for spec in strategies]
    rows = []
    for count in clients:
        for strategy in built:
            results = [run_occ_contention(count, strategy, seed * 1_000_003 + run) for run in range(runs)]
            calls = [r.calls for r in results]
            times_ms = [r.time_s * 1000.0 for r in results]
            rows.append(
                {
                    "clients": count,
                    "strategy": strategy.name,
                    "calls_mean": statistics.fmean(calls),
                    "calls_std": statistics.stdev(calls) if runs > 1 else 0.0,
                    "time_ms_mean": statistics.fmean(times_ms),
                    "time_ms_std": statistics.stdev(times_ms) if runs > 1 else 0.0,
                    "runs": runs,
                }
            )
    return pd.DataFrame(
        rows,
        columns=["clients", "strategy", "calls_mean", "calls_std", "time_ms_mean", "time_ms_std", "runs"],
    )
