"""HttpProvider.stream() against a real loopback server answering with the vendors' documented bytes,
and with the broken streams a client must survive: one that stalls, one that never ends, one that
grows without bound, a malformed event, a cut connection. Each ends its attempt with a project error
naming what was wrong (a billed StreamCutError once a chunk had arrived), and the provider keeps
working for the next request.

Sources of the recorded streams:
- OpenAI: https://platform.openai.com/docs/api-reference/chat-streaming (the chunk object) and
  https://platform.openai.com/docs/api-reference/chat/create#chat-create-stream_options
  (``include_usage``: a last chunk with empty ``choices`` and the ``usage``), ``data: [DONE]``.
- Anthropic: https://docs.anthropic.com/en/docs/build-with-claude/streaming ("Basic streaming
  request" event flow, and the ``error`` event example).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import aiqsim
from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import (
    ProviderTimeoutError,
    SchemaViolationError,
    ServerError,
    StreamCutError,
)
from aiqsim.core.task import Priority
from aiqsim.core.token_bucket import QuotaLimits
from aiqsim.http import HttpProvider
from aiqsim.http.loopback import CutStream, HttpReply, HttpRequest, LoopbackHttpServer, StreamReply
from aiqsim.http.sse_stream import StreamLimits
from aiqsim.http.stream_events import MalformedStreamEventError
from aiqsim.runtime import AsyncioRuntime
from aiqsim.scheduler import RetryPolicy, Scheduler
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse, StreamChunk
from tests.cyclic_garbage import cyclic_garbage

OPENAI_STREAM = b"".join(
    b"data: " + json.dumps(chunk).encode() + b"\n\n"
    for chunk in [
        {"id": "chatcmpl-123", "object": "chat.completion.chunk", "created": 1694268190,
         "model": "gpt-4o-mini", "system_fingerprint": "fp_44709d6fcb",
         "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None}]},
        {"id": "chatcmpl-123", "object": "chat.completion.chunk", "created": 1694268190,
         "model": "gpt-4o-mini", "system_fingerprint": "fp_44709d6fcb",
         "choices": [{"index": 0, "delta": {"content": "Hello"}, "logprobs": None, "finish_reason": None}]},
        {"id": "chatcmpl-123", "object": "chat.completion.chunk", "created": 1694268190,
         "model": "gpt-4o-mini", "system_fingerprint": "fp_44709d6fcb",
         "choices": [{"index": 0, "delta": {"content": "!"}, "logprobs": None, "finish_reason": None}]},
        {"id": "chatcmpl-123", "object": "chat.completion.chunk", "created": 1694268190,
         "model": "gpt-4o-mini", "system_fingerprint": "fp_44709d6fcb",
         "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]},
        {"id": "chatcmpl-123", "object": "chat.completion.chunk", "created": 1694268190,
         "model": "gpt-4o-mini", "system_fingerprint": "fp_44709d6fcb", "choices": [],
         "usage": {"prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21}},
    ]
) + b"data: [DONE]\n\n"  # fmt: skip

ANTHROPIC_STREAM = b"""event: message_start
data: {"type": "message_start", "message": {"id": "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY", "type": "message", "role": "assistant", "content": [], "model": "claude-3-5-sonnet-20240620", "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 25, "output_tokens": 1}}}

event: content_block_start
data: {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}

event: ping
data: {"type": "ping"}

event: content_block_delta
data: {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}}

event: content_block_delta
data: {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "!"}}

event: content_block_stop
data: {"type": "content_block_stop", "index": 0}

