"""The HTTP and callable provider adapters: header parsing, status mapping, the openai mapper.

Pure functions are tested directly; the HttpProvider wiring is tested over real HTTP on
127.0.0.1 against a scripted loopback server. The ``openai`` package is not installed:
its exceptions are reproduced by small stand-in classes with the SDK's class names,
hierarchy and attributes (``status_code``, ``response`` as a real ``httpx.Response``, ``body``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import re
import socket
import subprocess
import sys
import threading
import time
from email.utils import formatdate
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiqsim import (
    AsyncioRuntime,
    ConstantBackoff,
    QuotaLimits,
    RetryPolicy,
    Scheduler,
    SimPyRuntime,
    TaskStatus,
)
from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import (
    FailureClass,
    InvalidRequestError,
    ProviderContractError,
    ProviderError,
    ProviderTimeoutError,
    QuotaExhaustedError,
    RateLimitError,
    SchemaViolationError,
    ServerError,
    classify_failure,
)
from aiqsim.core.task import Priority
from aiqsim.core.token_bucket import MultiQuota
from aiqsim.http import (
    CallableProvider,
    HttpProvider,
    HttpStatusError,
    RateLimitSnapshot,
    apply_ratelimit_snapshot,
    corrected_level,
    error_for_status,
    format_duration,
    is_quota_exhausted,
    map_openai_error,
    openai_error_mapper,
    parse_duration,
    parse_ratelimit_headers,
    retry_after_from_headers,
)
from aiqsim.http.chat import completion_json, error_json, estimate_chat_tokens
from aiqsim.http.loopback import DropConnection, HttpReply, HttpRequest, LoopbackHttpServer
from aiqsim.http.protocol_errors import ResponseDecodingError, ResponseMismatchError
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def make_request(payload: Any = "hi", key: str = "key-1", attempt: int = 1) -> ProviderRequest:
    return ProviderRequest(
        task_id="t1",
        idempotency_key=key,
        kind="llm",
        payload=payload,
        cost_estimate=10.0,
        attempt=attempt,
        priority=Priority.BACKGROUND,
    )


# ---------------------------------------------------------------------------- durations
@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("250ms", 0.25),
        ("17ms", 0.017),
        ("1h2m3.5s", 3723.5),
        ("2m59.56s", 179.56),
        ("500us", 0.0005),
        ("3µs", 3e-6),
        ("10ns", 1e-8),
        ("0s", 0.0),
        ("0", 0.0),
        ("12", 12.0),
        ("0.5", 0.5),
        (" 1s ", 1.0),
        (".5s", 0.5),
    ],
)
def test_parse_duration_reads_openai_formats(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(
    "text",
    [
        *("", "  ", "abc", "1x", "s", "-1s", "1s junk", "1 s", "ms1", "1.2.3s", "-3", "nan"),
        *("+1", "1e3", "1_000", "\u0661s", "\u0661", "\uff12ms"),  # ASCII digits only, as Go reads them
    ],
)
def test_parse_duration_rejects_garbage(text: str) -> None:
    assert parse_duration(text) is None


# Go's own table for time.ParseDuration (src/time/time_test.go, parseDurationTests and
# parseDurationErrorTests). Where aiqsim differs by design, the row says how: a negative duration
# is "no information" (None), a bare number is seconds, a duration past 2**31 s is clamped.
_GO_DURATIONS = [
    ("0", 0.0),
    ("5s", 5.0),
    ("30s", 30.0),
    ("1478s", 1478.0),
    ("+5s", 5.0),
    ("-0", 0.0),
    ("+0", 0.0),
    ("5.0s", 5.0),
    ("5.6s", 5.6),
    ("5.s", 5.0),
    (".5s", 0.5),
    ("1.0s", 1.0),
    ("1.00s", 1.0),
    ("1.004s", 1.004),
    ("1.0040s", 1.004),
    ("100.00100s", 100.001),
    ("10ns", 10e-9),
    ("11us", 11e-6),
    ("12\u00b5s", 12e-6),
    ("12\u03bcs", 12e-6),
    ("13ms", 13e-3),
    ("14s", 14.0),
    ("15m", 900.0),
    ("16h", 57600.0),
    ("3h30m", 12600.0),
    ("10.5s4m", 250.5),
    ("1h2m3s4ms5us6ns", 3723.004005006),
    ("39h9m14.425s", 140954.425),
    ("52763797000ns", 52.763797),
    ("0.3333333333333333333h", 1200.0),
    ("9007199254740993ns", 9007199.254740993),
    ("0.100000000000000000000h", 360.0),
    ("0.830103483285477580700h", 2988.372539827),
]


@pytest.mark.parametrize(("text", "seconds"), _GO_DURATIONS)
def test_parse_duration_reads_go_s_published_table(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("text", ["-5s", "-2m3.4s", "-9223372036854775808ns", "-2562047h47m16.854775808s"])
def test_parse_duration_reads_go_s_negative_durations_as_no_information(text: str) -> None:
    assert parse_duration(text) is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "-",
        "s",
        ".",
        "-.",
        ".s",
        "+.s",
        "1d",
        "\x85\x85",
        "\xffff",
        "hello \xffff world",
        "\ufffd",
        "\ufffd hello \ufffd world",
        "+-5s",
        "--5s",
        "+ 5s",
    ],
)
def test_parse_duration_refuses_what_go_refuses(text: str) -> None:
    assert parse_duration(text) is None


def test_parse_duration_of_none_and_numbers() -> None:
    assert parse_duration(None) is None
    assert parse_duration(2) == 2.0
    assert parse_duration(-1.0) is None
    assert parse_duration(math.inf) is None
    assert parse_duration(True) is None  # a boolean is not one second (shared with Retry-After parsing)


@pytest.mark.parametrize("value", [10**400, "9" * 400, "9" * 400 + "h", "3000000000s", 2**31 + 1])
def test_parse_duration_clamps_what_is_longer_than_two_to_the_31_seconds(value: object) -> None:
    # 10**400 used to raise OverflowError; "9" * 400 + "h" gave inf
    assert parse_duration(value) == 2**31  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0, "0s"), (0.25, "250ms"), (0.0171, "18ms"), (1.0, "1s"), (360.0, "6m0s"), (3723.5, "1h2m3.5s")],
)
def test_format_duration_writes_go_durations(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.floats(min_value=0.0, max_value=200_000.0, allow_nan=False))
def test_format_then_parse_never_reads_earlier(seconds: float) -> None:
    parsed = parse_duration(format_duration(seconds))
    assert parsed is not None
    assert seconds - 1e-9 <= parsed < seconds + 0.001 + 1e-9


# ---------------------------------------------------------------------------- rate-limit headers
OPENAI_HEADERS = {
    "X-RateLimit-Limit-Requests": "60",
    "X-RateLimit-Remaining-Requests": "59",
    "X-RateLimit-Reset-Requests": "1s",
    "X-RateLimit-Limit-Tokens": "150000",
    "X-RateLimit-Remaining-Tokens": "149984",
    "X-RateLimit-Reset-Tokens": "6m0s",
}


@pytest.mark.parametrize("as_httpx", [False, True])
def test_parse_ratelimit_headers_reads_all_six(as_httpx: bool) -> None:
    headers = httpx.Headers(OPENAI_HEADERS) if as_httpx else OPENAI_HEADERS
    snapshot = parse_ratelimit_headers(headers)
    assert snapshot == RateLimitSnapshot(
        limit_requests=60,
        remaining_requests=59,
        reset_requests_s=1.0,
        limit_tokens=150000,
        remaining_tokens=149984,
        reset_tokens_s=360.0,
    )
    assert not snapshot.is_empty


def test_parse_ratelimit_headers_tolerates_missing_and_garbage() -> None:
    snapshot = parse_ratelimit_headers(
        {"x-ratelimit-remaining-requests": "many", "x-ratelimit-reset-tokens": "?"}
    )
    assert snapshot.is_empty
    partial = parse_ratelimit_headers({"x-ratelimit-remaining-tokens": "12"})
    assert partial.remaining_tokens == 12 and partial.remaining_requests is None


DATE = "Wed, 01 Jan 2099 00:00:00 GMT"
DATE_EPOCH = 4070908800.0


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([("retry-after", "7"), ("retry-after", "7")], 7.0),
        ([("retry-after", "7"), ("retry-after", "30")], 30.0),  # they disagree: the longest wait
        ([("retry-after-ms", "7000"), ("retry-after-ms", "7000")], 7.0),
        ([("retry-after", DATE), ("retry-after", DATE)], 60.0),
        ([("retry-after", "7"), ("retry-after", DATE)], 60.0),
        ([("retry-after", "soon"), ("retry-after", "7")], 7.0),  # a line that does not parse is left out
    ],
)
@pytest.mark.parametrize("joined", [False, True], ids=["field-lines", "joined"])
def test_a_retry_after_sent_twice_is_read_value_by_value(
    lines: list[tuple[str, str]], expected: float | None, joined: bool
) -> None:
    """Before: a Retry-After that an origin and a proxy both set arrived as "7, 7" (httpx joins
    them) and was read as no Retry-After at all: the client retried on its own backoff, too early."""
    headers: Any = httpx.Headers(lines)
    if joined:  # a plain mapping that joined the lines itself, as httpx's .get() does
        headers = {lines[0][0]: ", ".join(value for _, value in lines)}
        if lines[0][1] == "soon":  # joined, a list is read only if every item parses
            expected = None
    assert retry_after_from_headers(headers, DATE_EPOCH - 60) == (
        None if expected is None else pytest.approx(expected)
    )


def test_rate_limit_headers_sent_twice_are_read_cautiously() -> None:
    """Before: "0, 0" for remaining requests read as unknown, so a 429 whose quota was spent did
    not say so. Sent twice, the smallest limit and remaining win, and the longest reset."""
    headers = httpx.Headers(
        [
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-limit-tokens", "1000"),
            ("x-ratelimit-limit-tokens", "800"),
            ("x-ratelimit-reset-tokens", "1s"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ]
    )
    snapshot = parse_ratelimit_headers(headers)
    assert snapshot.remaining_requests == 0 and snapshot.limit_tokens == 800
    assert snapshot.reset_tokens_s == 360.0
    assert parse_ratelimit_headers({"x-ratelimit-remaining-requests": "0, 4"}).remaining_requests == 0
    # a thousands separator is no list: "1,000" was read as 0 remaining (a spent quota) and a 1 s reset
    thousands = parse_ratelimit_headers(
        {"x-ratelimit-remaining-tokens": "1,000", "x-ratelimit-reset-tokens": "1,000"}
    )
    assert thousands.remaining_tokens is None and thousands.reset_tokens_s is None


def test_snapshot_lowers_bucket_levels_but_never_raises_them() -> None:
    quota = MultiQuota(QuotaLimits(requests_per_min=600, tokens_per_min=100_000), now=0.0)
    assert apply_ratelimit_snapshot(
        RateLimitSnapshot(remaining_requests=3, remaining_tokens=1000), quota, 0.0
    )
    assert quota.requests is not None and quota.tokens is not None
    assert quota.requests.level(0.0) == 3
    assert quota.tokens.level(0.0) == 1000
    assert not quota.can_reserve(1001, 0.0)
    # the server says more is left than we think: the client's own view stays
    assert not apply_ratelimit_snapshot(
        RateLimitSnapshot(remaining_requests=500, remaining_tokens=10**9), quota, 0.0
    )
    assert quota.requests.level(0.0) == 3
    assert quota.tokens.level(0.0) == 1000
    apply_ratelimit_snapshot(RateLimitSnapshot(remaining_requests=-4), quota, 0.0)
    assert quota.requests.level(0.0) == 0


@given(
    local=st.floats(min_value=-50, max_value=1000),
    remaining=st.none() | st.floats(min_value=-10, max_value=10**6),
    reset=st.none() | st.floats(min_value=0, max_value=3600),
    rate=st.floats(min_value=0, max_value=1000),
    limit=st.none() | st.floats(min_value=0, max_value=10**6),
)
def test_corrected_level_never_exceeds_the_local_level(
    local: float, remaining: float | None, reset: float | None, rate: float, limit: float | None
) -> None:
    level = corrected_level(local, remaining, reset, rate, limit=limit)
    assert level <= local
    if remaining is not None:
        assert level <= max(0.0, remaining)


def test_corrected_level_lowers_to_the_server_count_and_ignores_more_room() -> None:
    assert corrected_level(10.0, 4.0, 30.0, rate=10.0) == 4.0  # quota left: no reset correction
    assert corrected_level(10.0, 500.0, 30.0, rate=10.0) == 10.0
    assert corrected_level(2.5, None, 30.0, rate=10.0) == 2.5
    assert corrected_level(2.5, math.nan, None, rate=10.0) == 2.5


def test_a_spent_server_quota_pushes_the_refill_past_its_reset() -> None:
    # the server has nothing left and is back to its limit of 60 in 6 s: one request in 0.1 s
    level = corrected_level(10.0, 0.0, 6.0, rate=100.0, limit=60.0)
    assert level == pytest.approx(1.0 - 100.0 * 0.1)
    bucket_wait = (1.0 - level) / 100.0  # when a bucket refilling at 100/s can grant one request
    assert bucket_wait == pytest.approx(0.1)
    # without the limit, the whole reset is waited (the cautious reading)
    assert corrected_level(10.0, 0.0, 6.0, rate=100.0) == pytest.approx(1.0 - 600.0)
    # a slower client bucket already waits longer than the server: no change beyond min()
    assert corrected_level(0.0, 0.0, 6.0, rate=1.0, limit=60.0) == 0.0


def test_a_reset_holds_a_lane_back_no_longer_than_the_longest_wait() -> None:
    """A reset header is a Retry-After by another name: bounded as max_retry_after_s bounds one.
    A reset of 99999 h (a server's bug, a spent daily quota) froze the lane for 11 years, silently."""
    assert corrected_level(10.0, 0.0, 359_996_400.0, rate=1.0, longest_wait_s=300.0) == 1.0 - 300.0
    assert corrected_level(10.0, 0.0, 6.0, rate=1.0, longest_wait_s=300.0) == 1.0 - 6.0  # shorter: as said
    quota = MultiQuota(QuotaLimits(requests_per_min=60), now=0.0)
    snapshot = RateLimitSnapshot(remaining_requests=0, reset_requests_s=parse_duration("99999h"))
    assert apply_ratelimit_snapshot(snapshot, quota, 0.0)  # the default bound: 300 s
    assert quota.time_until(0.0, 0.0) == pytest.approx(300.0)
    quota = MultiQuota(QuotaLimits(requests_per_min=60), now=0.0)
    assert apply_ratelimit_snapshot(snapshot, quota, 0.0, longest_wait_s=None)  # trust any: as before
    assert quota.time_until(0.0, 0.0) == pytest.approx(359_996_400.0)


def test_attach_to_bounds_resets_by_the_schedulers_max_retry_after() -> None:
    runtime = SimPyRuntime()
    provider = HttpProvider("llm", "http://127.0.0.1:9/v1/chat/completions")
    scheduler = Scheduler(
        runtime,
        [provider],
        quotas={"llm": QuotaLimits(requests_per_min=60)},
        retry=RetryPolicy(max_retry_after_s=30.0),
    )
    provider.attach_to(scheduler)
    provider._observe(
        httpx.Headers({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "99999h"})
    )
    assert scheduler.quota("llm").time_until(0.0, 0.0) == pytest.approx(30.0)


def test_snapshot_resets_are_converted_with_the_time_scale() -> None:
    quota = MultiQuota(QuotaLimits(requests_per_min=600), now=0.0)
    snapshot = RateLimitSnapshot(remaining_requests=0, reset_requests_s=0.5)  # wall seconds
    assert apply_ratelimit_snapshot(snapshot, quota, 0.0, time_scale=0.1)  # = 5 bucket seconds
    assert quota.requests is not None
    assert quota.time_until(0.0, 0.0) == pytest.approx(5.0)


def test_snapshot_leaves_unlimited_dimensions_alone() -> None:
    quota = MultiQuota(QuotaLimits(concurrency=2), now=0.0)
    assert not apply_ratelimit_snapshot(
        RateLimitSnapshot(remaining_requests=0, remaining_tokens=0), quota, 0.0
    )
    assert quota.can_reserve(10**6, 0.0)


def test_retry_after_prefers_ms_then_seconds_then_date() -> None:
    now = 1_700_000_000.0
    assert retry_after_from_headers({"retry-after-ms": "1500", "retry-after": "9"}, now) == 1.5
    assert retry_after_from_headers({"Retry-After": "2"}, now) == 2.0
    assert retry_after_from_headers({"retry-after": "0.25"}, now) == 0.25
    assert retry_after_from_headers({"retry-after": formatdate(now + 30, usegmt=True)}, now) == 30.0
    assert retry_after_from_headers({"retry-after": formatdate(now - 30, usegmt=True)}, now) == 0.0
    assert retry_after_from_headers({}, now) is None
    assert retry_after_from_headers({"retry-after": "soon"}, now) is None


@pytest.mark.parametrize(
    "millis", ["1e3", "1E3", "1_000", "+5", "-0", "-5", "nan", "inf", "0x10", "\u0661", ""]
)
def test_retry_after_ms_has_delta_seconds_grammar_and_falls_back(millis: str) -> None:
    """retry-after-ms is read as Retry-After's delta-seconds are (ASCII digits, an optional fraction):
    what float() alone would accept (a sign, an exponent, underscores) is not a wait the server sent."""
    now = 1_700_000_000.0
    assert retry_after_from_headers({"retry-after-ms": millis}, now) is None
    assert retry_after_from_headers({"retry-after-ms": millis, "retry-after": "3"}, now) == 3.0


def test_retry_after_ms_is_capped_like_delta_seconds() -> None:
    now = 1_700_000_000.0
    assert retry_after_from_headers({"retry-after-ms": " 250.5\t"}, now) == 0.2505
    assert retry_after_from_headers({"retry-after-ms": "0"}, now) == 0.0
    assert retry_after_from_headers({"retry-after-ms": "9" * 400}, now) == 2**31  # RFC 9111 §1.2.2
    assert retry_after_from_headers({"retry-after-ms": "1" + "0" * 300}, now) == 2**31


# ---------------------------------------------------------------------------- status mapping (pure)
QUOTA_BODY = error_json("You exceeded your current quota.", "insufficient_quota", "insufficient_quota")


@pytest.mark.parametrize(
    ("status", "body", "expected", "failure"),
    [
        (
            429,
            error_json("slow down", "requests", "rate_limit_exceeded"),
            RateLimitError,
            FailureClass.RETRYABLE,
        ),
        (429, QUOTA_BODY, QuotaExhaustedError, FailureClass.FATAL),
        (403, QUOTA_BODY, QuotaExhaustedError, FailureClass.FATAL),
        (403, error_json("country not supported", "permission_error"), HttpStatusError, FailureClass.FATAL),
        (
            401,
            error_json("bad key", "invalid_request_error", "invalid_api_key"),
            HttpStatusError,
            FailureClass.FATAL,
        ),
        (400, error_json("bad", "invalid_request_error"), InvalidRequestError, FailureClass.FATAL),
        (422, None, InvalidRequestError, FailureClass.FATAL),
        (404, None, InvalidRequestError, FailureClass.FATAL),
        (408, None, ProviderTimeoutError, FailureClass.RETRYABLE),
        (409, None, ServerError, FailureClass.RETRYABLE),
        (500, "oops", ServerError, FailureClass.RETRYABLE),
        (502, None, ServerError, FailureClass.RETRYABLE),
        (503, None, ServerError, FailureClass.RETRYABLE),
    ],
)
def test_error_for_status_maps_onto_the_taxonomy(
    status: int, body: Any, expected: type[ProviderError], failure: FailureClass
) -> None:
    error = error_for_status(status, body=body, source="p")
    assert type(error) is expected
    assert classify_failure(error, attempts=1) is failure
    assert f"HTTP {status}" in str(error)
    if isinstance(error, ServerError | HttpStatusError):
        assert error.status == status


@pytest.mark.parametrize("status", [200, 201, 204, 299])
def test_error_for_status_is_none_for_2xx(status: int) -> None:
    assert error_for_status(status) is None


def test_rate_limit_retry_after_is_converted_to_scheduler_seconds() -> None:
    error = error_for_status(429, headers={"Retry-After": "3"}, time_scale=0.5)
    assert isinstance(error, RateLimitError) and error.retry_after_s == 6.0
    bare = error_for_status(429)
    assert isinstance(bare, RateLimitError) and bare.retry_after_s is None


@pytest.mark.parametrize(
    ("headers", "body", "spent"),
    [
        ({"x-ratelimit-remaining-requests": "0", "x-ratelimit-remaining-tokens": "900"}, None, True),
        ({"x-ratelimit-remaining-requests": "12", "x-ratelimit-remaining-tokens": "0"}, None, True),
        ({"x-ratelimit-remaining-tokens": "0.4"}, None, True),  # less than one whole unit left
        ({"x-ratelimit-remaining-requests": "12", "x-ratelimit-remaining-tokens": "900"}, None, False),
        ({"x-ratelimit-remaining-requests": "1"}, error_json("slow down", "requests"), False),
        ({}, None, None),
        ({"x-ratelimit-remaining-requests": "many"}, error_json("slow down", "requests"), None),
        # an explicit quota error body says it even without headers, and beats a positive count
        ({}, error_json("Rate limit reached for gpt-4o on requests per min (RPM)", "requests"), True),
        ({"x-ratelimit-remaining-requests": "5"}, error_json("server quota exceeded", "requests"), True),
        ({}, {"error": {"message": "Resource has been exhausted (e.g. check quota).", "status": "x"}}, True),
        ({}, {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "try later"}}, True),
    ],
)
def test_a_429_says_whether_the_quota_is_spent(
    headers: dict[str, str], body: Any, spent: bool | None
) -> None:
    error = error_for_status(429, headers=headers, body=body)
    assert isinstance(error, RateLimitError)
    assert error.quota_spent is spent


