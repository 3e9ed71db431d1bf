"""A full shared concurrency pool is polled, by every shared quota, with one rule (poll_full_pool).

SharedMultiQuota (in-process fleet) and RedisQuota (fleet across hosts, a real Redis server here)
must both answer a full pool with the poll interval, and leave every other wait as it is.
"""

from __future__ import annotations

import math
import random

import pytest

from aiqsim.core.fleet_quota import DEFAULT_SLOT_POLL_S, SharedMultiQuota, poll_full_pool
from aiqsim.core.token_bucket import QuotaLimits
from aiqsim.sim.config import FleetConfig


def test_a_full_pool_is_polled_and_any_other_wait_is_kept() -> None:
    assert poll_full_pool(math.inf, 0.25) == 0.25
    assert poll_full_pool(3.5, 0.25) == 3.5  # a bucket refill: its own time, even when longer
    assert poll_full_pool(0.0, 0.25) == 0.0


def test_the_lab_and_both_shared_quotas_default_to_one_poll_interval() -> None:
    assert SharedMultiQuota(QuotaLimits(concurrency=1)).slot_poll_s == DEFAULT_SLOT_POLL_S
    assert FleetConfig().slot_poll_s == DEFAULT_SLOT_POLL_S


def test_shared_multi_quota_polls_a_full_pool_and_waits_out_a_bucket() -> None:
    quota = SharedMultiQuota(
        QuotaLimits(concurrency=1, requests_per_min=60, request_burst=1), slot_poll_s=0.5
    )
    held = quota.try_reserve(0.0, 0.0)
    assert held is not None and quota.try_reserve(0.0, 0.0) is None
    assert quota.time_until(0.0, 0.0) == 0.5  # full pool: polled, since another worker may free it
    quota.release(held, 0.0)
    assert quota.time_until(0.0, 0.0) == pytest.approx(1.0)  # slot free, bucket empty: its refill


@pytest.mark.parametrize("time_scale", [1.0, 0.01])
def test_redis_quota_polls_a_full_pool_every_default_interval_of_wall_time(
    redis_url: str, time_scale: float
) -> None:
    from aiqsim.fleet import RedisQuota

    name = f"poll-{random.Random().getrandbits(40):010x}"
    limits = QuotaLimits(concurrency=1)
    a = RedisQuota(redis_url, name, limits, worker="a", time_scale=time_scale)
    b = RedisQuota(redis_url, name, limits, worker="b", time_scale=time_scale)
    try:
        assert a.try_reserve(0.0, 0.0) is not None
        assert b.try_reserve(0.0, 0.0) is None
        assert b.time_until(0.0, 0.0) == pytest.approx(DEFAULT_SLOT_POLL_S / time_scale)
    finally:
        a.reset()
