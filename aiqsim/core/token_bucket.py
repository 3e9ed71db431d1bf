"""Token buckets and the multi-dimension quota reservation built from them.

The arithmetic is pure: every method takes ``now`` and nothing reads a clock. A bucket
holds ``level`` tokens up to ``capacity`` and refills at ``rate`` tokens per second.

Floating point: a level refilled in many small steps (0.1 s, then 0.1 s, ...) ends a few
ulps short of the same level refilled in one step, so "wait ``time_until`` then acquire"
could fail by 1e-16 tokens and ask for a wait too small to move the clock (a livelock in
virtual time). Buckets therefore treat amounts within :data:`LEVEL_SLACK` x capacity of
the cost as enough, and ``time_until`` returns a wait whose float instant ``now + wait``
is never earlier than the exact one (so it always moves the clock).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from math import (  # names, not math.x: one lookup fewer per call in the hot path
    inf,
    isfinite,
    isnan,
    nan,
    nextafter,
)

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.numeric import is_real
from aiqsim.core.slot_init import compile_builder, fast_frozen_init


class QuotaConfigError(ConfigurationError):
    """A request that no amount of waiting could satisfy (e.g. cost above capacity)."""


def refilled_level(level: float, capacity: float, rate: float, elapsed: float) -> float:
    """The level after ``elapsed`` seconds of refill, capped at ``capacity``."""
    if elapsed <= 0:
        return level
    return min(capacity, level + rate * elapsed)


LEVEL_SLACK = 1e-9
"""Relative tolerance (fraction of capacity) under which a level counts as equal to the cost."""


def refill_wait(deficit: float, rate: float, now: float) -> float:
    """Seconds until ``deficit`` tokens have refilled, such that the float instant ``now + wait``
    is not earlier than the exact one.

    ``now + deficit / rate`` may round down by half an ulp of the clock (and ``now + 1e-17``
    is just ``now`` for any ``now`` above ~0.1); a caller who sleeps the wait and tries again
    would then find the bucket a hair short, and could spin at the same instant for ever.
    """
    if deficit <= 0:
        return 0.0
    if rate <= 0:
        return inf
    wait = deficit / rate
    instant = now + wait
    if instant - now < wait:  # the clock sum rounded down: take the next representable instant
        instant = nextafter(instant, inf)
    return instant - now


def wait_until(target: float, now: float) -> float:
    """Seconds from ``now`` to ``target`` such that ``now + wait >= target`` holds in floats."""
    wait = target - now
    if wait <= 0:
        return 0.0
    # target - now only rounds when target > 2 * now, where one ulp of wait moves the sum.
    while now + wait < target:
        wait = nextafter(wait, inf)
    return wait


def seconds_until(level: float, cost: float, rate: float) -> float:
    """Seconds of refill needed for ``level`` to reach ``cost`` (0 if it already has)."""
    deficit = cost - level
    if deficit <= 0:
        return 0.0
    if rate <= 0:
        return inf
    return deficit / rate


class TokenBucket:
    """A cost-weighted token bucket.

    ``try_acquire`` never takes the level below zero and ``refund`` never lifts it above
    capacity. ``charge`` (used to reconcile an estimate with the actual usage) may leave a
    debt, i.e. a negative level, because the provider has already counted that usage.
    """

    __slots__ = ("_level", "_slack", "_updated", "capacity", "rate")

    def __init__(self, capacity: float, rate: float, *, now: float = 0.0, level: float | None = None) -> None:
        if not is_real(capacity) or not 0 < capacity < inf:
            raise QuotaConfigError(f"bucket capacity must be a positive finite number, got {capacity!r}")
        if not is_real(rate) or not 0 <= rate < inf:
            raise QuotaConfigError(f"bucket refill rate must be >= 0 and finite, got {rate!r}")
        self.capacity = float(capacity)
        self.rate = float(rate)
        self._slack = LEVEL_SLACK * self.capacity
        self._level = self.capacity if level is None else min(float(level), self.capacity)
        self._updated = now

    def copy(self) -> TokenBucket:
        """An independent bucket in this one's exact state."""
        twin = TokenBucket.__new__(TokenBucket)
        twin.capacity, twin.rate, twin._slack = self.capacity, self.rate, self._slack
        twin._level, twin._updated = self._level, self._updated
        return twin

    def _check_cost(self, cost: float) -> None:
        if cost < 0 or isnan(cost):
            raise QuotaConfigError(f"cost must be >= 0, got {cost!r}")
        if cost > self.capacity:
            raise QuotaConfigError(
                f"cost {cost:g} exceeds bucket capacity {self.capacity:g}: it could never be granted"
            )

    def level(self, now: float) -> float:
        """Tokens available at ``now`` (refill applied)."""
        self._refill(now)
        return self._level

    def _refill(self, now: float) -> None:
        if now > self._updated:
            self._level = refilled_level(self._level, self.capacity, self.rate, now - self._updated)
            self._updated = now

    def can_acquire(self, cost: float, now: float) -> bool:
        """Whether ``try_acquire(cost, now)`` would succeed, without taking anything."""
        self._check_cost(cost)
        self._refill(now)
        return self._level + self._slack >= cost

    def try_acquire(self, cost: float, now: float) -> bool:
        """Take ``cost`` tokens if available; return whether it did. Raises if cost > capacity.

        A grant within the rounding slack leaves the level at 0, never below.
        """
        if not self.can_acquire(cost, now):
            return False
        self._take(cost)
        return True

    def _take(self, cost: float) -> None:
        """Take ``cost`` tokens that :meth:`can_acquire` just granted at this bucket's present time
        (the second half of :meth:`try_acquire`, for a caller that has asked already)."""
        self._level = self._level - cost if self._level >= cost else min(self._level, 0.0)

    def time_until(self, cost: float, now: float) -> float:
        """Seconds from ``now`` until ``cost`` tokens will be available (0 if now, ``inf`` if never).

        Counted from the bucket's own present: a ``now`` earlier than the last time the bucket was
        used (a clock read before another caller's) waits for that time too, since no refill
        happens before it (the wait was once counted from ``now``, too short by the difference).
        """
        if self.can_acquire(cost, now):
            return 0.0
        updated = self._updated  # == now unless now is in the bucket's past
        wait = refill_wait(cost - self._level, self.rate, updated)
        return wait if updated <= now else wait_until(updated + wait, now)

    def refund(self, amount: float, now: float) -> None:
        """Give back ``amount`` tokens (never above capacity)."""
        _check_amount("refund", amount)
        self._refill(now)
        self._level = min(self.capacity, self._level + amount)

    def charge(self, amount: float, now: float) -> None:
        """Take ``amount`` tokens unconditionally (may go into debt); used by reconcile."""
        _check_amount("charge", amount)
        self._refill(now)
        self._level -= amount

    def drain(self, now: float) -> None:
        """Empty the bucket, e.g. when the server says our view of its quota was too generous."""
        self._refill(now)
        self._level = min(self._level, 0.0)

    def set_level(self, level: float, now: float) -> None:
        """Overwrite the level (the server's view wins), clamped to capacity."""
        if not isfinite(level):
            raise ConfigurationError(f"a bucket level must be a finite number, got {level!r}")
        self._refill(now)
        self._level = min(float(level), self.capacity)


