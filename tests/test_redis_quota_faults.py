"""RedisQuota when something goes wrong: absurd usage, lost answers, bad settings (review findings).

Real Redis server, as in tests/test_redis_quota.py; a Redis fault is simulated by a script object
that raises the error redis-py would raise (a stall, a refused connection) for chosen calls.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable

import pytest

from aiqsim import RetryPolicy, Scheduler, TaskStatus
from aiqsim.core.backoff import ExponentialBackoff
from aiqsim.core.errors import ConfigurationError
from aiqsim.core.fleet_quota import WorkerCappedQuota
from aiqsim.core.token_bucket import QuotaLimits
from aiqsim.errors import ServerError
from aiqsim.runtime import AsyncioRuntime
from aiqsim.scheduler.events import UsageAnomaly
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse
from tests.redis_accounts import quota
from tests.runtimes import RUNTIMES, run_on

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
    assert q.levels(2.0)[1] == pytest.approx(1_000.0, abs=1.0)  # sent before the levels were read
    assert q.levels(2.0)[2] == 0  # and the slot freed
    assert q.unavailable == 2
    assert q.unsettled == (0.0, 0.0, 0)


def test_what_is_kept_is_bounded_by_one_capacity(redis_url: str, account: str) -> None:
    q = quota(redis_url, account, QuotaLimits(tokens_per_min=6, token_burst=1_000))
    reservations = [q.try_reserve(100.0, 0.0) for _ in range(5)]
    q._settle = Failing(refused())
    for second, reservation in enumerate(reservations, start=1):
        assert reservation is not None
        q.reconcile(reservation, 1_000.0, float(second))  # each past retry_s after the last failure
    assert q.unsettled == (0.0, -1_000.0, 0)  # 5 x 900 owed, kept as one bucket's worth
    assert q.try_reserve(0.0, 10.0) is None  # Redis is not asked again while what is owed cannot be sent
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
    assert stalled.levels(1.0)[2] == 0  # Redis answers again (past retry_s): freed
    assert other.try_reserve(0.0, 0.0) is not None


class Faults:
    """Stands for the settle script through a plan of faults, one per call, then answers: "ran"
    runs the script and loses its answer (a timeout after Redis applied it), "lost" times out
    before Redis ran it."""

    def __init__(self, script: object, plan: list[str]) -> None:
        self.script = script
        self.plan = list(plan)

    def __call__(self, *args: object, **kwargs: object) -> object:
        import redis

        fault = self.plan.pop(0) if self.plan else None
        if fault == "lost":
            raise redis.exceptions.TimeoutError("Timeout reading from socket")
        answer = self.script(*args, **kwargs)  # type: ignore[operator]
        if fault == "ran":
            raise redis.exceptions.TimeoutError("Timeout reading from socket")
        return answer


@pytest.mark.parametrize("plan", [["ran"], ["lost"], ["lost", "ran"], ["ran", "ran"], ["lost", "lost"]])
@pytest.mark.parametrize("settle", ["reconcile", "cancel"])
def test_a_settle_whose_answer_was_lost_is_applied_once(
    redis_url: str, account: str, settle: str, plan: list[str]
) -> None:
    """A settle lost to a timeout was kept and sent again with the next call, but Redis may already
    have run it: a reconcile of estimate 500 / actual 9 000 charged 8 500 twice (level -7 500, not
    1 000), a cancel refunded 5 000 twice (level 10 000 with a reservation of 5 000 still spent).
    Each settle is now applied once, whether its first send (or its resend) ran or never did."""
    q = quota(redis_url, account, QuotaLimits(tokens_per_min=6, token_burst=10_000))  # refill negligible
    settle_script = q._settle
    if settle == "reconcile":
        held = reservation = q.try_reserve(500.0, 0.0)
        assert reservation is not None
        q._settle = Faults(settle_script, plan)
        q.reconcile(reservation, 9_000.0, 1.0)
        expected = 1_000.0
    else:
        reservation, held = q.try_reserve(5_000.0, 0.0), q.try_reserve(5_000.0, 0.0)
        assert reservation is not None and held is not None
        q._settle = Faults(settle_script, plan)
        q.cancel(reservation, 1.0)
        expected = 5_000.0
    assert q.unsettled != (0.0, 0.0, 0)  # kept: Redis's answer never came
    for second in range(2, 2 + len(plan)):  # each resend past the retry window after the last failure
        q.levels(float(second))
    q.release(held, 10.0)
    assert q.unsettled == (0.0, 0.0, 0)
    assert q.levels(11.0)[1] == pytest.approx(expected, abs=2.0)
    assert q.levels(11.0)[2] == 0  # the slots freed too


def test_a_settle_in_doubt_past_the_resend_horizon_frees_its_slot_and_applies_nothing(
    redis_url: str, account: str
) -> None:
    """A worker that no call reached Redis from for longer than 2 x SETTLE_RESEND_S (Redis server
    clock) finds its marker gone: a settle in doubt may have run and outlived the marker that tells
    whether it did, so it is not applied (never twice), but its slot is still freed."""
    q = quota(redis_url, account, QuotaLimits(tokens_per_min=6, token_burst=10_000, concurrency=2))
    reservation = q.try_reserve(500.0, 0.0)
    assert reservation is not None
    import redis

    q._server_now = 1.0  # the last answer Redis gave was in 1970 ...
    redis.Redis.from_url(redis_url).delete(q._marker())  # ... and the marker expired since
    settle_script, q._settle = q._settle, Faults(q._settle, ["lost"])
    q.cancel(reservation, 1.0)
    q._settle = settle_script
    assert q.unsettled == (0.0, 500.0, 1)
    assert q.levels(2.0)[1:] == (pytest.approx(9_500.0, abs=2.0), 0)
    assert q.unsettled == (0.0, 0.0, 0)


@pytest.mark.parametrize("settle", ["reconcile", "cancel"])
def test_a_settle_lost_after_a_call_of_more_than_a_day_is_still_applied(
    redis_url: str, account: str, settle: str
) -> None:
    """The "too old to resend" check counted from the last Redis answer the worker saw, not from
    when the settle went into doubt: after a call of 25 h (slot_ttl_s over a day), a reconcile
    whose first send was lost charged nothing (level 9 500 instead of 1 000: 8 500 tokens the
    fleet never paid for). Every call now keeps the worker's marker alive for 2 x SETTLE_RESEND_S,
    the reservation included, so only a worker silent that long finds it gone."""
    q = quota(redis_url, account, QuotaLimits(tokens_per_min=6, token_burst=10_000), slot_ttl_s=200_000)
    reservation = q.try_reserve(500.0, 0.0)
    assert reservation is not None and q._server_now is not None
    q._server_now -= 90_000  # stands for a call of 25 h: no answer from Redis since the reservation
    settle_script, q._settle = q._settle, Faults(q._settle, ["lost"])  # the first send never ran
    if settle == "reconcile":
        q.reconcile(reservation, 9_000.0, 1.0)
        expected, slots = 1_000.0, 1
    else:
        q.cancel(reservation, 1.0)
        expected, slots = 10_000.0, 0
    q._settle = settle_script
    assert q.unsettled != (0.0, 0.0, 0)
    assert q.levels(2.0)[1:] == (pytest.approx(expected, abs=2.0), slots)
    assert q.unsettled == (0.0, 0.0, 0)


# ------------------------------------------------------------------ settings that cannot work


@pytest.mark.parametrize("timeout", [0, -1, math.nan, math.inf, "1"])
def test_a_socket_timeout_no_call_could_work_with_is_refused(redis_url: str, timeout: object) -> None:
    """0 stalled the lane for ever (every call timed out at once); -1 and nan made redis-py raise a
    bare ValueError from the dispatcher, to the loop's exception handler."""
    from aiqsim.fleet import RedisQuota

    with pytest.raises(ConfigurationError, match="socket_timeout_s must be a positive finite number"):
        RedisQuota(redis_url, "acct", QuotaLimits(concurrency=1), socket_timeout_s=timeout)  # type: ignore[arg-type]


