"""Provider profiles: every vendor's documented answers, through a real HttpProvider on loopback.

The vectors are data (``tests/data/provider_vectors.json``): one row per documented answer, with
the page it comes from (``source``), the status, headers and body bytes the vendor shows, and what
aiqsim must make of it. A loopback server answers each row's exact bytes; the row is read twice,
with its vendor's profile and with the default ``"auto"``, and both must agree. Adding a vendor is
a profile row (:mod:`aiqsim.http.profiles`) and vector rows.
"""

from __future__ import annotations

import asyncio
import json
import math
import pathlib
import random
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiqsim import AsyncioRuntime, ConstantBackoff, QuotaLimits, RetryPolicy, Scheduler, TaskStatus
from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import (
    FailureClass,
    ProviderError,
    QuotaExhaustedError,
    RateLimitError,
    ServerError,
    classify_failure,
)
from aiqsim.core.rfc3339 import rfc3339_epoch, seconds_until
from aiqsim.core.task import Priority
from aiqsim.core.token_bucket import MultiQuota
from aiqsim.http import (
    PROFILES,
    HttpProvider,
    anthropic_error_mapper,
    error_for_status,
    get_profile,
    map_anthropic_error,
    map_openai_error,
    openai_error_mapper,
    profile_snapshot,
)
from aiqsim.http.error_bodies import protobuf_duration_s
from aiqsim.http.loopback import HttpReply, HttpRequest, LoopbackHttpServer
from aiqsim.http.vendor_headers import detect_dialect
from aiqsim.scheduler.provider import ProviderRequest

VECTORS_PATH = pathlib.Path(__file__).parent / "data" / "provider_vectors.json"
VECTORS: list[dict[str, Any]] = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))
VENDORS = sorted(name for name in PROFILES if name != "auto")
DEFAULT_NOW = 1_761_393_570.0  # 2025-10-25T11:59:30Z


def _request() -> ProviderRequest:
    return ProviderRequest(
        task_id="t1",
        idempotency_key="key-1",
        kind="llm",
        payload="hi",
        cost_estimate=10.0,
        attempt=1,
        priority=Priority.BACKGROUND,
    )


class VectorServer:
    """Answers ``/v/<index>`` with that vector's exact status, headers and body bytes."""

    def __init__(self) -> None:
        self.replies: dict[str, HttpReply] = {}
        self.http = LoopbackHttpServer(self.handle, name="vectors")

    async def handle(self, request: HttpRequest) -> HttpReply:
        return self.replies[request.path]


@pytest.fixture(scope="module")
def server() -> Any:
    vectors = VectorServer()
    for index, vector in enumerate(VECTORS):
        body = vector["body"]
        data = b"{}" if body is None else body.encode("utf-8")
        headers = {"content-type": "application/json", **vector["headers"]}
        vectors.replies[f"/v/{index}"] = HttpReply(vector["status"], data, headers)
    with vectors.http:
        yield vectors


def _now(vector: dict[str, Any]) -> float:
    return rfc3339_epoch(vector["now"]) if "now" in vector else DEFAULT_NOW  # type: ignore[return-value]


def _outcome(server: VectorServer, index: int, profile: str) -> Any:
    vector = VECTORS[index]
    now = _now(vector)
    provider = HttpProvider(
        "llm",
        server.http.url,
        path=f"/v/{index}",
        profile=profile,
        wall_clock=lambda: now,
        parse_result=lambda body: body,
    )

    async def once() -> Any:
        try:
            return await provider.call(_request())
        except ProviderError as error:
            return error
        finally:
            await provider.aclose()

    outcome = asyncio.run(once())
    return outcome, provider.last_ratelimit


def _check_snapshot(expected: dict[str, float] | None, snapshot: Any) -> None:
    if expected is None:  # no usable rate-limit header: nothing learnt
        assert snapshot is None or snapshot.is_empty
        return
    assert snapshot is not None
    for field, value in expected.items():
        assert getattr(snapshot, field) == pytest.approx(value), field


