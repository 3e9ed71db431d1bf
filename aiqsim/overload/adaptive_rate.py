"""AWS SDK "adaptive" retry mode: a client send-rate limit that follows CUBIC.

Once a provider throttles (429), every attempt to it needs a token from a client-side
bucket whose fill rate is the allowed send rate. On each throttle the rate drops to
``beta`` (0.7) times the measured send rate; after it, the rate climbs back along the
CUBIC curve (RFC 8312, as in TCP CUBIC)

    W(t) = C·(t − K)³ + W_max,     K = (W_max·(1 − β) / C)^(1/3)

where ``t`` is the time since the last throttle, ``W_max`` the rate at that throttle and
C = 0.4: concave back up to ``W_max`` (reached at ``t = K``), then convex beyond it to probe
for more. Every response also caps the rate at twice the measured send rate.

The arithmetic follows botocore exactly (``botocore/retries/throttling.py``
``CubicCalculator``: ``_SCALE_CONSTANT = 0.4``, ``_BETA = 0.7``; ``botocore/retries/
adaptive.py`` ``ClientRateLimiter`` (``_MAX_RATE_ADJUST_SCALE = 2.0``, limiter enabled on
the first throttle, ``rate_to_use = min(measured, bucket rate)`` once enabled) and
``RateClocker`` (0.5 s buckets, smoothing 0.8); ``botocore/retries/bucket.py``
``TokenBucket`` (``_MIN_RATE = 0.5``, capacity ``max(rate, 1)``, starts empty at rate 1)),
described in "Retry behavior", AWS SDKs and Tools Reference Guide
(https://docs.aws.amazon.com/sdkref/latest/guide/feature-retry-behavior.html): adaptive
mode "can delay initial request". The per-provider state starts at the first attempt the
gate sees (botocore: at client creation).

As an :class:`~aiqsim.scheduler.retry.AttemptGate` the limiter can only refuse an attempt
when no token is available, which fails the task; AWS adaptive mode *waits* instead. The
gate therefore also answers ``seconds_until_attempt`` (see :mod:`aiqsim.overload.gate`):
a scheduler that sleeps that long before ``before_attempt`` never sees a refusal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import FailureClass
from aiqsim.core.numeric import is_positive_finite
from aiqsim.core.token_bucket import refill_wait
from aiqsim.overload.gate import OverloadGate
from aiqsim.overload.signals import ErrorPredicate, is_rate_limited

if TYPE_CHECKING:
    from random import Random  # the injected generator's type; no randomness is imported

CUBIC_SCALE_CONSTANT = 0.4
"""C: how fast the cubic curve moves away from W_max (botocore ``_SCALE_CONSTANT``)."""
CUBIC_BETA = 0.7
"""β: the multiplicative decrease on a throttle (botocore ``_BETA``)."""
MIN_SEND_RATE = 0.5
"""The send rate never drops below this many requests per second (botocore ``_MIN_RATE``)."""
MAX_RATE_ADJUST_SCALE = 2.0
"""The send rate is capped at this multiple of the measured rate (botocore ``_MAX_RATE_ADJUST_SCALE``)."""
RATE_SMOOTHING = 0.8
"""Weight of the newest bucket in the measured rate (botocore ``_DEFAULT_SMOOTHING``)."""
RATE_BUCKET_S = 0.5
"""Width of the measured-rate time buckets (botocore ``_TIME_BUCKET_RANGE``)."""
INITIAL_SEND_RATE = 1.0
"""The token bucket's rate before the first throttle (botocore ``TokenBucket(max_rate=1)``)."""

_TOKEN_EPSILON = 1e-9
"""A level this close to a whole token counts as one (float error after an exact wait)."""


def cubic_zero_point(
    w_max: float, *, beta: float = CUBIC_BETA, scale_constant: float = CUBIC_SCALE_CONSTANT
) -> float:
    """K = (W_max·(1 − β) / C)^(1/3): seconds after a throttle at which the curve is back at W_max."""
    return (w_max * (1 - beta) / scale_constant) ** (1 / 3)