class Flaky:
    """Fails its first call with a retryable server error, then answers."""

    name = "llm"

    def __init__(self, before_retry: Callable[[], object]) -> None:
        self.before_retry = before_retry
        self.calls = 0

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        self.calls += 1
        if self.calls == 1:
            self.before_retry()
            raise ServerError("503")
        return ProviderResponse(result="ok")


def test_a_database_redis_refuses_fails_the_task_saying_so(redis_url: str, account: str) -> None:
    """With a database index Redis does not have, the quota failed closed for ever: the task stayed
    queued, `unavailable` counting up. The task now fails with the error Redis answered."""
    q = quota(redis_url.rsplit("/", 1)[0] + "/99", account, QuotaLimits(concurrency=2), verify=False)

    async def body() -> object:
        scheduler = Scheduler(AsyncioRuntime(), [Reporting(None)], quotas={"llm": q})
        async with scheduler:
            return await asyncio.wait_for(scheduler.submit("llm", {"i": 1}).wait(), 10)

    record = asyncio.run(body())
    assert record.status == TaskStatus.FAILED
    assert "QuotaConfigError" in record.error and "DB index is out of range" in record.error


def test_a_retry_whose_reservation_redis_refuses_fails_the_task(redis_url: str, account: str) -> None:
    """A retry waits for quota on a ticket: Redis refusing it (here the state key holds a string,
    WRONGTYPE) fails the task with that error instead of tripping an assertion in the dispatcher."""
    import redis

    from aiqsim.fleet.redis_quota import quota_key_prefix

    q = quota(redis_url, account, QuotaLimits(requests_per_min=6000))
    client = redis.Redis.from_url(redis_url)
    provider = Flaky(lambda: client.set(f"{quota_key_prefix(account)}:state", "not a hash"))
    retry = RetryPolicy(max_attempts=3, backoff=ExponentialBackoff(base_s=0.01, cap_s=0.01))

    async def body() -> object:
        scheduler = Scheduler(AsyncioRuntime(), [provider], quotas={"llm": q}, retry=retry)
        async with scheduler:
            return await asyncio.wait_for(scheduler.submit("llm", {"i": 1}).wait(), 10)

    record = asyncio.run(body())
    assert record.status == TaskStatus.FAILED
    assert "WRONGTYPE" in record.error and provider.calls == 1