@pytest.mark.parametrize("index", range(len(VECTORS)), ids=[f"{v['vendor']}-{v['name']}" for v in VECTORS])
@pytest.mark.parametrize("mode", ["vendor", "auto"])
def test_each_documented_answer_is_read_as_its_vendor_means_it(
    server: VectorServer, index: int, mode: str
) -> None:
    """Each row's ``source`` is the vendor page the answer is documented on (see the JSON table)."""
    vector = VECTORS[index]
    expect = vector["expect"]
    assert vector["source"].startswith("https://")
    outcome, observed = _outcome(server, index, vector["vendor"] if mode == "vendor" else "auto")
    if expect["class"] is None:
        assert not isinstance(outcome, BaseException), outcome
        _check_snapshot(expect["snapshot"], observed)
        return
    assert type(outcome).__name__ == expect["class"], f"{outcome!r}"
    if "status" in expect:
        assert outcome.status == expect["status"]
    if "retry_after_s" in expect:
        assert outcome.retry_after_s == pytest.approx(expect["retry_after_s"])
    if "quota_spent" in expect:
        assert outcome.quota_spent is expect["quota_spent"]
    if "snapshot" in expect:
        _check_snapshot(expect["snapshot"], outcome.ratelimit)
    fatal = isinstance(outcome, QuotaExhaustedError)
    assert (classify_failure(outcome, attempts=1) is FailureClass.FATAL) is (
        fatal or expect["class"] in ("InvalidRequestError", "HttpStatusError")
    )


def test_every_vendor_has_vectors_and_every_vector_a_vendor() -> None:
    vendors = {vector["vendor"] for vector in VECTORS}
    assert vendors == set(VENDORS)


def test_an_unknown_profile_name_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigurationError, match="unknown provider profile 'antropic'") as caught:
        HttpProvider("llm", "http://127.0.0.1:9", profile="antropic")
    for name in PROFILES:
        assert name in str(caught.value)
    with pytest.raises(ConfigurationError):
        get_profile(42)  # type: ignore[arg-type]
    assert get_profile(" Anthropic ") is PROFILES["anthropic"]


def test_the_dialect_is_detected_from_the_header_names() -> None:
    assert detect_dialect({"anthropic-ratelimit-requests-remaining": "3"}) == "anthropic"
    assert detect_dialect({"x-ratelimit-remaining-requests": "3"}) == "openai"
    assert detect_dialect({"retry-after": "3"}) == "none"
    assert detect_dialect(None) == "none"


def test_a_named_profile_reads_only_its_own_dialect() -> None:
    headers = {"anthropic-ratelimit-requests-remaining": "0", "x-ratelimit-remaining-requests": "7"}
    assert profile_snapshot(headers, DEFAULT_NOW, PROFILES["anthropic"]).remaining_requests == 0
    assert profile_snapshot(headers, DEFAULT_NOW, PROFILES["openai"]).remaining_requests == 7
    assert profile_snapshot(headers, DEFAULT_NOW, PROFILES["bedrock"]).is_empty