def test_a_503_retry_after_becomes_the_server_errors_retry_after() -> None:
    """RFC 9110 §10.2.3 defines Retry-After on 503 (urllib3 honours it on 413, 429, 503)."""
    now = 1_700_000_000.0
    error = error_for_status(503, headers={"Retry-After": "3600"}, now_epoch_s=now)
    assert isinstance(error, ServerError) and error.status == 503 and error.retry_after_s == 3600.0
    dated = error_for_status(503, headers={"retry-after": formatdate(now + 90, usegmt=True)}, now_epoch_s=now)
    assert isinstance(dated, ServerError) and dated.retry_after_s == 90.0
    scaled = error_for_status(503, headers={"retry-after-ms": "1500"}, time_scale=0.5)
    assert isinstance(scaled, ServerError) and scaled.retry_after_s == 3.0
    assert error_for_status(503).retry_after_s is None  # type: ignore[union-attr]
    assert error_for_status(503, headers={"Retry-After": "+5"}).retry_after_s is None  # type: ignore[union-attr]
    # other 5xx keep no pause: the RFC gives Retry-After no meaning there
    assert error_for_status(500, headers={"Retry-After": "5"}).retry_after_s is None  # type: ignore[union-attr]


def test_is_quota_exhausted_reads_codes_types_and_prose() -> None:
    assert is_quota_exhausted(QUOTA_BODY)
    assert is_quota_exhausted({"code": "billing_hard_limit_reached"})
    assert is_quota_exhausted({"error": {"message": "Your credit balance is too low to access the API"}})
    assert not is_quota_exhausted(error_json("Rate limit reached for tokens per min", "tokens"))
    assert not is_quota_exhausted(None)
    assert not is_quota_exhausted("plain text")


