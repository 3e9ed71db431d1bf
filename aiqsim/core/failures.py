"""The failure taxonomy: what went wrong with a provider call and whether to try again.

Providers (simulated, HTTP or SDK-wrapped) raise these errors; :func:`classify_failure`
turns any exception into retryable, fatal or poison.
"""

from __future__ import annotations

import enum
import math
from typing import Any

from aiqsim.core.errors import AiqsimError
from aiqsim.core.ratelimit import RateLimitSnapshot


class ProviderError(AiqsimError):
    """Base of every failure a provider adapter reports.

    ``ratelimit`` is what the provider said about its limits on the failed answer (its
    ``x-ratelimit-*`` headers), when an adapter saw any: observed for the call log, never acted on.
    """

    ratelimit: RateLimitSnapshot | None = None


class RateLimitError(ProviderError):
    """HTTP 429: the provider throttled us; ``retry_after_s`` is its requested pause, if any.

    ``quota_spent`` says what the 429 means when the provider told us: ``True`` when the
    account's quota window is used up (``x-ratelimit-remaining-*: 0``, an explicit quota
    error), so every request of the provider would be refused; ``False`` when the server says
    quota remains (one overloaded request); ``None`` when it did not say.
    """

    def __init__(
        self,
        message: str = "rate limited",
        retry_after_s: float | None = None,
        *,
        quota_spent: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.quota_spent = quota_spent


class ProviderTimeoutError(ProviderError, TimeoutError):
    """No response in time. The server may still have done (and billed) the work."""


class StreamCutError(ProviderTimeoutError):
    """A streamed answer stopped after its first chunk arrived (the connection dropped, the server
    closed it, or a deadline cut it), or after the provider said the answer had begun (an HTTP
    stream's first event, which may carry no text): the server has started, and billed, the work.
    Retryable like any timeout, but a retry is a second bill unless the provider honours idempotency
    keys or can be asked (``lookup``) for the answer it kept. ``received_units`` is what had arrived
    (tokens), if known."""

    def __init__(self, message: str = "stream cut", *, received_units: float | None = None) -> None:
        super().__init__(message)
        self.received_units = received_units


class FirstTokenTimeoutError(ProviderTimeoutError):
    """A streamed answer sent no first chunk within the retry policy's ``first_token_timeout_s``:
    the attempt was abandoned before anything reached the consumer. Retryable like any timeout (the
    server may have begun, and may bill, the work)."""


class BilledStreamCutError(ProviderError):
    """A streamed answer was cut once begun (billed), and the scheduler would not send it
    again: the provider neither honours idempotency keys nor could say (``lookup``) what it kept, so a
    retry would be a second bill. Fatal: the task fails with this error, naming what was received."""


class ServerError(ProviderError):
    """HTTP 5xx or a broken connection: the provider failed on its side."""

    def __init__(
        self, message: str = "server error", status: int = 500, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s
        """A 503's Retry-After (RFC 9110 §10.2.3), if the server sent one."""


class QuotaExhaustedError(ProviderError):
    """The account's hard quota or credit is used up: retrying cannot help."""


class InvalidRequestError(ProviderError):
    """HTTP 400/422: the request itself is wrong."""


class SchemaViolationError(ProviderError):
    """The provider answered, but not in the expected shape (possibly because of this input)."""


class ProviderContractError(ProviderError):
    """The adapter broke the :class:`~aiqsim.scheduler.provider.Provider` contract: ``call()``
    returned something other than a ``ProviderResponse``. A bug in the adapter, so fatal: retrying
    would only call (and bill) the provider again for an answer the adapter cannot hand over."""


class ProviderCancelledError(ProviderError):
    """A provider's call raised a cancellation that nobody asked for (the scheduler did not cancel
    the task): a bug in the adapter or in a library under it, such as an inner task cancelled by
    mistake. The call's outcome is unknown, so it is fatal like any unknown error (retrying could
    bill twice), and reported as a failure instead of passing for a user's cancellation."""


class PoisonInputError(ProviderError):
    """Raised for a key that was recorded as poison: it is not sent to the provider again."""


class TaskInterruptedError(ProviderError):
    """The process running this task stopped before the outcome was recorded."""


class FailureClass(enum.StrEnum):
    """What to do about a failure."""

    RETRYABLE = "retryable"
    FATAL = "fatal"
    POISON = "poison"


# The members as module globals, for the hot paths (as aiqsim.core.task's statuses).
RETRYABLE = FailureClass.RETRYABLE
FATAL = FailureClass.FATAL
POISON = FailureClass.POISON

POISON_AFTER_ATTEMPTS = 3
"""A schema violation that survives this many attempts marks the input as poison."""


def classify_failure(
    err: BaseException, attempts: int, *, poison_after: int = POISON_AFTER_ATTEMPTS
) -> FailureClass:
    """Classify ``err`` seen on attempt number ``attempts`` (1-based).

    429, timeouts and 5xx are retryable; quota exhausted and invalid requests are fatal;
    a schema violation is retried until ``poison_after`` attempts, then poison; anything
    unknown is fatal (retrying a bug multiplies it).
    """
    if isinstance(err, _RETRYABLE_ERRORS):
        return RETRYABLE
    if isinstance(err, SchemaViolationError):
        return POISON if attempts >= poison_after else RETRYABLE
    if isinstance(err, PoisonInputError):
        return POISON
    return FATAL


_RETRYABLE_ERRORS = (RateLimitError, TimeoutError, ServerError)
"""429s, timeouts and 5xx (a tuple built once: ``A | B | C`` in the call made a union per failure)."""


def describe_error(err: BaseException) -> str:
    """``"TypeName: message"``, the form stored on task records."""
    text = str(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


class AttemptRejectedError(ProviderError):
    """A client-side guard (retry budget, circuit breaker, throttle) refused to send an attempt."""


class BudgetExceeded(AttemptRejectedError):
    """A spend budget (:class:`~aiqsim.overload.Budget`) has no room left for the attempt's
    estimated cost: the task fails at once (fatal, never retried: a closed budget stays closed
    until ``resets_at``, the scheduler-clock instant its day ends).

    ``budget`` names it (``"per_day"``, or ``"per_tenant_per_day[acme]"``), ``spent`` is what its
    day had spent and reserved, ``limit`` its limit and ``estimate`` the refused attempt's cost.
    """

    def __init__(self, budget: str, *, spent: float, limit: float, estimate: float, resets_at: float) -> None:
        self.budget = budget
        self.spent = spent
        self.limit = limit
        self.estimate = estimate
        self.resets_at = resets_at
        super().__init__(
            f"budget {budget} spent: {spent:g} of {limit:g} used, the attempt needs {estimate:g}; "
            f"it resets at t={resets_at:g} s (scheduler clock)"
        )

    def __reduce__(self) -> tuple[Any, ...]:  # keyword-only fields: rebuilt from them (pickling, copy)
        return _rebuild_budget_exceeded, (self.budget, self.spent, self.limit, self.estimate, self.resets_at)


def _rebuild_budget_exceeded(
    budget: str, spent: float, limit: float, estimate: float, resets_at: float
) -> BudgetExceeded:
    return BudgetExceeded(budget, spent=spent, limit=limit, estimate=estimate, resets_at=resets_at)


def retry_after_of(error: BaseException) -> float | None:
    """The server's requested pause carried by ``error`` (any provider error may carry one, e.g. a
    429 or a 503's Retry-After), or ``None``. The one place the scheduler reads it: a value that is
    not a finite number >= 0 (a buggy adapter) counts as absent."""
    value = getattr(error, "retry_after_s", None)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not 0 <= value < math.inf:
        return None
    return float(value)