# ---------------------------------------------------------------------------- RFC 3339
@pytest.mark.parametrize(
    ("text", "epoch"),
    [
        ("2025-10-25T12:00:00Z", 1_761_393_600.0),
        ("2025-10-25T12:00:00.250Z", 1_761_393_600.25),
        ("2025-10-25T14:00:00+02:00", 1_761_393_600.0),
        ("2025-10-25t12:00:00z", 1_761_393_600.0),
        ("2016-12-31T23:59:60Z", 1_483_228_800.0),  # a leap second: the second after :59
        ("2016-12-31T15:59:60-08:00", 1_483_228_800.0),  # the same leap second, in local time
        ("2017-01-01T05:29:60+05:30", 1_483_228_800.0),  # (on the next day's local date)
        ("2015-06-30T23:59:60.5Z", 1_435_708_800.5),
        # RFC 3339's time-secfrac is "." 1*DIGIT: no upper bound on the digits
        ("2025-10-25T12:00:00.1250000000000000Z", 1_761_393_600.125),
    ],
)
def test_rfc3339_reads_what_anthropic_sends(text: str, epoch: float) -> None:
    assert rfc3339_epoch(text) == pytest.approx(epoch)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "2025-10-25",
        "2025-10-25T12:00:00",
        "2025-11-31T00:00:00Z",
        "2025-10-25T24:00:00Z",
        "2025-10-25T12:00:00+24:00",
        "２０２５-10-25T12:00:00Z",
        "1761393600",
        "NaN",
        "-1",
        "0000-01-01T00:00:00Z",
        # a leap second only ends a month in UTC (RFC 3339 section 5.7)
        "2025-10-25T12:00:60Z",
        "2016-12-31T23:58:60Z",
        "2016-12-30T23:59:60Z",
        "2016-12-31T23:59:60-08:00",
        "2017-01-01T23:59:60Z",
    ],
)
def test_rfc3339_refuses_what_is_not_a_timestamp(text: str) -> None:
    assert rfc3339_epoch(text) is None


def test_a_reset_in_the_past_or_far_future_is_bounded() -> None:
    assert seconds_until("2000-01-01T00:00:00Z", DEFAULT_NOW) == 0.0
    assert seconds_until("9999-12-31T23:59:59Z", DEFAULT_NOW) == 2147483648.0
    assert seconds_until("2025-10-25T12:00:00Z", math.nan) is None


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("19s", 19.0),
        ("0.5s", 0.5),
        ({"seconds": 19, "nanos": 500_000_000}, 19.5),
        ({"seconds": "3"}, 3.0),
        ("-1s", None),
        ("19", None),
        ("nans", None),
        ({"seconds": True}, None),
        (None, None),
        ("1e3s", None),
    ],
)
def test_google_retry_delay_is_a_protobuf_duration(value: Any, seconds: float | None) -> None:
    assert protobuf_duration_s(value) == seconds


# ---------------------------------------------------------------------------- malformed headers
_GARBAGE = st.one_of(
    st.sampled_from(
        [
            "NaN",
            "nan",
            "inf",
            "-inf",
            "-5",
            "1e309",
            "9" * 400,
            "",
            " ",
            "2025-13-45T99:99:99Z",
            "2025-10-25T12:00:00+99:99",
            "6m0s",
            "-1s",
            "0x10",
            "1_000",
            "１２",
        ]
    ),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40),
)
_HEADER_NAMES = [
    f"{prefix}-{dimension}-{part}"
    for prefix, dimensions in (
        ("anthropic-ratelimit", ("requests", "tokens", "input-tokens", "output-tokens")),
        ("x-ratelimit", ("requests", "tokens")),
    )
    for dimension in dimensions
    for part in ("limit", "remaining", "reset")
] + ["x-ratelimit-limit-requests", "x-ratelimit-remaining-tokens", "retry-after", "retry-after-ms"]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    headers=st.dictionaries(st.sampled_from(_HEADER_NAMES), _GARBAGE, max_size=8),
    profile=st.sampled_from(sorted(PROFILES)),
    status=st.sampled_from([200, 429, 498, 503, 529]),
    delay=st.one_of(st.none(), _GARBAGE),
)
def test_malformed_headers_never_raise_and_the_error_is_still_classified(
    headers: dict[str, str], profile: str, status: int, delay: str | None
) -> None:
    """Bad RFC 3339, negative, NaN, huge or garbage values of any profile's headers (and a garbage
    Google retryDelay) are ignored: no raw exception, the answer still classified, and no wait
    that is negative, NaN or beyond the 2**31 s ceiling (a stalled lane)."""
    chosen = PROFILES[profile]
    body = {
        "error": {
            "code": status,
            "status": "RESOURCE_EXHAUSTED",
            "message": "x",
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}],
        }
    }
    snapshot = profile_snapshot(headers, DEFAULT_NOW, chosen)
    for value in (snapshot.reset_requests_s, snapshot.reset_tokens_s):
        assert value is None or 0 <= value <= 2147483648.0
    for value in (
        snapshot.limit_requests,
        snapshot.remaining_requests,
        snapshot.limit_tokens,
        snapshot.remaining_tokens,
    ):
        assert value is None or math.isfinite(value)
    error = error_for_status(status, headers=headers, body=body, now_epoch_s=DEFAULT_NOW, profile=chosen)
    if status == 200:
        return
    if status == 429:
        assert isinstance(error, RateLimitError | QuotaExhaustedError)
    elif status in (503, 529) or status in chosen.overload_statuses:
        assert isinstance(error, ServerError) and error.status == status
    else:
        assert isinstance(error, ProviderError)
    wait = getattr(error, "retry_after_s", None)
    assert wait is None or 0 <= wait <= 2147483648.0


