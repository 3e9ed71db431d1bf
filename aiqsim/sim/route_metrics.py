"""Summary keys per deployment of a route: who got the calls, how fast they answered, what they cost.

Present when the scenario has ``[[routes]]``, for every provider a route lists, each key
``deployment_<provider>_<name>`` (:data:`DEPLOYMENT_KEYS`). Both result modes compute them:
:func:`summarize_deployments` from the final records and the providers' ledger,
:class:`StreamingDeployments` from the ledger's executions and the task transitions as they happen
(the percentile within the streaming histogram's relative error; shares and costs exact).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from aiqsim.core.task import SUCCEEDED, TaskRecord
from aiqsim.scheduler.events import TaskTransition
from aiqsim.sim.config import Scenario
from aiqsim.sim.streaming import DEFAULT_RELATIVE_ERROR, ExactSum, RelativeErrorHistogram

__all__ = ["DEPLOYMENT_KEYS", "StreamingDeployments", "deployment_key_meaning", "summarize_deployments"]

DEPLOYMENT_KEYS: dict[str, str] = {
    "call_share": "this deployment's share of the provider calls made to its route's deployments (every "
    "attempt counts, 429s included)",
    "success_latency_p99_s": "99th percentile arrival-to-result time of the tasks whose result this "
    "deployment produced (ended succeeded on it) (s); NaN when none did",
    "cost": "money this deployment billed",
}
"""Per-deployment summary keys, each ``deployment_<provider>_<name>``."""

_DEPLOYMENT_KEY = re.compile(r"deployment_(.+)_(" + "|".join(DEPLOYMENT_KEYS) + r")$")


def deployment_key_meaning(key: str) -> str:
    """The definition of a per-deployment summary key, or ``""`` when it is none."""
    match = _DEPLOYMENT_KEY.match(key)
    if match is None:
        return ""
    return f"deployment {match.group(1)}: {DEPLOYMENT_KEYS[match.group(2)]}"


def _deployments(scenario: Scenario) -> tuple[list[str], dict[str, int]]:
    """Every provider a route lists, once, in the routes' order, and the index of its (first) route."""
    deployments: list[str] = []
    route_of: dict[str, int] = {}
    for index, route in enumerate(scenario.routes):
        for provider in route.providers:
            if provider not in route_of:
                route_of[provider] = index
                deployments.append(provider)
    return deployments, route_of


def _keys(
    scenario: Scenario,
    calls: Mapping[str, int],
    p99: Mapping[str, float],
    costs: Mapping[str, float],
) -> dict[str, float]:
    deployments, route_of = _deployments(scenario)
    route_calls = [0] * len(scenario.routes)
    for name in deployments:
        route_calls[route_of[name]] += calls[name]
    summary: dict[str, float] = {}
    for name in deployments:
        total = route_calls[route_of[name]]
        summary[f"deployment_{name}_call_share"] = calls[name] / total if total else math.nan
        summary[f"deployment_{name}_success_latency_p99_s"] = p99[name]
        summary[f"deployment_{name}_cost"] = costs[name]
    return summary


def summarize_deployments(
    scenario: Scenario,
    records: Sequence[TaskRecord],
    executions: Sequence[Any],
    arrivals: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """:data:`DEPLOYMENT_KEYS` for every provider of every route, from a run's records and ledger."""
    deployments, _ = _deployments(scenario)
    calls = dict.fromkeys(deployments, 0)
    costs: dict[str, list[float]] = {name: [] for name in deployments}
    for e in executions:
        if e.provider in calls:
            calls[e.provider] += 1
            if e.billed:
                costs[e.provider].append(e.cost)
    latencies: dict[str, list[float]] = {name: [] for name in deployments}
    for r in records:
        # succeeded only: a deduped task's answer came from its owner's run
        if r.status is SUCCEEDED and r.provider in latencies and r.finished_at is not None:
            arrived = arrivals.get(r.id, r.created_at) if arrivals else r.created_at
            latencies[r.provider].append(r.finished_at - arrived)
    p99 = {
        name: float(np.percentile(np.asarray(values, dtype=float), 99)) if values else math.nan
        for name, values in latencies.items()
    }
    return _keys(scenario, calls, p99, {name: math.fsum(values) for name, values in costs.items()})


class StreamingDeployments:
    """The per-deployment keys as the run goes, from the ledger's :meth:`execution` records and the
    scheduler's task transitions (:meth:`event`). Per-task state lives from a task's arrival until it
    ends (memory flat in the number of tasks)."""

    def __init__(self, scenario: Scenario, relative_error: float = DEFAULT_RELATIVE_ERROR) -> None:
        self.scenario = scenario
        deployments, _ = _deployments(scenario)
        self.calls = dict.fromkeys(deployments, 0)
        self.costs = {name: ExactSum() for name in deployments}
        self.latency = {name: RelativeErrorHistogram(relative_error) for name in deployments}
        self._arrivals: dict[str, float] = {}

    def arrival(self, task_id: str, time: float) -> None:
        """A user submitted ``task_id`` at ``time`` (its latency counts from here)."""
        self._arrivals[task_id] = time

    def rejected(self, task_id: str) -> None:
        """The scheduler refused ``task_id`` at the door."""
        self._arrivals.pop(task_id, None)

    def execution(self, execution: Any) -> None:
        """One provider execution from the ledger (a call a deployment received)."""
        if execution.provider in self.calls:
            self.calls[execution.provider] += 1
            if execution.billed:
                self.costs[execution.provider].add(execution.cost)

    def event(self, event: Any) -> None:
        """Consume one scheduler event (only task transitions are read)."""
        if not isinstance(event, TaskTransition):
            return
        if event.old is None:
            self._arrivals.setdefault(event.task_id, event.time)
        if event.new in _TERMINAL:
            arrived = self._arrivals.pop(event.task_id, None)
            latency = self.latency.get(event.provider)
            if event.new == "succeeded" and latency is not None and arrived is not None:
                latency.add(event.time - arrived)

    def summary(self) -> dict[str, float]:
        """The per-deployment keys, as :func:`summarize_deployments` names them."""
        p99 = {name: histogram.percentile(99) for name, histogram in self.latency.items()}
        costs = {name: total.value for name, total in self.costs.items()}
        return _keys(self.scenario, self.calls, p99, costs)


_TERMINAL = frozenset({"succeeded", "failed", "cancelled", "deduped"})
