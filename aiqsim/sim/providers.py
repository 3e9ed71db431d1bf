"""Simulated providers: a server model with latency, quota windows, failures and billing.

A :class:`SimulatedProvider` plays the *server* side of an AI API inside a simulation. It
is written only against the :class:`~aiqsim.runtime.protocol.Runtime` protocol, so the
real :class:`~aiqsim.scheduler.Scheduler` calls it exactly as it would call an HTTP
adapter, and everything it does happens in virtual time on
:class:`~aiqsim.runtime.SimPyRuntime`.

One call goes through these steps, in this order:

1. **Outage windows** (``config.outages``): ``error`` answers HTTP 503 after
   ``latency_base_s``; ``slow`` multiplies every latency of the call by ``slow_factor``.
2. **Server-side quota**: sliding 60 s windows over accepted requests, for
   ``server_requests_per_min`` and ``server_units_per_min`` (units = prompt + output). A
   request that would exceed either is rejected at once with a 429 whose Retry-After is
   the whole number of seconds (rounded up) until the window has room for it. Nothing
   is billed. Retry storms emerge from this rule, not from a scripted failure rate. The 429
   says the quota is spent (``RateLimitError.quota_spent=True``, as ``x-ratelimit-remaining: 0``
   would); a random 429 (step 3) says what the windows hold (``None`` without windows, or with
   ``reports_quota = false``: a server that does not say).
3. **Random failures**, decided by per-request draws (see Randomness below): a random 429, quota
   exhausted (fatal), invalid request, a 500 after part of the latency (not billed),
   and a schema violation for poison payloads after the full latency (billed: the server
   did the work).
4. **Idempotency**: a provider that honours keys answers a repeated key from its stored
   result (not billed, recorded as a ``replay``), and a repeat that arrives while the
   first execution is still running waits for it instead of running again.
5. **Execution**: latency ``(latency_base_s + latency_per_unit_s * output_units)`` times a
   mean-1 lognormal noise, then the call is billed. With ``timeout_prob`` the response
   is lost *after* billing: the client hears nothing and its attempt timeout fires.

**Streams** (``ttft_s`` and ``tokens_per_s`` set, see :class:`~aiqsim.sim.config.ProviderConfig`):
the latency of an execution is its time to first token plus its generation time, and every answer
says its time to first token (``ProviderResponse.first_token_s``), to :meth:`SimulatedProvider.call`
as to :meth:`SimulatedProvider.stream`, which yields the answer's chunks at the times the tokens are
generated (the first token alone, then up to :data:`STREAM_CHUNK_UNITS` per chunk). A random 500
comes before the first token (not billed). With ``stream_cut_prob`` the connection drops at a
uniform point of the generation: the client gets the chunks before it, then
:class:`~aiqsim.core.failures.StreamCutError`; the server, as for a lost response, finishes, bills
and keeps the answer (recorded ``stream_cut``), so a ``lookup`` or an honoured key finds it and
only a blind re-send is billed twice. A stream's draws (first-token noise, cut, cut point)
come from a second keyed hash of the same request identity, so a provider without the stream model
draws exactly as before.

The work of a call runs as a server-side task of its own: a client that gives up
(attempt timeout, cancellation, a crash of the whole scheduler) does not stop the server
from finishing, billing and remembering the result, exactly as a real API behaves. That
is what makes duplicate billing and crash recovery by ``lookup`` measurable.

Every call is recorded in a :class:`ProviderLedger` (which may be shared by several
providers and outlives any scheduler instance) as a frozen :class:`Execution`.

Randomness: every call takes exactly :data:`DRAWS_PER_CALL` uniform draws up front, whatever
its outcome, so changing one probability never shifts the draws behind the others. The draws
are a keyed hash of the request's identity, its idempotency key and how many requests with
that key arrived before it (a retry is the key's second arrival, a re-send after a crash its
next), under a secret taken once from the injected ``rng``. A request's fate therefore does not
depend on the order in which requests of different keys reach the server: the live run over
HTTP, where near-simultaneous requests arrive in any order, meets the same fates as the
simulation, and two configurations compared on one seed (FIFO vs SJF, two backoff bases) face
the same fate per request (common random numbers). Server-quota 429s count as arrivals too, so
where those depend on timing (a request landing just inside or outside a window), so do the
fates of that key's later requests.
"""

from __future__ import annotations

import hashlib
import random
import statistics
import struct
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from math import (  # names, not math.x: one lookup fewer per call in the hot path
    ceil,
    exp,
    floor,
    fsum,
    inf,
    isinf,
    log1p,
)
from statistics import NormalDist
from typing import Any, Literal, NamedTuple, get_args

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import (
    InvalidRequestError,
    ProviderError,
    ProviderTimeoutError,
    QuotaExhaustedError,
    RateLimitError,
    SchemaViolationError,
    ServerError,
    StreamCutError,
)
from aiqsim.core.ratelimit import RateLimitSnapshot
from aiqsim.core.slot_init import compile_builder, compile_copier, fast_frozen_init
from aiqsim.runtime.protocol import Future, Runtime
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse, StreamChunk, new_response
from aiqsim.sim.config import LATENCY_DISTRIBUTIONS, OutageConfig, ProviderConfig
from aiqsim.sim.recent_keys import RecentKeys

__all__ = [
    "DRAWS_PER_CALL",
    "LOST_RESPONSE_HANG_S",
    "OUTCOMES",
    "SERVER_ERROR_LATENCY_FRACTION",
    "STREAM_CHUNK_UNITS",
    "WINDOW_S",
    "Execution",
    "Outcome",
    "ProviderLedger",
    "SimJob",
    "SimulatedProvider",
    "lognormal_noise",
]

Outcome = Literal[
    "ok",
    "rate_limited",
    "server_error",
    "schema_violation",
    "quota_exhausted",
    "invalid_request",
    "outage",
    "replay",
    "stream_cut",
]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
"""Every value :attr:`Execution.outcome` can take."""

WINDOW_S = 60.0
"""Length of the server's sliding quota windows (limits are published per minute)."""

WINDOW_TOLERANCE_S = 1e-9
"""An accepted request leaves the window this much before exactly 60 s have passed, so a
client pacing itself at the limit is not rejected by floating-point noise in its clock."""

SERVER_ERROR_LATENCY_FRACTION = 0.5
"""A random 500 arrives after this fraction of the call's latency (the server failed midway)."""