# ---------------------------------------------------------------------------- wiring: quota, scheduler, SDK
def _vector(vendor: str, name: str) -> dict[str, Any]:
    return next(v for v in VECTORS if v["vendor"] == vendor and v["name"] == name)


def _reply(vector: dict[str, Any], **header_changes: str) -> HttpReply:
    body = b"{}" if vector["body"] is None else vector["body"].encode("utf-8")
    return HttpReply(
        vector["status"], body, {"content-type": "application/json", **vector["headers"], **header_changes}
    )


class Script:
    """A loopback server answering its queue of replies in order (the last one forever)."""

    def __init__(self, *replies: HttpReply) -> None:
        self.replies = list(replies)
        self.seen: list[float] = []
        self.http = LoopbackHttpServer(self.handle, name="script")

    async def handle(self, request: HttpRequest) -> HttpReply:
        self.seen.append(request.received_at)
        return self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]


OK_BODY = json.dumps({"choices": [{"message": {"content": "done"}}], "usage": {"total_tokens": 3}}).encode()


def _run_one_task(script: Script, *, profile: str = "auto", max_attempts: int = 5) -> Any:
    runtime = AsyncioRuntime()

    async def main() -> Any:
        provider = HttpProvider("llm", script.http.url, profile=profile)
        retry = RetryPolicy(backoff=ConstantBackoff(0.01), max_attempts=max_attempts)
        scheduler = Scheduler(runtime, [provider], retry=retry, rng=random.Random(3))
        record = await scheduler.submit("llm", "q", cost_estimate=1).wait()
        await scheduler.close()
        await provider.aclose()
        return record

    with script.http:
        return runtime.run(main())


def test_an_anthropic_spend_cap_is_not_retried() -> None:
    """https://platform.claude.com/docs/en/api/rate-limits: a 429 whose error.details.error_code is
    enforced_spend_limit_reached lifts at the start of next month; it was retried as a rate limit."""
    script = Script(_reply(_vector("anthropic", "429-enforced-spend-limit")), HttpReply(200, OK_BODY))
    record = _run_one_task(script, profile="anthropic")
    assert record.status is TaskStatus.FAILED and record.attempts == 1
    assert "QuotaExhaustedError" in (record.error or "")
    assert len(script.seen) == 1


def test_a_gemini_per_minute_429_waits_its_retry_delay_and_is_retried() -> None:
    """https://ai.google.dev/gemini-api/docs/rate-limits: the wait is stated only in the body's
    RetryInfo (here shortened from the documented 19s to 0.3s to keep the test short); it was read
    as exhausted credit and failed the task."""
    vector = _vector("gemini", "429-per-minute-retry-delay")
    body = json.loads(vector["body"])
    body["error"]["details"][2]["retryDelay"] = "0.3s"
    limited = HttpReply(429, json.dumps(body).encode(), {"content-type": "application/json"})
    script = Script(limited, HttpReply(200, OK_BODY, {"content-type": "application/json"}))
    record = _run_one_task(script, profile="gemini")
    assert record.status is TaskStatus.SUCCEEDED and record.attempts == 2
    assert script.seen[1] - script.seen[0] >= 0.3  # a lower bound only: the wait is never shorter