def cubic_rate(
    seconds_since_throttle: float, w_max: float, k: float, *, scale_constant: float = CUBIC_SCALE_CONSTANT
) -> float:
    """W(t) = C·(t − K)³ + W_max: the CUBIC send rate ``t`` seconds after the last throttle."""
    return scale_constant * (seconds_since_throttle - k) ** 3 + w_max


@dataclass(frozen=True, slots=True)
class CubicParams:
    """The CUBIC curve in force: peak rate ``w_max``, zero point ``k``, time of the last throttle."""

    w_max: float
    k: float
    last_throttle: float


class CubicRateCurve:
    """The CUBIC rate calculator (botocore ``CubicCalculator``)."""

    __slots__ = ("_k", "_last_throttle", "_w_max", "beta", "scale_constant")

    def __init__(
        self,
        w_max: float = 0.0,
        start_time: float = 0.0,
        *,
        beta: float = CUBIC_BETA,
        scale_constant: float = CUBIC_SCALE_CONSTANT,
    ) -> None:
        if not 0 < beta < 1:
            raise ConfigurationError(f"beta must be in (0, 1), got {beta!r}")
        if not is_positive_finite(scale_constant):
            raise ConfigurationError(f"scale_constant must be a finite number > 0, got {scale_constant!r}")
        self.beta = beta
        self.scale_constant = scale_constant
        self._w_max = w_max
        self._k = cubic_zero_point(w_max, beta=beta, scale_constant=scale_constant)
        self._last_throttle = start_time

    @property
    def params(self) -> CubicParams:
        return CubicParams(w_max=self._w_max, k=self._k, last_throttle=self._last_throttle)

    def rate_after_success(self, now: float) -> float:
        """The curve's rate at ``now`` (a non-throttled response does not change the curve)."""
        return cubic_rate(now - self._last_throttle, self._w_max, self._k, scale_constant=self.scale_constant)

    def rate_after_throttle(self, current_rate: float, now: float) -> float:
        """Restart the curve at a throttle seen while sending at ``current_rate``; return β × that rate."""
        self._w_max = current_rate
        self._k = cubic_zero_point(current_rate, beta=self.beta, scale_constant=self.scale_constant)
        self._last_throttle = now
        return current_rate * self.beta


class SendRateMeter:
    """Smoothed responses-per-second (botocore ``RateClocker``).

    Responses are counted into ``bucket_s``-wide time buckets; when a response lands in a
    later bucket than the last update, the rate over the elapsed buckets is blended in:
    ``measured = smoothing × count / elapsed + (1 − smoothing) × measured``. The first
    bucket boundary is ``floor(start)`` (whole seconds, as botocore does).
    """

    __slots__ = ("_bucket_scale", "_count", "_last_bucket", "measured_rate", "smoothing")

    def __init__(
        self, start: float, *, smoothing: float = RATE_SMOOTHING, bucket_s: float = RATE_BUCKET_S
    ) -> None:
        if not 0 < smoothing <= 1:
            raise ConfigurationError(f"smoothing must be in (0, 1], got {smoothing!r}")
        if not is_positive_finite(bucket_s):  # inf made every record() divide by zero
            raise ConfigurationError(f"bucket_s must be a finite number of seconds > 0, got {bucket_s!r}")
        self.smoothing = smoothing
        self._bucket_scale = 1 / bucket_s
        self._last_bucket = float(math.floor(start))
        self._count = 0
        self.measured_rate = 0.0

    def record(self, now: float, amount: int = 1) -> float:
        """Count ``amount`` responses at ``now``; return the measured rate."""
        bucket = math.floor(now * self._bucket_scale) / self._bucket_scale
        self._count += amount
        if bucket > self._last_bucket:
            current_rate = self._count / (bucket - self._last_bucket)
            self.measured_rate = current_rate * self.smoothing + self.measured_rate * (1 - self.smoothing)
            self._count = 0
            self._last_bucket = bucket
        return self.measured_rate


