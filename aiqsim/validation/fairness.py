"""Tenants' fair sharing of a lane, against the theory of weighted fair queuing.

Two checks of the production :class:`~aiqsim.scheduler.scheduler.Scheduler` with ``tenants=``
(the rule: :mod:`aiqsim.scheduler.tenants`), each runnable on either runtime:

- **Shares.** Tenants that stay backlogged receive service in proportion to their weights
  (generalised processor sharing, which weighted fair queuing approximates within one task per
  tenant): with weights 1:3, 25% and 75% of the service, counted in the unit the scheduler shares
  (each call's cost estimate, at least 1). :func:`measure_shares` queues more work than the window
  needs for every tenant at once, so that every tenant is backlogged throughout, and counts the
  service of the first calls the provider receives.
- **Isolation.** A tenant offering ten times its share does not raise a quiet tenant's wait: with
  fair sharing a quiet task goes at the next free slot (its tenant rejoins at the virtual time,
  ahead of the noisy tenant's backlog), so its wait is bounded by the residual service time of the
  calls in flight, whatever the noisy tenant queued. Without tenants the same work is served first
  come, first served and the quiet tenant waits behind the noisy backlog, which grows without bound.
  :func:`measure_quiet_wait` runs one such case; :func:`isolation_check` the four of them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.token_bucket import QuotaLimits
from aiqsim.runtime.simpy_runtime import SimPyRuntime
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse
from aiqsim.scheduler.retry import RetryPolicy
from aiqsim.scheduler.scheduler import Scheduler
from aiqsim.scheduler.tenants import Tenant, tenant_charge

__all__ = [
    "IsolationResult",
    "ShareResult",
    "isolation_check",
    "measure_quiet_wait",
    "measure_shares",
    "share_check",
]


class _FixedServiceProvider:
    """A provider whose every call takes ``service_s`` and that notes who it served, in order."""

    def __init__(self, runtime: Any, service_s: float) -> None:
        self.name = "llm"
        self._runtime = runtime
        self._service_s = service_s
        self.served: list[tuple[str | None, float]] = []

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        self.served.append((request.tenant, request.cost_estimate))
        await self._runtime.sleep(self._service_s)
        return ProviderResponse(None)


def _retry() -> RetryPolicy:
    return RetryPolicy(max_attempts=1, attempt_timeout_s=None)


@dataclass(frozen=True, slots=True)
class ShareResult:
    """Each tenant's measured and expected share of the service over the window (fractions)."""

    measured: dict[str, float]
    expected: dict[str, float]
    window: int
    """How many calls the shares were counted over (every tenant backlogged throughout)."""

    @property
    def worst_error(self) -> float:
        """The largest absolute difference between a measured and an expected share."""
        return max(abs(self.measured[name] - self.expected[name]) for name in self.expected)


async def measure_shares(
    runtime: Any,
    weights: dict[str, float],
    *,
    window: int = 400,
    concurrency: int = 4,
    service_s: float = 0.5,
    seed: int = 7,
) -> ShareResult:
    """Queue enough calls of random cost for each tenant of ``weights`` to keep it backlogged for the
    first ``window`` calls, run them on ``runtime`` and count each tenant's service among those calls."""
    if not weights or any(not weight > 0 for weight in weights.values()):
        raise ConfigurationError(f"weights: expected tenant -> weight > 0, got {weights!r}")
    rng = random.Random(seed)
    total_weight = sum(weights.values())
    expected = {name: weight / total_weight for name, weight in weights.items()}
    provider = _FixedServiceProvider(runtime, service_s)
    scheduler = Scheduler(
        runtime,
        [provider],
        quotas={"llm": QuotaLimits(concurrency=concurrency)},
        tenants={name: Tenant(weight=weight) for name, weight in weights.items()},
        retry=_retry(),
        background_limit=None,
        rng=random.Random(seed),
    )
    submissions = []
    for name, share in expected.items():
        # twice the calls the window needs (costs vary): backlogged until the window is over
        for _ in range(int(2 * window * share) + concurrency + 10):
            cost = float(rng.randint(100, 2000))
            submissions.append(
                scheduler.submit("llm", rng.random(), cost_estimate=cost, key=None, tenant=name)
            )
    async with scheduler:
        for submission in submissions:
            await submission
    served: dict[str, float] = dict.fromkeys(weights, 0.0)
    for tenant, cost in provider.served[:window]:
        assert tenant is not None
        served[tenant] += tenant_charge(cost, 1.0)
    total = sum(served.values())
    return ShareResult({name: value / total for name, value in served.items()}, expected, window)


