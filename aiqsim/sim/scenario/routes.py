"""The ``[[routes]]`` entries: unique names no provider has, declared providers of one kind, a weight
for each of them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiqsim.sim.config import ProviderConfig, RouteConfig
from aiqsim.sim.scenario.errors import describe
from aiqsim.sim.scenario.reader import _Reader


def _routes(
    raw: tuple[dict[str, Any], ...], providers: Mapping[str, ProviderConfig], reader: _Reader
) -> tuple[RouteConfig, ...]:
    """The ``[[routes]]`` entries, each checked against the declared providers."""
    seen: dict[str, int] = {}
    routes = []
    for i, values in enumerate(raw):
        path = f"routes[{i}]"
        name = values["name"]
        reader.unique_name(seen, "routes", i, "route", name)
        if name in providers:
            raise reader.error(
                f"{path}.name",
                "expected a name no provider has (a workload's target must mean one thing), "
                f"got {describe(name)}",
            )
        names = values["providers"]
        if not names:
            raise reader.error(f"{path}.providers", "expected at least one provider name, got none")
        for j, provider in enumerate(names):
            if provider not in providers:
                raise reader.error(
                    f"{path}.providers[{j}]",
                    f"expected the name of a declared provider ({', '.join(providers)}), "
                    f"got {describe(provider)}",
                )
        kinds = {provider: providers[provider].kind for provider in names}
        if len(set(kinds.values())) > 1:
            listed = ", ".join(f"{p} is {k}" for p, k in kinds.items())
            raise reader.error(f"{path}.providers", f"expected providers of one kind, got {listed}")
        weights = values.get("weights")
        if weights is not None:
            for provider in weights:
                if provider not in names:
                    raise reader.error(
                        f"{path}.weights.{provider}",
                        f"expected a weight for one of the route's providers ({', '.join(names)})",
                    )
            missing = [provider for provider in names if provider not in weights]
            if missing:
                raise reader.error(
                    f"{path}.weights.{missing[0]}",
                    "missing; expected a number > 0 for each of the route's providers",
                )
            values = {**values, "weights": {provider: float(weights[provider]) for provider in names}}
        routes.append(RouteConfig(**values))
    return tuple(routes)


def _route_named(
    values: dict[str, Any], path: str, routes: Mapping[str, RouteConfig], reader: _Reader
) -> RouteConfig:
    """The ``[[routes]]`` entry a workload or a job stage names with ``route =`` (which then takes no
    ``provider``: the route's policy picks it), refused naming the declared routes if there is none."""
    if "provider" in values:
        raise reader.error(
            f"{path}.provider",
            f"does not apply with route = {values['route']!r} (the route's policy picks the provider); "
            "give one of provider or route",
        )
    if values["route"] not in routes:
        declared = ", ".join(routes) or "none declared"
        raise reader.error(
            f"{path}.route",
            f"expected the name of a [[routes]] entry ({declared}), got {describe(values['route'])}",
        )
    return routes[values["route"]]
