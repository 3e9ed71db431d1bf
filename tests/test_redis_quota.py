"""RedisQuota against a real Redis server: one account-wide budget for every worker.

Two RedisQuota objects with one name stand for two workers (on one host or two: they share
nothing but the Redis server). Times are the Redis server's, so the tests leave room for a
loaded machine only in how long they wait, never in what may be granted.
"""

from __future__ import annotations

import math
import multiprocessing
import time

import pytest

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.token_bucket import QuotaConfigError, QuotaLimits
from tests.redis_accounts import quota


def test_two_workers_draw_from_one_request_bucket(redis_url: str, account: str) -> None:
    limits = QuotaLimits(requests_per_min=6, request_burst=3)  # one request per 10 s after a burst of 3
    a, b = quota(redis_url, account, limits, worker="a"), quota(redis_url, account, limits, worker="b")
    granted = [q.try_reserve(0.0, 0.0) for q in (a, b, a, b)]
    assert [g is not None for g in granted] == [True, True, True, False]
    assert 9.0 < b.time_until(0.0, 0.0) <= 10.0  # the Redis clock says when the next request refills


def test_a_reservation_is_all_or_nothing(redis_url: str, account: str) -> None:
    limits = QuotaLimits(requests_per_min=600, request_burst=5, tokens_per_min=60, token_burst=100)
    a = quota(redis_url, account, limits)
    started = time.monotonic()
    assert a.try_reserve(80.0, 0.0) is not None
    assert a.try_reserve(50.0, 0.0) is None  # not enough tokens: the request bucket keeps its token
    requests, tokens, _ = a.levels(0.0)
    # The buckets refill on the Redis server's clock between the calls (10 requests/s, 1 token/s): by
    # at most the rate times the time the three calls took, however slow a loaded machine makes them.
    # A failed reservation that took a request (3.x) or tokens (below 20) still falls outside.
    elapsed = time.monotonic() - started + 1e-3  # + Redis TIME's and the float's resolution
    assert 4.0 - 1e-9 <= requests <= min(5.0, 4.0 + 10.0 * elapsed)
    assert 20.0 - 1e-9 <= tokens <= 20.0 + 1.0 * elapsed
    with pytest.raises(QuotaConfigError, match="exceeds bucket capacity"):
        a.try_reserve(101.0, 0.0)


def test_concurrency_slots_are_shared_and_released(redis_url: str, account: str) -> None:
    limits = QuotaLimits(concurrency=2)
    a, b = quota(redis_url, account, limits, worker="a"), quota(redis_url, account, limits, worker="b")
    first, second = a.try_reserve(0.0, 0.0), b.try_reserve(0.0, 0.0)
    assert first is not None and second is not None
    assert a.try_reserve(0.0, 0.0) is None
    assert 0 < a.time_until(0.0, 0.0) < 1  # polled, not infinite: b's release sends a no signal
    assert a.levels(0.0)[2] == 2
    b.release(second, 1.0)
    assert a.try_reserve(0.0, 1.0) is not None


def test_a_dead_workers_slot_lapses_after_its_ttl(redis_url: str, account: str) -> None:
    limits = QuotaLimits(concurrency=1)
    dead = quota(redis_url, account, limits, worker="dead", slot_ttl_s=0.3)
    assert dead.try_reserve(0.0, 0.0) is not None  # ... and the worker is killed before it releases
    alive = quota(redis_url, account, limits, worker="alive")
    assert alive.try_reserve(0.0, 0.0) is None
    time.sleep(0.4)
    assert alive.try_reserve(0.0, 0.0) is not None


def test_reconcile_charges_and_refunds_the_shared_token_bucket(redis_url: str, account: str) -> None:
    limits = QuotaLimits(tokens_per_min=6, token_burst=1000)  # 0.1 token/s: refill is negligible here
    a, b = quota(redis_url, account, limits), quota(redis_url, account, limits)
    reservation = a.try_reserve(100.0, 0.0)
    assert reservation is not None
    assert a.reconcile(reservation, 400.0, 1.0) == 300.0
    assert b.levels(0.0)[1] == pytest.approx(600.0, abs=1.0)  # 1000 - 400 actually used
    second = b.try_reserve(100.0, 0.0)
    assert second is not None
    b.reconcile(second, 10.0, 1.0)  # 90 of its 100 refunded
    assert a.levels(0.0)[1] == pytest.approx(590.0, abs=1.0)
    with pytest.raises(ValueError, match="finite number >= 0"):
        a.reconcile(second, math.inf, 3.0)


