"""Fleet summary keys: how much of the account's limit a fleet of workers used, and how much it wasted.

Measured per provider that has a server-side limit (units per minute if it has one, else
requests per minute), over the *offered window*: from the first to the last submission of a
task for that provider — while users were asking for work. Outside it the fleet only drains.

- offered load: work submitted in the window / the limit over the window (> 1: saturated);
- utilisation: work the provider admitted (every attempt it executed, not a 429) that started in
  the window / the limit over the window;
- wasted capacity: ``max(0, min(offered, limit) - admitted) / limit`` — the part of the limit that
  was both wanted and available but not used. With a saturating load this is ``1 - utilisation``;
  a quota split statically over workers with uneven traffic wastes the idle workers' shares.

Ratios of several providers are averaged, like ``quota_utilization``. Per-worker keys
(``worker{i}_...``) say how the offered load and the admitted work were spread over the fleet.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from aiqsim.core.task import TaskRecord, TaskStatus
from aiqsim.sim.config import Scenario
from aiqsim.sim.fleet_routing import fleet_worker_index

FLEET_SUMMARY_KEYS: dict[str, str] = {
    "fleet_workers": "scheduler instances in the fleet ([fleet] workers)",
    "fleet_offered_load": "work submitted while arrivals lasted / the provider's server-side limit over that "
    "window (> 1: the load exceeds the limit; units if the provider has a units limit, else requests; mean "
    "over providers with a server limit)",
    "fleet_utilization": "work the provider admitted (executed, not 429) that started while arrivals lasted "
    "/ its server-side limit over that window, whole fleet",
    "wasted_capacity": "max(0, min(offered, limit) - admitted) / limit over the same window: the share of "
    "the limit that was wanted and available but not used",
}
"""Fleet summary keys (present when ``[fleet] workers`` > 1) with their definitions."""

WORKER_KEYS: dict[str, str] = {
    "offered_share": "this worker's share of the work submitted while arrivals lasted",
    "utilization": "work this worker got admitted / the provider's whole limit over the offered window "
    "(the workers' values add up to fleet_utilization)",
    "latency_p95_s": "95th percentile arrival-to-terminal time of this worker's tasks (s)",
}
"""Per-worker summary keys, each ``worker{i}_<name>``."""

_WORKER_KEY = re.compile(r"worker(\d+)_(\w+)$")


def fleet_key_meaning(key: str) -> str:
    """The definition of a fleet summary key (fixed or per worker), or ``""`` when it is none."""
    if key in FLEET_SUMMARY_KEYS:
        return FLEET_SUMMARY_KEYS[key]
    match = _WORKER_KEY.match(key)
    if match and match.group(2) in WORKER_KEYS:
        return f"worker {match.group(1)}: {WORKER_KEYS[match.group(2)]}"
    return ""


def _work(units: float, by_units: bool) -> float:
    return float(units) if by_units else 1.0


def summarize_fleet(
    scenario: Scenario,
    records: Sequence[TaskRecord],
    executions: Sequence[Any],
    rejected: Iterable[Mapping[str, Any]] = (),
    arrivals: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """:data:`FLEET_SUMMARY_KEYS` and the per-worker keys for ``workers`` workers."""
    workers = scenario.fleet.workers
    worker_of = {r.id: fleet_worker_index(r.worker) or 0 for r in records}  # foreign ids count as 0
    rejected = list(rejected)
    offered_ratio, used_ratio, wasted_ratio = [], [], []
    offered_by_worker = np.zeros((0, workers))
    admitted_by_worker = np.zeros((0, workers))
    for provider in scenario.providers:
        by_units = provider.server_units_per_min is not None
        per_min = provider.server_units_per_min if by_units else provider.server_requests_per_min
        if per_min is None:
            continue
        submissions = [
            (r.created_at, r.cost_estimate, worker_of[r.id])
            for r in records
            if r.provider == provider.name and r.status is not TaskStatus.DEDUPED
        ]
        submissions += [
            (row["arrived_at"], row.get("cost_estimate") or 0.0, int(row.get("worker", 0)))
            for row in rejected
            if row.get("provider") == provider.name
        ]
        if not submissions:
            continue
        start = min(t for t, _, _ in submissions)
        end = max(t for t, _, _ in submissions)
        if end <= start:
            continue
        limit = per_min / 60.0 * (end - start)
        offered = np.zeros(workers)
        for _, cost, worker in submissions:
            offered[worker] += _work(cost, by_units)
        admitted = np.zeros(workers)
        for e in executions:
            if e.provider != provider.name or e.outcome in ("rate_limited", "replay"):
                continue
            if start <= e.start <= end and e.task_id in worker_of:
                admitted[worker_of[e.task_id]] += _work(e.units, by_units)
        offered_ratio.append(offered.sum() / limit)
        used_ratio.append(admitted.sum() / limit)
        wasted_ratio.append(max(0.0, min(offered.sum(), limit) - admitted.sum()) / limit)
        offered_by_worker = np.vstack([offered_by_worker, offered / max(offered.sum(), 1e-12)])
        admitted_by_worker = np.vstack([admitted_by_worker, admitted / limit])

    def mean(values: Sequence[float] | np.ndarray) -> float:
        return float(np.mean(values)) if len(values) else math.nan

    summary: dict[str, float] = {
        "fleet_workers": workers,
        "fleet_offered_load": mean(offered_ratio),
        "fleet_utilization": mean(used_ratio),
        "wasted_capacity": mean(wasted_ratio),
    }
    latencies: list[list[float]] = [[] for _ in range(workers)]
    for r in records:
        if r.status.is_terminal and r.finished_at is not None:
            arrived = arrivals.get(r.id, r.created_at) if arrivals else r.created_at
            latencies[worker_of[r.id]].append(r.finished_at - arrived)
    for i in range(workers):
        summary[f"worker{i}_offered_share"] = (
            mean(offered_by_worker[:, i]) if len(offered_by_worker) else math.nan
        )
        summary[f"worker{i}_utilization"] = (
            mean(admitted_by_worker[:, i]) if len(admitted_by_worker) else math.nan
        )
        summary[f"worker{i}_latency_p95_s"] = (
            float(np.percentile(latencies[i], 95)) if latencies[i] else math.nan
        )
    return summary
