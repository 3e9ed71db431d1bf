"""Streaming mode's side of a run: the accumulators, the retention rule and what the mode refuses.

:class:`StreamingRun` is what :func:`aiqsim.sim.simulate.simulate` plugs into the harness for
``records="summary"``: the scheduler's events and the provider ledger's executions go to a
:class:`~aiqsim.sim.streaming.StreamingSummary` and a :class:`~aiqsim.sim.streaming.StreamingTimeline`
instead of lists (and, when the scenario has them, to :class:`~aiqsim.sim.job_stream.StreamingJobs`
for the job keys and :class:`~aiqsim.sim.fleet_stream.StreamingFleet` for the fleet keys, each
fleet worker's events through its own :meth:`StreamingRun.sink`), and the store is purged by
:class:`~aiqsim.stores.retention.RetentionPolicy` with the key window as both TTLs. No scheduling
rule lives here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from aiqsim.core.errors import ConfigurationError
from aiqsim.sim.config import Scenario
from aiqsim.sim.fleet_stream import StreamingFleet
from aiqsim.sim.job_stream import StreamingJobs
from aiqsim.sim.route_metrics import StreamingDeployments
from aiqsim.sim.streaming import DEFAULT_KEY_WINDOW_S, StreamingSummary, StreamingTimeline
from aiqsim.sim.tenant_metrics import StreamingTenants
from aiqsim.stores.retention import RetentionPolicy


def check_streamable(scenario: Scenario, backend: Mapping[str, Any]) -> None:
    """Refuse (ConfigurationError) what streaming mode does not cover yet: providers supplied by the
    caller (a live run). Job workloads and a ``[fleet]`` of several workers are streamed
    (:mod:`aiqsim.sim.job_stream`, :mod:`aiqsim.sim.fleet_stream`)."""
    reasons = []
    if backend.get("providers") is not None:
        reasons.append("providers supplied by the caller (their ledger is not streamed)")
    if reasons:
        raise ConfigurationError(
            f"records='summary' does not support {', '.join(reasons)} in scenario {scenario.name!r}; "
            "use records='full'"
        )


class StreamingRun:
    """The accumulators and retention of one streaming run (``window_s``: the key window)."""

    def __init__(self, scenario: Scenario, window_s: float = DEFAULT_KEY_WINDOW_S) -> None:
        self.window_s = window_s
        self.summary = StreamingSummary(scenario, window_s=window_s)
        self.timeline = StreamingTimeline(scenario.timeline_step_s)
        self.fleet = StreamingFleet(scenario, window_s) if scenario.fleet.workers > 1 else None
        """The fleet keys' accumulators (``[fleet] workers`` > 1 only)."""
        has_jobs = any(w.job is not None for w in scenario.workloads)
        self.jobs = StreamingJobs(scenario, window_s) if has_jobs else None
        """The job keys' accumulators (scenarios with job workloads only)."""
        self.tenants = StreamingTenants(scenario) if scenario.tenants else None
        """The per-tenant keys' accumulators (scenarios with ``[tenants.NAME]`` tables only)."""
        self.deployments = StreamingDeployments(scenario) if scenario.routes else None
        """The per-deployment keys' accumulators (scenarios with ``[[routes]]`` only)."""
        self.retention = RetentionPolicy(
            finished_ttl_s=window_s, keys_ttl_s=window_s, interval_s=window_s / 2
        )
        """Retention in this mode: finished tasks and jobs, and their keys, go after the window."""

    def event(self, event: Any) -> None:
        """The scheduler's event sink (worker 0's, the only one without a ``[fleet]``)."""
        self.summary.event(event)
        self.timeline.event(event)
        if self.fleet is not None:
            self.fleet.event(event, 0)
        if self.jobs is not None:
            self.jobs.event(event)
        if self.tenants is not None:
            self.tenants.event(event)
        if self.deployments is not None:
            self.deployments.event(event)

    def sink(self, worker: int) -> Callable[[Any], None]:
        """The event sink of fleet worker ``worker`` (the fleet keys need to know whose task it is)."""
        if worker == 0 and self.fleet is None:
            return self.event

        def event(event: Any) -> None:
            self.summary.event(event)
            self.timeline.event(event)
            if self.fleet is not None:
                self.fleet.event(event, worker)
            if self.jobs is not None:
                self.jobs.event(event)
            if self.tenants is not None:
                self.tenants.event(event)
            if self.deployments is not None:
                self.deployments.event(event)

        return event

    def execution(self, execution: Any) -> None:
        """The provider ledger's ``on_record`` hook."""
        self.summary.execution(execution)
        self.timeline.execution(execution)
        if self.fleet is not None:
            self.fleet.execution(execution)
        if self.jobs is not None:
            self.jobs.execution(execution)
        if self.deployments is not None:
            self.deployments.execution(execution)

    def reconcile(self, store: Any) -> None:
        """After a simulated crash, with the store the restarted process opens (before recovery):
        take in the writes whose events the crash swallowed
        (:meth:`~aiqsim.sim.streaming.StreamingSummary.corrections`): the task keys as transitions,
        the job keys as stored states only (:meth:`~aiqsim.sim.job_stream.StreamingJobs.stored`),
        as the full-record mode reads them from the records and not from the events; the jobs
        first (:meth:`~aiqsim.sim.job_stream.StreamingJobs.reconcile`), which may name stage tasks."""
        if self.jobs is not None:
            self.jobs.reconcile(store)
        self.summary.drop_unstored(store)
        for event in self.summary.corrections(store):
            self.summary.event(event)
            if self.jobs is not None:
                self.jobs.stored(event)
            if self.tenants is not None:
                self.tenants.event(event)
            if self.deployments is not None:
                self.deployments.event(event)

    def arrival(self, task_id: str, time: float) -> None:
        """A user submitted task ``task_id`` at ``time``."""
        self.summary.arrival(task_id, time)
        if self.fleet is not None:
            self.fleet.arrival(task_id, time)
        if self.tenants is not None:
            self.tenants.arrival(task_id, time)
        if self.deployments is not None:
            self.deployments.arrival(task_id, time)

    def rejected(self, arrival: Any, worker: int) -> None:
        """``worker`` refused task ``arrival`` at the door (queue full, a cost no quota can grant)."""
        self.summary.rejected(arrival.task_id)
        if self.tenants is not None:
            self.tenants.rejected(arrival.task_id)
        if self.deployments is not None:
            self.deployments.rejected(arrival.task_id)
        if self.fleet is not None:
            self.fleet.rejected(
                arrival.task_id, arrival.provider, arrival.time, arrival.cost_estimate, worker
            )

    def job_arrival(self, job_id: str, time: float) -> None:
        """A user submitted job ``job_id`` at ``time`` (its latency counts from here)."""
        if self.jobs is not None:
            self.jobs.arrival(job_id, time)

    def job_rejected(self, job_id: str) -> None:
        """The scheduler refused job ``job_id`` at the door."""
        if self.jobs is not None:
            self.jobs.rejected(job_id)

    def summary_keys(self, sim_time_s: float, recoveries: Any) -> dict[str, Any]:
        """The run's whole summary: the task keys, then the fleet's, the deployments', the tenants' and
        the jobs' when present (the order of :class:`~aiqsim.sim.simulate.SimulationResult`)."""
        summary: dict[str, Any] = self.summary.summary(sim_time_s=sim_time_s, recoveries=recoveries)
        if self.fleet is not None:
            summary.update(self.fleet.summary())
        if self.deployments is not None:
            summary.update(self.deployments.summary())
        if self.tenants is not None:
            summary.update(self.tenants.summary())
        if self.jobs is not None:
            summary.update(self.jobs.summary(sim_time_s))
        return summary


def scenario_metric_keys(scenario: Scenario) -> tuple[str, ...]:
    """The numeric summary keys a run of ``scenario`` reports, in the summary's order, without running it.

    Derived from the same accumulators a run sums into (:meth:`StreamingRun.summary_keys`, which both
    record modes share, then the budget figures), left empty: the task keys always; the fleet's,
    the deployments', the tenants' and the jobs' only when the scenario has them, named after its
    workers, providers and tenants. A text key (``bottleneck_stage``) is left out: it cannot be
    minimised or bounded. What :mod:`aiqsim.lab.tune` checks an objective or a constraint against.
    """
    from aiqsim.sim.metrics import budget_figures

    summary = StreamingRun(scenario).summary_keys(0.0, [])
    summary.update(budget_figures(()))
    return tuple(
        key
        for key, value in summary.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    )
