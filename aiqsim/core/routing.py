"""Routes: one model served by several deployments, and the pure rules that pick one for a call.

A :class:`Route` names the deployments (scheduler providers, one lane each) that can serve the same
calls, and the policy that picks one of them. The scheduler builds one frozen
:class:`DeploymentState` per deployment from its lanes' public state (in flight, queued, quota
left, recent service times) and asks :func:`choose_deployment`; nothing here reads a clock, a lane
or the global ``random``: the only randomness is the generator passed in (the scheduler's own).

The policies:

- ``weighted``: a draw proportional to the weights (one ``rng.random()`` per choice);
- ``least_loaded``: the smallest ``(in flight + queued) / concurrency`` (an unlimited concurrency
  counts as 1: the deployment with the fewest calls out or waiting);
- ``lowest_latency``: the smallest EWMA of recent service times (a deployment with no sample yet
  goes first, the least loaded of them, so each is measured);
- ``most_headroom``: the largest share of quota left, over its dimensions (requests, tokens,
  concurrency slots; the smallest of them counts);
- ``cheapest``: the lowest price among the deployments with quota left now; when none has any, the
  least loaded.

Ties go to the deployment listed first in the route (no draw), so a choice is reproducible.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.slot_init import compile_builder

if TYPE_CHECKING:
    from random import Random  # the injected generator's type; no randomness is imported

__all__ = [
    "DEFAULT_LATENCY_ALPHA",
    "ROUTE_POLICIES",
    "DeploymentState",
    "Route",
    "RouteConfigError",
    "choose_deployment",
    "ewma",
    "new_deployment_state",
]

ROUTE_POLICIES = ("weighted", "least_loaded", "lowest_latency", "most_headroom", "cheapest")
"""The policy names a :class:`Route` (and a scenario's ``[[routes]]``) accepts."""

DEFAULT_LATENCY_ALPHA = 0.2
"""Weight of the newest service time in the ``lowest_latency`` EWMA: the last ~5 calls dominate."""


class RouteConfigError(ConfigurationError):
    """A route that cannot be used (an unknown policy, a weight <= 0, a deployment named twice...)."""


@dataclass(frozen=True, slots=True)
class Route:
    """Deployments that serve the same calls, and how a call picks one of them.

    Parameters:
        providers: the deployments' provider names, in preference order (ties go to the first).
        policy: one of :data:`ROUTE_POLICIES` (``weighted`` by default).
        weights: for ``weighted``: a number > 0 per deployment, as a sequence in ``providers``'
            order or a mapping name -> weight; equal weights by default.
        retry_elsewhere: a retryable failure re-chooses the deployment of the retry among the
            others (the one that failed is left out when another exists); ``False`` keeps a task on
            the deployment chosen for its first attempt.
        prices: for ``cheapest``: a price per deployment (any unit, only the order counts);
            by default the provider's own ``price_per_1k_units`` (or its ``config``'s), else 0.
        latency_alpha: the weight of the newest sample in the ``lowest_latency`` EWMA, in (0, 1].
    """

    providers: tuple[str, ...]
    policy: str = "weighted"
    weights: tuple[float, ...] | None = None
    retry_elsewhere: bool = True
    prices: tuple[float, ...] | None = None
    latency_alpha: float = DEFAULT_LATENCY_ALPHA

    def __init__(
        self,
        providers: Sequence[str],
        policy: str = "weighted",
        weights: Sequence[float] | Mapping[str, float] | None = None,
        retry_elsewhere: bool = True,
        prices: Sequence[float] | Mapping[str, float] | None = None,
        latency_alpha: float = DEFAULT_LATENCY_ALPHA,
    ) -> None:
        if isinstance(providers, str) or not isinstance(providers, Sequence):
            raise RouteConfigError(f"providers: expected a list of provider names, got {providers!r}")
        names = tuple(providers)
        if not names:
            raise RouteConfigError("providers: a route needs at least one provider")
        for name in names:
            if type(name) is not str or not name:
                raise RouteConfigError(f"providers: expected non-empty provider names, got {name!r}")
        if len(set(names)) != len(names):
            twice = sorted({name for name in names if names.count(name) > 1})
            raise RouteConfigError(f"providers: {twice} named more than once; list each deployment once")
        if policy not in ROUTE_POLICIES:
            raise RouteConfigError(f"policy: expected one of {list(ROUTE_POLICIES)}, got {policy!r}")
        if type(retry_elsewhere) is not bool:
            raise RouteConfigError(f"retry_elsewhere: expected true or false, got {retry_elsewhere!r}")
        if (
            isinstance(latency_alpha, bool)
            or not isinstance(latency_alpha, numbers.Real)
            or not 0 < latency_alpha <= 1
        ):
            raise RouteConfigError(f"latency_alpha: expected a number in (0, 1], got {latency_alpha!r}")
        set_ = object.__setattr__
        set_(self, "providers", names)
        set_(self, "policy", policy)
        set_(self, "weights", _per_provider(weights, names, "weights", positive=True))
        set_(self, "retry_elsewhere", retry_elsewhere)
        set_(self, "prices", _per_provider(prices, names, "prices", positive=False))
        set_(self, "latency_alpha", float(latency_alpha))

    def weight_of(self, index: int) -> float:
        """The weight of the ``index``-th deployment (1 when no weights were given)."""
        return 1.0 if self.weights is None else self.weights[index]


def _per_provider(
    given: Sequence[float] | Mapping[str, float] | None, names: tuple[str, ...], key: str, *, positive: bool
) -> tuple[float, ...] | None:
    """``given`` as one finite number per deployment, in ``names``' order; refused naming ``key``."""
    if given is None:
        return None
    if isinstance(given, Mapping):
        unknown = sorted(set(given) - set(names), key=str)
        if unknown:
            raise RouteConfigError(
                f"{key}: given for {unknown}, which the route does not list ({list(names)})"
            )
        missing = [name for name in names if name not in given]
        if missing:
            raise RouteConfigError(f"{key}: no value for {missing}; give one per provider of the route")
        values = [given[name] for name in names]
    elif isinstance(given, str) or not isinstance(given, Sequence):
        raise RouteConfigError(
            f"{key}: expected a list of numbers or a mapping provider -> number, got {given!r}"
        )
    else:
        values = list(given)
        if len(values) != len(names):
            raise RouteConfigError(
                f"{key}: {len(values)} value(s) for {len(names)} provider(s) {list(names)}; "
                "give one per provider"
            )
    checked = []
    for name, value in zip(names, values, strict=True):
        bound = "> 0" if positive else ">= 0"
        if (
            isinstance(value, bool)
            or not isinstance(value, numbers.Real)
            or not math.isfinite(value)
            or not (value > 0 if positive else value >= 0)
        ):
            raise RouteConfigError(f"{key}: {name!r} has {value!r}; expected a finite number {bound}")
        checked.append(float(value))
    return tuple(checked)


@dataclass(frozen=True, slots=True)
class DeploymentState:
    """One deployment of a route as the scheduler sees it at one instant (built per choice)."""

    name: str
    weight: float
    """The route's weight for it (1 when the route has none)."""
    in_flight: int
    """Its calls at the provider now."""
    queued: int
    """Its tasks waiting for quota (queued, and retries waiting for a grant)."""
    concurrency: int | None
    """Its concurrency limit (``None``: unlimited)."""
    latency_s: float | None
    """EWMA of its recent service times (``None``: no call has finished there yet)."""
    headroom: float
    """Share of its quota left now, in [0, 1]: the smallest over its dimensions (1: unlimited); its
    concurrency slots count net of the queued tasks that will take them next."""
    price: float
    """Its price (only the order counts)."""


new_deployment_state: Callable[..., DeploymentState] = compile_builder(DeploymentState)
"""``DeploymentState(...)`` without the cost of a class call (one per deployment per routed submission)."""


def ewma(previous: float | None, sample: float, alpha: float) -> float:
    """The exponentially weighted moving average after ``sample`` (the first sample is taken as is)."""
    if previous is None:
        return sample
    return previous + alpha * (sample - previous)


def _load(state: DeploymentState) -> float:
    return (state.in_flight + state.queued) / (state.concurrency or 1)


def _argmin(states: Sequence[DeploymentState], key: Callable[[DeploymentState], Any]) -> int:
    best = 0
    best_value = key(states[0])
    for index in range(1, len(states)):
        value = key(states[index])
        if value < best_value:
            best, best_value = index, value
    return best


def weighted(states: Sequence[DeploymentState], rng: Random) -> int:
    """A draw proportional to the weights: one ``rng.random()``."""
    total = 0.0
    for state in states:
        total += state.weight
    point = rng.random() * total
    for index, state in enumerate(states):
        point -= state.weight
        if point < 0:
            return index
    return len(states) - 1  # rounding: the last one


def least_loaded(states: Sequence[DeploymentState], rng: Random) -> int:
    """The smallest (in flight + queued) per concurrency slot."""
    return _argmin(states, _load)


def lowest_latency(states: Sequence[DeploymentState], rng: Random) -> int:
    """The smallest EWMA of service times; an unmeasured deployment first (the least loaded of
    them, so a burst before any answer does not all go to the first listed)."""
    return _argmin(
        states, lambda state: (-1.0, _load(state)) if state.latency_s is None else (state.latency_s, 0.0)
    )


def most_headroom(states: Sequence[DeploymentState], rng: Random) -> int:
    """The largest share of quota left (its tightest dimension)."""
    return _argmin(states, lambda state: -state.headroom)


def cheapest(states: Sequence[DeploymentState], rng: Random) -> int:
    """The lowest price among those with quota left now; else the least loaded."""
    open_ = [index for index, state in enumerate(states) if state.headroom > 0]
    if not open_:
        return least_loaded(states, rng)
    return min(open_, key=lambda index: (states[index].price, index))


POLICY_RULES: Mapping[str, Callable[[Sequence[DeploymentState], Any], int]] = {
    "weighted": weighted,
    "least_loaded": least_loaded,
    "lowest_latency": lowest_latency,
    "most_headroom": most_headroom,
    "cheapest": cheapest,
}
"""Each policy name's rule: ``rule(states, rng) -> index`` of the chosen deployment."""


def choose_deployment(policy: str, states: Sequence[DeploymentState], rng: Random) -> int:
    """The index in ``states`` of the deployment ``policy`` picks (``states`` non-empty)."""
    if len(states) == 1:
        return 0
    return POLICY_RULES[policy](states, rng)
