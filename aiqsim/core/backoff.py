"""Backoff strategies: how long to wait before retry number ``n``.

Small composable objects with readable names, after tenacity's ``wait_*`` and the
strategies of Marc Brooker's "Exponential Backoff And Jitter" (AWS Architecture Blog,
2015). Randomness always comes from an injected ``random.Random``; ``retry`` counts
retries from 0 (the first retry waits about ``base_s``).
"""

from __future__ import annotations

import math
import numbers
import random
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.numeric import is_wait, is_whole


@runtime_checkable
class BackoffStrategy(Protocol):
    """Maps (retry number, previous delay) to the next delay in seconds."""

    name: str

    def delay(self, retry: int, rng: random.Random, previous: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (0-based)."""
        ...


def _finite_non_negative(name: str, value: float) -> None:
    # finite: an infinite delay or cap made retries that never come, or (inf times a draw of 0.0) NaN
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not (math.isfinite(value) and value >= 0)
    ):
        raise ConfigurationError(f"{name} must be a finite number >= 0, got {value!r}")


def _check(base_s: float, cap_s: float) -> None:
    """Refuse what is not a finite, non-negative ``base_s`` up to a finite ``cap_s``."""
    _finite_non_negative("base_s", base_s)
    _finite_non_negative("cap_s", cap_s)
    if not (cap_s >= base_s):
        raise ConfigurationError(f"cap_s ({cap_s!r}) must be >= base_s ({base_s!r})")


def exponential_ceiling(retry: int, base_s: float, cap_s: float) -> float:
    """``min(cap, base * 2**retry)`` without overflowing for large ``retry``."""
    if not (is_whole(retry, 0) and isinstance(retry, numbers.Integral)):
        raise ConfigurationError(f"retry must be a whole number >= 0, got {retry!r}")
    if base_s == 0:
        return 0.0
    try:
        grown = math.ldexp(base_s, retry)  # base * 2**retry, exact; no overflow in between
    except OverflowError:
        return cap_s
    return min(cap_s, grown)


@dataclass(frozen=True, slots=True)
class NoBackoff:
    """Retry at once. The baseline that turns every failure into a retry storm."""

    name: str = "none"

    def delay(self, retry: int, rng: random.Random, previous: float | None = None) -> float:
        return 0.0


@dataclass(frozen=True, slots=True)
class ConstantBackoff:
    """Always wait ``delay_s``."""

    delay_s: float = 1.0
    name: str = "constant"

    def __post_init__(self) -> None:
        _finite_non_negative("delay_s", self.delay_s)

    def delay(self, retry: int, rng: random.Random, previous: float | None = None) -> float:
        return self.delay_s


@dataclass(frozen=True, slots=True)
class ExponentialBackoff:
    """``min(cap, base * 2**n)``: capped exponential with no jitter (clients stay in lockstep)."""

    base_s: float = 0.5
    cap_s: float = 60.0
    name: str = "exponential"

    def __post_init__(self) -> None:
        _check(self.base_s, self.cap_s)

    def delay(self, retry: int, rng: random.Random, previous: float | None = None) -> float:
        return exponential_ceiling(retry, self.base_s, self.cap_s)


@dataclass(frozen=True, slots=True)
class FullJitter:
    """``uniform(0, min(cap, base * 2**n))``: the AWS recommendation; least total work."""

    base_s: float = 0.5
    cap_s: float = 60.0
    name: str = "full_jitter"

    def __post_init__(self) -> None:
        _check(self.base_s, self.cap_s)

    def delay(self, retry: int, rng: random.Random, previous: float | None = None) -> float:
        return rng.random() * exponential_ceiling(retry, self.base_s, self.cap_s)


@dataclass(frozen=True, slots=True)
class EqualJitter:
    """``t/2 + uniform(0, t/2)`` with ``t = min(cap, base * 2**n)``: never shorter than half."""

    base_s: float = 0.5
    cap_s: float = 60.0
    name: str = "equal_jitter"

    def __post_init__(self) -> None:
        _check(self.base_s, self.cap_s)

    def delay(self, retry: int, rng: random.Random, previous: float | None = None) -> float:
        ceiling = exponential_ceiling(retry, self.base_s, self.cap_s)
        half = ceiling / 2.0
        drawn = half + rng.random() * half
        # half + u * half rounds up to the ceiling itself for u just below 1; keep [t/2, t).
        return min(drawn, math.nextafter(ceiling, 0.0)) if ceiling > 0 else drawn


@dataclass(frozen=True, slots=True)
class DecorrelatedJitter:
    """``min(cap, uniform(base, 3 * previous))``: grows from the last delay, not the retry count."""

    base_s: float = 0.5
    cap_s: float = 60.0
    name: str = "decorrelated_jitter"

    def __post_init__(self) -> None:
        _check(self.base_s, self.cap_s)

    def delay(self, retry: int, rng: random.Random, previous: float | None = None) -> float:
        prev = self.base_s if previous is None else max(previous, self.base_s)
        upper = prev * 3.0
        return min(self.cap_s, self.base_s + rng.random() * (upper - self.base_s))


BACKOFF_STRATEGIES: dict[str, type] = {
    "none": NoBackoff,
    "constant": ConstantBackoff,
    "exponential": ExponentialBackoff,
    "full_jitter": FullJitter,
    "equal_jitter": EqualJitter,
    "decorrelated_jitter": DecorrelatedJitter,
}
"""Strategy names as used in scenario files and sweeps."""


def backoff_from_name(name: str, base_s: float = 0.5, cap_s: float = 60.0) -> BackoffStrategy:
    """Build a strategy from its scenario-file name."""
    try:
        cls = BACKOFF_STRATEGIES[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown backoff strategy {name!r}; expected one of {sorted(BACKOFF_STRATEGIES)}"
        ) from None
    if cls is NoBackoff:
        return NoBackoff()
    if cls is ConstantBackoff:
        return ConstantBackoff(delay_s=base_s)
    return cls(base_s=base_s, cap_s=cap_s)


def retry_delay(
    strategy: BackoffStrategy,
    retry: int,
    rng: random.Random,
    *,
    previous: float | None = None,
    retry_after_s: float | None = None,
) -> float:
    """The delay before a retry: the strategy's delay, floored by the server's Retry-After.

    The server's word wins: a Retry-After is never shortened by jitter.

    A strategy's delay that is no finite number >= 0 (a custom strategy's bug) raises
    :class:`ConfigurationError` naming it: NaN slept as 0 (a retry storm, said nowhere) and
    infinity held the task running for ever. The scheduler fails the task with that message.
    """
    delay = strategy.delay(retry, rng, previous)
    if delay.__class__ is not float or not 0.0 <= delay < math.inf:  # one test for the built-in ones
        try:
            seconds = float(delay) if is_wait(delay) else math.nan
        except OverflowError:  # an int past any float (10**400)
            seconds = math.inf
        if not seconds < math.inf:
            raise ConfigurationError(
                f"{type(strategy).__name__}.delay(retry={retry}) returned {delay!r}; a backoff "
                "strategy must answer a finite number of seconds >= 0"
            )
        delay = seconds
    if retry_after_s is not None and retry_after_s > delay:
        return float(retry_after_s)
    return delay
