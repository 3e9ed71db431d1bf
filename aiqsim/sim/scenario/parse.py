"""A scenario mapping to a validated :class:`~aiqsim.sim.config.Scenario`: the file read against the
spec, then each section built in dependency order (providers before what names them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiqsim.sim.config import DispatchConfig, Scenario
from aiqsim.sim.scenario.budget import _budget
from aiqsim.sim.scenario.errors import _fmt
from aiqsim.sim.scenario.fleet import _fleet
from aiqsim.sim.scenario.jobs import _jobs
from aiqsim.sim.scenario.providers import _providers
from aiqsim.sim.scenario.quotas import _quotas
from aiqsim.sim.scenario.reader import _Reader
from aiqsim.sim.scenario.retry import _overload, _retry
from aiqsim.sim.scenario.routes import _routes
from aiqsim.sim.scenario.spec import _FILE
from aiqsim.sim.scenario.store import _crash, _store
from aiqsim.sim.scenario.tenants import _tenants
from aiqsim.sim.scenario.workloads import _workload

MAX_TIMELINE_STEPS = 1_000_000
"""The timeline has one row per step and provider: more steps than this is a typo, not a wish."""


def parse_scenario(mapping: Mapping[str, Any], source: str = "<scenario>") -> Scenario:
    """Validate a scenario mapping (as parsed from TOML) into a :class:`Scenario`.

    ``source`` names the file in error messages and is kept as ``Scenario.source``; relative
    trace paths are resolved against its folder when it is a file. Raises
    :class:`~aiqsim.sim.scenario.ScenarioError`.
    """
    reader = _Reader(source)
    values = reader.table(mapping, "", _FILE)
    header = values["scenario"]
    providers = _providers(values["providers"], reader)
    by_name = {provider.name: provider for provider in providers}
    quotas = _quotas(values.get("quotas", {}), list(by_name), reader)
    retry = _retry(values.get("retry", {}), reader)
    dispatch = DispatchConfig(**values.get("dispatch", {}))
    store = _store(values.get("store", {}), reader)
    defaults = Scenario.__dataclass_fields__
    duration_s = header.get("duration_s", defaults["duration_s"].default)
    drain_s = header.get("drain_s", defaults["drain_s"].default)
    step_s = header.get("timeline_step_s", defaults["timeline_step_s"].default)
    if (duration_s + drain_s) / step_s > MAX_TIMELINE_STEPS:
        raise reader.error(
            "scenario.timeline_step_s",
            f"expected at most {MAX_TIMELINE_STEPS:,} steps over duration_s + drain_s "
            f"({_fmt(duration_s + drain_s)} s), got a step of {_fmt(step_s)} s",
        )
    if not values["workloads"]:
        raise reader.error("workloads", "expected at least one [[workloads]] table, got none")
    routes = _routes(values.get("routes", ()), by_name, reader)
    jobs = _jobs(values.get("jobs", ()), by_name, quotas, reader, {r.name: r for r in routes})
    tenants = _tenants(values.get("tenants", {}), reader)
    templates = {j.name: j for j in jobs}
    workloads = tuple(
        _workload(
            item,
            f"workloads[{i}]",
            by_name,
            quotas,
            duration_s,
            reader,
            templates,
            routes={r.name: r for r in routes},
            tenants=tenants,
        )
        for i, item in enumerate(values["workloads"])
    )
    crashes = tuple(
        _crash(item, f"crashes[{i}]", store, duration_s + drain_s, reader)
        for i, item in enumerate(values.get("crashes", ()))
    )
    return Scenario(
        providers=providers,
        workloads=workloads,
        quotas=quotas,
        retry=retry,
        dispatch=dispatch,
        store=store,
        crashes=crashes,
        overload=_overload(values.get("overload", {}), reader),
        jobs=jobs,
        fleet=_fleet(values.get("fleet", {}), quotas, workloads, crashes, reader),
        routes=routes,
        tenants=tenants,
        budget=_budget(values.get("budget", {}), list(by_name), reader),
        source=source,
        **header,
    )
