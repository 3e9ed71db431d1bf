"""RedisQuota helpers for the tests on the real Redis server (tests/test_redis_quota*.py); the
``account`` fixture that gives each test an account of its own is in tests/conftest.py."""

from __future__ import annotations

from aiqsim.core.token_bucket import QuotaLimits


def quota(redis_url: str, account: str, limits: QuotaLimits, **options: object):  # type: ignore[no-untyped-def]
    from aiqsim.fleet import RedisQuota

    return RedisQuota(redis_url, account, limits, **options)  # type: ignore[arg-type]
