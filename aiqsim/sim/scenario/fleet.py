"""The ``[fleet]`` section: workers, weights, and the checks that span sections (no crashes in a fleet
yet; a split quota that still grants each workload's largest call)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiqsim.sim.config import ClientQuotaConfig, CrashConfig, FleetConfig, WorkloadConfig
from aiqsim.sim.scenario.errors import _fmt, describe
from aiqsim.sim.scenario.quotas import _unit_capacity
from aiqsim.sim.scenario.reader import _Reader
from aiqsim.sim.scenario.sizes import _largest_fixed_units

MAX_FLEET_WORKERS = 1000
"""More scheduler instances than this in one simulation is a typo, not a fleet."""


def _fleet(
    values: dict[str, Any],
    quotas: Mapping[str, ClientQuotaConfig],
    workloads: tuple[WorkloadConfig, ...],
    crashes: tuple[CrashConfig, ...],
    reader: _Reader,
) -> FleetConfig:
    """The ``[fleet]`` section, with the checks that span keys and sections."""
    fleet = FleetConfig(**values)
    if fleet.workers > MAX_FLEET_WORKERS:
        raise reader.error(
            "fleet.workers", f"expected at most {MAX_FLEET_WORKERS} workers, got {describe(fleet.workers)}"
        )
    if fleet.routing == "weighted" and len(fleet.weights) != fleet.workers:
        got = f"{len(fleet.weights)} weight(s)" if "weights" in values else "none"
        raise reader.error(
            "fleet.weights",
            f'expected one weight per worker ({fleet.workers}) with routing = "weighted", got {got}',
        )
    if fleet.workers > 1 and crashes:
        raise reader.error(
            "crashes",
            f"crashes are not simulated in a fleet yet (fleet.workers = {fleet.workers}); "
            "remove [[crashes]] or set fleet.workers = 1",
        )
    if fleet.quota == "split" and fleet.workers > 1:
        for i, workload in enumerate(workloads):
            if workload.job is not None or workload.type in ("trace", "replay"):
                continue
            largest = _largest_fixed_units(workload.cost)
            whole = _unit_capacity(quotas.get(workload.provider))
            if whole is None or largest is None:
                continue
            capacity = whole / fleet.workers
            if largest > capacity:
                raise reader.error(
                    "fleet.quota",
                    f"a split over {fleet.workers} workers leaves each {_fmt(capacity)} units of "
                    f"{workload.provider!r} at once, less than workloads[{i}]'s tasks of {largest} units "
                    '(they could never be granted); use quota = "shared" or fewer workers',
                )
    return fleet