LOST_RESPONSE_HANG_S = 86_400.0
"""How long a client whose response was lost waits before its connection finally drops
(:class:`ProviderTimeoutError`). Any sane attempt timeout fires long before."""

DRAWS_PER_CALL = 6
"""Uniform draws every call takes (from its keyed hash): rate limit, quota exhausted, invalid
request, server error, lost response, latency noise."""

STREAM_DRAWS_PER_CALL = 3
"""Uniform draws every call of a provider with the stream model takes from its second keyed hash:
first-token noise, stream cut, cut point."""

STREAM_CHUNK_UNITS = 16
"""Most output units one simulated stream chunk carries (the first chunk carries the first token
alone, at the time to first token): a chunk per token would cost an event per token."""

_STREAM_PERSON = b"aiqsim-stream"
"""BLAKE2b personalisation of the stream draws' hash (same secret, independent draws)."""

_STANDARD_NORMAL = NormalDist()
_UNIT_OPEN = 1e-12
_NORMAL_QUANTILE: Callable[[float, float, float], float] | None = getattr(
    statistics, "_normal_dist_inv_cdf", None
)
"""The function ``NormalDist.inv_cdf`` ends in (C on CPython), called directly: the method around it only
checks ``0 < p < 1`` and ``sigma > 0``, which :func:`lognormal_noise` guarantees, and costs ~0.4 us of
each simulated call. ``None`` on a Python without it: the method is used."""


def lognormal_noise(sigma: float, uniform: float) -> float:
    """A lognormal factor with mean 1 and log-space ``sigma``, from one uniform draw in [0, 1).

    Uses the inverse normal CDF so one call costs exactly one draw (``random.lognormvariate``
    takes a variable number). ``sigma == 0`` gives exactly 1.0.
    """
    if sigma == 0:
        return 1.0
    p = min(max(uniform, _UNIT_OPEN), 1.0 - _UNIT_OPEN)
    z = _STANDARD_NORMAL.inv_cdf(p) if _NORMAL_QUANTILE is None else _NORMAL_QUANTILE(p, 0.0, 1.0)
    return exp(sigma * z - 0.5 * sigma * sigma)


def exponential_noise(uniform: float) -> float:
    """An exponential factor with mean 1 from one uniform draw in [0, 1) (inverse CDF: ``-ln(1 - u)``)."""
    return -log1p(-uniform)


_copy_response = compile_copier(ProviderResponse)
_new_snapshot = compile_builder(RateLimitSnapshot)  # one per simulated answer: no class call
"""``dataclasses.replace`` for responses without its per-call introspection (one per simulated answer)."""


@fast_frozen_init  # built per call: see aiqsim.core.slot_init
@dataclass(frozen=True, slots=True)
class Execution:
    """One call as the server saw it.

    ``start`` is when the request arrived, ``end`` when the server answered (or, for a lost
    response or a cut stream, when it finished and billed the work; the client never hears of it,
    or, for a ``stream_cut``, heard its stream stop earlier).
    ``billed`` calls cost ``cost``; ``units`` is the request's prompt + output units.
    ``service_s`` is how long the provider model meant the call to take (its latency draw; None
    for calls answered without one): ``end - start`` exceeds it only by the runtime's timer lag,
    which is 0 on the virtual clock and what a live server's loop adds in real time.
    """

    provider: str
    task_id: str
    key: str
    attempt: int
    start: float
    end: float
    outcome: Outcome
    billed: bool
    cost: float
    units: int
    response_lost: bool = False
    service_s: float | None = None


class ProviderLedger:
    """What the simulated servers did and billed: the ground truth for cost and duplicates.

    Scheduler events say what the *client* saw; only the ledger knows that a timed-out
    call was in fact executed and billed. One ledger may be shared by several providers.
    It holds plain data only, so a simulation harness keeps it across a simulated
    scheduler crash and restart.
    """

    def __init__(
        self,
        *,
        keep_executions: bool = True,
        on_record: Callable[[Execution], None] | None = None,
        forget_keys_after_s: float | None = None,
        key_in_use: Callable[[str, float], bool] | None = None,
    ) -> None:
        self.executions: list[Execution] = []
        """Every call, in the order the server finished with it (empty with ``keep_executions=False``)."""
        self._successes: dict[tuple[str, str], tuple[Execution, Any]] = {}
        self._keep = keep_executions
        self._on_record = on_record
        """Called with every execution as it is recorded (a streaming summary counts them there)."""
        self._recent: RecentKeys[tuple[str, str]] | None = (
            None if forget_keys_after_s is None else RecentKeys(forget_keys_after_s)
        )
        """With ``forget_keys_after_s``: the provider's idempotency memory, like a real API's key
        retention -- a key's first result is forgotten once the key has been silent that long."""
        self._key_in_use = key_in_use
        """``key_in_use(key, at)``: whether live tasks, which may call ``key`` again, have held it
        since ``at`` or earlier (see :meth:`forget_silent_keys`)."""

    def __len__(self) -> int:
        return len(self.executions)

    def __iter__(self) -> Iterator[Execution]:
        return iter(self.executions)

    def record(self, execution: Execution, result: Any = None) -> None:
        """Append ``execution``; an ``ok`` one also stores ``result`` if it is the key's first."""
        if self._keep:
            self.executions.append(execution)
        if execution.outcome == "ok" or execution.outcome == "stream_cut":  # the server finished both
            self._successes.setdefault((execution.provider, execution.key), (execution, result))
        recent = self._recent
        if recent is not None:
            if (execution.provider, execution.key) in self._successes:
                recent.touch((execution.provider, execution.key), execution.end)
            self.forget_silent_keys(execution.end)
        if self._on_record is not None:
            self._on_record(execution)

    def forget_silent_keys(self, now: float) -> None:
        """With ``forget_keys_after_s``: drop the results of keys silent that long before ``now``.

        A key live tasks have held since before it would have expired (``key_in_use``) is kept, as
        the store keeps a live owner's key: a client waiting out a lost response's attempt timeout
        is not silent, and its retry must find the result (a window shorter than that gap had it
        billed again). A key taken up again only later is forgotten all the same."""
        recent = self._recent
        if recent is not None:
            in_use = self._key_in_use
            for gone, last in recent.expired_since(now):
                if in_use is not None and in_use(gone[1], last + recent.window_s):
                    recent.touch(gone, now)
                else:
                    self._successes.pop(gone, None)

    def first_success(self, provider: str, key: str) -> tuple[Execution, Any] | None:
        """The first completed execution of ``key`` at ``provider`` and its result (``ok``, or
        ``stream_cut``: the server finished the answer whose stream was cut)."""
        return self._successes.get((provider, key))

    @property
    def results(self) -> dict[str, Any]:
        """Idempotency key -> result of its first completed execution (first provider wins)."""
        found: dict[str, Any] = {}
        for (_provider, key), (_execution, result) in self._successes.items():
            found.setdefault(key, result)
        return found

    def executions_by_key(self, *, billed_only: bool = False) -> dict[str, list[Execution]]:
        """Calls grouped by idempotency key, in order (only billed ones with ``billed_only``)."""
        grouped: dict[str, list[Execution]] = {}
        for execution in self.executions:
            if billed_only and not execution.billed:
                continue
            grouped.setdefault(execution.key, []).append(execution)
        return grouped

    def outcome_counts(self) -> dict[str, int]:
        """Number of calls per outcome (every outcome in :data:`OUTCOMES`, zeros included)."""
        counts = dict.fromkeys(OUTCOMES, 0)
        for execution in self.executions:
            counts[execution.outcome] += 1
        return counts

    @property
    def billed_calls(self) -> int:
        """Calls the provider charged for (executions, including lost responses, cut streams and schema
        violations)."""
        return sum(1 for execution in self.executions if execution.billed)

    @property
    def cost_total(self) -> float:
        """Everything billed, in currency units."""
        return fsum(execution.cost for execution in self.executions)

    def _duplicates(self) -> Iterator[Execution]:
        for billed in self.executions_by_key(billed_only=True).values():
            yield from billed[1:]

    @property
    def duplicate_billed_calls(self) -> int:
        """Billed executions beyond the first for the same key: work paid for twice."""
        return sum(1 for _ in self._duplicates())

    @property
    def cost_duplicated(self) -> float:
        """What the duplicate billed executions cost."""
        return fsum(execution.cost for execution in self._duplicates())


