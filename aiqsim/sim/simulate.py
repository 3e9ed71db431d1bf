"""Run a scenario on the SimPy virtual clock with the production scheduler.

Nothing here makes a scheduling decision: the harness builds the real
:class:`~aiqsim.scheduler.Scheduler` on a :class:`~aiqsim.runtime.SimPyRuntime`, feeds it
the scenario's arrivals, kills and restarts it where the scenario says, and collects the
records. Every random stream is derived from the seed, so a run replays exactly.
"""

from __future__ import annotations

import heapq
import os
import random
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiqsim.core.backoff import backoff_from_name
from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import describe_error
from aiqsim.core.routing import Route
from aiqsim.core.task import Priority, TaskRecord
from aiqsim.core.token_bucket import QuotaConfigError, QuotaLimits
from aiqsim.observability.fanout import EventFanout
from aiqsim.observability.records import CallBilled
from aiqsim.runtime.gc_tuning import relaxed_gc
from aiqsim.runtime.protocol import Cancelled, TaskHandle
from aiqsim.runtime.simpy_runtime import SimPyRuntime
from aiqsim.runtime.sync import Signal
from aiqsim.scheduler.dispatch import dispatch_policy_from_name
from aiqsim.scheduler.events import SchedulerEvent
from aiqsim.scheduler.retry import RetryPolicy
from aiqsim.scheduler.scheduler import QueueFullError, RecoveryReport, Scheduler
from aiqsim.scheduler.tenants import Tenant
from aiqsim.sim import metrics
from aiqsim.sim.config import Scenario
from aiqsim.sim.crash import CrashingStore, SimulatedCrash
from aiqsim.sim.recent_keys import RecentKeys
from aiqsim.sim.streaming import DEFAULT_KEY_WINDOW_S, RecordsNotKeptError, check_records_mode, check_window
from aiqsim.sim.streaming_run import StreamingRun, check_streamable
from aiqsim.stores.base import StoreOpenError, TaskStore
from aiqsim.stores.memory import MemoryStore

if TYPE_CHECKING:
    import pandas as pd

    from aiqsim.core.job import JobRecord
    from aiqsim.scheduler.call_log import CallLog
    from aiqsim.sim.job_workloads import JobArrival
    from aiqsim.sim.workloads import Arrival


class SimulationResult:
    """Outcome of one simulated run: ``summary`` (dict) and DataFrames ``tasks``, ``calls``, ``timeline``
    (and ``jobs`` when the scenario submits jobs; the summary then has the job keys too).

    The DataFrames are built on first access; ``records``, ``executions``, ``events`` and
    ``job_records`` hold the raw flat records they come from.
    """

    def __init__(
        self,
        *,
        scenario: Scenario,
        seed: int,
        records: list[TaskRecord],
        rejected: list[dict[str, Any]],
        executions: list[Any],
        events: list[SchedulerEvent],
        recoveries: list[RecoveryReport],
        task_errors: list[str],
        gates: Sequence[Any] = (),
        sim_time_s: float,
        store_writes: int = 0,
        torn_writes_recovered: int = 0,
        arrival_times: Mapping[str, float] | None = None,
        job_records: Sequence[JobRecord] = (),
        rejected_jobs: Sequence[dict[str, Any]] = (),
    ) -> None:
        self.scenario = scenario
        self.seed = seed
        self.records = records
        self.rejected = rejected
        self.executions = executions
        self.events = events
        self.recoveries = recoveries
        self.arrival_times = dict(arrival_times or {})
        """When each task's user submitted it (task id -> virtual time)."""
        self.gates = list(gates)
        """The overload gates that ran (e.g. a circuit breaker's ``transitions`` log)."""
        self.task_errors = task_errors
        self.sim_time_s = sim_time_s
        self.store_writes = store_writes
        """Store writes the scheduler made (the count that ``crashes.after_writes`` refers to)."""
        self.torn_writes_recovered = torn_writes_recovered
        """Restarts whose JSON store found (and cut off) a torn journal line left by the crash."""
        self.summary: dict[str, float] = metrics.summarize(
            scenario,
            records,
            executions,
            events,
            rejected=len(rejected),
            sim_time_s=sim_time_s,
            recoveries=recoveries,
            arrivals=self.arrival_times,
        )
        if scenario.fleet.workers > 1:
            from aiqsim.sim.fleet_metrics import summarize_fleet

            self.summary.update(summarize_fleet(scenario, records, executions, rejected, self.arrival_times))
        if scenario.routes:
            from aiqsim.sim.route_metrics import summarize_deployments

            self.summary.update(summarize_deployments(scenario, records, executions, self.arrival_times))
        if scenario.tenants:
            from aiqsim.sim.tenant_metrics import summarize_tenants

            self.summary.update(summarize_tenants(scenario, records, self.arrival_times))
        self.job_records = list(job_records)
        """The final record of every job (empty when the scenario submits no jobs)."""
        self.rejected_jobs = list(rejected_jobs)
        self._job_rows: list[dict[str, Any]] = []
        if any(w.job is not None for w in scenario.workloads):
            from aiqsim.sim import job_metrics

            self._job_rows = job_metrics.job_rows(
                scenario, self.job_records, records, events, executions, self.arrival_times
            )
            self.summary.update(
                job_metrics.summarize_jobs(scenario, self._job_rows, rejected=len(self.rejected_jobs))
            )
        self.summary.update(metrics.budget_figures(self.gates))

    @cached_property
    def tasks(self) -> pd.DataFrame:
        """One row per task (rejected submissions included with status ``rejected``)."""
        return metrics.tasks_frame(self.records, self.rejected, self.arrival_times)

    @cached_property
    def jobs(self) -> pd.DataFrame:
        """One row per job: status, latency, its critical path split into queue wait / quota wait /
        retries / service, per-stage times, cost and duplicate cost (see :mod:`aiqsim.sim.job_metrics`)."""
        from aiqsim.sim.job_metrics import jobs_frame

        return jobs_frame(self._job_rows, self.rejected_jobs)

    def stage_breakdown(self) -> pd.DataFrame:
        """Per job stage over succeeded jobs: critical-path time, share of latency, mean of each part."""
        import pandas as pd

        from aiqsim.sim.job_metrics import stage_breakdown

        return pd.DataFrame(stage_breakdown(self._job_rows, self.scenario))

    @cached_property
    def calls(self) -> pd.DataFrame:
        """One row per provider attempt: start, end, outcome, billed, cost, and the scheduler's decision."""
        return metrics.calls_frame(self.executions, self.events)

    @cached_property
    def timeline(self) -> pd.DataFrame:
        """Per-interval, per-provider attempt counts, 429s, successes, bucket levels and queue depths."""
        return metrics.timeline_frame(
            self.executions, self.events, self.scenario.timeline_step_s, max(self.sim_time_s, 1e-9)
        )

    @cached_property
    def call_log(self) -> CallLog:
        """The run's call log (:mod:`aiqsim.scheduler.call_log`): the same tasks/calls rows, written by
        the same code, as a production scheduler's ``CallLog`` sink records; ``.write(folder)`` saves it."""
        from aiqsim.scheduler.call_log import CallLog

        return CallLog().extend(self.events)

    def breaker_transitions(self) -> list[Any]:
        """Every circuit-breaker state change in the run (time, provider, old, new), in time order."""
        found = []
        for gate in self.gates:
            for member in getattr(gate, "gates", (gate,)):
                found.extend(getattr(member, "transitions", ()))
        return sorted(found, key=lambda t: t.time)

    def __repr__(self) -> str:
        s = self.summary
        return (
            f"<SimulationResult {self.scenario.name!r} seed={self.seed}: {s['tasks_submitted']} tasks, "
            f"{s['attempts']} attempts, {s['tasks_lost']} lost, sim {s['sim_time_s']:.1f}s>"
        )


