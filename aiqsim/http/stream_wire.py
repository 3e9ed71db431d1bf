"""The httpx side of a streamed request: its body, its bytes, and its transport failures.

Small helpers for :meth:`aiqsim.http.httpx_provider.HttpProvider.stream`, kept apart so the provider
module stays about the exchange and :mod:`aiqsim.http.sse_stream` stays free of httpx.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from aiqsim.core.failures import InvalidRequestError, ProviderError, ProviderTimeoutError, ServerError
from aiqsim.http.protocol_errors import ResponseDecodingError

__all__ = ["body_bytes", "is_event_stream", "stream_body", "transport_failure"]


def stream_body(body: Mapping[str, Any], stream_format: str, url: str) -> dict[str, Any]:
    """``body`` asking for a stream: ``"stream": true`` and, for an OpenAI-style endpoint, the usage
    at the end (``stream_options: {"include_usage": true}``), unless the body says otherwise. Not
    for Anthropic's Messages API (``stream_format="anthropic"``, or a URL ending in ``/messages``),
    which reports usage in its events and refuses unknown fields."""
    asked = {**body, "stream": True}
    anthropic = stream_format == "anthropic" or url.rstrip("/").endswith("/messages")
    if not anthropic and "stream_options" not in asked:
        asked["stream_options"] = {"include_usage": True}
    return asked


def is_event_stream(response: Any) -> bool:
    """A 2xx answer of type ``text/event-stream`` (anything else is read as a whole body)."""
    kind = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return 200 <= response.status_code < 300 and kind == "text/event-stream"


def transport_failure(httpx: Any, source: str, exc: BaseException) -> ProviderError:
    """An httpx failure as the provider error it means (as for a whole call)."""
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return ProviderTimeoutError(f"{source}: no response in time ({type(exc).__name__})")
    if isinstance(exc, httpx.DecodingError):
        return ResponseDecodingError(f"{source}: the response body could not be decoded: {detail}")
    if isinstance(exc, httpx.LocalProtocolError):
        return InvalidRequestError(f"{source}: the request could not be sent as HTTP ({detail})")
    if isinstance(exc, httpx.TransportError):
        return ServerError(f"{source}: connection failed: {detail}", status=0)
    return ServerError(f"{source}: request failed: {type(exc).__name__}: {detail}", status=0)


async def body_bytes(httpx: Any, source: str, response: Any) -> AsyncIterator[bytes]:
    """The response body's bytes as they arrive (content-encoding decoded); a broken connection or
    a read timeout raised as a provider error, never as a raw httpx one."""
    parts = response.aiter_bytes().__aiter__()
    try:
        while True:
            try:
                part = await parts.__anext__()
            except StopAsyncIteration:
                return
            except httpx.HTTPError as exc:
                raise transport_failure(httpx, source, exc) from exc
            yield part
    finally:  # left early: httpx's reader is closed now too (the response is closed by its owner)
        await parts.aclose()
