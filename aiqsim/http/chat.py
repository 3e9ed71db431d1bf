"""The OpenAI chat-completions wire format, as far as aiqsim needs it (pure).

Client side: :func:`chat_body` turns a task payload into a request body,
:func:`estimate_chat_tokens` predicts its cost, :func:`chat_content` and
:func:`total_tokens` read a response. Server side (:mod:`aiqsim.http.server`):
:func:`prompt_tokens`, :func:`output_tokens` and :func:`completion_json`. Client and
local server count tokens with the same rule, so on the local server the estimate is exact.

Token counting is the usual rule of thumb (one token per four characters, rounded up):
aiqsim schedules on cost estimates, it does not need a real tokenizer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from aiqsim.core.failures import SchemaViolationError
from aiqsim.core.fingerprint import canonical_json
from aiqsim.scheduler.provider import ProviderRequest

DEFAULT_MAX_TOKENS = 16
"""Output tokens assumed when a request gives no ``max_tokens`` (the legacy OpenAI default)."""

CHARS_PER_TOKEN = 4


def chat_body(request: ProviderRequest, *, model: str | None = None) -> dict[str, Any]:
    """A chat-completions request body for a task.

    A mapping payload is sent as the body itself (it should hold ``messages``); a string
    becomes one user message; anything else is sent as one user message of its canonical
    JSON. ``model`` is filled in when the payload names none.
    """
    payload = request.payload
    if isinstance(payload, Mapping):
        body = dict(payload)
    else:
        content = payload if isinstance(payload, str) else canonical_json(payload)
        body = {"messages": [{"role": "user", "content": content}]}
    if model is not None:
        body.setdefault("model", model)
    return body


def message_chars(messages: Any) -> int:
    """Characters of text in a ``messages`` list (string contents and text parts)."""
    if not isinstance(messages, list):
        return 0
    chars = 0
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        content = message.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    chars += len(part["text"])
    return chars


def prompt_tokens(body: Mapping[str, Any]) -> int:
    """Prompt tokens of a request body: ceil(characters / 4)."""
    return math.ceil(message_chars(body.get("messages")) / CHARS_PER_TOKEN)


def output_tokens(body: Mapping[str, Any], default: int = DEFAULT_MAX_TOKENS) -> int:
    """Output tokens a request asks for: ``max_completion_tokens``, else ``max_tokens``, else ``default``."""
    for field in ("max_completion_tokens", "max_tokens"):
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return default


def explicit_units(body: Mapping[str, Any]) -> tuple[int, int] | None:
    """``(prompt_units, output_units)`` of a simulation-style payload that states them, else ``None``.

    Workloads of :mod:`aiqsim.sim.workloads` submit ``{"input", "prompt_units", "output_units"}``;
    sent as a request body, their units are taken as given.
    """
    prompt, output = body.get("prompt_units"), body.get("output_units")
    for value in (prompt, output):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return None
    assert isinstance(prompt, int) and isinstance(output, int)
    return prompt, output


def estimate_chat_tokens(payload: Any, default_max_tokens: int = DEFAULT_MAX_TOKENS) -> float:
    """Prompt plus output tokens of the body :func:`chat_body` builds from ``payload``.

    A payload stating ``prompt_units`` and ``output_units`` (a simulation workload's) costs their sum.
    """
    if isinstance(payload, Mapping):
        stated = explicit_units(payload)
        if stated is not None:
            return float(sum(stated))
        body: Mapping[str, Any] = payload
    else:
        content = payload if isinstance(payload, str) else canonical_json(payload)
        body = {"messages": [{"role": "user", "content": content}]}
    return float(prompt_tokens(body) + output_tokens(body, default_max_tokens))


def chat_content(body: Any) -> str:
    """``choices[0].message.content`` of a chat response; :class:`SchemaViolationError` if absent."""
    try:
        content = body["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as exc:
        raise SchemaViolationError(f"response has no choices[0].message.content ({exc!r})") from exc
    if not isinstance(content, str):
        raise SchemaViolationError(f"choices[0].message.content is {type(content).__name__}, not a string")
    return content


def total_tokens(body: Any) -> float | None:
    """``usage.total_tokens`` of a response, or ``None`` when it is missing or not a number."""
    usage = body.get("usage") if isinstance(body, Mapping) else None
    value = usage.get("total_tokens") if isinstance(usage, Mapping) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and -1e300 < value < 1e300:
        return float(value)  # finite, and no int beyond a float (a 401-digit count raised OverflowError)
    return None


def completion_tokens(body: Any) -> float | None:
    """``usage.completion_tokens`` of a response (what the model generated), or ``None``."""
    usage = body.get("usage") if isinstance(body, Mapping) else None
    value = usage.get("completion_tokens") if isinstance(usage, Mapping) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and -1e300 < value < 1e300:
        return float(value)  # finite, and no int beyond a float (a 401-digit count raised OverflowError)
    return None


def completion_json(
    completion_id: str, model: str, content: str, prompt: int, output: int, created: int
) -> dict[str, Any]:
    """A chat-completions response body as OpenAI shapes it."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output},
    }


def error_json(message: str, error_type: str, code: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error body."""
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}
