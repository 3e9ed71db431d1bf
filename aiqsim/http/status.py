"""HTTP status codes and error bodies mapped onto the aiqsim failure taxonomy (pure).

Shared by :class:`~aiqsim.http.httpx_provider.HttpProvider` (raw HTTP) and the
``openai`` SDK mapper (:mod:`aiqsim.http.openai_errors`), so both classify a response
the same way:

========================================  ==========================================
429 / 403 with a quota-exhausted body     :class:`QuotaExhaustedError` (fatal)
429                                       :class:`RateLimitError` with Retry-After and
                                          ``quota_spent`` (:func:`rate_limit_quota_spent`)
408                                       :class:`ProviderTimeoutError` (retryable)
409 (idempotent request still running)    :class:`ServerError` (retryable)
400, 404, 413, 422                        :class:`InvalidRequestError` (fatal)
503                                       :class:`ServerError` with Retry-After
                                          (RFC 9110 §10.2.3; urllib3 honours it too)
other 5xx                                 :class:`ServerError` (retryable)
other non-2xx (401, 403...)               :class:`HttpStatusError` (fatal)
========================================  ==========================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiqsim.core.failures import (
    InvalidRequestError,
    ProviderError,
    ProviderTimeoutError,
    QuotaExhaustedError,
    RateLimitError,
    ServerError,
)
from aiqsim.http.headers import header_value, parse_ratelimit_headers, retry_after_from_headers

QUOTA_EXHAUSTED_CODES = frozenset(
    {"insufficient_quota", "billing_hard_limit_reached", "quota_exceeded", "billing_not_active"}
)
"""``error.code`` / ``error.type`` values meaning the account's quota or credit is used up."""

QUOTA_EXHAUSTED_PHRASES = (
    "exceeded your current quota",
    "credit balance is too low",
    "insufficient credit",
    "insufficient_quota",
)
"""Message fragments with the same meaning, for providers that only say it in prose."""

RATE_QUOTA_SPENT_PHRASES = (
    "rate limit reached for",  # OpenAI: "Rate limit reached for gpt-4 ... on requests per min (RPM)"
    "would exceed your organization's rate limit",  # Anthropic
    "would exceed the rate limit",
    "quota exceeded",  # Google "Quota exceeded for quota metric ...", the local server's window
    "resource_exhausted",
    "resource has been exhausted",  # Google gRPC RESOURCE_EXHAUSTED
)
"""Fragments of a 429 body saying the account's rate-limit *window* is used up (so every request
of the provider would be refused until it resets), as opposed to one overloaded request. Hard
quota / credit exhaustion is recognised first by :func:`is_quota_exhausted` and is fatal."""

_RETRY_AFTER_STATUSES = frozenset({429, 503})
"""Statuses whose Retry-After is honoured (RFC 9110 §10.2.3 names 503 and 3xx; RFC 6585 429). 413
also may carry one (urllib3's ``RETRY_AFTER_STATUS_CODES``), but 413 here is fatal: the request
itself is too large, so waiting cannot help."""

_INVALID_STATUSES = frozenset({400, 404, 413, 422})
_MESSAGE_LIMIT = 300


class HttpStatusError(ProviderError):
    """A non-2xx status with no better class (401, 403, 405...): fatal, since retrying cannot fix it."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def error_object(body: Any) -> Mapping[str, Any] | None:
    """The ``{"message", "type", "code"}`` object of an OpenAI-style error body, if there is one.

    Accepts the full body (``{"error": {...}}``) or the inner object (what the SDK keeps as ``exc.body``).
    """
    if not isinstance(body, Mapping):
        return None
    inner = body.get("error")
    if isinstance(inner, Mapping):
        return inner
    if any(field in body for field in ("code", "type", "message")):
        return body
    return None


def error_message(body: Any) -> str:
    """A short human message from an error body (``""`` when there is none)."""
    error = error_object(body)
    if error is not None and error.get("message") is not None:
        message = str(error["message"])
    elif isinstance(body, str):
        message = body
    else:
        return ""
    return message if len(message) <= _MESSAGE_LIMIT else message[: _MESSAGE_LIMIT - 3] + "..."


def is_quota_exhausted(body: Any) -> bool:
    """Whether an error body says the account's quota or credit is exhausted (not a rate limit)."""
    error = error_object(body)
    if error is not None:
        for field in ("code", "type"):
            value = error.get(field)
            if isinstance(value, str) and value.lower() in QUOTA_EXHAUSTED_CODES:
                return True
    message = error_message(body).lower()
    return any(phrase in message for phrase in QUOTA_EXHAUSTED_PHRASES)


