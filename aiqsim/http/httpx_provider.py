"""A provider that speaks HTTP (OpenAI-style JSON) through ``httpx``.

``httpx`` is an optional dependency (``pip install 'aiqsim[http]'``): this module imports
it only when an :class:`HttpProvider` is created, so ``import aiqsim.http`` works without it.

This is inherently real-time I/O, so it reads the wall clock (``time.time``) for HTTP-date
``Retry-After`` values. Everything it tells the scheduler is in scheduler seconds: give it
the same ``time_scale`` as the :class:`~aiqsim.runtime.AsyncioRuntime` it runs on.

Connection pool. The owned ``httpx.AsyncClient`` keeps as many connections open *and alive*
as the lane can have attempts in flight (its ``concurrency``, learnt from :meth:`HttpProvider.attach_to`
or ``bind_quota``, or given as ``max_connections``). With httpx's default (100 connections, 20
kept alive; httpcore 1.0 closes a released connection whenever more than 20 are open) most
attempts opened a new TCP connection: at concurrency 256 the local server accepted 4,823
connections for 13,900 requests. Two costs
remain with httpx 0.28 / httpcore 1.0 and are the same for any httpx client with this pool
(``benchmarks/bench_http_pool.py``): the pool's bookkeeping scans every connection on every
request and release, and polls each idle socket, so CPU per request grows with the pool size;
and an idle connection is closed after httpx's 5 s keep-alive expiry, so a lane whose
connections each wait longer than that between requests reconnects anyway.

Responses that belong to another request. A server (or a proxy) that writes more bytes than
its ``Content-Length`` on a keep-alive connection leaves them in the client's buffer, and the
HTTP stack (httpx → httpcore → h11) reads them as the answer to the *next* request sent on that
connection: another task would succeed with someone else's answer. HTTP/1.1 gives a client no
way to tell such bytes from a real answer, except what the server says about the request. So:
when the response echoes an ``Idempotency-Key`` (the local provider server does) and it is not
the key sent, the answer is refused with
:class:`~aiqsim.http.protocol_errors.ResponseMismatchError` (retryable) and its connection is
closed unread, so the misaligned bytes behind it are dropped too. Not defended: a server that
echoes nothing (the stray answer is indistinguishable from the real one); over HTTP/2 the
problem does not arise (frames carry their stream id).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import aclosing
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import InvalidRequestError, ProviderTimeoutError, SchemaViolationError, ServerError
from aiqsim.core.numeric import check_time_scale, is_positive_finite
from aiqsim.core.token_bucket import MultiQuota
from aiqsim.http.chat import chat_body, chat_content, completion_tokens, estimate_chat_tokens, total_tokens
from aiqsim.http.headers import (
    RateLimitSnapshot,
    apply_ratelimit_snapshot,
    differing_echo,
    header_problem,
    idempotency_header_value,
)
from aiqsim.http.profiles import ProviderProfile, get_profile
from aiqsim.http.protocol_errors import ResponseDecodingError, ResponseMismatchError
from aiqsim.http.sse_stream import StreamLimits, stream_answer
from aiqsim.http.status import error_for_status
from aiqsim.http.stream_events import StreamDecoder, StreamFormat, check_stream_format
from aiqsim.http.stream_wire import body_bytes, is_event_stream, stream_body, transport_failure
from aiqsim.http.vendor_headers import profile_snapshot
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse, StreamChunk
from aiqsim.scheduler.retry import DEFAULT_MAX_RETRY_AFTER_S

if TYPE_CHECKING:
    import httpx

    from aiqsim.scheduler.scheduler import Scheduler

IDEMPOTENCY_HEADER = "Idempotency-Key"
DEFAULT_MAX_CONNECTIONS = 100
DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024
"""The largest response body read (64 MiB, decoded): a chat completion is kilobytes; a body that
never ends is a broken server, not an answer."""
"""Pool size of an owned client when neither ``max_connections`` nor the lane's concurrency is known
(httpx's own default size, but with every connection kept alive, not only 20)."""


def require_httpx() -> Any:
    """The ``httpx`` module, or an ImportError that says how to install it."""
    try:
        import httpx
    except ImportError as exc:  # pragma: no cover - httpx is installed in the test environment
        raise ImportError(
            "aiqsim.http.HttpProvider needs the optional dependency httpx: pip install 'aiqsim[http]'"
        ) from exc
    return httpx


def _check_url(httpx: Any, url: str, name: str) -> None:
    """Refuse, when the provider is made, a URL no request can go to: each call then failed (as a
    retried 'connection failed', or a raw InvalidURL / an OverflowError for port 99999)."""
    try:
        parsed = httpx.URL(url)
        port = parsed.port
    except (httpx.InvalidURL, ValueError, TypeError) as error:
        raise ConfigurationError(f"provider {name!r}: base_url {url!r} is not a URL ({error})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigurationError(
            f"provider {name!r}: base_url {url!r}: expected http://HOST[:PORT] or https://HOST[:PORT]"
        )
    if port is not None and not 0 < port < 65536:
        raise ConfigurationError(
            f"provider {name!r}: base_url {url!r}: port {port} is not a TCP port (1-65535)"
        )


def _checked_headers(name: str, headers: Any) -> dict[str, str]:
    """``headers`` as text, each one sendable, in the forms httpx takes (a mapping or pairs, text
    or ASCII bytes); a ConfigurationError naming the header otherwise, when the provider is made,
    not at every call (a non-ASCII value failed each call with a raw UnicodeEncodeError)."""
    if not headers:
        return {}
    multi_items = getattr(headers, "multi_items", None)
    if callable(multi_items):  # httpx.Headers: every line, duplicates included
        pairs = list(multi_items())
    elif isinstance(headers, Mapping):
        pairs = list(headers.items())
    else:
        try:
            pairs = [(header, value) for header, value in headers]
        except (TypeError, ValueError):
            raise ConfigurationError(
                f"HttpProvider {name!r}: headers must be a mapping or (name, value) pairs, got {headers!r}"
            ) from None
    checked = {}
    for header, value in pairs:
        header, value = _as_text(header), _as_text(value)
        problem = header_problem(header, value)
        if problem is not None:
            raise ConfigurationError(f"HttpProvider {name!r}: {problem}")
        checked[header] = value
    return checked


def _as_text(given: Any) -> Any:
    """ASCII bytes as text (httpx sends bytes as they are); anything else as given, for the check."""
    if isinstance(given, bytes):
        try:
            return given.decode("ascii")
        except UnicodeDecodeError:
            return given.decode("latin-1")  # refused by the check, shown as it would be sent
    return given


def _check_timeout(httpx: Any, timeout: Any) -> None:
    """Refuse, when the provider is made, a timeout httpx would misread: NaN failed each call with
    a raw ValueError, 0 or a negative timed every call out before it was sent, and infinity quietly
    meant no timeout at all (``None`` says that, on purpose)."""
    if timeout is None:
        return
    parts = (
        {"connect": timeout.connect, "read": timeout.read, "write": timeout.write, "pool": timeout.pool}
        if isinstance(timeout, httpx.Timeout)
        else {"": timeout}
    )
    for part, value in parts.items():
        if value is None and part:
            continue  # an httpx.Timeout part left unlimited on purpose
        if not is_positive_finite(value):
            where = f"timeout.{part}" if part else "timeout"
            raise ConfigurationError(
                f"{where} must be a finite number of seconds > 0 (or None: no limit), got {value!r}"
            )


class HttpProvider:
    """POST each attempt as JSON to ``base_url + path`` and map the answer onto the failure taxonomy.

    - The task's idempotency key goes out as an ``Idempotency-Key`` header.
    - 429 → ``RateLimitError`` (``retry-after-ms`` or ``Retry-After``, delta-seconds or
      HTTP date); 429/403 whose body says the quota or credit is exhausted →
      ``QuotaExhaustedError``; 5xx → ``ServerError(status)``; 400/422 →
      ``InvalidRequestError`` (full table in :mod:`aiqsim.http.status`).
    - Timeouts (connect, read, write, pool) → ``ProviderTimeoutError``; refused or broken
      connections and responses cut short → ``ServerError(status=0)``; a body whose
      ``Content-Encoding`` cannot be decoded → ``ResponseDecodingError`` and an answer echoing
      another request's ``Idempotency-Key`` → ``ResponseMismatchError`` (both ``ServerError``
      with ``status=0``, retryable; see the module docstring).
    - A 2xx whose body is not JSON or not the expected shape → ``SchemaViolationError``.
    - ``usage.total_tokens`` becomes ``ProviderResponse.usage``.
    - ``x-ratelimit-remaining-{requests,tokens}`` (and their resets), or Anthropic's
      ``anthropic-ratelimit-*`` (RFC 3339 resets), *lower* the bound quota's bucket levels when
      the server has less room than the client thinks, on every response including 429s; they
      never raise them above what the client's own limits allow
      (:func:`aiqsim.http.headers.corrected_level`).
    - ``profile`` says how the vendor speaks (:mod:`aiqsim.http.profiles`): its rate-limit header
      dialect, where it states a wait, which answers are spent credit or a spend cap (fatal
      ``QuotaExhaustedError``) and which are retryable overload (Anthropic 529, Groq 498).

    Parameters:
        name: the provider (scheduler lane) name.
        base_url: e.g. ``"https://api.openai.com"`` or a local server's ``.url``.
        path: the endpoint path.
        client: an ``httpx.AsyncClient`` to use (not closed by :meth:`aclose`); by default
            one is created per event loop and owned here.
        headers: extra headers for every request (``Authorization``...).
        quota: the client-side quota to correct from rate-limit headers, usually
            ``scheduler.quota(name)``; see also :meth:`attach_to`.
        clock: the quota's clock (``runtime.now``); required with ``quota``.
        time_scale: wall seconds per scheduler second (as ``AsyncioRuntime(time_scale=...)``);
            converts Retry-After.
        timeout: httpx timeout (seconds or ``httpx.Timeout``) for an owned client.
        max_connections: pool size of an owned client (all kept alive). Default: the bound
            lane's ``concurrency`` (:meth:`attach_to`, ``bind_quota``), else
            :data:`DEFAULT_MAX_CONNECTIONS`. Fewer connections than attempts in flight makes
            attempts wait for a connection (counted in their timeout); more are never used.
        max_response_bytes: the largest response body read (decoded; :data:`DEFAULT_MAX_RESPONSE_BYTES`);
            a larger one fails the attempt with ``SchemaViolationError`` and its connection is dropped.
        model: filled into bodies that name no model.
        build_body: ``request -> dict`` JSON body (default :func:`aiqsim.http.chat.chat_body`).
        parse_result: ``decoded JSON -> result`` (default: ``choices[0].message.content``);
            raising ``KeyError``/``TypeError``/``ValueError`` counts as a schema violation.
        estimate_cost: ``(kind, payload) -> float`` (default: prompt + max tokens).
        lookup_path: e.g. ``"/lookup/{key}"`` if the server can report work done for a key
            (used by crash recovery); without it :meth:`lookup` returns ``None``.
        send_task_headers: also send ``x-aiqsim-task-id`` and ``x-aiqsim-attempt`` (the local
            server records them on its executions; off by default for third-party APIs).
        wall_clock: Unix time source for HTTP-date Retry-After values and RFC 3339 resets.
        profile: the vendor's :class:`~aiqsim.http.profiles.ProviderProfile` or its name
            (``"openai"``, ``"azure"``, ``"anthropic"``, ``"gemini"``, ``"vertex"``, ``"bedrock"``,
            ``"mistral"``, ``"groq"``, ``"deepseek"``, ``"openrouter"``). Default ``"auto"``: every
            vendor's error rules at once, and the rate-limit header dialect each response's header
            names show (``anthropic-ratelimit-*`` -> Anthropic's, ``x-ratelimit-*`` -> OpenAI's).
            An unknown name is a ConfigurationError listing the valid ones.
        stream_format: how :meth:`stream` reads the events: ``"openai"`` (chat.completion.chunk,
            ``[DONE]``), ``"anthropic"`` (``message_start`` ... ``message_stop``) or ``"auto"`` (the
            default: told by the first event); :mod:`aiqsim.http.stream_events`.
        stream_limits: idle and total timeouts and the byte limit of a streamed answer
            (:class:`~aiqsim.http.sse_stream.StreamLimits`; defaults: 60 s idle, 600 s, 64 MiB).
        honours_idempotency_keys: the server bills a re-sent ``Idempotency-Key`` once (off by default:
            a stream cut after its first chunk is then looked up or failed, never re-sent).
        request_headers: headers computed per request (``request_headers(request)``), added to the
            others on every call, e.g. a trace's ``traceparent``
            (:meth:`aiqsim.observability.OpenTelemetryTracing.headers_for`).
    """

    def __init__(
        self,
        name: str,
        base_url: str,
        *,
        path: str = "/v1/chat/completions",
        client: httpx.AsyncClient | None = None,
        headers: Mapping[str, str] | None = None,
        quota: MultiQuota | None = None,
        clock: Callable[[], float] | None = None,
        time_scale: float = 1.0,
        timeout: float | httpx.Timeout = 60.0,
        model: str | None = None,
        build_body: Callable[[ProviderRequest], Mapping[str, Any]] | None = None,
        parse_result: Callable[[Any], Any] | None = None,
        estimate_cost: Callable[[str, Any], float] | None = None,
        lookup_path: str | None = None,
        send_task_headers: bool = False,
        wall_clock: Callable[[], float] = time.time,
        max_connections: int | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        profile: str | ProviderProfile = "auto",
        stream_format: StreamFormat = "auto",
        stream_limits: StreamLimits | None = None,
        honours_idempotency_keys: bool = False,
        request_headers: Callable[[ProviderRequest], Mapping[str, str]] | None = None,
    ) -> None:
        self.profile = get_profile(profile)
        self._httpx = require_httpx()
        self.stream_format: StreamFormat = check_stream_format(stream_format, f"HttpProvider {name!r}")
        if stream_limits is not None and not isinstance(stream_limits, StreamLimits):
            raise ConfigurationError(
                f"HttpProvider {name!r}: stream_limits must be a StreamLimits, got {stream_limits!r}"
            )
        self.stream_limits = stream_limits if stream_limits is not None else StreamLimits()
        if not isinstance(honours_idempotency_keys, bool):
            raise ConfigurationError(
                f"HttpProvider {name!r}: honours_idempotency_keys must be True or False, "
                f"got {honours_idempotency_keys!r}"
            )
        self.honours_idempotency_keys = honours_idempotency_keys
        """Whether the server bills a re-sent ``Idempotency-Key`` once (the scheduler then re-sends
        a stream cut after its first chunk; otherwise it looks it up or fails the task)."""
        if request_headers is not None and not callable(request_headers):
            raise ConfigurationError(f"request_headers must be callable, got {request_headers!r}")
        self._request_headers = request_headers
        if (
            isinstance(max_response_bytes, bool)
            or not isinstance(max_response_bytes, int)
            or max_response_bytes < 1
        ):
            raise ConfigurationError(f"max_response_bytes must be an int >= 1, got {max_response_bytes!r}")
        self.max_response_bytes = max_response_bytes
        check_time_scale(time_scale)
        _check_timeout(self._httpx, timeout)
        headers = _checked_headers(name, headers)
        if max_connections is not None and (isinstance(max_connections, bool) or max_connections < 1):
            raise ConfigurationError(f"max_connections must be an int >= 1, got {max_connections!r}")
        self.name = name
        self.url = base_url.rstrip("/") + "/" + path.lstrip("/")
        self.base_url = base_url.rstrip("/")
        _check_url(self._httpx, self.url, name)
        self.time_scale = float(time_scale)
        self.lookup_path = lookup_path
        self.send_task_headers = send_task_headers
        self._client = client
        self._owned: tuple[asyncio.AbstractEventLoop, httpx.AsyncClient] | None = None
        self._headers = headers
        self._timeout = timeout
        self._model = model
        self._build_body = build_body
        self._parse_result = parse_result if parse_result is not None else chat_content
        self._estimate_cost = estimate_cost
        self._wall_clock = wall_clock
        self._quota: MultiQuota | None = None
        self._clock: Callable[[], float] | None = None
        self._longest_wait_s: float | None = DEFAULT_MAX_RETRY_AFTER_S
        self._max_connections = max_connections
        self._lane_concurrency: int | None = None
        self.last_ratelimit: RateLimitSnapshot | None = None
        """The rate-limit headers of the latest response (for observability)."""
        if quota is not None:
            if clock is None:
                raise ConfigurationError("a quota needs its clock too: pass clock=runtime.now")
            self.bind_quota(quota, clock)

    # ------------------------------------------------------------------ wiring
    def bind_quota(
        self,
        quota: MultiQuota,
        clock: Callable[[], float],
        *,
        longest_wait_s: float | None = DEFAULT_MAX_RETRY_AFTER_S,
    ) -> None:
        """Correct ``quota`` (read at ``clock()``) from every response's rate-limit headers, and
        size the owned connection pool from its ``concurrency`` (unless ``max_connections`` was
        given). Bind before the first call: a client already created keeps its pool. A reset
        header holds the lane back at most ``longest_wait_s`` (``None``: any; see
        :func:`~aiqsim.http.headers.corrected_level`)."""
        self._quota = quota
        self._clock = clock
        self._longest_wait_s = longest_wait_s
        self._lane_concurrency = quota.concurrency

    def attach_to(self, scheduler: Scheduler) -> HttpProvider:
        """Bind to the quota of this provider's lane in ``scheduler`` (header corrections and
        pool size; a reset header holds the lane back no longer than the scheduler's retry policy
        waits out a Retry-After, ``max_retry_after_s``); returns self."""
        self.bind_quota(
            scheduler.quota(self.name),
            scheduler.runtime.now,
            longest_wait_s=scheduler.retry.max_retry_after_s,
        )
        return self

    @property
    def max_connections(self) -> int:
        """The pool size an owned client gets: ``max_connections``, else the lane's
        concurrency, else :data:`DEFAULT_MAX_CONNECTIONS`."""
        if self._max_connections is not None:
            return self._max_connections
        if self._lane_concurrency is not None:
            return self._lane_concurrency
        return DEFAULT_MAX_CONNECTIONS

    async def _http(self) -> httpx.AsyncClient:
        if self._client is not None:
            return self._client
        loop = asyncio.get_running_loop()
        if self._owned is None or self._owned[0] is not loop:
            size = self.max_connections
            limits = self._httpx.Limits(max_connections=size, max_keepalive_connections=size)
            self._owned = (loop, self._httpx.AsyncClient(timeout=self._timeout, limits=limits))
        return self._owned[1]

    async def aclose(self) -> None:
        """Close the client this provider created (a client passed in is the caller's to close)."""
        if self._owned is not None:
            _, client = self._owned
            self._owned = None
            await client.aclose()

    async def __aenter__(self) -> HttpProvider:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ provider protocol
    def estimate_cost(self, kind: str, payload: Any) -> float:
        """Cost of a submission without ``cost_estimate``: prompt tokens + max tokens by default."""
        if self._estimate_cost is not None:
            return float(self._estimate_cost(kind, payload))
        return estimate_chat_tokens(payload)

    def body_for(self, request: ProviderRequest) -> Mapping[str, Any]:
        """The JSON body sent for ``request``."""
        if self._build_body is not None:
            return self._build_body(request)
        return chat_body(request, model=self._model)

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        """One POST; the outcome as a response or an :mod:`aiqsim.core.failures` error."""
        sent_key = idempotency_header_value(request.idempotency_key)
        headers = self._headers_for(request, sent_key)
        response = await self._send(
            "POST", self.url, headers=headers, json=self.body_for(request), sent_key=sent_key
        )
        body = self._check(response)
        snapshot = self._snapshot(response.headers)
        return ProviderResponse(
            result=self._result(body),
            usage=total_tokens(body),
            output_units=completion_tokens(body),
            ratelimit=None if snapshot.is_empty else snapshot,
        )

    def stream(self, request: ProviderRequest) -> AsyncIterator[StreamChunk | ProviderResponse]:
        """One POST with ``"stream": true``, its server-sent events yielded as chunks as they arrive,
        then the response (:class:`~aiqsim.scheduler.provider.SupportsStreaming`; the reading rules
        and limits: :mod:`aiqsim.http.sse_stream`). An OpenAI-style body also asks for the usage
        (``stream_options.include_usage``) unless it says otherwise or the format is Anthropic's. A
        failure status is raised before any chunk, as :meth:`call` raises it; a server that answers
        with a whole JSON body instead of a stream is read as :meth:`call` reads it."""
        return self._stream(request)

    async def _stream(self, request: ProviderRequest) -> AsyncIterator[StreamChunk | ProviderResponse]:
        httpx = self._httpx
        sent_key = idempotency_header_value(request.idempotency_key)
        headers = self._headers_for(request, sent_key, {"accept": "text/event-stream"})
        body = stream_body(self.body_for(request), self.stream_format, self.url)
        client = await self._http()
        try:
            response = await client.send(
                client.build_request("POST", self.url, headers=headers, json=body), stream=True
            )
        except httpx.HTTPError as exc:
            raise transport_failure(httpx, self.name, exc) from exc
        try:
            # value by value, as call() reads it: an origin's and a proxy's echo arrive as "k, k"
            echoed = differing_echo(response.headers, IDEMPOTENCY_HEADER, sent_key)
            if echoed is not None:
                raise ResponseMismatchError(
                    f"{self.name}: the answer belongs to another request: it echoes {IDEMPOTENCY_HEADER} "
                    f"{echoed!r}, the request sent {sent_key!r}; its connection is dropped",
                    sent_key=sent_key,
                    echoed_key=echoed,
                )
            if not is_event_stream(response):  # an error status, or a whole answer: read as call() does
                try:
                    await self._read_bounded(response)
                except httpx.HTTPError as exc:
                    raise transport_failure(httpx, self.name, exc) from exc
                whole = self._check(response)
                snapshot = self._snapshot(response.headers)
                yield ProviderResponse(
                    result=self._result(whole),
                    usage=total_tokens(whole),
                    output_units=completion_tokens(whole),
                    ratelimit=None if snapshot.is_empty else snapshot,
                )
                return
            self._observe(response.headers)
            snapshot = self._snapshot(response.headers)
            decoder = StreamDecoder(self.stream_format, source=self.name)
            # closed here, not left to the loop's finalizer, when this stream is left early (the
            # scheduler closes it when it abandons the attempt): it closes the body's reader in turn
            async with aclosing(
                stream_answer(
                    self.name,
                    body_bytes(httpx, self.name, response),
                    decoder,
                    self.stream_limits,
                    ratelimit=None if snapshot.is_empty else snapshot,
                    time_scale=self.time_scale,
                )
            ) as answer:
                async for item in answer:
                    yield item
        finally:
            await response.aclose()  # a stream left early (a cut, a limit) drops its connection

    async def lookup(self, idempotency_key: str) -> ProviderResponse | None:
        """Ask the server whether it already did the work for ``idempotency_key``.

        ``None`` when no ``lookup_path`` is configured or the server answers 404. Any other
        failure is raised: guessing "not done" could bill the work twice.
        """
        if self.lookup_path is None:
            return None
        # the key as the calls sent it (idempotency_header_value): the server knows it by that
        url = self.base_url + self.lookup_path.format(
            key=quote(idempotency_header_value(idempotency_key), safe="")
        )
        response = await self._send("GET", url, headers=dict(self._headers))
        if response.status_code == 404:
            return None
        body = self._check(response)
        if isinstance(body, Mapping) and "response" in body:
            body = body["response"]
        return ProviderResponse(result=self._result(body), usage=total_tokens(body))

    # ------------------------------------------------------------------ internals
    def _headers_for(
        self, request: ProviderRequest, sent_key: str, extra: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """The headers of one attempt's POST, a whole call or a stream alike: the provider's own,
        the idempotency key as sent, ``extra``, the task headers when asked for, then the caller's
        per-request headers (last: they win)."""
        headers = {**self._headers, IDEMPOTENCY_HEADER: sent_key, **(extra or {})}
        if self.send_task_headers:
            headers["x-aiqsim-task-id"] = idempotency_header_value(request.task_id)
            headers["x-aiqsim-attempt"] = str(request.attempt)
        if self._request_headers is not None:
            headers.update(self._request_headers(request))
        return headers

    async def _send(
        self, method: str, url: str, *, sent_key: str | None = None, **kwargs: Any
    ) -> httpx.Response:
        """One request, its body read; every httpx failure mapped onto a provider error.

        The head is checked before the body is read: an answer echoing another
        ``Idempotency-Key`` than ``sent_key`` is closed unread, which makes httpcore close its
        connection (a response closed before its end is never returned to the pool).
        """
        httpx = self._httpx
        client = await self._http()
        encoding = "no content-encoding"
        try:
            response = await client.send(client.build_request(method, url, **kwargs), stream=True)
            try:
                # value by value: an origin's and a proxy's echo arrive joined as "k, k"
                echoed = differing_echo(response.headers, IDEMPOTENCY_HEADER, sent_key) if sent_key else None
                if sent_key is not None and echoed is not None:
                    raise ResponseMismatchError(
                        f"{self.name}: the answer belongs to another request: it echoes "
                        f"{IDEMPOTENCY_HEADER} {echoed!r}, the request sent {sent_key!r}; its "
                        "connection is dropped",
                        sent_key=sent_key,
                        echoed_key=echoed,
                    )
                encoding = response.headers.get("content-encoding", encoding)
                await self._read_bounded(response)
            finally:
                await response.aclose()
            return response
        except httpx.TimeoutException as exc:
            raise ProviderTimeoutError(f"{self.name}: no response in time ({type(exc).__name__})") from exc
        except httpx.DecodingError as exc:
            raise ResponseDecodingError(
                f"{self.name}: the response body could not be decoded (content-encoding {encoding!r}): {exc}"
            ) from exc
        except httpx.LocalProtocolError as exc:  # refused before sending: no server saw it, no retry helps
            raise InvalidRequestError(
                f"{self.name}: the request could not be sent as HTTP ({exc}); nothing reached the server"
            ) from exc
        except httpx.TransportError as exc:
            detail = str(exc) or type(exc).__name__
            raise ServerError(f"{self.name}: connection failed: {detail}", status=0) from exc
        except httpx.RequestError as exc:  # any other failure of the exchange: never a raw httpx error
            detail = str(exc) or type(exc).__name__
            raise ServerError(
                f"{self.name}: request failed: {type(exc).__name__}: {detail}", status=0
            ) from exc

    async def _read_bounded(self, response: httpx.Response) -> None:
        """Read the body, at most :attr:`max_response_bytes` of it (decoded): ``aread()`` took any size,
        so a body that never ended grew the process until the attempt timed out (1.4 GB in 10 s)."""
        limit = self.max_response_bytes
        parts: list[bytes] = []
        size = 0
        async for part in response.aiter_bytes():
            size += len(part)
            if size > limit:
                raise SchemaViolationError(
                    f"{self.name}: the response body is larger than max_response_bytes ({limit:,} bytes); "
                    "not read further, its connection is dropped"
                )
            parts.append(part)
        response._content = b"".join(parts)  # what Response.aread() keeps: .json() and .text read it

    def _check(self, response: httpx.Response) -> Any:
        """Apply rate-limit headers, raise for a failure status, return the decoded body."""
        self._observe(response.headers)
        try:
            body: Any = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError, RecursionError):  # [[[[... nested
            body = None
            decoded = False
        else:
            decoded = True
        error = error_for_status(
            response.status_code,
            headers=response.headers,
            body=body if decoded else response.text,
            now_epoch_s=self._wall_clock(),
            time_scale=self.time_scale,
            source=self.name,
            request=_described_request(response),
            profile=self.profile,
        )
        if error is not None:
            snapshot = self._snapshot(response.headers)
            error.ratelimit = None if snapshot.is_empty else snapshot  # for the call log
            try:
                raise error
            finally:
                # this frame is in the error's traceback: naming the error from it is a cycle per
                # failed call (a 429, a 5xx) that only the collector frees
                del error
        if not decoded:
            raise SchemaViolationError(
                f"{self.name}: HTTP {response.status_code} body is not JSON: {response.text[:120]!r}"
            )
        return body

    def _result(self, body: Any) -> Any:
        try:
            return self._parse_result(body)
        except SchemaViolationError as exc:
            raise SchemaViolationError(f"{self.name}: {exc}") from exc
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise SchemaViolationError(f"{self.name}: unexpected response shape ({exc!r})") from exc

    def _snapshot(self, headers: httpx.Headers) -> RateLimitSnapshot:
        """The response's rate-limit headers in this provider's dialect (resets in wall seconds)."""
        return profile_snapshot(headers, self._wall_clock(), self.profile)

    def _observe(self, headers: httpx.Headers) -> None:
        snapshot = self._snapshot(headers)
        if snapshot.is_empty:
            return
        self.last_ratelimit = snapshot
        if self._quota is not None and self._clock is not None:
            apply_ratelimit_snapshot(
                snapshot,
                self._quota,
                self._clock(),
                time_scale=self.time_scale,
                longest_wait_s=self._longest_wait_s,
            )

    def __repr__(self) -> str:
        return f"HttpProvider({self.name!r}, {self.url!r})"


def _described_request(response: httpx.Response) -> str | None:
    """``"POST http://host/v1/chat/completions"``: the request ``response`` answers, for an error's
    message (a 404 or a redirect is about the address). No user, password or query string: they may
    hold a secret."""
    try:
        request = response.request
    except RuntimeError:  # a response built by hand, with no request
        return None
    url = request.url
    return f"{request.method} {url.scheme}://{url.netloc.decode('ascii')}{url.path}"
