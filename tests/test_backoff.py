"""Backoff strategies: ranges, distribution, determinism, caps and the Retry-After floor."""

from __future__ import annotations

import math
import random
import statistics
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiqsim.core.backoff import (
    BACKOFF_STRATEGIES,
    BackoffStrategy,
    ConstantBackoff,
    DecorrelatedJitter,
    EqualJitter,
    ExponentialBackoff,
    FullJitter,
    NoBackoff,
    backoff_from_name,
    exponential_ceiling,
    retry_delay,
)
from aiqsim.core.errors import ConfigurationError

bases = st.floats(min_value=1e-3, max_value=10.0)
cap_factors = st.floats(min_value=1.0, max_value=1e4)
retries = st.integers(min_value=0, max_value=2000)
seeds = st.integers(min_value=0, max_value=2**32)


class ExtremeRandom(random.Random):
    """A Random whose ``random()`` always returns one fixed value, to probe range edges."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


LARGEST_BELOW_ONE = 1.0 - 2.0**-53  # the largest value random.random() can return


def ceiling(retry: int, base: float, cap: float) -> float:
    """min(cap, base * 2**retry), computed exactly in rationals (2.0**1024 would overflow a float)."""
    return cap if Fraction(base) * 2**retry >= Fraction(cap) else float(Fraction(base) * 2**retry)


# ---------------------------------------------------------------------------- exponential


@given(base=bases, cap_factor=cap_factors, retry=retries)
def test_exponential_is_base_times_two_to_the_n_capped(base: float, cap_factor: float, retry: int) -> None:
    cap = base * cap_factor
    strategy = ExponentialBackoff(base_s=base, cap_s=cap)
    delay = strategy.delay(retry, random.Random(0))
    assert delay == ceiling(retry, base, cap)
    assert delay <= cap
    assert strategy.delay(retry + 1, random.Random(0)) >= delay


def test_exponential_sequence_and_overflow_safety() -> None:
    strategy = ExponentialBackoff(base_s=0.5, cap_s=10.0)
    rng = random.Random(0)
    assert [strategy.delay(n, rng) for n in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert strategy.delay(10**6, rng) == 10.0  # 2.0 ** 10**6 would overflow
    with pytest.raises(ValueError, match="retry"):
        exponential_ceiling(-1, 0.5, 10.0)


@pytest.mark.parametrize(
    ("retry", "base", "cap"),
    [
        (1100, 1e-300, 1e300),
        (1023, 1e-300, 1e300),
        (2000, 5e-324, 1.7e308),
        (1074, 5e-324, 2.0),
        (3, 1e-310, 1.0),
    ],
)
def test_the_ceiling_is_exact_where_cap_over_base_overflows_or_base_is_subnormal(
    retry: int, base: float, cap: float
) -> None:
    # cap / base overflowed to inf, and retry >= 1024 was taken as "past the cap": 1e300 instead of 1.36e31
    assert exponential_ceiling(retry, base, cap) == ceiling(retry, base, cap)


# ---------------------------------------------------------------------------- full jitter


@given(base=bases, cap_factor=cap_factors, retry=retries, seed=seeds)
def test_full_jitter_lies_in_zero_to_ceiling(base: float, cap_factor: float, retry: int, seed: int) -> None:
    cap = base * cap_factor
    delay = FullJitter(base_s=base, cap_s=cap).delay(retry, random.Random(seed))
    assert 0.0 <= delay < ceiling(retry, base, cap)


@pytest.mark.parametrize("ceiling_s", [0.75, 1.0, 3.0, 60.0])
def test_full_jitter_stays_below_the_ceiling_at_the_largest_draw(ceiling_s: float) -> None:
    strategy = FullJitter(base_s=ceiling_s, cap_s=60.0)
    assert strategy.delay(0, ExtremeRandom(LARGEST_BELOW_ONE)) < ceiling_s
    assert strategy.delay(0, ExtremeRandom(0.0)) == 0.0


@pytest.mark.parametrize("retry", [0, 3, 6, 12])
def test_full_jitter_mean_is_half_the_ceiling(retry: int) -> None:
    """uniform(0, t) has mean t/2 and standard deviation t/sqrt(12); with n draws the sample
    mean lies within 5 standard errors (t / sqrt(12 n)) of t/2 except with probability 6e-7,
    and the seed is fixed, so this is a deterministic check of the distribution's centre."""
    strategy = FullJitter(base_s=0.5, cap_s=60.0)
    t = min(60.0, 0.5 * 2**retry)
    n = 20_000
    rng = random.Random(20240611 + retry)
    delays = [strategy.delay(retry, rng) for _ in range(n)]
    standard_error = t / math.sqrt(12 * n)
    assert abs(statistics.fmean(delays) - t / 2) < 5 * standard_error
    # Spread, not just centre: a quarter of the draws fall in each quarter of [0, t).
    below_quarter = sum(d < t / 4 for d in delays) / n
    assert abs(below_quarter - 0.25) < 5 * math.sqrt(0.25 * 0.75 / n)
    assert max(delays) < t


