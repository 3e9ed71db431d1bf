"""Scenario files: TOML in, a validated :class:`~aiqsim.sim.config.Scenario` out.

A scenario file looks like this (units are in the key names)::

    [scenario]                # name, description, seed, duration_s, drain_s, timeline_step_s
    name = "retry_storm_429"
    duration_s = 120

    [[providers]]             # one table per provider (ProviderConfig fields)
    name = "llm"
    server_requests_per_min = 120
      [[providers.outages]]   # OutageConfig: start_s, end_s, mode, slow_factor
      start_s = 30
      end_s = 40

    [quotas.llm]              # client-side quota per provider name (ClientQuotaConfig)
    concurrency = 8
    [retry]                   # RetryConfig
    [dispatch]                # DispatchConfig
    [store]                   # StoreConfig
    [[workloads]]             # WorkloadConfig, with [workloads.cost] for CostConfig
    type = "poisson"
    provider = "llm"
    [[crashes]]               # CrashConfig: exactly one of at_s / after_writes
    [[jobs]]                  # JobConfig (aiqsim/sim/job_config.py): a template of stages
      [[jobs.stages]]         # StageConfig: name, provider, after, size, fanout, fallback
    [[workloads]]             # a job workload names a template instead of a provider
    type = "poisson"
    job = "edit"
    [fleet]                   # FleetConfig: workers, quota ("shared"/"split"), routing, weights
    [tenants.acme]            # TenantConfig: weight, max_queued; a workload says tenant = "acme"

Everything is validated before a :class:`Scenario` exists: unknown keys, wrong types (a bool
is not a number), out-of-range values and broken references all raise :class:`ScenarioError`
naming the file, the dotted key path (``providers[1].timeout_prob``) and what was expected.
TOML has no null: an optional setting whose default is a value (``retry.attempt_timeout_s``)
is switched off with the string ``"none"``.

Overrides (``load_scenario(path, overrides={"retry.base_s": 0.5})`` or the CLI's
``--set retry.base_s=0.5`` through :func:`parse_override`) are applied to the raw mapping
before validation, so they are checked exactly like the file. Providers can be addressed by
name (``providers.llm.timeout_prob``) or by index (``providers[0].timeout_prob``).
"""

from __future__ import annotations

from typing import Any

from aiqsim.sim.config import FleetConfig, RouteConfig, Scenario, WorkloadConfig
from aiqsim.sim.scenario.errors import ScenarioError
from aiqsim.sim.scenario.errors import describe as describe
from aiqsim.sim.scenario.files import MAX_SCENARIO_BYTES as MAX_SCENARIO_BYTES
from aiqsim.sim.scenario.files import load_scenario
from aiqsim.sim.scenario.fleet import MAX_FLEET_WORKERS as MAX_FLEET_WORKERS
from aiqsim.sim.scenario.nesting import MAX_NESTING as MAX_NESTING
from aiqsim.sim.scenario.overrides import apply_overrides, parse_override
from aiqsim.sim.scenario.overrides import split_key_path as split_key_path
from aiqsim.sim.scenario.parse import MAX_TIMELINE_STEPS as MAX_TIMELINE_STEPS
from aiqsim.sim.scenario.parse import parse_scenario
from aiqsim.sim.scenario.providers import provider_from_table as provider_from_table
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
from aiqsim.sim.scenario.spec import MAX_PRICE_PER_1K_UNITS as MAX_PRICE_PER_1K_UNITS
from aiqsim.sim.scenario.spec import SECTION_FIELDS as SECTION_FIELDS

__all__ = [
    "ScenarioError",
    "apply_overrides",
    "load_scenario",
    "parse_override",
    "parse_scenario",
    "scenario_to_dict",
]


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
