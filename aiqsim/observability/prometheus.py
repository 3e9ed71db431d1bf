"""Prometheus metrics from the scheduler's events: ``Scheduler(events=PrometheusMetrics())``.

On the serving path the sink only appends each event to a queue; the held events are counted into
plain dicts in one tight loop every :data:`HOLD_EVENTS` events and before every scrape (no
``prometheus_client`` object is touched per event), and a collector registered once per registry
turns the counts into metric families when Prometheus scrapes. A scrape therefore sees every event
received before it, and the counting runs under one lock per registry, so a scrape on the HTTP
server's thread never reads a count half-updated. A second scheduler in the same process is simple: every
:class:`PrometheusMetrics` on one registry shares that registry's counts (counters add up, gauges
are summed over the sinks that are alive, quota utilisation is the highest), so two schedulers
export one set of series instead of failing with a duplicated-timeseries error.

What each series counts is in :data:`aiqsim.observability.definitions.METRIC_NAMES`; the labels are
bounded (provider, priority name, status, outcome class, job spec and stage names; never a task id).
"""

from __future__ import annotations

import sys
import threading
import weakref
from bisect import bisect_left
from collections import deque
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
    BudgetCharged,
    BudgetRefused,
    LanePaused,
    QueueRejected,
    QuotaSample,
    QuotaUnavailable,
    StoreWriteFailed,
    TaskTransition,
    UsageAnomaly,
)
from aiqsim.scheduler.job_events import JobTransition, StageEvent

__all__ = ["HOLD_EVENTS", "MetricsRegistryError", "PrometheusMetrics", "require_prometheus_client"]

HOLD_EVENTS = 256
"""Events a sink holds before counting them in one loop (a scrape counts them whenever it runs)."""

_SUCCESS = frozenset(str(status) for status in ("succeeded", "deduped"))


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
            name: {} for name in _LABELS if name.endswith("_total") and name != "aiqsim_tasks_total"
        }
        self.task_counts: dict[tuple[str, str], list[int]] = {}
        """(provider, priority name) -> counts in :data:`_TASK_STATUSES` order: aiqsim_tasks_total,
        held as a list so counting a status change is one index, not a labels tuple per event."""
        self.histograms: dict[str, dict[tuple[str, ...], _Histogram]] = {
            "aiqsim_task_latency_seconds": {},
            "aiqsim_job_latency_seconds": {},
            "aiqsim_job_stage_seconds": {},
        }
        self.gauges: dict[int, _Gauges] = {}
        self.lock = threading.Lock()
        """Held only to add or drop a sink's gauges or list the sinks, never on the event path."""
        self.sinks: weakref.WeakSet[PrometheusMetrics] = weakref.WeakSet()
        """Every live sink on the registry: their held events are counted before a scrape."""
        self.count_lock = threading.Lock()
        """Held while events are counted into the shared dicts (by a sink on its own thread, or by
        a scrape on the HTTP server's) and while a scrape reads them."""


_TASK_STATUSES = ("submitted", "succeeded", "failed", "cancelled", "deduped")
_TERMINAL_INDEX = {status: index for index, status in enumerate(_TASK_STATUSES) if index}
_SUCCESS_INDEXES = frozenset(_TERMINAL_INDEX[status] for status in _SUCCESS)


class _Gauges:
    """One sink's view of its providers: its tasks queued and running, and the bucket levels."""

    __slots__ = ("capacity", "lanes", "levels")

    def __init__(self) -> None:
        self.lanes: dict[tuple[str, str], list[int]] = {}
        """(provider, priority name) -> [tasks queued, tasks running], as this sink saw them."""
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
    "aiqsim_budget_spend_total": ("provider",),
    "aiqsim_budget_refused_total": ("budget",),
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
        state = self.state
        if empty:
            yield from self._build(empty=True)
            return
        with state.lock:
            sinks = list(state.sinks)
        with state.count_lock:  # every event received so far is counted, and nothing moves meanwhile
            for sink in sinks:
                sink._count_pending()
            families = list(self._build(empty=False))
        yield from families

    def _build(self, *, empty: bool) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        state = self.state
        for name, values in _counter_series(state).items():
            family = CounterMetricFamily(name, METRIC_NAMES[name], labels=_LABELS[name])
            if not empty:
                for labels, value in values.items():
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


def _counter_series(state: _State) -> dict[str, dict[tuple[str, ...], float]]:
    """Every counter's series, ``aiqsim_tasks_total`` first (copies: atomic against the event loop)."""
    tasks: dict[tuple[str, ...], float] = {}
    for (provider, priority), counts in state.task_counts.copy().items():
        for status, count in zip(_TASK_STATUSES, counts.copy(), strict=True):
            tasks[(provider, priority, status)] = count
    return {"aiqsim_tasks_total": tasks, **{name: values.copy() for name, values in state.counters.items()}}


