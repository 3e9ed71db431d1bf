"""The ``[[workloads]]`` tables: what each calls (a provider, a route or a job template), its tenant,
its arrival window and count, and calls no client quota could ever grant."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from aiqsim.sim.config import ClientQuotaConfig, ProviderConfig, RouteConfig, TenantConfig, WorkloadConfig
from aiqsim.sim.job_config import JobConfig
from aiqsim.sim.scenario.errors import _fmt, describe
from aiqsim.sim.scenario.quotas import _never_granted, _unit_capacity
from aiqsim.sim.scenario.reader import _Reader
from aiqsim.sim.scenario.routes import _route_named
from aiqsim.sim.scenario.sizes import _cost, _largest_fixed_units
from aiqsim.sim.scenario.spec import _JOB_WORKLOAD_EXCLUDED, _WORKLOAD, _WORKLOAD_KEYS
from aiqsim.sim.scenario.workload_files import _resolve_replay_arrivals, _resolve_trace
from aiqsim.sim.workloads import arrival_overflow


def _workload(
    values: dict[str, Any],
    path: str,
    providers: dict[str, ProviderConfig],
    quotas: dict[str, ClientQuotaConfig],
    duration_s: float,
    reader: _Reader,
    jobs: Mapping[str, JobConfig] | None = None,
    routes: Mapping[str, RouteConfig] | None = None,
    tenants: Mapping[str, TenantConfig] | None = None,
) -> WorkloadConfig:
    tenants = tenants or {}
    if "tenant" in values and values["tenant"] not in tenants:
        declared = ", ".join(tenants) or "none declared"
        raise reader.error(
            f"{path}.tenant",
            f"expected the name of a [tenants.NAME] table ({declared}), got {describe(values['tenant'])}",
        )
    if "job" in values:
        if "route" in values:
            raise reader.error(
                f"{path}.route", "does not apply to a job workload (its stages name the providers)"
            )
        return _job_workload(values, path, jobs or {}, duration_s, reader)
    if "route" in values:
        return _route_workload(values, path, routes or {}, duration_s, reader)
    if "provider" not in values:
        raise reader.error(
            f"{path}.provider", "missing; expected a string (the provider to call), or job = a [[jobs]] name"
        )
    if values["provider"] not in providers:
        raise reader.error(
            f"{path}.provider",
            f"expected the name of a declared provider ({', '.join(providers)}), "
            f"got {describe(values['provider'])}",
        )
    workload = _workload_config(values, path, duration_s, reader)
    capacity = _unit_capacity(quotas.get(workload.provider))
    largest = _largest_fixed_units(workload.cost) if workload.type not in ("trace", "replay") else None
    if capacity is not None and largest is not None and largest > capacity:
        key = "mean" if workload.cost.dist == "fixed" else "high"
        raise _never_granted(reader, f"{path}.cost.{key}", workload.provider, capacity, largest)
    return workload


def _workload_config(values: dict[str, Any], path: str, duration_s: float, reader: _Reader) -> WorkloadConfig:
    """A workload's record from its checked table: its cost, trace and replayed arrivals read, its
    arrivals checked against the scenario's duration (for a provider's workload and a route's alike)."""
    kwargs = dict(values)
    if "cost" in kwargs:
        kwargs["cost"] = _cost(kwargs["cost"], f"{path}.cost", reader)
    if "trace" in kwargs:
        kwargs["trace"] = _resolve_trace(kwargs["trace"], f"{path}.trace", reader)
    if "arrivals" in kwargs:
        kwargs["arrivals"] = _resolve_replay_arrivals(kwargs["arrivals"], f"{path}.arrivals", reader)
    workload = WorkloadConfig(**kwargs)
    _check_arrivals(workload, values, path, duration_s, reader)
    return workload


def _route_workload(
    values: dict[str, Any], path: str, routes: Mapping[str, RouteConfig], duration_s: float, reader: _Reader
) -> WorkloadConfig:
    """A workload submitted to a ``[[routes]]`` entry: it names the route, not a provider."""
    _route_named(values, path, routes, reader)
    workload = _workload_config(values, path, duration_s, reader)
    return workload


def _job_workload(
    values: dict[str, Any], path: str, jobs: Mapping[str, JobConfig], duration_s: float, reader: _Reader
) -> WorkloadConfig:
    for key in _JOB_WORKLOAD_EXCLUDED:
        if key in values:
            # route is refused on a job workload too (by _workload, before this)
            allowed = set(_WORKLOAD_KEYS[values["type"]]) - {*_JOB_WORKLOAD_EXCLUDED, "route"}
            listed = ", ".join(k for k in _WORKLOAD.fields if k in allowed)
            raise reader.error(
                f"{path}.{key}",
                "does not apply to a job workload (its stages name the providers and sizes); "
                f"keys for a {values['type']} job workload: {listed}",
            )
    if values["job"] not in jobs:
        declared = ", ".join(jobs) or "none declared"
        raise reader.error(
            f"{path}.job",
            f"expected the name of a [[jobs]] template ({declared}), got {describe(values['job'])}",
        )
    workload = WorkloadConfig(**values)
    _check_arrivals(workload, values, path, duration_s, reader)
    return workload


def _check_arrivals(
    workload: WorkloadConfig, values: dict[str, Any], path: str, duration_s: float, reader: _Reader
) -> None:
    """The arrival window (start_s before duration_s, end_s after start_s) and the arrival count that
    generation would refuse (:func:`~aiqsim.sim.workloads.arrival_overflow`), for task and job
    workloads alike."""
    if not workload.start_s < duration_s:
        raise reader.error(
            f"{path}.start_s",
            f"expected a number < scenario.duration_s ({_fmt(duration_s)}), "
            f"got {describe(values['start_s'])} (arrivals stop at duration_s)",
        )
    if workload.end_s is not None and not workload.end_s > workload.start_s:
        raise reader.error(
            f"{path}.end_s",
            f"expected a number > start_s ({_fmt(workload.start_s)}), got {describe(workload.end_s)}",
        )
    too_many = arrival_overflow(workload, duration_s)
    if too_many is not None:
        # name clicks when the user actions alone would fit: it is the key to lower
        by_clicks = workload.type == "double_click" and (
            arrival_overflow(replace(workload, clicks=1), duration_s) is None
        )
        raise reader.error(f"{path}.clicks" if by_clicks else path, too_many)
