"""The quota objects each worker of a simulated fleet gets (``[fleet] quota = "shared" | "split"``).

``shared``: one :class:`~aiqsim.core.fleet_quota.SharedMultiQuota` per provider, the same object
in every worker's ``Scheduler(quotas=...)`` — on the single-threaded SimPy runtime this is what
:class:`aiqsim.fleet.RedisQuota` is across hosts. ``split``: each worker its own ``QuotaLimits``,
the account's divided by N (:func:`~aiqsim.core.fleet_quota.split_quota_limits`). The scheduler
code is the same either way; only the object handed to it differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiqsim.core.fleet_quota import SharedMultiQuota, split_quota_limits
from aiqsim.core.token_bucket import QuotaLimits
from aiqsim.sim.config import FleetConfig


def worker_quotas(fleet: FleetConfig, limits: Mapping[str, QuotaLimits], now: float) -> list[dict[str, Any]]:
    """One ``quotas=`` mapping per worker, from the account's per-provider ``limits``."""
    if fleet.workers == 1:
        return [dict(limits)]
    if fleet.quota == "shared":
        shared = {
            name: SharedMultiQuota(limit, now=now, slot_poll_s=fleet.slot_poll_s)
            for name, limit in limits.items()
        }
        return [dict(shared) for _ in range(fleet.workers)]
    per_provider = {name: split_quota_limits(limit, fleet.workers) for name, limit in limits.items()}
    return [{name: shares[i] for name, shares in per_provider.items()} for i in range(fleet.workers)]