def _gauge_series(state: _State) -> dict[str, dict[tuple[str, ...], float]]:
    """The gauges over every live sink of ``state``: depths and in-flight summed, utilisation the
    highest (two schedulers sharing a provider name and registry are one process's view)."""
    with state.lock:
        sinks = list(state.gauges.values())
    depths: dict[tuple[str, ...], float] = {}
    flights: dict[tuple[str, ...], float] = {}
    shares: dict[tuple[str, ...], float] = {}
    for gauges in sinks:
        for (provider, priority), (queued, running) in gauges.lanes.copy().items():  # copy: atomic
            depths[(provider, priority)] = depths.get((provider, priority), 0) + queued
            flights[(provider,)] = flights.get((provider,), 0) + running
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
    """``aiqsim_quota_utilization`` comes from the quota samples (the bucket levels at each grant)."""

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
            state.sinks.add(self)
        weakref.finalize(self, _drop_gauges, state, id(self))
        counters = state.counters
        self._lane_cache: dict[str, dict[int, tuple[list[int], list[int], _Histogram]]] = {}
        """provider -> priority -> (its shared task counts, this sink's [queued, running], its
        latency histogram): two dict look-ups per status change."""
        self._attempts = counters["aiqsim_attempts_total"]
        self._rate_limited = counters["aiqsim_rate_limited_total"]
        self._jobs = counters["aiqsim_jobs_total"]
        self._task_latency = state.histograms["aiqsim_task_latency_seconds"]
        self._job_latency = state.histograms["aiqsim_job_latency_seconds"]
        self._stage_time = state.histograms["aiqsim_job_stage_seconds"]
        self._live: dict[str, tuple[float | None, str, list[int]]] = {}
        """Task id -> (submit time if seen, status, its lane's [queued, running] gauge), for tasks
        not yet ended: the queue depth and in-flight gauges count these by status, exactly and
        current (not as of the last grant)."""
        self._jobs_open: dict[str, tuple[float, str]] = {}
        """Job id -> (submit time, spec name), for jobs not yet ended."""
        self._stages_open: dict[tuple[str, str], float] = {}
        """(job id, stage) -> when the stage's tasks were submitted."""
        self._quota_labels: dict[str, tuple[tuple[str, str], tuple[str, str]]] = {}
        """provider -> its (provider, "requests") and (provider, "tokens") labels."""
        self._pending: deque[Any] = deque()
        """Events received and not counted yet (see :meth:`__call__`)."""
        self._lock = state.count_lock
        self._handlers = {
            CallBilled: self._bill,
            JobTransition: self._job,
            StageEvent: self._stage,
            QueueRejected: self._rejected,
            LanePaused: self._paused,
            QuotaUnavailable: self._unavailable,
            StoreWriteFailed: self._write_failed,
            UsageAnomaly: self._anomaly,
            BudgetCharged: self._budget_charged,
            BudgetRefused: self._budget_refused,
        }

    # ------------------------------------------------------------------ the sink
    def __call__(self, event: Any) -> None:
        """Take ``event`` (any record type; those that count nothing are dropped when counted).

        Only an append on the serving path: the held events are counted in one tight loop every
        :attr:`HOLD_EVENTS` events, and whenever the registry is scraped or :meth:`value` is read,
        so a scrape always sees every event received before it."""
        pending = self._pending
        pending.append(event)
        if len(pending) >= HOLD_EVENTS and self._lock.acquire(blocking=False):
            try:
                self._count_pending()
            finally:
                self._lock.release()

    def __del__(self) -> None:
        """Count what is still held when the sink goes (counters never lose an event received):
        without waiting, so a collection that happens while the lock is held cannot deadlock (the
        rare events then held are lost with the sink)."""
        if sys.is_finalizing():  # the interpreter is ending: no registry will be scraped again
            return
        if getattr(self, "_handlers", None) is None:  # __init__ refused its arguments: nothing held
            return
        if self._pending and self._lock.acquire(blocking=False):
            try:
                self._count_pending()
            finally:
                self._lock.release()

    def sync(self) -> None:
        """Count every event held (the collector does this for every sink before a scrape)."""
        with self._lock:
            self._count_pending()

    def _count_pending(self) -> None:
        """Count the held events, in the order received (the registry's lock is held: the counts
        are shared with every sink on the registry, and a scrape may run on another thread)."""
        pending = self._pending
        popleft = pending.popleft
        handlers = self._handlers
        live = self._live
        attempts = self._attempts
        limited = self._rate_limited
        lanes = self._lane_cache
        classes = OUTCOME_CLASSES
        terminal = _TERMINAL_INDEX
        successes = _SUCCESS_INDEXES
        bounds = self.buckets
        levels = self._gauges.levels
        capacity = self._gauges.capacity
        fixed = self._fixed_capacity
        quota_labels = self._quota_labels
        for _ in range(len(pending)):  # the event loop may append meanwhile: those wait for next time
            event = popleft()
            kind = type(event)
            if kind is TaskTransition:
                time, task_id, _key, provider, priority, old, new, _attempts, _cost, _tenant = event
                by_priority = lanes.get(provider)
                lane = None if by_priority is None else by_priority.get(priority)
                if lane is None:
                    lane = self._lane(provider, priority)
                counts, gauge, histogram = lane
                previous = live.get(task_id)
                if previous is not None:  # it leaves the gauge it was counted in: a routed task's
                    started, was, counted = previous  # retry moves it to another provider's lane
                    if was == "queued":
                        counted[0] -= 1
                    elif was == "running":
                        counted[1] -= 1
                else:  # submitted now, or first seen after a restart (its submit time is unknown here)
                    started = time if old is None else None
                if old is None:
                    counts[0] += 1
                index = terminal.get(new)
                if index is not None:
                    counts[index] += 1
                    if previous is not None:
                        del live[task_id]
                    if started is not None and index in successes:
                        elapsed = time - started
                        histogram.counts[bisect_left(bounds, elapsed)] += 1
                        histogram.sum += elapsed
                else:
                    live[task_id] = (started, new, gauge)
                    if new == "queued":
                        gauge[0] += 1
                    elif new == "running":
                        gauge[1] += 1
            elif kind is AttemptRecord:
                provider = event.provider
                outcome = event.outcome
                labels = (provider, classes.get(outcome, "other"))
                attempts[labels] = attempts.get(labels, 0) + 1
                if outcome == "RateLimitError":
                    limited[(provider,)] = limited.get((provider,), 0) + 1
            elif kind is QuotaSample:  # one per grant: the levels at the last one, the highest seen
                provider = event.provider
                pair = quota_labels.get(provider)
                if pair is None:
                    pair = quota_labels[provider] = ((provider, "requests"), (provider, "tokens"))
                level = event.requests_level
                if level == level:  # nan: no bucket in that dimension
                    labels = pair[0]
                    levels[labels] = level
                    if level > capacity.get(labels, 0.0) and labels not in fixed:
                        capacity[labels] = level
                level = event.tokens_level
                if level == level:
                    labels = pair[1]
                    levels[labels] = level
                    if level > capacity.get(labels, 0.0) and labels not in fixed:
                        capacity[labels] = level
            else:
                handler = handlers.get(kind)
                if handler is not None:
                    handler(event)

    def _lane(self, provider: str, priority: int) -> tuple[list[int], list[int], _Histogram]:
        """The counts of a (provider, priority) this sink meets for the first time."""
        name = priority_label(priority)
        state = self._state
        counts = state.task_counts.setdefault((provider, name), [0] * len(_TASK_STATUSES))
        gauge = self._gauges.lanes.setdefault((provider, name), [0, 0])
        histogram = self._task_latency.get((provider, name))
        if histogram is None:
            histogram = self._task_latency[(provider, name)] = _Histogram(len(self.buckets))
        lane = (counts, gauge, histogram)
        self._lane_cache.setdefault(provider, {})[priority] = lane
        return lane

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

    def _budget_charged(self, event: BudgetCharged) -> None:
        series = self._state.counters["aiqsim_budget_spend_total"]
        labels = (event.provider,)
        series[labels] = series.get(labels, 0) + event.billed

    def _budget_refused(self, event: BudgetRefused) -> None:
        self._count("aiqsim_budget_refused_total", (event.budget,))

    def _write_failed(self, event: StoreWriteFailed) -> None:
        """Count the failure; the task leaves this process (no transition of it follows here), so it
        leaves the queue-depth and in-flight gauges now: it was counted queued or running for ever.
        An outcome written again later is counted as a task first seen after a restart is."""
        self._count("aiqsim_store_write_failures_total", (event.provider,))
        previous = self._live.pop(event.task_id, None)
        if previous is not None:
            _, was, gauge = previous
            if was == "queued":
                gauge[0] -= 1
            elif was == "running":
                gauge[1] -= 1

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
        with self._state.lock:
            sinks = list(self._state.sinks)
        for sink in sinks:
            sink.sync()
        gauges = _gauge_series(self._state)
        counters = _counter_series(self._state)
        if name in gauges:
            series: Mapping[tuple[str, ...], Any] = gauges[name]
        elif name in counters:
            series = counters[name]
        elif name in self._state.histograms:
            series = {key: sum(h.counts) for key, h in self._state.histograms[name].items()}
        else:
            raise ConfigurationError(
                f"value: {name!r} is not a counter or histogram this sink exports; "
                f"known: {sorted([*counters, *self._state.histograms, *gauges])}"
            )
        names = _LABELS[name]
        unknown = set(labels) - set(names)
        if unknown:
            raise ConfigurationError(f"value: {name} has labels {names}, not {sorted(unknown)}")
        wanted = [(names.index(label), value) for label, value in labels.items()]
        return sum(v for key, v in series.items() if all(key[i] == want for i, want in wanted))

    def __repr__(self) -> str:
        return f"PrometheusMetrics(registry={self.registry!r})"


def _drop_gauges(state: _State, sink_id: int) -> None:
    with state.lock:
        state.gauges.pop(sink_id, None)
