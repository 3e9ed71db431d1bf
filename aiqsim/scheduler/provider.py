"""What the scheduler asks of a provider adapter (simulated, HTTP or SDK-wrapped)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from aiqsim.core.ratelimit import RateLimitSnapshot
from aiqsim.core.slot_init import compile_builder, fast_frozen_init
from aiqsim.core.task import Priority


@fast_frozen_init  # one per attempt: see aiqsim.core.slot_init
@dataclass(frozen=True, slots=True)
class ProviderRequest:
    """One attempt at one task, as handed to :meth:`Provider.call`.

    ``idempotency_key`` is the task's key; adapters should send it to providers that
    honour one (e.g. as an ``Idempotency-Key`` header) so a retried call is not billed twice.
    ``tenant`` is the task's tenant (per-tenant accounting, spend budgets), ``None`` without tenants.
    """

    task_id: str
    idempotency_key: str
    kind: str
    payload: Any
    cost_estimate: float
    attempt: int
    priority: Priority
    tenant: str | None = None
    """The tenant the call is made for (``submit(tenant=...)``), ``None`` without tenants."""


@fast_frozen_init  # one per successful attempt
@dataclass(frozen=True, slots=True)
class ProviderResponse:
    """A successful call. ``usage`` is the actual cost in the quota's unit (tokens, characters);
    ``None`` means the estimate was right. ``output_units`` is the part of it the provider generated
    (completion tokens), when it says so, and ``ratelimit`` what it said about its own limits on this
    answer: both only observed (the call log records them for calibration), never acted on here.
    ``first_token_s`` is, for a streamed answer, the seconds from the start of the attempt to its
    first content chunk (time to first token); ``None`` for an answer that was not streamed."""

    result: Any
    usage: float | None = None
    output_units: float | None = None
    ratelimit: RateLimitSnapshot | None = None
    first_token_s: float | None = None


new_request: Callable[..., ProviderRequest] = compile_builder(ProviderRequest)
"""``ProviderRequest(...)`` without the cost of a class call (one per attempt; see
:func:`aiqsim.core.slot_init.compile_builder`)."""

new_response: Callable[..., ProviderResponse] = compile_builder(ProviderResponse)
"""``ProviderResponse(...)`` without the cost of a class call, for simulated providers (one per call)."""


@runtime_checkable
class Provider(Protocol):
    """An async callable service with a name. Failures are raised as :mod:`aiqsim.core.failures` errors."""

    name: str

    async def call(self, request: ProviderRequest) -> ProviderResponse: ...


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """One piece of a streamed answer, as it arrives: ``data`` is the piece (a text delta, or the
    provider's decoded event), ``units`` the tokens it carries when the provider says so."""

    data: Any
    units: float | None = None


@runtime_checkable
class SupportsStreaming(Protocol):
    """A provider that can answer as a stream (server-sent events, a simulated token stream).

    ``stream(request)`` yields :class:`StreamChunk` items as they arrive and then, as its last
    item, the :class:`ProviderResponse` (usage, ``output_units``, ``first_token_s``). A failure
    before the first chunk is raised as for :meth:`Provider.call` (nothing was billed for a refusal);
    a failure after it is raised as :class:`~aiqsim.core.failures.StreamCutError` (the server began,
    and billed, the work).
    """

    def stream(self, request: ProviderRequest) -> AsyncIterator[StreamChunk | ProviderResponse]: ...


@runtime_checkable
class SupportsLookup(Protocol):
    """A provider that can say whether it already did the work for an idempotency key.

    Used by crash recovery: a task found ``running`` after a restart is completed from the
    provider's record instead of being called (and billed) again.
    """

    async def lookup(self, idempotency_key: str) -> ProviderResponse | None: ...


def honours_idempotency_keys(provider: object) -> bool:
    """Whether ``provider`` says a re-sent request with the same idempotency key is not billed again:
    its ``honours_idempotency_keys`` attribute (``True``/``False``), else its simulated config's
    ``honours_idempotency``; ``False`` when it says nothing (re-sending could be a second bill).
    The scheduler asks it before re-sending a streamed answer cut after its first chunk."""
    said = getattr(provider, "honours_idempotency_keys", None)
    if isinstance(said, bool):
        return said
    config = getattr(provider, "config", None)
    return getattr(config, "honours_idempotency", False) is True
