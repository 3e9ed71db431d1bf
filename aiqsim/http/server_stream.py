"""How the local provider server writes a streamed chat answer, as the OpenAI API does.

Pure helpers for :mod:`aiqsim.http.server`: the ``chat.completion.chunk`` objects, their
server-sent events framing (``data: {...}\\n\\n``, ``data: [DONE]``), the usage chunk of
``stream_options.include_usage``, and how the answer's text is revealed as the simulated
provider's chunks arrive (in proportion to the output units generated so far). Reference:
https://platform.openai.com/docs/api-reference/chat-streaming.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["DONE", "chunk_event", "include_usage", "models_json", "revealed", "usage_event"]

DONE = b"data: [DONE]\n\n"
"""The last event of an OpenAI stream."""


def _event(payload: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode("utf-8") + b"\n\n"


def chunk_event(
    completion_id: str,
    model: str,
    created: int,
    delta: Mapping[str, Any],
    finish_reason: str | None = None,
) -> bytes:
    """One ``chat.completion.chunk`` event carrying ``delta`` (``{"content": ...}``, the first one
    ``{"role": "assistant", "content": ""}``, the last ``{}`` with ``finish_reason="stop"``)."""
    return _event(
        {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": dict(delta), "logprobs": None, "finish_reason": finish_reason}],
        }
    )


def usage_event(completion_id: str, model: str, created: int, prompt: int, output: int) -> bytes:
    """The last chunk of a stream asked with ``include_usage``: no choices, the whole usage."""
    return _event(
        {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output},
        }
    )


def include_usage(body: Mapping[str, Any]) -> bool:
    """Whether the request asked for the usage chunk (``stream_options.include_usage``)."""
    options = body.get("stream_options")
    return isinstance(options, Mapping) and options.get("include_usage") is True


def stream_options_problem(body: Mapping[str, Any]) -> str | None:
    """Why ``stream``/``stream_options`` cannot be answered as the API would, or ``None``."""
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        return f"stream must be true or false, got {stream!r}"
    options = body.get("stream_options")
    if options is None:
        return None
    if not stream:
        return "stream_options is only allowed when stream is true"
    if not isinstance(options, Mapping):
        return f"stream_options must be an object, got {options!r}"
    flag = options.get("include_usage", False)
    if not isinstance(flag, bool):
        return f"stream_options.include_usage must be true or false, got {flag!r}"
    return None


def revealed(text: str, generated: float, total: float) -> int:
    """How many characters of ``text`` an answer that generated ``generated`` of its ``total`` output
    units has revealed (all of it when it states no total). Rounded up: the first token shows at
    least one character, so a client's time to first token is the provider's, however short the
    text is next to the tokens it stands for."""
    if total <= 0:
        return len(text)
    share = min(1.0, max(0.0, generated / total))
    return min(len(text), math.ceil(len(text) * share - 1e-9))


def models_json(model: str) -> dict[str, Any]:
    """``GET /v1/models``: the one model this server answers as."""
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "aiqsim"}]}