class StreamedSimulationResult(SimulationResult):
    """Outcome of a ``records="summary"`` run: ``summary`` and ``timeline`` as in full mode (computed
    on the fly, job and fleet keys included), no per-task records: ``tasks``, ``calls``, ``call_log``,
    ``jobs`` and ``stage_breakdown()`` raise :class:`~aiqsim.sim.streaming.RecordsNotKeptError`;
    ``records``, ``executions`` and ``events`` are empty."""

    def __init__(
        self,
        *,
        scenario: Scenario,
        streaming: StreamingRun,
        seed: int,
        recoveries: list[RecoveryReport],
        task_errors: list[str],
        gates: Sequence[Any] = (),
        sim_time_s: float,
        store_writes: int = 0,
        torn_writes_recovered: int = 0,
    ) -> None:
        self.scenario = scenario
        self.seed = seed
        self.records = []
        self.rejected = []
        self.executions = []
        self.events = []
        self.recoveries = recoveries
        self.arrival_times = {}
        self.gates = list(gates)
        self.task_errors = task_errors
        self.sim_time_s = sim_time_s
        self.store_writes = store_writes
        self.torn_writes_recovered = torn_writes_recovered
        self.job_records = []
        self.rejected_jobs = []
        self._job_rows = []
        self.streaming = streaming
        """The accumulators (``streaming.summary.retained`` says how much per-task state was left)."""
        self.summary = streaming.summary_keys(sim_time_s, recoveries)
        self.summary.update(metrics.budget_figures(self.gates))

    @cached_property
    def timeline(self) -> pd.DataFrame:
        """Per-interval, per-provider counts and quota samples, binned as the run went."""
        return self.streaming.timeline.frame(max(self.sim_time_s, 1e-9))

    def _not_kept(self, name: str) -> RecordsNotKeptError:
        return RecordsNotKeptError(
            f"{name}: this run kept no per-task records (records='summary'); run it with records='full'"
        )

    @property
    def tasks(self) -> pd.DataFrame:  # type: ignore[override]
        """Not kept in streaming mode: raises :class:`RecordsNotKeptError`."""
        raise self._not_kept("tasks")

    @property
    def calls(self) -> pd.DataFrame:  # type: ignore[override]
        """Not kept in streaming mode: raises :class:`RecordsNotKeptError`."""
        raise self._not_kept("calls")

    @property
    def jobs(self) -> pd.DataFrame:  # type: ignore[override]
        """Not kept in streaming mode: raises :class:`RecordsNotKeptError`."""
        raise self._not_kept("jobs")

    @property
    def call_log(self) -> CallLog:  # type: ignore[override]
        """Not kept in streaming mode: raises :class:`RecordsNotKeptError`."""
        raise self._not_kept("call_log")

    def stage_breakdown(self) -> pd.DataFrame:
        """Not kept in streaming mode (it is read from the per-job rows): raises
        :class:`RecordsNotKeptError`; the summary's ``bottleneck_stage``/``bottleneck_share`` are kept."""
        raise self._not_kept("stage_breakdown")


def scheduler_routes(scenario: Scenario) -> dict[str, Route]:
    """The scheduler's routes from the scenario's ``[[routes]]`` entries (empty when it has none)."""
    return {
        route.name: Route(
            list(route.providers),
            policy=route.policy,
            weights=route.weights,
            retry_elsewhere=route.retry_elsewhere,
        )
        for route in scenario.routes
    }


def quota_limits(scenario: Scenario) -> dict[str, QuotaLimits]:
    """The scheduler's client-side limits from the scenario's ``[quotas.*]`` tables."""
    return {
        name: QuotaLimits(
            requests_per_min=q.requests_per_min,
            tokens_per_min=q.units_per_min,
            concurrency=q.concurrency,
            request_burst=q.request_burst,
            token_burst=q.unit_burst,
        )
        for name, q in scenario.quotas.items()
    }


