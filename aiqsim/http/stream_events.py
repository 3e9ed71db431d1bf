"""What the events of a streamed chat answer mean: OpenAI chunks and Anthropic message events.

Pure: :class:`StreamDecoder` takes parsed server-sent events (:mod:`aiqsim.http.sse`) and returns
the text deltas they carry, keeping the usage and noticing the end. The transport
(:mod:`aiqsim.http.sse_stream`) turns what it says into chunks, a response or a failure.

Two dialects, told apart by the first event when ``format="auto"``:

- OpenAI (https://platform.openai.com/docs/api-reference/chat-streaming): ``data:`` lines holding
  ``chat.completion.chunk`` objects; the text is ``choices[0].delta.content``; with
  ``stream_options: {"include_usage": true}`` a last chunk with empty ``choices`` carries ``usage``
  (``prompt_tokens``, ``completion_tokens``, ``total_tokens``); the stream ends with
  ``data: [DONE]``. A chunk holding ``error`` is a failure reported mid-stream.
- Anthropic (https://docs.anthropic.com/en/docs/build-with-claude/streaming): named events
  ``message_start`` (``message.usage.input_tokens``), ``content_block_start``,
  ``content_block_delta`` (``delta.type == "text_delta"``: ``delta.text``), ``content_block_stop``,
  ``message_delta`` (``usage.output_tokens``, cumulative), ``message_stop`` (the end), ``ping``
  and ``error`` (``{"type": "error", "error": {"type": "overloaded_error", ...}}``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import (
    InvalidRequestError,
    ProviderError,
    QuotaExhaustedError,
    RateLimitError,
    SchemaViolationError,
    ServerError,
)
from aiqsim.core.numeric import is_real
from aiqsim.http.sse import SseEvent

__all__ = [
    "STREAM_FORMATS",
    "MalformedStreamEventError",
    "StreamDecoder",
    "StreamFormat",
    "check_stream_format",
]

StreamFormat = Literal["auto", "openai", "anthropic"]
STREAM_FORMATS: tuple[str, ...] = ("auto", "openai", "anthropic")

_ANTHROPIC_EVENTS = frozenset(
    {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
        "error",
    }
)

_ANTHROPIC_ERRORS: dict[str, tuple[type[ProviderError], int]] = {
    "overloaded_error": (ServerError, 529),
    "api_error": (ServerError, 500),
    "timeout_error": (ServerError, 504),
    "rate_limit_error": (RateLimitError, 429),
    "invalid_request_error": (InvalidRequestError, 400),
    "request_too_large": (InvalidRequestError, 413),
    "billing_error": (QuotaExhaustedError, 402),
}
"""Anthropic's error types (https://docs.anthropic.com/en/api/errors) -> the failure they mean."""


class MalformedStreamEventError(SchemaViolationError):
    """An event of a streamed answer that is not what its dialect allows (not JSON, a chunk without
    ``choices``, an Anthropic event out of its shape): named with the event's type and its start."""


def check_stream_format(value: Any, where: str) -> StreamFormat:
    """``value`` if it is one of :data:`STREAM_FORMATS`; a ConfigurationError naming ``where`` otherwise."""
    if value not in STREAM_FORMATS:
        raise ConfigurationError(
            f"{where}: stream_format must be one of {', '.join(STREAM_FORMATS)}, got {value!r}"
        )
    return value  # type: ignore[no-any-return]


def _show(text: str) -> str:
    return repr(text[:120] + ("..." if len(text) > 120 else ""))