@pytest.mark.parametrize("answer", ["nan", "-nan", "-1", "soon"])
def test_a_bad_wait_redis_answers_fails_the_task_saying_so(redis_url: str, account: str, answer: str) -> None:
    """A refusal whose wait is no number >= 0 (here a script on the real server answers it, as a
    worker of another version or a hand-written key might): NaN went through ``max(wait, 1e-6)``
    into the lane's timer and the lane stalled, the task queued for ever. It now fails, naming
    what Redis answered."""
    import redis

    q = quota(redis_url, account, QuotaLimits(requests_per_min=6000))
    client = redis.Redis.from_url(redis_url)
    q._reserve = client.register_script(  # type: ignore[attr-defined]
        f"local t = redis.call('TIME') return {{0, '{answer}', tostring(t[1])}}"
    )

    async def body() -> object:
        scheduler = Scheduler(AsyncioRuntime(), [Reporting(None)], quotas={"llm": q})
        async with scheduler:
            return await asyncio.wait_for(scheduler.submit("llm", {"i": 1}).wait(), 10)

    record = asyncio.run(body())
    assert record.status == TaskStatus.FAILED
    assert "QuotaConfigError" in record.error and f"answered a wait of '{answer}'" in record.error


def test_an_unreachable_server_is_still_not_a_configuration_error() -> None:
    import redis

    from aiqsim.fleet.redis_quota import _misconfiguration

    busy = redis.exceptions.ResponseError("BUSY Redis is busy running a script")
    for error in (refused(), redis.exceptions.TimeoutError("t"), redis.exceptions.ReadOnlyError("r"), busy):
        assert not _misconfiguration(redis.exceptions, error)
    for error in (redis.exceptions.NoPermissionError("NOPERM"), redis.exceptions.AuthenticationError("a")):
        assert _misconfiguration(redis.exceptions, error)