def scheduler_tenants(scenario: Scenario) -> dict[str, Tenant] | None:
    """The scheduler's ``tenants`` from the scenario's ``[tenants.NAME]`` tables (``None``: none)."""
    if not scenario.tenants:
        return None
    return {
        name: Tenant(weight=tenant.weight, max_queued=tenant.max_queued)
        for name, tenant in scenario.tenants.items()
    }


def retry_policy(scenario: Scenario) -> RetryPolicy:
    """The scheduler's retry policy from the scenario's ``[retry]`` table."""
    r = scenario.retry
    return RetryPolicy(
        backoff=backoff_from_name(r.strategy, r.base_s, r.cap_s),
        max_attempts=r.max_attempts,
        attempt_timeout_s=r.attempt_timeout_s,
        honour_retry_after=r.honour_retry_after,
        max_retry_after_s=r.max_retry_after_s,
        rate_limit_scope=r.rate_limit_scope,
        first_token_timeout_s=r.first_token_timeout_s,
    )


def overload_gates(scenario: Scenario) -> list[Any]:
    """The attempt gates the scenario's ``[overload]`` table asks for, chained in the recommended
    order: breaker (cheap state check), throttle, retry budget, adaptive send rate."""
    from aiqsim.overload import (
        AdaptiveRateLimiter,
        CircuitBreaker,
        ClientSideThrottle,
        GateChain,
        RetryRatioBudget,
        RetryTokenBucket,
    )

    o = scenario.overload
    gates: list[Any] = []
    if o.circuit_breaker:
        gates.append(
            CircuitBreaker(
                failure_threshold=o.breaker_failure_threshold,
                window_s=o.breaker_window_s,
                cooldown_s=o.breaker_cooldown_s,
                half_open_probes=o.breaker_half_open_probes,
            )
        )
    if o.throttle:
        gates.append(ClientSideThrottle(k=o.throttle_k, window_s=o.throttle_window_s))
    if o.retry_budget == "token_bucket":
        gates.append(
            RetryTokenBucket(
                capacity=o.budget_capacity,
                retry_cost=o.budget_retry_cost,
                timeout_retry_cost=o.budget_timeout_retry_cost,
            )
        )
    elif o.retry_budget == "ratio":
        gates.append(RetryRatioBudget(ratio=o.budget_ratio, window_s=o.budget_window_s))
    if o.adaptive_rate:
        gates.append(AdaptiveRateLimiter())
    return [GateChain(gates)] if len(gates) > 1 else gates


def budget_gate(scenario: Scenario, ledger: Any, events: Callable[[Any], None] | None = None) -> list[Any]:
    """The scenario's ``[budget]`` as a :class:`~aiqsim.overload.Budget` on ``ledger`` (one ledger per
    run, shared by every worker and every incarnation: money spent stays spent across a crash), or no
    gate. Without ``prices`` each provider's own ``price_per_1k_units / 1000`` prices its calls. Its
    charges and refusals go to ``events`` (the scheduler's sink: the run's records and outside sinks)."""
    b = scenario.budget
    if not b.enabled:
        return []
    from aiqsim.overload import Budget

    prices = b.prices or {p.name: p.price_per_1k_units / 1000.0 for p in scenario.providers}
    return [
        Budget(
            per_day=b.per_day,
            per_tenant_per_day=b.per_tenant_per_day,
            prices=prices,
            ledger=ledger,
            events=events,
        )
    ]


def simulate(
    scenario: Scenario | str | Path,
    seed: int | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    workdir: str | Path | None = None,
    records: str = "full",
    key_window_s: float = DEFAULT_KEY_WINDOW_S,
    progress: Callable[[float, float], None] | None = None,
    sinks: Sequence[Callable[[Any], None]] = (),
) -> SimulationResult:
    """Run ``scenario`` (a :class:`Scenario` or a path to a TOML file) and return its result.

    ``seed`` defaults to the scenario's. ``overrides`` are dotted keys applied with the same
    validation as the file (``{"retry.base_s": 0.5}``). File-backed stores live in
    ``workdir`` (a temporary directory, removed afterwards, by default).

    ``records="summary"`` is the streaming mode for long runs: the summary, the timeline and the
    latency percentiles are computed as the run goes (:mod:`aiqsim.sim.streaming`) and no per-task
    record is kept, so memory stays flat in the number of tasks; ``tasks``/``calls``/``call_log``
    then raise :class:`~aiqsim.sim.streaming.RecordsNotKeptError`. Job workloads and a ``[fleet]`` are
    streamed too: their summary keys are the full mode's (percentiles within 0.1%), while ``jobs``
    and ``stage_breakdown()`` raise (:mod:`aiqsim.sim.job_stream`). Finished tasks and idempotency keys
    are forgotten (store, provider, accumulators) ``key_window_s`` simulated seconds after their last
    activity: a duplicate within the window is deduplicated exactly as in the default ``"full"``
    mode, one after it runs again. ``progress(now, horizon)`` is called every 1/200 of the arrival
    horizon on the virtual clock (e.g. to drive a progress bar).

    ``sinks`` are event sinks fed as the run goes, on the virtual clock, exactly as a production
    scheduler feeds its ``events=`` sink (e.g. :class:`aiqsim.observability.PrometheusMetrics`, so
    the lab exports the series production does); they also get an
    :class:`aiqsim.observability.CallBilled` for every call the simulated providers bill.
    """
    scenario = resolve_scenario(scenario, overrides)
    return run_scenario(
        scenario,
        check_seed(scenario, seed),
        workdir=workdir,
        records=records,
        key_window_s=key_window_s,
        progress=progress,
        **({"sinks": _checked_sinks(sinks)} if sinks else {}),
    )


