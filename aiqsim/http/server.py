"""The simulated provider, served over real HTTP on 127.0.0.1 in (scaled) wall time.

``start_local_server(config)`` runs the very same server model the simulation lab uses,
:class:`~aiqsim.sim.providers.SimulatedProvider`, on an
:class:`~aiqsim.runtime.AsyncioRuntime` inside the server's thread, and puts an
OpenAI-like HTTP face on it. There is one model of a provider (latency, sliding-window
quotas, seeded failures, idempotency, billing), so a simulated run and a live run of the
same :class:`~aiqsim.sim.config.ProviderConfig` differ only by transport and real time:
that is what makes a sim-vs-real comparison meaningful.

Routes:

- ``POST /v1/chat/completions``: the body is translated into the simulator's payload
  (``{"input", "prompt_units", "output_units", "poison"}`` bodies, as the simulation
  workloads submit, are taken as they are; chat bodies count prompt = characters / 4
  rounded up and output = ``max_tokens``, default 16; for ``tts`` all text is output
  characters) and handed to the simulated provider. Its outcome becomes the answer:
  success → 200 chat completion (``usage`` = units, ``result`` = the simulator's result);
  ``RateLimitError`` → 429 with ``Retry-After`` and ``retry-after-ms``;
  ``QuotaExhaustedError`` → 429 ``insufficient_quota``; ``InvalidRequestError`` → 400;
  ``ServerError`` → its status (500, or 503 in an outage); a schema violation (poison
  input) → 200 whose body lacks the completion. A *lost response* (``timeout_prob``):
  the work finished and was billed, and the server holds the connection open unanswered
  until the client gives up (``lost_mode="hold"``) or closes it without a response
  (``lost_mode="close"``). Every answer carries ``x-ratelimit-{limit,remaining,reset}-
  {requests,tokens}`` headers read from the provider's windows. ``Idempotency-Key`` is
  the simulator's idempotency key (honoured when ``honours_idempotency``); every answer to
  a request that sent one echoes it, so a client can check the answer is its own (see
  :mod:`aiqsim.http.httpx_provider` on responses misaligned on a keep-alive connection).
- ``GET /ledger``: every answered HTTP request, every execution and every bill, as JSON (also
  :meth:`LocalProviderServer.ledger`), and ``in_flight``: chat requests received and not
  answered yet (a client that watches for a call to be under way, e.g. to kill itself mid-call),
  and ``server_work``: executions accepted and not finished yet (a cut stream's or a timed-out
  call's work goes on, and is billed, after its answer ended: wait for 0 before reading the bills).
- ``GET /metrics``: Prometheus text exposition of what the server did (requests by outcome, 429s,
  bills, duplicate bills and their cost), under the names a worker's
  :class:`~aiqsim.observability.PrometheusMetrics` uses for bills (:func:`ledger_metrics`).
- ``GET /lookup/{key}`` (also ``/v1/lookup/{key}``): the stored result for an idempotency key
  (404 if none, or when ``supports_lookup`` is off), for crash recovery.

Time: scenario seconds map to wall seconds by ``time_scale`` (wall = scenario x scale),
as for :class:`~aiqsim.runtime.AsyncioRuntime`. On the wire everything is wall time, as a
real server would send it (``Retry-After``, reset durations); a client converts back with
its own ``time_scale`` (:class:`~aiqsim.http.httpx_provider.HttpProvider` does). Scenario
time 0 is when the server started (outage windows count from there).

Optional request headers ``x-client-id`` (recorded in the ledger), ``x-aiqsim-task-id`` and
``x-aiqsim-attempt`` (recorded on executions; see ``HttpProvider(send_task_headers=True)``).

The HTTP layer is :mod:`aiqsim.http.loopback` (asyncio streams in a background thread;
the reasons for that choice are in its docstring).
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import math
import random
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import (
    InvalidRequestError,
    ProviderError,
    QuotaExhaustedError,
    RateLimitError,
    SchemaViolationError,
    ServerError,
    StreamCutError,
)
from aiqsim.core.task import Priority
from aiqsim.http.chat import (
    DEFAULT_MAX_TOKENS,
    completion_json,
    error_json,
    explicit_units,
    message_chars,
    output_tokens,
    prompt_tokens,
)
from aiqsim.http.headers import format_duration
from aiqsim.http.loopback import (
    CutStream,
    DropConnection,
    HttpReply,
    HttpRequest,
    LoopbackHttpServer,
    StreamReply,
)
from aiqsim.http.server_stream import (
    DONE,
    chunk_event,
    include_usage,
    models_json,
    revealed,
    stream_options_problem,
    usage_event,
)
from aiqsim.observability.exposition import CONTENT_TYPE, MetricFamily, render
from aiqsim.runtime.asyncio_runtime import AsyncioRuntime
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse, StreamChunk
from aiqsim.sim.config import ProviderConfig
from aiqsim.sim.providers import Execution, ProviderLedger, SimulatedProvider

LostMode = Literal["hold", "close"]
CHAT_PATH = "/v1/chat/completions"
LOOKUP_PREFIXES = ("/lookup/", "/v1/lookup/")
"""Where ``GET .../lookup/{key}`` is served: also under ``/v1``, so a client whose base URL is the
OpenAI-style ``http://host:port/v1`` finds it with ``lookup_path="/lookup/{key}"``."""
MODELS_PATHS = ("/v1/models", "/models")
"""``GET /v1/models``: the model this server answers as (the ``openai`` SDK's ``models.list()``)."""
CLIENT_HEADER = "x-client-id"
TASK_ID_HEADER = "x-aiqsim-task-id"
ATTEMPT_HEADER = "x-aiqsim-attempt"


