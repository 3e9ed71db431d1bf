"""Rate-limit response headers: parse them (pure) and let them correct a client-side quota.

OpenAI (and Groq, Mistral, Azure OpenAI and others copying it) sends, on every response::

    x-ratelimit-limit-requests: 500        x-ratelimit-limit-tokens: 30000
    x-ratelimit-remaining-requests: 499    x-ratelimit-remaining-tokens: 29000
    x-ratelimit-reset-requests: 120ms      x-ratelimit-reset-tokens: 6m0s

The reset values are Go durations ("1s", "6m0s", "250ms", "1h2m3.5s"). The server knows
how much of *its* quota is left, so :func:`apply_ratelimit_snapshot` corrects our local
token-bucket estimate with it, but only downwards (:func:`corrected_level`): the client's own
limits (``requests_per_min``, bursts) are a promise of the client's, and a server with more
room must never raise them. A server reporting a fuller quota than ours would otherwise refill
our bucket on every response and ``requests_per_min`` would stop limiting.

Everything here is pure: no clock, no I/O. Durations are returned in the server's
(wall-clock) seconds; callers running in scaled time convert.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.ratelimit import RateLimitSnapshot
from aiqsim.core.retry_after import MAX_DELTA_SECONDS, delta_seconds, parse_retry_after, parse_retry_after_ms
from aiqsim.core.token_bucket import MultiQuota
from aiqsim.scheduler.retry import DEFAULT_MAX_RETRY_AFTER_S

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
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")  # ASCII digits only


def parse_duration(value: str | float | int | None) -> float | None:
    """Seconds in a Go-style duration (``"6m0s"``, ``"250ms"``, ``"1h2m3.5s"``) or a bare number of seconds.

    The syntax is Go's ``time.ParseDuration``: an optional sign, then one or more decimal numbers
    each with a unit (``ns``, ``us``/``µs``/``μs``, ``ms``, ``s``, ``m``, ``h``). Returns ``None``
    for anything absent, negative (``"-0s"`` is zero) or unparseable, so a provider that changes
    its format degrades to "no information" instead of an exception. Longer than 2**31 s gives
    2**31 s (:data:`~aiqsim.core.retry_after.MAX_DELTA_SECONDS`), where Go reports an overflow.
    """
    if value is None:
        return None
    try:
        return delta_seconds(value)
    except ValueError:
        pass
    text = value.strip()  # type: ignore[union-attr]  # numbers were handled above
    negative = text[:1] == "-"
    if text[:1] in ("+", "-"):
        text = text[1:]
        if text == "0":  # Go's one unitless duration, signed
            return 0.0
    total = 0.0
    position = 0
    for match in _DURATION_PART.finditer(text):
        if match.start() != position:
            return None
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        position = match.end()
    if position == 0 or position != len(text):
        return None
    if negative and total > 0:
        return None  # a reset in the past says nothing about the quota
    return min(total, MAX_DELTA_SECONDS)  # "99...9h" is far in the future, as for Retry-After


def format_duration(seconds: float) -> str:
    """The Go-style duration OpenAI would send for ``seconds`` (inverse of :func:`parse_duration`).

    Under one second it is whole milliseconds (``"250ms"``; 1.5 ms is ``"2ms"``); above, hours, minutes
    and seconds (``"6m0s"``, ``"1h0m2.5s"``). Sub-millisecond remainders are rounded up so
    a client never reads a reset earlier than the server meant.
    """
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigurationError(f"duration must be finite and >= 0, got {seconds!r}")
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


_HEADER_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_TEXT = re.compile(r"[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*")
HASHED_KEY_PREFIX = "sha256:"
"""How :func:`idempotency_header_value` marks a key it had to send as its SHA-256."""


def header_problem(name: object, value: object) -> str | None:
    """Why ``name: value`` cannot be sent as an HTTP header (``None`` when it can).

    HTTP/1.1 field values are visible ASCII with inner spaces (RFC 9110 §5.5); httpx refuses
    anything else only when the request is sent, where it looked like a failed connection."""
    if not isinstance(name, str) or not _HEADER_TOKEN.fullmatch(name):
        return f"header name {name!r} is not an HTTP token"
    if not isinstance(value, str):
        return f"header {name!r} has a {type(value).__name__} value, not text: {value!r}"
    if value and not _HEADER_TEXT.fullmatch(value):
        return (
            f"header {name!r} value {value!r} is not sendable: visible ASCII with inner spaces only "
            "(no control characters, no leading or trailing space, no non-ASCII letters)"
        )
    return None


def idempotency_header_value(key: str) -> str:
    """The ``Idempotency-Key`` header value that stands for ``key``: the key itself when HTTP can
    carry it (fingerprints always can), else ``sha256:`` and the hex SHA-256 of its UTF-8 bytes.

    A key is any text (``submit(key=...)``): ``"café-42"`` or one with a line break cannot be a
    header value, and sending it failed every attempt. The same key always gives the same value,
    and different keys different ones (a key that itself starts with ``sha256:`` is hashed too),
    so the server still runs each key once; lookups use this value as well."""
    if _HEADER_TEXT.fullmatch(key) and not key.startswith(HASHED_KEY_PREFIX):
        return key
    return HASHED_KEY_PREFIX + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


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


_DAY_NAME = re.compile(r"(mon|tue|wed|thu|fri|sat|sun)[a-z]*", re.IGNORECASE)


_JOINED = re.compile(r",[ \t]+")
"""Where lines a client joined meet: a comma and a space (httpx, urllib3 and aiohttp join with
``", "``); a comma alone is part of a value (``"1,000"``)."""


def _list_items(line: str) -> list[str]:
    """The items of a header line that a client joined from several; a day name (``Wed,`` of an HTTP
    date, which holds a comma itself) stays with what follows it."""
    items: list[str] = []
    for piece in _JOINED.split(line):
        if items and _DAY_NAME.fullmatch(items[-1].strip()):
            items[-1] = f"{items[-1]}, {piece}"
        else:
            items.append(piece)
    return items


def _field_lines(headers: Mapping[str, Any] | Any, name: str) -> list[str]:
    """Each value of header ``name``, one per field line where the mapping keeps them apart
    (``httpx.Headers.get_list``, a multidict's ``getall``), else the one value it gives."""
    for method in ("get_list", "getall"):
        getter = getattr(headers, method, None)
        if getter is not None:
            try:
                lines = getter(name)
            except (KeyError, TypeError):
                continue
            return [str(line) for line in lines]
    value = header_value(headers, name)
    return [] if value is None else [value]


def _each_value(
    headers: Mapping[str, Any] | Any, name: str, parse: Callable[[str], float | None]
) -> list[float]:
    """Every value of a header that arrived more than once (an origin's and a proxy's), parsed.

    A mapping that joins duplicates gives ``"7, 7"``, which no single-value grammar reads: a line
    that does not parse whole is read as a comma-separated list (dates split after ``GMT``, since
    a date holds a comma itself), and only if every item parses (``"1,000"`` is no list).
    Values that do not parse are left out."""
    parsed = []
    for line in _field_lines(headers, name):
        value = parse(line)
        if value is not None:
            parsed.append(value)
            continue
        parts = [parse(part) for part in _list_items(line)]
        if len(parts) > 1 and None not in parts:  # "1,000" is no list of two values
            parsed.extend(parts)  # type: ignore[arg-type]
    return parsed


def differing_echo(headers: Mapping[str, Any] | Any, name: str, sent: str) -> str | None:
    """The echo of header ``name`` when one of its values is not ``sent``; ``None`` when every value
    is (or none came).

    An origin and a proxy that both echo a value send two field lines, which httpx joins as
    ``"k, k"``: read value by value, as :func:`retry_after_from_headers` reads Retry-After, that
    answer echoes ``sent`` twice and is accepted. A line equal to ``sent`` whole is one value
    (``sent`` may hold ``", "`` itself)."""
    for line in _field_lines(headers, name):
        if line != sent and any(item != sent for item in _JOINED.split(line)):
            return ", ".join(_field_lines(headers, name))
    return None


def _cautious(values: list[float], pick: Callable[[list[float]], float]) -> float | None:
    return pick(values) if values else None


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse_ratelimit_headers(headers: Mapping[str, Any] | Any) -> RateLimitSnapshot:
    """Read OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` headers.

    A header that arrived more than once (an origin's and a proxy's) is read value by value, and
    the cautious one wins: the smallest limit and remaining, the longest reset."""

    def number(name: str) -> float | None:
        return _cautious(_each_value(headers, name, _number), min)

    def duration(name: str) -> float | None:
        return _cautious(_each_value(headers, name, parse_duration), max)

    return RateLimitSnapshot(
        limit_requests=number("x-ratelimit-limit-requests"),
        remaining_requests=number("x-ratelimit-remaining-requests"),
        reset_requests_s=duration("x-ratelimit-reset-requests"),
        limit_tokens=number("x-ratelimit-limit-tokens"),
        remaining_tokens=number("x-ratelimit-remaining-tokens"),
        reset_tokens_s=duration("x-ratelimit-reset-tokens"),
    )


def corrected_level(
    local_level: float,
    remaining: float | None,
    reset_s: float | None,
    rate: float,
    *,
    limit: float | None = None,
    unit: float = 1.0,
    longest_wait_s: float | None = None,
) -> float:
    """The client bucket's level after the server reported ``remaining`` units left (pure).

    The rule: server headers may only *lower* what the client believes it may send.

    - The level becomes ``min(local_level, remaining)``: never more than the client's own
      level, whatever the server says (a negative ``remaining`` counts as 0).
    - When the server says the dimension is spent (``remaining < unit``: not even one request,
      or one token, left) and when it resets (``reset_s``, already in the bucket's seconds),
      the bucket is set back (into debt) so that, refilling at its own ``rate``, it reaches
      ``unit`` no earlier than the server will have ``unit`` again. OpenAI's reset is the time
      until the quota is back to ``limit``; the server is taken to refill linearly over it, so
      one unit is back after ``reset_s x (unit - remaining) / (limit - remaining)``; without
      ``limit``, after the whole ``reset_s`` (the cautious reading). Without this, a client
      whose own rate is faster than the server's refill asks again too early and meets a 429.
    - ``remaining`` ``None`` (the header was absent or unreadable): ``local_level`` unchanged.
    - ``longest_wait_s`` bounds that wait, as ``RetryPolicy.max_retry_after_s`` bounds a
      Retry-After (a reset is one by another name): a reset of years, a server's bug or a spent
      daily quota, would otherwise hold the lane for that long without a word; past the bound the
      lane asks again, and a 429 then says how long, under the retry policy's rules.

    The result is never above ``local_level``.
    """
    if remaining is None or not math.isfinite(remaining):
        return local_level
    level = min(local_level, max(0.0, remaining))
    if remaining < unit and reset_s is not None and math.isfinite(reset_s) and reset_s > 0:
        wait = reset_s
        if limit is not None and math.isfinite(limit) and limit > max(remaining, 0.0) + unit:
            wait = reset_s * (unit - max(remaining, 0.0)) / (limit - max(remaining, 0.0))
        if longest_wait_s is not None:
            wait = min(wait, longest_wait_s)
        level = min(level, unit - rate * wait)
    return level


def apply_ratelimit_snapshot(
    snapshot: RateLimitSnapshot,
    quota: MultiQuota,
    now: float,
    *,
    time_scale: float = 1.0,
    longest_wait_s: float | None = DEFAULT_MAX_RETRY_AFTER_S,
) -> bool:
    """Lower the quota's bucket levels to the server's remaining counts; True if any level fell.

    :func:`corrected_level` for each of requests and tokens: the server's count may lower an
    optimistic local bucket (we would otherwise run into 429s) and push its refill past the
    server's reset, but never raise a bucket: the client's ``requests_per_min`` and bursts stay
    the ceiling even when the server has more room. Unlimited local dimensions are left alone.
    ``time_scale`` (wall seconds per bucket second) converts the server's wall-clock reset
    durations into the bucket's clock. Requests of ours in flight are already taken from the
    local bucket and not yet counted by the server: the minimum keeps them counted.
    """
    changed = False
    for bucket, limit, remaining, reset_wall in (
        (quota.requests, snapshot.limit_requests, snapshot.remaining_requests, snapshot.reset_requests_s),
        (quota.tokens, snapshot.limit_tokens, snapshot.remaining_tokens, snapshot.reset_tokens_s),
    ):
        if bucket is None or remaining is None:
            continue
        level = bucket.level(now)
        reset_s = None if reset_wall is None else reset_wall / time_scale
        corrected = corrected_level(
            level, remaining, reset_s, bucket.rate, limit=limit, longest_wait_s=longest_wait_s
        )
        if corrected < level:
            bucket.set_level(corrected, now)
            changed = True
    return changed


def retry_after_from_headers(headers: Mapping[str, Any] | Any, now_epoch_s: float) -> float | None:
    """Seconds to wait from ``retry-after-ms`` (preferred, sent by OpenAI/Azure) or ``Retry-After``.

    ``Retry-After`` may be delta-seconds or an HTTP date, measured against ``now_epoch_s``
    (Unix seconds, passed in to keep this pure). Both headers are read with delta-seconds' grammar
    and its 2**31 s ceiling (:mod:`aiqsim.core.retry_after`); an unparseable ``retry-after-ms``
    falls back to ``Retry-After``. A header that arrived more than once (an origin's and a
    proxy's; httpx joins them as ``"7, 7"``, which was read as no Retry-After at all) is read
    value by value, and the longest wait wins.
    """
    waited = _cautious(_each_value(headers, "retry-after-ms", parse_retry_after_ms), max)
    if waited is not None:
        return waited
    return _cautious(_each_value(headers, "retry-after", lambda v: parse_retry_after(v, now_epoch_s)), max)
