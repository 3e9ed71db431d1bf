"""From flat simulation records to the numbers and tables a user reads.

The summary is computed from plain records with numpy (fast enough for sweeps); the
DataFrames are built only when asked for (pandas at the analysis edge).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from aiqsim.core.task import (
    BACKGROUND,
    CANCELLED,
    DEDUPED,
    FAILED,
    INTERACTIVE,
    SUCCEEDED,
    Priority,
    TaskRecord,
)

# SUCCESS_STATUSES: the terminal states in which the user got a result, what success latency and
# goodput count; one definition with the production metrics (aiqsim_task_latency_seconds).
from aiqsim.observability.definitions import SUCCESS_STATUSES
from aiqsim.scheduler.events import AttemptRecord, QuotaSample, SchedulerEvent

if TYPE_CHECKING:
    import pandas as pd

    from aiqsim.sim.config import Scenario

SUMMARY_KEYS: dict[str, str] = {
    "tasks_submitted": "submissions the scheduler accepted (a task record exists)",
    "tasks_rejected": "submissions refused at the door (queue depth limit, or a cost the client quota "
    "can never grant)",
    "tasks_succeeded": "tasks that ended succeeded (their own provider run produced the result)",
    "tasks_failed": "tasks that ended failed (fatal, poison, retries exhausted, interrupted)",
    "tasks_cancelled": "tasks that ended cancelled",
    "tasks_deduped": "tasks that ended deduped (result shared from another run of the same key)",
    "tasks_lost": "accepted tasks not terminal at the end of the run (should be 0)",
    "attempts": "provider calls received by the providers (every attempt of every task)",
    "retries": "attempts beyond the first per task (attempts - tasks that made any attempt)",
    "attempts_per_task": "attempts / tasks that made any attempt (retry amplification)",
    "rejected_locally": "attempts refused by a client-side overload gate (budget, breaker, throttle)",
    "rate_limited": "attempts the providers answered with 429",
    "timeouts": "attempts the scheduler gave up on after attempt_timeout_s",
    "billed_calls": "executions the providers billed",
    "duplicate_billed_calls": "billed executions beyond the first for the same idempotency key",
    "cost_total": "money billed by all providers",
    "cost_duplicated": "money billed for duplicate executions",
    "success_latency_p50_s": "median arrival-to-result time of tasks that succeeded (ended succeeded or "
    "deduped) (s); failed tasks are excluded (see failure_time_*); arrival is when the user submitted, "
    "which is earlier than the task record when the process was down",
    "success_latency_p95_s": "95th percentile arrival-to-result time of tasks that succeeded (s)",
    "success_latency_p99_s": "99th percentile arrival-to-result time of tasks that succeeded (s)",
    "failure_time_p50_s": "median arrival-to-failure time of tasks that ended failed (s): how long a user "
    "waited to learn the task would not succeed; NaN when none failed",
    "failure_time_p99_s": "99th percentile arrival-to-failure time of tasks that ended failed (s)",
    "ttft_p50_s": "median time to first token of tasks that ended succeeded (s): from arrival to the first "
    "token of the answer the task ended with (its succeeding attempt's start minus arrival, plus that "
    "attempt's first_token_s; a cut stream completed from the provider's record counts its own first "
    "token), so queueing and abandoned attempts count as the user waited through them; deduped tasks "
    "and answers that stated no time to first token are left out; NaN when none is left (no provider "
    "streams)",
    "ttft_p99_s": "99th percentile time to first token of tasks that ended succeeded (s), as ttft_p50_s",
    "interactive_success_latency_p99_s": "99th percentile arrival-to-result time of interactive tasks "
    "that succeeded (s)",
    "background_success_latency_p99_s": "99th percentile arrival-to-result time of background tasks "
    "that succeeded (s)",
    "quota_utilization": "work executed / (the server quota's rate x the span from the first submission "
    "to the last execution's end): the fraction of the server's steady rate used while work was pending "
    "(units if the provider has a units quota, else requests; mean over providers with a server quota; "
    "NaN if none). It may pass 1, by at most one window's quota over the same span (<= 1 + 60 s / span): "
    "the server's sliding 60 s window admits a full minute's quota at once, so a run that opens with a "
    "burst uses the window before the steady rate has paid for it; idle gaps in the workload pull it down",
    "goodput_per_s": "successes (tasks that ended succeeded or deduped) per simulated second of the run "
    "(sim_time_s); attempts, retries and failures do not count",
    "sim_time_s": "virtual time at which the run ended (s)",
    "crashes": "simulated process crashes",
    "orphans_reconciled": "running tasks found after a restart and completed from the provider's record",
    "orphans_failed": "running tasks found after a restart and failed as interrupted",
    "orphans_requeued": "running tasks found after a restart and sent again",
    "max_executions_per_key": "most provider executions for one idempotency key",
}
"""Every summary key with its definition (also the order of the summary table)."""


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    return float(np.percentile(np.asarray(values, dtype=float), q))


def recovery_figures(recoveries: Sequence[Any]) -> dict[str, int]:
    """The summary's crash keys from the run's recovery reports (both result modes use this)."""
    return {
        "crashes": len(recoveries),
        "orphans_reconciled": sum(r.orphans_completed for r in recoveries),
        "orphans_failed": sum(r.orphans_failed for r in recoveries),
        "orphans_requeued": sum(r.orphans_requeued for r in recoveries),
    }


def summarize(
    scenario: Scenario,
    records: Sequence[TaskRecord],
    executions: Sequence[Any],
    events: Sequence[SchedulerEvent],
    *,
    rejected: int,
    sim_time_s: float,
    recoveries: Sequence[Any] = (),
    arrivals: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Compute :data:`SUMMARY_KEYS` from the final task records, the provider ledger and the events."""
    counts = Counter(r.status for r in records)
    latencies: dict[Priority | None, list[float]] = {
        None: [],
        INTERACTIVE: [],
        BACKGROUND: [],
    }
    failure_times: list[float] = []
    first_tokens = first_token_times(events)
    ttfts: list[float] = []
    for r in records:
        if r.finished_at is None:
            continue
        elapsed = r.finished_at - (arrivals.get(r.id, r.created_at) if arrivals else r.created_at)
        if r.status in SUCCESS_STATUSES:
            latencies[None].append(elapsed)
            latencies[r.priority].append(elapsed)
            first_token = first_tokens.get(r.id) if r.status is SUCCEEDED else None
            if first_token is not None:
                ttfts.append(first_token - (arrivals.get(r.id, r.created_at) if arrivals else r.created_at))
        elif r.status is FAILED:
            failure_times.append(elapsed)
    # One pass over the executions and one over the events (each of the figures below once had its own;
    # the events outnumber the tasks several times over).
    attempts = len(executions)
    attempted_tasks: set[str] = set()
    billed = []
    rate_limited = 0
    per_key: dict[str, int] = {}  # calls that reached execution (not 429s, not replays) per key
    for e in executions:
        attempted_tasks.add(e.task_id)
        if e.billed:
            billed.append(e)
        if e.outcome == "rate_limited":
            rate_limited += 1
        elif e.outcome != "replay":
            per_key[e.key] = per_key.get(e.key, 0) + 1
    tasks_attempted = len(attempted_tasks)
    timeouts = rejected_locally = 0
    for e in events:
        if isinstance(e, AttemptRecord):
            if e.outcome in ("ProviderTimeoutError", "TimeoutError"):
                timeouts += 1
            if e.decision == "rejected":
                rejected_locally += 1
    seen_keys: set[str] = set()
    duplicate_costs: list[float] = []
    for e in sorted(billed, key=lambda e: e.start):
        if e.key in seen_keys:
            duplicate_costs.append(e.cost)
        else:
            seen_keys.add(e.key)
    duplicate_billed = len(duplicate_costs)
    # exactly rounded sums (math.fsum): independent of the order of the terms, so the streaming mode
    # (aiqsim.sim.streaming.ExactSum, which sees them in another order) gives the identical figure
    cost_duplicated = math.fsum(duplicate_costs)
    done = counts[SUCCEEDED] + counts[DEDUPED]
    return {
        "tasks_submitted": len(records),
        "tasks_rejected": rejected,
        "tasks_succeeded": counts[SUCCEEDED],
        "tasks_failed": counts[FAILED],
        "tasks_cancelled": counts[CANCELLED],
        "tasks_deduped": counts[DEDUPED],
        "tasks_lost": sum(count for status, count in counts.items() if not status.is_terminal),
        "attempts": attempts,
        "retries": attempts - tasks_attempted,
        "attempts_per_task": attempts / tasks_attempted if tasks_attempted else math.nan,
        "rejected_locally": rejected_locally,
        "rate_limited": rate_limited,
        "timeouts": timeouts,
        "billed_calls": len(billed),
        "duplicate_billed_calls": duplicate_billed,
        "cost_total": math.fsum(e.cost for e in billed),
        "cost_duplicated": cost_duplicated,
        "success_latency_p50_s": _percentile(latencies[None], 50),
        "success_latency_p95_s": _percentile(latencies[None], 95),
        "success_latency_p99_s": _percentile(latencies[None], 99),
        "failure_time_p50_s": _percentile(failure_times, 50),
        "failure_time_p99_s": _percentile(failure_times, 99),
        "ttft_p50_s": _percentile(ttfts, 50),
        "ttft_p99_s": _percentile(ttfts, 99),
        "interactive_success_latency_p99_s": _percentile(latencies[INTERACTIVE], 99),
        "background_success_latency_p99_s": _percentile(latencies[BACKGROUND], 99),
        "quota_utilization": quota_utilization(scenario, executions, records),
        "goodput_per_s": done / sim_time_s if sim_time_s > 0 else math.nan,
        "sim_time_s": sim_time_s,
        **recovery_figures(recoveries),
        "max_executions_per_key": max(per_key.values(), default=0),
    }


