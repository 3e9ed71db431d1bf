"""The failure taxonomy: which errors are retried, which are fatal, when an input is poison."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiqsim.core.failures import (
    POISON_AFTER_ATTEMPTS,
    FailureClass,
    InvalidRequestError,
    PoisonInputError,
    ProviderError,
    ProviderTimeoutError,
    QuotaExhaustedError,
    RateLimitError,
    SchemaViolationError,
    ServerError,
    classify_failure,
    describe_error,
)


class ReadTimeout(TimeoutError):
    """A third-party timeout type (as an HTTP client might raise): still a timeout."""


R, F, P = FailureClass.RETRYABLE, FailureClass.FATAL, FailureClass.POISON
attempts = st.integers(min_value=1, max_value=1000)

RETRYABLE_ERRORS = [
    RateLimitError(),
    RateLimitError("slow down", retry_after_s=2.5),
    ProviderTimeoutError("no answer in 30 s"),
    TimeoutError("builtin"),
    TimeoutError(),
    ReadTimeout("socket read timed out"),
    ServerError(),
    ServerError("bad gateway", status=502),
    ServerError("unavailable", status=503),
]
FATAL_ERRORS = [
    QuotaExhaustedError("monthly credit used up"),
    InvalidRequestError("max_tokens must be positive"),
    ValueError("a bug in the caller"),
    KeyError("missing"),
    RuntimeError("unexpected"),
    ProviderError("unclassified provider trouble"),
]


@pytest.mark.parametrize("err", RETRYABLE_ERRORS, ids=repr)
@given(attempt=attempts)
def test_throttling_timeouts_and_server_errors_are_retryable(err: BaseException, attempt: int) -> None:
    assert classify_failure(err, attempt) is R


@pytest.mark.parametrize("err", FATAL_ERRORS, ids=repr)
@given(attempt=attempts)
def test_quota_invalid_and_unknown_errors_are_fatal(err: BaseException, attempt: int) -> None:
    assert classify_failure(err, attempt) is F


def test_schema_violation_turns_poison_at_the_third_attempt() -> None:
    err = SchemaViolationError("expected a JSON object")
    assert POISON_AFTER_ATTEMPTS == 3
    assert [classify_failure(err, n) for n in (1, 2, 3, 4)] == [R, R, P, P]


@given(attempt=attempts, poison_after=st.integers(min_value=1, max_value=20))
def test_schema_violation_threshold_is_configurable(attempt: int, poison_after: int) -> None:
    expected = P if attempt >= poison_after else R
    assert classify_failure(SchemaViolationError(), attempt, poison_after=poison_after) is expected


def test_recorded_poison_stays_poison() -> None:
    assert classify_failure(PoisonInputError("key abc is poison"), 1) is P


def test_provider_timeout_is_also_a_builtin_timeout() -> None:
    assert issubclass(ProviderTimeoutError, TimeoutError)
    assert issubclass(ProviderTimeoutError, ProviderError)


def test_rate_limit_carries_the_servers_pause_and_server_error_its_status() -> None:
    assert RateLimitError(retry_after_s=4.0).retry_after_s == 4.0
    assert RateLimitError().retry_after_s is None
    assert ServerError(status=504).status == 504


@pytest.mark.parametrize(
    ("err", "text"),
    [
        (ServerError("bad gateway", status=502), "ServerError: bad gateway"),
        (TimeoutError(), "TimeoutError"),
        (RateLimitError(), "RateLimitError: rate limited"),
    ],
)
def test_describe_error_is_type_and_message(err: BaseException, text: str) -> None:
    assert describe_error(err) == text