@fast_frozen_init  # built per call: see aiqsim.core.slot_init
@dataclass(frozen=True, slots=True)
class SimJob:
    """A simulated request payload, validated: ``{"input", "prompt_units", "output_units", "poison"}``."""

    input: str
    prompt_units: int
    output_units: int
    poison: bool = False

    @property
    def units(self) -> int:
        """What the request costs in the provider's units (prompt + output)."""
        return self.prompt_units + self.output_units

    @classmethod
    def from_payload(cls, payload: Any) -> SimJob:
        """Validate a payload dict; :class:`InvalidRequestError` (a 400) if it is malformed."""
        # Fast path (twice per simulated call: the client's cost estimate and the server): the usual
        # payload, a plain dict with text input and non-negative plain int units, is read as is.
        # Anything else takes the full checks below, which convert it or say what is wrong; both
        # paths build the same SimJob (tests/test_sim_providers_fast_paths.py).
        if type(payload) is dict:
            text = payload.get("input")
            prompt = payload.get("prompt_units")
            output = payload.get("output_units")
            if (
                type(text) is str
                and type(prompt) is int
                and type(output) is int
                and prompt >= 0
                and output >= 0
            ):
                poison = payload.get("poison", False)
                return cls(text, prompt, output, poison if type(poison) is bool else bool(poison))
        return cls._checked(payload)

    @classmethod
    def _checked(cls, payload: Any) -> SimJob:
        """:meth:`from_payload` for any payload: the full checks, converting input and poison."""
        if not isinstance(payload, dict):
            raise InvalidRequestError(f"payload must be a dict, got {type(payload).__name__}")
        missing = [name for name in ("input", "prompt_units", "output_units") if name not in payload]
        if missing:
            raise InvalidRequestError(f"payload lacks {', '.join(missing)}")
        prompt, output = payload["prompt_units"], payload["output_units"]
        for name, value in (("prompt_units", prompt), ("output_units", output)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidRequestError(f"{name} must be an int >= 0, got {value!r}")
        return cls(
            input=str(payload["input"]),
            prompt_units=prompt,
            output_units=output,
            poison=bool(payload.get("poison", False)),
        )


class _Draws(NamedTuple):
    """The uniform draws one call takes, always all of them, always in this order.

    A named tuple (built per call): made from its six floats by ``tuple.__new__`` in C, ~0.5 us less
    than a frozen dataclass; immutable and read by name all the same.
    """

    rate_limit: float
    quota_exhausted: float
    invalid_request: float
    server_error: float
    response_lost: float
    noise: float

    @classmethod
    def for_request(cls, secret: bytes, idempotency_key: str, arrival: int) -> _Draws:
        """The draws of the ``arrival``-th request (from 0) with ``idempotency_key``: a pure function."""
        return cls.from_keyed_hash(_keyed_hash(secret), idempotency_key, arrival)

    @classmethod
    def from_keyed_hash(cls, keyed: Any, idempotency_key: str, arrival: int) -> _Draws:
        """:meth:`for_request` from ``_keyed_hash(secret)``, which a provider builds once.

        Why: a keyed BLAKE2b hashes its key as a first block; ``copy()`` of the fresh keyed state
        starts every request from that state (the same digest) without redoing that block or the
        constructor, about 0.6 us of each simulated call.
        """
        hasher = keyed.copy()
        # surrogatepass: any Python string is a valid key, even one with a lone surrogate
        hasher.update(f"{arrival}\0{idempotency_key}".encode("utf-8", "surrogatepass"))
        # The six words unpacked by name, not by a comprehension (a function call of its own on 3.11).
        w0, w1, w2, w3, w4, w5 = _UNPACK_DRAWS(hasher.digest())
        unit = _TWO_TO_MINUS_53
        return _new_tuple(
            cls,
            (
                (w0 >> 11) * unit,
                (w1 >> 11) * unit,
                (w2 >> 11) * unit,
                (w3 >> 11) * unit,
                (w4 >> 11) * unit,
                (w5 >> 11) * unit,
            ),
        )


def _keyed_hash(secret: bytes) -> Any:
    """A fresh BLAKE2b state keyed with ``secret``, with the digest size of one call's draws."""
    return hashlib.blake2b(key=secret, digest_size=8 * DRAWS_PER_CALL)


_UNPACK_DRAWS = struct.Struct(f"<{DRAWS_PER_CALL}Q").unpack
_UNPACK_STREAM_DRAWS = struct.Struct(f"<{STREAM_DRAWS_PER_CALL}Q").unpack
_new_tuple = tuple.__new__
_TWO_TO_MINUS_53 = 2.0**-53
"""53 random bits times this is a uniform float in [0, 1), as ``random.random`` makes them."""


class _LostResponse:
    """Marker a server-side task returns when the client will never hear the answer."""


_LOST = _LostResponse()


class _StreamDraws(NamedTuple):
    """The stream model's uniform draws of one call (see :data:`STREAM_DRAWS_PER_CALL`)."""

    ttft_noise: float
    cut: float
    cut_point: float


class _StreamPlan(NamedTuple):
    """When an execution's tokens come, as the stream model drew it (times from the call's start)."""

    ttft_s: float
    generation_s: float
    output_units: int
    cut_fraction: float | None
    """Where in the generation the stream is cut (in (0, 1]); ``None``: it is not."""

    @property
    def client_end_s(self) -> float:
        """When the client's stream ends: the complete answer, or the cut."""
        if self.cut_fraction is None:
            return self.ttft_s + self.generation_s
        return self.ttft_s + self.cut_fraction * self.generation_s

    def generated_units(self) -> int:
        """Output units generated by :attr:`client_end_s` (all of them unless cut; at least the first)."""
        out = self.output_units
        if self.cut_fraction is None:
            return out
        return min(out, floor(self.cut_fraction * out) + 1)

    def chunks(self) -> list[tuple[float, int]]:
        """``(offset_s, units)`` of every chunk the client receives, in order: the first token at
        :attr:`ttft_s`, then up to :data:`STREAM_CHUNK_UNITS` units a chunk, each when its last token
        is generated (token ``j`` of ``n`` at ``ttft_s + generation_s * (j - 1) / n``); a chunk not
        complete at the cut is not received."""
        out, ttft, generation = self.output_units, self.ttft_s, self.generation_s
        if out == 0:
            return [(ttft, 0)]
        last = self.generated_units()
        chunks = [(ttft, 1)]
        token = 1
        while token < last:
            upto = min(token + STREAM_CHUNK_UNITS, last)
            if upto - token < STREAM_CHUNK_UNITS and upto < out and self.cut_fraction is not None:
                break  # the chunk in progress at the cut never arrives
            chunks.append((ttft + generation * (upto - 1) / out, upto - token))
            token = upto
        return chunks


def _hand_over(work: Callable[[], Any], answer: Future[Any], done: Callable[[], None] | None = None) -> None:
    """Run the server-side ``work`` and give its outcome to ``answer``, unless it is resolved already;
    ``done`` is called first (the provider counts its work done). Called as the scheduled callback
    itself: a frame between would hold ``answer``, which the error's traceback leads back to."""
    if done is not None:
        done()
    try:
        value = work()
    except Exception as error:
        if not answer.done():
            answer.set_exception(error)
        del answer  # the error's traceback holds this frame: no cycle back to the error through it
    else:
        if not answer.done():
            answer.set_result(value)


class _SlidingWindow:
    """Amounts accepted in the last :data:`WINDOW_S` seconds, against a per-minute limit."""

    __slots__ = ("_entries", "_total", "limit")

    def __init__(self, limit: float) -> None:
        self.limit = float(limit)
        self._entries: deque[tuple[float, float]] = deque()
        self._total = 0.0

    def _expire(self, now: float) -> None:
        horizon = now - WINDOW_S + WINDOW_TOLERANCE_S
        entries = self._entries
        while entries and entries[0][0] <= horizon:
            self._total -= entries.popleft()[1]
        if not entries:
            self._total = 0.0  # no drift from repeated float subtraction

    def wait_for_room(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` more fits (0.0 if it fits now); ``inf`` if it never can."""
        if amount > self.limit:
            return inf
        self._expire(now)
        if self._total + amount <= self.limit:
            return 0.0
        remaining = self._total
        for accepted_at, accepted in self._entries:
            remaining -= accepted
            if remaining + amount <= self.limit:
                return accepted_at + WINDOW_S - now
        raise AssertionError("unreachable: an empty window has room for any amount within the limit")

    def add(self, amount: float, now: float) -> None:
        self._entries.append((now, amount))
        self._total += amount

    def usage(self, now: float) -> tuple[float, float]:
        """(amount used, seconds until the window is empty) at ``now``."""
        self._expire(now)
        reset = self._entries[-1][0] + WINDOW_S - now if self._entries else 0.0
        return self._total, max(0.0, reset)


def _retry_after_header(wait_s: float) -> float:
    """A wait as a provider's Retry-After header states it: whole seconds, rounded up, at least 1."""
    return float(max(1, ceil(wait_s - WINDOW_TOLERANCE_S)))


def _check_probability(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigurationError(f"{name} must be a probability in [0, 1], got {value!r}")


def _validate(config: ProviderConfig) -> None:
    for name in (
        "rate_limit_prob",
        "server_error_prob",
        "timeout_prob",
        "quota_exhausted_prob",
        "invalid_request_prob",
        "stream_cut_prob",
    ):
        _check_probability(f"provider {config.name!r}: {name}", getattr(config, name))
    _validate_stream_model(config)
    if config.latency_dist not in LATENCY_DISTRIBUTIONS:
        raise ConfigurationError(
            f"provider {config.name!r}: latency_dist must be one of {list(LATENCY_DISTRIBUTIONS)}, "
            f"got {config.latency_dist!r}"
        )
    if config.latency_dist == "exponential" and config.latency_sigma != 0:
        raise ConfigurationError(
            f"provider {config.name!r}: latency_sigma must be 0 with latency_dist='exponential', "
            f"got {config.latency_sigma!r}"
        )
    for name in ("latency_base_s", "latency_per_unit_s", "latency_sigma", "price_per_1k_units"):
        if not getattr(config, name) >= 0:
            raise ConfigurationError(
                f"provider {config.name!r}: {name} must be >= 0, got {getattr(config, name)!r}"
            )
    for name in ("server_requests_per_min", "server_units_per_min"):
        limit = getattr(config, name)
        if limit is not None and not limit >= 1:
            raise ConfigurationError(f"provider {config.name!r}: {name} must be >= 1 or None, got {limit!r}")
    for outage in config.outages:
        if not outage.end_s > outage.start_s:
            raise ConfigurationError(
                f"provider {config.name!r}: outage window must end after it starts: {outage}"
            )
        if outage.mode == "slow" and not outage.slow_factor > 0:
            raise ConfigurationError(f"provider {config.name!r}: outage slow_factor must be > 0: {outage}")


def _validate_stream_model(config: ProviderConfig) -> None:
    """The stream model's keys: ``ttft_s`` and ``tokens_per_s`` both or neither, the others only with them."""
    if (config.ttft_s is None) != (config.tokens_per_s is None):
        given, missing = (
            ("ttft_s", "tokens_per_s") if config.ttft_s is not None else ("tokens_per_s", "ttft_s")
        )
        raise ConfigurationError(
            f"provider {config.name!r}: {given} needs {missing} (the stream model takes both: the time to "
            "first token and the generation rate)"
        )
    if config.tokens_per_s is None:
        for name in ("ttft_per_prompt_unit_s", "ttft_sigma", "stream_cut_prob"):
            if getattr(config, name) != 0:
                raise ConfigurationError(
                    f"provider {config.name!r}: {name} is part of the stream model, which needs ttft_s and "
                    f"tokens_per_s; got {name}={getattr(config, name)!r} without them"
                )
        return
    for name in ("ttft_s", "ttft_per_prompt_unit_s", "ttft_sigma"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < inf:
            raise ConfigurationError(
                f"provider {config.name!r}: {name} must be a finite number >= 0, got {value!r}"
            )
    rate = config.tokens_per_s
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate < inf:
        raise ConfigurationError(
            f"provider {config.name!r}: tokens_per_s must be a finite number > 0 (output units per second), "
            f"got {rate!r}"
        )


class SimulatedProvider:
    """A simulated AI API server that the real scheduler calls (see the module docstring).

    Implements the scheduler's ``Provider`` protocol (``name``, ``call``), ``SupportsLookup``
    (``lookup``) and ``estimate_cost``. Keep one instance per provider for the whole
    simulation, across scheduler crashes: it *is* the server, with its quota windows and
    its in-flight work.
    """

    def __init__(
        self,
        runtime: Runtime,
        config: ProviderConfig,
        rng: random.Random,
        ledger: ProviderLedger | None = None,
        *,
        forget_keys_after_s: float | None = None,
        key_in_use: Callable[[str, float], bool] | None = None,
    ) -> None:
        _validate(config)
        self.runtime = runtime
        self.config = config
        self.rng = rng
        self._draw_secret = rng.getrandbits(256).to_bytes(32, "little")
        self._draw_hash = _keyed_hash(self._draw_secret)
        self._stream_hash = hashlib.blake2b(
            key=self._draw_secret, digest_size=8 * STREAM_DRAWS_PER_CALL, person=_STREAM_PERSON
        )
        self._planned: _StreamPlan | None = None
        """The stream timeline :meth:`_accept` drew for the execution it just started (read at once by
        :meth:`stream`; ``None`` for an answer that is not an execution)."""
        self._arrivals: dict[str, int] = {}
        """Idempotency key -> requests with it so far: with the key, what a request's draws depend on."""
        self._recent_keys: RecentKeys[str] | None = (
            None if forget_keys_after_s is None else RecentKeys(forget_keys_after_s)
        )
        """With ``forget_keys_after_s``: keys silent that long leave ``_arrivals`` (bounded memory in
        streaming runs; a key seen again later draws as a new one), but for the keys a live task
        still holds (``key_in_use``): a retry of such a task draws as its next request, not as its
        first again (a window shorter than a lost response's attempt timeout had every retry lost)."""
        self._key_in_use = key_in_use
        self.ledger = ledger if ledger is not None else ProviderLedger()
        self.name = config.name
        rpm, upm = config.server_requests_per_min, config.server_units_per_min
        self._request_window = _SlidingWindow(rpm) if rpm is not None else None
        self._unit_window = _SlidingWindow(upm) if upm is not None else None
        self._in_flight: dict[str, list[Future[Any]]] = {}
        """Keys with a (non-poison) execution running -> futures of those waiting for its result."""
        self.server_work = 0
        """Server-side work accepted and not yet done (the client may have given up on it)."""
        self._server_idle: list[Future[Any]] = []

    def _draws(self, request: ProviderRequest) -> _Draws:
        key = request.idempotency_key
        arrival = self._arrivals.get(key, 0)
        self._arrivals[key] = arrival + 1
        recent = self._recent_keys
        if recent is not None:
            now = self.runtime.now()
            recent.touch(key, now)
            in_use = self._key_in_use
            for gone, last in recent.expired_since(now):
                if in_use is not None and in_use(gone, last + recent.window_s):
                    recent.touch(gone, now)
                else:
                    del self._arrivals[gone]
            self.ledger.forget_silent_keys(now)  # before this call may replay a forgotten key
        return _Draws.from_keyed_hash(self._draw_hash, key, arrival)

    # ------------------------------------------------------------------ public API
    def estimate_cost(self, kind: str, payload: Any) -> float:
        """The request's units (prompt + output): what the client quota should reserve."""
        return float(SimJob.from_payload(payload).units)

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        """Serve one attempt; raises :mod:`aiqsim.core.failures` errors as a real API would.

        Like the HTTP server's ``x-ratelimit-*`` headers, every answer (a response or a
        :class:`~aiqsim.core.failures.ProviderError`, except a lost response, which is no answer)
        carries a :class:`~aiqsim.core.ratelimit.RateLimitSnapshot` of the server windows when the
        provider has any, so a simulated call log holds what a live one holds.
        """
        # One coroutine frame per call: the request is admitted by a plain method (_accept, which
        # raises the immediate answers) and the server task's answer is awaited right here. A client's
        # every resume passes through each coroutine frame of its call, so the former call -> _call ->
        # _serve chain cost two frames more per call and per resume, with the same events in the
        # same order (tests/test_sim_providers.py drives every outcome through here).
        try:
            value = await self._accept(request)
            if value is _LOST:
                await self.runtime.sleep(LOST_RESPONSE_HANG_S)
                raise ProviderTimeoutError(f"no response from {self.name!r}: the connection dropped")
        except ProviderError as error:
            if not isinstance(error, ProviderTimeoutError):
                error.ratelimit = self.ratelimit_snapshot(self.runtime.now())
            raise
        snapshot = self.ratelimit_snapshot(self.runtime.now())
        if snapshot is None:
            return value  # type: ignore[no-any-return]
        return _copy_response(value, {"ratelimit": snapshot})

    async def stream(self, request: ProviderRequest) -> AsyncIterator[StreamChunk | ProviderResponse]:
        """Serve one attempt as a stream (the scheduler's ``SupportsStreaming``): the answer's chunks as
        the stream model generates them, then, last, its :class:`ProviderResponse` (``first_token_s``
        set). A failure before the first chunk is raised as :meth:`call` raises it (nothing is billed
        for a refusal); a cut after it is a :class:`~aiqsim.core.failures.StreamCutError` (billed).

        An answer that is not an execution (an idempotent replay) comes as one chunk holding it all,
        as does any answer of a provider without the stream model. Closing the iterator early does not
        stop the server, which finishes, records and bills the work at its time, as :meth:`call`'s does.
        """
        runtime = self.runtime
        self._planned = None
        start = runtime.now()
        try:
            answer = self._accept(request)
        except ProviderError as error:
            if not isinstance(error, ProviderTimeoutError):
                error.ratelimit = self.ratelimit_snapshot(runtime.now())
            raise
        plan, self._planned = self._planned, None
        streamed = False
        if plan is not None:
            for index, (offset, units) in enumerate(plan.chunks()):
                wait = start + offset - runtime.now()
                if wait > 0:
                    await runtime.sleep(wait)
                streamed = True
                yield StreamChunk(data={"provider": self.name, "chunk": index}, units=float(units))
        try:
            value = await answer
            if value is _LOST:
                await runtime.sleep(LOST_RESPONSE_HANG_S)
                raise ProviderTimeoutError(f"no response from {self.name!r}: the connection dropped")
        except ProviderError as error:
            if not isinstance(error, ProviderTimeoutError):
                error.ratelimit = self.ratelimit_snapshot(runtime.now())
            raise
        finally:
            # The failure's traceback holds this frame; ``answer`` holds the failure: without this,
            # a cycle per failed stream (a cut) that only the collector frees.
            answer = None
        now = runtime.now()
        if not streamed:
            yield StreamChunk(data=value.result, units=value.output_units)
        changes: dict[str, Any] = {}
        if value.first_token_s is None:  # no stream model: the whole answer was its first chunk
            changes["first_token_s"] = now - start
        snapshot = self.ratelimit_snapshot(now)
        if snapshot is not None:
            changes["ratelimit"] = snapshot
        yield _copy_response(value, changes) if changes else value

    def ratelimit_snapshot(self, now: float) -> RateLimitSnapshot | None:
        """The server windows at ``now`` as a provider's ``x-ratelimit-*`` headers state them
        (remaining rounded down to whole units, as :mod:`aiqsim.http.server` sends them);
        ``None`` for a provider without server limits."""
        requests, units = self._request_window, self._unit_window
        if requests is None and units is None:  # once per call: answered without building anything
            return None
        limit_requests = remaining_requests = reset_requests = None
        limit_tokens = remaining_tokens = reset_tokens = None
        if requests is not None:
            used, reset_requests = requests.usage(now)
            limit_requests = requests.limit
            remaining_requests = float(floor(max(0.0, limit_requests - used)))
        if units is not None:
            used, reset_tokens = units.usage(now)
            limit_tokens = units.limit
            remaining_tokens = float(floor(max(0.0, limit_tokens - used)))
        # Positional, in field order: tests/test_sim_providers_fast_paths.py compares it with the
        # snapshot built by keyword from window_usage, so a field reorder fails there.
        return _new_snapshot(
            limit_requests, remaining_requests, reset_requests, limit_tokens, remaining_tokens, reset_tokens
        )

    def _accept(self, request: ProviderRequest) -> Future[Any]:
        """Take ``request`` in: raise the answers given at once (a malformed request, a quota 429, a
        random 429 / quota exhausted / invalid request), else start its server-side work and return the
        future of that work's answer (a :class:`ProviderResponse`, or ``_LOST``; it may fail instead)."""
        runtime, config = self.runtime, self.config
        start = runtime.now()
        draws = self._draws(request)
        try:
            job = SimJob.from_payload(request.payload)
        except InvalidRequestError:
            self._record(request, start, start, "invalid_request", 0)
            raise

        outage = self._outage_at(start)
        if outage is not None and outage.mode == "error":
            return self._fail_after(request, job, start, config.latency_base_s, "outage")
        slow = outage.slow_factor if outage is not None else 1.0

        units = job.units
        wait = self._quota_wait(units, start)
        if wait is not None:
            self._record(request, start, start, "rate_limited", units)
            if isinf(wait):
                raise InvalidRequestError(
                    f"request of {units} units exceeds {self.name!r}'s limit of "
                    f"{config.server_units_per_min:g} units per minute"
                )
            if config.reports_quota:
                raise RateLimitError(
                    "server quota exceeded", retry_after_s=_retry_after_header(wait), quota_spent=True
                )
            # a server that does not say its quota is spent, in headers or in words (over HTTP
            # the message is the 429's body, which "quota exceeded" would say it in)
            raise RateLimitError("rate limited", retry_after_s=_retry_after_header(wait))
        if draws.rate_limit < config.rate_limit_prob:
            self._record(request, start, start, "rate_limited", units)
            raise RateLimitError(
                "rate limited",
                retry_after_s=config.rate_limit_retry_after_s,
                quota_spent=self._quota_spent(start),
            )
        self._admit(units, start)

        if draws.quota_exhausted < config.quota_exhausted_prob:
            self._record(request, start, start, "quota_exhausted", units)
            raise QuotaExhaustedError("account quota exhausted")
        if draws.invalid_request < config.invalid_request_prob:
            self._record(request, start, start, "invalid_request", units)
            raise InvalidRequestError("invalid request")

        if config.tokens_per_s is None:
            plan = None
            latency = self._latency(job, draws.noise) * slow
            until_failure = latency * SERVER_ERROR_LATENCY_FRACTION
        else:
            plan = self._stream_plan(request, job, draws.noise, slow)
            latency = plan.ttft_s + plan.generation_s
            until_failure = plan.ttft_s * SERVER_ERROR_LATENCY_FRACTION  # before the first token
        if draws.server_error < config.server_error_prob:
            return self._fail_after(request, job, start, until_failure, "server_error")
        if job.poison:
            return self._poisoned(request, job, start, latency)
        key = request.idempotency_key
        if config.honours_idempotency:
            if self.ledger.first_success(self.name, key) is not None:
                return self._replay(request, job, start, config.latency_base_s * slow)
            if key in self._in_flight:
                return self._join(request, job, start)
        lost = draws.response_lost < config.timeout_prob
        # Registered before the server task starts, so a repeat arriving at the same instant sees it.
        owns_in_flight = key not in self._in_flight
        if owns_in_flight:
            self._in_flight[key] = []
        if plan is None:
            return self._execute(request, job, start, latency, lost, owns_in_flight)
        if lost:  # a lost response streams nothing: its client hears nothing
            return self._execute(request, job, start, latency, lost, owns_in_flight, plan.ttft_s)
        self._planned = plan
        if plan.cut_fraction is None:
            return self._execute(request, job, start, latency, lost, owns_in_flight, plan.ttft_s)
        self._execute(request, job, start, latency, lost, owns_in_flight, plan.ttft_s, "stream_cut")
        return self._cut(plan)

    def _stream_plan(
        self, request: ProviderRequest, job: SimJob, noise_draw: float, slow: float
    ) -> _StreamPlan:
        """The stream model's timeline of this call (its draws come from the stream hash)."""
        config = self.config
        key = request.idempotency_key
        hasher = self._stream_hash.copy()
        arrival = self._arrivals[key] - 1  # the arrival _draws just counted
        hasher.update(f"{arrival}\0{key}".encode("utf-8", "surrogatepass"))
        w0, w1, w2 = _UNPACK_STREAM_DRAWS(hasher.digest())
        draws = _StreamDraws(
            (w0 >> 11) * _TWO_TO_MINUS_53, (w1 >> 11) * _TWO_TO_MINUS_53, (w2 >> 11) * _TWO_TO_MINUS_53
        )
        assert config.ttft_s is not None and config.tokens_per_s is not None  # _validate: both or neither
        ttft = (config.ttft_s + config.ttft_per_prompt_unit_s * job.prompt_units) * lognormal_noise(
            config.ttft_sigma, draws.ttft_noise
        )
        if config.latency_dist == "exponential":
            noise = exponential_noise(noise_draw)
        else:
            noise = lognormal_noise(config.latency_sigma, noise_draw)
        generation = job.output_units / config.tokens_per_s * noise
        cut = None
        if job.output_units > 0 and draws.cut < config.stream_cut_prob:
            cut = 1.0 - draws.cut_point  # in (0, 1]: the cut comes after the first token
        return _StreamPlan(ttft * slow, generation * slow, job.output_units, cut)

    def window_usage(self, now: float) -> dict[str, tuple[float, float, float]]:
        """``{"requests"|"units": (limit, used, seconds until empty)}`` for the configured server windows
        (what a real provider reports in its ``x-ratelimit-*`` headers)."""
        windows = (("requests", self._request_window), ("units", self._unit_window))
        return {name: (w.limit, *w.usage(now)) for name, w in windows if w is not None}

    async def lookup(self, idempotency_key: str) -> ProviderResponse | None:
        """The stored result for a key this provider executed, or ``None``.

        If an execution of the key is still running, waits for it to finish (a crashed
        client's last call usually is). Always ``None`` when ``config.supports_lookup`` is
        false. Takes no virtual time of its own and is not recorded as a call.
        """
        if not self.config.supports_lookup:
            return None
        if idempotency_key in self._in_flight:
            await self._in_flight_done(idempotency_key)
        found = self.ledger.first_success(self.name, idempotency_key)
        if found is None:
            return None
        execution, result = found
        return new_response(result=result, usage=float(execution.units))

    # ------------------------------------------------------------------ server-side work
    def _serve(self, delay: float, work: Callable[[], Any]) -> Future[Any]:
        """Do ``work`` server-side ``delay`` virtual seconds from now; the future of its answer (what
        it returns, or the exception it raises).

        The client may give up (timeout, cancellation, crash); the server's work is not the
        client's, so it still runs at its time, records and bills. A lost response (``_LOST``)
        makes the client hang instead. A scheduled callback rather than a task of its own: the
        work never waits on anything but its delay, and a callback costs one event where a task
        cost a start event, a resume and two coroutine frames.
        """
        runtime = self.runtime
        answer: Future[Any] = runtime.create_future()
        self.server_work += 1
        runtime.call_later(
            delay, partial(_hand_over, work, answer, self._work_done), name=f"{self.name}-server"
        )
        return answer

    def _work_done(self) -> None:
        """A piece of server-side work's time has come (it runs next): count it done."""
        self.server_work -= 1
        if not self.server_work and self._server_idle:
            waiters, self._server_idle = self._server_idle, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def finish_server_work(self) -> None:
        """Wait until the work this provider accepted is done, answered or not: a call the client gave
        up on (a timeout, a crash) still runs, is recorded and billed at its time. A simulation waits
        for it once its tasks have ended, so that such calls count in its ledger."""
        while self.server_work:
            waiter: Future[Any] = self.runtime.create_future()
            self._server_idle.append(waiter)
            await waiter

    def _fail_after(
        self, request: ProviderRequest, job: SimJob, start: float, delay: float, outcome: Outcome
    ) -> Future[Any]:
        def fail() -> ProviderResponse:
            self._record(request, start, self.runtime.now(), outcome, job.units, service_s=delay)
            if outcome == "outage":
                raise ServerError(f"{self.name!r} is unavailable (outage)", status=503)
            raise ServerError(f"{self.name!r} failed while processing", status=500)

        return self._serve(delay, fail)

    def _poisoned(self, request: ProviderRequest, job: SimJob, start: float, latency: float) -> Future[Any]:
        def poisoned() -> ProviderResponse:
            self._record(
                request,
                start,
                self.runtime.now(),
                "schema_violation",
                job.units,
                billed=True,
                service_s=latency,
            )
            raise SchemaViolationError(f"response for input {job.input!r} does not match the schema")

        return self._serve(latency, poisoned)

    def _replay(self, request: ProviderRequest, job: SimJob, start: float, delay: float) -> Future[Any]:
        return self._serve(delay, partial(self._replayed, request, job, start))

    def _join(self, request: ProviderRequest, job: SimJob, start: float) -> Future[Any]:
        """The answer of a repeat that arrives while an execution of its key runs: a replay of
        that execution's result, once it has finished."""
        answer: Future[Any] = self.runtime.create_future()
        replay = partial(self._replayed, request, job, start)
        self._in_flight_done(request.idempotency_key).add_done_callback(lambda _: _hand_over(replay, answer))
        return answer

    def _replayed(self, request: ProviderRequest, job: SimJob, start: float) -> ProviderResponse:
        found = self.ledger.first_success(self.name, request.idempotency_key)
        assert found is not None, "a replay follows a completed execution of the same key"
        execution, result = found
        now = self.runtime.now()
        self._record(request, start, now, "replay", job.units)
        if self.config.tokens_per_s is not None:  # the stored answer comes whole: its first token with it
            return new_response(
                result=result,
                usage=float(execution.units),
                output_units=float(job.output_units),
                first_token_s=now - start,
            )
        return new_response(result=result, usage=float(execution.units), output_units=float(job.output_units))

    def _execute(
        self,
        request: ProviderRequest,
        job: SimJob,
        start: float,
        latency: float,
        lost: bool,
        owns_in_flight: bool,
        first_token_s: float | None = None,
        outcome: Outcome = "ok",
    ) -> Future[Any]:
        """Do the work and bill it. The first execution of a key running at a time
        (``owns_in_flight``) wakes, when done, the repeats and lookups that waited for it.
        ``first_token_s``: the stream model's time to first token, which the answer states;
        ``outcome``: ``stream_cut`` for the execution of a stream whose connection :meth:`_cut` drops."""

        def execute() -> ProviderResponse | _LostResponse:
            waiters = self._in_flight.pop(request.idempotency_key, []) if owns_in_flight else []
            result = {"input": job.input, "output_units": job.output_units, "provider": self.name}
            end = self.runtime.now()
            self._record(
                request,
                start,
                end,
                outcome,
                job.units,
                billed=True,
                lost=lost,
                result=result,
                service_s=latency,
            )
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
            if lost:
                return _LOST
            if first_token_s is not None:
                return new_response(
                    result=result,
                    usage=float(job.units),
                    output_units=float(job.output_units),
                    first_token_s=first_token_s,
                )
            return new_response(result=result, usage=float(job.units), output_units=float(job.output_units))

        return self._serve(latency, execute)

    def _cut(self, plan: _StreamPlan) -> Future[Any]:
        """The client's side of a stream whose connection drops during its generation: it has had the
        chunks before the cut, then gets a :class:`StreamCutError`. The server's side is the execution
        :meth:`_accept` started beside it, which finishes, bills and keeps its answer at its time, as
        for a lost response (recorded ``stream_cut``): a lookup or an honoured key finds it."""
        runtime = self.runtime
        answer: Future[Any] = runtime.create_future()
        received = float(sum(units for _, units in plan.chunks()))
        output = plan.output_units

        def cut() -> ProviderResponse:
            raise StreamCutError(
                f"the connection to {self.name!r} dropped after {received:g} of {output} output units "
                "had arrived (the server finishes and bills the answer)",
                received_units=received,
            )

        runtime.call_later(plan.client_end_s, partial(_hand_over, cut, answer), name=f"{self.name}-cut")
        return answer

    def _in_flight_done(self, key: str) -> Future[Any]:
        """A future resolved when the execution of ``key`` now running ends."""
        waiter: Future[Any] = self.runtime.create_future()
        self._in_flight[key].append(waiter)
        return waiter

    # ------------------------------------------------------------------ rules
    def _outage_at(self, now: float) -> OutageConfig | None:
        """The outage in force at ``now``: an ``error`` window wins, else the slowest ``slow`` one."""
        outages = self.config.outages
        if not outages:
            return None
        active = [o for o in outages if o.start_s <= now < o.end_s]
        if not active:
            return None
        errors = [o for o in active if o.mode == "error"]
        if errors:
            return errors[0]
        return max(active, key=lambda o: o.slow_factor)

    def _quota_spent(self, now: float) -> bool | None:
        """What a 429's ``x-ratelimit-remaining-*`` headers would say (``RateLimitError.quota_spent``):
        ``True`` if a server window has less than one whole request or unit left, ``False`` if every
        window has room, ``None`` when the server has no quota windows (it sends no such headers)."""
        usage = self.window_usage(now)
        if not usage or not self.config.reports_quota:
            return None
        return any(limit - used < 1.0 for limit, used, _ in usage.values())

    def _quota_wait(self, units: int, now: float) -> float | None:
        """``None`` if the server quota admits the request now, else seconds until it would (may be inf)."""
        wait = 0.0
        if self._request_window is not None:
            wait = max(wait, self._request_window.wait_for_room(1.0, now))
        if self._unit_window is not None:
            wait = max(wait, self._unit_window.wait_for_room(float(units), now))
        return wait if wait > 0 else None

    def _admit(self, units: int, now: float) -> None:
        if self._request_window is not None:
            self._request_window.add(1.0, now)
        if self._unit_window is not None:
            self._unit_window.add(float(units), now)

    def _latency(self, job: SimJob, noise_draw: float) -> float:
        config = self.config
        base = config.latency_base_s + config.latency_per_unit_s * job.output_units
        if config.latency_dist == "exponential":
            return base * exponential_noise(noise_draw)
        return base * lognormal_noise(config.latency_sigma, noise_draw)

    def _record(
        self,
        request: ProviderRequest,
        start: float,
        end: float,
        outcome: Outcome,
        units: int,
        *,
        billed: bool = False,
        lost: bool = False,
        result: Any = None,
        service_s: float | None = None,
    ) -> None:
        cost = self.config.price_per_1k_units * units / 1000.0 if billed else 0.0
        # Positional, in field order (one per call; keywords cost ~1 us more here); the field-by-field
        # check is tests/test_sim_providers_fast_paths.py::test_a_recorded_execution_names_its_fields.
        execution = Execution(
            self.name,
            request.task_id,
            request.idempotency_key,
            request.attempt,
            start,
            end,
            outcome,
            billed,
            cost,
            units,
            lost,
            service_s,
        )
        self.ledger.record(execution, result)
