"""Adapt any async callable (an SDK call, a function of yours) into a scheduler provider."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import ProviderContractError, ProviderError, describe_error
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse

ErrorMapper = Callable[[Exception], BaseException | None]
"""Turns a foreign exception into an aiqsim failure; ``None`` means "not mine, keep the original"."""


class CallableProviderArgumentError(ConfigurationError, TypeError):
    """A :class:`CallableProvider` argument that cannot work: a name that is no text, a function that
    is not callable. Still a ``TypeError``, as it was."""


def _as_response(value: Any) -> ProviderResponse:
    return value if isinstance(value, ProviderResponse) else ProviderResponse(result=value)


class CallableProvider:
    """A :class:`~aiqsim.scheduler.provider.Provider` around ``fn(request) -> result``.

    Parameters:
        name: the provider (scheduler lane) name.
        fn: ``async def fn(request: ProviderRequest) -> Any``. Its return value becomes
            ``ProviderResponse.result``; return a :class:`ProviderResponse` yourself to
            report the actual usage. A plain (non-async) function is accepted too, but it
            blocks the event loop while it runs.
        lookup: optional ``async def lookup(idempotency_key) -> Any | None`` used by crash
            recovery to ask whether the work was already done (``None``: it was not).
        estimate_cost: optional ``estimate_cost(kind, payload) -> float`` used when a task
            is submitted without ``cost_estimate`` (0 otherwise).
        error_mapper: optional ``mapper(exc) -> BaseException | None`` that turns the
            exceptions ``fn`` raises into :mod:`aiqsim.core.failures` errors (see
            :func:`aiqsim.http.openai_errors.map_openai_error`). Errors that already are
            aiqsim failures pass through untouched. An unmapped exception propagates as it
            is, and the scheduler treats it as fatal (retrying a bug multiplies it).
    """

    def __init__(
        self,
        name: str,
        fn: Callable[[ProviderRequest], Awaitable[Any] | Any],
        *,
        lookup: Callable[[str], Awaitable[Any] | Any] | None = None,
        estimate_cost: Callable[[str, Any], float] | None = None,
        error_mapper: ErrorMapper | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise CallableProviderArgumentError(f"name: expected the provider's name (text), got {name!r}")
        if not callable(fn):
            raise CallableProviderArgumentError(f"fn: expected a callable fn(request), got {fn!r}")
        for what, given in (
            ("lookup", lookup),
            ("estimate_cost", estimate_cost),
            ("error_mapper", error_mapper),
        ):
            if given is not None and not callable(given):
                raise CallableProviderArgumentError(f"{what}: expected a callable or None, got {given!r}")
        self.name = name
        self._fn = fn
        self._lookup = lookup
        self._estimate_cost = estimate_cost
        self._error_mapper = error_mapper

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        """Run ``fn`` once; map its failure, wrap its result."""
        try:
            value = self._fn(request)
            if inspect.isawaitable(value):
                value = await value
        except ProviderError:
            raise
        except Exception as exc:
            mapped = self._map(exc)
            if mapped is None:
                raise
            raise mapped from exc
        return _as_response(value)

    async def lookup(self, idempotency_key: str) -> ProviderResponse | None:
        """The provider's record for ``idempotency_key`` (``None`` without a lookup function)."""
        if self._lookup is None:
            return None
        value = self._lookup(idempotency_key)
        if inspect.isawaitable(value):
            value = await value
        return None if value is None else _as_response(value)

    def estimate_cost(self, kind: str, payload: Any) -> float:
        """The cost estimate for a submission without one (0 without an estimator)."""
        if self._estimate_cost is None:
            return 0.0
        return float(self._estimate_cost(kind, payload))

    def _map(self, exc: Exception) -> BaseException | None:
        if self._error_mapper is None:
            return None
        mapped = self._error_mapper(exc)
        if mapped is None or mapped is exc:
            return None
        if not isinstance(mapped, BaseException):
            raise ProviderContractError(
                f"provider {self.name!r}: error_mapper returned {mapped!r} for {describe_error(exc)}, not an "
                "exception or None (a bug in the mapper; the original error is the cause)"
            ) from exc
        return mapped

    def __repr__(self) -> str:
        return f"CallableProvider({self.name!r}, {getattr(self._fn, '__qualname__', self._fn)!r})"
