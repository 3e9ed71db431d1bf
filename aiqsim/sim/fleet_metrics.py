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

import heapq
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
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


class FleetLoad:
    """The fleet keys' running totals, fed one submission, execution and finished task at a time.

    Both result modes use it: full mode (:func:`summarize_fleet`) feeds it the final records, the
    streaming mode (:class:`aiqsim.sim.fleet_stream.StreamingFleet`) the run's events as they happen.
    Sums are exactly rounded (:class:`~aiqsim.sim.streaming.ExactSum`), so the keys do not depend on
    the order of the terms and the two modes agree to the last bit.

    An execution counts when it starts inside its provider's offered window, whose end (the last
    submission) is only known at the end of the run: executions that start after the latest
    submission seen so far wait in a heap until a later submission covers them. They are only the
    executions since the last submission (the drain), not the run's.
    """

    def __init__(self, scenario: Scenario, latencies: Sequence[Any]) -> None:
        from aiqsim.sim.streaming import ExactSum

        self.scenario = scenario
        self.workers = scenario.fleet.workers
        self.latencies = latencies
        """One sink per worker with ``add(value)`` (a list's ``append`` in full mode, a histogram in
        streaming mode), read by :meth:`summary` through ``worker_p95``."""
        self._by_units: dict[str, bool] = {}
        for provider in scenario.providers:
            by_units = provider.server_units_per_min is not None
            per_min = provider.server_units_per_min if by_units else provider.server_requests_per_min
            if per_min is not None:
                self._by_units[provider.name] = by_units
        self._window: dict[str, list[float]] = {}
        """Provider -> [first, last] submission time."""
        self._offered = {name: [ExactSum() for _ in range(self.workers)] for name in self._by_units}
        self._admitted = {name: [ExactSum() for _ in range(self.workers)] for name in self._by_units}
        self._later: dict[str, list[tuple[float, int, int, float]]] = {name: [] for name in self._by_units}
        self._serial = 0

    def submission(self, provider: str, time: float, cost: float | None, worker: int) -> None:
        """A task (not deduplicated) or a refused submission for ``provider`` at ``time``."""
        by_units = self._by_units.get(provider)
        if by_units is None:
            return
        self._offered[provider][worker].add(_work(cost or 0.0, by_units))
        window = self._window.get(provider)
        if window is None:
            self._window[provider] = [time, time]
        else:
            window[0] = min(window[0], time)
            if time > window[1]:
                window[1] = time
                later, admitted = self._later[provider], self._admitted[provider]
                while later and later[0][0] <= time:
                    _, _, worker_index, work = heapq.heappop(later)
                    admitted[worker_index].add(work)

    def execution(self, provider: str, start: float, outcome: str, units: float, worker: int) -> None:
        """One provider ledger record of a task of ``worker`` (429s and replays are not admitted work)."""
        by_units = self._by_units.get(provider)
        if by_units is None or outcome in ("rate_limited", "replay"):
            return
        work = _work(units, by_units)
        window = self._window.get(provider)
        if window is not None and window[0] <= start <= window[1]:
            self._admitted[provider][worker].add(work)
        elif window is None or start > window[1]:
            self._serial += 1
            heapq.heappush(self._later[provider], (start, self._serial, worker, work))

    def summary(self, worker_p95: Callable[[Any], float]) -> dict[str, float]:
        """:data:`FLEET_SUMMARY_KEYS` and the per-worker keys (``worker_p95(sink)``: a sink's p95)."""
        workers = self.workers
        offered_ratio, used_ratio, wasted_ratio = [], [], []
        offered_by_worker = np.zeros((0, workers))
        admitted_by_worker = np.zeros((0, workers))
        for provider in self.scenario.providers:
            window = self._window.get(provider.name)
            if window is None:
                continue
            start, end = window
            if end <= start:
                continue
            by_units = self._by_units[provider.name]
            per_min = provider.server_units_per_min if by_units else provider.server_requests_per_min
            assert per_min is not None
            limit = per_min / 60.0 * (end - start)
            offered = np.array([s.value for s in self._offered[provider.name]])
            admitted = np.array([s.value for s in self._admitted[provider.name]])
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
        for i in range(workers):
            summary[f"worker{i}_offered_share"] = (
                mean(offered_by_worker[:, i]) if len(offered_by_worker) else math.nan
            )
            summary[f"worker{i}_utilization"] = (
                mean(admitted_by_worker[:, i]) if len(admitted_by_worker) else math.nan
            )
            summary[f"worker{i}_latency_p95_s"] = worker_p95(self.latencies[i])
        return summary


def summarize_fleet(
    scenario: Scenario,
    records: Sequence[TaskRecord],
    executions: Sequence[Any],
    rejected: Iterable[Mapping[str, Any]] = (),
    arrivals: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """:data:`FLEET_SUMMARY_KEYS` and the per-worker keys for ``workers`` workers, from a run's records."""
    latencies: list[list[float]] = [[] for _ in range(scenario.fleet.workers)]
    load = FleetLoad(scenario, latencies)
    worker_of = {r.id: fleet_worker_index(r.worker) or 0 for r in records}  # foreign ids count as 0
    for r in records:
        if r.status is not TaskStatus.DEDUPED:
            load.submission(r.provider, r.created_at, r.cost_estimate, worker_of[r.id])
    for row in rejected:
        provider = row.get("provider")
        if provider is not None:
            load.submission(provider, row["arrived_at"], row.get("cost_estimate"), int(row.get("worker", 0)))
    for e in executions:
        if e.task_id in worker_of:
            load.execution(e.provider, e.start, e.outcome, e.units, worker_of[e.task_id])
    for r in records:
        if r.status.is_terminal and r.finished_at is not None:
            arrived = arrivals.get(r.id, r.created_at) if arrivals else r.created_at
            latencies[worker_of[r.id]].append(r.finished_at - arrived)
    return load.summary(lambda values: float(np.percentile(values, 95)) if values else math.nan)