class SendTokenBucket:
    """The client send bucket (botocore ``bucket.TokenBucket``): one token per attempt.

    Fill rate ``max(max_rate, min_rate)``, capacity ``max(max_rate, 1)``; it starts empty.
    Changing the rate first refills at the old rate, then clips the level to the new capacity.
    """

    __slots__ = ("_level", "_updated", "fill_rate", "max_capacity", "min_rate", "requested_rate")

    def __init__(self, max_rate: float, now: float, *, min_rate: float = MIN_SEND_RATE) -> None:
        if not is_positive_finite(min_rate):
            raise ConfigurationError(f"min_rate must be a finite number > 0, got {min_rate!r}")
        self.min_rate = min_rate
        self._level = 0.0
        self._updated = now
        self.fill_rate = max(max_rate, min_rate)
        self.max_capacity = max(max_rate, 1.0)
        self.requested_rate = max_rate

    def _refill(self, now: float) -> None:
        if now > self._updated:
            self._level = min(self.max_capacity, self._level + (now - self._updated) * self.fill_rate)
            self._updated = now

    def set_max_rate(self, max_rate: float, now: float) -> None:
        """Change the send rate at ``now`` (tokens due at the old rate are credited first)."""
        self._refill(now)
        self.requested_rate = max_rate
        self.fill_rate = max(max_rate, self.min_rate)
        self.max_capacity = max_rate if max_rate >= 1 else 1.0
        self._level = min(self._level, self.max_capacity)

    def level(self, now: float) -> float:
        """Tokens available at ``now``."""
        self._refill(now)
        return self._level

    def seconds_until_token(self, now: float) -> float:
        """How long until one token is available (0 if it is)."""
        missing = 1.0 - self.level(now)
        return 0.0 if missing <= _TOKEN_EPSILON else refill_wait(missing, self.fill_rate, now)

    def try_take(self, now: float) -> bool:
        """Take one token if available."""
        if self.seconds_until_token(now) > 0:
            return False
        self._level -= 1.0
        return True

    def give_back(self, now: float) -> None:
        """Return one token taken for an attempt that was not sent."""
        self._refill(now)
        self._level = min(self.max_capacity, self._level + 1.0)


class AdaptiveSendRate:
    """One provider's adaptive client rate limiter (botocore ``ClientRateLimiter``).

    Disabled (no limit) until the first throttled response; from then on every send takes
    a token. Each response updates the send rate: CUBIC's rate at ``now`` (not throttled)
    or β × ``min(measured, current rate)`` (throttled), then capped at
    ``max_rate_adjust_scale`` × the measured response rate.
    """

    def __init__(
        self,
        start: float,
        *,
        beta: float = CUBIC_BETA,
        scale_constant: float = CUBIC_SCALE_CONSTANT,
        min_rate: float = MIN_SEND_RATE,
        max_rate_adjust_scale: float = MAX_RATE_ADJUST_SCALE,
        smoothing: float = RATE_SMOOTHING,
        bucket_s: float = RATE_BUCKET_S,
    ) -> None:
        if not is_positive_finite(max_rate_adjust_scale):
            raise ConfigurationError(
                f"max_rate_adjust_scale must be a finite number > 0, got {max_rate_adjust_scale!r}"
            )
        self.curve = CubicRateCurve(0.0, start, beta=beta, scale_constant=scale_constant)
        self.meter = SendRateMeter(start, smoothing=smoothing, bucket_s=bucket_s)
        self.bucket = SendTokenBucket(INITIAL_SEND_RATE, start, min_rate=min_rate)
        self.max_rate_adjust_scale = max_rate_adjust_scale
        self.enabled = False

    @property
    def send_rate(self) -> float:
        """The allowed sends per second (the bucket's fill rate; enforced only once enabled)."""
        return self.bucket.fill_rate

    def time_until_send(self, now: float) -> float:
        """Seconds until an attempt may be sent (0 while disabled or a token is available)."""
        if not self.enabled:
            return 0.0
        return self.bucket.seconds_until_token(now)

    def try_send(self, now: float) -> bool:
        """Take a send token if one is needed and available; whether the attempt may go."""
        return not self.enabled or self.bucket.try_take(now)

    def record_response(self, throttled: bool, now: float) -> float:
        """Update the send rate for a response at ``now``; return the new bucket rate request."""
        measured = self.meter.record(now)
        if throttled:
            rate_to_use = min(measured, self.bucket.fill_rate) if self.enabled else measured
            new_rate = self.curve.rate_after_throttle(rate_to_use, now)
            self.enabled = True
        else:
            new_rate = self.curve.rate_after_success(now)
        capped = min(new_rate, self.max_rate_adjust_scale * measured)
        self.bucket.set_max_rate(capped, now)
        return capped


