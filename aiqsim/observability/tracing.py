"""OpenTelemetry traces from the scheduler's events: one span per task, a child per attempt.

``Scheduler(events=OpenTelemetryTracing())`` opens a ``aiqsim.task`` span when a task is
submitted and ends it when the task ends (attributes, all named ``aiqsim.*``: ``task_id``,
``key``, ``provider``, ``priority``, ``cost_estimate``, then ``status`` and ``attempts``; each bill
the provider reports is an ``aiqsim.billed`` event with its cost); every provider attempt becomes
an ``aiqsim.attempt`` child (``provider``, ``attempt``, ``outcome``, ``outcome_class``,
``decision``, and when known ``usage``, ``output_units``, ``retry_after_s``, ``delay_s``,
``first_token_s``; the task's own attributes are on its span, not repeated). A job is an
``aiqsim.job`` span with an ``aiqsim.stage`` child per stage. A task its tracer provider's sampler
drops costs one unrecorded span: its attempts, bills and end record nothing. A task whose change
could not be stored (:class:`~aiqsim.scheduler.events.StoreWriteFailed`) ends its span there, in error.

Give :meth:`OpenTelemetryTracing.headers_for` to ``HttpProvider(request_headers=...)`` and each
HTTP request carries the W3C ``traceparent`` of its attempt's span, so the provider's side of the
call joins the same trace.

Times: the events carry the scheduler's clock (seconds since its runtime started; virtual under
SimPy). Span times are Unix nanoseconds: ``time_origin_ns`` maps scheduler time 0 to a Unix time;
by default the first event anchors it to the wall clock (exact for the asyncio runtime at
``time_scale=1``; a simulation's spans then start at the moment it ran).
"""

from __future__ import annotations

import time as _wall
from typing import Any

from aiqsim.core.errors import ConfigurationError
from aiqsim.observability.definitions import TERMINAL_STATUSES, priority_label
from aiqsim.observability.records import CallBilled
from aiqsim.scheduler.call_log import OUTCOME_CLASSES
from aiqsim.scheduler.events import (
    AttemptRecord,
    LanePaused,
    QuotaUnavailable,
    StoreWriteFailed,
    TaskTransition,
)
from aiqsim.scheduler.job_events import JobTransition, StageEvent
from aiqsim.scheduler.provider import ProviderRequest

__all__ = ["OpenTelemetryTracing", "TracingError"]


class TracingError(ConfigurationError):
    """OpenTelemetry is not installed, or the tracer provider given is not one."""


def _otel() -> tuple[Any, Any, Any, Any]:
    try:
        from opentelemetry import trace
        from opentelemetry.context import Context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        from opentelemetry.trace.status import Status, StatusCode
    except ImportError as error:
        raise TracingError(
            "aiqsim's OpenTelemetry tracing needs opentelemetry-api (and an SDK to export): "
            "pip install 'aiqsim[otel]'"
        ) from error
    return trace, TraceContextTextMapPropagator(), (Status, StatusCode), Context()