# ------------------------------------------------------------------ slots that lapse mid-call


@pytest.mark.parametrize("timeout", [10.0, 1.0, None])
@pytest.mark.parametrize("capped", [False, True])
def test_an_attempt_that_may_outlive_its_slot_is_refused(
    redis_url: str, timeout: float | None, capped: bool
) -> None:
    """slot_ttl_s=1 with attempt_timeout_s=10 was accepted: 3 s calls ran 3 at once under
    concurrency 1, each slot lapsing mid-call. Refused now, for the scheduler's policy and a task's."""
    from aiqsim.fleet import RedisQuota

    shared = RedisQuota(redis_url, "lapse", QuotaLimits(concurrency=1), slot_ttl_s=1.0)
    lane_quota = WorkerCappedQuota(shared, 2) if capped else shared
    with pytest.raises(ConfigurationError, match=r"slot_ttl_s=1 s.*no scheduler was created"):
        Scheduler(AsyncioRuntime(), [Reporting(None)], quotas={"llm": lane_quota},
                  retry=RetryPolicy(attempt_timeout_s=timeout))  # fmt: skip
    scheduler = Scheduler(AsyncioRuntime(), [Reporting(None)], quotas={"llm": lane_quota},
                          retry=RetryPolicy(attempt_timeout_s=0.5))  # fmt: skip
    with pytest.raises(ConfigurationError, match=r"slot_ttl_s=1 s.*nothing was queued"):
        scheduler.submit("llm", {"i": 1}, retry=RetryPolicy(attempt_timeout_s=timeout))


# ------------------------------------------------------------------ a stalled Redis


class Stalled:
    """A script whose call takes ``socket_timeout_s`` and then times out (Redis stopped)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.calls = 0

    def __call__(self, *args: object, **kwargs: object) -> object:
        import redis

        self.calls += 1
        time.sleep(self.seconds)
        raise redis.exceptions.TimeoutError("Timeout reading from socket")


def test_a_stalled_redis_costs_one_timeout_per_retry_window_not_one_per_task(
    redis_url: str, account: str
) -> None:
    """Every try_reserve asked the stalled Redis and waited socket_timeout_s, synchronously: 8 queued
    tasks blocked the loop 8 x the timeout (r4: one 8 s stall; r5: a lease lapsed, keys billed twice).
    After a failure Redis is not asked for retry_s: the queued tasks go to the fallback at once."""
    q = quota(
        redis_url, account, QuotaLimits(concurrency=50), fallback=QuotaLimits(concurrency=10), retry_s=5.0
    )
    q._reserve = q._settle = stall = Stalled(0.2)
    granted = [q.try_reserve(0.0, 0.0) for _ in range(8)]  # one dispatch run: one reading of the clock
    assert all(r is not None and r.local for r in granted)
    assert stall.calls == 1 and q.unavailable == 8
    for reservation in granted:
        q.release(reservation, 1.0)  # local reservations are settled locally
    assert q.try_reserve(0.0, 4.9) is not None and stall.calls == 1  # still inside retry_s
    q.try_reserve(0.0, 5.0)
    assert stall.calls == 2  # asked again once retry_s has passed


def test_a_clock_that_went_back_does_not_extend_the_retry_window(redis_url: str, account: str) -> None:
    """The window after a failure was measured on whatever clock the quota last saw: a failure at
    now=3600 under one runtime left a new Scheduler on a fresh AsyncioRuntime (its clock starting at
    0) failing closed for about an hour with Redis healthy (r2: task still queued after 3 s, 61
    calls unavailable). A reading before the failure's now ends the window."""
    q = quota(redis_url, account, QuotaLimits(concurrency=2))
    reserve, q._reserve = q._reserve, Failing(refused())
    assert q.try_reserve(1.0, 3_600.0) is None  # a blip, under a runtime an hour old
    q._reserve = reserve
    assert q.try_reserve(1.0, 3_600.01) is None  # the window is still kept on that clock
    assert q.unavailable == 2

    async def body() -> object:
        scheduler = Scheduler(AsyncioRuntime(), [Reporting(None)], quotas={"llm": q})
        async with scheduler:
            return await asyncio.wait_for(scheduler.submit("llm", {"i": 1}, cost_estimate=1).wait(), 10)

    started = time.monotonic()
    record = asyncio.run(body())
    assert record.status == TaskStatus.SUCCEEDED
    assert time.monotonic() - started < 5.0
    assert q.unavailable == 2


