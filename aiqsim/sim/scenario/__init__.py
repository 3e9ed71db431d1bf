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
      [[jobs.stages]]         # StageConfig: name, provider or route, after, size, fanout, fallback
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

Where each rule lives (this module only re-exports):

- ``files``: reading a file (size, UTF-8, TOML errors with their line); ``nesting``: the depth bound;
  ``overrides``: key paths and ``--set``; ``parse``: :func:`parse_scenario`, the sections in order;
  ``to_dict``: a scenario back to the file layout.
- ``spec``: every table, its keys and their value checks (``checks``), from which
  :mod:`aiqsim.sim.scenario_schema` writes the JSON Schema; ``reader``: a mapping checked against them;
  ``errors``: :class:`ScenarioError` and how values are written in messages.
- One builder per section, with the checks that span keys: ``providers``, ``quotas``, ``workloads``
  (and ``workload_files``), ``sizes``, ``jobs``, ``routes``, ``tenants``, ``budget``, ``retry``
  (with ``[overload]``), ``store`` (with ``[[crashes]]``), ``fleet``.
"""

from __future__ import annotations

from aiqsim.sim.config import Scenario as Scenario
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
from aiqsim.sim.scenario.spec import MAX_PRICE_PER_1K_UNITS as MAX_PRICE_PER_1K_UNITS
from aiqsim.sim.scenario.spec import SECTION_FIELDS as SECTION_FIELDS
from aiqsim.sim.scenario.to_dict import scenario_to_dict

__all__ = [
    "ScenarioError",
    "apply_overrides",
    "load_scenario",
    "parse_override",
    "parse_scenario",
    "scenario_to_dict",
]