def first_token_times(events: Iterable[Any]) -> dict[str, float]:
    """Task id -> when the first token of its last successful attempt came (attempt start +
    ``first_token_s``), for the attempts that stated one. A stream cut that the provider's record
    settled (decision ``lookup``) is the attempt that succeeded: its answer is the one looked up."""
    found: dict[str, float] = {}
    for e in events:
        if isinstance(e, AttemptRecord) and (e.outcome == "ok" or e.decision == "lookup"):
            if e.first_token_s is None:
                found.pop(e.task_id, None)
            else:
                found[e.task_id] = e.start + e.first_token_s
    return found


def quota_utilization(scenario: Scenario, executions: Sequence[Any], records: Sequence[TaskRecord]) -> float:
    """Executed work over the server quota's steady rate while work was pending, averaged over providers.

    "While work was pending" runs from the first submission to the last execution's end for that
    provider, so idle tails after the workload do not count against utilisation. The denominator is the
    quota's *rate* times that span, not the most its sliding 60 s window can admit: the window lets a full
    minute's quota through at once, so the ratio can pass 1 by up to ``60 s / span`` (one window's worth),
    as :data:`SUMMARY_KEYS` states and ``tests/test_simulate.py`` checks.
    """
    ratios = []
    for provider in scenario.providers:
        mine = [
            e
            for e in executions
            if e.provider == provider.name and e.outcome not in ("rate_limited", "replay")
        ]
        submitted = [r.created_at for r in records if r.provider == provider.name]
        if not mine or not submitted:
            continue
        span = max(e.end for e in mine) - min(submitted)
        if span <= 0:
            continue
        if provider.server_units_per_min is not None:
            used = sum(e.units for e in mine)
            ratios.append(used / (provider.server_units_per_min / 60.0 * span))
        elif provider.server_requests_per_min is not None:
            ratios.append(len(mine) / (provider.server_requests_per_min / 60.0 * span))
    return float(np.mean(ratios)) if ratios else math.nan


