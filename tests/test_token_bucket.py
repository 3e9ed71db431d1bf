"""Token buckets and MultiQuota: properties over arbitrary operation sequences, plus examples."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from aiqsim.core.token_bucket import (
    LEVEL_SLACK,
    MultiQuota,
    QuotaConfigError,
    QuotaLimits,
    Reservation,
    TokenBucket,
    refill_wait,
    wait_until,
)

capacities = st.floats(min_value=0.5, max_value=1e5, allow_nan=False, allow_infinity=False)
rates = st.floats(min_value=1e-3, max_value=1e4, allow_nan=False, allow_infinity=False)
fractions = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
advances = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)
start_times = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)

# One step of a workload: wait some seconds, or try to take / give back a fraction of capacity.
operations = st.one_of(
    st.tuples(st.just("advance"), advances),
    st.tuples(st.just("acquire"), fractions),
    st.tuples(st.just("refund"), fractions),
)


def slack(capacity: float) -> float:
    return LEVEL_SLACK * capacity


# ---------------------------------------------------------------------------- TokenBucket properties


@given(capacity=capacities, rate=rates, start=start_times, initial=fractions, ops=st.lists(operations))
def test_level_stays_between_zero_and_capacity(
    capacity: float, rate: float, start: float, initial: float, ops: list[tuple[str, float]]
) -> None:
    bucket = TokenBucket(capacity, rate, now=start, level=initial * capacity)
    now = start
    for op, value in ops:
        if op == "advance":
            now += value
        elif op == "acquire":
            cost = value * capacity
            before = bucket.level(now)
            granted = bucket.try_acquire(cost, now)
            after = bucket.level(now)
            if granted:
                assert after <= before
            else:
                assert after == before
                assert before + slack(capacity) < cost
        else:
            bucket.refund(value * capacity, now)
        level = bucket.level(now)
        assert 0.0 <= level <= capacity, (op, value, level)


@given(capacity=capacities, rate=rates, start=start_times, ops=st.lists(operations, max_size=80))
def test_grants_never_exceed_burst_plus_refill(
    capacity: float, rate: float, start: float, ops: list[tuple[str, float]]
) -> None:
    """Over any window [0, T] a full bucket grants at most capacity + rate * T."""
    bucket = TokenBucket(capacity, rate, now=start)
    now = start
    granted = 0.0
    grants = 0
    for op, value in ops:
        if op == "advance":
            now += value
        elif op == "acquire" and bucket.try_acquire(value * capacity, now):
            granted += value * capacity
            grants += 1
        # refunds are left out: giving tokens back legitimately allows granting them again
    bound = capacity + rate * (now - start)
    tolerance = grants * slack(capacity) + 1e-9 * bound
    assert granted <= bound + tolerance


def test_a_greedy_client_gets_the_full_rate_and_no_more() -> None:
    """The bound above is tight: a client that asks every 10 ms gets burst + rate * T."""
    bucket = TokenBucket(capacity=50.0, rate=20.0)
    granted = 0.0
    for step in range(10_001):  # 0 .. 100 s
        now = step * 0.01
        while bucket.try_acquire(1.0, now):
            granted += 1.0
    assert 50.0 + 20.0 * 100.0 - 1.0 <= granted <= 50.0 + 20.0 * 100.0


@given(
    capacity=capacities,
    rate=rates,
    start=start_times,
    level=fractions,
    cost=fractions,
    elapsed=st.floats(min_value=0.0, max_value=10.0),
)
def test_time_until_is_exact(
    capacity: float, rate: float, start: float, level: float, cost: float, elapsed: float
) -> None:
    """Acquiring at now + time_until succeeds, and clearly earlier it does not."""
    now = start + elapsed
    early = TokenBucket(capacity, rate, now=start, level=level * capacity)
    on_time = TokenBucket(capacity, rate, now=start, level=level * capacity)
    amount = cost * capacity
    available = on_time.level(now)
    wait = on_time.time_until(amount, now)
    note(f"available={available!r} wait={wait!r}")
    assert wait >= 0.0
    assert on_time.try_acquire(amount, now + wait)
    if available + slack(capacity) >= amount:
        assert wait == 0.0
    else:
        expected = (amount - available) / rate
        assert wait == pytest.approx(expected, rel=1e-9, abs=4 * math.ulp(now))
        # "Not before": a little earlier the bucket must refuse, whenever the tokens still
        # missing at that instant are more than the rounding slack.
        earlier = now + wait * 0.999
        still_missing = (amount - available) - rate * (earlier - now)
        if still_missing > 2 * slack(capacity):
            assert not early.try_acquire(amount, earlier)


@given(
    capacity=capacities,
    rate=rates,
    start=start_times,
    cost=fractions,
    peeks=st.lists(st.floats(min_value=0.0, max_value=1.0), max_size=20),
)
def test_waiting_time_until_always_makes_progress(
    capacity: float, rate: float, start: float, cost: float, peeks: list[float]
) -> None:
    """The dispatcher's loop (try, else sleep time_until, repeat) finishes in one or two rounds
    even when the level is refilled in many small steps in between (each step rounds)."""
    bucket = TokenBucket(capacity, rate, now=start, level=0.0)
    amount = cost * capacity
    now = start
    rounds = 0
    while not bucket.try_acquire(amount, now):
        wait = bucket.time_until(amount, now)
        assert wait > 0 and now + wait > now, "a wait that cannot move the clock would spin for ever"
        for fraction in sorted(peeks):  # someone looks at the level at intermediate instants
            bucket.level(now + wait * fraction)
        now += wait
        rounds += 1
        assert rounds <= 3


def test_refill_in_small_steps_does_not_livelock() -> None:
    """Regression: three 0.1 s refills at 10 tokens/s from t=2.0 leave 2.9999999999999982
    tokens at t=2.3; the old bucket refused 3 tokens and asked for a 1.8e-16 s wait, which
    t=2.3 cannot represent, so the dispatcher spun at t=2.3 for ever."""
    bucket = TokenBucket(capacity=600.0, rate=10.0, now=2.0, level=0.0)
    for step in (1, 2, 3):
        bucket.level(2.0 + step * 0.1)
    now = 2.0 + 3 * 0.1
    assert bucket.level(now) < 3.0  # the rounding this test is about
    assert bucket.try_acquire(3.0, now)


@given(capacity=capacities, rate=rates, start=start_times, excess=st.floats(min_value=1e-6, max_value=1e6))
def test_a_cost_above_capacity_is_refused_at_once(
    capacity: float, rate: float, start: float, excess: float
) -> None:
    bucket = TokenBucket(capacity, rate, now=start)
    cost = capacity * (1 + excess)
    for method in (bucket.try_acquire, bucket.can_acquire, bucket.time_until):
        with pytest.raises(QuotaConfigError, match="exceeds bucket capacity"):
            method(cost, start)
    assert bucket.level(start) == capacity


@pytest.mark.parametrize("cost", [-1.0, math.nan, math.inf])
def test_nonsense_costs_are_config_errors(cost: float) -> None:
    with pytest.raises(QuotaConfigError):
        TokenBucket(10.0, 1.0).try_acquire(cost, 0.0)


@pytest.mark.parametrize(
    ("capacity", "rate"),
    [(0.0, 1.0), (-1.0, 1.0), (math.inf, 1.0), (math.nan, 1.0), (5.0, -1.0), (5.0, math.inf)],
)
def test_impossible_buckets_are_refused(capacity: float, rate: float) -> None:
    with pytest.raises(QuotaConfigError):
        TokenBucket(capacity, rate)


@pytest.mark.parametrize("amount", [-1.0, math.nan, math.inf])
def test_refund_and_charge_reject_amounts_that_would_poison_the_level(amount: float) -> None:
    bucket = TokenBucket(10.0, 1.0)
    for method in (bucket.refund, bucket.charge):
        with pytest.raises(ValueError, match="amount"):
            method(amount, 0.0)
    assert bucket.level(0.0) == 10.0


def test_charge_may_go_into_debt_and_the_debt_is_waited_out() -> None:
    bucket = TokenBucket(capacity=10.0, rate=2.0)
    bucket.charge(16.0, now=0.0)
    assert bucket.level(0.0) == -6.0
    assert not bucket.try_acquire(1.0, 0.0)
    assert bucket.time_until(1.0, 0.0) == pytest.approx(3.5)
    assert bucket.try_acquire(1.0, 3.5)


def test_refill_is_capped_and_time_going_backwards_is_ignored() -> None:
    bucket = TokenBucket(capacity=10.0, rate=1.0, now=0.0, level=2.0)
    assert bucket.level(5.0) == 7.0
    assert bucket.level(3.0) == 7.0  # an earlier 'now' neither refills nor drains
    assert bucket.level(100.0) == 10.0
    bucket.refund(5.0, 100.0)
    assert bucket.level(100.0) == 10.0


def test_zero_rate_bucket_never_refills() -> None:
    bucket = TokenBucket(capacity=3.0, rate=0.0)
    assert bucket.try_acquire(3.0, 0.0)
    assert bucket.time_until(1.0, 1e9) == math.inf


def test_drain_and_set_level_take_the_servers_word() -> None:
    bucket = TokenBucket(capacity=10.0, rate=1.0)
    bucket.drain(0.0)
    assert bucket.level(0.0) == 0.0
    bucket.set_level(25.0, 0.0)
    assert bucket.level(0.0) == 10.0


@pytest.mark.parametrize("now", [0.0, 0.3, 2.0, 262144.0, 1e9, 1e15])
@pytest.mark.parametrize("deficit", [1e-300, 1e-12, 0.37, 5.0])
def test_refill_wait_lands_on_or_after_the_exact_instant(now: float, deficit: float) -> None:
    wait = refill_wait(deficit, 3.0, now)
    assert now + wait > now  # a positive wait always moves the clock
    assert (now + wait) - now >= deficit / 3.0  # ... and never lands before the refill is done
    assert wait <= deficit / 3.0 + 2 * math.ulp(now + deficit / 3.0)  # ... nor noticeably after
    assert refill_wait(0.0, 3.0, now) == 0.0
    assert refill_wait(deficit, 0.0, now) == math.inf


@pytest.mark.parametrize("now", [0.0, 0.1, 3.0, 1e6])
@pytest.mark.parametrize("gap", [1e-300, 1e-9, 0.7, 1e7, 1e17])
def test_wait_until_reaches_the_target(now: float, gap: float) -> None:
    target = now + gap
    wait = wait_until(target, now)
    assert now + wait >= target
    assert wait <= max(gap, 0.0) * (1 + 1e-15) + math.ulp(target)
    assert wait_until(now - 1.0, now) == 0.0


@given(
    capacity=capacities,
    rate=rates,
    level=fractions,
    cost=fractions,
    now=st.floats(min_value=0.0, max_value=1e12),
)
def test_acquire_at_now_plus_wait_succeeds_even_on_a_late_clock(
    capacity: float, rate: float, level: float, cost: float, now: float
) -> None:
    """Far from t=0 the clock's own rounding (ulp(1e12) = 1.2e-4 s) exceeds the level slack."""
    bucket = TokenBucket(capacity, rate, now=now, level=level * capacity)
    wait = bucket.time_until(cost * capacity, now)
    assert bucket.try_acquire(cost * capacity, now + wait)


