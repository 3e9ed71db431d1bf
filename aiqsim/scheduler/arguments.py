"""Checks of the arguments a user hands to :class:`~aiqsim.scheduler.Scheduler` and its ``submit``.

Each check runs at the call, before anything is queued, stored or sent to a provider, and
raises a :class:`~aiqsim.core.errors.ConfigurationError` (a ``ValueError``) that names the
argument and says what is accepted. Without them a bad value surfaced late and far from its
cause: a negative ``cost_estimate`` was accepted, the provider was called and billed, and only
then did the quota's reconciliation fail with an internal message.

Pure functions: no clock, no I/O.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
from math import inf, isfinite  # names, not math.x: one lookup fewer per call in the hot path
from typing import Any

from aiqsim.core.errors import ConfigurationError

__all__ = [
    "SchedulerArgumentError",
    "SchedulerArgumentTypeError",
    "UnknownNameError",
    "checked_capable",
    "checked_cost_estimate",
    "checked_positive_seconds",
    "checked_providers",
    "checked_queue_limit",
]


class SchedulerArgumentError(ConfigurationError):
    """An argument of ``Scheduler(...)``, one of its methods (``submit``, ``recover``, ``retry_failed``,
    ``quota``, ``jobs``...) or a :class:`~aiqsim.scheduler.retry.RetryPolicy` that cannot be used."""


class SchedulerArgumentTypeError(SchedulerArgumentError, TypeError):
    """A scheduler argument of the wrong type; also a ``TypeError``, as it was before."""


class UnknownNameError(SchedulerArgumentError, KeyError):
    """A provider, task id, job id or stage name that the scheduler (or its store) does not know;
    also a ``KeyError``, as it was before. ``str()`` is the message, without ``KeyError``'s quotes."""

    def __str__(self) -> str:
        return Exception.__str__(self)


def checked_capable(value: Any, name: str, methods: tuple[str, ...], expected: str, refused: str) -> Any:
    """``value`` if it has every one of ``methods`` (callable): the duck-typed interfaces the
    scheduler is given (a runtime, a store, a dispatch policy); else a
    :class:`SchedulerArgumentTypeError` that names the argument and what it lacks (a string where a
    policy object goes, ``None`` for a runtime...) instead of an ``AttributeError`` at first use."""
    missing = [method for method in methods if not callable(getattr(value, method, None))]
    if missing:
        raise SchedulerArgumentTypeError(
            f"{name}: expected {expected}, got {value!r} (it has no {', '.join(missing)}); {refused}"
        )
    return value


def checked_cost_estimate(value: Any) -> float:
    """``cost_estimate`` as a float: a finite real number >= 0 (tokens, characters...)."""
    kind = type(value)
    if (kind is float or kind is int) and 0 <= value < inf:  # the usual case, without the ABC check
        try:  # not contextlib.suppress: this runs once per submission, and a try costs nothing
            return float(value)
        except OverflowError:  # an int beyond any float (10**400): refused below
            pass
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SchedulerArgumentError(
            f"cost_estimate: expected a finite number >= 0 (the call's expected token count), got {value!r}"
        )
    try:
        number = float(value)
    except OverflowError:
        number = inf
    if not (isfinite(number) and number >= 0):
        raise SchedulerArgumentError(
            f"cost_estimate: expected a finite number >= 0 (the call's expected token count), got {value!r}"
        )
    return number


def checked_providers(providers: Any) -> dict[str, Any]:
    """The providers by name: at least one, each with a non-empty string ``name`` and a ``call``
    method, no name twice.

    ``providers`` is an iterable of provider objects (named by their ``name``) or a mapping
    name -> provider (the mapping's keys are the lane names).
    """
    if isinstance(providers, Mapping):
        by_name = dict(providers)
        bad = [name for name in by_name if not isinstance(name, str) or not name]
        if bad:
            raise SchedulerArgumentError(f"providers: mapping keys must be non-empty names, got {bad!r}")
    else:
        if isinstance(providers, str | bytes) or not isinstance(providers, Iterable):
            raise SchedulerArgumentError(
                f"providers: expected a list of providers or a mapping name -> provider, got {providers!r}"
            )
        by_name = {}
        for provider in providers:
            name = getattr(provider, "name", None)
            if not isinstance(name, str) or not name:
                raise SchedulerArgumentError(
                    f"providers: every provider needs a non-empty string .name, got {provider!r}"
                )
            if name in by_name:
                raise SchedulerArgumentError(
                    f"providers: two providers are named {name!r}; each lane needs its own name"
                )
            by_name[name] = provider
    if not by_name:
        raise SchedulerArgumentError(
            "providers: expected at least one provider; a scheduler without providers cannot run any task"
        )
    for name, provider in by_name.items():
        if not callable(getattr(provider, "call", None)):
            raise SchedulerArgumentError(
                f"providers: {name!r} ({type(provider).__name__}) has no call() method; a provider "
                "needs 'async def call(self, request) -> ProviderResponse' (aiqsim.scheduler.provider)"
            )
    return by_name


def checked_queue_limit(value: Any, name: str) -> int | None:
    """A queue depth limit: ``None`` (unbounded) or a whole number >= 0 of waiting requests.

    0 means "start at once or be refused" (:mod:`aiqsim.scheduler.depth_limit`). A scenario file
    accepts the same values.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise SchedulerArgumentError(
            f"{name}: expected None (no limit) or a whole number >= 0 of waiting requests, got {value!r}"
        )
    return int(value)


def checked_positive_seconds(value: Any, name: str, what: str) -> float:
    """A duration in seconds > 0 (``inf`` allowed); ``what`` says what it is for."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SchedulerArgumentTypeError(f"{name}: expected a number of seconds > 0 ({what}), got {value!r}")
    if not value > 0:
        raise SchedulerArgumentError(f"{name}: expected a number of seconds > 0 ({what}), got {value!r}")
    return value


def checked_worker_id(value: str | None, what: str, refused: str) -> str | None:
    """A worker id is a non-empty string; ``None`` means "no worker id" (tasks of a single user).

    ``refused`` says what did not happen when it is not (``"no scheduler was created"``).
    """
    if value is not None and (not isinstance(value, str) or not value):
        raise SchedulerArgumentError(f"{what} must be a non-empty string or None, got {value!r}; {refused}")
    return value
