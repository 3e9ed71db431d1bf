"""Streaming accumulators: a run's summary, timeline and latency percentiles without per-task records.

``simulate(..., records="summary")`` feeds these classes the scheduler's event stream, the provider
ledger's executions and the harness's arrivals as they happen, and keeps no per-task record once a task
is done: memory is flat in the number of tasks (it grows with the tasks *alive* at once and with the
idempotency window, i.e. with rate x window, never with the length of the run).

They are plain, side-effect-free classes (no clock, no I/O, no randomness): time only enters as the
``time``/``start``/``end`` fields of what they consume. They read events by attribute only, through
the public field names of :mod:`aiqsim.scheduler.events` (``TaskTransition``, ``AttemptRecord``,
``QuotaSample``) and of :class:`aiqsim.sim.providers.Execution`.

Exactness against the full-record summary (:func:`aiqsim.sim.metrics.summarize`) for the same seed:

- counts, attempts, retries, billed and duplicate calls, ``max_executions_per_key``, quota
  utilisation, goodput: identical;
- ``cost_total`` / ``cost_duplicated``: identical, both sides being exactly rounded sums
  (:class:`ExactSum` here, :func:`math.fsum` there), which do not depend on the order of the terms;
- latency percentiles: from a :class:`RelativeErrorHistogram` (``relative_error`` 0.1% by default),
  within that *relative* error of numpy's ``linear`` percentile of the same values;
- per-key and per-task state is forgotten ``window_s`` after its last activity (see
  :class:`RecentKeys`); the figures stay exact as long as no idempotency key (or task) is active again
  after a silence longer than the window -- the same window the store's retention uses, after which a
  duplicate runs (and bills) again anyway.

The job keys (:mod:`aiqsim.sim.job_stream`) and the fleet keys (:mod:`aiqsim.sim.fleet_stream`) are
streamed by their own accumulators on the same inputs, with the same guarantees.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.task import QUEUED, RUNNING
from aiqsim.scheduler.events import AttemptRecord, QuotaSample, TaskTransition
from aiqsim.sim.metrics import recovery_figures
from aiqsim.sim.recent_keys import RecentKeys

if TYPE_CHECKING:
    import pandas as pd

    from aiqsim.sim.config import Scenario

DEFAULT_RELATIVE_ERROR = 1e-3
"""Latency percentiles in streaming mode are within 0.1% (relative) of the exact ones."""

DEFAULT_KEY_WINDOW_S = 3_600.0
"""How long (simulated seconds) a finished task's key is remembered in streaming mode: the store's
idempotency retention, the provider's idempotency memory and the accumulators' per-key state."""

_TERMINAL = frozenset({"succeeded", "failed", "cancelled", "deduped"})
_SUCCESS = frozenset({"succeeded", "deduped"})
_INTERACTIVE = 0  # int(Priority.INTERACTIVE); events carry the priority as an int
_TIMEOUT_OUTCOMES = frozenset({"ProviderTimeoutError", "TimeoutError"})
_NOT_EXECUTED = frozenset({"rate_limited", "replay"})


class RecordsNotKeptError(ConfigurationError, AttributeError):
    """A per-task table (``tasks``, ``calls``, ``call_log``, ``jobs``) asked of a run made with
    ``records="summary"``, which keeps none: run again with ``records="full"`` to get it."""


def check_records_mode(records: str) -> str:
    """``records`` if it names a result mode (``"full"`` or ``"summary"``), else a ConfigurationError."""
    if records not in ("full", "summary"):
        raise ConfigurationError(f"records: expected 'full' or 'summary', got {records!r}")
    return records


MIN_KEY_WINDOW_S = 1.0
"""The shortest key window: the store is purged every half window, so a window of a microsecond
made millions of purges per simulated second (the run never finished), and a key forgotten within
a second is forgotten while its own calls still run."""


def check_window(window_s: float, *, label: str = "key_window_s") -> float:
    """``window_s`` if it is a finite number of seconds >= :data:`MIN_KEY_WINDOW_S`, else a
    ConfigurationError naming ``label`` (the CLI passes ``--key-window``, so the message names the flag
    the user typed)."""
    number = not isinstance(window_s, bool) and isinstance(window_s, int | float)
    if not number or not MIN_KEY_WINDOW_S <= window_s < math.inf:
        raise ConfigurationError(
            f"{label}: expected a finite number of seconds >= {MIN_KEY_WINDOW_S:g} (how long a key is "
            f"remembered), got {window_s!r}"
        )
    return float(window_s)


class ExactSum:
    """A running float sum that ends exactly rounded: :attr:`value` equals ``math.fsum`` of every
    term added, whatever their order (Shewchuk's partials, the algorithm behind ``math.fsum``).

    It keeps a handful of non-overlapping partials (at most ~40 for doubles), not the terms.
    """

    __slots__ = ("_partials",)

    def __init__(self) -> None:
        self._partials: list[float] = []

    def add(self, x: float) -> None:
        """Add one term."""
        partials = self._partials
        i = 0
        for y in partials:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                partials[i] = lo
                i += 1
            x = hi
        partials[i:] = [x]

    @property
    def value(self) -> float:
        """The exactly rounded sum of the terms so far (0.0 for none)."""
        return math.fsum(self._partials)


class RelativeErrorHistogram:
    """Exact counts in logarithmic buckets: any order statistic within ``relative_error`` of the truth.

    The DDSketch bucket mapping: a positive value ``x`` goes to bucket ``ceil(log_gamma(x))`` with
    ``gamma = (1 + a) / (1 - a)``, whose representative ``2 gamma^i / (gamma + 1)`` is within ``a`` of
    every value in it (relative). Zero is counted exactly; negative values mirror the positive ones.
    Memory is the number of occupied buckets, not the values: ~8,100 for 1 ms .. 1e4 s at a = 0.1%
    (``ln(1e7) / ln(gamma)``).

    :meth:`percentile` interpolates between the two order statistics around rank ``(n - 1) q / 100``
    like ``numpy.percentile``'s default (``linear``) method, so for non-negative values it is within
    ``relative_error`` of ``numpy.percentile`` of the same values.
    """

    __slots__ = ("_buckets", "_gamma", "_log_gamma", "_negative", "_zeros", "count", "relative_error")

    def __init__(self, relative_error: float = DEFAULT_RELATIVE_ERROR) -> None:
        if not 0 < relative_error < 1:
            raise ConfigurationError(f"relative_error must be in (0, 1), got {relative_error!r}")
        self.relative_error = relative_error
        self._gamma = (1 + relative_error) / (1 - relative_error)
        self._log_gamma = math.log(self._gamma)
        self._buckets: Counter[int] = Counter()
        self._negative: Counter[int] = Counter()
        self._zeros = 0
        self.count = 0
        """How many values are held."""

    def _index(self, magnitude: float) -> int:
        return math.ceil(math.log(magnitude) / self._log_gamma)

    def add(self, value: float, weight: int = 1) -> None:
        """Count ``value`` (``weight`` times; a negative weight removes values added before).

        A value that is not a finite number is refused (ConfigurationError): NaN compares false
        with everything and was counted as a zero (a NaN latency then pulled the percentiles down,
        where ``numpy.percentile`` answers NaN), and infinity has no bucket (an OverflowError)."""
        if value > 0:
            if value == math.inf:
                raise ConfigurationError(f"a histogram counts finite numbers, got {value!r}")
            self._buckets[self._index(value)] += weight
        elif value < 0:
            if value == -math.inf:
                raise ConfigurationError(f"a histogram counts finite numbers, got {value!r}")
            self._negative[self._index(-value)] += weight
        elif value == 0:
            self._zeros += weight
        else:
            raise ConfigurationError(f"a histogram counts finite numbers, got {value!r}")
        self.count += weight

    def remove(self, value: float) -> None:
        """Take back one ``value`` added before (a task that left a terminal state)."""
        self.add(value, -1)

    def _ordered(self) -> list[tuple[float, int]]:
        """(representative, count) of every occupied bucket, in increasing order of value."""
        scale = 2.0 / (self._gamma + 1.0)
        rows = [(-scale * self._gamma**i, n) for i, n in sorted(self._negative.items(), reverse=True) if n]
        if self._zeros:
            rows.append((0.0, self._zeros))
        rows.extend((scale * self._gamma**i, n) for i, n in sorted(self._buckets.items()) if n)
        return rows

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile (0..100) as ``numpy.percentile`` would give it, NaN when empty."""
        return self.percentiles([q])[0]

    def percentiles(self, qs: Iterable[float]) -> list[float]:
        """Several percentiles with one pass over the buckets."""
        qs = list(qs)
        if self.count <= 0:
            return [math.nan] * len(qs)
        rows = self._ordered()
        edges = np.cumsum([n for _, n in rows])  # edges[j]: values at ranks < edges[j] are in rows[:j+1]
        values = [v for v, _ in rows]

        def at(rank: int) -> float:
            return values[int(np.searchsorted(edges, rank, side="right"))]

        found = []
        for q in qs:
            h = (self.count - 1) * q / 100.0
            low = math.floor(h)
            frac = h - low
            lower = at(low)
            found.append(lower if frac == 0 else lower + (at(min(low + 1, self.count - 1)) - lower) * frac)
        return found


class _TaskState:
    """What the summary needs of one task while it is alive (and for a window after it finished)."""

    __slots__ = (
        "arrived",
        "created",
        "executed",
        "finished",
        "first_token",
        "key",
        "priority",
        "provider",
        "status",
    )

    def __init__(
        self, arrived: float, key: str, provider: str, priority: int, status: str, created: float
    ) -> None:
        self.arrived = arrived
        self.created = created
        self.key = key
        self.provider = provider
        self.priority = priority
        self.status = status
        self.finished: float | None = None
        self.executed = False
        self.first_token: float | None = None
        """When the first token of its last successful attempt came (``ttft_*``), if it said."""


class _KeyState:
    """One idempotency key's billing: its first billed execution (by start) and executions so far."""

    __slots__ = ("executions", "first_cost", "first_start")

    def __init__(self) -> None:
        self.first_start: float | None = None
        self.first_cost = 0.0
        self.executions = 0


def _stored_transition(record: Any, old: str | None, new: str, time: float) -> TaskTransition:
    """The transition event of a change found in the store (see :meth:`StreamingSummary.corrections`)."""
    return TaskTransition(
        time,
        record.id,
        record.key,
        record.provider,
        int(record.priority),
        old,
        new,
        record.attempts,
        record.cost_estimate,
        record.tenant,
    )


class StreamingSummary:
    """The :data:`aiqsim.sim.metrics.SUMMARY_KEYS` summary, computed as the run goes.

    Feed it :meth:`arrival` (a user submitted a task), :meth:`rejected` (refused at the door),
    :meth:`event` (every scheduler event) and :meth:`execution` (every provider ledger record), then
    read :meth:`summary`. See the module docstring for what is exact and what is within a bound.
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        window_s: float = DEFAULT_KEY_WINDOW_S,
        relative_error: float = DEFAULT_RELATIVE_ERROR,
    ) -> None:
        self.scenario = scenario
        self.window_s = check_window(window_s)
        self.statuses: Counter[str] = Counter()
        """Tasks per current status (a task's transition moves it from one count to another)."""
        self.rejected_count = 0
        self.success_latency = RelativeErrorHistogram(relative_error)
        self.interactive_latency = RelativeErrorHistogram(relative_error)
        self.background_latency = RelativeErrorHistogram(relative_error)
        self.failure_time = RelativeErrorHistogram(relative_error)
        self.ttft = RelativeErrorHistogram(relative_error)
        self.attempts = 0
        self.tasks_attempted = 0
        self.rate_limited = 0
        self.billed = 0
        self.duplicate_billed = 0
        self.cost_total = ExactSum()
        self.cost_duplicated = ExactSum()
        self.timeouts = 0
        self.rejected_locally = 0
        self.max_executions_per_key = 0
        self.first_created: dict[str, float] = {}
        """Provider (lane) -> the earliest task creation time on it."""
        self.work: dict[str, list[float]] = {}
        """Provider -> [executions, units, last end] of executions that did work (not 429s, not replays)."""
        self._arrivals: dict[str, float] = {}
        self._tasks: dict[str, _TaskState] = {}
        self._finished: RecentKeys[str] = RecentKeys(self.window_s)
        self._keys: dict[str, _KeyState] = {}
        self._key_activity: RecentKeys[str] = RecentKeys(self.window_s)
        self._live_keys: Counter[str] = Counter()
        self._live_since: dict[str, float] = {}
        """Key -> since when some queued or running task has held it without a break."""
        self._orphan_executions: RecentKeys[str] = RecentKeys(self.window_s)
        """Task ids that executed with no known task state (evicted, or not seen as a transition)."""

    # ------------------------------------------------------------------ inputs
    def arrival(self, task_id: str, time: float) -> None:
        """A user submitted ``task_id`` at ``time`` (before the scheduler saw it: while the process is
        down, the submission waits, and latency counts from here)."""
        self._arrivals[task_id] = time

    def rejected(self, task_id: str) -> None:
        """The scheduler refused ``task_id`` at the door: no task record exists."""
        self._arrivals.pop(task_id, None)
        self.rejected_count += 1

    def event(self, event: Any) -> None:
        """Consume one scheduler event (others than the three read here are ignored)."""
        if isinstance(event, TaskTransition):
            self._transition(event)
        elif isinstance(event, AttemptRecord):
            if event.outcome in _TIMEOUT_OUTCOMES:
                self.timeouts += 1
            if event.decision == "rejected":
                self.rejected_locally += 1
            if event.outcome == "ok" or event.decision == "lookup":  # as metrics.first_token_times
                task = self._tasks.get(event.task_id)
                if task is not None:
                    first = event.first_token_s
                    task.first_token = None if first is None else event.start + first

    def _transition(self, e: Any) -> None:
        new, old, now = e.new, e.old, e.time
        statuses = self.statuses
        statuses[new] += 1
        if old is None:
            arrived = self._arrivals.pop(e.task_id, now)
            self._tasks[e.task_id] = _TaskState(arrived, e.key, e.provider, e.priority, new, now)
            self._hold(e.key, now)
            first = self.first_created.get(e.provider)
            if first is None or now < first:
                self.first_created[e.provider] = now
        else:
            statuses[old] -= 1
        task = self._tasks.get(e.task_id)
        self._key_activity.touch(e.key, now)
        if task is None:  # its state was forgotten: counts stay exact, its latency cannot be taken
            return
        if old in _TERMINAL and task.finished is not None:  # e.g. failed -> queued: take it back
            self._count_latency(task, task.finished, -1)
            task.finished = None
            self._hold(task.key, now)
        task.status = new
        if new in _TERMINAL:
            task.finished = now
            self._count_latency(task, now, 1)
            self._live_keys[task.key] -= 1
            if not self._live_keys[task.key]:
                del self._live_keys[task.key]
                del self._live_since[task.key]
            self._finished.touch(e.task_id, now)
        self._expire(now)

    def _hold(self, key: str, now: float) -> None:
        """One more queued or running task holds ``key``."""
        if not self._live_keys[key]:
            self._live_since[key] = now
        self._live_keys[key] += 1

    def _count_latency(self, task: _TaskState, finished: float, weight: int) -> None:
        elapsed = finished - task.arrived
        if task.status in _SUCCESS:
            self.success_latency.add(elapsed, weight)
            side = self.interactive_latency if task.priority == _INTERACTIVE else self.background_latency
            side.add(elapsed, weight)
            if task.status == "succeeded" and task.first_token is not None:
                self.ttft.add(task.first_token - task.arrived, weight)
        elif task.status == "failed":
            self.failure_time.add(elapsed, weight)

    def execution(self, x: Any) -> None:
        """Consume one provider ledger record (an :class:`~aiqsim.sim.providers.Execution`)."""
        self.attempts += 1
        task = self._tasks.get(x.task_id)
        if task is not None:
            if not task.executed:
                task.executed = True
                self.tasks_attempted += 1
        elif x.task_id not in self._orphan_executions:
            self.tasks_attempted += 1
            self._orphan_executions.touch(x.task_id, x.end)
        else:
            self._orphan_executions.touch(x.task_id, x.end)
        outcome = x.outcome
        if outcome == "rate_limited":
            self.rate_limited += 1
        if outcome not in _NOT_EXECUTED or x.billed:
            state = self._keys.get(x.key)
            if state is None:
                state = self._keys[x.key] = _KeyState()
            self._key_activity.touch(x.key, x.end)
            if outcome not in _NOT_EXECUTED:
                state.executions += 1
            if x.billed:
                self.billed += 1
                self.cost_total.add(x.cost)
                if state.first_start is None:
                    state.first_start, state.first_cost = x.start, x.cost
                else:  # the earliest start is the original (ties: the first recorded), the rest duplicates
                    self.duplicate_billed += 1
                    if x.start < state.first_start:
                        self.cost_duplicated.add(state.first_cost)
                        state.first_start, state.first_cost = x.start, x.cost
                    else:
                        self.cost_duplicated.add(x.cost)
        if outcome not in _NOT_EXECUTED:
            work = self.work.get(x.provider)
            if work is None:
                self.work[x.provider] = [1, x.units, x.end]
            else:
                work[0] += 1
                work[1] += x.units
                if x.end > work[2]:
                    work[2] = x.end
        self._expire(x.end)

    def _expire(self, now: float) -> None:
        """Forget finished tasks and silent keys older than the window (live ones are kept)."""
        for task_id in self._finished.expired(now):
            task = self._tasks.get(task_id)
            if task is not None and task.finished is not None:
                del self._tasks[task_id]
        keys = self._keys
        for key in self._key_activity.expired(now):
            if key in self._live_keys:  # a task of this key is still queued or running
                self._key_activity.touch(key, now)
                continue
            state = keys.pop(key, None)
            if state is not None and state.executions > self.max_executions_per_key:
                self.max_executions_per_key = state.executions
        self._orphan_executions.expired(now)

    def corrections(self, store: Any) -> list[TaskTransition]:
        """After a simulated crash, the transitions that bring this view back to ``store``'s records.

        A crash right after a store write kills the process before it emits that write's event: a
        submission is stored without its creation event (its arrival is still pending here), or a
        task is stored in a state its events never announced (stored succeeded, still running
        here). The full-record summary reads the store, so these writes count there; the stream
        learns them here, from the records, before recovery's own transitions (which start from
        the stored state). A pending arrival without a record was never stored: it is dropped.
        Reads the queued and running records (a job's stage task stored without its event has no
        arrival here) and one record per pending arrival and per task held, once per restart.
        """
        found: list[TaskTransition] = []
        unannounced = {record.id: record for record in store.list_by_status(QUEUED, RUNNING)}
        for task_id in list(self._arrivals):
            record = store.get(task_id)
            if record is None:
                del self._arrivals[task_id]
            else:
                unannounced[task_id] = record
        for task_id, record in unannounced.items():
            if task_id in self._tasks:
                continue
            found.append(_stored_transition(record, None, "queued", record.created_at))
            if record.status.value != "queued":
                found.append(_stored_transition(record, "queued", record.status.value, record.updated_at))
        for task_id, task in self._tasks.items():
            record = store.get(task_id)  # None: purged by retention (a finished task) -- nothing to fix
            if record is not None and record.status.value != task.status:
                found.append(_stored_transition(record, task.status, record.status.value, record.updated_at))
        return found

    def key_in_use(self, key: str, at: float) -> bool:
        """Whether queued or running tasks have held idempotency key ``key`` without a break since
        ``at`` or earlier (they may call again). The providers of a streaming run keep a key silent
        for the window when so at the moment it would have expired (``at``), as the store keeps a
        live owner's key; a key taken up again only after that moment is forgotten all the same."""
        since = self._live_since.get(key)
        return since is not None and since <= at

    def drop_unstored(self, store: Any) -> None:
        """After a simulated crash, forget the queued and running tasks ``store`` has no record of.

        With group commit, the writes staged when the process died are never stored, while their
        events were emitted when staged: a submission counted here that the full-record summary,
        which reads the store, never sees. (A finished task without a record was purged by the
        retention rule: it stays counted.) A provider whose first task was one of them starts at
        its earliest stored task (all later than the lost one: it was staged just before the crash)."""
        for task_id, task in list(self._tasks.items()):
            if task.status in _TERMINAL or store.get(task_id) is not None:
                continue
            del self._tasks[task_id]
            if self.first_created.get(task.provider) == task.created:
                stored = [r.created_at for r in store.list_by_status() if r.provider == task.provider]
                if stored:
                    self.first_created[task.provider] = min(stored)
                else:
                    del self.first_created[task.provider]
            self.statuses[task.status] -= 1
            self._live_keys[task.key] -= 1
            if not self._live_keys[task.key]:
                del self._live_keys[task.key]
                del self._live_since[task.key]

    # ------------------------------------------------------------------ output
    @property
    def retained(self) -> dict[str, int]:
        """How many entries each per-task / per-key structure holds now (for memory checks)."""
        return {
            "tasks": len(self._tasks),
            "keys": len(self._keys),
            "pending_arrivals": len(self._arrivals),
            "finished_window": len(self._finished),
            "key_window": len(self._key_activity),
        }

    def quota_utilization(self) -> float:
        """As :func:`aiqsim.sim.metrics.quota_utilization`, from the running per-provider totals."""
        ratios = []
        for provider in self.scenario.providers:
            work = self.work.get(provider.name)
            first = self.first_created.get(provider.name)
            if work is None or first is None:
                continue
            span = work[2] - first
            if span <= 0:
                continue
            if provider.server_units_per_min is not None:
                ratios.append(work[1] / (provider.server_units_per_min / 60.0 * span))
            elif provider.server_requests_per_min is not None:
                ratios.append(work[0] / (provider.server_requests_per_min / 60.0 * span))
        return float(np.mean(ratios)) if ratios else math.nan

    def summary(self, *, sim_time_s: float, recoveries: Iterable[Any] = ()) -> dict[str, float]:
        """The summary dict (same keys and order as :data:`aiqsim.sim.metrics.SUMMARY_KEYS`)."""
        recoveries = list(recoveries)
        s = self.statuses
        most = self.max_executions_per_key  # keys already forgotten, then the keys still in the window
        per_key = max(most, max((state.executions for state in self._keys.values()), default=most))
        done = s["succeeded"] + s["deduped"]
        p50, p95, p99 = self.success_latency.percentiles([50, 95, 99])
        f50, f99 = self.failure_time.percentiles([50, 99])
        t50, t99 = self.ttft.percentiles([50, 99])
        return {
            "tasks_submitted": sum(s.values()),
            "tasks_rejected": self.rejected_count,
            "tasks_succeeded": s["succeeded"],
            "tasks_failed": s["failed"],
            "tasks_cancelled": s["cancelled"],
            "tasks_deduped": s["deduped"],
            "tasks_lost": sum(n for status, n in s.items() if status not in _TERMINAL),
            "attempts": self.attempts,
            "retries": self.attempts - self.tasks_attempted,
            "attempts_per_task": self.attempts / self.tasks_attempted if self.tasks_attempted else math.nan,
            "rejected_locally": self.rejected_locally,
            "rate_limited": self.rate_limited,
            "timeouts": self.timeouts,
            "billed_calls": self.billed,
            "duplicate_billed_calls": self.duplicate_billed,
            "cost_total": self.cost_total.value,
            "cost_duplicated": self.cost_duplicated.value,
            "success_latency_p50_s": p50,
            "success_latency_p95_s": p95,
            "success_latency_p99_s": p99,
            "failure_time_p50_s": f50,
            "failure_time_p99_s": f99,
            "ttft_p50_s": t50,
            "ttft_p99_s": t99,
            "interactive_success_latency_p99_s": self.interactive_latency.percentile(99),
            "background_success_latency_p99_s": self.background_latency.percentile(99),
            "quota_utilization": self.quota_utilization(),
            "goodput_per_s": done / sim_time_s if sim_time_s > 0 else math.nan,
            "sim_time_s": sim_time_s,
            **recovery_figures(recoveries),
            "max_executions_per_key": per_key,
        }


_COUNTED = ("attempts", "rate_limited", "successes", "errors", "billed")
_SAMPLED = ("tokens_level", "requests_level", "in_flight", "queued_interactive", "queued_background")


class StreamingTimeline:
    """The ``timeline`` table (:func:`aiqsim.sim.metrics.timeline_frame`) in fixed ``step_s`` bins,
    counted as executions and quota samples arrive. Memory: bins x providers (the run's length over
    the step), nothing per task. The last bin absorbs everything at or past the run's end, as there."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self._counts: dict[str, dict[str, Counter[int]]] = {}
        self._samples: dict[str, dict[int, tuple[float, ...]]] = {}

    def _provider(self, provider: str) -> dict[str, Counter[int]]:
        counts = self._counts.get(provider)
        if counts is None:
            counts = self._counts[provider] = {name: Counter() for name in _COUNTED}
            self._samples.setdefault(provider, {})
        return counts

    def _bin(self, time: float) -> int:
        return max(0, int(time / self.step_s))

    def execution(self, x: Any) -> None:
        """Count one provider ledger record."""
        counts = self._provider(x.provider)
        start, end = self._bin(x.start), self._bin(x.end)
        counts["attempts"][start] += 1
        if x.outcome == "rate_limited":
            counts["rate_limited"][start] += 1
        if x.outcome in ("ok", "replay") and not x.response_lost:
            counts["successes"][end] += 1
        elif x.outcome != "rate_limited" or x.response_lost:
            counts["errors"][end] += 1
        if x.billed:
            counts["billed"][start] += 1

    def event(self, event: Any) -> None:
        """Keep a quota sample (the last one of each bin wins); other events are ignored."""
        if not isinstance(event, QuotaSample):
            return
        self._provider(event.provider)
        self._samples[event.provider][self._bin(event.time)] = tuple(getattr(event, a) for a in _SAMPLED)

    def frame(self, end_s: float) -> pd.DataFrame:
        """The timeline up to ``end_s`` (the run's end), one row per bin and provider."""
        import pandas as pd

        bins = max(1, math.ceil(end_s / self.step_s)) if end_s > 0 else 1
        frames = []
        for provider in sorted(self._counts):
            columns: dict[str, Any] = {"t": np.arange(bins) * self.step_s, "provider": provider}
            for name in _COUNTED:
                values = np.zeros(bins, dtype=int)
                for slot, n in self._counts[provider][name].items():
                    values[min(slot, bins - 1)] += n
                columns[name] = values
            sampled = np.full((bins, len(_SAMPLED)), np.nan)
            for slot in sorted(self._samples[provider]):  # a later bin past the end overwrites an earlier
                sampled[min(slot, bins - 1)] = self._samples[provider][slot]
            for j, name in enumerate(_SAMPLED):
                columns[name] = pd.Series(sampled[:, j]).ffill().to_numpy()
            frames.append(pd.DataFrame(columns))
        if not frames:
            return pd.DataFrame(
                columns=["t", "provider", "attempts", "rate_limited", "successes", "errors", "billed"]
            )
        return pd.concat(frames, ignore_index=True)
