"""Prometheus metrics from the scheduler's events: ``Scheduler(events=PrometheusMetrics())``.

The sink only adds to plain dicts on the serving path (a dict update per event, no lock, no
``prometheus_client`` object touched); a collector registered once per registry turns those counts
into metric families when Prometheus scrapes. That keeps the overhead on the scheduler's path to a
few dict operations per event, and makes a second scheduler in the same process simple: every
:class:`PrometheusMetrics` on one registry shares that registry's counts (counters add up, gauges
are summed over the sinks that are alive, quota utilisation is the highest), so two schedulers
export one set of series instead of failing with a duplicated-timeseries error.

What each series counts is in :data:`aiqsim.observability.definitions.METRIC_NAMES`; the labels are
bounded (provider, priority name, status, outcome class, job spec and stage names; never a task id).
"""

from __future__ import annotations

import threading
import weakref
from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from math import isfinite
from typing import Any

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.token_bucket import QuotaLimits
from aiqsim.observability.definitions import (
    DEFAULT_LATENCY_BUCKETS,
    METRIC_NAMES,
    TERMINAL_STATUSES,
    priority_label,
)
from aiqsim.observability.records import CallBilled
from aiqsim.scheduler.call_log import OUTCOME_CLASSES
from aiqsim.scheduler.events import (
    AttemptRecord,
    LanePaused,
    QueueRejected,
    QuotaSample,
    QuotaUnavailable,
    StoreWriteFailed,
    TaskTransition,
    UsageAnomaly,
)
from aiqsim.scheduler.job_events import JobTransition, StageEvent

__all__ = ["MetricsRegistryError", "PrometheusMetrics", "require_prometheus_client"]

_SUCCESS = frozenset(str(status) for status in ("succeeded", "deduped"))
_PRIORITIES: dict[int, str] = {}


class MetricsRegistryError(ConfigurationError):
    """The Prometheus registry cannot take aiqsim's metrics (another exporter registered series of
    the same names), or ``prometheus_client`` is not installed."""


def require_prometheus_client() -> Any:
    """``prometheus_client``, or a :class:`MetricsRegistryError` saying how to install it."""
    try:
        import prometheus_client
    except ImportError as error:
        raise MetricsRegistryError(
            "aiqsim's Prometheus metrics need prometheus_client: pip install 'aiqsim[prometheus]'"
        ) from error
    return prometheus_client


class _Histogram:
    """Bucket counts (not cumulative), sum and count of one labelled histogram series."""

    __slots__ = ("counts", "sum")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * (buckets + 1)  # the last one is +Inf
        self.sum = 0.0


class _State:
    """One registry's counts, shared by every sink on it. Counters and histograms are summed in
    place; gauges are held per sink (``gauges``) and combined when scraped."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counters: dict[str, dict[tuple[str, ...], float]] = {
            name: {} for name in _LABELS if name.endswith("_total")
        }
        self.histograms: dict[str, dict[tuple[str, ...], _Histogram]] = {
            "aiqsim_task_latency_seconds": {},
            "aiqsim_job_latency_seconds": {},
            "aiqsim_job_stage_seconds": {},
        }
        self.gauges: dict[int, _Gauges] = {}
        self.lock = threading.Lock()
        """Held only to add or drop a sink's gauges, never on the event path."""


class _Gauges:
    """One sink's last view of its providers: queue depth, in flight, bucket levels."""

    __slots__ = ("capacity", "in_flight", "levels", "queue_depth")

    def __init__(self) -> None:
        self.queue_depth: dict[tuple[str, str], int] = {}
        self.in_flight: dict[tuple[str], int] = {}
        self.levels: dict[tuple[str, str], float] = {}
        self.capacity: dict[tuple[str, str], float] = {}