# ---------------------------------------------------------------------------- MultiQuota


def snapshot(quota: MultiQuota, now: float) -> tuple[float, float, int]:
    return quota.levels(now)


def same_levels(a: tuple[float, float, int], b: tuple[float, float, int]) -> bool:
    return all((math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b, strict=True))


@given(
    rpm=st.none() | st.floats(min_value=1, max_value=600),
    tpm=st.none() | st.floats(min_value=100, max_value=1e5),
    concurrency=st.none() | st.integers(min_value=1, max_value=4),
    pre_requests=st.integers(min_value=0, max_value=700),
    pre_tokens=fractions,
    tokens=fractions,
    held=st.integers(min_value=0, max_value=5),
)
def test_reservation_is_all_or_nothing(
    rpm: float | None,
    tpm: float | None,
    concurrency: int | None,
    pre_requests: int,
    pre_tokens: float,
    tokens: float,
    held: int,
) -> None:
    quota = MultiQuota(QuotaLimits(requests_per_min=rpm, tokens_per_min=tpm, concurrency=concurrency))
    now = 0.0
    if quota.requests is not None:  # use up some requests and tokens without holding slots
        quota.requests.charge(min(pre_requests, quota.requests.capacity), now)
    if quota.tokens is not None:
        quota.tokens.charge(pre_tokens * quota.tokens.capacity, now)
        tokens *= quota.tokens.capacity
    quota.in_flight = min(held, concurrency) if concurrency is not None else held
    before = snapshot(quota, now)
    could = quota.can_reserve(tokens, now)
    reservation = quota.try_reserve(tokens, now)
    after = snapshot(quota, now)
    assert (reservation is not None) == could
    if reservation is None:
        assert same_levels(before, after)
        return
    req_before, tok_before, slots_before = before
    req_after, tok_after, slots_after = after
    assert slots_after == slots_before + 1
    if quota.requests is not None:
        assert req_after == pytest.approx(req_before - 1.0, abs=slack(quota.requests.capacity))
    if quota.tokens is not None:
        assert tok_after == pytest.approx(tok_before - tokens, abs=2 * slack(quota.tokens.capacity))
    assert reservation == Reservation(
        requests=1.0 if rpm is not None else 0.0, tokens=tokens if tpm is not None else 0.0, slots=1
    )