class StreamDecoder:
    """Decodes one streamed answer's events (see the module docstring)."""

    __slots__ = ("done", "format", "input_tokens", "output_tokens", "source", "total_tokens")

    def __init__(self, format: StreamFormat = "auto", source: str = "provider") -> None:
        self.format: StreamFormat = check_stream_format(format, source)
        self.source = source
        self.done = False
        """The dialect's end marker arrived (``[DONE]``, ``message_stop``)."""
        self.input_tokens: float | None = None
        self.output_tokens: float | None = None
        self.total_tokens: float | None = None

    @property
    def usage(self) -> float | None:
        """The stream's total tokens, when it said (OpenAI ``total_tokens``; Anthropic input + output)."""
        if self.total_tokens is not None:
            return self.total_tokens
        if self.input_tokens is None and self.output_tokens is None:
            return None
        return (self.input_tokens or 0.0) + (self.output_tokens or 0.0)

    def feed(self, event: SseEvent) -> list[str]:
        """The text deltas ``event`` carries (often one, or none). Raises
        :class:`MalformedStreamEventError` for an event its dialect does not allow, and the
        provider error an ``error`` event reports."""
        if self.format == "auto":
            self.format = "anthropic" if event.event in _ANTHROPIC_EVENTS - {"error"} else "openai"
            if event.event == "message" and event.data.lstrip().startswith("{"):
                shape = self._json(event)
                if isinstance(shape, Mapping) and shape.get("type") in _ANTHROPIC_EVENTS:
                    self.format = "anthropic"
        if self.done:
            raise MalformedStreamEventError(
                f"{self.source}: an event came after the stream's end marker: {event.event} "
                f"{_show(event.data)}"
            )
        if self.format == "anthropic":
            return self._anthropic(event)
        return self._openai(event)

    # ------------------------------------------------------------------ OpenAI
    def _openai(self, event: SseEvent) -> list[str]:
        if event.data.strip() == "[DONE]":
            self.done = True
            return []
        body = self._json(event)
        if not isinstance(body, Mapping):
            raise self._malformed(event, "a chunk must be a JSON object")
        if "error" in body and body.get("error"):
            raise self._reported_error(body["error"])
        usage = body.get("usage")
        if isinstance(usage, Mapping):
            self.input_tokens = _number(usage.get("prompt_tokens"), self.input_tokens)
            self.output_tokens = _number(usage.get("completion_tokens"), self.output_tokens)
            self.total_tokens = _number(usage.get("total_tokens"), self.total_tokens)
        elif usage is not None:
            raise self._malformed(event, "usage must be an object")
        choices = body.get("choices")
        if not isinstance(choices, list):
            raise self._malformed(event, "a chat.completion.chunk needs a choices list")
        texts = []
        for choice in choices:
            delta = choice.get("delta") if isinstance(choice, Mapping) else None
            if not isinstance(delta, Mapping):
                raise self._malformed(event, "each choice needs a delta object")
            if choice.get("index", 0) != 0:  # n > 1: the answer is choice 0's, as the whole-body read keeps
                continue
            content = delta.get("content")
            if content is None:
                continue
            if not isinstance(content, str):
                raise self._malformed(event, "delta.content must be text")
            if content:
                texts.append(content)
        return texts

    # ------------------------------------------------------------------ Anthropic
    def _anthropic(self, event: SseEvent) -> list[str]:
        body = self._json(event)
        if not isinstance(body, Mapping):
            raise self._malformed(event, "an event's data must be a JSON object")
        kind = body.get("type", event.event)
        if event.event != "message" and kind != event.event:
            raise self._malformed(event, f"the data's type {kind!r} is not the event's name")
        if kind == "error":
            raise self._reported_error(body.get("error"))
        if kind == "message_start":
            message = body.get("message")
            usage = message.get("usage") if isinstance(message, Mapping) else None
            if not isinstance(usage, Mapping):
                raise self._malformed(event, "message_start needs message.usage")
            self.input_tokens = _number(usage.get("input_tokens"), self.input_tokens)
            for cached in ("cache_creation_input_tokens", "cache_read_input_tokens"):
                extra = _number(usage.get(cached), None)
                if extra:
                    self.input_tokens = (self.input_tokens or 0.0) + extra
            self.output_tokens = _number(usage.get("output_tokens"), self.output_tokens)
            return []
        if kind == "content_block_delta":
            delta = body.get("delta")
            if not isinstance(delta, Mapping):
                raise self._malformed(event, "content_block_delta needs a delta object")
            if delta.get("type") == "text_delta":
                text = delta.get("text")
                if not isinstance(text, str):
                    raise self._malformed(event, "a text_delta needs text")
                return [text] if text else []
            return []  # input_json_delta, thinking_delta...: not text of the answer
        if kind == "message_delta":
            usage = body.get("usage")
            if isinstance(usage, Mapping):
                self.output_tokens = _number(usage.get("output_tokens"), self.output_tokens)
            return []
        if kind == "message_stop":
            self.done = True
            return []
        if kind in _ANTHROPIC_EVENTS:
            return []  # content_block_start/stop, ping
        return []  # the API may add event types: ignored, as Anthropic asks clients to

    # ------------------------------------------------------------------ shared
    def _json(self, event: SseEvent) -> Any:
        try:
            return json.loads(event.data)
        except (ValueError, RecursionError):
            raise self._malformed(event, "its data is not JSON") from None

    def _malformed(self, event: SseEvent, why: str) -> MalformedStreamEventError:
        return MalformedStreamEventError(
            f"{self.source}: malformed {self.format} stream event {event.event!r}: {why}: {_show(event.data)}"
        )

    def _reported_error(self, error: Any) -> ProviderError:
        """The failure an in-stream error object reports."""
        kind = error.get("type") if isinstance(error, Mapping) else None
        message = error.get("message") if isinstance(error, Mapping) else None
        text = f"{self.source}: the stream reported an error: {kind or 'error'}: {message or error!r}"
        cls, status = _ANTHROPIC_ERRORS.get(str(kind), (ServerError, 500))
        if cls is ServerError:
            return ServerError(text, status=status)
        return cls(text)


def _number(value: Any, default: float | None) -> float | None:
    if isinstance(value, bool) or not is_real(value) or not 0 <= value < float("inf"):
        return default
    return float(value)