event: message_delta
data: {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence":null}, "usage": {"output_tokens": 15}}

event: message_stop
data: {"type": "message_stop"}

"""  # noqa: E501 - the documented bytes, line for line

ANTHROPIC_ERROR = b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}\n\n'  # noqa: E501

SSE = {"content-type": "text/event-stream", "cache-control": "no-cache"}


def _events(stream: bytes) -> list[bytes]:
    return [part + b"\n\n" for part in stream.split(b"\n\n") if part]


class Scripts:
    """The server's answers, by the request's ``x-script`` header; ``requests`` counts them."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    async def handle(self, request: HttpRequest) -> Any:
        body = request.json()
        self.requests.append(body)
        script = request.headers.get("x-script") or body.get("script", "openai")
        if script == "openai":
            return StreamReply(200, _slowly(_events(OPENAI_STREAM)), SSE)
        if script == "anthropic":
            return StreamReply(200, _slowly(_events(ANTHROPIC_STREAM)), SSE)
        if script == "anthropic-error-first":
            return StreamReply(200, _slowly([ANTHROPIC_ERROR]), SSE)
        if script == "anthropic-error-mid":
            events = _events(ANTHROPIC_STREAM)
            return StreamReply(200, _slowly([*events[:4], ANTHROPIC_ERROR]), SSE)
        if script == "cut":
            return StreamReply(200, _slowly(_events(OPENAI_STREAM)[:3], cut=True), SSE)
        if script == "stall":  # keep-alive comments, never another event
            return StreamReply(200, _stall(_events(OPENAI_STREAM)[:2]), SSE)
        if script == "stall-first":  # keep-alive comments, never an event
            return StreamReply(200, _stall([]), SSE)
        if script == "stall-after-role":  # the role chunk (no text), then nothing but keep-alives
            return StreamReply(200, _stall(_events(OPENAI_STREAM)[:1]), SSE)
        if script == "silent":  # the head, then not a byte (no keep-alive either)
            return StreamReply(200, _silent(), SSE)
        if script == "endless":  # events for ever
            return StreamReply(200, _endless(), SSE)
        if script == "malformed":
            return StreamReply(200, _slowly([*_events(OPENAI_STREAM)[:2], b"data: {not json\n\n"]), SSE)
        if script == "malformed-first":
            return StreamReply(200, _slowly([b"data: {not json\n\n"]), SSE)
        if script == "no-done":
            return StreamReply(200, _slowly(_events(OPENAI_STREAM)[:-1]), SSE)
        if script == "429":
            return HttpReply.json(
                429, {"error": {"message": "slow down", "type": "requests"}}, {"retry-after": "2"}
            )
        if script == "whole":
            return HttpReply.json(
                200,
                {"choices": [{"message": {"content": "all at once"}}], "usage": {"total_tokens": 7}},
            )
        raise AssertionError(script)


async def _slowly(parts: list[bytes], cut: bool = False) -> AsyncIterator[bytes]:
    for part in parts:
        await asyncio.sleep(0.005)
        yield part
    if cut:
        raise CutStream


async def _stall(parts: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part
    while True:
        await asyncio.sleep(0.02)
        yield b": keep-alive\n\n"


async def _silent() -> AsyncIterator[bytes]:
    await asyncio.sleep(3600)
    yield b""


async def _endless() -> AsyncIterator[bytes]:
    first = _events(OPENAI_STREAM)[1]
    while True:
        await asyncio.sleep(0.01)
        yield first


@pytest.fixture
def server() -> Iterator[tuple[LoopbackHttpServer, Scripts]]:
    scripts = Scripts()
    with LoopbackHttpServer(scripts.handle) as http:
        yield http, scripts


def _request(n: int = 1) -> ProviderRequest:
    return ProviderRequest(f"t{n}", f"k{n}", "chat", {"messages": [{"role": "user", "content": "hi"}]},
                           10.0, 1, Priority.BACKGROUND)  # fmt: skip


def _provider(http: LoopbackHttpServer, script: str, **options: Any) -> HttpProvider:
    return HttpProvider("p", http.url, headers={"x-script": script}, **options)


async def _collect(provider: HttpProvider, n: int = 1) -> tuple[list[str], ProviderResponse]:
    texts: list[str] = []
    async for item in provider.stream(_request(n)):
        if isinstance(item, StreamChunk):
            texts.append(item.data)
        else:
            return texts, item
    raise AssertionError("the stream ended without its response")


def test_the_openai_documented_stream_with_its_usage_chunk(server: Any) -> None:
    http, scripts = server

    async def body() -> None:
        async with _provider(http, "openai") as provider:
            texts, response = await _collect(provider)
        assert texts == ["Hello", "!"]
        assert (response.result, response.usage, response.output_units) == ("Hello!", 21.0, 12.0)
        assert response.first_token_s is not None and response.first_token_s > 0

    asyncio.run(body())
    sent = scripts.requests[0]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


def test_the_anthropic_documented_event_flow(server: Any) -> None:
    http, scripts = server

    async def body() -> None:
        async with _provider(http, "anthropic", path="/v1/messages") as provider:
            texts, response = await _collect(provider)
        assert texts == ["Hello", "!"]
        assert (response.result, response.usage, response.output_units) == ("Hello!", 40.0, 15.0)

    asyncio.run(body())
    assert "stream_options" not in scripts.requests[0]  # Anthropic's API refuses unknown fields


def test_an_error_event_before_any_text_is_raised_as_for_a_call(server: Any) -> None:
    http, _ = server

    async def body() -> None:
        async with _provider(http, "anthropic-error-first") as provider:
            with pytest.raises(ServerError, match="overloaded_error") as raised:
                await _collect(provider)
        assert raised.value.status == 529 and not isinstance(raised.value, StreamCutError)

    asyncio.run(body())


def test_an_error_event_after_text_is_a_billed_cut(server: Any) -> None:
    http, _ = server

    async def body() -> None:
        async with _provider(http, "anthropic-error-mid") as provider:
            with pytest.raises(StreamCutError, match=r"after 1 chunk.*overloaded_error"):
                await _collect(provider)

    asyncio.run(body())


@pytest.mark.parametrize(
    ("script", "limits", "cut", "named"),
    [
        ("cut", {}, StreamCutError, "connection failed|incomplete"),
        ("stall", {"idle_timeout_s": 0.3}, StreamCutError, "no event for idle_timeout_s=0.3"),
        ("endless", {"total_timeout_s": 0.3}, StreamCutError, "total_timeout_s=0.3"),
        ("endless", {"max_bytes": 4096}, StreamCutError, "larger than max_stream_bytes \\(4,096 bytes\\)"),
        ("malformed", {}, StreamCutError, "malformed openai stream event.*not JSON"),
        ("no-done", {}, StreamCutError, "ended before its end marker"),
        ("malformed-first", {}, MalformedStreamEventError, "not JSON"),
    ],
)
def test_a_broken_stream_ends_the_attempt_naming_what_was_wrong_and_the_provider_goes_on(
    server: Any, script: str, limits: dict[str, Any], cut: type[BaseException], named: str
) -> None:
    http, _ = server

    async def body() -> None:
        client = _provider(http, script, stream_limits=StreamLimits(**limits))
        good = HttpProvider("p", http.url, headers={"x-script": "openai"}, client=await client._http())
        async with client:
            with pytest.raises(cut, match=named):
                await _collect(client)
            _, response = await _collect(good, 2)  # the same connection pool, the next request
            assert response.result == "Hello!"

    asyncio.run(body())


def test_a_failure_status_and_a_whole_answer_are_read_as_a_call_reads_them(server: Any) -> None:
    http, _ = server

    async def body() -> None:
        async with _provider(http, "429") as provider:
            with pytest.raises(Exception, match="slow down") as raised:
                await _collect(provider)
            assert raised.type.__name__ == "RateLimitError" and raised.value.retry_after_s == 2.0
        async with _provider(http, "whole") as provider:
            texts, response = await _collect(provider)
            assert texts == [] and response.result == "all at once" and response.usage == 7.0

    asyncio.run(body())


def test_bad_stream_settings_are_refused_by_name(server: Any) -> None:
    http, _ = server
    with pytest.raises(ConfigurationError, match="stream_format must be one of auto, openai, anthropic"):
        HttpProvider("p", http.url, stream_format="gemini")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="idle_timeout_s"):
        StreamLimits(idle_timeout_s=0)
    with pytest.raises(ConfigurationError, match="max_bytes"):
        StreamLimits(max_bytes=0)
    with pytest.raises(ConfigurationError, match="stream_limits"):
        HttpProvider("p", http.url, stream_limits={"max_bytes": 3})  # type: ignore[arg-type]


def test_limits_before_the_first_chunk_are_timeouts_not_cuts(server: Any) -> None:
    http, _ = server

    async def body() -> None:
        limits = StreamLimits(idle_timeout_s=0.3)
        async with _provider(http, "stall-first", stream_limits=limits) as provider:
            with pytest.raises(ProviderTimeoutError, match=r"idle_timeout_s=0\.3") as raised:
                await _collect(provider)
            assert not isinstance(raised.value, StreamCutError)
        # the documented first chunk names the role (no text): the answer has begun, and is billed
        async with _provider(http, "stall-after-role", stream_limits=limits) as provider:
            with pytest.raises(StreamCutError, match=r"after 0 chunk\(s\): .*idle_timeout_s=0\.3"):
                await _collect(provider)

    asyncio.run(body())


@pytest.mark.parametrize(
    ("script", "cause"),
    [
        ("malformed", "malformed openai stream event"),
        ("stall", "no event for idle_timeout_s=0.3"),
        ("endless", "total_timeout_s=0.5"),
        ("cut", "connection failed"),
        ("anthropic-error-mid", "overloaded_error"),
    ],
)
def test_through_the_scheduler_a_broken_stream_fails_its_task_once_and_the_lane_goes_on(
    server: Any, script: str, cause: str
) -> None:
    """The task whose stream broke after its first chunk was billed: with no lookup and keys not
    honoured it fails naming the cause, sent once; the next task on the same lane succeeds."""
    http, scripts = server

    async def body() -> tuple[Any, Any]:
        runtime = AsyncioRuntime()
        limits = StreamLimits(idle_timeout_s=0.3, total_timeout_s=0.5, max_bytes=1 << 20)
        provider = HttpProvider("p", http.url, stream_limits=limits)
        scheduler = Scheduler(
            runtime,
            [provider],
            quotas={"p": QuotaLimits(concurrency=1)},
            retry=RetryPolicy(max_attempts=3, attempt_timeout_s=30.0),
            rng=random.Random(3),
        )
        async with provider, scheduler:
            broken = scheduler.submit("chat", {"script": script, "messages": []}, provider="p", stream=True)
            good = scheduler.submit("chat", {"script": "openai", "messages": []}, provider="p", stream=True)
            return await broken.wait(), await good.wait()

    broken, good = asyncio.run(body())
    assert broken.status.value == "failed" and "billed and cut" in broken.error and cause in broken.error
    assert good.status.value == "succeeded" and good.result == "Hello!"
    assert [sent["script"] for sent in scripts.requests] == [script, "openai"]  # never re-sent


def test_schema_and_timeout_errors_keep_their_classes() -> None:
    assert issubclass(MalformedStreamEventError, SchemaViolationError)
    assert issubclass(StreamCutError, ProviderTimeoutError)


@pytest.mark.parametrize("streamed", [False, True])
def test_a_failure_status_leaves_no_error_for_the_cycle_collector(server: Any, streamed: bool) -> None:
    """Before: the 429's RateLimitError was raised from a frame that named it (the frame is in its
    traceback): each failed call, whole or streamed, was cyclic garbage kept until a collection."""
    from aiqsim.core.failures import RateLimitError

    http, _scripts = server

    async def body() -> int:
        failed = 0
        async with _provider(http, "429") as provider:
            for n in range(3):
                try:
                    if streamed:
                        await _collect(provider, n)
                    else:
                        await provider.call(_request(n))
                except RateLimitError:
                    failed += 1
        return failed

    failed, kept = cyclic_garbage(lambda: asyncio.run(body()), RateLimitError)
    assert failed == 3
    assert kept == []


def test_the_clients_own_read_timeout_is_named_not_taken_for_the_streams_idle_limit(server: Any) -> None:
    """Before: httpx's read timeout, raised by the body as a ProviderTimeoutError (a TimeoutError),
    was caught as the stream's own deadline and reported as 'no event for idle_timeout_s=30 s'
    after 0.3 s: the wrong setting named, the real one hidden."""
    http, _scripts = server
    limits = StreamLimits(idle_timeout_s=30.0, total_timeout_s=60.0)

    async def body() -> BaseException:
        async with _provider(http, "silent", timeout=0.3, stream_limits=limits) as provider:
            with pytest.raises(ProviderTimeoutError) as raised:
                await _collect(provider)
            return raised.value

    error = asyncio.run(asyncio.wait_for(body(), 20))
    assert "idle_timeout_s" not in str(error) and "total_timeout_s" not in str(error)
    assert "ReadTimeout" in str(error)


def test_a_stream_left_early_closes_its_readers_at_once(server: Any) -> None:
    """Before: closing HttpProvider.stream() (the scheduler does when it abandons an attempt)
    closed the response but left the generators reading it (the SSE reader, the body's bytes)
    suspended, for the loop's finalizer to close at some later collection."""
    import sys

    http, _scripts = server

    async def body() -> list[str]:
        hooks = sys.get_asyncgen_hooks()
        started: list[Any] = []

        def first_iteration(generator: Any) -> None:
            started.append(generator)
            if hooks.firstiter is not None:
                hooks.firstiter(generator)

        sys.set_asyncgen_hooks(firstiter=first_iteration, finalizer=hooks.finalizer)
        try:
            async with _provider(http, "stall") as provider:
                items = provider.stream(_request())
                assert isinstance(await items.__anext__(), StreamChunk)
                await items.aclose()  # abandoned after its first chunk
                package = str(Path(aiqsim.__file__).resolve().parent)  # not a venv whose path says "aiqsim"
                ours = [g for g in started if str(Path(g.ag_code.co_filename).resolve()).startswith(package)]
                return [g.__qualname__ for g in ours if g.ag_frame is not None]
        finally:
            sys.set_asyncgen_hooks(*hooks)

    assert asyncio.run(body()) == []  # (httpx's own are httpx's to close)


def test_a_stream_of_several_choices_keeps_choice_0s_text_as_a_whole_answer_does() -> None:
    """With ``n > 1`` each chunk carries its choice's ``index``: the texts of other choices are not run
    into choice 0's answer (the whole-body read keeps ``choices[0]`` too)."""
    from aiqsim.http.sse import SseEvent
    from aiqsim.http.stream_events import StreamDecoder

    decoder = StreamDecoder("openai", source="llm")
    texts = []
    for index, text in ((0, "Hel"), (1, "Bon"), (0, "lo"), (1, "jour")):
        data = json.dumps(
            {"object": "chat.completion.chunk", "choices": [{"index": index, "delta": {"content": text}}]}
        )
        texts += decoder.feed(SseEvent("message", data))
    assert "".join(texts) == "Hello"
