"""Running aiqsim on several hosts: a quota every worker shares through Redis.

The store side of a fleet is :class:`aiqsim.stores.PostgresStore` (claims and records shared
by every worker). Both need optional extras (``redis``, ``postgres``) and are imported on use.
"""

from __future__ import annotations


def __getattr__(name: str) -> object:
    if name in ("RedisQuota", "SharedReservation"):  # redis-py is an optional extra
        from aiqsim.fleet import redis_quota

        return getattr(redis_quota, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["RedisQuota", "SharedReservation"]