def test_anthropic_headers_teach_the_bound_quota_the_servers_view() -> None:
    """https://platform.claude.com/docs/en/api/rate-limits: the anthropic-ratelimit-* headers lower
    the local buckets as x-ratelimit-* do; a 429 saying the requests are spent pushes the requests
    bucket into debt until the RFC 3339 reset."""
    ok = _vector("anthropic", "headers-table")
    spent = _vector("anthropic", "429-rate-limit-requests-spent")
    now = rfc3339_epoch(ok["now"])
    assert now is not None
    script = Script(_reply(ok), _reply(spent))
    quota = MultiQuota(QuotaLimits(requests_per_min=600, tokens_per_min=600_000), now=0.0)

    async def calls() -> Any:
        provider = HttpProvider(
            "llm",
            script.http.url,
            profile="auto",
            quota=quota,
            clock=lambda: 0.0,
            wall_clock=lambda: now,
            parse_result=lambda body: body,
        )
        try:
            await provider.call(_request())
            levels = quota.levels(0.0)[:2]
            try:
                await provider.call(_request())
            except RateLimitError as error:
                return levels, error, quota.levels(0.0)[:2]
        finally:
            await provider.aclose()
        raise AssertionError("the second call should have been refused")

    with script.http:
        first, error, second = asyncio.run(calls())
    assert first == (49.0, 39000.0)
    assert error.quota_spent is True and error.retry_after_s == 30.0
    # 0 of 50 left, all back in 30 s: one request is back after 30 / 50 = 0.6 s, so the bucket
    # refilling 10 per second is set to 1 - 10 * 0.6 = -5
    assert second[0] == pytest.approx(-5.0)


class AnthropicError(Exception):
    pass


class APIStatusError(AnthropicError):
    def __init__(self, message: str, *, response: Any, body: object | None) -> None:
        super().__init__(message)
        self.response = response
        self.status_code = response.status_code
        self.body = body


class _SDKRateLimit(APIStatusError):
    pass


_SDKRateLimit.__name__ = _SDKRateLimit.__qualname__ = "RateLimitError"


class OverloadedError(APIStatusError):
    pass


class BadRequestError(APIStatusError):
    pass


def _sdk_error(cls: type[APIStatusError], vector: dict[str, Any]) -> APIStatusError:
    request = httpx.Request("POST", "https://api.anthropic.com/v1/messages")
    response = httpx.Response(
        vector["status"], headers=vector["headers"], content=vector["body"].encode(), request=request
    )
    return cls(f"Error code: {vector['status']}", response=response, body=json.loads(vector["body"]))


@pytest.mark.parametrize(
    ("cls", "name", "expected"),
    [
        (_SDKRateLimit, "429-enforced-spend-limit", QuotaExhaustedError),
        (_SDKRateLimit, "429-rate-limit-requests-spent", RateLimitError),
        (OverloadedError, "529-overloaded", ServerError),
        (BadRequestError, "400-own-spend-limit", QuotaExhaustedError),
    ],
)
def test_the_anthropic_sdk_mapper_reads_the_same_profile(cls: type, name: str, expected: type) -> None:
    """https://platform.claude.com/docs/en/api/errors: the anthropic SDK's exceptions (recognised by
    class name, the SDK is not installed) carry the same answers; they are read with the profile."""
    vector = _vector("anthropic", name)
    now = _now(vector)
    mapped = map_anthropic_error(_sdk_error(cls, vector), wall_clock=lambda: now)
    assert type(mapped) is expected
    assert type(anthropic_error_mapper(wall_clock=lambda: now)(_sdk_error(cls, vector))) is expected
    if isinstance(mapped, ServerError):
        assert mapped.status == 529 and mapped.retry_after_s == 5.0
    if isinstance(mapped, RateLimitError):
        assert mapped.quota_spent is True and mapped.retry_after_s == 30.0