def _check_amount(what: str, amount: float) -> None:
    # NaN would poison the level for ever (every comparison with it is False); inf likewise.
    if not (amount >= 0 and isfinite(amount)):
        raise ConfigurationError(f"{what} amount must be a finite number >= 0, got {amount!r}")


@fast_frozen_init  # built per call: see aiqsim.core.slot_init
@dataclass(frozen=True, slots=True)
class Reservation:
    """What one attempt took from a :class:`MultiQuota`: give it back with ``release``/``reconcile``."""

    requests: float
    tokens: float
    slots: int


_new_reservation = compile_builder(Reservation)  # one per granted attempt with tokens: not a class call


@dataclass(frozen=True, slots=True)
class QuotaLimits:
    """Per-provider client-side limits. ``None`` means unlimited in that dimension.

    Rates are per minute as providers publish them; bursts default to one minute's worth.
    """

    requests_per_min: float | None = None
    tokens_per_min: float | None = None
    concurrency: int | None = None
    request_burst: float | None = None
    token_burst: float | None = None

    def __post_init__(self) -> None:
        """Refuse a limit no bucket could enforce here, naming the field, rather than fail later inside
        a comparison (``concurrency="4"``) or at the first reservation."""
        for name in ("requests_per_min", "tokens_per_min", "request_burst", "token_burst"):
            value = getattr(self, name)
            if value is None:
                continue
            if not is_real(value) or not (isfinite(value) and value > 0):
                raise QuotaConfigError(
                    f"QuotaLimits({name}=...): expected a finite number > 0 or None, got {value!r}"
                )
        if self.concurrency is not None and (
            isinstance(self.concurrency, bool)
            or not isinstance(self.concurrency, numbers.Integral)
            or self.concurrency < 1
        ):
            raise QuotaConfigError(
                f"QuotaLimits(concurrency=...): expected an integer >= 1 or None, got {self.concurrency!r}"
            )
        if self.requests_per_min is not None:
            burst = self.request_burst if self.request_burst is not None else self.requests_per_min
            if burst < 1:  # every attempt takes one request: a smaller bucket never grants one
                raise QuotaConfigError(
                    f"QuotaLimits: a request burst of {burst:g} (request_burst, else one minute of "
                    f"requests_per_min) can never grant a request, which takes 1; give at least 1"
                )