@pytest.mark.parametrize("short", ["requests", "tokens", "slots", "paused"])
def test_one_short_dimension_blocks_and_changes_nothing(short: str) -> None:
    quota = MultiQuota(QuotaLimits(requests_per_min=60, tokens_per_min=6000, concurrency=2))
    if short == "requests":
        quota.requests.charge(60.0, 0.0)  # type: ignore[union-attr]
    elif short == "tokens":
        quota.tokens.charge(5950.0, 0.0)  # type: ignore[union-attr]
    elif short == "slots":
        quota.in_flight = 2
    else:
        quota.pause_until(5.0)
    before = snapshot(quota, 0.0)
    assert quota.try_reserve(100.0, 0.0) is None
    assert snapshot(quota, 0.0) == before


def test_concurrency_slots_are_held_until_released() -> None:
    quota = MultiQuota(QuotaLimits(concurrency=2))
    first = quota.try_reserve(10.0, 0.0)
    second = quota.try_reserve(10.0, 0.0)
    assert first is not None and second is not None
    assert quota.try_reserve(10.0, 0.0) is None
    assert quota.time_until(10.0, 0.0) == math.inf  # only a release frees a slot
    quota.release(first, 1.0)
    assert quota.time_until(10.0, 1.0) == 0.0
    third = quota.try_reserve(10.0, 1.0)
    assert third is not None
    quota.release(second, 2.0)
    quota.release(third, 2.0)
    assert quota.in_flight == 0
    with pytest.raises(RuntimeError, match="released more slots"):
        quota.release(third, 3.0)
    assert quota.in_flight == 0  # the failed release changed nothing


