"""A scenario's arrivals as a lazy, time-ordered stream (for long runs in streaming mode).

:func:`aiqsim.sim.workloads.generate_arrivals` builds every arrival of the run up front (~0.5 KB
each: 8.6M arrivals would be gigabytes). :func:`iter_arrivals` yields the *same* arrivals in the
*same* order, but generates a workload's arrivals only when the clock reaches its ``start_s`` and
drops each arrival once handed out, so memory holds the workloads in progress, not the whole run.
A day is best written as several workloads (e.g. one per hour, which also gives it a diurnal shape).
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Iterator

from aiqsim.sim.config import Scenario
from aiqsim.sim.workloads import Arrival, workload_arrivals


def iter_arrivals(scenario: Scenario, rng: random.Random) -> Iterator[Arrival]:
    """Every non-job workload's arrivals, merged by time (ties: workload order, then each workload's
    own order): exactly :func:`~aiqsim.sim.workloads.generate_arrivals` for the same ``rng`` state.

    Correct because a workload never arrives before its ``start_s`` (Poisson times, bursts, trace
    offsets and double-click gaps all count forward from it): a workload is generated as soon as the
    next arrival to hand out is not earlier than its ``start_s``.
    """
    seeds = [rng.getrandbits(64) for _ in scenario.workloads]  # the same draws as generate_arrivals
    pending = sorted(
        (workload.start_s, index) for index, workload in enumerate(scenario.workloads) if workload.job is None
    )
    pending.reverse()  # pop() takes the earliest start
    streams: dict[int, deque[Arrival]] = {}
    heap: list[tuple[float, int]] = []  # (time of the workload's next arrival, workload index)

    def activate(index: int) -> None:
        workload = scenario.workloads[index]
        arrivals = deque(workload_arrivals(index, workload, scenario, random.Random(seeds[index])))
        if arrivals:
            streams[index] = arrivals
            heapq.heappush(heap, (arrivals[0].time, index))

    while heap or pending:
        while pending and (not heap or pending[-1][0] <= heap[0][0]):
            activate(pending.pop()[1])
        if not heap:
            continue
        _, index = heapq.heappop(heap)
        stream = streams[index]
        arrival = stream.popleft()
        if stream:
            heapq.heappush(heap, (stream[0].time, index))
        else:
            del streams[index]
        yield arrival
