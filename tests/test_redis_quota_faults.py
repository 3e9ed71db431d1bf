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