# ---------------------------------------------------------------------------- ledger records
@dataclass(frozen=True, slots=True)
class RequestEntry:
    """One HTTP request to the chat endpoint and how it was answered.

    Times are seconds since the server started: ``*_wall`` in wall time, ``arrived_s`` in
    scenario time. ``status`` is ``None`` when the response was lost. ``outcome`` is the
    simulator's (``ok``, ``rate_limited``, ``replay``...; ``bad_request`` for a body that
    never reached it). ``retry_after_wall`` is the Retry-After sent with a 429.
    """

    seq: int
    client: str
    key: str | None
    arrived_wall: float
    arrived_s: float
    responded_wall: float
    status: int | None
    outcome: str
    retry_after_wall: float | None = None
    response_lost: bool = False


@dataclass(frozen=True, slots=True)
class Ledger:
    """A snapshot of what the server saw (``requests``) and did (``executions``, the simulator's records)."""

    requests: tuple[RequestEntry, ...]
    executions: tuple[Execution, ...]

    @property
    def bills(self) -> tuple[Execution, ...]:
        """The executions the provider charged for (lost responses and schema violations included)."""
        return tuple(execution for execution in self.executions if execution.billed)

    @property
    def total_cost(self) -> float:
        """Sum of all bills."""
        return math.fsum(execution.cost for execution in self.executions)

    def bills_for(self, key: str) -> int:
        """How many times work for idempotency key ``key`` was billed."""
        return sum(1 for execution in self.bills if execution.key == key)

    @property
    def duplicate_bills(self) -> int:
        """Bills beyond the first for the same key: work paid for twice."""
        keys = [execution.key for execution in self.bills]
        return len(keys) - len(set(keys))

    def requests_from(self, client: str) -> list[RequestEntry]:
        """Requests that carried ``x-client-id: client``, in arrival order."""
        mine = (entry for entry in self.requests if entry.client == client)
        return sorted(mine, key=lambda entry: entry.arrived_wall)

    def outcomes(self) -> dict[str, int]:
        """Request count per outcome (``ok``, ``rate_limited``, ``replay``...)."""
        counts: dict[str, int] = {}
        for entry in self.requests:
            counts[entry.outcome] = counts.get(entry.outcome, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (as served on ``GET /ledger``)."""
        return {
            "requests": [asdict(entry) for entry in self.requests],
            "executions": [asdict(execution) for execution in self.executions],
            "bills": [asdict(execution) for execution in self.bills],
            "total_cost": self.total_cost,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Ledger:
        """Inverse of :meth:`to_dict` (e.g. for a ledger fetched over HTTP)."""
        return cls(
            requests=tuple(RequestEntry(**entry) for entry in data["requests"]),
            executions=tuple(Execution(**execution) for execution in data["executions"]),
        )


def ledger_metrics(ledger: Ledger, provider: str, *, in_flight: int = 0) -> list[MetricFamily]:
    """The server's side of the dashboard, from its ledger: requests by outcome, 429s, bills. A bill
    is a duplicate when its key was billed before (in the order the server finished the calls, as
    :func:`aiqsim.sim.simulate` feeds its sinks)."""
    requests: dict[tuple[str, ...], float] = {}
    for entry in ledger.requests:
        requests[(provider, entry.outcome)] = requests.get((provider, entry.outcome), 0) + 1
    billed_keys: set[str] = set()
    calls = cost = duplicates = duplicate_cost = 0.0
    for execution in ledger.executions:
        if not execution.billed:
            continue
        calls += 1
        cost += execution.cost
        if execution.key in billed_keys:
            duplicates += 1
            duplicate_cost += execution.cost
        billed_keys.add(execution.key)
    one = (provider,)
    limited = requests.get((provider, "rate_limited"), 0)
    return [
        MetricFamily("aiqsim_provider_requests_total", "counter", ("provider", "outcome"), requests),
        MetricFamily("aiqsim_provider_rate_limited_total", "counter", ("provider",), {one: limited}),
        MetricFamily("aiqsim_provider_in_flight", "gauge", ("provider",), {one: in_flight}),
        MetricFamily("aiqsim_billed_calls_total", "counter", ("provider",), {one: calls}),
        MetricFamily("aiqsim_billed_cost_total", "counter", ("provider",), {one: cost}),
        MetricFamily("aiqsim_duplicate_billed_calls_total", "counter", ("provider",), {one: duplicates}),
        MetricFamily("aiqsim_duplicate_cost_total", "counter", ("provider",), {one: duplicate_cost}),
    ]


def iter_retry_violations(ledger: Ledger, client: str, slack_wall: float = 1e-3) -> Iterator[RequestEntry]:
    """Requests of ``client`` that arrived before a preceding 429's Retry-After had passed.

    Exact for a client that sends one request at a time (concurrency 1): its next request
    after a 429 can only have been sent after it received that 429. ``slack_wall``
    absorbs timer granularity.
    """
    not_before = -math.inf
    for entry in ledger.requests_from(client):
        if entry.arrived_wall + slack_wall < not_before:
            yield entry
        if entry.status == 429 and entry.retry_after_wall is not None:
            not_before = max(not_before, entry.responded_wall + entry.retry_after_wall)


# ---------------------------------------------------------------------------- plumbing
class _Exchange:
    """One HTTP request in flight: receives the simulator's record of it."""

    __slots__ = ("execution", "lost")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.execution: Execution | None = None
        self.lost: asyncio.Future[None] = loop.create_future()


_CURRENT_EXCHANGE: contextvars.ContextVar[_Exchange | None] = contextvars.ContextVar(
    "aiqsim_http_exchange", default=None
)
"""Set around each simulated call; asyncio copies it into the server-side task the simulator spawns."""


class _ExchangeLedger(ProviderLedger):
    """The simulator's ledger, also telling the HTTP exchange that caused a record about it."""

    def __init__(self, lock: threading.Lock) -> None:
        super().__init__()
        self._lock = lock

    def record(self, execution: Execution, result: Any = None) -> None:
        with self._lock:
            super().record(execution, result)
        exchange = _CURRENT_EXCHANGE.get()
        if exchange is not None:
            exchange.execution = execution
            if execution.response_lost and not exchange.lost.done():
                exchange.lost.set_result(None)


MAX_REQUEST_TOKENS = 1_000_000
"""The most output tokens (and the most stated units) a request may ask for: more is no model's
answer, and a 400-digit max_tokens crashed the handler (HTTP 500, retried, never logged)."""


def unsupported_request(body: Mapping[str, Any]) -> str | None:
    """Why this server cannot answer ``body`` as the API would, or ``None``. OpenAI returns ``n``
    choices (this server one), refuses a ``max_tokens`` below 1, and a ``stream``/``stream_options``
    that is not what its API allows (``stream: true`` is answered as a stream)."""
    problem = stream_options_problem(body)
    if problem is not None:
        return problem
    n = body.get("n", 1)
    if n != 1 or isinstance(n, bool):
        return f"n={n!r}: this server returns one choice; send n=1 or leave it out"
    for field in ("max_completion_tokens", "max_tokens", "prompt_units", "output_units"):
        value = body.get(field)
        if value is None:
            continue
        least = 0 if field.endswith("_units") else 1
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MAX_REQUEST_TOKENS:
            return f"{field} must be a whole number from {least} to {MAX_REQUEST_TOKENS:,}, got {value!r}"
    return None


def simulator_payload(body: Mapping[str, Any], kind: str, default_max_tokens: int) -> dict[str, Any]:
    """The :class:`~aiqsim.sim.providers.SimJob` payload for a request body.

    A body stating ``prompt_units``/``output_units`` is taken as it is; a chat body is
    counted (``tts``: all message characters are output units).
    """
    if explicit_units(body) is not None:
        return {key: body[key] for key in ("input", "prompt_units", "output_units", "poison") if key in body}
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    content = last.get("content") if isinstance(last, Mapping) else None
    text = content if isinstance(content, str) else ""
    if kind == "tts":
        prompt, output = 0, message_chars(messages)
    else:
        prompt, output = prompt_tokens(body), output_tokens(body, default_max_tokens)
    return {"input": text, "prompt_units": prompt, "output_units": output, "poison": bool(body.get("poison"))}


def _completion_id(execution: Execution) -> str:
    digest = hashlib.sha256(f"{execution.key}:{execution.start!r}".encode()).hexdigest()
    return f"chatcmpl-{digest[:16]}"


# ---------------------------------------------------------------------------- the server
class LocalProviderServer:
    """A :class:`~aiqsim.sim.providers.SimulatedProvider` served over HTTP on loopback.

    Create it with :func:`start_local_server`. ``url`` is the base URL to give
    :class:`~aiqsim.http.httpx_provider.HttpProvider`; ``ledger()`` snapshots what happened.
    """

    def __init__(
        self,
        config: ProviderConfig,
        *,
        time_scale: float = 1.0,
        seed: int | str = 0,
        lost_mode: LostMode = "hold",
        hold_s: float | None = None,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        model: str = "aiqsim-local",
        port: int = 0,
        host: str = "127.0.0.1",
    ) -> None:
        if lost_mode not in ("hold", "close"):
            raise ConfigurationError(f"lost_mode must be 'hold' or 'close', got {lost_mode!r}")
        self.config = config
        self.runtime = AsyncioRuntime(time_scale=time_scale)
        self.time_scale = self.runtime.time_scale
        self.lost_mode: LostMode = lost_mode
        self.hold_s = hold_s
        self.default_max_tokens = default_max_tokens
        self.model = model
        self._lock = threading.Lock()
        self._provider_ledger = _ExchangeLedger(self._lock)
        self.provider = SimulatedProvider(self.runtime, config, random.Random(seed), self._provider_ledger)
        """The simulated provider behind the endpoint (lives on the server thread)."""
        self._requests: list[RequestEntry] = []
        self._arrivals = 0
        """Chat requests received so far: names a request that brings no task id or key of its own."""
        self._in_flight = 0
        """Chat requests being worked on and not answered yet (owned by the server loop)."""
        self._origin: float | None = None
        self._http = LoopbackHttpServer(
            self._handle, name=f"aiqsim-provider-{config.name}", on_start=self._on_start, port=port, host=host
        )

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> LocalProviderServer:
        """Start serving (done by :func:`start_local_server`)."""
        self._http.start()
        return self

    def _on_start(self) -> None:
        self._origin = time.monotonic()
        self.runtime.now()  # binds the runtime to the server loop and starts scenario time at 0

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321``."""
        return self._http.url

    @property
    def connections_accepted(self) -> int:
        """TCP connections accepted so far."""
        return self._http.connections_accepted

    def stop(self) -> None:
        """Stop serving and close every connection (idempotent)."""
        self._http.stop()

    def __enter__(self) -> LocalProviderServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def ledger(self) -> Ledger:
        """A consistent snapshot of requests and executions so far (thread-safe)."""
        with self._lock:
            return Ledger(tuple(self._requests), tuple(self._provider_ledger.executions))

    # ------------------------------------------------------------------ clocks
    def _wall(self, monotonic: float | None = None) -> float:
        assert self._origin is not None, "server not started"
        return (time.monotonic() if monotonic is None else monotonic) - self._origin

    # ------------------------------------------------------------------ routing
    async def _handle(self, request: HttpRequest) -> HttpReply | DropConnection | StreamReply:
        if request.method == "POST" and request.path == CHAT_PATH:
            self._in_flight += 1
            streaming = False
            try:
                reply = await self._chat(request)
                if isinstance(reply, StreamReply):  # in flight until its last byte is written
                    streaming = True
                    reply = _ending_with(reply, self._stream_ended)
                return reply
            finally:
                if not streaming:
                    self._in_flight -= 1
        if request.method == "GET" and request.path in MODELS_PATHS:
            return HttpReply.json(200, models_json(self.model))
        if request.method == "GET" and request.path == "/metrics":
            body = render(ledger_metrics(self.ledger(), self.config.name, in_flight=self._in_flight))
            return HttpReply(200, body.encode("utf-8"), {"content-type": CONTENT_TYPE})
        if request.method == "GET" and request.path == "/ledger":
            return HttpReply.json(
                200,
                {
                    **self.ledger().to_dict(),
                    "in_flight": self._in_flight,
                    "server_work": self.provider.server_work,
                },
            )
        for prefix in LOOKUP_PREFIXES:
            if request.method == "GET" and request.path.startswith(prefix):
                return await self._lookup(request.path[len(prefix) :])
        return HttpReply.json(404, error_json(f"no route {request.method} {request.path}", "not_found"))

    def _stream_ended(self, whole: bool) -> None:
        self._in_flight -= 1

    async def _lookup(self, key: str) -> HttpReply:
        found = await self.provider.lookup(key)
        first = self._provider_ledger.first_success(self.config.name, key)
        if found is None or first is None:
            return HttpReply.json(404, error_json(f"no stored result for key {key!r}", "not_found"))
        return HttpReply.json(200, {"key": key, "response": self._completion(first[0], found)})

    def _completion(self, execution: Execution, response: ProviderResponse) -> dict[str, Any]:
        """A chat completion for the simulator's result (kept whole under ``result``)."""
        result = response.result if isinstance(response.result, Mapping) else {}
        output = int(result.get("output_units", 0))
        body = completion_json(
            _completion_id(execution),
            self.model,
            f"echo: {result.get('input', '')}",
            prompt=execution.units - output,
            output=output,
            created=int(time.time()),
        )
        body["result"] = response.result
        return body

    def _ratelimit_headers(self) -> dict[str, str]:
        """``x-ratelimit-*`` as OpenAI sends them; none from a server that does not report its quota
        (``reports_quota = false``), as its simulated twin's 429s say nothing about it either."""
        if not self.provider.config.reports_quota:
            return {}
        now = self.runtime.now()
        headers: dict[str, str] = {}
        usage_by_window = self.provider.window_usage(now)
        for dimension, window in (("requests", "requests"), ("tokens", "units")):
            usage = usage_by_window.get(window)
            if usage is None:
                continue
            limit, used, reset = usage
            headers[f"x-ratelimit-limit-{dimension}"] = f"{limit:g}"
            headers[f"x-ratelimit-remaining-{dimension}"] = f"{math.floor(max(0.0, limit - used)):d}"
            headers[f"x-ratelimit-reset-{dimension}"] = format_duration(reset * self.time_scale)
        return headers

    async def _chat(self, request: HttpRequest) -> HttpReply | DropConnection:
        arrived_wall = self._wall(request.received_at)
        entry: dict[str, Any] = {
            "client": request.headers.get(CLIENT_HEADER, ""),
            "key": request.headers.get("idempotency-key"),
            "arrived_wall": arrived_wall,
            "arrived_s": arrived_wall / self.time_scale,
        }

        def log(status: int | None, outcome: str, **extra: Any) -> None:
            with self._lock:
                seq = len(self._requests) + 1
                self._requests.append(
                    RequestEntry(
                        seq=seq, responded_wall=self._wall(), status=status, outcome=outcome, **entry, **extra
                    )
                )

        def reply(
            status: int, payload: Any, outcome: str, headers: Mapping[str, str] | None = None, **extra: Any
        ) -> HttpReply:
            log(status, outcome, **extra)
            echo = {} if entry["key"] is None else {"idempotency-key": entry["key"]}
            return HttpReply.json(status, payload, {**self._ratelimit_headers(), **echo, **(headers or {})})

        try:
            body = request.json()
        except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser recurses
            body = None
        if not isinstance(body, dict) or (
            explicit_units(body) is None and not isinstance(body.get("messages"), list)
        ):
            message = "the body must be a JSON object with a messages list (or prompt_units and output_units)"
            return reply(400, error_json(message, "invalid_request_error"), "bad_request")
        problem = unsupported_request(body)
        if problem is not None:  # refused before it is simulated, billed or logged as served
            return reply(400, error_json(problem, "invalid_request_error"), "bad_request")

        self._arrivals += 1  # the server loop is one thread: a unique, deterministic arrival number
        arrival = self._arrivals
        sim_request = ProviderRequest(
            task_id=request.headers.get(TASK_ID_HEADER) or f"http-{arrival}",
            # a keyless request is its own key: its fate follows its arrival number, as seeded
            idempotency_key=entry["key"] or f"no-key-{arrival}",
            kind=self.config.kind,
            payload=simulator_payload(body, self.config.kind, self.default_max_tokens),
            cost_estimate=0.0,
            attempt=_int_header(request.headers.get(ATTEMPT_HEADER), default=1),
            priority=Priority.BACKGROUND,
        )
        exchange = _Exchange(asyncio.get_running_loop())
        token = _CURRENT_EXCHANGE.set(exchange)
        items: AsyncIterator[Any] | None = None
        try:
            if body.get("stream") is True:
                items = aiter(self.provider.stream(sim_request))
                call = asyncio.ensure_future(anext(items))  # the simulated call starts in this context
            else:
                call = asyncio.ensure_future(self.provider.call(sim_request))
        finally:
            _CURRENT_EXCHANGE.reset(token)
        try:
            await asyncio.wait({call, exchange.lost}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            call.cancel()
            raise
        outcome = exchange.execution.outcome if exchange.execution is not None else "unrecorded"

        if exchange.lost.done() and not call.done():
            call.cancel()  # the simulator would make its client hang; here the connection does
            log(None, outcome, response_lost=True)
            return DropConnection(hold_s=0.0 if self.lost_mode == "close" else self.hold_s)
        if items is not None:
            try:
                first = call.result()
            except StreamCutError:  # cut (and billed) before its first token: the connection drops
                log(None, "stream_cut", response_lost=True)
                return DropConnection(hold_s=0.0)
            except ProviderError as error:
                return self._failure(reply, error, outcome)
            return self._stream_reply(body, sim_request, items, first, exchange, entry, log)
        try:
            response = call.result()
        except ProviderError as error:
            return self._failure(reply, error, outcome)
        assert exchange.execution is not None, "every simulated call is recorded"
        first = self._provider_ledger.first_success(self.config.name, sim_request.idempotency_key)
        source = first[0] if first is not None and outcome == "replay" else exchange.execution
        headers = {"idempotent-replayed": "true"} if outcome == "replay" else {}
        return reply(200, self._completion(source, response), outcome, headers)

    def _failure(self, reply: Any, error: ProviderError, outcome: str) -> HttpReply:
        """The answer to a simulated call that failed before any of its answer was sent."""
        if isinstance(error, RateLimitError):
            return self._rate_limited(reply, error, outcome)
        if isinstance(error, QuotaExhaustedError):
            message = f"{error} (insufficient quota)"
            body_json = error_json(message, "insufficient_quota", "insufficient_quota")
            return reply(429, body_json, outcome)
        if isinstance(error, InvalidRequestError):
            return reply(400, error_json(str(error), "invalid_request_error"), outcome)
        if isinstance(error, ServerError):
            return reply(error.status, error_json(str(error), "server_error"), outcome)
        if isinstance(error, SchemaViolationError):
            malformed = {"id": "chatcmpl-malformed", "object": "chat.completion", "choices": []}
            return reply(200, malformed, outcome)
        # e.g. a lost response's timeout: no answer of the API's fits; a server error says it failed
        return reply(500, error_json(str(error), "server_error"), outcome)

    def _stream_reply(
        self,
        body: Mapping[str, Any],
        sim_request: ProviderRequest,
        items: AsyncIterator[Any],
        first: Any,
        exchange: _Exchange,
        entry: dict[str, Any],
        log: Any,
    ) -> StreamReply:
        """The answer as OpenAI streams it: a role chunk, the text revealed as the simulated provider
        generates it, a ``stop`` chunk, the usage chunk when asked, ``[DONE]``. A cut of the simulated
        stream (``stream_cut_prob``) closes the connection mid-body, as a dropped connection does."""
        payload = sim_request.payload
        text = f"echo: {payload.get('input', '')}"
        prompt, output = int(payload.get("prompt_units", 0)), int(payload.get("output_units", 0))
        digest = hashlib.sha256(f"{sim_request.idempotency_key}:{sim_request.task_id}".encode()).hexdigest()
        completion_id, created, model = f"chatcmpl-{digest[:16]}", int(time.time()), self.model
        usage = include_usage(body)
        ended: list[str] = []

        async def parts() -> AsyncIterator[bytes]:
            yield chunk_event(completion_id, model, created, {"role": "assistant", "content": ""})
            shown = 0
            generated = 0.0
            item = first
            while not isinstance(item, ProviderResponse):
                if isinstance(item, StreamChunk):
                    generated += item.units or 0.0
                    whole = not (isinstance(item.data, Mapping) and "chunk" in item.data)
                    upto = len(text) if whole else revealed(text, generated, output)
                    if upto > shown:
                        yield chunk_event(completion_id, model, created, {"content": text[shown:upto]})
                        shown = upto
                try:
                    item = await anext(items)
                except StopAsyncIteration:
                    ended.append("stream_unfinished")
                    raise CutStream from None
                except ProviderError:  # a simulated cut (billed) or a late failure: the body stops
                    ended.append("stream_cut")
                    raise CutStream from None
            if shown < len(text):
                yield chunk_event(completion_id, model, created, {"content": text[shown:]})
            yield chunk_event(completion_id, model, created, {}, "stop")
            if usage:
                yield usage_event(completion_id, model, created, prompt, output)
            yield DONE

        def on_end(whole: bool) -> None:
            outcome = exchange.execution.outcome if exchange.execution is not None else "unrecorded"
            if not whole:
                outcome = ended[0] if ended else "client_gone"
            log(200, outcome)

        headers = {
            **self._ratelimit_headers(),
            "content-type": "text/event-stream",
            "cache-control": "no-cache",
        }
        if entry["key"] is not None:
            headers["idempotency-key"] = entry["key"]
        return StreamReply(200, parts(), headers, on_end)

    def _rate_limited(self, reply: Any, error: RateLimitError, outcome: str) -> HttpReply:
        headers: dict[str, str] = {}
        retry_after_wall: float | None = None
        if error.retry_after_s is not None:
            millis = max(1, math.ceil(round(error.retry_after_s * self.time_scale * 1000.0, 6)))
            retry_after_wall = millis / 1000.0
            # RFC 9110 delay-seconds is a whole number (urllib3 and requests refuse "0.500"): rounded
            # up, never sooner than asked; retry-after-ms (OpenAI's header) keeps the fraction
            headers = {"retry-after": str(math.ceil(millis / 1000)), "retry-after-ms": str(millis)}
        body = error_json(str(error), "requests", "rate_limit_exceeded")
        return reply(429, body, outcome, headers, retry_after_wall=retry_after_wall)


def _ending_with(reply: StreamReply, also: Any) -> StreamReply:
    """``reply`` whose end also calls ``also(whole)``."""
    inner = reply.on_end

    def on_end(whole: bool) -> None:
        try:
            if inner is not None:
                inner(whole)
        finally:
            also(whole)

    return StreamReply(reply.status, reply.parts, reply.headers, on_end)


def _int_header(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def start_local_server(
    config: ProviderConfig,
    *,
    time_scale: float = 1.0,
    seed: int | str = 0,
    lost_mode: LostMode = "hold",
    hold_s: float | None = None,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    port: int = 0,
    host: str = "127.0.0.1",
) -> LocalProviderServer:
    """Start a :class:`LocalProviderServer` for ``config``; use it as a context manager.

    ``time_scale``: wall seconds per scenario second. ``seed``: the simulated provider's
    random generator. ``lost_mode``/``hold_s``: how a lost response is lost (see the module
    docstring; ``hold_s`` in wall seconds, ``None`` = until the client closes). ``port``
    (0: any free port) and ``host`` (loopback by default): where to listen; an address that
    cannot be used raises :class:`~aiqsim.http.loopback.ServerStartError`.
    """
    return LocalProviderServer(
        config,
        time_scale=time_scale,
        seed=seed,
        lost_mode=lost_mode,
        hold_s=hold_s,
        default_max_tokens=default_max_tokens,
        port=port,
        host=host,
    ).start()
