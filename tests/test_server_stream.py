"""The local provider server answers ``stream=true`` as the OpenAI API does, read by the official
``openai`` SDK and by aiqsim's HttpProvider through the scheduler; it cuts streams at the configured
rate (billed once, never re-sent); ``GET /v1/models``; a whole-second Retry-After.

OpenAI's stream format: https://platform.openai.com/docs/api-reference/chat-streaming.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import httpx
import openai
import pytest
import urllib3

from aiqsim import AsyncioRuntime, RetryPolicy, Scheduler
from aiqsim.core.token_bucket import QuotaLimits
from aiqsim.http import HttpProvider
from aiqsim.http.server import start_local_server
from aiqsim.scheduler.call_log import CallLog
from aiqsim.scheduler.streams import StreamInterruptedError
from aiqsim.sim.config import ProviderConfig

STREAMING = {"ttft_s": 0.05, "tokens_per_s": 400.0, "latency_base_s": 0.0}
"""A provider whose answers stream: the first token after 50 ms, then 400 tokens a second."""
TEXT = "a streamed hello"


def _sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="not-needed", max_retries=0, timeout=30)


def test_the_openai_sdk_streams_from_the_server_with_the_usage_chunk() -> None:
    config = ProviderConfig(name="llm", **STREAMING)
    with start_local_server(config) as server:
        stream = _sdk(server.url).chat.completions.create(
            model="aiqsim-local",
            messages=[{"role": "user", "content": TEXT}],
            max_tokens=40,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        # the server logs the request once its last byte is written, which the client may read
        # first: wait for it (bounded) rather than read the ledger at once
        _wait_until_idle(server.url)
        ledger = server.ledger()
    contents = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(contents) == f"echo: {TEXT}"
    assert len(contents) > 3  # revealed as it was generated, not in one piece
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert (usage.completion_tokens, usage.total_tokens) == (40, usage.prompt_tokens + 40)
    assert len(ledger.bills) == 1 and ledger.bills[0].units == usage.total_tokens
    assert [entry.outcome for entry in ledger.requests] == ["ok"]


def test_without_include_usage_no_usage_chunk_is_sent() -> None:
    with start_local_server(ProviderConfig(name="llm", **STREAMING)) as server:
        chunks = list(
            _sdk(server.url).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}], max_tokens=5, stream=True
            )
        )
    assert all(chunk.usage is None for chunk in chunks) and chunks[-1].choices[0].finish_reason == "stop"


def test_a_provider_without_the_stream_model_streams_its_answer_in_one_piece() -> None:
    config = ProviderConfig(name="llm", latency_base_s=0.01, latency_per_unit_s=0.0)
    with start_local_server(config) as server:
        chunks = list(
            _sdk(server.url).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "y"}], max_tokens=5, stream=True
            )
        )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "echo: y"


def test_the_models_route_answers_the_sdks_models_list() -> None:
    with start_local_server(ProviderConfig(name="llm")) as server:
        models = _sdk(server.url).models.list()
    assert [model.id for model in models.data] == ["aiqsim-local"]


def test_a_cut_stream_is_dropped_mid_body_and_billed_once() -> None:
    config = ProviderConfig(name="llm", stream_cut_prob=1.0, **STREAMING)
    with start_local_server(config) as server:
        received: list[str] = []
        with pytest.raises(openai.APIError):  # the SDK sees the body end without its last chunk
            for chunk in _sdk(server.url).chat.completions.create(
                model="m", messages=[{"role": "user", "content": TEXT}], max_tokens=200, stream=True
            ):
                if chunk.choices and chunk.choices[0].delta.content:
                    received.append(chunk.choices[0].delta.content)
        _wait_until_idle(server.url)  # the cut is the connection's: the server finishes, then bills
        ledger = server.ledger()
    assert received  # the cut came after the answer began
    assert [entry.outcome for entry in ledger.requests] == ["stream_cut"]
    assert len(ledger.bills) == 1


def _busy(url: str) -> bool:
    ledger = httpx.get(url + "/ledger", timeout=10).json()
    return bool(ledger["in_flight"] or ledger["server_work"])


def _wait_until_idle(url: str, limit_s: float = 30.0) -> None:
    """Until the server has no request in flight and no work left to finish (a cut stream's
    execution goes on, and bills, after its connection dropped: its answer ending was not enough)
    (bounded: a server that never finishes fails the test)."""
    deadline = time.monotonic() + limit_s
    while _busy(url):
        assert time.monotonic() < deadline, f"the server still had work in flight after {limit_s:g} s"
        time.sleep(0.05)


def _scheduler_run(server_url: str, texts: list[str], log: CallLog) -> tuple[list[Any], list[list[str]]]:
    async def drive() -> tuple[list[Any], list[list[str]]]:
        runtime = AsyncioRuntime()
        provider = HttpProvider("llm", server_url, lookup_path="/lookup/{key}")
        scheduler = Scheduler(
            runtime,
            [provider],
            quotas={"llm": QuotaLimits(requests_per_min=6000, tokens_per_min=1e7, concurrency=4)},
            retry=RetryPolicy(max_attempts=3, attempt_timeout_s=30.0, first_token_timeout_s=10.0),
            rng=random.Random(5),
            events=log,
        )
        provider.attach_to(scheduler)
        async with provider, scheduler:
            submissions = [
                scheduler.submit("chat", {"messages": [{"role": "user", "content": t}], "max_tokens": 30},
                                 provider="llm", stream=True)
                for t in texts
            ]  # fmt: skip
            streamed: list[list[str]] = []
            for submission in submissions:
                pieces: list[str] = []
                try:
                    async for chunk in submission.stream():
                        pieces.append(chunk.data)
                except StreamInterruptedError:
                    pieces.append("<cut>")
                streamed.append(pieces)
            records = [await submission.wait() for submission in submissions]
        return records, streamed

    return asyncio.run(drive())


def test_the_scheduler_streams_through_http_provider_and_reconciles_the_usage() -> None:
    log = CallLog()
    with start_local_server(ProviderConfig(name="llm", **STREAMING)) as server:
        records, streamed = _scheduler_run(server.url, ["one", "two"], log)
        ledger = server.ledger()
    assert [record.status.value for record in records] == ["succeeded", "succeeded"]
    assert ["".join(pieces) for pieces in streamed] == ["echo: one", "echo: two"]
    assert all(len(pieces) > 1 for pieces in streamed)
    _, calls = log.as_dicts()
    assert len(calls) == 2 and all(call["first_token_s"] is not None for call in calls)
    assert all(call["first_token_s"] >= STREAMING["ttft_s"] for call in calls)
    assert all(call["tokens_per_s"] is not None and call["tokens_per_s"] > 0 for call in calls)
    # the usage the stream ended with is what the quota was reconciled with: the bill's units
    assert sorted(call["usage"] for call in calls) == sorted(float(bill.units) for bill in ledger.bills)
    assert ledger.duplicate_bills == 0


@pytest.mark.parametrize("lookup", [False, True])
def test_a_cut_through_the_scheduler_is_billed_once_and_never_resent(lookup: bool) -> None:
    log = CallLog()
    # ignores keys; with a lookup the server's record of the answer it finished settles the cut
    config = ProviderConfig(name="llm", stream_cut_prob=1.0, supports_lookup=lookup, **STREAMING)
    with start_local_server(config) as server:
        records, streamed = _scheduler_run(server.url, ["cut me"], log)
        _wait_until_idle(server.url)
        ledger = server.ledger()
    assert streamed[0][-1] == "<cut>"
    if lookup:
        assert records[0].status.value == "succeeded"  # completed from the provider's record
    else:
        assert records[0].status.value == "failed" and "billed and cut" in records[0].error
    assert len(ledger.requests) == 1 and len(ledger.bills) == 1  # not sent again


def test_retry_after_is_whole_seconds_that_urllib3_accepts_and_the_ms_header_keeps_the_fraction() -> None:
    config = ProviderConfig(name="llm", rate_limit_prob=1.0, rate_limit_retry_after_s=0.25)
    with start_local_server(config) as server:
        answer = httpx.post(
            server.url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
            timeout=10,
        )
    assert answer.status_code == 429
    assert answer.headers["retry-after"] == "1"  # 0.25 s rounded up to RFC 9110 delay-seconds
    assert answer.headers["retry-after-ms"] == "250"
    assert urllib3.util.Retry().parse_retry_after(answer.headers["retry-after"]) == 1
    with pytest.raises(urllib3.exceptions.InvalidHeader):  # what the old "0.250" met
        urllib3.util.Retry().parse_retry_after("0.250")


def test_the_first_token_reveals_text_however_short_the_answer() -> None:
    from aiqsim.http.server_stream import revealed

    assert revealed("echo: q", 1, 400) == 1  # one token of 400 already shows a character
    assert revealed("echo: q", 0, 400) == 0
    assert revealed("echo: q", 400, 400) == len("echo: q")
    assert revealed("echo: q", 200, 400) == 4 and revealed("abcd", 2, 4) == 2


def test_a_lost_streamed_response_drops_the_connection_billed() -> None:
    config = ProviderConfig(name="llm", timeout_prob=1.0, **STREAMING)
    with start_local_server(config, lost_mode="close") as server:
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.post(
                server.url + "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "stream": True},
                timeout=10,
            )
        ledger = server.ledger()
    assert [entry.response_lost for entry in ledger.requests] == [True]
    assert len(ledger.bills) == 1  # done and billed; the client heard nothing
