"""HTTP status codes and error bodies mapped onto the aiqsim failure taxonomy (pure).

Shared by :class:`~aiqsim.http.httpx_provider.HttpProvider` (raw HTTP) and the
``openai`` SDK mapper (:mod:`aiqsim.http.openai_errors`), so both classify a response
the same way:

========================================  ==========================================
402 (Anthropic, DeepSeek, OpenRouter)     :class:`QuotaExhaustedError` (fatal)
400 / 403 / 429 with a quota-exhausted    :class:`QuotaExhaustedError` (fatal): spent
body (codes, ``error.details.error_code``, credit, a spend cap, a per-day Google quota
prose; Google: a per-day QuotaFailure)
429                                       :class:`RateLimitError` with Retry-After (or
                                          Google's ``retryDelay``) and ``quota_spent``
                                          (:func:`rate_limit_quota_spent`)
498 (Groq ``capacity_exceeded``)          :class:`ServerError` (retryable, Retry-After)
408                                       :class:`ProviderTimeoutError` (retryable)
409 (idempotent request still running)    :class:`ServerError` (retryable)
400, 404, 413, 422                        :class:`InvalidRequestError` (fatal)
503, 529 (Anthropic ``overloaded_error``) :class:`ServerError` with Retry-After
                                          (RFC 9110 §10.2.3; urllib3 honours it too)
other 5xx                                 :class:`ServerError` (retryable)
other non-2xx (401, 403...)               :class:`HttpStatusError` (fatal)
2xx with an ``error`` object (OpenRouter) classified by its ``error.code``
========================================  ==========================================

Which of these rules apply is a :class:`~aiqsim.http.profiles.ProviderProfile`'s choice; the
default (``"auto"``) applies every vendor's.
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
from aiqsim.core.ratelimit import RateLimitSnapshot
from aiqsim.http.error_bodies import (
    error_codes,
    error_in_success,
    google_daily_quota,
    google_retry_delay_s,
    is_google_status,
)
from aiqsim.http.headers import header_value, retry_after_from_headers
from aiqsim.http.profiles import AUTO, ProviderProfile
from aiqsim.http.vendor_headers import profile_snapshot

QUOTA_EXHAUSTED_CODES = AUTO.quota_codes
"""``error.code`` / ``error.type`` / ``error.details.error_code`` values meaning the account's quota,
credit or spend cap is used up (every vendor's: :mod:`aiqsim.http.profiles`)."""

QUOTA_EXHAUSTED_PHRASES = AUTO.quota_phrases
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

_INVALID_STATUSES = frozenset({400, 404, 413, 422})
_QUOTA_STATUSES = frozenset({400, 403, 429})
"""Statuses whose body may say the credit or a spend cap is spent: 429 and 403 (OpenAI, Google)
and 400 (Anthropic's "You have reached your specified API usage limits", "Your credit balance is
too low")."""
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


def is_quota_exhausted(body: Any, profile: ProviderProfile = AUTO) -> bool:
    """Whether an error body says the account's quota, credit or spend cap is exhausted (not a rate
    limit), by ``profile``'s codes and phrases (:mod:`aiqsim.http.profiles`)."""
    if any(code in profile.quota_codes for code in error_codes(body)):
        return True
    message = error_message(body).lower()
    return any(phrase in message for phrase in profile.quota_phrases)


def says_rate_quota_spent(body: Any) -> bool:
    """Whether a 429 body explicitly says the rate-limit quota window is spent (see
    :data:`RATE_QUOTA_SPENT_PHRASES`); ``error.code``/``type`` are read as well as the message."""
    error = error_object(body)
    texts = [error_message(body)]
    if error is not None:
        texts.extend(str(error.get(field, "")) for field in ("code", "type", "status"))
    lowered = " ".join(texts).lower()
    return any(phrase in lowered for phrase in RATE_QUOTA_SPENT_PHRASES)


def rate_limit_quota_spent(
    headers: Mapping[str, Any] | Any, body: Any, *, snapshot: RateLimitSnapshot | None = None
) -> bool | None:
    """What a 429 says about the account's quota, for ``RateLimitError.quota_spent`` (pure).

    - ``True``: the remaining requests or tokens (``snapshot``, read in the vendor's dialect:
      ``x-ratelimit-remaining-*`` or ``anthropic-ratelimit-*-remaining``; by default the
      ``x-ratelimit-*`` headers of ``headers``) are 0 (below one whole unit), or the body
      explicitly says the quota window is spent (:func:`says_rate_quota_spent`); every request of
      this provider would be refused until the window resets.
    - ``False``: the server sent remaining counts and all of them are positive: quota remains,
      this 429 is about this one request (an overloaded replica, a burst limit).
    - ``None``: the server said neither.

    A "spent" signal wins over a positive one: one exhausted dimension (tokens) refuses every
    request even while another (requests) has room.
    """
    if snapshot is None:
        snapshot = profile_snapshot(headers, 0.0, _OPENAI_DIALECT)
    remaining = [
        value for value in (snapshot.remaining_requests, snapshot.remaining_tokens) if value is not None
    ]
    if any(value < 1 for value in remaining) or says_rate_quota_spent(body):
        return True
    if remaining:
        return False
    return None


def _error_type(headers: Mapping[str, Any] | Any, profile: ProviderProfile) -> str | None:
    """The error type a profile's error-type header names (``ThrottlingException:http://...`` ->
    ``"throttlingexception"``), or ``None``."""
    if profile.error_type_header is None:
        return None
    value = header_value(headers, profile.error_type_header)
    return None if value is None else value.split(":", 1)[0].strip().lower()


_OPENAI_DIALECT = ProviderProfile("x-ratelimit", "x-ratelimit-* headers", ratelimit_dialect="openai")


def error_for_status(
    status: int,
    *,
    headers: Mapping[str, Any] | Any = None,
    body: Any = None,
    now_epoch_s: float = 0.0,
    time_scale: float = 1.0,
    source: str = "provider",
    request: str | None = None,
    profile: ProviderProfile = AUTO,
) -> ProviderError | None:
    """The failure for an HTTP ``status`` (``None`` for a 2xx that carries no error).

    ``body`` is the decoded JSON body (or text, or ``None``). ``now_epoch_s`` is the wall
    clock for an HTTP-date Retry-After and an RFC 3339 reset. ``time_scale`` converts the server's
    wall seconds into the caller's scheduler seconds (``retry_after_s = wall / time_scale``),
    matching :class:`~aiqsim.runtime.AsyncioRuntime` run with the same scale. ``source`` names the
    provider in messages, ``request`` (``"POST https://..."``) the request that got this answer. A
    redirect (3xx) is a failure too: following it would send a billed POST again, so its message
    names the ``Location`` to put in ``base_url`` instead. A 429's and a 503's Retry-After
    (``retry-after-ms`` preferred; else, for Google, the body's ``RetryInfo.retryDelay``) land in
    ``retry_after_s``; a 429 also says whether the quota is spent (:func:`rate_limit_quota_spent`).

    ``profile`` (:mod:`aiqsim.http.profiles`; default every vendor's rules) says which answers are a
    spent credit or spend cap (:class:`QuotaExhaustedError`, fatal), which statuses are retryable
    overload (Anthropic's 529, Groq's 498) and whether a 2xx body's ``error`` object is a failure
    (OpenRouter).
    """
    shown = f"HTTP {status}"
    if 200 <= status < 300:
        carried = error_in_success(body) if profile.errors_in_200 else None
        if carried is None:
            return None
        shown = f"HTTP {status} carrying an error (code {carried})"
        status = carried
    detail = error_message(body)
    if 300 <= status < 400:
        location = header_value(headers, "location")
        location = None if location is None else location[:_MESSAGE_LIMIT]
        detail = (
            f"a redirect{f' to {location}' if location else ''}, not followed (it would send the call "
            "again); point the provider's base_url at the address the server names"
        )
    message = f"{source}: {shown}" + (f" from {request}" if request else "")
    message += f": {detail}" if detail else ""
    google = profile.google_quota and is_google_status(body)
    if status in profile.quota_statuses:
        return QuotaExhaustedError(message)
    if google:
        daily = google_daily_quota(body) if status == 429 else None
        if daily is not None:
            return QuotaExhaustedError(
                f"{message} (a per-day quota, {daily}: it lifts at midnight Pacific time, "
                "not after the body's retryDelay)"
            )
    elif status in _QUOTA_STATUSES and is_quota_exhausted(body, profile):
        return QuotaExhaustedError(message)
    retry_after_s: float | None = None
    if status in profile.retry_after_statuses:
        wall = retry_after_from_headers(headers, now_epoch_s)
        if wall is None and profile.body_retry_delay:
            wall = google_retry_delay_s(body)
        retry_after_s = None if wall is None else wall / time_scale
    if status == 429 or _error_type(headers, profile) in profile.rate_limited_types:
        snapshot = profile_snapshot(headers, now_epoch_s, profile)
        return RateLimitError(
            message,
            retry_after_s=retry_after_s,
            quota_spent=rate_limit_quota_spent(headers, body, snapshot=snapshot),
        )
    if status in profile.overload_statuses:
        return ServerError(message, status=status, retry_after_s=retry_after_s)
    if status == 408:
        return ProviderTimeoutError(message)
    if status == 409:
        return ServerError(message, status=status)
    if status in _INVALID_STATUSES:
        return InvalidRequestError(message)
    if status >= 500:
        return ServerError(message, status=status, retry_after_s=retry_after_s)
    return HttpStatusError(message, status=status)