def test_estimate_matches_the_local_token_rule() -> None:
    assert estimate_chat_tokens("x" * 9) == 3 + 16
    assert estimate_chat_tokens({"messages": [{"role": "user", "content": "abcd"}], "max_tokens": 5}) == 1 + 5


# ---------------------------------------------------------------------------- CallableProvider
class FlakyBackend(Exception):
    """A user's own exception type, mapped by an error mapper."""


def test_callable_provider_wraps_results_and_passes_responses_through() -> None:
    async def plain(request: ProviderRequest) -> Any:
        return {"echo": request.payload}

    async def with_usage(request: ProviderRequest) -> Any:
        return ProviderResponse(result="r", usage=42.0)

    assert run(CallableProvider("a", plain).call(make_request("x"))) == ProviderResponse({"echo": "x"})
    assert run(CallableProvider("b", with_usage).call(make_request())) == ProviderResponse("r", 42.0)
    assert (
        run(CallableProvider("c", lambda request: request.attempt).call(make_request(attempt=3))).result == 3
    )


def test_callable_provider_maps_foreign_errors_only() -> None:
    def mapper(exc: Exception) -> BaseException | None:
        return ServerError("backend flaked", status=503) if isinstance(exc, FlakyBackend) else None

    async def flaky(request: ProviderRequest) -> Any:
        raise FlakyBackend("boom")

    async def buggy(request: ProviderRequest) -> Any:
        raise KeyError("bug")

    async def already_mapped(request: ProviderRequest) -> Any:
        raise RateLimitError(retry_after_s=2.0)

    with pytest.raises(ServerError) as mapped:
        run(CallableProvider("p", flaky, error_mapper=mapper).call(make_request()))
    assert mapped.value.status == 503 and isinstance(mapped.value.__cause__, FlakyBackend)
    with pytest.raises(KeyError):
        run(CallableProvider("p", buggy, error_mapper=mapper).call(make_request()))
    with pytest.raises(FlakyBackend):
        run(CallableProvider("p", flaky).call(make_request()))
    with pytest.raises(RateLimitError) as passed:
        run(
            CallableProvider("p", already_mapped, error_mapper=lambda exc: ServerError()).call(make_request())
        )
    assert passed.value.retry_after_s == 2.0


