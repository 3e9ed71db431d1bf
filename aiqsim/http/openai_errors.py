"""Map exceptions of the official ``openai`` SDK (v1) onto the aiqsim failure taxonomy.

Use it with :class:`~aiqsim.http.adapter.CallableProvider`::

    client = openai.AsyncOpenAI(max_retries=0)          # let aiqsim do the retrying
    provider = CallableProvider("llm", call_openai, error_mapper=map_openai_error)

The SDK is never imported: exceptions are recognised by the *names* of their classes
(walking the MRO, most specific first) and by the attributes the SDK gives them
(``status_code``, ``response.headers``, ``body``, ``code``, ``type``). The same names
and attributes are used by other Stainless-generated SDKs (``anthropic`` among them),
so the mapper works for those too.

================================  =========================================
``APITimeoutError``               :class:`ProviderTimeoutError`
``APIConnectionError``            :class:`ServerError` (status 0)
``RateLimitError`` (429)          :class:`RateLimitError` with Retry-After,
                                  or :class:`QuotaExhaustedError` for ``insufficient_quota``
``InternalServerError`` (5xx)     :class:`ServerError` (status)
``BadRequestError`` (400),        :class:`InvalidRequestError`
``UnprocessableEntityError``,
``NotFoundError``
``ConflictError`` (409)           :class:`ServerError` (retryable, as the SDK itself retries it)
``OverloadedError`` (529),        :class:`ServerError` with Retry-After (``anthropic``)
``ServiceUnavailableError`` (503)
``AuthenticationError``,          :class:`HttpStatusError` (fatal), unless the body says
``PermissionDeniedError``         the quota is exhausted
``APIResponseValidationError``,   :class:`SchemaViolationError`
``LengthFinishReasonError``,
``ContentFilterFinishReasonError``,
``json.JSONDecodeError`` raised
while the SDK read a body
other ``APIStatusError``          by status code (:func:`aiqsim.http.status.error_for_status`)
================================  =========================================

The status, headers and body go through the same pure classifier as
:class:`~aiqsim.http.HttpProvider`'s, with a :mod:`provider profile <aiqsim.http.profiles>`:
:func:`map_anthropic_error` reads them as Anthropic's (its spend cap ``enforced_spend_limit_reached``
is fatal, its ``anthropic-ratelimit-*`` headers say whether a 429 spent the quota);
:func:`map_openai_error` takes ``profile=`` (default ``"auto"``: every vendor's rules), for the
OpenAI-compatible endpoints of Groq, DeepSeek, OpenRouter, Mistral... reached with the ``openai`` SDK.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from aiqsim.core.failures import (
    ProviderError,
    ProviderTimeoutError,
    SchemaViolationError,
    ServerError,
)
from aiqsim.http.profiles import ProviderProfile, get_profile
from aiqsim.http.status import error_for_status

_STATUS_OF_CLASS = {
    "BadRequestError": 400,
    "AuthenticationError": 401,
    "PermissionDeniedError": 403,
    "NotFoundError": 404,
    "ConflictError": 409,
    "UnprocessableEntityError": 422,
    "RateLimitError": 429,
    "InternalServerError": 500,
    "ServiceUnavailableError": 503,
    "OverloadedError": 529,
}
_SDK_BASES = frozenset({"OpenAIError", "AnthropicError", "APIError"})
"""Base classes of the SDK exception hierarchies; an exception with none of them is not ours."""
_SCHEMA_CLASSES = frozenset(
    {"APIResponseValidationError", "LengthFinishReasonError", "ContentFilterFinishReasonError"}
)


def _class_names(exc: BaseException) -> list[str]:
    return [cls.__name__ for cls in type(exc).__mro__]


def _status_code(exc: BaseException, names: list[str]) -> int | None:
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and not isinstance(status, bool):
        return status
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(status, int) and not isinstance(status, bool):
        return status
    for name in names:
        if name in _STATUS_OF_CLASS:
            return _STATUS_OF_CLASS[name]
    return None


def _error_body(exc: BaseException) -> Any:
    """The error body as the SDK keeps it, with ``code``/``type`` attributes folded in."""
    raw = getattr(exc, "body", None)
    body = dict(raw) if isinstance(raw, dict) else {}
    for field in ("code", "type"):
        value = getattr(exc, field, None)
        if isinstance(value, str) and field not in body:
            body[field] = value
    if "message" not in body:
        body["message"] = str(getattr(exc, "message", None) or exc)
    return body


_SDK_RESPONSE_MODULES = frozenset({"_response", "_legacy_response", "_base_client"})
"""Where a Stainless-generated SDK (``openai``, ``anthropic``...) reads a response body."""


def _sdk_that_parsed(exc: BaseException) -> str | None:
    """The SDK package (``"openai"``) whose response parsing raised ``exc``, or ``None``.

    The SDK lets a body that is no JSON escape as a plain ``json.JSONDecodeError``, no SDK class;
    its traceback passes through the SDK's response module, which a user's own parsing does not."""
    tb = exc.__traceback__
    found = None
    while tb is not None:
        module = str(tb.tb_frame.f_globals.get("__name__", "")).split(".")
        if len(module) > 1 and module[1] in _SDK_RESPONSE_MODULES:
            found = module[0]
        tb = tb.tb_next
    return found


def map_openai_error(
    exc: BaseException,
    *,
    time_scale: float = 1.0,
    wall_clock: Callable[[], float] = time.time,
    profile: str | ProviderProfile = "auto",
) -> ProviderError | None:
    """The aiqsim failure for an ``openai`` SDK exception, or ``None`` if ``exc`` is not one.

    ``time_scale`` converts the server's Retry-After (wall seconds) into scheduler
    seconds, as for :class:`~aiqsim.http.httpx_provider.HttpProvider`; ``wall_clock``
    measures HTTP-date Retry-After values and RFC 3339 resets; ``profile`` names the vendor
    (:mod:`aiqsim.http.profiles`; an unknown name is a ConfigurationError).
    """
    chosen = get_profile(profile)
    names = _class_names(exc)
    if isinstance(exc, json.JSONDecodeError):
        sdk = _sdk_that_parsed(exc)
        if sdk is not None:  # a 200 whose body is no JSON (a proxy's login page): as HttpProvider says
            return SchemaViolationError(f"{sdk}: the response body is not JSON ({exc})")
    if _SDK_BASES.isdisjoint(names):
        return None
    source = type(exc).__module__.split(".")[0] or "sdk"
    message = f"{source}: {type(exc).__name__}: {exc}"
    for name in names:
        if name == "APITimeoutError":
            return ProviderTimeoutError(message)
        if name == "APIConnectionError":
            return ServerError(message, status=0)
        if name in _SCHEMA_CLASSES:
            return SchemaViolationError(message)
        if name == "APIStatusError" or name in _STATUS_OF_CLASS:
            break
    status = _status_code(exc, names)
    if status is None:
        return None
    response = getattr(exc, "response", None)
    return error_for_status(
        status,
        headers=getattr(response, "headers", None),
        body=_error_body(exc),
        now_epoch_s=wall_clock(),
        time_scale=time_scale,
        source=source,
        profile=chosen,
    )


def openai_error_mapper(
    *,
    time_scale: float = 1.0,
    wall_clock: Callable[[], float] = time.time,
    profile: str | ProviderProfile = "auto",
) -> Callable[[Exception], ProviderError | None]:
    """:func:`map_openai_error` with a fixed ``time_scale`` and ``profile``, for
    ``CallableProvider(error_mapper=...)``. The profile name is checked here, once."""
    chosen = get_profile(profile)

    def mapper(exc: Exception) -> ProviderError | None:
        return map_openai_error(exc, time_scale=time_scale, wall_clock=wall_clock, profile=chosen)

    return mapper


def map_anthropic_error(
    exc: BaseException,
    *,
    time_scale: float = 1.0,
    wall_clock: Callable[[], float] = time.time,
) -> ProviderError | None:
    """The aiqsim failure for an ``anthropic`` SDK exception (recognised by class name, the SDK is
    never imported), read with the Anthropic profile; ``None`` if ``exc`` is not one."""
    return map_openai_error(exc, time_scale=time_scale, wall_clock=wall_clock, profile="anthropic")


def anthropic_error_mapper(
    *, time_scale: float = 1.0, wall_clock: Callable[[], float] = time.time
) -> Callable[[Exception], ProviderError | None]:
    """:func:`map_anthropic_error` with a fixed ``time_scale``, for ``CallableProvider(error_mapper=...)``."""
    return openai_error_mapper(time_scale=time_scale, wall_clock=wall_clock, profile="anthropic")
