"""A streamed chat answer read off the wire: bytes -> server-sent events -> chunks and a response.

:func:`stream_answer` is what :meth:`aiqsim.http.httpx_provider.HttpProvider.stream` yields: a
:class:`~aiqsim.scheduler.provider.StreamChunk` per text delta as it arrives, then the
:class:`~aiqsim.scheduler.provider.ProviderResponse` (the whole text, the usage the stream ended
with, the time to first token). It keeps the limits a stream needs and a whole body does not:

- ``idle_timeout_s``: the longest wait for the next event (bytes that complete none, such as
  keep-alive comments, do not count): a server that stalls mid-answer;
- ``total_timeout_s``: the longest a whole stream may last: a server that never ends it;
- ``max_bytes``: the most bytes read: a stream that grows without bound.

Each ends the attempt with a project error naming the limit and its value; so do a malformed event
(:class:`~aiqsim.http.stream_events.MalformedStreamEventError`), an ``error`` event, a connection
that breaks, and a stream that ends before its end marker. Before the stream's first valid event
the error is raised as for a whole call (a timeout, a 5xx, a schema violation: retried as such);
after it (OpenAI's first chunk names only the role, Anthropic's ``message_start`` carries no text:
the server has begun, and bills, the answer) it is raised as
:class:`~aiqsim.core.failures.StreamCutError` with the cause in its message (the scheduler then
looks it up, re-sends only under an honoured idempotency key, or fails the task: nothing is billed
twice). Wall-clock time (``asyncio``'s loop clock), as any HTTP I/O; ``time_scale`` converts the
time to first token into scheduler seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import (
    ProviderError,
    ProviderTimeoutError,
    SchemaViolationError,
    ServerError,
    StreamCutError,
)
from aiqsim.core.numeric import is_positive_finite
from aiqsim.core.ratelimit import RateLimitSnapshot
from aiqsim.http.sse import SseParser
from aiqsim.http.stream_events import StreamDecoder
from aiqsim.scheduler.provider import ProviderResponse, StreamChunk

__all__ = [
    "DEFAULT_STREAM_IDLE_TIMEOUT_S",
    "DEFAULT_STREAM_TOTAL_TIMEOUT_S",
    "StreamLimits",
    "StreamTooLargeError",
    "stream_answer",
]

DEFAULT_STREAM_IDLE_TIMEOUT_S = 60.0
"""A minute without an event: longer than any model's pause between tokens or a server's keep-alive."""
DEFAULT_STREAM_TOTAL_TIMEOUT_S = 600.0
"""Ten minutes for a whole streamed answer (the scheduler's ``attempt_timeout_s`` may end it sooner)."""


class StreamTooLargeError(SchemaViolationError):
    """A streamed answer grew past ``max_bytes``: not read further, its connection dropped."""


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """How long and how large a streamed answer may be (wall seconds, bytes as received decoded);
    ``None`` for a timeout: no limit of that kind."""

    idle_timeout_s: float | None = DEFAULT_STREAM_IDLE_TIMEOUT_S
    total_timeout_s: float | None = DEFAULT_STREAM_TOTAL_TIMEOUT_S
    max_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("idle_timeout_s", "total_timeout_s"):
            value = getattr(self, name)
            if value is not None and not is_positive_finite(value):
                raise ConfigurationError(
                    f"stream {name} must be a finite number of seconds > 0 or None (no limit), got {value!r}"
                )
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or self.max_bytes < 1:
            raise ConfigurationError(f"stream max_bytes must be an int >= 1, got {self.max_bytes!r}")


async def stream_answer(
    source: str,
    parts: AsyncIterator[bytes],
    decoder: StreamDecoder,
    limits: StreamLimits,
    *,
    ratelimit: RateLimitSnapshot | None = None,
    time_scale: float = 1.0,
) -> AsyncIterator[StreamChunk | ProviderResponse]:
    """The chunks of a streamed answer read from ``parts`` (its body's bytes), then its response
    (rules: the module docstring). ``parts`` raises provider errors for a broken transport."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    last_event = started
    parser = SseParser()
    size = 0
    texts: list[str] = []
    first_at: float | None = None
    began = False  # a valid event arrived: the server has begun (and bills) the answer
    feed = parts.__aiter__()
    end_marker = "message_stop" if decoder.format == "anthropic" else "[DONE] (or message_stop)"

    def ended(error: ProviderError) -> ProviderError:
        """``error`` as raised: as it is before the first chunk, a billed cut after it."""
        if not began:
            return error
        cut = StreamCutError(
            f"{source}: the stream was cut after {len(texts)} chunk(s): {error}",
            received_units=decoder.output_tokens,
        )
        cut.__cause__ = error
        return cut

    try:
        while not decoder.done:
            now = loop.time()
            idle_left = None if limits.idle_timeout_s is None else last_event + limits.idle_timeout_s - now
            total_left = None if limits.total_timeout_s is None else started + limits.total_timeout_s - now
            lefts = [left for left in (idle_left, total_left) if left is not None]
            wait = min(lefts) if lefts else None
            try:
                if wait is not None and wait <= 0:
                    raise TimeoutError
                part = await (feed.__anext__() if wait is None else asyncio.wait_for(feed.__anext__(), wait))
            except StopAsyncIteration:
                for event in parser.close():  # the decoder's last bytes (a line with no end is dropped)
                    texts.extend(_checked(decoder, event, ended))
                    began = True
                if not decoder.done:
                    raise ended(
                        ServerError(
                            f"{source}: the stream ended before its end marker {end_marker}"
                            + ("" if began else " (no event at all)"),
                            status=0,
                        )
                    ) from None
                break
            except ProviderError as error:  # (before TimeoutError: the transport's own read timeout is one)
                raise ended(error)  # noqa: B904 - a cut names its cause itself (its __cause__)
            except TimeoutError:
                if total_left is not None and (idle_left is None or total_left <= idle_left):
                    what = f"the stream lasted longer than its total_timeout_s={limits.total_timeout_s:g} s"
                else:
                    what = f"no event for idle_timeout_s={limits.idle_timeout_s:g} s"
                raise ended(ProviderTimeoutError(f"{source}: {what}; the stream was abandoned")) from None
            size += len(part)
            if size > limits.max_bytes:
                raise ended(
                    StreamTooLargeError(
                        f"{source}: the stream is larger than max_stream_bytes ({limits.max_bytes:,} bytes); "
                        "not read further, its connection is dropped"
                    )
                )
            for event in parser.feed(part):
                last_event = loop.time()
                new = _checked(decoder, event, ended)
                began = True
                for text in new:
                    if first_at is None:
                        first_at = loop.time()
                    texts.append(text)
                    yield StreamChunk(text)
                if decoder.done:
                    break  # bytes after the end marker are not read
        first_token_s = None if first_at is None else (first_at - started) / time_scale
        yield ProviderResponse(
            result="".join(texts),
            usage=decoder.usage,
            output_units=decoder.output_tokens,
            ratelimit=ratelimit,
            first_token_s=first_token_s,
        )
    finally:  # ended, failed or left early: the body's reader is closed now, not by a later collection
        closer = getattr(feed, "aclose", None)
        if closer is not None:
            await closer()


def _checked(decoder: StreamDecoder, event: Any, ended: Any) -> list[str]:
    try:
        return decoder.feed(event)
    except ProviderError as error:
        raise ended(error)  # noqa: B904 - a cut names its cause itself (its __cause__)