# ---------------------------------------------------------------------- DataFrames (analysis edge)
TASK_COLUMNS = [
    "task_id", "key", "provider", "priority", "status", "cost_estimate", "attempts", "arrived_at",
    "created_at", "started_at", "finished_at", "wait_s", "latency_s", "error", "deduped_from", "worker",
    "tenant",
]  # fmt: skip
"""Columns of the ``tasks`` DataFrame (present even when a run has no tasks)."""


def tasks_frame(
    records: Iterable[TaskRecord],
    rejected: Iterable[dict[str, Any]] = (),
    arrivals: Mapping[str, float] | None = None,
) -> pd.DataFrame:
    """One row per task: ids, status, priority name, timestamps, attempts, wait and latency, and the
    index of the fleet worker that held it (``worker``; 0 without a ``[fleet]``), and its ``tenant``
    (empty without ``[tenants.NAME]`` tables, or for the default tenant).

    ``arrived_at`` is when the user submitted (``arrivals``, default ``created_at``); wait and latency
    count from it, so time spent while the process was down is not hidden.
    """
    import pandas as pd

    from aiqsim.sim.fleet_routing import fleet_worker_index

    rows = []
    for r in records:
        arrived = arrivals.get(r.id, r.created_at) if arrivals else r.created_at
        rows.append(
            {
                "task_id": r.id,
                "key": r.key,
                "provider": r.provider,
                "priority": Priority(r.priority).name.lower(),
                "status": r.status.value,
                "cost_estimate": r.cost_estimate,
                "attempts": r.attempts,
                "arrived_at": arrived,
                "created_at": r.created_at,
                "started_at": r.started_at,
                "finished_at": r.finished_at,
                "wait_s": None if r.started_at is None else r.started_at - arrived,
                "latency_s": None if r.finished_at is None else r.finished_at - arrived,
                "error": r.error,
                "deduped_from": r.deduped_from,
                "worker": fleet_worker_index(r.worker),
                "tenant": r.tenant,
            }
        )
    rows.extend(rejected)
    frame = pd.DataFrame(rows, columns=TASK_COLUMNS)
    if not frame.empty:
        frame = frame.sort_values(["arrived_at", "task_id"], kind="stable").reset_index(drop=True)
    return frame


