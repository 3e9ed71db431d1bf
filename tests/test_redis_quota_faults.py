"""RedisQuota when something goes wrong: absurd usage, lost answers, bad settings (review findings).

Real Redis server, as in tests/test_redis_quota.py; a Redis fault is simulated by a script object
that raises the error redis-py would raise (a stall, a refused connection) for chosen calls.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from aiqsim import Scheduler, TaskStatus
from aiqsim.core.fleet_quota import WorkerCappedQuota
from aiqsim.core.token_bucket import QuotaLimits
from aiqsim.scheduler.events import UsageAnomaly
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse
from tests.runtimes import RUNTIMES, run_on


@pytest.fixture
def account(redis_url: str) -> Iterator[str]:
    name = f"acct-{random.Random().getrandbits(40):010x}"
    yield name
    import redis

    client = redis.Redis.from_url(redis_url)
    client.delete(f"aiqsim:quota:{name}:state", f"aiqsim:quota:{name}:slots")


def quota(redis_url: str, account: str, limits: QuotaLimits, **options: object):  # type: ignore[no-untyped-def]
    from aiqsim.fleet import RedisQuota

    return RedisQuota(redis_url, account, limits, **options)  # type: ignore[arg-type]


# ------------------------------------------------------------------ an absurd usage report


class Reporting:
    """Answers at once, reporting ``usage`` tokens."""

    name = "llm"

    def __init__(self, usage: object) -> None:
        self.usage = usage

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        return ProviderResponse(result="ok", usage=self.usage)


@pytest.mark.parametrize("rt_name", RUNTIMES)
@pytest.mark.parametrize("capped", [False, True])
def test_an_absurd_usage_is_clamped_to_the_shared_capacity(
    redis_url: str, account: str, rt_name: str, capped: bool
) -> None:
    """1e15 tokens reported once put the shared level at -1e15: every worker waited millennia.
    Now the report is charged at the shared bucket's capacity and counted, as on a local lane."""
    shared = quota(redis_url, account, QuotaLimits(tokens_per_min=60_000))
    lane_quota = WorkerCappedQuota(shared, 4) if capped else shared

    async def body(rt):  # type: ignore[no-untyped-def]
        events: list = []
        scheduler = Scheduler(rt, [Reporting(1e15)], quotas={"llm": lane_quota}, events=events.append)
        record = await scheduler.submit("llm", {"i": 1}, cost_estimate=100).wait()
        await scheduler.close()
        charged = [e.charged for e in events if isinstance(e, UsageAnomaly)]
        return record.status, dict(scheduler.anomalies), charged

    status, anomalies, charged = run_on(rt_name, body)
    assert status == TaskStatus.SUCCEEDED
    assert anomalies == {"usage": 1}
    assert charged == [60_000.0]
    level = shared.levels(0.0)[1]
    assert -1.0 <= level <= 1_000.0  # 60 000 - 100 reserved - 59 900 charged, plus refill meanwhile


# ------------------------------------------------------------------ a settle Redis did not answer


class Failing:
    """Stands for a registered script while Redis is unreachable: raises what redis-py raises."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    def __call__(self, *args: object, **kwargs: object) -> object:
        self.calls += 1
        raise self.error


def refused() -> Exception:
    import redis

    return redis.exceptions.ConnectionError("Connection refused")


def test_a_charge_redis_did_not_take_is_sent_with_the_next_call(redis_url: str, account: str) -> None:
    """A reconcile's charge lost to a Redis error was dropped: after an estimate of 500 and a use of
    9 000, the shared level read 9 500 and 18 500 of 10 000 tokens were granted in a minute."""
    q = quota(redis_url, account, QuotaLimits(tokens_per_min=6, token_burst=10_000))  # refill negligible
    reservation = q.try_reserve(500.0, 0.0)
    assert reservation is not None
    settle, q._settle = q._settle, Failing(refused())
    assert q.reconcile(reservation, 9_000.0, 1.0) == 8_500.0
    q.release(reservation, 1.0)
    q._settle = settle
    assert q.levels(1.0)[1] == pytest.approx(1_000.0, abs=1.0)  # sent before the levels were read
    assert q.levels(1.0)[2] == 0  # and the slot freed
    assert q.unavailable == 2
    assert q.unsettled == (0.0, 0.0, 0)


def test_what_is_kept_is_bounded_by_one_capacity(redis_url: str, account: str) -> None:
    q = quota(redis_url, account, QuotaLimits(tokens_per_min=6, token_burst=1_000))
    reservations = [q.try_reserve(100.0, 0.0) for _ in range(5)]
    q._settle = Failing(refused())
    for reservation in reservations:
        assert reservation is not None
        q.reconcile(reservation, 1_000.0, 1.0)
    assert q.unsettled == (0.0, -1_000.0, 0)  # 5 x 900 owed, kept as one bucket's worth
    assert q.try_reserve(0.0, 1.0) is None  # Redis is not asked again while what is owed cannot be sent
    assert q._settle.calls == 6


class AnswerLost:
    """A reservation script that runs in Redis, but whose answer never comes back (a timeout)."""

    def __init__(self, script: object) -> None:
        self.script = script

    def __call__(self, *args: object, **kwargs: object) -> object:
        import redis

        self.script(*args, **kwargs)  # type: ignore[operator]
        raise redis.exceptions.TimeoutError("Timeout reading from socket")


def test_a_slot_whose_reservation_answer_was_lost_is_freed_when_redis_answers(
    redis_url: str, account: str
) -> None:
    """A timeout during a reservation left its slot held by nobody for slot_ttl_s (300 s): under
    concurrency 1 the whole fleet was blocked. The lost member is now freed on the next call."""
    limits = QuotaLimits(concurrency=1)
    stalled, other = (
        quota(redis_url, account, limits, worker="a"),
        quota(redis_url, account, limits, worker="b"),
    )
    reserve, stalled._reserve = stalled._reserve, AnswerLost(stalled._reserve)
    assert stalled.try_reserve(0.0, 0.0) is None  # fails closed: it does not know it has the slot
    stalled._reserve = reserve
    assert other.levels(0.0)[2] == 1  # the phantom slot
    assert stalled.levels(0.0)[2] == 0  # Redis answers again: freed
    assert other.try_reserve(0.0, 0.0) is not None
