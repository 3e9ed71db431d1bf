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
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
from aiqsim.http import PROFILES, HttpProvider, error_for_status, get_profile, profile_snapshot
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


def _check_snapshot(expected: dict[str, float], snapshot: Any) -> None:
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