def share_check(weights: Sequence[float] = (1.0, 3.0), **options: Any) -> ShareResult:
    """:func:`measure_shares` on the virtual clock, tenants named ``t0``, ``t1``..."""
    runtime = SimPyRuntime()
    named = {f"t{index}": float(weight) for index, weight in enumerate(weights)}
    return runtime.run(measure_shares(runtime, named, **options))


@dataclass(frozen=True, slots=True)
class IsolationResult:
    """The quiet tenant's mean wait for a slot (seconds), with and without fair sharing, when the
    noisy tenant offers its share and ten times its share."""

    fair_at_share: float
    fair_at_10x: float
    fifo_at_share: float
    fifo_at_10x: float


async def measure_quiet_wait(
    runtime: Any,
    *,
    fair: bool,
    noisy_load: float,
    quiet_load: float = 0.2,
    duration_s: float = 200.0,
    concurrency: int = 2,
    service_s: float = 1.0,
    seed: int = 11,
) -> float:
    """Mean wait (submission to start) of the quiet tenant's calls over ``duration_s``.

    Two tenants of weight 1 share a lane of ``concurrency`` slots and calls of ``service_s``: each
    one's share is half the capacity. Calls arrive as Poisson streams, the quiet tenant's at
    ``quiet_load`` times its share, the noisy one's at ``noisy_load`` times its share. ``fair``:
    the scheduler has the two tenants; otherwise it has none and serves the same calls first come,
    first served. A quiet call that had not started by the end counts its wait until then.
    """
    share_rate = concurrency / service_s / 2.0
    provider = _FixedServiceProvider(runtime, service_s)
    scheduler = Scheduler(
        runtime,
        [provider],
        quotas={"llm": QuotaLimits(concurrency=concurrency)},
        tenants={"quiet": Tenant(), "noisy": Tenant()} if fair else None,
        retry=_retry(),
        background_limit=None,
        rng=random.Random(seed),
    )
    quiet_ids: list[str] = []
    start = runtime.now()

    async def arrivals(name: str, rate: float, rng: random.Random) -> None:
        while True:
            await runtime.sleep(rng.expovariate(rate))
            if runtime.now() - start >= duration_s:
                return
            submission = scheduler.submit(
                "llm", rng.random(), cost_estimate=1.0, tenant=name if fair else None
            )
            if name == "quiet":
                quiet_ids.append(submission.id)

    async with scheduler:
        streams = [
            runtime.spawn(arrivals("quiet", quiet_load * share_rate, random.Random(seed + 1))),
            runtime.spawn(arrivals("noisy", noisy_load * share_rate, random.Random(seed + 2))),
        ]
        for stream in streams:
            await stream
        end = runtime.now()
        waits = []
        for task_id in quiet_ids:
            record = scheduler.store.get(task_id)
            assert record is not None
            started = record.started_at if record.started_at is not None else end
            waits.append(started - record.created_at)
        await scheduler.close(cancel_pending=True)
    return sum(waits) / len(waits) if waits else 0.0


def isolation_check(**options: Any) -> IsolationResult:
    """:func:`measure_quiet_wait` on the virtual clock: fair and FIFO, noisy at its share and at 10x."""

    def run(fair: bool, noisy_load: float) -> float:
        runtime = SimPyRuntime()
        return runtime.run(measure_quiet_wait(runtime, fair=fair, noisy_load=noisy_load, **options))

    return IsolationResult(run(True, 1.0), run(True, 10.0), run(False, 1.0), run(False, 10.0))