_LABELS: dict[str, tuple[str, ...]] = {
    "aiqsim_tasks_total": ("provider", "priority", "status"),
    "aiqsim_attempts_total": ("provider", "outcome"),
    "aiqsim_rate_limited_total": ("provider",),
    "aiqsim_queue_rejected_total": ("provider", "priority"),
    "aiqsim_lane_pauses_total": ("provider", "reason"),
    "aiqsim_store_write_failures_total": ("provider",),
    "aiqsim_usage_anomalies_total": ("provider",),
    "aiqsim_quota_unavailable_total": ("provider",),
    "aiqsim_jobs_total": ("spec", "status"),
    "aiqsim_billed_calls_total": ("provider",),
    "aiqsim_billed_cost_total": ("provider",),
    "aiqsim_duplicate_billed_calls_total": ("provider",),
    "aiqsim_duplicate_cost_total": ("provider",),
    "aiqsim_task_latency_seconds": ("provider", "priority"),
    "aiqsim_job_latency_seconds": ("spec",),
    "aiqsim_job_stage_seconds": ("spec", "stage"),
    "aiqsim_queue_depth": ("provider", "priority"),
    "aiqsim_in_flight": ("provider",),
    "aiqsim_quota_utilization": ("provider", "dimension"),
}
"""Label names of every series this sink exports (the server-side ``aiqsim_provider_*`` ones are
rendered by ``aiqsim serve``)."""


class _Collector:
    """The registry's view of a :class:`_State`: metric families built at scrape time."""

    def __init__(self, state: _State) -> None:
        self.state = state

    def describe(self) -> Iterator[Any]:
        """The families with no samples: lets the registry see the names at registration."""
        return self._families(empty=True)

    def collect(self) -> Iterator[Any]:
        return self._families(empty=False)

    def _families(self, *, empty: bool) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        state = self.state
        for name, values in state.counters.items():
            family = CounterMetricFamily(name, METRIC_NAMES[name], labels=_LABELS[name])
            if not empty:
                for labels, value in values.copy().items():  # copy: atomic against the event loop
                    family.add_metric(labels, value)
            yield family
        bounds = [repr(float(b)) for b in state.buckets] + ["+Inf"]
        for name, series in state.histograms.items():
            family = HistogramMetricFamily(name, METRIC_NAMES[name], labels=_LABELS[name])
            if not empty:
                for labels, histogram in series.copy().items():
                    running, cumulative = 0, []
                    for bound, count in zip(bounds, histogram.counts.copy(), strict=True):
                        running += count
                        cumulative.append((bound, running))
                    family.add_metric(labels, cumulative, histogram.sum)
            yield family
        depth = GaugeMetricFamily(
            "aiqsim_queue_depth", METRIC_NAMES["aiqsim_queue_depth"], labels=_LABELS["aiqsim_queue_depth"]
        )
        flight = GaugeMetricFamily(
            "aiqsim_in_flight", METRIC_NAMES["aiqsim_in_flight"], labels=_LABELS["aiqsim_in_flight"]
        )
        used = GaugeMetricFamily(
            "aiqsim_quota_utilization",
            METRIC_NAMES["aiqsim_quota_utilization"],
            labels=_LABELS["aiqsim_quota_utilization"],
        )
        if not empty:
            series = _gauge_series(state)
            for family in (depth, flight, used):
                for labels, value in series[family.name].items():
                    family.add_metric(labels, value)
        yield depth
        yield flight
        yield used


def _gauge_series(state: _State) -> dict[str, dict[tuple[str, ...], float]]:
    """The gauges over every live sink of ``state``: depths and in-flight summed, utilisation the
    highest (two schedulers sharing a provider name and registry are one process's view)."""
    with state.lock:
        sinks = list(state.gauges.values())
    depths: dict[tuple[str, ...], float] = {}
    flights: dict[tuple[str, ...], float] = {}
    shares: dict[tuple[str, ...], float] = {}
    for gauges in sinks:
        for labels, value in gauges.queue_depth.copy().items():  # copy: atomic against the event loop
            depths[labels] = depths.get(labels, 0) + value
        for labels, value in gauges.in_flight.copy().items():
            flights[labels] = flights.get(labels, 0) + value
        capacity = gauges.capacity.copy()
        for labels, level in gauges.levels.copy().items():
            full = capacity.get(labels)
            if full:
                share = min(1.0, max(0.0, 1.0 - level / full))
                shares[labels] = max(shares.get(labels, 0.0), share)
    return {"aiqsim_queue_depth": depths, "aiqsim_in_flight": flights, "aiqsim_quota_utilization": shares}