def test_a_429_pause_stops_every_worker(redis_url: str, account: str) -> None:
    limits = QuotaLimits(requests_per_min=6000)
    a, b = quota(redis_url, account, limits), quota(redis_url, account, limits)
    a.try_reserve(0.0, 100.0)
    a.pause_until(100.0 + 30.0)  # a saw a 429 with Retry-After 30 s at its time 100
    assert b.try_reserve(0.0, 5.0) is None  # b's clock differs; the pause is on Redis's clock
    assert 29.0 < b.time_until(0.0, 5.0) <= 30.0


def test_grants_never_exceed_the_budget_under_a_race(redis_url: str, account: str) -> None:
    """Eight processes hammer one bucket: no more grants than capacity + rate x elapsed."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(8) as pool:
        results = pool.starmap(_hammer, [(redis_url, account, n) for n in range(8)])
    granted = sum(count for count, _, _ in results)
    elapsed = max(end for _, _, end in results) - min(start for _, start, _ in results)
    print(f"8 processes, {elapsed:.2f} s: {granted} grants (allowed at most {20 + 10 * elapsed:.1f})")
    assert granted <= 20 + 10 * elapsed + 1, (granted, elapsed)
    assert granted >= 20 + 10 * 1.5  # the burst and most of the refill were used


def _hammer(redis_url: str, account: str, seed: int) -> tuple[int, float, float]:
    limits = QuotaLimits(requests_per_min=600, request_burst=20)  # 10 per second after a burst of 20
    q = quota(redis_url, account, limits, worker=f"p{seed}")
    granted = 0
    start = time.time()  # wall time: comparable across the processes
    while time.time() - start < 2.0:
        reservation = q.try_reserve(0.0, 0.0)
        if reservation is not None:
            granted += 1
            q.release(reservation, 0.0)
    return granted, start, time.time()


def test_unreachable_redis_fails_closed_by_default() -> None:
    from aiqsim.fleet import RedisQuota

    q = RedisQuota(
        "redis://127.0.0.1:1/0", "acct", QuotaLimits(requests_per_min=60), retry_s=0.25, verify=False
    )
    assert q.try_reserve(0.0, 0.0) is None
    assert q.time_until(0.0, 0.0) == 0.25
    assert q.unavailable == 1
    assert math.isnan(q.levels(0.0)[0])


def test_unreachable_redis_falls_back_to_a_local_share_when_asked() -> None:
    from aiqsim.fleet import RedisQuota

    share = QuotaLimits(requests_per_min=60, request_burst=2)
    q = RedisQuota(
        "redis://127.0.0.1:1/0", "acct", QuotaLimits(requests_per_min=240), fallback=share, verify=False
    )
    first, second = q.try_reserve(0.0, 0.0), q.try_reserve(0.0, 0.0)
    assert first is not None and first.local and second is not None
    assert q.try_reserve(0.0, 0.0) is None  # the local share's burst is spent
    assert q.time_until(0.0, 0.0) == pytest.approx(1.0)
    q.release(first, 0.5)
    assert q.unavailable == 3


def test_bad_configuration_is_refused(redis_url: str) -> None:
    from aiqsim.fleet import RedisQuota

    with pytest.raises(ConfigurationError, match="account name"):
        RedisQuota(redis_url, "", QuotaLimits())
    with pytest.raises(ConfigurationError, match="QuotaLimits"):
        RedisQuota(redis_url, "a", {"requests_per_min": 5})  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="expected a finite number > 0"):
        RedisQuota(redis_url, "a", QuotaLimits(requests_per_min=0))


def _reserve_in_a_fork(quota_object, results) -> None:  # type: ignore[no-untyped-def]
    results.put(quota_object.try_reserve(0.0, 0.0) is not None)


def test_processes_forked_from_one_quota_object_hold_one_slot_each(redis_url: str, account: str) -> None:
    """Slots were named worker:id(self):sequence: processes forked after the quota was made (or
    making theirs at the same address) named their first slots alike, Redis counted one, and 5
    processes ran under concurrency=2."""
    shared = quota(redis_url, account, QuotaLimits(concurrency=2))
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    workers = [context.Process(target=_reserve_in_a_fork, args=(shared, results)) for _ in range(5)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    granted = sorted(results.get(timeout=10) for _ in workers)
    assert granted == [False, False, False, True, True]
    assert shared.levels(0.0)[2] == 2


def test_a_url_redis_cannot_use_and_an_unreachable_reset_are_project_errors() -> None:
    from aiqsim.fleet import RedisQuota

    with pytest.raises(ConfigurationError, match=r"http://127\.0\.0\.1:1 is not a Redis URL"):
        RedisQuota("http://127.0.0.1:1", "acct", QuotaLimits(concurrency=1))
    unreachable = RedisQuota(
        "redis://user:pw-secret@127.0.0.1:1/0", "acct", QuotaLimits(concurrency=1), verify=False
    )
    with pytest.raises(ConfigurationError, match="cannot reset the shared state") as raised:
        unreachable.reset()
    assert "pw-secret" not in str(raised.value)
