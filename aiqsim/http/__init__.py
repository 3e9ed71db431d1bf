"""Real providers: adapters that put HTTP services and SDKs behind the scheduler, and a local server.

- :class:`CallableProvider`: any async callable (an SDK call) as a provider, with an
  optional error mapper (:func:`map_openai_error` for the ``openai`` SDK).
- :class:`HttpProvider`: OpenAI-style JSON over ``httpx`` (optional dependency, extra
  ``http``; imported only when an HttpProvider is created), with Idempotency-Key,
  Retry-After and ``x-ratelimit-*`` header corrections (downwards only) of the client-side quota;
  :class:`ResponseDecodingError` / :class:`ResponseMismatchError` for answers it cannot use.
  ``HttpProvider.stream()`` reads server-sent events (OpenAI chunks, Anthropic events) within
  :class:`StreamLimits` (:mod:`aiqsim.http.sse`, :mod:`aiqsim.http.sse_stream`).
- :func:`start_local_server`: an OpenAI-like server on 127.0.0.1 driven by a
  :class:`~aiqsim.sim.config.ProviderConfig`, for tests, demos and sim-vs-real checks
  (imported on first use: it runs the simulation lab's provider model).
"""

from typing import TYPE_CHECKING, Any

from aiqsim.http.adapter import CallableProvider, ErrorMapper
from aiqsim.http.headers import (
    RateLimitSnapshot,
    apply_ratelimit_snapshot,
    corrected_level,
    format_duration,
    parse_duration,
    parse_ratelimit_headers,
    retry_after_from_headers,
)
from aiqsim.http.httpx_provider import HttpProvider
from aiqsim.http.loopback import ServerStartError
from aiqsim.http.openai_errors import map_openai_error, openai_error_mapper
from aiqsim.http.protocol_errors import HttpExchangeError, ResponseDecodingError, ResponseMismatchError
from aiqsim.http.sse_stream import StreamLimits
from aiqsim.http.status import HttpStatusError, error_for_status, is_quota_exhausted

if TYPE_CHECKING:
    from aiqsim.http.server import Ledger, LocalProviderServer, iter_retry_violations, start_local_server

_SERVER_NAMES = frozenset({"Ledger", "LocalProviderServer", "iter_retry_violations", "start_local_server"})


def __getattr__(name: str) -> Any:
    """Load the local server (which pulls in the simulation lab) only when it is asked for."""
    if name in _SERVER_NAMES:
        from aiqsim.http import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CallableProvider",
    "ErrorMapper",
    "HttpExchangeError",
    "HttpProvider",
    "HttpStatusError",
    "Ledger",
    "LocalProviderServer",
    "RateLimitSnapshot",
    "ResponseDecodingError",
    "ResponseMismatchError",
    "ServerStartError",
    "StreamLimits",
    "apply_ratelimit_snapshot",
    "corrected_level",
    "error_for_status",
    "format_duration",
    "is_quota_exhausted",
    "iter_retry_violations",
    "map_openai_error",
    "openai_error_mapper",
    "parse_duration",
    "parse_ratelimit_headers",
    "retry_after_from_headers",
    "start_local_server",
]