def test_the_openai_mapper_takes_a_profile_and_refuses_unknown_names() -> None:
    vector = _vector("deepseek", "402-insufficient-balance")
    exc = _sdk_error(APIStatusError, vector)
    assert isinstance(map_openai_error(exc, profile="deepseek"), QuotaExhaustedError)
    assert not isinstance(map_openai_error(exc, profile="openai"), QuotaExhaustedError)
    with pytest.raises(ConfigurationError, match="unknown provider profile"):
        openai_error_mapper(profile="nope")


def test_azures_minus_one_sentinel_leaves_the_bucket_full_and_a_429_not_spent() -> None:
    """https://learn.microsoft.com/en-us/answers/questions/5625878/azure-openai-responses-api-x-ratelimit-headers-val:
    the Responses API answers x-ratelimit-{limit,remaining}-tokens: -1. Read as "0 left", it emptied
    the token bucket on every answer and made every 429 a spent quota."""
    sentinel = _vector("azure", "responses-api-minus-one-sentinel")
    ok = HttpReply(200, OK_BODY, {"content-type": "application/json", **sentinel["headers"]})
    script = Script(ok)
    quota = MultiQuota(QuotaLimits(requests_per_min=600, tokens_per_min=60_000), now=0.0)
    full = quota.levels(0.0)[:2]

    async def call() -> None:
        provider = HttpProvider("llm", script.http.url, profile="azure", quota=quota, clock=lambda: 0.0)
        try:
            await provider.call(_request())
        finally:
            await provider.aclose()

    with script.http:
        asyncio.run(call())
    assert quota.levels(0.0)[:2] == full
    limited = error_for_status(429, headers=sentinel["headers"], body=None, profile=PROFILES["azure"])
    assert isinstance(limited, RateLimitError) and limited.quota_spent is None


def test_garbage_rate_limit_headers_never_stall_the_lane() -> None:
    """A 429 whose anthropic-ratelimit-* headers are garbage (NaN limit, a reset in the year 9999, a
    negative limit, a reset that is no date, a Retry-After that is no number) still ends the attempt
    as a RateLimitError and the task is retried and succeeds: the year-9999 reset holds the lane no
    longer than the retry policy's max_retry_after_s (0.5 s here), as a Retry-After would."""
    garbage = {
        "anthropic-ratelimit-requests-limit": "NaN",
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "9999-12-31T23:59:59Z",
        "anthropic-ratelimit-tokens-limit": "-5",
        "anthropic-ratelimit-tokens-remaining": "-7",
        "anthropic-ratelimit-tokens-reset": "not a date",
        "retry-after": "soon",
    }
    limited = _reply(_vector("anthropic", "429-rate-limit-requests-spent"), **garbage)
    script = Script(limited, HttpReply(200, OK_BODY, {"content-type": "application/json"}))
    runtime = AsyncioRuntime()

    async def main() -> Any:
        provider = HttpProvider("llm", script.http.url, profile="anthropic")
        retry = RetryPolicy(backoff=ConstantBackoff(0.01), max_attempts=3, max_retry_after_s=0.5)
        scheduler = Scheduler(
            runtime,
            [provider],
            quotas={"llm": QuotaLimits(requests_per_min=600)},
            retry=retry,
            rng=random.Random(4),
        )
        provider.attach_to(scheduler)
        try:  # a stalled lane fails here instead of hanging the suite
            return await asyncio.wait_for(scheduler.submit("llm", "q", cost_estimate=1).wait(), 60)
        finally:
            await scheduler.close()
            await provider.aclose()

    with script.http:
        record = runtime.run(main())
    assert record.status is TaskStatus.SUCCEEDED and record.attempts == 2