# ------------------------------------------------------------------ a worker forked from another


def _in_a_fork(body: Callable[[], object]) -> int:
    """Run ``body`` in a child process forked from this one (a real ``os.fork``); its exit status
    (0: ``body`` returned; the child never returns into pytest)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        status = 1
        try:
            body()
            status = 0
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_forked_child_does_not_send_the_settles_its_parent_still_owes(redis_url: str, account: str) -> None:
    """A child forked while its parent had a settle in doubt and another waiting sent both under its
    own pid's marker, and the parent sent them again under its own: each charge of 1 000 applied
    twice (level 6 000 instead of 7 000). The parent settles what it owes; the child starts with
    nothing owed."""
    q = quota(redis_url, account, QuotaLimits(tokens_per_min=6, token_burst=10_000))  # refill negligible
    first, second = q.try_reserve(500.0, 0.0), q.try_reserve(500.0, 0.0)
    assert first is not None and second is not None
    settle_script, q._settle = q._settle, Faults(q._settle, ["lost"])
    q.reconcile(first, 1_500.0, 1.0)  # charge 1 000: its answer lost, in doubt
    q.reconcile(second, 1_500.0, 1.01)  # charge 1 000 within the retry window: kept, waits
    q._settle = settle_script
    assert q.unsettled == (0.0, -2_000.0, 0)

    assert _in_a_fork(lambda: q.levels(10.0)) == 0  # the child's first call to Redis
    assert q.levels(10.0)[1:] == (pytest.approx(7_000.0, abs=2.0), 2)
    assert q.unsettled == (0.0, 0.0, 0)


def test_a_child_given_a_dead_siblings_pid_still_applies_its_settles(redis_url: str, account: str) -> None:
    """Children forked from one quota shared its instance id and started at the same sequence
    number: a child the kernel gave a dead sibling's pid (within the marker's two days) found the
    sibling's marker, holding a number above its own, and every settle of its was skipped (level
    7 800 instead of 5 800: a charge of 2 000 never paid). Each child now gets an instance id and
    a sequence of its own."""
    q = quota(redis_url, account, QuotaLimits(tokens_per_min=6, token_burst=10_000))  # made before the forks
    q.levels(0.0)
    read, write = os.pipe()

    def worker(pid: int | None = None) -> None:
        if pid is not None:
            os.getpid = lambda: pid  # stands for the kernel reusing the dead sibling's pid
        reservation = q.try_reserve(100.0, 0.0)
        assert reservation is not None
        q.reconcile(reservation, 2_100.0, 1.0)  # charge 2 000
        q.release(reservation, 1.0)
        assert q.unsettled == (0.0, 0.0, 0)
        os.write(write, str(os.getpid()).encode())

    assert _in_a_fork(worker) == 0
    sibling = int(os.read(read, 64))
    assert q.levels(5.0)[1] == pytest.approx(7_900.0, abs=2.0)
    assert _in_a_fork(lambda: worker(sibling)) == 0
    assert int(os.read(read, 64)) == sibling
    os.close(read)
    os.close(write)
    assert q.levels(6.0)[1:] == (pytest.approx(5_800.0, abs=2.0), 0)
