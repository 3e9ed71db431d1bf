"""Provider errors for a broken HTTP exchange: an answer that arrived but cannot be trusted.

Both are :class:`~aiqsim.core.failures.ServerError` with ``status=0`` (no usable HTTP status),
so the scheduler retries them like a dropped connection: nothing about the *request* was
wrong, and with an idempotency key a retry cannot bill the work twice.

- :class:`ResponseDecodingError`: the body could not be decoded at the transport level
  (``Content-Encoding: gzip`` that is not gzip, a truncated deflate stream...). httpx raises
  ``httpx.DecodingError``, which is not one of its transport errors; left unmapped, the
  scheduler saw a foreign exception and treated it as a bug (one attempt, fatal).
- :class:`ResponseMismatchError`: the answer names another request than the one sent (an
  echoed ``Idempotency-Key`` that differs), e.g. bytes left on a keep-alive connection by an
  earlier, broken response. The connection it came over is not reused.
"""

from __future__ import annotations

from aiqsim.core.failures import ServerError


class HttpExchangeError(ServerError):
    """The HTTP answer arrived but is unusable; retryable, like a broken connection (``status=0``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=0)


class ResponseDecodingError(HttpExchangeError):
    """The response body could not be decoded (its ``Content-Encoding`` is broken)."""


class ResponseMismatchError(HttpExchangeError):
    """The response does not belong to the request: its echoed ``Idempotency-Key`` differs.

    ``sent_key`` is the key of the request, ``echoed_key`` the one the response carried.
    """

    def __init__(self, message: str, *, sent_key: str, echoed_key: str) -> None:
        super().__init__(message)
        self.sent_key = sent_key
        self.echoed_key = echoed_key
