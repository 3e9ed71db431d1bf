"""Arrivals of jobs: a scenario's ``job = "..."`` workloads turned into time-ordered job submissions.

The arrival processes are the call workloads' own (Poisson, burst, double-click; see
:mod:`aiqsim.sim.workloads`). What differs is what arrives: a :class:`JobArrival` carries the
job's *inputs*, everything random about the job drawn once when the user acts: the size of every
stage whose size is a distribution and the fan-out of every stage (paragraph count). Sizes that
follow from an earlier stage's output (``from_stage``) are computed when that stage is done, by
the stage's build function (:mod:`aiqsim.sim.job_templates`). The clicks of a double-click
share one draw, so they submit identical jobs (same inputs, same job fingerprint).

Generation is pure: each job workload draws from its own generator, seeded from the run's seed and
the workload's index, so adding a job workload does not reshuffle any other workload.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aiqsim.core.errors import ConfigurationError
from aiqsim.sim.config import Scenario, WorkloadConfig
from aiqsim.sim.job_config import MAX_FANOUT, FanoutConfig, JobConfig, StageSizeConfig
from aiqsim.sim.workloads import MAX_ARRIVALS_PER_WORKLOAD, WorkloadTooLargeError, _action_times

__all__ = [
    "JobArrival",
    "draw_fanout",
    "draw_stage_units",
    "generate_job_arrivals",
    "iter_job_workload_arrivals",
    "job_template",
]


@dataclass(frozen=True, slots=True)
class JobArrival:
    """One job submission: at ``time`` submit template ``job`` with ``inputs`` at ``priority``.

    ``inputs`` is ``{"input": label, "units": {stage: units}, "fanout": {stage: calls}}`` (plain
    JSON data, so the scheduler can fingerprint and persist it). ``action`` names the user action:
    the clicks of one double-click share it and carry identical inputs. ``tenant``: the workload's
    tenant, given to ``submit_job(tenant=...)`` (``None``: the default tenant).
    """

    time: float
    job_id: str
    job: str
    priority: str
    inputs: dict[str, Any]
    action: str
    tenant: str | None = None


def job_template(scenario: Scenario, name: str) -> JobConfig:
    """The scenario's job template called ``name``; ``KeyError`` if there is none."""
    for job in scenario.jobs:
        if job.name == name:
            return job
    raise KeyError(name)


def _draw(dist: str, mean: float, sigma: float, low: float, high: float, rng: random.Random) -> float:
    if dist == "fixed":
        return mean
    if dist == "lognormal":
        # mean of a lognormal is exp(mu + sigma^2 / 2): choose mu so the mean is ``mean``
        return rng.lognormvariate(math.log(mean) - sigma**2 / 2.0, sigma)
    if dist == "uniform":
        return rng.uniform(low, high)
    raise ConfigurationError(f"unknown distribution {dist!r}")


def draw_stage_units(size: StageSizeConfig, rng: random.Random) -> int:
    """A stage's total units for one job, drawn from ``size`` (whole units, at least 1).

    Only for drawn sizes; a ``from_stage`` size depends on an earlier stage's output.
    """
    if size.dist == "from_stage":
        raise ConfigurationError("a from_stage size is computed from an earlier stage's output, not drawn")
    return max(1, round(_draw(size.dist, size.mean, size.sigma, size.low, size.high, rng)))


def draw_fanout(fanout: FanoutConfig, rng: random.Random) -> int:
    """How many calls a stage makes for one job: whole, in [1, :data:`MAX_FANOUT`]."""
    value = _draw(fanout.dist, fanout.mean, fanout.sigma, fanout.low, fanout.high, rng)
    return min(MAX_FANOUT, max(1, round(value)))


def _draw_inputs(template: JobConfig, label: str, rng: random.Random) -> dict[str, Any]:
    units: dict[str, int] = {}
    fanout: dict[str, int] = {}
    for stage in template.stages:  # declaration order: a fixed number of draws per stage kind
        if stage.size.dist != "from_stage":
            units[stage.name] = draw_stage_units(stage.size, rng)
        fanout[stage.name] = draw_fanout(stage.fanout, rng)
    return {"input": label, "units": units, "fanout": fanout}


def job_workload_arrivals(
    index: int, workload: WorkloadConfig, scenario: Scenario, rng: random.Random
) -> list[JobArrival]:
    """The job arrivals of workload number ``index`` alone, sorted by time.

    Job ids read ``w{index}-job-{n:06d}``, actions ``w{index}-a{n:06d}``, inputs
    ``w{index}-input-{k:06d}`` (with ``distinct_inputs``, inputs recur and so do their draws).
    """
    return list(iter_job_workload_arrivals(index, workload, scenario, rng))


def iter_job_workload_arrivals(
    index: int, workload: WorkloadConfig, scenario: Scenario, rng: random.Random
) -> Iterator[JobArrival]:
    """:func:`job_workload_arrivals` one at a time: the same draws in the same order, but each job's
    inputs are drawn when it is handed out, so only the action times are held (not every job's
    inputs; for the streaming mode, :func:`aiqsim.sim.arrival_stream.iter_job_arrivals`)."""
    assert workload.job is not None, "only job workloads have job arrivals"
    template = job_template(scenario, workload.job)
    times = sorted(_action_times(workload, scenario.duration_s, rng))
    clicks = workload.clicks if workload.type == "double_click" else 1
    if len(times) * clicks > MAX_ARRIVALS_PER_WORKLOAD:  # each click submits a job
        raise WorkloadTooLargeError(
            index,
            f"would generate more than {MAX_ARRIVALS_PER_WORKLOAD:,} jobs; "
            "lower its rate_per_s, count or clicks, or shorten the scenario",
        )
    drawn: dict[int, dict[str, Any]] = {}
    pending: list[tuple[float, int, int, dict[str, Any]]] = []  # (time, action, click, inputs): a heap
    serial = 0

    def release(until: float) -> Iterator[JobArrival]:
        """Hand out the clicks due at or before ``until`` (no later action can sort before them)."""
        nonlocal serial
        while pending and pending[0][0] <= until:
            time, number, _click, inputs = heapq.heappop(pending)
            yield JobArrival(
                time=time,
                job_id=f"w{index}-job-{serial:06d}",
                job=template.name,
                priority=workload.priority,
                inputs=inputs,
                action=f"w{index}-a{number:06d}",
                tenant=workload.tenant,
            )
            serial += 1

    for number, time in enumerate(times):
        yield from release(time)
        if workload.distinct_inputs is None:  # every action its own input: nothing to remember
            inputs = _draw_inputs(template, f"w{index}-input-{number:06d}", rng)
        else:
            k = rng.randrange(workload.distinct_inputs)
            if k not in drawn:
                drawn[k] = _draw_inputs(template, f"w{index}-input-{k:06d}", rng)
            inputs = drawn[k]
        for click in range(clicks):
            heapq.heappush(pending, (time + click * workload.click_gap_s, number, click, inputs))
    yield from release(math.inf)


def generate_job_arrivals(scenario: Scenario, seed: int) -> list[JobArrival]:
    """Every job workload's arrivals merged into one list sorted by time (ties: workload order).

    Workload ``i`` draws from ``random.Random(f"{seed}:jobs:{i}")``: deterministic per seed, and
    independent of the other workloads.
    """
    merged: list[JobArrival] = []
    for index, workload in enumerate(scenario.workloads):
        if workload.job is not None:
            rng = random.Random(f"{seed}:jobs:{index}")
            merged.extend(job_workload_arrivals(index, workload, scenario, rng))
    merged.sort(key=lambda arrival: arrival.time)
    return merged