class AdaptiveRateLimiter(OverloadGate):
    """AWS SDK adaptive mode as a gate: one :class:`AdaptiveSendRate` per provider.

    ``before_attempt`` takes a send token (once the provider has throttled) or refuses
    ("client send rate exceeded"); ``seconds_until_attempt`` says how long to wait for
    one, for schedulers that delay rather than fail. Every outcome feeds the rate:
    ``is_throttle`` (429 by default) marks the throttled ones. A token taken for an attempt
    that a later gate refused is given back.
    """

    def __init__(
        self,
        *,
        beta: float = CUBIC_BETA,
        scale_constant: float = CUBIC_SCALE_CONSTANT,
        min_rate: float = MIN_SEND_RATE,
        max_rate_adjust_scale: float = MAX_RATE_ADJUST_SCALE,
        smoothing: float = RATE_SMOOTHING,
        bucket_s: float = RATE_BUCKET_S,
        is_throttle: ErrorPredicate = is_rate_limited,
    ) -> None:
        self._settings = {
            "beta": beta,
            "scale_constant": scale_constant,
            "min_rate": min_rate,
            "max_rate_adjust_scale": max_rate_adjust_scale,
            "smoothing": smoothing,
            "bucket_s": bucket_s,
        }
        # every setting checked now, as a limiter checks it, not at the first attempt of every task
        AdaptiveSendRate(0.0, **self._settings)
        self.is_throttle = is_throttle
        self._limiters: dict[str, AdaptiveSendRate] = {}
        self._took_token: dict[str, bool] = {}

    def limiter(self, provider: str, now: float) -> AdaptiveSendRate:
        """``provider``'s limiter (created at ``now`` on first use)."""
        limiter = self._limiters.get(provider)
        if limiter is None:
            limiter = self._limiters[provider] = AdaptiveSendRate(now, **self._settings)
        return limiter

    def time_until_send(self, provider: str, now: float) -> float:
        """Seconds until an attempt to ``provider`` may be sent."""
        return self.limiter(provider, now).time_until_send(now)

    def seconds_until_attempt(self, provider: str, is_retry: bool, now: float) -> float:
        return self.time_until_send(provider, now)

    def before_attempt(
        self,
        provider: str,
        is_retry: bool,
        now: float,
        rng: Random,
        *,
        task_id: str | None = None,
        cause: BaseException | None = None,
    ) -> str | None:
        limiter = self.limiter(provider, now)
        self._took_token[provider] = False
        if not limiter.enabled:
            return None
        if not limiter.try_send(now):
            return (
                f"client send rate for {provider!r} exceeded ({limiter.send_rate:.3g}/s after throttling); "
                f"next send token in {limiter.time_until_send(now):.3g} s"
            )
        self._took_token[provider] = True
        return None

    def after_attempt(
        self,
        provider: str,
        is_retry: bool,
        failure: FailureClass | None,
        error: BaseException | None,
        now: float,
        *,
        task_id: str | None = None,
    ) -> None:
        throttled = failure is not None and error is not None and self.is_throttle(error)
        self.limiter(provider, now).record_response(throttled, now)

    def attempt_abandoned(
        self, provider: str, is_retry: bool, sent: bool, now: float, *, task_id: str | None = None
    ) -> None:
        """Give back the token of an attempt refused by a later gate (same step as its admission)."""
        if not sent and self._took_token.get(provider, False):
            self._took_token[provider] = False
            self.limiter(provider, now).bucket.give_back(now)
