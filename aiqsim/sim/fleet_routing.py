"""Which worker of a simulated fleet receives each arrival (the load balancer in front of the fleet).

``round_robin`` deals arrivals out in turn; ``weighted`` sends each arrival to worker ``i`` with
probability ``weights[i] / sum(weights)`` — an uneven load, as when users are pinned to the host
their session landed on. The draw uses its own seeded stream, so routing never shifts the
workload's or the providers' random numbers, and a run replays exactly.
"""

from __future__ import annotations

import itertools
import random

from aiqsim.sim.config import FleetConfig

WORKER_ID_PREFIX = "worker-"
"""Workers of a simulated fleet are ``Scheduler(worker_id="worker-0")``, ``"worker-1"``, ..."""


def fleet_worker_id(index: int) -> str:
    """The ``worker_id`` of the fleet's worker ``index``."""
    return f"{WORKER_ID_PREFIX}{index}"


def fleet_worker_index(worker_id: str | None) -> int | None:
    """The index of a fleet worker from a task record's ``worker``: ``None`` (the single scheduler) is 0;
    an id the simulated fleet did not give (a store shared with other processes) is ``None``."""
    if worker_id is None:
        return 0
    digits = worker_id[len(WORKER_ID_PREFIX) :]
    if not worker_id.startswith(WORKER_ID_PREFIX) or not (digits.isascii() and digits.isdigit()):
        return None
    return int(digits)


class ArrivalRouter:
    """Picks the worker for each arrival, in arrival order, as ``fleet`` says."""

    def __init__(self, fleet: FleetConfig, rng: random.Random) -> None:
        self.workers = fleet.workers
        self.routing = fleet.routing
        self._rng = rng
        self._turn = itertools.count()
        self._cumulative = list(itertools.accumulate(fleet.weights)) if fleet.routing == "weighted" else []

    def route(self) -> int:
        """The index of the worker that receives the next arrival."""
        if self.workers == 1:
            return 0
        if self.routing == "weighted":
            return self._rng.choices(range(self.workers), cum_weights=self._cumulative)[0]
        return next(self._turn) % self.workers
