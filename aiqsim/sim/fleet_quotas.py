"""The quota objects each worker of a simulated fleet gets (``[fleet] quota = "shared" | "split"``).

``shared``: one :class:`~aiqsim.core.fleet_quota.SharedMultiQuota` per provider, the same object
in every worker's ``Scheduler(quotas=...)`` — on the single-threaded SimPy runtime this is what
:class:`aiqsim.fleet.RedisQuota` is across hosts. ``split``: each worker its own ``QuotaLimits``,
the account's divided by N (:func:`~aiqsim.core.fleet_quota.split_quota_limits`). With
``worker_concurrency`` each worker's quota is wrapped in its own
:class:`~aiqsim.core.fleet_quota.WorkerCappedQuota`. The scheduler code is the same either way;
only the object handed to it differs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from aiqsim.core.fleet_quota import SharedMultiQuota, WorkerCappedQuota, split_quota_limits
from aiqsim.core.token_bucket import MultiQuota, QuotaLimits
from aiqsim.sim.config import FleetConfig


def worker_quotas(
    fleet: FleetConfig, limits: Mapping[str, QuotaLimits], now: float, providers: Iterable[str] = ()
) -> list[dict[str, Any]]:
    """One ``quotas=`` mapping per worker, from the account's per-provider ``limits``
    (``providers`` without limits are unlimited, but still capped by ``worker_concurrency``)."""
    if fleet.worker_concurrency is None:
        if fleet.workers == 1:
            return [dict(limits)]
    else:
        limits = {name: limits.get(name, QuotaLimits()) for name in [*limits, *providers]}
    if fleet.quota == "shared" and fleet.workers > 1:
        shared = {
            name: SharedMultiQuota(limit, now=now, slot_poll_s=fleet.slot_poll_s)
            for name, limit in limits.items()
        }
        quotas: list[dict[str, Any]] = [dict(shared) for _ in range(fleet.workers)]
    else:
        per_provider = {name: split_quota_limits(limit, fleet.workers) for name, limit in limits.items()}
        quotas = [{name: shares[i] for name, shares in per_provider.items()} for i in range(fleet.workers)]
    if fleet.worker_concurrency is None:
        return quotas
    cap = fleet.worker_concurrency
    return [
        {
            name: WorkerCappedQuota(
                quota if not isinstance(quota, QuotaLimits) else MultiQuota(quota, now=now), cap
            )
            for name, quota in mine.items()
        }
        for mine in quotas
    ]