class OpenTelemetryTracing:
    """A scheduler event sink that records OpenTelemetry spans (see the module docstring).

    ``tracer_provider`` defaults to the global one (``opentelemetry.trace.get_tracer_provider()``);
    without an SDK configured there, spans are no-ops. Spans of tasks still running are held until
    their task ends (one entry per live task, none per finished one).
    """

    wants_quota_samples = False
    """Quota samples make no spans."""

    def __init__(self, tracer_provider: Any = None, *, time_origin_ns: int | None = None) -> None:
        trace, self._propagator, (self._status, self._code), self._root = _otel()
        """``_root``: the empty context. A parent span is set in it rather than in the current
        context: the parent is the task's (or job's) span whatever context the event arrived in,
        and no context-variable lookup is paid per child."""
        self._trace = trace
        provider = trace.get_tracer_provider() if tracer_provider is None else tracer_provider
        if not callable(getattr(provider, "get_tracer", None)):
            raise TracingError(
                f"tracer_provider: expected an opentelemetry TracerProvider, got {tracer_provider!r}"
            )
        if time_origin_ns is not None and (
            isinstance(time_origin_ns, bool) or not isinstance(time_origin_ns, int)
        ):
            raise ConfigurationError(
                f"time_origin_ns: expected an int (Unix ns) or None, got {time_origin_ns!r}"
            )
        self.tracer = provider.get_tracer("aiqsim.observability")
        self._origin = time_origin_ns
        self._tasks: dict[str, Any] = {}
        self._attempts: dict[tuple[str, int], Any] = {}
        """Attempt spans opened by :meth:`headers_for`, ended by their :class:`AttemptRecord`."""
        self._jobs: dict[str, Any] = {}
        self._stages: dict[tuple[str, str], Any] = {}
        self._handlers = {
            TaskTransition: self._task,
            AttemptRecord: self._attempt,
            JobTransition: self._job,
            StageEvent: self._stage,
            CallBilled: self._bill,
            QuotaUnavailable: self._unavailable,
            LanePaused: self._paused,
            StoreWriteFailed: self._lost,
        }

    # ------------------------------------------------------------------ time
    def _ns(self, t: float) -> int:
        origin = self._origin
        if origin is None:
            origin = self._origin = _wall.time_ns() - int(t * 1e9)
        return origin + int(t * 1e9)

    # ------------------------------------------------------------------ the sink
    def __call__(self, event: Any) -> None:
        """Turn ``event`` into span starts, ends and attributes (other record types are ignored)."""
        handler = self._handlers.get(type(event))
        if handler is not None:
            handler(event)

    def _task(self, event: TaskTransition) -> None:
        task_id = event.task_id
        span = self._tasks.get(task_id)
        if span is None:  # submitted here, or first seen after a restart
            attributes = {
                "aiqsim.task_id": task_id,
                "aiqsim.key": event.key,
                "aiqsim.provider": event.provider,
                "aiqsim.priority": priority_label(event.priority),
            }
            if event.cost_estimate is not None:
                attributes["aiqsim.cost_estimate"] = event.cost_estimate
            start = self._ns(event.time)
            span = self.tracer.start_span("aiqsim.task", start_time=start, attributes=attributes)
            self._tasks[task_id] = span
        new = event.new
        if new in TERMINAL_STATUSES:
            del self._tasks[task_id]
            if self._attempts:  # an attempt headers_for opened that no AttemptRecord ended
                self._end_open_attempts(event)
            if span.is_recording():  # a task sampled out ends at no further cost
                span.set_attributes({"aiqsim.status": new, "aiqsim.attempts": event.attempts})
                if new == "failed":
                    span.set_status(self._status(self._code.ERROR, "task failed"))
                span.end(end_time=self._ns(event.time))

    def _lost(self, event: StoreWriteFailed) -> None:
        """A task whose change could not be stored leaves this process (no transition of it follows
        here; ``recover()`` reconciles it after a restart): its span ends now, in error, with an
        ``aiqsim.store_write_failed`` event naming the change lost, and the sink lets it go (it was
        held for ever). Should its outcome be written again later, that transition makes a span of
        its own, as a task first seen after a restart does."""
        span = self._tasks.pop(event.task_id, None)
        if span is None:  # a lost outcome's rewrite failing again, or a task this sink never saw
            return
        if self._attempts:
            self._end_open_attempts(event, "lost")
        if span.is_recording():
            span.add_event(
                "aiqsim.store_write_failed",
                {"aiqsim.lost": event.lost, "aiqsim.error": event.error},
                timestamp=self._ns(event.time),
            )
            span.set_status(self._status(self._code.ERROR, "store write failed"))
            span.end(end_time=self._ns(event.time))

    def _end_open_attempts(self, event: TaskTransition | StoreWriteFailed, ended: str | None = None) -> None:
        """End the attempt spans of ``event``'s task still open at its end: a call cancelled in
        flight (the task cancelled, its job ended) emits no :class:`AttemptRecord`, and its span,
        opened by :meth:`headers_for`, would otherwise stay open and held for ever. ``ended``: how
        the task ended (default: the transition's new status)."""
        end = self._ns(event.time)
        how = ended if ended is not None else event.new  # type: ignore[union-attr]
        for key in [key for key in self._attempts if key[0] == event.task_id]:
            span = self._attempts.pop(key)
            span.set_attributes({"aiqsim.outcome": how, "aiqsim.decision": how})
            span.set_status(self._status(self._code.ERROR, f"task {how} during the call"))
            span.end(end_time=max(end, getattr(span, "start_time", None) or 0))

    def _attempt(self, event: AttemptRecord) -> None:
        # the task's id, key and cost estimate are on the parent span: not repeated here
        opened = self._attempts.pop((event.task_id, event.attempt), None) if self._attempts else None
        parent = None
        if opened is None:
            parent = self._tasks.get(event.task_id)
            if parent is not None and not parent.is_recording():
                return  # its task was sampled out (a ratio sampler): so is the attempt, at no cost
        outcome = event.outcome
        attributes: dict[str, Any] = {
            "aiqsim.provider": event.provider,
            "aiqsim.attempt": event.attempt,
            "aiqsim.outcome": outcome,
            "aiqsim.outcome_class": OUTCOME_CLASSES.get(outcome, "other"),
            "aiqsim.decision": event.decision,
        }
        if event.usage is not None:
            attributes["aiqsim.usage"] = event.usage
        if event.output_units is not None:
            attributes["aiqsim.output_units"] = event.output_units
        if event.retry_after_s is not None:
            attributes["aiqsim.retry_after_s"] = event.retry_after_s
        if event.delay_s is not None:
            attributes["aiqsim.delay_s"] = event.delay_s
        if event.first_token_s is not None:
            attributes["aiqsim.first_token_s"] = event.first_token_s
        if opened is None:  # one call: the attributes go in with the span
            span = self.tracer.start_span(
                "aiqsim.attempt",
                context=None if parent is None else self._trace.set_span_in_context(parent, self._root),
                start_time=self._ns(event.start),
                attributes=attributes,
            )
            end = self._ns(event.end)
        else:  # opened on the wall clock by headers_for: never end it before it started
            span = opened
            span.set_attributes(attributes)
            end = max(self._ns(event.end), getattr(span, "start_time", None) or 0)
        if outcome != "ok":
            span.set_status(self._status(self._code.ERROR, outcome))
        span.end(end_time=end)

    def _job(self, event: JobTransition) -> None:
        span = self._jobs.get(event.job_id)
        if span is None:
            span = self.tracer.start_span(
                "aiqsim.job",
                start_time=self._ns(event.time),
                attributes={
                    "aiqsim.job_id": event.job_id,
                    "aiqsim.key": event.key,
                    "aiqsim.spec": event.name,
                    "aiqsim.priority": priority_label(event.priority),
                },
            )
            self._jobs[event.job_id] = span
        if event.new in TERMINAL_STATUSES:
            del self._jobs[event.job_id]
            for key in [key for key in self._stages if key[0] == event.job_id]:
                self._stages.pop(key).end(end_time=self._ns(event.time))
            span.set_attribute("aiqsim.status", event.new)
            if event.stage is not None:
                span.set_attribute("aiqsim.failed_stage", event.stage)
            if event.new == "failed":
                span.set_status(self._status(self._code.ERROR, event.error or "job failed"))
            span.end(end_time=self._ns(event.time))

    def _stage(self, event: StageEvent) -> None:
        key = (event.job_id, event.stage)
        if event.event in ("submitted", "fallback"):
            previous = self._stages.pop(key, None)
            if previous is not None:  # a fallback replaces the stage's first tasks
                previous.end(end_time=self._ns(event.time))
            job = self._jobs.get(event.job_id)
            self._stages[key] = self.tracer.start_span(
                "aiqsim.stage",
                context=None if job is None else self._trace.set_span_in_context(job, self._root),
                start_time=self._ns(event.time),
                attributes={
                    "aiqsim.stage": event.stage,
                    "aiqsim.stage_event": event.event,
                    "aiqsim.task_ids": list(event.task_ids),
                },
            )
        elif event.event in ("succeeded", "failed", "cancelled"):
            span = self._stages.pop(key, None)
            if span is not None:
                span.set_attribute("aiqsim.stage_outcome", event.event)
                if event.event == "failed":
                    span.set_status(self._status(self._code.ERROR, event.error or "stage failed"))
                span.end(end_time=self._ns(event.time))

    def _bill(self, event: CallBilled) -> None:
        span = self._tasks.get(event.task_id)
        if span is not None and span.is_recording():
            span.add_event(
                "aiqsim.billed",
                {
                    "aiqsim.attempt": event.attempt,
                    "aiqsim.cost": event.cost,
                    "aiqsim.duplicate": event.duplicate,
                },
                timestamp=self._ns(event.time),
            )

    def _unavailable(self, event: QuotaUnavailable) -> None:
        at = self._ns(event.time)
        span = self.tracer.start_span(
            "aiqsim.quota_unavailable",
            start_time=at,
            attributes={"aiqsim.provider": event.provider, "aiqsim.error": event.error},
        )
        span.set_status(self._status(self._code.ERROR, event.error))
        span.end(end_time=at)

    def _paused(self, event: LanePaused) -> None:
        span = self._tasks.get(event.task_id)
        if span is not None and span.is_recording():
            span.add_event(
                "aiqsim.lane_paused",
                {
                    "aiqsim.provider": event.provider,
                    "aiqsim.until_s": event.until,
                    "aiqsim.reason": event.reason,
                },
                timestamp=self._ns(event.time),
            )

    # ------------------------------------------------------------------ propagation
    def headers_for(self, request: ProviderRequest) -> dict[str, str]:
        """The W3C trace headers (``traceparent``) for one provider request: opens the attempt's span
        now, as a child of its task's, and the attempt's event ends it. Pass this method as
        ``HttpProvider(request_headers=...)``. A task this sink never saw gets no header; a task
        sampled out opens no attempt span and sends its own context (flagged not sampled), so the
        provider's side does not record it either."""
        parent = self._tasks.get(request.task_id)
        if parent is None:
            return {}
        root = self._root
        set_span = self._trace.set_span_in_context
        if parent.is_recording():
            key = (request.task_id, request.attempt)
            span = self._attempts.get(key)
            if span is None:
                span = self._attempts[key] = self.tracer.start_span(
                    "aiqsim.attempt", context=set_span(parent, root), start_time=_wall.time_ns()
                )
        else:
            span = parent
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=set_span(span, root))
        return carrier

    def __repr__(self) -> str:
        return f"OpenTelemetryTracing(tracer={self.tracer!r})"