_STATES: weakref.WeakKeyDictionary[Any, _State] = weakref.WeakKeyDictionary()
_STATES_LOCK = threading.Lock()


def _state_for(registry: Any, buckets: tuple[float, ...]) -> _State:
    """The registry's shared state, registering its collector the first time."""
    with _STATES_LOCK:
        state = _STATES.get(registry)
        if state is not None:
            if state.buckets != buckets:
                raise MetricsRegistryError(
                    "this registry already exports aiqsim's latency histograms with buckets "
                    f"{state.buckets}; a second PrometheusMetrics on it must use the same buckets "
                    f"(got {buckets})"
                )
            return state
        state = _State(buckets)
        try:
            registry.register(_Collector(state))
        except ValueError as error:  # prometheus_client: "Duplicated timeseries in CollectorRegistry"
            raise MetricsRegistryError(
                f"the Prometheus registry already holds series named like aiqsim's ({error}); they were "
                "registered by something other than aiqsim.observability.PrometheusMetrics. Unregister "
                "them, or give PrometheusMetrics a registry of its own: "
                "PrometheusMetrics(registry=prometheus_client.CollectorRegistry())"
            ) from error
        _STATES[registry] = state
        return state


def _checked_buckets(buckets: Sequence[float]) -> tuple[float, ...]:
    try:
        bounds = tuple(float(b) for b in buckets)
    except (TypeError, ValueError) as error:
        raise ConfigurationError(f"buckets: expected increasing numbers, got {buckets!r}") from error
    if not bounds or any(not isfinite(b) for b in bounds) or list(bounds) != sorted(set(bounds)):
        raise ConfigurationError(
            f"buckets: expected finite, strictly increasing bounds (+Inf is added), got {buckets!r}"
        )
    return bounds


