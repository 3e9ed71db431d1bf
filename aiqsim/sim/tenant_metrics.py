"""Per-tenant summary keys: how fast each tenant's calls succeeded and what share of service it got.

Present when the scenario declares ``[tenants.NAME]`` tables, one pair per declared tenant, each
``tenant_<NAME>_<key>`` (:data:`TENANT_KEYS`):

- ``success_latency_p99_s``: the 99th percentile arrival-to-result time of the tenant's tasks that
  succeeded (ended succeeded or deduped), as ``success_latency_p99_s`` is for all tasks;
- ``service_share``: the tenant's share of the service the lanes granted, counted in the unit the
  fair sharing weighs (:func:`aiqsim.scheduler.tenants.tenant_charge`: each task that started
  counts its cost estimate, at least 1), over every task that started (the default tenant's
  included, so the declared tenants' shares add up to 1 less the default tenant's).

Both result modes compute them: :func:`summarize_tenants` from the final records,
:class:`StreamingTenants` from the scheduler's task transitions as they happen (the percentile within
the streaming histogram's relative error; the share exact, as long as no crash makes a task start
twice).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from aiqsim.core.task import TaskRecord
from aiqsim.observability.definitions import SUCCESS_STATUSES
from aiqsim.scheduler.events import TaskTransition
from aiqsim.scheduler.tenants import tenant_charge
from aiqsim.sim.config import Scenario
from aiqsim.sim.streaming import DEFAULT_RELATIVE_ERROR, ExactSum, RelativeErrorHistogram

__all__ = ["TENANT_KEYS", "StreamingTenants", "summarize_tenants", "tenant_key", "tenant_key_meaning"]

TENANT_KEYS: dict[str, str] = {
    "success_latency_p99_s": "99th percentile arrival-to-result time of this tenant's tasks that "
    "succeeded (s)",
    "service_share": "this tenant's share of the service granted: the cost estimates (each at least 1) of "
    "its tasks that started, over those of every task that started (the unit the fair sharing weighs)",
}
"""Per-tenant summary keys, each ``tenant_<NAME>_<key>``."""

_TENANT_KEY = re.compile(r"tenant_(.+)_(" + "|".join(TENANT_KEYS) + r")$")
_SUCCESS = frozenset(status.value for status in SUCCESS_STATUSES)
_TERMINAL = frozenset({"succeeded", "failed", "cancelled", "deduped"})


def tenant_key(tenant: str, key: str) -> str:
    """The summary key of ``key`` (one of :data:`TENANT_KEYS`) for ``tenant``."""
    return f"tenant_{tenant}_{key}"


def tenant_key_meaning(key: str) -> str:
    """The definition of a per-tenant summary key, or ``""`` when it is none."""
    match = _TENANT_KEY.match(key)
    if match is None:
        return ""
    return f"tenant {match.group(1)}: {TENANT_KEYS[match.group(2)]}"


def _keys(
    tenants: Sequence[str], p99: Mapping[str, float], served: Mapping[str, float], total: float
) -> dict[str, float]:
    summary: dict[str, float] = {}
    for name in tenants:
        summary[tenant_key(name, "success_latency_p99_s")] = p99[name]
        summary[tenant_key(name, "service_share")] = served[name] / total if total > 0 else math.nan
    return summary


def summarize_tenants(
    scenario: Scenario, records: Sequence[TaskRecord], arrivals: Mapping[str, float] | None = None
) -> dict[str, float]:
    """The per-tenant keys of the scenario's declared tenants, from a run's final records."""
    tenants = list(scenario.tenants)
    latencies: dict[str, list[float]] = {name: [] for name in tenants}
    served = {name: 0.0 for name in tenants}
    shares: dict[str | None, list[float]] = {}
    for r in records:
        if r.started_at is not None:
            shares.setdefault(r.tenant if r.tenant in served else None, []).append(
                tenant_charge(r.cost_estimate, 1.0)
            )
        if r.tenant in latencies and r.status in SUCCESS_STATUSES and r.finished_at is not None:
            arrived = arrivals.get(r.id, r.created_at) if arrivals else r.created_at
            latencies[r.tenant].append(r.finished_at - arrived)
    for name in tenants:
        served[name] = math.fsum(shares.get(name, ()))
    total = math.fsum(math.fsum(charges) for charges in shares.values())
    p99 = {
        name: float(np.percentile(values, 99)) if values else math.nan for name, values in latencies.items()
    }
    return _keys(tenants, p99, served, total)


class StreamingTenants:
    """The per-tenant keys as the run goes, from :meth:`arrival` and every :meth:`event`. Per-task
    state lives from a task's arrival until it ends (memory flat in the number of tasks)."""

    def __init__(self, scenario: Scenario, relative_error: float = DEFAULT_RELATIVE_ERROR) -> None:
        self.tenants = list(scenario.tenants)
        self.latency = {name: RelativeErrorHistogram(relative_error) for name in self.tenants}
        self.served = {name: ExactSum() for name in self.tenants}
        self.total = ExactSum()
        self._arrivals: dict[str, float] = {}
        self._tasks: dict[str, list[Any]] = {}
        """Task id -> [tenant, arrived, started] while the task is live."""

    def arrival(self, task_id: str, time: float) -> None:
        """A user submitted ``task_id`` at ``time`` (its latency counts from here)."""
        self._arrivals[task_id] = time

    def rejected(self, task_id: str) -> None:
        """The scheduler refused ``task_id`` at the door."""
        self._arrivals.pop(task_id, None)

    def event(self, event: Any) -> None:
        """Consume one scheduler event (only task transitions are read)."""
        if not isinstance(event, TaskTransition):
            return
        task_id = event.task_id
        if event.old is None:
            arrived = self._arrivals.pop(task_id, event.time)
            self._tasks[task_id] = [event.tenant, arrived, False]
        task = self._tasks.get(task_id)
        if task is None:
            return
        new = event.new
        if new == "running" and not task[2]:
            task[2] = True
            charge = tenant_charge(event.cost_estimate or 0.0, 1.0)
            self.total.add(charge)
            served = self.served.get(task[0])
            if served is not None:
                served.add(charge)
        if new in _TERMINAL:
            del self._tasks[task_id]
            latency = self.latency.get(task[0])
            if latency is not None and new in _SUCCESS:
                latency.add(event.time - task[1])

    def summary(self) -> dict[str, float]:
        """The per-tenant keys, as :func:`summarize_tenants` names them."""
        p99 = {name: self.latency[name].percentile(99) for name in self.tenants}
        served = {name: self.served[name].value for name in self.tenants}
        return _keys(self.tenants, p99, served, self.total.value)
