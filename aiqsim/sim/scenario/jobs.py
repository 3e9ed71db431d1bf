"""The ``[[jobs]]`` templates and their ``[[jobs.stages]]``: unique names, a provider or a route (exactly
one) and fallbacks, stages that wait only for earlier ones, sizes from a stage waited for, calls the
client quota of every provider the stage may call can grant."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from aiqsim.sim.config import ClientQuotaConfig, ProviderConfig, RouteConfig
from aiqsim.sim.job_config import JobConfig, StageConfig
from aiqsim.sim.scenario.errors import describe
from aiqsim.sim.scenario.quotas import _never_granted, _unit_capacity
from aiqsim.sim.scenario.reader import _Reader
from aiqsim.sim.scenario.routes import _route_named
from aiqsim.sim.scenario.sizes import _fanout, _largest_fixed_units, _stage_size


def _stage(
    values: dict[str, Any],
    path: str,
    earlier: list[str],
    providers: Mapping[str, ProviderConfig],
    quotas: Mapping[str, ClientQuotaConfig],
    reader: _Reader,
    routes: Mapping[str, RouteConfig],
) -> StageConfig:
    declared = ", ".join(providers)
    deployments = _target(values, path, providers, routes, reader)
    fallback = values.get("fallback")
    if fallback is not None and fallback not in providers:
        raise reader.error(
            f"{path}.fallback",
            f'expected the name of a declared provider ({declared}) or "none", got {describe(fallback)}',
        )
    if fallback is not None and fallback == values.get("provider"):
        raise reader.error(
            f"{path}.fallback", f"expected a provider other than the stage's own ({values['provider']!r})"
        )
    before = ", ".join(earlier) or "none: this is the first stage"
    for name in values.get("after", ()):
        if name not in earlier:
            raise reader.error(
                f"{path}.after",
                f"expected names of stages declared before this one ({before}), got {describe(name)}",
            )
    kwargs = dict(values)
    if "size" in kwargs:
        kwargs["size"] = _stage_size(kwargs["size"], f"{path}.size", reader)
    if "fanout" in kwargs:
        kwargs["fanout"] = _fanout(kwargs["fanout"], f"{path}.fanout", reader)
    stage = StageConfig(**kwargs)
    if stage.size.dist == "from_stage" and stage.size.stage not in stage.after:
        listed = ", ".join(stage.after) or "none"
        raise reader.error(
            f"{path}.size.stage",
            f"expected one of the stages this stage waits for (after = {listed}), "
            f"got {describe(stage.size.stage)}",
        )
    largest = _largest_fixed_units(stage.size)
    smallest_fanout = max(1, round(stage.fanout.mean if stage.fanout.dist == "fixed" else stage.fanout.low))
    if stage.fanout.dist == "lognormal":
        smallest_fanout = 1
    for name in (*deployments, stage.fallback):  # any of a route's deployments may get a call
        capacity = _unit_capacity(quotas.get(name) if name is not None else None)
        if largest is None or capacity is None:
            continue
        per_call = math.ceil(largest / smallest_fanout)
        if per_call > capacity:
            key = "mean" if stage.size.dist == "fixed" else "high"
            raise _never_granted(reader, f"{path}.size.{key}", name, capacity, per_call, per_call=True)
    return stage


def _target(
    values: dict[str, Any],
    path: str,
    providers: Mapping[str, ProviderConfig],
    routes: Mapping[str, RouteConfig],
    reader: _Reader,
) -> tuple[str, ...]:
    """Check that the stage names exactly one of a declared provider or a ``[[routes]]`` entry; return
    the providers its calls may go to (the provider, or every deployment of the route)."""
    if "route" in values:
        return _route_named(values, path, routes, reader).providers
    declared_routes = ", ".join(routes) or "none declared"
    if "provider" not in values:
        raise reader.error(
            f"{path}.provider",
            f"missing; expected the name of a declared provider ({', '.join(providers)}), "
            f"or route = the name of a [[routes]] entry ({declared_routes})",
        )
    if values["provider"] not in providers:
        raise reader.error(
            f"{path}.provider",
            f"expected the name of a declared provider ({', '.join(providers)}), "
            f"got {describe(values['provider'])}",
        )
    return (values["provider"],)


def _jobs(
    raw: tuple[dict[str, Any], ...],
    providers: Mapping[str, ProviderConfig],
    quotas: Mapping[str, ClientQuotaConfig],
    reader: _Reader,
    routes: Mapping[str, RouteConfig] | None = None,
) -> tuple[JobConfig, ...]:
    seen: dict[str, int] = {}
    jobs = []
    for i, values in enumerate(raw):
        path = f"jobs[{i}]"
        reader.unique_name(seen, "jobs", i, "job", values["name"])
        if not values["stages"]:
            raise reader.error(f"{path}.stages", "expected at least one [[jobs.stages]] table, got none")
        stages: list[StageConfig] = []
        names: list[str] = []
        for j, stage_values in enumerate(values["stages"]):
            stage_path = f"{path}.stages[{j}]"
            if stage_values["name"] in names:
                raise reader.error(
                    f"{stage_path}.name",
                    f"expected a stage name unique within the job, got {describe(stage_values['name'])} "
                    f"(also stages[{names.index(stage_values['name'])}])",
                )
            stages.append(_stage(stage_values, stage_path, names, providers, quotas, reader, routes or {}))
            names.append(stage_values["name"])
        jobs.append(JobConfig(**{**values, "stages": tuple(stages)}))
    return tuple(jobs)