def calls_frame(executions: Sequence[Any], events: Sequence[SchedulerEvent]) -> pd.DataFrame:
    """One row per provider attempt, from the providers' ledger, with the scheduler's view joined in."""
    import pandas as pd

    frame = pd.DataFrame(
        [
            {
                "provider": e.provider,
                "task_id": e.task_id,
                "key": e.key,
                "attempt": e.attempt,
                "start": e.start,
                "end": e.end,
                "outcome": e.outcome,
                "billed": e.billed,
                "cost": e.cost,
                "units": e.units,
                "response_lost": e.response_lost,
            }
            for e in executions
        ],
        columns=[
            "provider", "task_id", "key", "attempt", "start", "end",
            "outcome", "billed", "cost", "units", "response_lost",
        ],
    )  # fmt: skip
    client = pd.DataFrame(
        [
            {
                "task_id": a.task_id,
                "attempt": a.attempt,
                "client_outcome": a.outcome,
                "decision": a.decision,
                "delay_s": a.delay_s,
            }
            for a in events
            if isinstance(a, AttemptRecord)
        ],
        columns=["task_id", "attempt", "client_outcome", "decision", "delay_s"],
    ).drop_duplicates(["task_id", "attempt"], keep="last")
    if frame.empty:
        return pd.DataFrame(columns=[*frame.columns, "client_outcome", "decision", "delay_s"])
    merged = frame.merge(client, on=["task_id", "attempt"], how="left")
    return merged.sort_values(["start", "task_id"], kind="stable").reset_index(drop=True)


def timeline_frame(
    executions: Sequence[Any], events: Sequence[SchedulerEvent], step_s: float, end_s: float
) -> pd.DataFrame:
    """Per-interval, per-provider activity: attempts, 429s, successes, errors, billed calls,
    client bucket levels, in-flight calls and queue depths (last sample in each interval)."""
    import pandas as pd

    bins = max(1, math.ceil(end_s / step_s)) if end_s > 0 else 1
    providers = sorted(
        {e.provider for e in executions} | {e.provider for e in events if isinstance(e, QuotaSample)}
    )

    def count(times: list[float]) -> np.ndarray:
        if not times:
            return np.zeros(bins, dtype=int)
        slots = np.clip((np.asarray(times, dtype=float) / step_s).astype(int), 0, bins - 1)
        return np.bincount(slots, minlength=bins)

    frames = []
    for provider in providers:
        mine = [e for e in executions if e.provider == provider]
        columns: dict[str, Any] = {"t": np.arange(bins) * step_s, "provider": provider}
        columns["attempts"] = count([e.start for e in mine])
        columns["rate_limited"] = count([e.start for e in mine if e.outcome == "rate_limited"])
        columns["successes"] = count(
            [e.end for e in mine if e.outcome in ("ok", "replay") and not e.response_lost]
        )
        columns["errors"] = count(
            [e.end for e in mine if e.outcome not in ("ok", "replay", "rate_limited") or e.response_lost]
        )
        columns["billed"] = count([e.start for e in mine if e.billed])
        samples = [e for e in events if isinstance(e, QuotaSample) and e.provider == provider]
        for attr in (
            "tokens_level",
            "requests_level",
            "in_flight",
            "queued_interactive",
            "queued_background",
        ):
            values = np.full(bins, np.nan)
            for sample in samples:
                values[min(bins - 1, int(sample.time / step_s))] = getattr(sample, attr)
            columns[attr] = pd.Series(values).ffill().to_numpy()
        frames.append(pd.DataFrame(columns))
    if not frames:
        return pd.DataFrame(
            columns=["t", "provider", "attempts", "rate_limited", "successes", "errors", "billed"]
        )
    return pd.concat(frames, ignore_index=True)