@pytest.mark.parametrize(
    ("args", "options", "named"),
    [
        (("", lambda r: None), {}, "name"),
        ((None, lambda r: None), {}, "name"),
        (("p", "not a function"), {}, "fn"),
        (("p", lambda r: None), {"lookup": "x"}, "lookup"),
        (("p", lambda r: None), {"estimate_cost": 3}, "estimate_cost"),
        (("p", lambda r: None), {"error_mapper": {}}, "error_mapper"),
    ],
)
def test_callable_provider_refuses_arguments_that_cannot_work(
    args: tuple[Any, ...], options: dict[str, Any], named: str
) -> None:
    from aiqsim.core.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=f"^{named}: expected") as refused:
        CallableProvider(*args, **options)
    assert isinstance(refused.value, TypeError)  # callers catching the old builtin still do


def test_an_error_mapper_that_returns_no_exception_fails_the_call_as_a_broken_contract() -> None:
    async def flaky(request: ProviderRequest) -> Any:
        raise FlakyBackend("boom")

    provider = CallableProvider("p", flaky, error_mapper=lambda exc: "retry please")
    with pytest.raises(ProviderContractError, match="error_mapper returned 'retry please'") as broken:
        run(provider.call(make_request()))
    assert isinstance(broken.value.__cause__, FlakyBackend) and "FlakyBackend: boom" in str(broken.value)


def test_callable_provider_lookup_and_estimate() -> None:
    done = {"k1": "stored"}

    async def lookup(key: str) -> Any:
        return done.get(key)

    provider = CallableProvider(
        "p", lambda r: None, lookup=lookup, estimate_cost=lambda kind, payload: len(payload)
    )
    assert run(provider.lookup("k1")) == ProviderResponse("stored")
    assert run(provider.lookup("k2")) is None
    assert provider.estimate_cost("llm", "abcd") == 4.0
    bare = CallableProvider("p", lambda r: None)
    assert run(bare.lookup("k1")) is None and bare.estimate_cost("llm", "abcd") == 0.0


def test_callable_provider_retries_mapped_failures_in_the_scheduler() -> None:
    calls: list[int] = []

    async def backend(request: ProviderRequest) -> Any:
        calls.append(request.attempt)
        if len(calls) < 3:
            raise FlakyBackend("transient")
        return f"done after {request.attempt}"

    def mapper(exc: Exception) -> BaseException | None:
        return ServerError(str(exc), status=502) if isinstance(exc, FlakyBackend) else None

    runtime = AsyncioRuntime(time_scale=0.001)

    async def main() -> Any:
        provider = CallableProvider("llm", backend, error_mapper=mapper)
        retry = RetryPolicy(backoff=ConstantBackoff(1.0), max_attempts=5)
        scheduler = Scheduler(runtime, [provider], retry=retry, rng=random.Random(0))
        record = await scheduler.submit("llm", "x", cost_estimate=1).wait()
        await scheduler.close()
        return record

    record = runtime.run(main())
    assert record.status is TaskStatus.SUCCEEDED
    assert record.result == "done after 3" and record.attempts == 3
    assert calls == [1, 2, 3]


# ---------------------------------------------------------------------------- openai SDK mapper
# Stand-ins for openai._exceptions (openai>=1.0): same class names, hierarchy and attributes.
class OpenAIError(Exception):
    pass


class APIError(OpenAIError):
    def __init__(self, message: str, request: httpx.Request, *, body: object | None) -> None:
        super().__init__(message)
        self.request = request
        self.message = message
        self.body = body
        inner = body if isinstance(body, dict) else {}
        self.code = inner.get("code")
        self.param = inner.get("param")
        self.type = inner.get("type")


class APIResponseValidationError(APIError):
    def __init__(self, response: httpx.Response, body: object | None) -> None:
        super().__init__("Data returned by API invalid for expected schema.", response.request, body=body)
        self.response = response
        self.status_code = response.status_code


class APIStatusError(APIError):
    def __init__(self, message: str, *, response: httpx.Response, body: object | None) -> None:
        super().__init__(message, response.request, body=body)
        self.response = response
        self.status_code = response.status_code
        self.request_id = response.headers.get("x-request-id")


class APIConnectionError(APIError):
    def __init__(self, *, message: str = "Connection error.", request: httpx.Request) -> None:
        super().__init__(message, request, body=None)


class APITimeoutError(APIConnectionError):
    def __init__(self, request: httpx.Request) -> None:
        super().__init__(message="Request timed out.", request=request)


class BadRequestError(APIStatusError):
    status_code = 400


class AuthenticationError(APIStatusError):
    status_code = 401


class PermissionDeniedError(APIStatusError):
    status_code = 403


class NotFoundError(APIStatusError):
    status_code = 404


class ConflictError(APIStatusError):
    status_code = 409


class UnprocessableEntityError(APIStatusError):
    status_code = 422


class RateLimitErrorSDK(APIStatusError):  # renamed below so the class name matches the SDK's
    status_code = 429


RateLimitErrorSDK.__name__ = "RateLimitError"
RateLimitErrorSDK.__qualname__ = "RateLimitError"


class InternalServerError(APIStatusError):
    pass


class LengthFinishReasonError(OpenAIError):
    pass


SDK_REQUEST = httpx.Request("POST", "https://api.openai.com/v1/chat/completions")


