"""Back to a mapping: a :class:`~aiqsim.sim.config.Scenario` in the file layout (for reports and round
trips: ``parse_scenario(scenario_to_dict(s), source=s.source) == s``)."""

from __future__ import annotations

from typing import Any

from aiqsim.sim.config import FleetConfig, RouteConfig, Scenario, WorkloadConfig
from aiqsim.sim.scenario.spec import (
    _BUDGET,
    _CRASH,
    _DISPATCH,
    _FLEET,
    _JOB,
    _JOB_WORKLOAD_EXCLUDED,
    _OVERLOAD,
    _PROVIDER,
    _QUOTA,
    _RETRY,
    _ROUTE,
    _SCENARIO_SECTION,
    _STORE,
    _TENANT,
    _WORKLOAD,
    _Array,
    _Table,
)


def _record_dict(record: Any, schema: _Table) -> dict[str, Any]:
    allowed = list(schema.fields)
    if schema.variant_key is not None:
        variant = getattr(record, schema.variant_key)
        allowed = [name for name in schema.fields if name in schema.variants[variant]]
    values: dict[str, Any] = {}
    for key in allowed:
        value = getattr(record, key)
        sub = schema.fields[key]
        if isinstance(sub, _Table):
            value = _record_dict(value, sub)
        elif isinstance(sub, _Array):
            value = [_record_dict(item, sub.item) for item in value]
        values[key] = value
    for key in schema.one_of:  # only the one set (a stage's provider or route) is written
        if values.get(key) is None:
            values.pop(key, None)
    return values


def _workload_dict(workload: WorkloadConfig) -> dict[str, Any]:
    """A workload's keys: a job workload has no provider, cost or poison share, a call workload no job."""
    values = _record_dict(workload, _WORKLOAD)
    dropped = _JOB_WORKLOAD_EXCLUDED if workload.job is not None else ("job",)
    dropped += ("provider",) if workload.route is not None else ("route",)
    if workload.tenant is None:
        dropped = (*dropped, "tenant")
    return {key: value for key, value in values.items() if key not in dropped}


def scenario_to_dict(scenario: Scenario) -> dict[str, Any]:
    """The scenario as a plain mapping in the file layout (JSON-serialisable; ``None`` for unset).

    ``parse_scenario(scenario_to_dict(s), source=s.source) == s``.
    """
    return {
        "scenario": _record_dict(scenario, _SCENARIO_SECTION),
        "providers": [_record_dict(provider, _PROVIDER) for provider in scenario.providers],
        "quotas": {name: _record_dict(quota, _QUOTA) for name, quota in scenario.quotas.items()},
        "retry": _record_dict(scenario.retry, _RETRY),
        "dispatch": _record_dict(scenario.dispatch, _DISPATCH),
        "store": _record_dict(scenario.store, _STORE),
        "workloads": [_workload_dict(workload) for workload in scenario.workloads],
        "crashes": [_record_dict(crash, _CRASH) for crash in scenario.crashes],
        "overload": _record_dict(scenario.overload, _OVERLOAD),
        "jobs": [_record_dict(job, _JOB) for job in scenario.jobs],
        "fleet": _fleet_dict(scenario.fleet),
        "routes": [_route_dict(route) for route in scenario.routes],
        "tenants": {name: _record_dict(tenant, _TENANT) for name, tenant in scenario.tenants.items()},
        "budget": {**_record_dict(scenario.budget, _BUDGET), "prices": dict(scenario.budget.prices)},
    }


def _route_dict(route: RouteConfig) -> dict[str, Any]:
    """A route's keys (``providers`` as a list, no ``weights`` when unset)."""
    values = _record_dict(route, _ROUTE)
    values["providers"] = list(route.providers)
    if route.weights is None:
        del values["weights"]
    else:
        values["weights"] = dict(route.weights)
    return values


def _fleet_dict(fleet: FleetConfig) -> dict[str, Any]:
    """The fleet's keys (``weights`` as a list, as in the file)."""
    values = _record_dict(fleet, _FLEET)
    values["weights"] = list(fleet.weights)
    return values