def _checked_sinks(sinks: Any) -> tuple[Callable[[Any], None], ...]:
    """``sinks`` as a tuple of callables, or a :class:`ConfigurationError` naming the bad one."""
    if callable(sinks) or isinstance(sinks, (str, bytes)):
        raise ConfigurationError(f"sinks: expected a sequence of event sinks (e.g. [metrics]), got {sinks!r}")
    checked = tuple(sinks)
    for index, sink in enumerate(checked):
        if not callable(sink):
            raise ConfigurationError(f"sinks[{index}]: expected a callable event sink, got {sink!r}")
    return checked


def check_seed(scenario: Scenario, seed: Any) -> int:
    """The run's seed: the scenario's when ``seed`` is None, else a whole number >= 0 (not a bool)."""
    from aiqsim.sim.scenario import ScenarioError

    if seed is None:
        return scenario.seed
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ScenarioError(
            scenario.source or scenario.name, "seed", f"expected an integer >= 0, got {seed!r}"
        )
    return seed


def resolve_scenario(scenario: Scenario | str | Path, overrides: Mapping[str, Any] | None = None) -> Scenario:
    """A :class:`Scenario` from a record or a file path, with dotted ``overrides`` applied and validated."""
    from aiqsim.sim.scenario import apply_overrides, load_scenario, parse_scenario, scenario_to_dict

    if overrides is not None and not isinstance(overrides, Mapping):
        raise ConfigurationError(
            f"overrides: expected a mapping of dotted keys to values (e.g. {{'retry.max_attempts': 3}}), "
            f"got {overrides!r}"
        )
    if not isinstance(scenario, Scenario):
        return load_scenario(checked_scenario_path(scenario), overrides=overrides)
    # a record is checked as a file is (a fraction of a millisecond): one built by hand or changed
    # with dataclasses.replace skipped the reader's checks (a rate of 0 divided by zero in the run)
    source = scenario.source or scenario.name
    return parse_scenario(
        apply_overrides(scenario_to_dict(scenario), overrides or {}, source=source), source=source
    )


def checked_scenario_path(scenario: Any) -> str | Path:
    """``scenario`` if it can name a scenario file (a ``str`` or ``os.PathLike``), else a
    :class:`~aiqsim.core.errors.ConfigurationError` that says what ``simulate``/``sweep`` accept."""
    if isinstance(scenario, str | os.PathLike) and str(scenario):
        return scenario
    raise ConfigurationError(
        f"scenario: expected a Scenario or the path of a scenario TOML file, got {scenario!r}"
    )


def run_scenario(
    scenario: Scenario,
    seed: int,
    *,
    workdir: str | Path | None = None,
    records: str = "full",
    key_window_s: float = DEFAULT_KEY_WINDOW_S,
    progress: Callable[[float, float], None] | None = None,
    **backend: Any,
) -> SimulationResult:
    """Run the harness for ``scenario`` at ``seed``; ``backend`` (runtime, providers, executions,
    on_new_scheduler, on_finish, store_factory) replaces the simulated defaults, e.g. for a live run over HTTP
    or a store the scenario format does not describe (a PostgreSQL schema: ``store_factory`` opens
    it again at every restart, as a restarted process would). ``records``, ``key_window_s`` and
    ``progress``: see :func:`simulate`."""
    from aiqsim.sim.preflight import check_runnable

    check_runnable(scenario)  # a store.path that cannot be created fails now, not after the arrivals
    if check_records_mode(records) == "summary":
        check_streamable(scenario, backend)
        backend["streaming"] = StreamingRun(scenario, check_window(key_window_s))
    if progress is not None:
        backend["progress"] = progress
    own_dir = workdir is None and scenario.store.kind != "memory" and scenario.store.path is None
    directory = Path(tempfile.mkdtemp(prefix="aiqsim-")) if own_dir else Path(workdir or ".")
    try:
        with relaxed_gc():  # see aiqsim.runtime.gc_tuning: the cycle collector was ~14% of a long run
            return _Run(scenario, seed, directory, **backend).execute()
    finally:
        if own_dir:
            shutil.rmtree(directory, ignore_errors=True)


def _arrivals(scenario: Scenario, seed: int) -> list[Arrival]:
    """The scenario's arrivals; problems only the data reveals (a bad trace row, too many arrivals)
    become :class:`~aiqsim.sim.scenario.ScenarioError` naming the workload."""
    from aiqsim.sim.scenario import ScenarioError
    from aiqsim.sim.workloads import TraceError, WorkloadTooLargeError, generate_arrivals

    source = scenario.source or scenario.name
    try:
        return generate_arrivals(scenario, random.Random(f"{seed}:workload"))
    except WorkloadTooLargeError as error:
        raise ScenarioError(source, f"workloads[{error.index}]", error.message) from None
    except TraceError as error:
        raise ScenarioError(source, "workloads.trace", str(error)) from None


def _streamed_arrivals(scenario: Scenario, seed: int) -> Iterator[Arrival]:
    """The arrivals of :func:`_arrivals`, generated lazily (:mod:`aiqsim.sim.arrival_stream`), with the
    same errors."""
    from aiqsim.sim.arrival_stream import iter_arrivals
    from aiqsim.sim.scenario import ScenarioError
    from aiqsim.sim.workloads import TraceError, WorkloadTooLargeError

    source = scenario.source or scenario.name
    try:
        yield from iter_arrivals(scenario, random.Random(f"{seed}:workload"))
    except WorkloadTooLargeError as error:
        raise ScenarioError(source, f"workloads[{error.index}]", error.message) from None
    except TraceError as error:
        raise ScenarioError(source, "workloads.trace", str(error)) from None


def _simulation_store(kind: str, path: Path, *, group_commit: bool) -> TaskStore:
    """The scenario's durable store, opened without fsync.

    A simulated crash is a *process* crash inside this Python process: what a store wrote reaches
    the operating system, and the restarted scheduler reads it back through the same files, exactly
    as after a real ``kill -9``. Forcing every write to the disk (``synchronous=FULL``, the JSON
    store's fsync per append) would only model a power loss, which no scenario simulates, and it was
    half of ``crash_recovery.toml``'s CPU time. Every store code path (SQL, journal, claims, recovery)
    is the same; the file is complete on disk when the run ends.
    """
    from aiqsim.stores import JsonFileStore, SqliteStore

    if kind == "sqlite":
        return SqliteStore(path, synchronous="OFF", group_commit=group_commit)
    return JsonFileStore(path, fsync=False)


