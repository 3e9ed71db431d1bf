"""Production seen the way the lab sees it: Prometheus metrics and OpenTelemetry traces.

Both are scheduler event sinks, composable with :class:`~aiqsim.scheduler.call_log.CallLog` and
your own through :func:`fan_out`::

    from aiqsim.observability import OpenTelemetryTracing, PrometheusMetrics, fan_out
    scheduler = Scheduler(runtime, providers, events=fan_out(PrometheusMetrics(), OpenTelemetryTracing()))
    prometheus_client.start_http_server(9464)

The series carry the lab's names and definitions (:data:`METRIC_NAMES`), and
``aiqsim.sim.simulate(..., sinks=[...])`` feeds the same sinks on the virtual clock. The
``prometheus_client`` and ``opentelemetry`` packages are extras (``aiqsim[prometheus]``,
``aiqsim[otel]``), imported only when a sink that needs them is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiqsim.observability.definitions import METRIC_NAMES, SUCCESS_STATUSES
from aiqsim.observability.fanout import EventFanout, fan_out
from aiqsim.observability.records import CallBilled

if TYPE_CHECKING:
    from aiqsim.observability.prometheus import MetricsRegistryError, PrometheusMetrics
    from aiqsim.observability.tracing import OpenTelemetryTracing, TracingError

__all__ = [
    "METRIC_NAMES",
    "SUCCESS_STATUSES",
    "CallBilled",
    "EventFanout",
    "MetricsRegistryError",
    "OpenTelemetryTracing",
    "PrometheusMetrics",
    "TracingError",
    "fan_out",
]

_LAZY = {
    "PrometheusMetrics": "aiqsim.observability.prometheus",
    "MetricsRegistryError": "aiqsim.observability.prometheus",
    "OpenTelemetryTracing": "aiqsim.observability.tracing",
    "TracingError": "aiqsim.observability.tracing",
}


def __getattr__(name: str) -> Any:
    """The sinks load on first use, so importing this package needs neither optional library."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'aiqsim.observability' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
