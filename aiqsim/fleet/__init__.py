"""Running aiqsim on several hosts: a quota shared through Redis, and leases.

- :class:`RedisQuota`: one account's requests/tokens/concurrency shared by every worker
  (the ``redis`` extra, imported on first use).
- :class:`RedisBudgetLedger`: a spend budget (:class:`aiqsim.overload.Budget`) kept in that
  account, so N workers cannot overspend it.
- :class:`LeaseKeeper`: renews a worker's lease and adopts the tasks of workers whose lease
  expired, exactly once, through the provider lookup (needs a store with leases).

The store side of a fleet is :class:`aiqsim.stores.PostgresStore` (the ``postgres`` extra).
"""

from __future__ import annotations

from aiqsim.fleet.leases import Adoption, LeaseKeeper, LeaseLostError


def __getattr__(name: str) -> object:
    if name in ("RedisQuota", "SharedReservation"):  # redis-py is an optional extra
        from aiqsim.fleet import redis_quota

        return getattr(redis_quota, name)
    if name == "RedisBudgetLedger":
        from aiqsim.fleet import redis_budget

        return redis_budget.RedisBudgetLedger
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Adoption",
    "LeaseKeeper",
    "LeaseLostError",
    "RedisBudgetLedger",
    "RedisQuota",
    "SharedReservation",
]
