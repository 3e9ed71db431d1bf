"""Streaming mode's side of a run: the accumulators, the retention rule and what the mode refuses.

:class:`StreamingRun` is what :func:`aiqsim.sim.simulate.simulate` plugs into the harness for
``records="summary"``: the scheduler's events and the provider ledger's executions go to a
:class:`~aiqsim.sim.streaming.StreamingSummary` and a :class:`~aiqsim.sim.streaming.StreamingTimeline`
instead of lists, and the store is purged by :class:`~aiqsim.stores.retention.RetentionPolicy` with
the key window as both TTLs. No scheduling rule lives here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiqsim.core.errors import ConfigurationError
from aiqsim.sim.config import Scenario
from aiqsim.sim.streaming import DEFAULT_KEY_WINDOW_S, StreamingSummary, StreamingTimeline
from aiqsim.stores.retention import RetentionPolicy


def check_streamable(scenario: Scenario, backend: Mapping[str, Any]) -> None:
    """Refuse (ConfigurationError) what streaming mode does not cover yet: job workloads, a
    ``[fleet]`` of several workers, and providers supplied by the caller (a live run)."""
    reasons = []
    if any(w.job is not None for w in scenario.workloads):
        reasons.append("job workloads (their metrics join per-task records)")
    if scenario.fleet.workers > 1:
        reasons.append("a [fleet] of several workers (its metrics join per-task records)")
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
        self.retention = RetentionPolicy(
            finished_ttl_s=window_s, keys_ttl_s=window_s, interval_s=window_s / 2
        )
        """The store's retention in this mode: finished tasks and their keys go after the window."""

    def event(self, event: Any) -> None:
        """The scheduler's event sink."""
        self.summary.event(event)
        self.timeline.event(event)

    def execution(self, execution: Any) -> None:
        """The provider ledger's ``on_record`` hook."""
        self.summary.execution(execution)
        self.timeline.execution(execution)