def sdk_status_error(
    cls: type[APIStatusError], status: int, body: Any = None, headers: Any = None
) -> APIStatusError:
    """Build an SDK status error the way openai's client does (``body`` = the inner error object)."""
    response = httpx.Response(
        status, headers=headers or {}, json={"error": body} if body else None, request=SDK_REQUEST
    )
    return cls(f"Error code: {status} - {body}", response=response, body=body)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (APITimeoutError(SDK_REQUEST), ProviderTimeoutError),
        (APIConnectionError(request=SDK_REQUEST), ServerError),
        (
            sdk_status_error(RateLimitErrorSDK, 429, {"message": "slow", "code": "rate_limit_exceeded"}),
            RateLimitError,
        ),
        (sdk_status_error(RateLimitErrorSDK, 429, QUOTA_BODY["error"]), QuotaExhaustedError),
        (sdk_status_error(InternalServerError, 500), ServerError),
        (sdk_status_error(InternalServerError, 503), ServerError),
        (
            sdk_status_error(
                BadRequestError, 400, {"message": "context too long", "code": "context_length_exceeded"}
            ),
            InvalidRequestError,
        ),
        (sdk_status_error(UnprocessableEntityError, 422), InvalidRequestError),
        (sdk_status_error(NotFoundError, 404, {"message": "model not found"}), InvalidRequestError),
        (sdk_status_error(ConflictError, 409), ServerError),
        (
            sdk_status_error(AuthenticationError, 401, {"message": "bad key", "code": "invalid_api_key"}),
            HttpStatusError,
        ),
        (sdk_status_error(PermissionDeniedError, 403, {"message": "no"}), HttpStatusError),
        (sdk_status_error(APIStatusError, 418), HttpStatusError),
        (
            APIResponseValidationError(httpx.Response(200, request=SDK_REQUEST), body={"x": 1}),
            SchemaViolationError,
        ),
        (LengthFinishReasonError("output cut at max_tokens"), SchemaViolationError),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else value.__name__,
)
def test_openai_mapper_maps_sdk_exceptions(exc: BaseException, expected: type[ProviderError]) -> None:
    mapped = map_openai_error(exc)
    assert type(mapped) is expected
    if isinstance(exc, APIStatusError) and isinstance(mapped, ServerError | HttpStatusError):
        assert mapped.status == exc.status_code
    if isinstance(exc, APIConnectionError) and isinstance(mapped, ServerError):
        assert mapped.status == 0


def test_openai_mapper_reads_retry_after_from_the_response() -> None:
    seconds = sdk_status_error(RateLimitErrorSDK, 429, {"message": "slow"}, headers={"retry-after": "7"})
    millis = sdk_status_error(RateLimitErrorSDK, 429, {"message": "slow"}, headers={"retry-after-ms": "250"})
    now = 1_700_000_000.0
    date = sdk_status_error(
        RateLimitErrorSDK,
        429,
        {"message": "slow"},
        headers={"retry-after": formatdate(now + 20, usegmt=True)},
    )
    assert map_openai_error(seconds).retry_after_s == 7.0  # type: ignore[union-attr]
    assert map_openai_error(millis).retry_after_s == 0.25  # type: ignore[union-attr]
    assert map_openai_error(date, wall_clock=lambda: now).retry_after_s == 20.0  # type: ignore[union-attr]
    scaled = openai_error_mapper(time_scale=0.1)(seconds)
    assert isinstance(scaled, RateLimitError) and scaled.retry_after_s == pytest.approx(70.0)


def test_openai_mapper_ignores_other_exceptions() -> None:
    assert map_openai_error(ValueError("x")) is None
    assert map_openai_error(TimeoutError()) is None

    class RateLimitError(Exception):  # same name, but not from an SDK hierarchy
        status_code = 429

    assert map_openai_error(RateLimitError()) is None


def test_openai_mapper_drives_scheduler_retries() -> None:
    attempts: list[float] = []
    runtime = AsyncioRuntime(time_scale=0.01)

    async def sdk_call(request: ProviderRequest) -> Any:
        attempts.append(runtime.now())
        if len(attempts) == 1:
            raise sdk_status_error(
                RateLimitErrorSDK, 429, {"message": "slow"}, headers={"retry-after": "0.05"}
            )
        return "ok"

    async def main() -> Any:
        mapper = openai_error_mapper(time_scale=runtime.time_scale)
        provider = CallableProvider("llm", sdk_call, error_mapper=mapper)
        retry = RetryPolicy(backoff=ConstantBackoff(0.1), max_attempts=3)
        scheduler = Scheduler(runtime, [provider], retry=retry, rng=random.Random(1))
        record = await scheduler.submit("llm", "q", cost_estimate=1).wait()
        await scheduler.close()
        return record

    record = runtime.run(main())
    assert record.status is TaskStatus.SUCCEEDED and record.attempts == 2
    # 0.05 wall seconds at time_scale 0.01 = 5 scheduler seconds, far above the 0.1 s backoff
    assert attempts[1] - attempts[0] >= 5.0 - 1e-6


# ---------------------------------------------------------------------------- HttpProvider over HTTP
class ScriptedServer:
    """A loopback server whose replies are chosen per path by the test: ``/case/<name>``."""

    def __init__(self) -> None:
        self.cases: dict[str, Any] = {}
        self.seen: list[HttpRequest] = []
        self.http = LoopbackHttpServer(self.handle, name="scripted")

    async def handle(self, request: HttpRequest) -> HttpReply | DropConnection:
        self.seen.append(request)
        case = self.cases[request.path.removeprefix("/case/")]
        if callable(case):
            return await case(request)
        return case


@pytest.fixture(scope="module")
def scripted() -> Any:
    server = ScriptedServer()
    with server.http:
        yield server


def provider_for(scripted: ScriptedServer, case: str, reply: Any, **options: Any) -> HttpProvider:
    scripted.cases[case] = reply
    return HttpProvider("llm", scripted.http.url, path=f"/case/{case}", **options)


async def call_once(provider: HttpProvider, request: ProviderRequest | None = None) -> ProviderResponse:
    try:
        return await provider.call(request or make_request())
    finally:
        await provider.aclose()


def test_a_body_larger_than_the_limit_is_not_read_into_memory(scripted: ScriptedServer) -> None:
    """aread() took any size: a body that never ended grew the process by 1.4 GB in 10 s."""
    body = completion_json("c1", "m", "x" * 5000, prompt=3, output=4, created=0)
    provider = provider_for(scripted, "big", HttpReply.json(200, body), max_response_bytes=4096)
    with pytest.raises(SchemaViolationError, match=r"larger than max_response_bytes \(4,096 bytes\)"):
        run(call_once(provider))
    provider = provider_for(scripted, "big", HttpReply.json(200, body))  # the default: 64 MiB
    assert run(call_once(provider)).result == "x" * 5000


@pytest.mark.parametrize(
    ("case", "body", "said"),
    [
        ("deep", b"[" * 100_000, "HTTP 200"),  # a bare RecursionError from json
        (
            "bigint",
            b'{"choices":[{"message":{"content":"hi"}}],"usage":{"total_tokens":1' + b"0" * 400 + b"}}",
            None,
        ),
    ],
)
def test_an_answer_json_cannot_hold_is_no_raw_error(
    scripted: ScriptedServer, case: str, body: bytes, said: Any
) -> None:
    provider = provider_for(scripted, case, HttpReply(200, body, {"content-type": "application/json"}))
    if said is None:  # a usage count beyond any float (an OverflowError) is no usage: the answer stands
        assert run(call_once(provider)).result == "hi"
        return
    with pytest.raises(SchemaViolationError, match=said):
        run(call_once(provider))


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://[::1", "ftp://host", "127.0.0.1:8000", ""])
def test_a_base_url_no_request_can_go_to_is_refused_when_the_provider_is_made(url: str) -> None:
    """Each was accepted, then every call failed (a raw InvalidURL, an ExceptionGroup around an
    OverflowError, or a 'connection failed' that was retried as if the server were down)."""
    with pytest.raises(ConfigurationError, match="provider 'llm': base_url"):
        HttpProvider("llm", url)


def test_http_provider_posts_json_with_the_idempotency_key(scripted: ScriptedServer) -> None:
    body = completion_json("c1", "m", "hello back", prompt=3, output=4, created=0)
    provider = provider_for(
        scripted, "ok", HttpReply.json(200, body), headers={"Authorization": "Bearer t"}, model="m"
    )
    response = run(call_once(provider, make_request("hello", key="abc-123")))
    assert response == ProviderResponse(result="hello back", usage=7.0, output_units=4.0)
    seen = scripted.seen[-1]
    assert seen.method == "POST" and seen.path == "/case/ok"
    assert seen.headers["idempotency-key"] == "abc-123"
    assert seen.headers["authorization"] == "Bearer t"
    assert seen.json() == {"messages": [{"role": "user", "content": "hello"}], "model": "m"}


