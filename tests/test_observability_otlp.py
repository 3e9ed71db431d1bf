"""The spans leave the process over OTLP/HTTP, as a collector receives them.

No OpenTelemetry Collector is packaged for this machine, so the collector here is a loopback HTTP
server that decodes each export request with the protocol's own protobuf messages
(``opentelemetry-proto``) and answers as a collector does: the SDK's real OTLP exporter, the real
wire format, only the receiving end is ours.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
requests = pytest.importorskip("requests")

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: E402

from aiqsim.observability import OpenTelemetryTracing  # noqa: E402
from aiqsim.sim import simulate  # noqa: E402
from tests.test_observability import OVERRIDES, SCENARIO  # noqa: E402


class Collector(ThreadingHTTPServer):
    """Receives ``POST /v1/traces`` (OTLP/HTTP, protobuf) on 127.0.0.1 and keeps every span."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Receiver)


class _Receiver(BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        request = ExportTraceServiceRequest.FromString(body)
        with self.server.lock:
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    self.server.spans.extend(scope.spans)
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200 if self.path == "/v1/traces" else 404)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def attributes(span: Any) -> dict[str, Any]:
    values = {}
    for item in span.attributes:
        kind = item.value.WhichOneof("value")
        values[item.key] = getattr(item.value, kind)
    return values


def test_spans_reach_a_collector_over_otlp(collector: Collector) -> None:
    session = requests.Session()
    session.trust_env = False  # loopback: no proxy from the environment
    exporter = OTLPSpanExporter(
        endpoint=f"http://127.0.0.1:{collector.server_address[1]}/v1/traces", session=session, timeout=10
    )
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    result = simulate(SCENARIO, sinks=[OpenTelemetryTracing(provider)], overrides=OVERRIDES)
    assert provider.force_flush(timeout_millis=30_000)
    provider.shutdown()
    with collector.lock:
        spans = list(collector.spans)
    tasks = {span.span_id: span for span in spans if span.name == "aiqsim.task"}
    attempts = [span for span in spans if span.name == "aiqsim.attempt"]
    assert len(tasks) == result.summary["tasks_submitted"]
    assert len(attempts) == result.summary["attempts"]
    assert all(attempt.parent_span_id in tasks for attempt in attempts)
    assert all(attempt.trace_id == tasks[attempt.parent_span_id].trace_id for attempt in attempts)
    outcomes = [attributes(attempt)["aiqsim.outcome_class"] for attempt in attempts]
    assert outcomes.count("rate_limited") == result.summary["rate_limited"]
    assert outcomes.count("timeout") == result.summary["timeouts"]
