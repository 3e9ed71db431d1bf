"""What an attempt's error says about the provider's health, as the overload policies read it.

One place decides which errors count as "the server is failing" (circuit breaker),
"the server turned the request away" (client-side throttle), "the server throttled us"
(adaptive send rate) and "the attempt timed out" (retry cost). The policies take these
predicates as defaults and accept any ``Callable[[BaseException], bool]`` instead.
"""

from __future__ import annotations

from collections.abc import Callable

from aiqsim.core.failures import RateLimitError, ServerError

ErrorPredicate = Callable[[BaseException], bool]


def is_timeout(error: BaseException) -> bool:
    """No answer in time: a provider timeout or the runtime's ``wait_for`` timeout."""
    return isinstance(error, TimeoutError)


def is_rate_limited(error: BaseException) -> bool:
    """HTTP 429: the provider is up and asks us to slow down."""
    return isinstance(error, RateLimitError)


def is_server_failure(error: BaseException) -> bool:
    """The provider failed on its side: 5xx, broken connection or timeout (not 429, not 4xx)."""
    return isinstance(error, ServerError | TimeoutError)


def is_server_failure_or_rate_limited(error: BaseException) -> bool:
    """:func:`is_server_failure`, counting 429 as a failure too."""
    return is_server_failure(error) or is_rate_limited(error)


def is_overload_rejection(error: BaseException) -> bool:
    """The backend did not accept the request: 429, 5xx or no answer in time.

    Anything else (a 4xx, a schema violation, a quota-exhausted answer) shows the backend
    took the request and processed it, so it counts as *accepted* for adaptive throttling.
    """
    return is_rate_limited(error) or is_server_failure(error)