@pytest.mark.parametrize(
    ("name", "reply", "expected"),
    [
        ("r429", HttpReply.json(429, error_json("slow", "requests"), {"retry-after": "2"}), RateLimitError),
        ("quota429", HttpReply.json(429, QUOTA_BODY), QuotaExhaustedError),
        ("quota403", HttpReply.json(403, QUOTA_BODY), QuotaExhaustedError),
        ("auth401", HttpReply.json(401, error_json("bad key", "invalid_request_error")), HttpStatusError),
        ("s500", HttpReply(500, b"<html>oops</html>"), ServerError),
        ("s503", HttpReply.json(503, error_json("overloaded", "server_error")), ServerError),
        ("bad400", HttpReply.json(400, error_json("bad", "invalid_request_error")), InvalidRequestError),
        ("bad422", HttpReply.json(422, {"detail": "no"}), InvalidRequestError),
        (
            "notjson",
            HttpReply(200, b"<html>hello</html>", {"content-type": "text/html"}),
            SchemaViolationError,
        ),
        ("noshape", HttpReply.json(200, {"result": "x"}), SchemaViolationError),
        (
            "nocontent",
            HttpReply.json(200, {"choices": [{"message": {"content": None}}]}),
            SchemaViolationError,
        ),
        ("hangup", DropConnection(hold_s=0), ServerError),
    ],
)
def test_http_provider_maps_statuses(scripted: ScriptedServer, name: str, reply: Any, expected: type) -> None:
    with pytest.raises(expected) as caught:
        run(call_once(provider_for(scripted, name, reply)))
    if name == "r429":
        assert caught.value.retry_after_s == 2.0
    if name.startswith("s"):
        assert caught.value.status == int(name[1:])
    if name == "hangup":
        assert caught.value.status == 0


def test_http_provider_carries_a_503_retry_after_in_scheduler_seconds(scripted: ScriptedServer) -> None:
    reply = HttpReply.json(503, error_json("maintenance", "server_error"), {"retry-after": "3600"})
    with pytest.raises(ServerError) as caught:
        run(call_once(provider_for(scripted, "s503_retry_after", reply, time_scale=0.01)))
    assert caught.value.status == 503 and caught.value.retry_after_s == pytest.approx(360_000.0)


@pytest.mark.parametrize(("remaining", "spent"), [("0", True), ("4", False), (None, None)])
def test_http_provider_reports_whether_a_429_spent_the_quota(
    scripted: ScriptedServer, remaining: str | None, spent: bool | None
) -> None:
    headers = {"retry-after": "1"} | (
        {} if remaining is None else {"x-ratelimit-remaining-requests": remaining}
    )
    reply = HttpReply.json(429, error_json("slow", "requests"), headers)
    with pytest.raises(RateLimitError) as caught:
        run(call_once(provider_for(scripted, f"spent_{remaining}", reply)))
    assert caught.value.quota_spent is spent


def test_http_provider_reads_http_date_retry_after_in_scaled_time(scripted: ScriptedServer) -> None:
    wall_now = time.time()
    reply = HttpReply.json(
        429, error_json("slow", "requests"), {"retry-after": formatdate(wall_now + 4, usegmt=True)}
    )
    provider = provider_for(scripted, "date", reply, time_scale=0.5, wall_clock=lambda: wall_now)
    with pytest.raises(RateLimitError) as caught:
        run(call_once(provider))
    # HTTP dates have whole seconds: 4 wall seconds, minus the fraction lost to truncation, at 2x
    assert 6.0 < caught.value.retry_after_s <= 8.0


def test_http_provider_times_out(scripted: ScriptedServer) -> None:
    async def slow(request: HttpRequest) -> HttpReply:
        await asyncio.sleep(1.0)
        return HttpReply.json(200, completion_json("c", "m", "late", 1, 1, 0))

    started = time.perf_counter()
    with pytest.raises(ProviderTimeoutError):
        run(call_once(provider_for(scripted, "slow", slow, timeout=0.1)))
    assert time.perf_counter() - started < 0.9


def test_http_provider_reports_refused_connections_as_status_0() -> None:
    with LoopbackHttpServer(lambda request: None) as closed:  # type: ignore[arg-type,return-value]
        url = closed.url
    provider = HttpProvider("llm", url, timeout=2.0)
    with pytest.raises(ServerError) as caught:
        run(call_once(provider))
    assert caught.value.status == 0
    assert classify_failure(caught.value, attempts=1) is FailureClass.RETRYABLE


def test_http_provider_corrects_the_bound_quota_from_headers(scripted: ScriptedServer) -> None:
    headers = {
        "x-ratelimit-remaining-requests": "7",
        "x-ratelimit-remaining-tokens": "900",
        "retry-after": "1",
    }
    quota = MultiQuota(QuotaLimits(requests_per_min=600, tokens_per_min=60_000), now=0.0)
    ok = provider_for(
        scripted,
        "headers_ok",
        HttpReply.json(200, completion_json("c", "m", "x", 1, 1, 0), headers),
        quota=quota,
        clock=lambda: 0.0,
    )
    run(call_once(ok))
    assert quota.levels(0.0)[:2] == (7.0, 900.0)
    assert ok.last_ratelimit is not None and ok.last_ratelimit.remaining_requests == 7
    # a 429 carries the headers too, and they are applied before the error is raised
    limited = provider_for(
        scripted,
        "headers_429",
        HttpReply.json(429, error_json("slow", "tokens"), {**headers, "x-ratelimit-remaining-tokens": "0"}),
        quota=quota,
        clock=lambda: 0.0,
    )
    with pytest.raises(RateLimitError):
        run(call_once(limited))
    assert quota.levels(0.0)[1] == 0.0


def test_http_provider_lookup(scripted: ScriptedServer) -> None:
    stored = completion_json("c9", "m", "done before", 2, 3, 0)

    async def lookup(request: HttpRequest) -> HttpReply:
        key = request.path.rsplit("/", 1)[-1]
        if key == "known key":
            return HttpReply.json(200, {"key": key, "response": stored})
        return HttpReply.json(404, error_json("unknown", "not_found"))

    scripted.cases["lookup/known key"] = lookup
    scripted.cases["lookup/other"] = lookup
    provider = HttpProvider("llm", scripted.http.url, lookup_path="/case/lookup/{key}")

    async def both() -> tuple[Any, Any]:
        try:
            return await provider.lookup("known key"), await provider.lookup("other")
        finally:
            await provider.aclose()

    assert run(both()) == (ProviderResponse("done before", 5.0), None)
    assert run(HttpProvider("llm", scripted.http.url).lookup("known key")) is None