def says_rate_quota_spent(body: Any) -> bool:
    """Whether a 429 body explicitly says the rate-limit quota window is spent (see
    :data:`RATE_QUOTA_SPENT_PHRASES`); ``error.code``/``type`` are read as well as the message."""
    error = error_object(body)
    texts = [error_message(body)]
    if error is not None:
        texts.extend(str(error.get(field, "")) for field in ("code", "type", "status"))
    lowered = " ".join(texts).lower()
    return any(phrase in lowered for phrase in RATE_QUOTA_SPENT_PHRASES)


def rate_limit_quota_spent(headers: Mapping[str, Any] | Any, body: Any) -> bool | None:
    """What a 429 says about the account's quota, for ``RateLimitError.quota_spent`` (pure).

    - ``True``: ``x-ratelimit-remaining-requests`` or ``-tokens`` is 0 (below one whole unit),
      or the body explicitly says the quota window is spent (:func:`says_rate_quota_spent`);
      every request of this provider would be refused until the window resets.
    - ``False``: the server sent remaining counts and all of them are positive: quota remains,
      this 429 is about this one request (an overloaded replica, a burst limit).
    - ``None``: the server said neither.

    A "spent" signal wins over a positive one: one exhausted dimension (tokens) refuses every
    request even while another (requests) has room.
    """
    snapshot = parse_ratelimit_headers(headers)
    remaining = [
        value for value in (snapshot.remaining_requests, snapshot.remaining_tokens) if value is not None
    ]
    if any(value < 1 for value in remaining) or says_rate_quota_spent(body):
        return True
    if remaining:
        return False
    return None


def error_for_status(
    status: int,
    *,
    headers: Mapping[str, Any] | Any = None,
    body: Any = None,
    now_epoch_s: float = 0.0,
    time_scale: float = 1.0,
    source: str = "provider",
    request: str | None = None,
) -> ProviderError | None:
    """The failure for an HTTP ``status`` (``None`` for 2xx).

    ``body`` is the decoded JSON body (or text, or ``None``). ``now_epoch_s`` is the wall
    clock for an HTTP-date Retry-After. ``time_scale`` converts the server's wall seconds
    into the caller's scheduler seconds (``retry_after_s = wall / time_scale``), matching
    :class:`~aiqsim.runtime.AsyncioRuntime` run with the same scale. ``source`` names the
    provider in messages, ``request`` (``"POST https://..."``) the request that got this answer. A
    redirect (3xx) is a failure too: following it would send a billed POST again, so its message
    names the ``Location`` to put in ``base_url`` instead. A 429's and a 503's Retry-After
    (``retry-after-ms`` preferred) land in ``retry_after_s``; a 429 also says whether the quota is
    spent (:func:`rate_limit_quota_spent`).
    """
    if 200 <= status < 300:
        return None
    detail = error_message(body)
    if 300 <= status < 400:
        location = header_value(headers, "location")
        location = None if location is None else location[:_MESSAGE_LIMIT]
        detail = (
            f"a redirect{f' to {location}' if location else ''}, not followed (it would send the call "
            "again); point the provider's base_url at the address the server names"
        )
    message = f"{source}: HTTP {status}" + (f" from {request}" if request else "")
    message += f": {detail}" if detail else ""
    if status in (429, 403) and is_quota_exhausted(body):
        return QuotaExhaustedError(message)
    retry_after_s: float | None = None
    if status in _RETRY_AFTER_STATUSES:
        wall = retry_after_from_headers(headers, now_epoch_s)
        retry_after_s = None if wall is None else wall / time_scale
    if status == 429:
        return RateLimitError(
            message, retry_after_s=retry_after_s, quota_spent=rate_limit_quota_spent(headers, body)
        )
    if status == 408:
        return ProviderTimeoutError(message)
    if status == 409:
        return ServerError(message, status=status)
    if status in _INVALID_STATUSES:
        return InvalidRequestError(message)
    if status >= 500:
        return ServerError(message, status=status, retry_after_s=retry_after_s)
    return HttpStatusError(message, status=status)
