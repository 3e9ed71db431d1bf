"""A demo worker for deploy/compose.yaml: a steady stream of chat calls, exported to Prometheus.

A production asyncio scheduler (HttpProvider, retries, a client quota) sends ``--rate`` calls per
second to an OpenAI-style API (``aiqsim serve`` in the compose file) and serves its metrics on
``--metrics-host:--metrics-port`` (``/metrics``) for Prometheus; Grafana shows them with
deploy/grafana/dashboards/aiqsim.json. With ``--otel`` it also records OpenTelemetry spans and
sends each request's ``traceparent`` (spans go to the SDK's console exporter here; point an OTLP
exporter at your collector in a real deployment).

    aiqsim serve scenarios/retry_storm_429.toml --port 8000 &
    python deploy/worker.py --base-url http://127.0.0.1:8000/v1 --metrics-port 9464

Needs the ``http`` and ``prometheus`` extras (``otel`` for ``--otel``). Runs until interrupted, or
until ``--tasks`` calls have ended; exit status 0, or 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
from collections.abc import Sequence
from typing import Any

import prometheus_client

from aiqsim import AsyncioRuntime, FullJitter, QuotaLimits, RetryPolicy, Scheduler
from aiqsim.http import HttpProvider
from aiqsim.observability import PrometheusMetrics, fan_out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default=os.environ.get("AIQSIM_BASE_URL", "http://127.0.0.1:8000/v1"))
    parser.add_argument("--metrics-host", default=os.environ.get("AIQSIM_METRICS_HOST", "127.0.0.1"))
    parser.add_argument(
        "--metrics-port", type=int, default=int(os.environ.get("AIQSIM_METRICS_PORT", "9464"))
    )
    parser.add_argument("--rate", type=float, default=3.0, help="calls submitted per second (default 3)")
    parser.add_argument("--tasks", type=int, default=0, help="stop after this many calls (default 0: never)")
    parser.add_argument("--requests-per-min", type=float, default=None, help="client request quota")
    parser.add_argument("--otel", action="store_true", help="also record OpenTelemetry spans")
    args = parser.parse_args(argv)
    if not args.rate > 0:
        parser.error(f"--rate: expected a number > 0, got {args.rate}")
    if args.tasks < 0:
        parser.error(f"--tasks: expected >= 0, got {args.tasks}")
    if not 0 <= args.metrics_port <= 65535:
        parser.error(f"--metrics-port: expected 0-65535, got {args.metrics_port}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    runtime = AsyncioRuntime()
    return runtime.run(work(args, runtime))


async def work(args: argparse.Namespace, runtime: AsyncioRuntime) -> int:
    sinks: list[Any] = [PrometheusMetrics()]
    headers = None
    if args.otel:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

        from aiqsim.observability import OpenTelemetryTracing

        traces = TracerProvider()
        traces.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
        tracing = OpenTelemetryTracing(traces)
        sinks.append(tracing)
        headers = tracing.headers_for
    server, _ = prometheus_client.start_http_server(args.metrics_port, addr=args.metrics_host)
    print(f"metrics on http://{args.metrics_host}:{server.server_port}/metrics", flush=True)
    llm = HttpProvider(
        "llm", args.base_url, path="/chat/completions", model="demo", timeout=30.0, request_headers=headers
    )
    scheduler = Scheduler(
        runtime,
        [llm],
        quotas={"llm": QuotaLimits(requests_per_min=args.requests_per_min, concurrency=32)},
        retry=RetryPolicy(backoff=FullJitter(base_s=0.5, cap_s=8.0), max_attempts=6, attempt_timeout_s=20),
        rng=random.Random(),
        events=fan_out(*sinks),
    )
    llm.attach_to(scheduler)
    rng = random.Random()
    handles = []
    sent = 0
    try:
        while args.tasks == 0 or sent < args.tasks:
            body = {"messages": [{"role": "user", "content": f"demo request {sent}"}], "max_tokens": 40}
            handles.append(scheduler.submit("llm", body, key=f"demo-{os.getpid()}-{sent}", cost_estimate=60))
            sent += 1
            await asyncio.sleep(rng.expovariate(args.rate))
        for handle in handles:
            try:
                await handle.wait()
            except Exception as error:  # a failed call is on the dashboard; the worker goes on
                print(f"{type(error).__name__}: {error}", file=sys.stderr)
        return 0
    finally:
        await scheduler.close()
        await llm.aclose()
        server.shutdown()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(0)
