"""What the exported metrics count, shared with the lab's summary so both say the same thing.

Pure data, no dependencies beyond :mod:`aiqsim.core` and the call log's outcome classes: the lab
(:mod:`aiqsim.sim.metrics`) takes :data:`SUCCESS_STATUSES` from here, the metrics sinks count with
the same sets, the Grafana dashboard test checks its PromQL against :data:`METRIC_NAMES`, and
``aiqsim serve`` renders its provider-side series under the names below.
"""

from __future__ import annotations

from aiqsim.core.task import Priority, TaskStatus

__all__ = [
    "DEFAULT_LATENCY_BUCKETS",
    "METRIC_NAMES",
    "SUCCESS_STATUSES",
    "TERMINAL_STATUSES",
    "priority_label",
]

SUCCESS_STATUSES = frozenset({TaskStatus.SUCCEEDED, TaskStatus.DEDUPED})
"""Terminal states in which the user got a result: what success latency and goodput count (the
lab's ``success_latency_*`` and ``aiqsim_task_latency_seconds`` alike)."""

TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled", "deduped"})
"""Status values (tasks and jobs) the scheduler never leaves on its own."""

DEFAULT_LATENCY_BUCKETS: tuple[float, ...] = (
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip
"""Histogram bucket bounds (s) for task and job latency: AI calls take from tenths of a second to
minutes with retries, which the client library's default buckets (5 ms .. 10 s) would cut off."""

METRIC_NAMES: dict[str, str] = {
    # -- client side: the scheduler's events (aiqsim.observability.PrometheusMetrics) -------------
    "aiqsim_tasks_total": "tasks by status: 'submitted' when accepted, then the terminal status it "
    "ended in (lab: tasks_submitted, tasks_succeeded, tasks_failed, tasks_cancelled, tasks_deduped)",
    "aiqsim_attempts_total": "provider attempts by outcome class (the call log's outcome_class: ok, "
    "rate_limited, timeout, server_error, rejected_locally, ...)",
    "aiqsim_rate_limited_total": "attempts answered with 429 (lab: rate_limited)",
    "aiqsim_queue_rejected_total": "submissions refused because their priority's queue was full",
    "aiqsim_lane_pauses_total": "times a 429's Retry-After paused a whole provider lane",
    "aiqsim_store_write_failures_total": "store writes that failed (the change named was not persisted)",
    "aiqsim_usage_anomalies_total": "provider usage reports the scheduler would not charge as is",
    "aiqsim_quota_unavailable_total": "outages of a quota shared through an outside service (a fleet's "
    "Redis account): no attempt is granted until it answers again",
    "aiqsim_budget_spend_total": "money a spend budget (aiqsim.overload.Budget given this sink as its "
    "events) charged: each attempt's bill at the budget's prices (lab: spend)",
    "aiqsim_budget_refused_total": "attempts a spend budget refused, by budget ('per_day', "
    "'per_tenant_per_day[NAME]'); each failed its task with BudgetExceeded (lab: refused_by_budget)",
    "aiqsim_queue_depth": "tasks in status queued: waiting for dispatch or a retry (current, from the "
    "tasks' status changes)",
    "aiqsim_in_flight": "tasks in status running: an attempt under way (current)",
    "aiqsim_quota_utilization": "share of the client-side bucket in use (1 - level / capacity) at the "
    "last grant or sample; dimension is 'requests' or 'tokens'",
    "aiqsim_task_latency_seconds": "submit-to-result time of tasks that succeeded (ended succeeded or "
    "deduped; lab: success_latency_*)",
    "aiqsim_jobs_total": "jobs by spec and status: 'submitted', then the terminal status (lab: jobs_*)",
    "aiqsim_job_latency_seconds": "submit-to-end time of jobs that succeeded (lab: job_latency_*)",
    "aiqsim_job_stage_seconds": "time from a stage's submission to its success, per spec and stage "
    "(the bottleneck stage is the one with the largest share)",
    # -- provider side: bills (fed by the lab's ledger, aiqsim serve, or a provider that reports them) -
    "aiqsim_billed_calls_total": "executions the provider billed (lab: billed_calls)",
    "aiqsim_billed_cost_total": "money billed (lab: cost_total)",
    "aiqsim_duplicate_billed_calls_total": "bills beyond the first for the same idempotency key "
    "(lab: duplicate_billed_calls)",
    "aiqsim_duplicate_cost_total": "money billed for duplicate executions (lab: cost_duplicated)",
    # -- the simulated provider's server (aiqsim serve) --------------------------------------------
    "aiqsim_provider_requests_total": "chat requests the simulated provider answered, by outcome",
    "aiqsim_provider_rate_limited_total": "requests the simulated provider answered with 429",
    "aiqsim_provider_in_flight": "chat requests the simulated provider has received and not answered yet",
}
"""Every metric name aiqsim exports, with what it counts (and the lab's summary key it equals).
Counters are listed with their ``_total`` suffix and histograms by their base name, as they appear
in a scrape (a histogram also exposes ``_bucket``, ``_sum`` and ``_count``)."""


def priority_label(priority: int) -> str:
    """A priority as a bounded label value: its name (``"interactive"``), or the number as text for
    a value outside :class:`~aiqsim.core.task.Priority` (there are only a few). Remembered per value:
    the sinks ask once per task."""
    label = _PRIORITY_LABELS.get(priority)
    if label is None:
        try:
            label = Priority(priority).name.lower()
        except ValueError:
            label = str(priority)
        _PRIORITY_LABELS[priority] = label
    return label


_PRIORITY_LABELS: dict[int, str] = {}
