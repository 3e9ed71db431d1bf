"""Rate-limit response headers: parse them (pure) and let them correct a client-side quota.

OpenAI (and Groq, Mistral, Azure OpenAI and others copying it) sends, on every response::

    x-ratelimit-limit-requests: 500        x-ratelimit-limit-tokens: 30000
    x-ratelimit-remaining-requests: 499    x-ratelimit-remaining-tokens: 29000
    x-ratelimit-reset-requests: 120ms      x-ratelimit-reset-tokens: 6m0s

The reset values are Go durations ("1s", "6m0s", "250ms", "1h2m3.5s"). The server knows
how much of *its* quota is left, so its view beats our local token-bucket estimate:
:func:`apply_ratelimit_snapshot` overwrites the bucket levels with ``set_level``.

Everything here is pure: no clock, no I/O. Durations are returned in the server's
(wall-clock) seconds; callers running in scaled time convert.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from aiqsim.core.ratelimit import RateLimitSnapshot
from aiqsim.core.retry_after import delta_seconds, parse_retry_after
from aiqsim.core.token_bucket import MultiQuota

_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,  # U+00B5 MICRO SIGN, as Go prints it
    "μs": 1e-6,  # U+03BC GREEK SMALL LETTER MU, also accepted by Go
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(value: str | float | int | None) -> float | None:
    """Seconds in a Go-style duration (``"6m0s"``, ``"250ms"``, ``"1h2m3.5s"``) or a bare number of seconds.

    Returns ``None`` for anything absent, negative or unparseable, so a provider that
    changes its format degrades to "no information" instead of an exception.
    """
    if value is None:
        return None
    try:
        return delta_seconds(value)
    except ValueError:
        pass
    text = value.strip()  # type: ignore[union-attr]  # numbers were handled above
    total = 0.0
    position = 0
    for match in _DURATION_PART.finditer(text):
        if match.start() != position:
            return None
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        position = match.end()
    if position == 0 or position != len(text):
        return None
    return total


def format_duration(seconds: float) -> str:
    """The Go-style duration OpenAI would send for ``seconds`` (inverse of :func:`parse_duration`).

    Under one second it is milliseconds (``"250ms"``, ``"1.5ms"``); above, hours, minutes
    and seconds (``"6m0s"``, ``"1h0m2.5s"``). Sub-millisecond remainders are rounded up so
    a client never reads a reset earlier than the server meant.
    """
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"duration must be finite and >= 0, got {seconds!r}")
    millis = math.ceil(round(seconds * 1000.0, 6))
    if millis == 0:
        return "0s"
    if millis < 1000:
        return f"{millis}ms"
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def header_value(headers: Mapping[str, Any] | Any, name: str) -> str | None:
    """Header ``name`` from any mapping (``httpx.Headers``, a plain dict...), case-insensitively."""
    if headers is None:
        return None
    getter = getattr(headers, "get", None)
    if getter is not None:
        value = getter(name)
        if value is None and name.lower() != name:
            value = getter(name.lower())
        if value is not None:
            return str(value)
    items = getattr(headers, "items", None)
    if items is None:
        return None
    wanted = name.lower()
    for key, value in items():
        if str(key).lower() == wanted:
            return str(value)
    return None


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse_ratelimit_headers(headers: Mapping[str, Any] | Any) -> RateLimitSnapshot:
    """Read OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` headers."""
    return RateLimitSnapshot(
        limit_requests=_number(header_value(headers, "x-ratelimit-limit-requests")),
        remaining_requests=_number(header_value(headers, "x-ratelimit-remaining-requests")),
        reset_requests_s=parse_duration(header_value(headers, "x-ratelimit-reset-requests")),
        limit_tokens=_number(header_value(headers, "x-ratelimit-limit-tokens")),
        remaining_tokens=_number(header_value(headers, "x-ratelimit-remaining-tokens")),
        reset_tokens_s=parse_duration(header_value(headers, "x-ratelimit-reset-tokens")),
    )


def apply_ratelimit_snapshot(snapshot: RateLimitSnapshot, quota: MultiQuota, now: float) -> bool:
    """Overwrite the quota's bucket levels with the server's remaining counts; True if anything changed.

    The server's count wins in both directions: it lowers an optimistic local bucket (we
    would otherwise run into 429s) and raises a pessimistic one (work would otherwise wait
    for quota the server has). Unlimited local dimensions are left alone. Known limit: a
    request of ours still in flight that the server has not counted yet is forgotten by
    this correction, so with high concurrency the first request after a correction may
    still see a 429; the scheduler absorbs it with Retry-After.
    """
    changed = False
    if snapshot.remaining_requests is not None and quota.requests is not None:
        quota.requests.set_level(max(0.0, snapshot.remaining_requests), now)
        changed = True
    if snapshot.remaining_tokens is not None and quota.tokens is not None:
        quota.tokens.set_level(max(0.0, snapshot.remaining_tokens), now)
        changed = True
    return changed


def retry_after_from_headers(headers: Mapping[str, Any] | Any, now_epoch_s: float) -> float | None:
    """Seconds to wait from ``retry-after-ms`` (preferred, sent by OpenAI/Azure) or ``Retry-After``.

    ``Retry-After`` may be delta-seconds or an HTTP date, measured against ``now_epoch_s``
    (Unix seconds, passed in to keep this pure).
    """
    millis = _number(header_value(headers, "retry-after-ms"))
    if millis is not None and millis >= 0:
        return millis / 1000.0
    return parse_retry_after(header_value(headers, "retry-after"), now_epoch_s)
