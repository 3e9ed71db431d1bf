"""A scheduler's routes: each route's deployments bound to their lanes, and the choice made for a call.

When the choice is made: a task submitted to a route (``submit("gpt-4o", ...)``, or a job stage
naming the route) is given a deployment when it is submitted, and queues in that deployment's lane
(the policy reads the lanes as they are then: what is in flight, what is queued, the quota left,
recent service times). When the route has ``retry_elsewhere`` (the default), every retry after a
retryable failure is chosen again, among the other deployments when there are any: a 503 or a 429
from one region moves the retry to the next. The task record's ``provider`` is always the deployment
that runs (or last ran) the call, written to the store before the call is sent, so a restart's
recovery asks that deployment about the task's idempotency key. The key itself never names a
deployment: it is the same whichever one runs the call.

The route a task came through is kept with it (:attr:`LiveTask.route`, and the record's ``route``,
stored): a task resumed by ``recover()`` (or retried by hand) starts on the deployment its record
names, and its retries may move as before, when this scheduler has that route
(:meth:`RouteTable.route_of`); without it, the task stays on its deployment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aiqsim.core.routing import (
    DEFAULT_LATENCY_ALPHA,
    DeploymentState,
    Route,
    RouteConfigError,
    choose_deployment,
    ewma,
    new_deployment_state,
)
from aiqsim.core.token_bucket import MultiQuota

if TYPE_CHECKING:
    from random import Random

    from aiqsim.core.task import TaskRecord
    from aiqsim.scheduler.lanes import Lane

__all__ = ["RouteTable", "deployment_state", "quota_headroom"]


def quota_headroom(quota: Any, now: float, waiting: int = 0) -> float:
    """Share of ``quota`` left at ``now`` in [0, 1]: its tightest dimension (requests, tokens,
    concurrency slots, the slots net of the ``waiting`` tasks that will take them next); 0 while
    it is paused by a 429, 1 for a quota that shows no levels."""
    if type(quota) is MultiQuota:  # the usual quota: its slots read directly (once per deployment per choice)
        if quota.paused_until > now:
            return 0.0
        share = 1.0
        for bucket in (quota.requests, quota.tokens):
            if bucket is not None:
                share = min(share, max(bucket.level(now), 0.0) / bucket.capacity)
        concurrency = quota.concurrency
        if concurrency:
            share = min(share, max(concurrency - quota.in_flight - waiting, 0) / concurrency)
        return share
    if getattr(quota, "paused_until", float("-inf")) > now:
        return 0.0
    share = 1.0
    for name in ("requests", "tokens"):
        bucket = getattr(quota, name, None)
        if bucket is not None and hasattr(bucket, "level"):
            share = min(share, max(bucket.level(now), 0.0) / bucket.capacity)
    concurrency = getattr(quota, "concurrency", None)
    if concurrency:
        taken = getattr(quota, "in_flight", 0) + waiting
        share = min(share, max(concurrency - taken, 0) / concurrency)
    return share


def deployment_state(
    lane: Lane, weight: float, latency: float | None, price: float, now: float
) -> DeploymentState:
    """The frozen view of ``lane`` a routing policy reads."""
    quota = lane.quota
    queued = 0
    for _, tickets, queue in lane.lines:  # retry line and queue per priority
        queued += len(tickets) + len(queue)
    if type(quota) is MultiQuota:
        in_flight, concurrency = quota.in_flight, quota.concurrency
    else:
        in_flight, concurrency = int(getattr(quota, "in_flight", 0)), getattr(quota, "concurrency", None)
    return new_deployment_state(
        lane.name, weight, in_flight, queued, concurrency, latency, quota_headroom(quota, now, queued), price
    )


def _price_of(provider: Any) -> float:
    price = getattr(provider, "price_per_1k_units", None)
    if price is None:
        price = getattr(getattr(provider, "config", None), "price_per_1k_units", None)
    try:
        return float(price) if price is not None else 0.0
    except (TypeError, ValueError):
        return 0.0


class RouteTable:
    """The routes of one scheduler, checked against its lanes, and the latency each lane showed."""

    __slots__ = ("_latency", "_members", "routes")

    def __init__(self, routes: Any, lanes: Mapping[str, Lane]) -> None:
        if not isinstance(routes, Mapping):
            raise RouteConfigError(f"routes: expected a mapping route name -> Route, got {routes!r}")
        self.routes: dict[str, Route] = {}
        self._members: dict[str, tuple[tuple[Lane, float, float], ...]] = {}
        """Each route's deployments: (lane, weight, price), in the route's order."""
        for name, route in routes.items():
            where = f"routes[{name!r}]"
            if type(name) is not str or not name:
                raise RouteConfigError(f"routes: expected non-empty route names, got {name!r}")
            if not isinstance(route, Route):
                raise RouteConfigError(f"{where}: expected a Route(...), got {route!r}")
            if name in lanes:
                raise RouteConfigError(
                    f"{where}: a provider is named {name!r} too; a route needs a name of its own "
                    "(submit(name) must mean one thing)"
                )
            unknown = [provider for provider in route.providers if provider not in lanes]
            if unknown:
                raise RouteConfigError(
                    f"{where}.providers: no provider named {unknown} (this scheduler has {sorted(lanes)})"
                )
            kinds = {
                provider: kind
                for provider in route.providers
                if (kind := _kind_of(lanes[provider].provider)) is not None
            }
            if len(set(kinds.values())) > 1:
                raise RouteConfigError(
                    f"{where}.providers: mixes kinds {kinds}; a route's deployments must serve the same calls"
                )
            self.routes[name] = route
            prices = (
                route.prices
                if route.prices is not None
                else tuple(_price_of(lanes[provider].provider) for provider in route.providers)
            )
            self._members[name] = tuple(
                (lanes[provider], route.weight_of(index), prices[index])
                for index, provider in enumerate(route.providers)
            )
        self._latency: dict[str, float] = {}

    def __contains__(self, name: object) -> bool:
        return name in self.routes

    def route_of(self, record: TaskRecord) -> str | None:
        """The route a stored task came through, for its retries to move as before (``None``: none,
        or one this scheduler was not given, or one its deployment is no longer a member of: the task
        then stays on the deployment its record names)."""
        route = self.routes.get(record.route) if record.route is not None else None
        if route is None or record.provider not in route.providers:
            return None
        return record.route

    def latency(self, lane_name: str) -> float | None:
        """The EWMA of ``lane_name``'s recent service times (``None`` before its first)."""
        return self._latency.get(lane_name)

    def observe(self, lane_name: str, service_s: float, route: str | None) -> None:
        """A call on ``lane_name`` (through ``route``, if any) took ``service_s``: fold it into that
        lane's EWMA, with the route's ``latency_alpha`` (the default for a call sent to the lane)."""
        alpha = self.routes[route].latency_alpha if route is not None else DEFAULT_LATENCY_ALPHA
        self._latency[lane_name] = ewma(self._latency.get(lane_name), service_s, alpha)

    def states(self, name: str, now: float, exclude: str | None = None) -> list[DeploymentState]:
        """The view of route ``name``'s deployments a policy reads (without ``exclude`` when others exist)."""
        members = self._members[name]
        latency = self._latency
        if len(members) == 1:
            exclude = None
        return [
            deployment_state(lane, weight, latency.get(lane.name), price, now)
            for lane, weight, price in members
            if lane.name != exclude
        ]

    def choose(
        self, name: str, lanes: Mapping[str, Lane], now: float, rng: Random, exclude: str | None = None
    ) -> Lane:
        """The lane route ``name``'s policy picks now (``exclude``: the deployment that just failed)."""
        states = self.states(name, now, exclude)
        return lanes[states[choose_deployment(self.routes[name].policy, states, rng)].name]


def _kind_of(provider: Any) -> str | None:
    """A provider's kind of call (``llm``, ``tts``...) when it says so (its ``kind`` or its config's)."""
    kind = getattr(provider, "kind", None)
    if kind is None:
        kind = getattr(getattr(provider, "config", None), "kind", None)
    return kind if isinstance(kind, str) else None