def _streamed_job_arrivals(scenario: Scenario, seed: int) -> Iterator[JobArrival]:
    """The job arrivals of :func:`_job_arrivals`, generated lazily (:mod:`aiqsim.sim.arrival_stream`),
    with the same errors."""
    from aiqsim.sim.arrival_stream import iter_job_arrivals
    from aiqsim.sim.scenario import ScenarioError
    from aiqsim.sim.workloads import WorkloadTooLargeError

    try:
        yield from iter_job_arrivals(scenario, seed)
    except WorkloadTooLargeError as error:
        source = scenario.source or scenario.name
        raise ScenarioError(source, f"workloads[{error.index}]", error.message) from None


def _job_arrivals(scenario: Scenario, seed: int) -> list[JobArrival]:
    """The scenario's job arrivals (empty without job workloads); too many is a ScenarioError."""
    from aiqsim.sim.job_workloads import generate_job_arrivals
    from aiqsim.sim.scenario import ScenarioError
    from aiqsim.sim.workloads import WorkloadTooLargeError

    try:
        return generate_job_arrivals(scenario, seed)
    except WorkloadTooLargeError as error:
        source = scenario.source or scenario.name
        raise ScenarioError(source, f"workloads[{error.index}]", error.message) from None


class _Run:
    """One run: the harness around the real scheduler (arrivals, process life, crashes, restarts).

    By default it simulates: a :class:`SimPyRuntime` and one :class:`SimulatedProvider` per
    provider config. ``runtime``, ``providers`` and ``executions`` swap in a live setup (an
    asyncio runtime, HTTP providers and the servers' ledgers) without changing anything else.
    """

    def __init__(
        self,
        scenario: Scenario,
        seed: int,
        directory: Path,
        *,
        runtime: Any = None,
        providers: Sequence[Any] | None = None,
        executions: Callable[[], list[Any]] | None = None,
        on_new_scheduler: Callable[[Scheduler], None] | None = None,
        on_finish: Callable[[], Awaitable[None]] | None = None,
        store_factory: Callable[[], TaskStore] | None = None,
        streaming: StreamingRun | None = None,
        progress: Callable[[float, float], None] | None = None,
        sinks: tuple[Callable[[Any], None], ...] = (),
    ) -> None:
        from aiqsim.sim.providers import ProviderLedger, SimulatedProvider

        self.sinks = sinks
        """Outside event sinks fed as the run goes (``simulate(sinks=...)``)."""
        self.streaming = streaming
        """Streaming mode (``records="summary"``): the accumulators that replace the kept records."""
        self.progress = progress
        self.scenario = scenario
        self.seed = seed
        self.directory = directory
        self.runtime = runtime if runtime is not None else SimPyRuntime()
        self.on_new_scheduler = on_new_scheduler
        self.on_finish = on_finish
        """Awaited last, on the run's own runtime, however the run ended (a live run closes its HTTP
        clients there: their connections belong to the run's event loop, which ends with it)."""
        self.store_factory = store_factory
        self.durable = scenario.store.kind != "memory" or store_factory is not None
        """Whether the store lives outside the process (closed at a crash, reopened at a restart)."""
        if providers is None:
            forget = streaming.window_s if streaming is not None else None
            in_use = streaming.summary.key_in_use if streaming is not None else None
            on_record = streaming.execution if streaming is not None else None
            if sinks:
                on_record = _BillFeed(sinks, on_record, forget if streaming is not None else None)
            ledger = (
                ProviderLedger(on_record=on_record)
                if streaming is None
                else ProviderLedger(
                    keep_executions=False,
                    on_record=on_record,
                    forget_keys_after_s=forget,
                    key_in_use=in_use,
                )
            )
            self.providers = [
                SimulatedProvider(
                    self.runtime,
                    p,
                    random.Random(f"{seed}:provider:{p.name}"),
                    ledger,
                    forget_keys_after_s=forget,
                    key_in_use=in_use,
                )
                for p in scenario.providers
            ]
            self.executions: Callable[[], list[Any]] = lambda: list(ledger.executions)
        else:
            if executions is None:
                raise ConfigurationError(
                    "a run with its own providers must say where their executions are recorded"
                )
            self.providers = list(providers)
            self.executions = executions
        self.arrivals: list[Arrival] = [] if streaming is not None else _arrivals(scenario, seed)
        from aiqsim.sim.job_templates import job_specs

        self.job_arrivals: list[JobArrival] = [] if streaming is not None else _job_arrivals(scenario, seed)
        self.job_specs = job_specs(scenario)
        self.streamed = frozenset(p.name for p in scenario.providers if p.streams)
        """Providers with the stream model: a workload's task on one is submitted ``stream=True``, so
        its attempts run through ``stream()`` (the first-token deadline applies)."""
        self.rejected_jobs: list[dict[str, Any]] = []
        self.events: list[SchedulerEvent] = []
        self.gates: list[Any] = []
        """The overload gates of every scheduler incarnation (a restart starts with fresh state)."""
        self.rejected: list[dict[str, Any]] = []
        self.recoveries: list[RecoveryReport] = []
        self.write_counter = [0]
        self.crash_points = {c.after_writes for c in scenario.crashes if c.after_writes is not None}
        self.crash_configs = {c.after_writes: c for c in scenario.crashes if c.after_writes is not None}
        self.incarnation = 0
        self.down = False
        self.drained_at: float | None = None
        """When the last task ended (and the run with it); None if the horizon cut the run first."""
        self.backlog: list[Arrival] = []
        self.torn_writes_recovered = 0
        self.changed = Signal(self.runtime)
        self.raw_store: TaskStore = self._open_store()
        self._check_store_keeps_jobs()
        from aiqsim.sim.fleet_quotas import worker_quotas
        from aiqsim.sim.fleet_routing import ArrivalRouter

        fleet = scenario.fleet
        self.router = ArrivalRouter(fleet, random.Random(f"{seed}:fleet:routing"))
        self.worker_quotas = worker_quotas(
            fleet, quota_limits(scenario), self.runtime.now(), [p.name for p in scenario.providers]
        )
        from aiqsim.overload import LocalBudgetLedger

        self.budget_ledger = LocalBudgetLedger(day_origin_s=0.0, day_s=scenario.budget.day_s)
        """The run's one spend ledger (``[budget]``): shared by every worker and incarnation."""
        self.scheduler = self._new_scheduler()
        self.schedulers = [self.scheduler, *(self._new_scheduler(worker=i) for i in range(1, fleet.workers))]
        """Every worker of the fleet (``[fleet] workers``); ``self.scheduler`` is worker 0."""

    # -- process life ------------------------------------------------------------------------
    def _store_path(self) -> Path:
        cfg = self.scenario.store
        if cfg.path is not None:
            return Path(cfg.path)
        return self.directory / ("tasks.json" if cfg.kind == "json" else "tasks.sqlite3")

    def _open_store(self) -> TaskStore:
        if self.store_factory is not None:
            return self.store_factory()
        kind = self.scenario.store.kind
        existing = getattr(self, "raw_store", None)
        if kind == "memory":
            return existing if existing is not None else MemoryStore()
        path = self._store_path()
        if existing is None and path.exists():  # a fresh run, not a restart: never mix two runs' tasks
            from aiqsim.sim.scenario import ScenarioError

            raise ScenarioError(
                self.scenario.source or self.scenario.name,
                "store.path",
                f"{path} already exists (from an earlier run?); delete it or choose another path",
            )
        try:
            return _simulation_store(kind, path, group_commit=self.scenario.store.group_commit)
        except StoreOpenError as error:  # e.g. store.path in a folder that does not exist
            from aiqsim.sim.scenario import ScenarioError

            raise ScenarioError(
                self.scenario.source or self.scenario.name, "store.path", str(error)
            ) from None

    def _check_store_keeps_jobs(self) -> None:
        from aiqsim.stores.job_store import JobStore

        if self.job_specs and not isinstance(self.raw_store, JobStore):
            from aiqsim.sim.scenario import ScenarioError

            raise ScenarioError(
                self.scenario.source or self.scenario.name,
                "store.kind",
                f"the {self.scenario.store.kind} store keeps no jobs in this build; job workloads need a "
                "store with a job table",
            )

    def _new_scheduler(self, worker: int = 0) -> Scheduler:
        """A scheduler incarnation for fleet worker ``worker`` (the only one without a ``[fleet]``)."""
        from aiqsim.sim.fleet_routing import fleet_worker_id

        scenario = self.scenario
        fleet = scenario.fleet.workers > 1
        store = CrashingStore(
            self.raw_store,
            counter=self.write_counter,
            crash_points=self.crash_points,
            on_crash=self._on_write_crash,
        )
        self.store = store
        sink = self._event_sink(worker)
        gates = overload_gates(scenario) + budget_gate(scenario, self.budget_ledger, sink)
        self.gates.extend(gates)
        scheduler = Scheduler(
            self.runtime,
            self.providers,
            quotas=self.worker_quotas[worker],
            store=store,
            dispatch=dispatch_policy_from_name(
                scenario.dispatch.policy, max_wait_s=scenario.dispatch.max_wait_s
            ),
            retry=retry_policy(scenario),
            interactive_limit=scenario.dispatch.interactive_limit,
            background_limit=scenario.dispatch.background_limit,
            rng=random.Random(
                f"{self.seed}:scheduler:{self.incarnation}"
                + (f":{fleet_worker_id(worker)}" if worker else "")
            ),
            events=sink,
            gates=gates,
            commit_window_s=scenario.store.commit_window_s,
            worker_id=fleet_worker_id(worker) if fleet else None,
            routes=scheduler_routes(scenario),
            tenants=scheduler_tenants(scenario),
        )
        if self.job_specs:  # registered before recover(), so it can re-drive the stored jobs
            from aiqsim.scheduler.jobs import Jobs

            Jobs(scheduler, specs=self.job_specs.values())
        if self.on_new_scheduler is not None:
            self.on_new_scheduler(scheduler)
        return scheduler

    def _event_sink(self, worker: int) -> Callable[[Any], None]:
        """Where a scheduler incarnation's events go: the run's records, then the outside sinks."""
        own = self.events.append if self.streaming is None else self.streaming.sink(worker)
        return EventFanout(own, *self.sinks) if self.sinks else own

    def _on_write_crash(self) -> None:
        config = self.crash_configs[self.write_counter[0]]
        self._crash(config.restart_after_s, config.torn_write)

    def _crash(self, restart_after_s: float, torn_write: bool) -> None:
        if self.down:
            return
        self.down = True
        self.store.dead = True
        self.scheduler.crash()
        self.runtime.spawn(self._restart_later(restart_after_s, torn_write), name="restart")

    async def _crash_at(self, at_s: float, restart_after_s: float, torn_write: bool) -> None:
        await self.runtime.sleep(max(0.0, at_s - self.runtime.now()))
        self._crash(restart_after_s, torn_write)

    async def _restart_later(self, delay: float, torn_write: bool) -> None:
        if self.durable:
            self.raw_store.close(flush=False)  # a dead process flushes nothing it had staged
            if torn_write and self.scenario.store.kind == "json":
                from aiqsim.stores.json_file import JsonFileStore

                JsonFileStore.leave_torn_write(self._store_path())
        await self.runtime.sleep(delay)
        self.incarnation += 1
        self.raw_store = self._open_store()
        self.torn_writes_recovered += int(getattr(self.raw_store, "torn_tail_recovered", False))
        if self.streaming is not None:  # the dead process's last write emitted no event
            self.streaming.reconcile(self.raw_store)
        self.scheduler = self._new_scheduler()
        self.schedulers[0] = self.scheduler  # crashes are refused in a fleet: the one worker restarted
        self.down = False
        try:
            self.recoveries.append(
                await self.scheduler.recover(
                    requeue_interrupted=self.scenario.store.requeue_interrupted,
                    use_lookup=self.scenario.store.reconcile_on_restart,
                )
            )
            backlog, self.backlog = self.backlog, []
            for arrival in backlog:
                self._offer(arrival)
        except SimulatedCrash:
            pass  # crashed again during recovery; the next restart takes over
        self.changed.notify()

    # -- workload ----------------------------------------------------------------------------
    def _offer_job(self, arrival: JobArrival) -> None:
        """Submit one job through the scheduler's jobs API; a refusal at the door is a ``rejected`` row."""
        if self.down:
            self.backlog.append(arrival)
            return
        worker = self.router.route()
        if self.streaming is not None:
            self.streaming.job_arrival(arrival.job_id, arrival.time)
        try:
            self.schedulers[worker].submit_job(
                self.job_specs[arrival.job],
                arrival.inputs,
                priority=Priority.INTERACTIVE if arrival.priority == "interactive" else Priority.BACKGROUND,
                job_id=arrival.job_id,
                tenant=arrival.tenant,
            )
        except QueueFullError as refusal:
            if self.streaming is not None:
                self.streaming.job_rejected(arrival.job_id)
                return
            self.rejected_jobs.append(
                {
                    "job_id": arrival.job_id,
                    "name": arrival.job,
                    "priority": arrival.priority,
                    "status": "rejected",
                    "arrived_at": arrival.time,
                    "created_at": arrival.time,
                    "error": describe_error(refusal),
                    "worker": worker,
                }
            )
        except SimulatedCrash:
            pass  # the record was written (or not) before the crash; recovery decides

    def _offer(self, arrival: Arrival | JobArrival) -> None:
        """Submit one arrival; a refusal at the door (queue full, a cost the quota can never grant)
        is recorded as a ``rejected`` row, as a user would see an error."""
        if self.job_specs:  # only a scenario with jobs has job arrivals; the import costs ~1 us a call
            from aiqsim.sim.job_workloads import JobArrival

            if isinstance(arrival, JobArrival):
                self._offer_job(arrival)
                return
        if self.down:
            self.backlog.append(arrival)
            return
        worker = self.router.route()
        if self.streaming is not None:
            self.streaming.arrival(arrival.task_id, arrival.time)
        try:
            self.schedulers[worker].submit(
                arrival.provider,
                arrival.payload,
                provider=arrival.provider,
                priority=Priority.INTERACTIVE if arrival.priority == "interactive" else Priority.BACKGROUND,
                cost_estimate=arrival.cost_estimate,
                task_id=arrival.task_id,
                stream=arrival.provider in self.streamed,
                tenant=arrival.tenant,
            )
        except (QueueFullError, QuotaConfigError) as refusal:
            if self.streaming is not None:
                self.streaming.rejected(arrival, worker)
                return
            self.rejected.append(
                {
                    "error": describe_error(refusal),
                    "task_id": arrival.task_id,
                    "provider": arrival.provider,
                    "priority": arrival.priority,
                    "status": "rejected",
                    "cost_estimate": arrival.cost_estimate,
                    "attempts": 0,
                    "arrived_at": arrival.time,
                    "created_at": arrival.time,
                    "worker": worker,
                    "tenant": arrival.tenant,
                }
            )
        except SimulatedCrash:
            pass  # the record was written (or not) before the crash; recovery decides

    async def _notify_when_idle(self, scheduler: Scheduler) -> None:
        await scheduler.join()
        if self.job_specs:
            await scheduler.jobs.join()
        self.changed.notify()

    async def _notify_when_fleet_idle(self) -> None:
        """Notify once every worker of the fleet has been seen idle."""
        for scheduler in self.schedulers:
            await scheduler.join()
            if self.job_specs:
                await scheduler.jobs.join()
        self.changed.notify()

    def _busy(self) -> bool:
        """Tasks or jobs not yet terminal in a live scheduler (any worker of the fleet)."""
        return any(
            scheduler.in_flight or (self.job_specs and scheduler.jobs.in_flight)
            for scheduler in self.schedulers
        )

    async def _sample_quotas(self) -> None:
        """Sample every lane's quota each timeline step, so quiet stretches show in the timeline too."""
        step = self.scenario.timeline_step_s
        while True:
            if not self.down:
                for scheduler in self.schedulers:
                    scheduler.sample_quotas()
            await self.runtime.sleep(step)

    async def _main(self) -> None:
        runtime = self.runtime
        sampler = runtime.spawn(self._sample_quotas(), name="quota-sampler")
        helpers: list[TaskHandle[Any]] = [sampler]
        if self.streaming is not None:
            helpers.append(runtime.spawn(self._purge_finished(), name="retention"))
        if self.progress is not None:
            helpers.append(runtime.spawn(self._report_progress(), name="progress"))
        try:
            await self._feed_and_drain(helpers)
        finally:
            for helper in helpers:  # a crash timer that never started is closed, not left unawaited
                helper.cancel()
            if self.on_finish is not None:
                await self.on_finish()

    async def _purge_finished(self) -> None:
        """Streaming mode: apply the store retention rule (:mod:`aiqsim.stores.retention`) with the
        key window as both TTLs, every half window, so the store holds ~1.5 windows of finished tasks."""
        assert self.streaming is not None
        policy = self.streaming.retention
        while True:
            await self.runtime.sleep(policy.interval_s)
            if not self.down:
                policy.purge(self.raw_store, self.runtime.now())

    async def _report_progress(self) -> None:
        """Call ``progress(now, horizon)`` every 1/200 of the arrival horizon of virtual time."""
        assert self.progress is not None
        horizon = self.scenario.duration_s
        step = max(horizon / 200.0, 1e-9)
        while True:
            self.progress(self.runtime.now(), horizon)
            await self.runtime.sleep(step)

    async def _feed_and_drain(self, helpers: list[TaskHandle[Any]]) -> None:
        """Offer every arrival at its time, then wait until every task has ended (crash timers
        are added to ``helpers``: the run's end cancels them)."""
        runtime = self.runtime
        for crash in self.scenario.crashes:
            if crash.at_s is not None:
                timer = self._crash_at(crash.at_s, crash.restart_after_s, crash.torn_write)
                helpers.append(runtime.spawn(timer, name="crash"))
        feed: Iterable[Arrival | JobArrival]
        if self.streaming is not None:  # generated as the clock goes; calls before jobs at one instant
            feed = heapq.merge(
                _streamed_arrivals(self.scenario, self.seed),
                _streamed_job_arrivals(self.scenario, self.seed),
                key=lambda arrival: arrival.time,
            )
        else:
            feed = [*self.arrivals, *self.job_arrivals]
            feed.sort(key=lambda arrival: arrival.time)  # stable: calls before jobs at the same instant
        for arrival in feed:
            delay = arrival.time - runtime.now()
            if delay > 0:
                await runtime.sleep(delay)
            self._offer(arrival)
        while self.down or self._busy():
            if not self.down:
                watch = (
                    self._notify_when_idle(self.scheduler)
                    if len(self.schedulers) == 1
                    else self._notify_when_fleet_idle()
                )
                runtime.spawn(watch, name="idle-watch")
            await self.changed.wait()
        self.drained_at = runtime.now()
        # Calls the clients gave up on (timed out, say) may still be running server-side: they are
        # billed when they end, so the ledger waits for them (up to the horizon, as everything does).
        for provider in self.providers:
            finish = getattr(provider, "finish_server_work", None)
            if finish is not None:
                await finish()

    def execute(self) -> SimulationResult:
        horizon = self.scenario.duration_s + self.scenario.drain_s
        try:
            self.runtime.run(self._main(), until=horizon)
        except Cancelled:
            pass  # the main task was cut at the horizon: whatever is not terminal is reported lost
        # the run ended when its last task did; the providers' leftover work only adds to the ledger
        sim_time = self.drained_at if self.drained_at is not None else self.runtime.now()
        if self.down and self.durable:
            self.raw_store = self._open_store()  # the run ended while the process was down
        if self.streaming is not None:
            if self.down:  # what the dead process stored counts, as in the full-record summary
                self.streaming.reconcile(self.raw_store)
            return self._streamed_result(sim_time)
        records = self.raw_store.list_by_status()
        job_records = self.raw_store.list_jobs() if self.job_specs else []  # type: ignore[attr-defined]
        errors = self._task_errors()
        if self.durable:
            self.raw_store.close()
        return SimulationResult(
            scenario=self.scenario,
            seed=self.seed,
            records=records,
            rejected=self.rejected,
            executions=self.executions(),
            events=self.events,
            recoveries=self.recoveries,
            task_errors=errors,
            gates=self.gates,
            sim_time_s=sim_time,
            store_writes=self.write_counter[0],
            torn_writes_recovered=self.torn_writes_recovered,
            arrival_times={
                **{a.task_id: a.time for a in self.arrivals},
                **{a.job_id: a.time for a in self.job_arrivals},
            },
            job_records=job_records,
            rejected_jobs=self.rejected_jobs,
        )

    def _task_errors(self) -> list[str]:
        """Coroutines that died of an error during the run (simulated crashes are the scenario's own)."""
        return [
            f"{name}: {describe_error(err)}"
            for name, err in getattr(self.runtime, "task_errors", ())
            if not isinstance(err, SimulatedCrash)
        ]

    def _streamed_result(self, sim_time: float) -> SimulationResult:
        """Streaming mode's result: the accumulators' summary and timeline, no per-task records."""
        assert self.streaming is not None
        errors = self._task_errors()
        if self.durable:
            self.raw_store.close()
        return StreamedSimulationResult(
            scenario=self.scenario,
            streaming=self.streaming,
            seed=self.seed,
            recoveries=self.recoveries,
            task_errors=errors,
            gates=self.gates,
            sim_time_s=sim_time,
            store_writes=self.write_counter[0],
            torn_writes_recovered=self.torn_writes_recovered,
        )