_TOKENLESS = (Reservation(requests=0.0, tokens=0.0, slots=1), Reservation(requests=1.0, tokens=0.0, slots=1))
"""What a quota without a token bucket grants, by whether it counts requests: the same every time,
so not built anew per call."""


class MultiQuota:
    """Requests, tokens and a concurrency slot, reserved all together or not at all.

    One ``try_reserve`` either takes from every dimension or from none, so two tasks can
    never each hold half of what they need. ``reconcile`` charges or refunds the difference
    between the estimated and the actual token count after the call.
    """

    # slots: every dispatch step reads these (see SimPyRuntime); an instance may take attributes too
    __slots__ = (
        "__dict__",
        "__weakref__",
        "concurrency",
        "in_flight",
        "limits",
        "paused_until",
        "requests",
        "tokens",
    )

    def __init__(self, limits: QuotaLimits, *, now: float = 0.0) -> None:
        self.limits = limits
        self.requests = _bucket(limits.requests_per_min, limits.request_burst, now)
        self.tokens = _bucket(limits.tokens_per_min, limits.token_burst, now)
        if limits.concurrency is not None and limits.concurrency < 1:
            raise QuotaConfigError(f"concurrency must be >= 1, got {limits.concurrency}")
        self.concurrency = limits.concurrency
        self.in_flight = 0
        self.paused_until = -inf

    @property
    def token_capacity(self) -> float | None:
        """The token bucket's capacity, ``None`` when tokens are unlimited: what a reported usage is
        bounded by (:func:`aiqsim.core.usage.usage_bound`; a quota without the attribute cost an
        AttributeError raised and caught on every successful call, 1% of an M/M/c customer)."""
        tokens = self.tokens
        return None if tokens is None else tokens.capacity

    def check_cost(self, tokens: float) -> None:
        """Raise :class:`QuotaConfigError` now if ``tokens`` could never be reserved."""
        if self.tokens is not None:
            self.tokens._check_cost(tokens)

    def can_reserve(self, tokens: float, now: float) -> bool:
        """Whether every dimension could grant one request of ``tokens`` at ``now``."""
        if now < self.paused_until:
            return False
        # each attribute read once: this runs for every request the dispatcher considers
        concurrency = self.concurrency
        if concurrency is not None and self.in_flight >= concurrency:
            return False
        requests = self.requests
        if requests is not None and not requests.can_acquire(1.0, now):
            return False
        bucket = self.tokens
        return bucket is None or bucket.can_acquire(tokens, now)

    def try_reserve(self, tokens: float, now: float) -> Reservation | None:
        """Take one request, ``tokens`` tokens and one slot, or nothing; None when not possible now."""
        if not self.can_reserve(tokens, now):
            return None
        # can_reserve has just refilled both buckets to ``now`` and found room: take it without
        # asking again (try_acquire would check the cost and refill a second time, to no effect)
        requests = self.requests
        if requests is not None:
            requests._take(1.0)
        self.in_flight += 1
        bucket = self.tokens
        if bucket is None:  # nothing in the grant varies: one shared value (records are values)
            return _TOKENLESS[requests is not None]
        bucket._take(tokens)
        # positional (requests, tokens, slots): one per granted attempt with a token bucket
        return _new_reservation(1.0 if requests is not None else 0.0, tokens, 1)

    def trial(self) -> MultiQuota:
        """A private copy to try reservations on: what it grants answers "would this start now?"
        (the depth limit's question) and nothing done to it reaches this quota. A copy, not
        reserve-then-cancel, so this quota's levels stay bit-for-bit what they were."""
        twin = MultiQuota.__new__(MultiQuota)
        twin.limits, twin.concurrency = self.limits, self.concurrency
        twin.requests = self.requests.copy() if self.requests is not None else None
        twin.tokens = self.tokens.copy() if self.tokens is not None else None
        twin.in_flight, twin.paused_until = self.in_flight, self.paused_until
        return twin

    def time_until(self, tokens: float, now: float) -> float:
        """Seconds until a reservation of ``tokens`` could succeed; ``inf`` while all slots are busy.

        A full concurrency pool only frees on a release, which the caller must wait for.
        """
        if self.concurrency is not None and self.in_flight >= self.concurrency:
            return inf
        wait = wait_until(self.paused_until, now)
        if self.requests is not None:
            wait = max(wait, self.requests.time_until(1.0, now))
        if self.tokens is not None:
            wait = max(wait, self.tokens.time_until(tokens, now))
        return wait

    def release(self, reservation: Reservation, now: float) -> None:
        """Free the concurrency slot of a finished attempt (buckets keep what was spent)."""
        slots = reservation.slots
        if slots:
            in_flight = self.in_flight
            if slots > in_flight:
                raise RuntimeError("MultiQuota released more slots than it reserved")
            self.in_flight = in_flight - slots

    def cancel(self, reservation: Reservation, now: float) -> None:
        """Undo a reservation that was never used: slot freed, request and tokens refunded."""
        self.release(reservation, now)
        if self.requests is not None:
            self.requests.refund(reservation.requests, now)
        if self.tokens is not None:
            self.tokens.refund(reservation.tokens, now)

    def reconcile(self, reservation: Reservation, actual_tokens: float, now: float) -> float:
        """Settle the token estimate against the actual usage; returns actual - estimate."""
        _check_amount("actual token", actual_tokens)
        difference = actual_tokens - reservation.tokens
        if self.tokens is not None:
            if difference > 0:
                self.tokens.charge(difference, now)
            elif difference < 0:
                self.tokens.refund(-difference, now)
        return difference

    def pause_until(self, until: float) -> None:
        """Let no reservation through before ``until`` (a 429's Retry-After applies to everyone)."""
        self.paused_until = max(self.paused_until, until)

    def levels(self, now: float) -> tuple[float, float, int]:
        """(request tokens, token tokens, in-flight) for observability; ``nan`` for unlimited buckets."""
        req = self.requests.level(now) if self.requests is not None else nan
        tok = self.tokens.level(now) if self.tokens is not None else nan
        return req, tok, self.in_flight


def _bucket(per_min: float | None, burst: float | None, now: float) -> TokenBucket | None:
    if per_min is None:
        return None
    if per_min <= 0:
        raise QuotaConfigError(f"a per-minute limit must be > 0, got {per_min!r}")
    return TokenBucket(capacity=burst if burst is not None else per_min, rate=per_min / 60.0, now=now)
