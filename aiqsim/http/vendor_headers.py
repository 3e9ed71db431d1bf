"""Rate-limit headers in each vendor's dialect, read into one :class:`RateLimitSnapshot` (pure).

- OpenAI's dialect (OpenAI, Azure OpenAI, Groq, Mistral, DeepSeek, OpenRouter...):
  ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``, resets as Go durations
  (:func:`aiqsim.http.headers.parse_ratelimit_headers`).
- Anthropic's: ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}``,
  resets as RFC 3339 *instants* (``2025-10-25T12:00:00Z``: when the limit is fully replenished),
  turned into seconds from ``now_epoch_s``. The token dimension that reaches the snapshot is the
  tightest one (the smallest share of its limit left) of ``tokens`` (Anthropic's own "most
  restrictive limit"), ``input-tokens`` and ``output-tokens``: any one of them spent refuses every
  request.

Every value is read with its grammar; one that does not parse (a bad timestamp, ``NaN``, a
negative or absurd number) is left out, never raised: the answer is classified as if the header
were absent. A dimension whose *limit* is negative says "not limited here", not "spent": Azure
OpenAI's Responses API sends ``x-ratelimit-limit-tokens: -1``, ``x-ratelimit-remaining-tokens: -1``,
and reading that ``-1`` as "nothing left" emptied the token bucket on every answer and marked
every 429 as a spent quota. Such a dimension is dropped from the snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiqsim.core.ratelimit import RateLimitSnapshot
from aiqsim.core.rfc3339 import seconds_until
from aiqsim.http.headers import _cautious, _each_value, _field_lines, _number, parse_ratelimit_headers
from aiqsim.http.profiles import AUTO, ProviderProfile

ANTHROPIC_PREFIX = "anthropic-ratelimit-"
OPENAI_PREFIX = "x-ratelimit-"
ANTHROPIC_TOKEN_DIMENSIONS = ("tokens", "input-tokens", "output-tokens")


_Dimension = tuple[float | None, float | None, float | None]
"""One rate-limit dimension as read: ``(limit, remaining, reset_s)``."""


def _header_names(headers: Mapping[str, Any] | Any) -> list[str]:
    if headers is None:
        return []
    keys = getattr(headers, "keys", None)
    if keys is None:
        return []
    return [str(name).lower() for name in keys()]


def detect_dialect(headers: Mapping[str, Any] | Any) -> str:
    """``"anthropic"`` when the response carries ``anthropic-ratelimit-*`` headers, ``"openai"`` for
    ``x-ratelimit-*``, ``"none"`` for neither (Anthropic's win when both are there: they are
    specific to one vendor, ``x-ratelimit-*`` is shared by many, a proxy's among them)."""
    names = _header_names(headers)
    if any(name.startswith(ANTHROPIC_PREFIX) for name in names):
        return "anthropic"
    if any(name.startswith(OPENAI_PREFIX) for name in names):
        return "openai"
    return "none"


def _anthropic_dimension(headers: Mapping[str, Any] | Any, dimension: str, now_epoch_s: float) -> _Dimension:
    base = ANTHROPIC_PREFIX + dimension
    limit = _cautious(_each_value(headers, base + "-limit", _number), min)
    remaining = _cautious(_each_value(headers, base + "-remaining", _number), min)
    resets = [
        wait
        for line in _field_lines(headers, base + "-reset")
        if (wait := seconds_until(line, now_epoch_s)) is not None
    ]
    return limit, remaining, _cautious(resets, max)


def _share_left(dimension: _Dimension) -> float:
    limit, remaining, _ = dimension
    if remaining is None:
        return float("inf")
    if limit is not None and limit > 0:
        return remaining / limit
    return remaining


def parse_anthropic_headers(headers: Mapping[str, Any] | Any, now_epoch_s: float) -> RateLimitSnapshot:
    """Anthropic's ``anthropic-ratelimit-*`` headers as a snapshot; resets in seconds from
    ``now_epoch_s`` (Unix seconds, the wall clock, passed in: this stays pure)."""
    requests = _anthropic_dimension(headers, "requests", now_epoch_s)
    tokens = min(
        (_anthropic_dimension(headers, dimension, now_epoch_s) for dimension in ANTHROPIC_TOKEN_DIMENSIONS),
        key=_share_left,
    )
    return _snapshot(requests, tokens)


def _snapshot(requests: _Dimension, tokens: _Dimension) -> RateLimitSnapshot:
    """A snapshot of two ``(limit, remaining, reset_s)`` dimensions: requests and tokens."""
    return RateLimitSnapshot(
        limit_requests=requests[0],
        remaining_requests=requests[1],
        reset_requests_s=requests[2],
        limit_tokens=tokens[0],
        remaining_tokens=tokens[1],
        reset_tokens_s=tokens[2],
    )


EMPTY = RateLimitSnapshot()


def without_unlimited(snapshot: RateLimitSnapshot) -> RateLimitSnapshot:
    """``snapshot`` with each dimension whose limit is negative (a "no limit" sentinel) dropped."""
    requests = (snapshot.limit_requests, snapshot.remaining_requests, snapshot.reset_requests_s)
    tokens = (snapshot.limit_tokens, snapshot.remaining_tokens, snapshot.reset_tokens_s)
    if not any(limit is not None and limit < 0 for limit in (requests[0], tokens[0])):
        return snapshot
    if requests[0] is not None and requests[0] < 0:
        requests = (None, None, None)
    if tokens[0] is not None and tokens[0] < 0:
        tokens = (None, None, None)
    return _snapshot(requests, tokens)


def profile_snapshot(
    headers: Mapping[str, Any] | Any, now_epoch_s: float, profile: ProviderProfile = AUTO
) -> RateLimitSnapshot:
    """The rate-limit headers of one response, read in ``profile``'s dialect (``"auto"``: the
    dialect the header names show, :func:`detect_dialect`)."""
    dialect = profile.ratelimit_dialect
    if dialect == "auto":
        dialect = detect_dialect(headers)
    if dialect == "openai":
        return without_unlimited(parse_ratelimit_headers(headers))
    if dialect == "anthropic":
        return without_unlimited(parse_anthropic_headers(headers, now_epoch_s))
    return EMPTY