class _BillFeed:
    """The ledger's ``on_record``: every billed execution becomes a :class:`CallBilled` for the
    outside sinks, a duplicate when its key was billed before (in the order the provider finished
    the calls, as a live provider's own bill would say), after ``then`` (the streaming summary) has it.

    With ``window_s`` (``records="summary"``) a key is forgotten once silent that long, as the
    streaming summary forgets it, so memory stays flat; otherwise every billed key is kept."""

    def __init__(
        self,
        sinks: tuple[Callable[[Any], None], ...],
        then: Callable[[Any], None] | None,
        window_s: float | None = None,
    ) -> None:
        self.sinks = sinks
        self.then = then
        self.billed_keys: set[str] | RecentKeys[str] = set() if window_s is None else RecentKeys(window_s)

    def __call__(self, execution: Any) -> None:
        if self.then is not None:
            self.then(execution)
        if not execution.billed:
            return
        key = execution.key
        keys = self.billed_keys
        if isinstance(keys, RecentKeys):
            keys.expired(execution.end)
            duplicate = key in keys
            keys.touch(key, execution.end)
        else:
            duplicate = key in keys
            keys.add(key)
        bill = CallBilled(
            execution.end,
            execution.provider,
            execution.task_id,
            key,
            execution.attempt,
            execution.cost,
            duplicate,
        )
        for sink in self.sinks:
            sink(bill)