# ---------------------------------------------------------------------------- equal jitter


@given(base=bases, cap_factor=cap_factors, retry=retries, seed=seeds)
def test_equal_jitter_lies_in_half_to_full_ceiling(
    base: float, cap_factor: float, retry: int, seed: int
) -> None:
    cap = base * cap_factor
    t = ceiling(retry, base, cap)
    delay = EqualJitter(base_s=base, cap_s=cap).delay(retry, random.Random(seed))
    assert t / 2 <= delay < t


@pytest.mark.parametrize("ceiling_s", [0.5, 1.0, 2.0, 3.0, 60.0])
def test_equal_jitter_edges(ceiling_s: float) -> None:
    """At the largest possible draw, half + u * half rounds to t for power-of-two halves;
    the strategy must still stay strictly below t."""
    strategy = EqualJitter(base_s=ceiling_s, cap_s=60.0)
    assert strategy.delay(0, ExtremeRandom(0.0)) == ceiling_s / 2
    assert ceiling_s / 2 <= strategy.delay(0, ExtremeRandom(LARGEST_BELOW_ONE)) < ceiling_s


def test_equal_jitter_mean_is_three_quarters_of_the_ceiling() -> None:
    strategy = EqualJitter(base_s=1.0, cap_s=60.0)
    n = 20_000
    rng = random.Random(7)
    delays = [strategy.delay(2, rng) for _ in range(n)]  # t = 4: uniform(2, 4)
    assert abs(statistics.fmean(delays) - 3.0) < 5 * (2.0 / math.sqrt(12 * n))


# ---------------------------------------------------------------------------- decorrelated jitter


@given(
    base=bases,
    cap_factor=cap_factors,
    previous=st.none() | st.floats(min_value=0.0, max_value=1e5),
    seed=seeds,
)
def test_decorrelated_jitter_lies_in_base_to_three_times_previous(
    base: float, cap_factor: float, previous: float | None, seed: int
) -> None:
    cap = base * cap_factor
    delay = DecorrelatedJitter(base_s=base, cap_s=cap).delay(5, random.Random(seed), previous)
    prev = base if previous is None else max(previous, base)
    upper = min(cap, 3 * prev)
    assert min(base, upper) <= delay <= upper


def test_decorrelated_jitter_grows_from_the_previous_delay_and_stays_capped() -> None:
    strategy = DecorrelatedJitter(base_s=1.0, cap_s=20.0)
    rng = random.Random(3)
    previous: float | None = None
    seen = []
    for retry in range(200):
        delay = strategy.delay(retry, rng, previous)
        bound = 3.0 if previous is None else min(20.0, 3 * previous)
        assert 1.0 <= delay <= bound
        seen.append(delay)
        previous = delay
    assert max(seen) > 10.0  # it does climb towards the cap over a long chain


# ---------------------------------------------------------------------------- shared properties

ALL_STRATEGIES: list[BackoffStrategy] = [
    NoBackoff(),
    ConstantBackoff(delay_s=2.0),
    ExponentialBackoff(),
    FullJitter(),
    EqualJitter(),
    DecorrelatedJitter(),
]