def test_unlimited_quota_always_reserves_and_reports_nan_levels() -> None:
    quota = MultiQuota(QuotaLimits())
    reservations = [quota.try_reserve(1e9, 0.0) for _ in range(100)]
    assert all(r == Reservation(requests=0.0, tokens=0.0, slots=1) for r in reservations)
    requests, tokens, in_flight = quota.levels(0.0)
    assert math.isnan(requests) and math.isnan(tokens) and in_flight == 100


def test_per_minute_limits_become_buckets_with_one_minute_burst() -> None:
    quota = MultiQuota(QuotaLimits(requests_per_min=120, tokens_per_min=6000, token_burst=1000))
    assert (quota.requests.capacity, quota.requests.rate) == (120.0, 2.0)  # type: ignore[union-attr]
    assert (quota.tokens.capacity, quota.tokens.rate) == (1000.0, 100.0)  # type: ignore[union-attr]
    with pytest.raises(QuotaConfigError, match="exceeds bucket capacity"):
        quota.check_cost(1001.0)
    with pytest.raises(QuotaConfigError):
        quota.try_reserve(1001.0, 0.0)


@pytest.mark.parametrize("limits", [{"requests_per_min": 0}, {"tokens_per_min": -5}, {"concurrency": 0}])
def test_impossible_limits_are_refused(limits: dict[str, float]) -> None:
    with pytest.raises(QuotaConfigError):  # when the limits are built, before any quota uses them
        QuotaLimits(**limits)


def test_reconcile_charges_or_refunds_the_difference() -> None:
    quota = MultiQuota(QuotaLimits(tokens_per_min=6000, token_burst=1000))
    tokens = quota.tokens
    assert tokens is not None
    over = quota.try_reserve(100.0, 0.0)
    assert over is not None and tokens.level(0.0) == 900.0
    assert quota.reconcile(over, 150.0, 0.0) == 50.0
    assert tokens.level(0.0) == 850.0
    under = quota.try_reserve(100.0, 0.0)
    assert under is not None and tokens.level(0.0) == 750.0
    assert quota.reconcile(under, 40.0, 0.0) == -60.0
    assert tokens.level(0.0) == 810.0
    exact = quota.try_reserve(10.0, 0.0)
    assert exact is not None and quota.reconcile(exact, 10.0, 0.0) == 0.0
    assert tokens.level(0.0) == 800.0