@pytest.mark.parametrize("key", ["café-42", "line\nbreak", " leading-space", "tab\tend\t", "sha256:abc"])
def test_a_key_http_cannot_carry_is_sent_and_looked_up_as_its_sha256(
    scripted: ScriptedServer, key: str
) -> None:
    """Before: a non-ASCII key failed its task with a raw UnicodeEncodeError, and a key with a control
    character or a leading space was refused inside httpx and retried as 'connection failed' until
    the attempts ran out; the server saw nothing. A key that starts with the hashed form's prefix is
    hashed too, so no two keys share a header value."""
    import hashlib

    hashed = "sha256:" + hashlib.sha256(key.encode()).hexdigest()
    body = completion_json("c1", "m", "hi", prompt=1, output=1, created=0)
    provider = provider_for(
        scripted, "unsendable_key", HttpReply.json(200, body, {"idempotency-key": hashed})
    )
    assert run(call_once(provider, make_request("x", key=key))).result == "hi"
    assert scripted.seen[-1].headers["idempotency-key"] == hashed

    async def lookup(request: HttpRequest) -> HttpReply:
        found = request.path.rsplit("/", 1)[-1] == hashed
        return HttpReply.json(200, {"response": body}) if found else HttpReply.json(404, {})

    scripted.cases[f"lookup/{hashed}"] = lookup
    looker = HttpProvider("llm", scripted.http.url, lookup_path="/case/lookup/{key}")
    assert run(looker.lookup(key)) == ProviderResponse("hi", 2.0)


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"timeout": math.nan}, "timeout must be a finite number of seconds > 0"),
        ({"timeout": -1.0}, "timeout must be a finite number of seconds > 0"),
        ({"timeout": 0.0}, "timeout must be a finite number of seconds > 0"),
        ({"timeout": math.inf}, "timeout must be a finite number of seconds > 0"),
        ({"timeout": httpx.Timeout(5.0, read=math.nan)}, "timeout.read must be"),
        ({"time_scale": math.inf}, "time_scale must be a finite number > 0"),
        ({"time_scale": 1e-320}, "time_scale must be a finite number > 0"),
        (
            {"headers": {"Authorization": "Bearer é"}},
            "header 'Authorization' value 'Bearer é' is not sendable",
        ),
        ({"headers": {"X-Note": "two\nlines"}}, "is not sendable"),
        ({"headers": {"bad name": "x"}}, "header name 'bad name' is not an HTTP token"),
        ({"headers": {"X-Count": 3}}, "has a int value, not text"),
    ],
)
def test_settings_no_call_could_work_with_are_refused_when_the_provider_is_made(
    options: dict[str, Any], said: str
) -> None:
    """Before: each was accepted, then every call failed (a raw ValueError for a NaN timeout, a
    timeout before sending for 0 or less, a raw UnicodeEncodeError for a non-ASCII header) or, for
    an infinite timeout, quietly had none."""
    with pytest.raises(ConfigurationError, match=re.escape(said)):
        HttpProvider("llm", "http://127.0.0.1:1", **options)


def test_no_timeout_and_unlimited_timeout_parts_are_still_accepted() -> None:
    HttpProvider("llm", "http://127.0.0.1:1", timeout=None)
    HttpProvider("llm", "http://127.0.0.1:1", timeout=httpx.Timeout(5.0, pool=None))


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": b"Bearer sk-abc"},
        {b"Authorization": b"Bearer sk-abc"},
        [("Authorization", "Bearer sk-abc")],
        httpx.Headers({"Authorization": "Bearer sk-abc"}),
    ],
    ids=["bytes-value", "bytes-name", "pairs", "httpx-headers"],
)
def test_headers_in_every_form_httpx_sends_are_accepted_and_sent(
    scripted: ScriptedServer, headers: Any
) -> None:
    """The first version of the header check (review) refused bytes, which httpx sends as given,
    and failed on a list of pairs with a raw AttributeError."""
    body = completion_json("c1", "m", "hi", prompt=1, output=1, created=0)
    provider = provider_for(scripted, "header_forms", HttpReply.json(200, body), headers=headers)
    assert run(call_once(provider)).result == "hi"
    assert scripted.seen[-1].headers["authorization"] == "Bearer sk-abc"


def test_the_openai_sdks_json_error_on_a_page_that_is_no_json_is_a_schema_violation(
    scripted: ScriptedServer,
) -> None:
    """Before: the real openai SDK let a 200 whose body is an HTML page (a proxy's login page) escape
    as a plain json.JSONDecodeError, which the mapper did not know: the task failed fatally on its
    first attempt, where HttpProvider retries the same answer as a schema violation. A
    JSONDecodeError of the caller's own parsing is still not the SDK's."""
    import json as json_module

    import openai

    scripted.cases["v1/chat/completions"] = HttpReply(
        200, b"<html>proxy login</html>", {"content-type": "application/json"}
    )
    client = openai.AsyncOpenAI(base_url=scripted.http.url + "/case/v1", api_key="sk-test", max_retries=0)

    async def ask() -> BaseException:
        try:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        except Exception as error:  # the SDK's own exception, as a CallableProvider sees it
            return error
        finally:
            await client.close()
        raise AssertionError("the SDK accepted an HTML page")

    raised = run(ask())
    assert isinstance(raised, json_module.JSONDecodeError)
    mapped = map_openai_error(raised)
    assert isinstance(mapped, SchemaViolationError) and "openai: the response body is not JSON" in str(mapped)
    try:
        json_module.loads("<html>")
    except json_module.JSONDecodeError as own:
        assert map_openai_error(own) is None


def test_http_provider_requires_a_clock_with_a_quota() -> None:
    with pytest.raises(ValueError, match="clock"):
        HttpProvider("llm", "http://127.0.0.1:1", quota=MultiQuota(QuotaLimits()))