class PrometheusMetrics:
    """A scheduler event sink that exports Prometheus metrics (see the module docstring).

    ``registry`` is a ``prometheus_client.CollectorRegistry`` (default: the client's global
    ``REGISTRY``, which ``prometheus_client.start_http_server`` serves). ``limits`` are the client
    quotas given to the scheduler (``{provider: QuotaLimits}``): they size the buckets for
    ``aiqsim_quota_utilization``; without them a bucket's capacity is taken as the highest level
    seen (the buckets start full, so it is exact once a provider has been idle for a moment).
    ``buckets`` are the latency histograms' upper bounds in seconds.

    Combine it with other sinks through :func:`aiqsim.observability.fan_out`. It also takes the
    :class:`~aiqsim.observability.CallBilled` records the lab's providers send.
    """

    wants_quota_samples = True
    """The gauges (queue depth, in flight, quota utilisation) come from the quota samples."""

    def __init__(
        self,
        registry: Any = None,
        *,
        limits: Mapping[str, QuotaLimits] | None = None,
        buckets: Sequence[float] = DEFAULT_LATENCY_BUCKETS,
    ) -> None:
        if registry is None:
            registry = require_prometheus_client().REGISTRY
        elif not callable(getattr(registry, "register", None)):
            raise ConfigurationError(
                f"registry: expected a prometheus_client.CollectorRegistry, got {registry!r}"
            )
        self.registry = registry
        self.buckets = _checked_buckets(buckets)
        state = _state_for(registry, self.buckets)
        self._state = state
        gauges = _Gauges()
        for provider, quota in (limits or {}).items():
            if not isinstance(quota, QuotaLimits):
                raise ConfigurationError(f"limits[{provider!r}]: expected QuotaLimits, got {quota!r}")
            if quota.requests_per_min is not None:
                burst = quota.request_burst if quota.request_burst is not None else quota.requests_per_min
                gauges.capacity[(provider, "requests")] = float(burst)
            if quota.tokens_per_min is not None:
                burst = quota.token_burst if quota.token_burst is not None else quota.tokens_per_min
                gauges.capacity[(provider, "tokens")] = float(burst)
        self._fixed_capacity = frozenset(gauges.capacity)
        self._gauges = gauges
        with state.lock:
            state.gauges[id(self)] = gauges
        weakref.finalize(self, _drop_gauges, state, id(self))
        counters = state.counters
        self._tasks = counters["aiqsim_tasks_total"]
        self._attempts = counters["aiqsim_attempts_total"]
        self._rate_limited = counters["aiqsim_rate_limited_total"]
        self._jobs = counters["aiqsim_jobs_total"]
        self._task_latency = state.histograms["aiqsim_task_latency_seconds"]
        self._job_latency = state.histograms["aiqsim_job_latency_seconds"]
        self._stage_time = state.histograms["aiqsim_job_stage_seconds"]
        self._live: dict[str, tuple[float | None, str]] = {}
        """Task id -> (submit time if seen, status), for tasks not yet ended: the queue depth and
        in-flight gauges count these by status, exactly and current (not as of the last grant)."""
        self._jobs_open: dict[str, tuple[float, str]] = {}
        """Job id -> (submit time, spec name), for jobs not yet ended."""
        self._stages_open: dict[tuple[str, str], float] = {}
        """(job id, stage) -> when the stage's tasks were submitted."""
        self._handlers = {
            TaskTransition: self._task,
            AttemptRecord: self._attempt,
            QuotaSample: self._sample,
            CallBilled: self._bill,
            JobTransition: self._job,
            StageEvent: self._stage,
            QueueRejected: self._rejected,
            LanePaused: self._paused,
            QuotaUnavailable: self._unavailable,
            StoreWriteFailed: self._write_failed,
            UsageAnomaly: self._anomaly,
        }

    # ------------------------------------------------------------------ the sink
    def __call__(self, event: Any) -> None:
        """Count ``event`` (any other record type is ignored)."""
        handler = self._handlers.get(type(event))
        if handler is not None:
            handler(event)

    def _task(self, event: TaskTransition) -> None:
        time, task_id, _key, provider, priority, old, new, _attempts, _cost = event
        name = _PRIORITIES.get(priority)
        if name is None:
            name = _PRIORITIES[priority] = priority_label(priority)
        live = self._live
        gauges = self._gauges
        previous = live.get(task_id)
        if previous is not None:
            started, was = previous
            if was == "queued":
                depth = gauges.queue_depth
                depth[(provider, name)] -= 1
            elif was == "running":
                flight = gauges.in_flight
                flight[(provider,)] -= 1
        else:  # submitted now, or first seen after a restart (its submit time is not known here)
            started = time if old is None else None
        tasks = self._tasks
        if old is None:
            labels = (provider, name, "submitted")
            tasks[labels] = tasks.get(labels, 0) + 1
        if new in TERMINAL_STATUSES:
            labels = (provider, name, new)
            tasks[labels] = tasks.get(labels, 0) + 1
            if previous is not None:
                del live[task_id]
            if started is not None and new in _SUCCESS:
                self._observe(self._task_latency, (provider, name), time - started)
        else:
            live[task_id] = (started, new)
            if new == "queued":
                depth = gauges.queue_depth
                depth[(provider, name)] = depth.get((provider, name), 0) + 1
            elif new == "running":
                flight = gauges.in_flight
                flight[(provider,)] = flight.get((provider,), 0) + 1

    def _attempt(self, event: AttemptRecord) -> None:
        provider = event.provider
        outcome = event.outcome
        labels = (provider, OUTCOME_CLASSES.get(outcome, "other"))
        attempts = self._attempts
        attempts[labels] = attempts.get(labels, 0) + 1
        if outcome == "RateLimitError":
            limited = self._rate_limited
            limited[(provider,)] = limited.get((provider,), 0) + 1

    def _sample(self, event: QuotaSample) -> None:
        provider = event.provider
        gauges = self._gauges
        for dimension, level in (("requests", event.requests_level), ("tokens", event.tokens_level)):
            if level != level:  # nan: no bucket in that dimension
                continue
            labels = (provider, dimension)
            gauges.levels[labels] = level
            if labels not in self._fixed_capacity and level > gauges.capacity.get(labels, 0.0):
                gauges.capacity[labels] = level

    def _bill(self, event: CallBilled) -> None:
        counters = self._state.counters
        labels = (event.provider,)
        for name, amount in (
            ("aiqsim_billed_calls_total", 1),
            ("aiqsim_billed_cost_total", event.cost),
        ) + (
            (("aiqsim_duplicate_billed_calls_total", 1), ("aiqsim_duplicate_cost_total", event.cost))
            if event.duplicate
            else ()
        ):
            series = counters[name]
            series[labels] = series.get(labels, 0) + amount

    def _job(self, event: JobTransition) -> None:
        jobs = self._jobs
        if event.old is None:
            labels = (event.name, "submitted")
            jobs[labels] = jobs.get(labels, 0) + 1
            self._jobs_open[event.job_id] = (event.time, event.name)
        if event.new in TERMINAL_STATUSES:
            labels = (event.name, event.new)
            jobs[labels] = jobs.get(labels, 0) + 1
            opened = self._jobs_open.pop(event.job_id, None)
            for key in [key for key in self._stages_open if key[0] == event.job_id]:
                del self._stages_open[key]
            if opened is not None and event.new == "succeeded":
                self._observe(self._job_latency, (event.name,), event.time - opened[0])

    def _stage(self, event: StageEvent) -> None:
        key = (event.job_id, event.stage)
        if event.event == "submitted":
            self._stages_open[key] = event.time
        elif event.event == "succeeded":
            started = self._stages_open.pop(key, None)
            job = self._jobs_open.get(event.job_id)
            if started is not None and job is not None:
                self._observe(self._stage_time, (job[1], event.stage), event.time - started)
        elif event.event in ("failed", "cancelled"):
            self._stages_open.pop(key, None)

    def _count(self, name: str, labels: tuple[str, ...]) -> None:
        series = self._state.counters[name]
        series[labels] = series.get(labels, 0) + 1

    def _rejected(self, event: QueueRejected) -> None:
        self._count("aiqsim_queue_rejected_total", (event.provider, priority_label(event.priority)))

    def _paused(self, event: LanePaused) -> None:
        self._count("aiqsim_lane_pauses_total", (event.provider, event.reason))

    def _unavailable(self, event: QuotaUnavailable) -> None:
        self._count("aiqsim_quota_unavailable_total", (event.provider,))

    def _write_failed(self, event: StoreWriteFailed) -> None:
        self._count("aiqsim_store_write_failures_total", (event.provider,))

    def _anomaly(self, event: UsageAnomaly) -> None:
        self._count("aiqsim_usage_anomalies_total", (event.provider,))

    def _observe(
        self, series: dict[tuple[str, ...], _Histogram], labels: tuple[str, ...], value: float
    ) -> None:
        histogram = series.get(labels)
        if histogram is None:
            histogram = series[labels] = _Histogram(len(self.buckets))
        histogram.counts[bisect_left(self.buckets, value)] += 1
        histogram.sum += value

    # ------------------------------------------------------------------ reading back
    def value(self, name: str, **labels: str) -> float:
        """The current value of counter or gauge ``name`` summed over the series matching ``labels``
        (e.g. ``value("aiqsim_rate_limited_total", provider="openai")``); for a histogram name, its
        observation count. Reads the registry's shared counts, as a scrape would."""
        gauges = _gauge_series(self._state)
        if name in gauges:
            series: Mapping[tuple[str, ...], Any] = gauges[name]
        elif name in self._state.histograms:
            series = {key: sum(h.counts) for key, h in self._state.histograms[name].items()}
        elif name in self._state.counters:
            series = self._state.counters[name]
        else:
            raise ConfigurationError(
                f"value: {name!r} is not a counter or histogram this sink exports; "
                f"known: {sorted([*self._state.counters, *self._state.histograms, *gauges])}"
            )
        names = _LABELS[name]
        unknown = set(labels) - set(names)
        if unknown:
            raise ConfigurationError(f"value: {name} has labels {names}, not {sorted(unknown)}")
        wanted = [(names.index(label), value) for label, value in labels.items()]
        return sum(v for key, v in series.copy().items() if all(key[i] == want for i, want in wanted))

    def __repr__(self) -> str:
        return f"PrometheusMetrics(registry={self.registry!r})"


def _drop_gauges(state: _State, sink_id: int) -> None:
    with state.lock:
        state.gauges.pop(sink_id, None)