def test_reconcile_may_leave_a_debt_but_never_refunds_above_capacity() -> None:
    quota = MultiQuota(QuotaLimits(tokens_per_min=600, token_burst=100))
    tokens = quota.tokens
    assert tokens is not None
    big = quota.try_reserve(100.0, 0.0)
    assert big is not None
    quota.reconcile(big, 130.0, 0.0)  # the provider counted more than we reserved
    assert tokens.level(0.0) == -30.0
    assert quota.time_until(10.0, 0.0) == pytest.approx(4.0)  # 40 tokens at 10 tokens/s
    small = Reservation(requests=0.0, tokens=90.0, slots=0)
    quota.reconcile(small, 0.0, 100.0)  # refund 90 into an already full bucket
    assert tokens.level(100.0) == 100.0


@pytest.mark.parametrize("actual", [-1.0, math.nan, math.inf])
def test_reconcile_rejects_impossible_usage(actual: float) -> None:
    quota = MultiQuota(QuotaLimits(tokens_per_min=600))
    reservation = quota.try_reserve(10.0, 0.0)
    assert reservation is not None
    with pytest.raises(ValueError, match="actual token"):
        quota.reconcile(reservation, actual, 0.0)
    assert quota.levels(0.0)[1] == 590.0


def test_cancel_gives_everything_back() -> None:
    quota = MultiQuota(QuotaLimits(requests_per_min=60, tokens_per_min=600, concurrency=1))
    before = snapshot(quota, 0.0)
    reservation = quota.try_reserve(50.0, 0.0)
    assert reservation is not None
    quota.cancel(reservation, 0.0)
    assert snapshot(quota, 0.0) == before


def test_pause_until_holds_everyone_back_and_never_shortens() -> None:
    quota = MultiQuota(QuotaLimits(requests_per_min=60))
    quota.pause_until(10.0)
    quota.pause_until(4.0)  # a shorter pause does not cut the longer one
    assert quota.time_until(1.0, 2.5) == 7.5
    assert not quota.can_reserve(1.0, 9.999)
    assert quota.try_reserve(1.0, 9.999) is None
    assert quota.try_reserve(1.0, 10.0) is not None


@given(
    rpm=st.floats(min_value=1, max_value=600),
    tpm=st.floats(min_value=100, max_value=1e5),
    used=fractions,
    tokens=fractions,
    pause=st.floats(min_value=0.0, max_value=30.0),
    now=start_times,
)
def test_reserving_at_now_plus_time_until_succeeds(
    rpm: float, tpm: float, used: float, tokens: float, pause: float, now: float
) -> None:
    quota = MultiQuota(QuotaLimits(requests_per_min=rpm, tokens_per_min=tpm, concurrency=3), now=now)
    assert quota.tokens is not None and quota.requests is not None
    quota.tokens.charge(used * quota.tokens.capacity, now)
    quota.requests.charge(quota.requests.capacity, now)
    quota.pause_until(now + pause)
    amount = tokens * quota.tokens.capacity
    wait = quota.time_until(amount, now)
    assert wait >= pause or now + wait >= now + pause
    assert quota.try_reserve(amount, now + wait) is not None


@given(
    level=st.floats(min_value=0.0, max_value=9.0),
    cost=st.floats(min_value=0.5, max_value=10.0),
    behind=st.floats(min_value=1e-3, max_value=50.0),
)
def test_a_wait_asked_from_the_buckets_past_counts_from_its_present(
    level: float, cost: float, behind: float
) -> None:
    """A caller whose clock reading is older than the bucket's last use (another caller read the
    clock later and used the bucket first) must not get a wait that ends before any refill."""
    used_at = 100.0
    bucket = TokenBucket(capacity=10.0, rate=1.0, now=used_at, level=level)
    asked_at = used_at - behind
    wait = bucket.time_until(cost, asked_at)
    if cost <= level:
        assert wait == 0.0
        return
    assert asked_at + wait >= used_at + (cost - level)  # never earlier than the refill allows
    assert bucket.try_acquire(cost, asked_at + wait)


@pytest.mark.parametrize(
    "limits", [{"requests_per_min": 10, "request_burst": 0.5}, {"requests_per_min": 0.5}]
)
def test_a_request_bucket_that_can_never_grant_a_request_is_refused(limits: dict) -> None:
    """Each attempt takes one request: a burst below 1 failed every task at dispatch instead."""
    with pytest.raises(QuotaConfigError, match="can never grant a request"):
        QuotaLimits(**limits)
    assert QuotaLimits(requests_per_min=0.5, request_burst=1).request_burst == 1  # one every 2 min
