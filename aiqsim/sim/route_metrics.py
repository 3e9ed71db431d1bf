"""Summary keys per deployment of a route: who got the calls, how fast they answered, what they cost.

Present when the scenario has ``[[routes]]``, for every provider a route lists, each key
``deployment_<provider>_<name>`` (:data:`DEPLOYMENT_KEYS`). Computed from the kept records (the
default ``records="full"`` mode); a ``records="summary"`` run does not report them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from aiqsim.core.task import SUCCEEDED, TaskRecord
from aiqsim.sim.config import Scenario

__all__ = ["DEPLOYMENT_KEYS", "deployment_key_meaning", "summarize_deployments"]

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


def summarize_deployments(
    scenario: Scenario,
    records: Sequence[TaskRecord],
    executions: Sequence[Any],
    arrivals: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """:data:`DEPLOYMENT_KEYS` for every provider of every route, from a run's records and ledger."""
    deployments: list[str] = []
    route_of: dict[str, int] = {}
    for index, route in enumerate(scenario.routes):
        for provider in route.providers:
            if provider not in route_of:
                route_of[provider] = index
                deployments.append(provider)
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
    route_calls = [0] * len(scenario.routes)
    for name in deployments:
        route_calls[route_of[name]] += calls[name]
    summary: dict[str, float] = {}
    for name in deployments:
        total = route_calls[route_of[name]]
        summary[f"deployment_{name}_call_share"] = calls[name] / total if total else math.nan
        values = latencies[name]
        summary[f"deployment_{name}_success_latency_p99_s"] = (
            float(np.percentile(np.asarray(values, dtype=float), 99)) if values else math.nan
        )
        summary[f"deployment_{name}_cost"] = math.fsum(costs[name])
    return summary