@pytest.mark.parametrize("strategy", ALL_STRATEGIES, ids=lambda s: s.name)
def test_same_seed_gives_same_delays(strategy: BackoffStrategy) -> None:
    def sequence(seed: int) -> list[float]:
        rng = random.Random(seed)
        previous = None
        out = []
        for retry in range(30):
            previous = strategy.delay(retry, rng, previous)
            out.append(previous)
        return out

    assert sequence(11) == sequence(11)
    if strategy.name in {"full_jitter", "equal_jitter", "decorrelated_jitter"}:
        assert sequence(11) != sequence(12)  # the seed is actually used


@given(
    name=st.sampled_from(sorted(BACKOFF_STRATEGIES)),
    retry=st.integers(min_value=0, max_value=40),
    retry_after=st.none() | st.floats(min_value=0.0, max_value=1e4),
    seed=seeds,
)
def test_retry_after_is_a_floor_and_otherwise_the_strategy_decides(
    name: str, retry: int, retry_after: float | None, seed: int
) -> None:
    strategy = backoff_from_name(name, base_s=0.5, cap_s=60.0)
    own = strategy.delay(retry, random.Random(seed), 1.0)
    delay = retry_delay(strategy, retry, random.Random(seed), previous=1.0, retry_after_s=retry_after)
    assert delay == (own if retry_after is None else max(own, retry_after))
    if retry_after is not None:
        assert delay >= retry_after  # the server's word wins over any jitter


def test_retry_after_longer_than_the_cap_is_still_honoured() -> None:
    delay = retry_delay(FullJitter(base_s=0.5, cap_s=10.0), 3, random.Random(0), retry_after_s=120.0)
    assert delay == 120.0


@pytest.mark.parametrize("name", sorted(BACKOFF_STRATEGIES))
def test_backoff_from_name_builds_every_strategy(name: str) -> None:
    strategy = backoff_from_name(name, base_s=0.25, cap_s=8.0)
    assert isinstance(strategy, BACKOFF_STRATEGIES[name])
    assert isinstance(strategy, BackoffStrategy)
    assert strategy.name == name
    if name == "constant":
        assert strategy == ConstantBackoff(delay_s=0.25)
    elif name != "none":
        assert (strategy.base_s, strategy.cap_s) == (0.25, 8.0)  # type: ignore[attr-defined]
    assert 0.0 <= strategy.delay(10, random.Random(1)) <= 8.0


def test_backoff_from_name_rejects_unknown_names_clearly() -> None:
    with pytest.raises(ValueError, match="unknown backoff strategy 'fibonacci'") as info:
        backoff_from_name("fibonacci")
    for name in BACKOFF_STRATEGIES:
        assert name in str(info.value)


@pytest.mark.parametrize("cls", [ExponentialBackoff, FullJitter, EqualJitter, DecorrelatedJitter])
@pytest.mark.parametrize(
    ("base", "cap"),
    [
        (-1.0, 10.0),
        (math.nan, 10.0),
        (math.inf, math.inf),
        (5.0, 1.0),
        (1.0, math.inf),  # an infinite cap gave delays of inf, or NaN (inf times a draw of 0.0)
        (1.0, math.nan),
        (True, 10.0),
        ("1", 10.0),
        (1.0, "60"),
    ],
)
def test_impossible_parameters_are_refused(cls: type, base: object, cap: object) -> None:
    with pytest.raises(ConfigurationError, match=r"base_s|cap_s"):
        cls(base_s=base, cap_s=cap)


@pytest.mark.parametrize("delay", [-1.0, math.nan, math.inf, True, "1"])
def test_a_constant_delay_must_be_a_finite_number(delay: object) -> None:
    with pytest.raises(ConfigurationError, match="delay_s"):
        ConstantBackoff(delay_s=delay)  # type: ignore[arg-type]


@pytest.mark.parametrize("retry", [1.5, -1, True, "2", None])
@pytest.mark.parametrize("cls", [ExponentialBackoff, FullJitter, EqualJitter])
def test_a_retry_number_must_be_a_whole_number(cls: type, retry: object) -> None:
    with pytest.raises(ConfigurationError, match="retry must be a whole number"):
        cls().delay(retry, random.Random(0))


def test_zero_base_means_no_wait() -> None:
    rng = random.Random(0)
    for cls in (ExponentialBackoff, FullJitter, EqualJitter):
        assert cls(base_s=0.0, cap_s=5.0).delay(7, rng) == 0.0
