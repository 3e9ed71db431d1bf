"""A scenario's arrivals as a lazy, time-ordered stream (for long runs in streaming mode).

:func:`aiqsim.sim.workloads.generate_arrivals` builds every arrival of the run up front (~0.5 KB
each: 8.6M arrivals would be gigabytes). :func:`iter_arrivals` yields the *same* arrivals in the
*same* order, but generates a workload's arrivals only when the clock reaches its ``start_s`` and
drops each arrival once handed out, so memory holds the workloads in progress, not the whole run.
:func:`iter_job_arrivals` does the same for the job workloads
(:func:`aiqsim.sim.job_workloads.generate_job_arrivals`).
A day is best written as several workloads (e.g. one per hour, which also gives it a diurnal shape).
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from aiqsim.sim.config import Scenario
from aiqsim.sim.job_workloads import JobArrival, iter_job_workload_arrivals
from aiqsim.sim.workloads import Arrival, workload_arrivals

_A = TypeVar("_A", bound=Any)


def iter_arrivals(scenario: Scenario, rng: random.Random) -> Iterator[Arrival]:
    """Every non-job workload's arrivals, merged by time (ties: workload order, then each workload's
    own order): exactly :func:`~aiqsim.sim.workloads.generate_arrivals` for the same ``rng`` state.

    Correct because a workload never arrives before its ``start_s`` (Poisson times, bursts, trace
    offsets and double-click gaps all count forward from it): a workload is generated as soon as the
    next arrival to hand out is not earlier than its ``start_s``.
    """
    seeds = [rng.getrandbits(64) for _ in scenario.workloads]  # the same draws as generate_arrivals

    def generate(index: int) -> Iterator[Arrival]:
        arrivals = deque(
            workload_arrivals(index, scenario.workloads[index], scenario, random.Random(seeds[index]))
        )
        while arrivals:  # each arrival dropped once handed out
            yield arrivals.popleft()

    yield from _merged(scenario, [i for i, w in enumerate(scenario.workloads) if w.job is None], generate)


def iter_job_arrivals(scenario: Scenario, seed: int) -> Iterator[JobArrival]:
    """Every job workload's arrivals, merged by time (ties: workload order, then each workload's own
    order): exactly :func:`~aiqsim.sim.job_workloads.generate_job_arrivals` for the same ``seed``,
    each workload started when the clock reaches its ``start_s`` (same argument as above) and its
    jobs' inputs drawn one job at a time (only its action times are held)."""

    def generate(index: int) -> Iterator[JobArrival]:
        rng = random.Random(f"{seed}:jobs:{index}")  # generate_job_arrivals' generator for workload index
        return iter_job_workload_arrivals(index, scenario.workloads[index], scenario, rng)

    yield from _merged(scenario, [i for i, w in enumerate(scenario.workloads) if w.job is not None], generate)


def _merged(scenario: Scenario, indices: list[int], generate: Callable[[int], Iterable[_A]]) -> Iterator[_A]:
    """The arrivals of workloads ``indices`` merged by time, each workload's (``generate``, which may
    be lazy itself) started only when the next arrival to hand out is not earlier than its ``start_s``."""
    pending = sorted((scenario.workloads[index].start_s, index) for index in indices)
    pending.reverse()  # pop() takes the earliest start
    streams: dict[int, tuple[_A, Iterator[_A]]] = {}  # workload -> (its next arrival, the rest)
    heap: list[tuple[float, int]] = []  # (time of the workload's next arrival, workload index)

    def advance(index: int, rest: Iterator[_A]) -> None:
        following = next(rest, None)
        if following is None:
            streams.pop(index, None)
        else:
            streams[index] = (following, rest)
            heapq.heappush(heap, (following.time, index))

    while heap or pending:
        while pending and (not heap or pending[-1][0] <= heap[0][0]):
            index = pending.pop()[1]
            advance(index, iter(generate(index)))
        if not heap:
            continue
        _, index = heapq.heappop(heap)
        arrival, rest = streams[index]
        advance(index, rest)
        yield arrival