def test_httpx_is_imported_lazily_with_a_clear_error() -> None:
    code = (
        "import sys\n"
        "import aiqsim.http\n"
        "assert 'httpx' not in sys.modules, 'aiqsim.http imported httpx eagerly'\n"
        "assert 'aiqsim.sim' not in sys.modules, 'aiqsim.http imported the simulation lab eagerly'\n"
        "sys.modules['httpx'] = None\n"
        "try:\n"
        "    aiqsim.http.HttpProvider('llm', 'http://127.0.0.1:1')\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "pip install 'aiqsim[http]'" in result.stdout


# ---------------------------------------------------------------------------- broken exchanges
def test_a_broken_gzip_body_is_a_retryable_decoding_error(scripted: ScriptedServer) -> None:
    reply = HttpReply(
        200, b'{"not": "gzip at all"}', {"content-encoding": "gzip", "content-type": "application/json"}
    )
    with pytest.raises(ResponseDecodingError) as caught:
        run(call_once(provider_for(scripted, "badgzip", reply)))
    assert isinstance(caught.value, ServerError) and caught.value.status == 0
    assert "gzip" in str(caught.value)
    assert classify_failure(caught.value, attempts=1) is FailureClass.RETRYABLE


def test_the_scheduler_retries_past_a_broken_gzip_body(scripted: ScriptedServer) -> None:
    good = completion_json("c", "m", "decoded fine", 1, 1, 0)
    served: list[int] = []

    async def flaky(request: HttpRequest) -> HttpReply:
        served.append(1)
        if len(served) == 1:
            return HttpReply(200, b"\x1f\x8b\x08garbage", {"content-encoding": "gzip"})
        return HttpReply.json(200, good)

    provider = provider_for(scripted, "gzip_then_ok", flaky)
    runtime = AsyncioRuntime()

    async def main() -> Any:
        retry = RetryPolicy(backoff=ConstantBackoff(0.01), max_attempts=3)
        scheduler = Scheduler(runtime, [provider], retry=retry, rng=random.Random(2))
        record = await scheduler.submit("llm", "q", cost_estimate=1).wait()
        await scheduler.close()
        await provider.aclose()
        return record

    record = runtime.run(main())
    assert record.status is TaskStatus.SUCCEEDED and record.result == "decoded fine"
    assert record.attempts == 2


class RawSocketServer:
    """A hand-written HTTP/1.1 server on a raw socket, for answers no real server library would send.

    ``extra(key)`` gives bytes written *after* the answer to the request carrying Idempotency-Key
    ``key``, in the same ``sendall`` (so they land in the client's buffer with the answer).
    Every answer echoes the request's key when ``echo`` is set.
    """

    def __init__(self, extra: Any, *, echo: bool = True, echoes: Any = None) -> None:
        self.extra = extra
        self.echo = echo
        self.echoes = echoes
        """``echoes(key)``: the Idempotency-Key values to send, one header line each (else the key once)."""
        self.connections = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    @staticmethod
    def answer(key: str | None, content: str, echoes: list[str] | None = None) -> bytes:
        body = json.dumps(completion_json("c", "m", content, 1, 1, 0)).encode()
        lines = echoes if echoes is not None else [key] if key is not None else []
        echo = "".join(f"idempotency-key: {value}\r\n" for value in lines)
        head = (
            f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n{echo}\r\n"
        )
        return head.encode() + body

    def __enter__(self) -> RawSocketServer:
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(0.2)
        buffer = b""
        with conn:
            while not self._stop.is_set():
                try:
                    while b"\r\n\r\n" not in buffer:
                        data = conn.recv(65536)
                        if not data:
                            return
                        buffer += data
                    head, _, rest = buffer.partition(b"\r\n\r\n")
                    fields = dict(line.split(":", 1) for line in head.decode("latin-1").split("\r\n")[1:])
                    headers = {name.strip().lower(): value.strip() for name, value in fields.items()}
                    length = int(headers.get("content-length", "0"))
                    while len(rest) < length:
                        rest += conn.recv(65536)
                    buffer = rest[length:]
                    key = headers.get("idempotency-key")
                    echoes = self.echoes(key) if self.echoes is not None else None
                    answer = self.answer(key if self.echo else None, f"answer {key}", echoes)
                    conn.sendall(answer + self.extra(key))
                except TimeoutError:
                    continue
                except OSError:
                    return


def test_bytes_smuggled_after_a_body_are_refused_as_another_requests_answer() -> None:
    """Extra bytes after a Content-Length body on a keep-alive connection became the
    NEXT request's answer (task B succeeded with them). The answer echoes another key: refused
    (retryable) and its connection dropped, so the retry gets B's own answer on a fresh one."""

    def extra(key: str | None) -> bytes:
        return RawSocketServer.answer(key, "smuggled") if key == "A" else b""

    async def main(url: str) -> tuple[ProviderResponse, BaseException, ProviderResponse]:
        provider = HttpProvider("llm", url, timeout=5.0)
        try:
            first = await provider.call(make_request(key="A"))
            try:
                await provider.call(make_request(key="B"))
            except ResponseMismatchError as exc:
                refused: BaseException = exc
            else:  # pragma: no cover - the regression
                pytest.fail("task B accepted an answer that echoes task A's key")
            again = await provider.call(make_request(key="B"))
        finally:
            await provider.aclose()
        return first, refused, again

    with RawSocketServer(extra) as server:
        first, refused, again = run(main(server.url))
        connections = server.connections
    assert first.result == "answer A"
    assert isinstance(refused, ResponseMismatchError) and isinstance(refused, ServerError)
    assert (refused.sent_key, refused.echoed_key) == ("B", "A")
    assert classify_failure(refused, attempts=1) is FailureClass.RETRYABLE
    assert again.result == "answer B"
    assert connections == 2  # the poisoned connection was dropped, not reused


def test_the_scheduler_gives_each_task_its_own_answer_despite_smuggled_bytes() -> None:
    served = itertools.count(1)

    def extra(key: str | None) -> bytes:  # a stray answer after the 1st, 4th and 7th request
        return RawSocketServer.answer(key, "smuggled") if next(served) in (1, 4, 7) else b""

    runtime = AsyncioRuntime()

    async def main(url: str) -> list[Any]:
        provider = HttpProvider("llm", url, timeout=5.0)
        # 3 stray answers can refuse one task's attempts at most 3 times: 5 attempts always suffice
        retry = RetryPolicy(backoff=ConstantBackoff(0.01), max_attempts=5)
        scheduler = Scheduler(
            runtime, [provider], quotas={"llm": QuotaLimits(concurrency=1)}, retry=retry, rng=random.Random(3)
        )
        provider.attach_to(scheduler)
        handles = [scheduler.submit("llm", f"q{i}", cost_estimate=1) for i in range(12)]
        records = [await handle.wait() for handle in handles]
        await scheduler.close()
        await provider.aclose()
        return records

    with RawSocketServer(extra) as server:
        records = runtime.run(main(server.url))
    assert all(record.status is TaskStatus.SUCCEEDED for record in records)
    assert [record.result for record in records] == [f"answer {record.key}" for record in records]
    # each stray answer was met by the next request on its connection and refused once
    assert 1 <= sum(record.attempts - 1 for record in records) <= 3


def test_an_answer_without_an_echo_is_accepted_as_before() -> None:
    """Servers that echo nothing: no check is possible, and none is made (documented limit)."""
    with RawSocketServer(lambda key: b"", echo=False) as server:
        response = run(call_once(HttpProvider("llm", server.url, timeout=5.0), make_request(key="K")))
    assert response.result == "answer K"


def test_a_key_echoed_twice_alike_is_accepted_and_differing_echoes_are_refused() -> None:
    """An origin and a proxy that both echo the key send two header lines, which httpx joins as
    ``"K, K"``: that answer is the request's own (it was refused, and the task failed after its
    attempts). Read value by value, as Retry-After is; one value that differs still refuses it."""
    with RawSocketServer(lambda key: b"", echoes=lambda key: [key, key]) as server:
        response = run(call_once(HttpProvider("llm", server.url, timeout=5.0), make_request(key="K")))
    assert response.result == "answer K"
    differing = RawSocketServer(lambda key: b"", echoes=lambda key: [key, "other"])
    with differing as server, pytest.raises(ResponseMismatchError) as refused:
        run(call_once(HttpProvider("llm", server.url, timeout=5.0), make_request(key="K")))
    assert refused.value.sent_key == "K" and "other" in str(refused.value.echoed_key)


def test_pool_size_comes_from_the_argument_then_the_lane_then_the_default() -> None:
    runtime = AsyncioRuntime()
    lane = HttpProvider("llm", "http://127.0.0.1:9")
    assert lane.max_connections == 100  # DEFAULT_MAX_CONNECTIONS: no lane known yet
    Scheduler(runtime, [lane], quotas={"llm": QuotaLimits(concurrency=256)})  # not attached: unchanged
    assert lane.max_connections == 100
    lane.attach_to(Scheduler(runtime, [lane], quotas={"llm": QuotaLimits(concurrency=256)}))
    assert lane.max_connections == 256
    pinned = HttpProvider("llm", "http://127.0.0.1:9", max_connections=16)
    pinned.attach_to(Scheduler(runtime, [pinned], quotas={"llm": QuotaLimits(concurrency=256)}))
    assert pinned.max_connections == 16
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="max_connections"):
            HttpProvider("llm", "http://127.0.0.1:9", max_connections=bad)


def test_the_owned_client_keeps_every_pooled_connection_alive() -> None:
    async def limits() -> Any:
        provider = HttpProvider("llm", "http://127.0.0.1:9", max_connections=64)
        client = await provider._http()
        pool = client._transport._pool  # httpx's own transport: the only place the limits live
        await provider.aclose()
        return pool._max_connections, pool._max_keepalive_connections

    assert run(limits()) == (64, 64)


def test_a_404_names_the_request_it_answered_without_its_secrets(scripted: ScriptedServer) -> None:
    """A wrong path said only 'llm: HTTP 404', leaving the user to guess which address was asked."""
    scripted.cases["missing"] = HttpReply(404, b"")
    base = scripted.http.url.replace("http://", "http://user:s3cret@")
    provider = HttpProvider("llm", base, path="/case/missing?api_key=s3cret")
    with pytest.raises(InvalidRequestError) as raised:
        run(call_once(provider))
    message = str(raised.value)
    assert message == f"llm: HTTP 404 from POST {scripted.http.url}/case/missing"
    assert "s3cret" not in message


@pytest.mark.parametrize("location", ["https://api.example.invalid/v2/chat", None])
def test_a_redirect_is_not_followed_and_says_where_it_points(
    scripted: ScriptedServer, location: str | None
) -> None:
    """A 301 (a moved endpoint) said 'llm: HTTP 301' and nothing about why it was not followed."""
    headers = {} if location is None else {"location": location}
    provider = provider_for(scripted, "moved", HttpReply(301, b"", headers))
    with pytest.raises(HttpStatusError) as raised:
        run(call_once(provider))
    message = str(raised.value)
    assert message.startswith(f"llm: HTTP 301 from POST {scripted.http.url}/case/moved: a redirect")
    assert "not followed" in message and "base_url" in message
    if location is not None:
        assert f"a redirect to {location}," in message
    assert classify_failure(raised.value, attempts=1) is FailureClass.FATAL


def test_a_redirect_location_is_cut_to_the_message_limit() -> None:
    error = error_for_status(302, headers={"Location": "https://x.invalid/" + "a" * 5000}, source="p")
    assert error is not None and len(str(error)) < 600
