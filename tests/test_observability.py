"""aiqsim.observability: the Prometheus and OpenTelemetry sinks say what the lab's summary says.

The lab and production share the definitions (aiqsim.observability.definitions); these tests feed
the sinks from a simulation, from a live asyncio scheduler and from an HttpProvider over loopback.
"""

from __future__ import annotations

import gc
import math
import random
from collections import Counter
from typing import Any

import pytest

prometheus_client = pytest.importorskip("prometheus_client")
pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from aiqsim.core.errors import ConfigurationError  # noqa: E402
from aiqsim.core.task import TaskStatus  # noqa: E402
from aiqsim.core.token_bucket import QuotaLimits  # noqa: E402
from aiqsim.http.chat import completion_json  # noqa: E402
from aiqsim.http.httpx_provider import HttpProvider  # noqa: E402
from aiqsim.http.loopback import HttpReply, HttpRequest, LoopbackHttpServer  # noqa: E402
from aiqsim.observability import (  # noqa: E402
    METRIC_NAMES,
    CallBilled,
    MetricsRegistryError,
    OpenTelemetryTracing,
    PrometheusMetrics,
    fan_out,
)
from aiqsim.observability.definitions import DEFAULT_LATENCY_BUCKETS  # noqa: E402
from aiqsim.runtime import AsyncioRuntime  # noqa: E402
from aiqsim.scheduler import Scheduler  # noqa: E402
from aiqsim.scheduler.call_log import CallLog  # noqa: E402
from aiqsim.scheduler.events import QuotaSample, TaskTransition  # noqa: E402
from aiqsim.scheduler.retry import RetryPolicy  # noqa: E402
from aiqsim.sim import simulate  # noqa: E402
from aiqsim.sim.metrics import SUCCESS_STATUSES  # noqa: E402
from tests.fakes import ScriptedProvider  # noqa: E402

SCENARIO = "scenarios/timeout_duplicate_billing.toml"
# A server quota far below the offered load (429s) on a provider that bills lost responses and
# ignores idempotency keys (duplicate bills): every counter below is non-zero in this run.
OVERRIDES = {
    "scenario.duration_s": 20,
    "providers.llm.server_requests_per_min": 30,
    "providers.llm.rate_limit_retry_after_s": 1.0,
}


def tracer() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_the_labs_summary_equals_what_the_metrics_say() -> None:
    """One scenario through simulate(sinks=[...]): each summary figure and its series agree."""
    metrics = PrometheusMetrics(prometheus_client.CollectorRegistry())
    result = simulate(SCENARIO, sinks=[metrics], overrides=OVERRIDES)
    summary = result.summary
    value = metrics.value
    assert summary["rate_limited"] > 0 and summary["duplicate_billed_calls"] > 0 and summary["timeouts"] > 0
    assert value("aiqsim_rate_limited_total") == summary["rate_limited"]
    assert value("aiqsim_attempts_total", outcome="rate_limited") == summary["rate_limited"]
    assert value("aiqsim_attempts_total", outcome="timeout") == summary["timeouts"]
    assert value("aiqsim_attempts_total", outcome="rejected_locally") == summary["rejected_locally"]
    assert value("aiqsim_attempts_total") - summary["rejected_locally"] == summary["attempts"]
    assert value("aiqsim_tasks_total", status="submitted") == summary["tasks_submitted"]
    for status in ("succeeded", "failed", "cancelled", "deduped"):
        assert value("aiqsim_tasks_total", status=status) == summary[f"tasks_{status}"], status
    assert value("aiqsim_billed_calls_total") == summary["billed_calls"]
    assert value("aiqsim_duplicate_billed_calls_total") == summary["duplicate_billed_calls"]
    assert value("aiqsim_billed_cost_total") == pytest.approx(summary["cost_total"], rel=1e-12)
    assert value("aiqsim_duplicate_cost_total") == pytest.approx(summary["cost_duplicated"], rel=1e-12)
    assert value("aiqsim_queue_depth") == 0 and value("aiqsim_in_flight") == 0  # drained
    # success latency: the histogram holds exactly the latencies the summary's percentiles are of
    tasks = result.tasks
    done = tasks[tasks.status.isin([str(s) for s in SUCCESS_STATUSES])]
    assert value("aiqsim_task_latency_seconds") == len(done) == summary["tasks_succeeded"]
    scrape = prometheus_client.generate_latest(metrics.registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(scrape)}
    samples = families["aiqsim_task_latency_seconds"].samples
    total = next(s.value for s in samples if s.name.endswith("_sum"))
    assert total == pytest.approx(done.latency_s.sum(), rel=1e-12)
    buckets = {s.labels["le"]: s.value for s in samples if s.name.endswith("_bucket")}
    for bound in DEFAULT_LATENCY_BUCKETS:
        assert buckets[repr(bound)] == (done.latency_s <= bound).sum(), bound
    assert math.isclose(summary["success_latency_p50_s"], float(done.latency_s.median()))


def test_the_streaming_labs_summary_equals_the_metrics_too() -> None:
    """records="summary" (no per-task records kept): the same figures, the bills fed as the run goes."""
    metrics = PrometheusMetrics(prometheus_client.CollectorRegistry())
    summary = simulate(SCENARIO, sinks=[metrics], overrides=OVERRIDES, records="summary").summary
    assert summary["rate_limited"] > 0 and summary["duplicate_billed_calls"] > 0
    for key, name in (
        ("rate_limited", "aiqsim_rate_limited_total"),
        ("billed_calls", "aiqsim_billed_calls_total"),
        ("duplicate_billed_calls", "aiqsim_duplicate_billed_calls_total"),
        ("tasks_succeeded", "aiqsim_task_latency_seconds"),
    ):
        assert metrics.value(name) == summary[key], key
    duplicated = metrics.value("aiqsim_duplicate_cost_total")
    assert duplicated == pytest.approx(summary["cost_duplicated"], rel=1e-12)


def test_labels_stay_bounded_and_every_exported_name_is_documented() -> None:
    metrics = PrometheusMetrics(prometheus_client.CollectorRegistry())
    result = simulate(SCENARIO, sinks=[metrics], overrides=OVERRIDES)
    scrape = prometheus_client.generate_latest(metrics.registry).decode()
    task_ids = set(result.tasks.task_id)
    keys = set(result.tasks.key)
    documented = set(METRIC_NAMES)
    for family in text_string_to_metric_families(scrape):
        name = family.name + ("_total" if family.type == "counter" else "")
        assert name in documented, name
        for sample in family.samples:
            assert not set(sample.labels.values()) & (task_ids | keys), sample
    assert 'aiqsim_tasks_total{priority="background",provider="llm",status="succeeded"}' in scrape


def test_a_second_scheduler_on_the_same_registry_shares_the_series() -> None:
    registry = prometheus_client.CollectorRegistry()
    first, second = PrometheusMetrics(registry), PrometheusMetrics(registry)
    simulate(SCENARIO, sinks=[first], overrides=OVERRIDES)
    once = first.value("aiqsim_rate_limited_total")
    simulate(SCENARIO, sinks=[second], overrides=OVERRIDES)
    assert first.value("aiqsim_rate_limited_total") == second.value("aiqsim_rate_limited_total") == 2 * once
    assert prometheus_client.generate_latest(registry).decode().count("aiqsim_rate_limited_total{") == 1


def test_a_registry_holding_foreign_aiqsim_series_gets_a_clear_error() -> None:
    registry = prometheus_client.CollectorRegistry()
    prometheus_client.Counter("aiqsim_tasks", "someone else's", registry=registry)
    with pytest.raises(MetricsRegistryError, match="registry of its own") as caught:
        PrometheusMetrics(registry)
    assert isinstance(caught.value, ConfigurationError)
    with pytest.raises(MetricsRegistryError, match="same buckets"):
        good = prometheus_client.CollectorRegistry()
        PrometheusMetrics(good)
        PrometheusMetrics(good, buckets=(1.0, 2.0))


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"registry": "not a registry"}, "CollectorRegistry"),
        ({"buckets": (2.0, 1.0)}, "increasing"),
        ({"buckets": ()}, "increasing"),
        ({"limits": {"llm": 60}}, "QuotaLimits"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, Any], said: str) -> None:
    kwargs.setdefault("registry", prometheus_client.CollectorRegistry())
    with pytest.raises(ConfigurationError, match=said):
        PrometheusMetrics(**kwargs)


def test_gauges_follow_the_tasks_status_and_the_quota_level() -> None:
    metrics = PrometheusMetrics(
        prometheus_client.CollectorRegistry(), limits={"llm": QuotaLimits(requests_per_min=60)}
    )

    def move(task: str, old: str | None, new: str, priority: int = 0) -> None:
        metrics(TaskTransition(1.0, task, "k" + task, "llm", priority, old, new, 1))

    move("a", None, "queued")
    move("b", None, "queued")
    move("c", None, "queued", priority=1)
    assert metrics.value("aiqsim_queue_depth", provider="llm") == 3
    move("a", "queued", "running")
    assert metrics.value("aiqsim_queue_depth") == 2 and metrics.value("aiqsim_in_flight") == 1
    move("a", "running", "succeeded")
    move("x", "running", "failed")  # first seen after a restart: counted, no gauge goes negative
    assert metrics.value("aiqsim_in_flight") == 0
    assert metrics.value("aiqsim_tasks_total", status="failed") == 1
    assert metrics.value("aiqsim_task_latency_seconds") == 1
    metrics(QuotaSample(2.0, "llm", 15.0, math.nan, 1, 0, 0))
    assert metrics.value("aiqsim_quota_utilization", dimension="requests") == pytest.approx(0.75)
    assert metrics.value("aiqsim_quota_utilization", dimension="tokens") == 0  # no token bucket
    metrics(CallBilled(3.0, "llm", "a", "ka", 1, 0.5, duplicate=True))
    assert metrics.value("aiqsim_duplicate_cost_total", provider="llm") == 0.5
    with pytest.raises(ConfigurationError, match="labels"):
        metrics.value("aiqsim_tasks_total", task_id="a")
    with pytest.raises(ConfigurationError, match="not a counter"):
        metrics.value("aiqsim_nothing")


def test_a_task_lost_to_a_failed_store_write_leaves_the_gauges() -> None:
    """A task whose change could not be stored leaves this process (StoreWriteFailed): no transition
    of it follows here, so it leaves the queue-depth and in-flight gauges now. Before, it stayed
    counted as queued or running for ever (and held in the sink); an outcome written again later is
    counted as a task first seen after a restart is."""
    from aiqsim.scheduler.events import StoreWriteFailed

    metrics = PrometheusMetrics(prometheus_client.CollectorRegistry())

    def move(task: str, old: str | None, new: str) -> None:
        metrics(TaskTransition(1.0, task, "k" + task, "llm", 1, old, new, 1))

    def lose(task: str, lost: str) -> None:
        metrics(StoreWriteFailed(2.0, task, "k" + task, "llm", lost, "StoreWriteError: disk full"))

    move("a", None, "queued")
    move("b", None, "queued")
    move("b", "queued", "running")
    lose("a", "queued -> running")
    lose("b", "running -> succeeded")
    lose("b", "running -> succeeded (written again later)")  # a rewrite failing again: no change
    assert metrics.value("aiqsim_queue_depth", provider="llm") == 0
    assert metrics.value("aiqsim_in_flight", provider="llm") == 0
    assert metrics.value("aiqsim_store_write_failures_total", provider="llm") == 3
    move("b", "running", "succeeded")  # the outcome written again
    assert metrics.value("aiqsim_in_flight", provider="llm") == 0
    assert metrics.value("aiqsim_tasks_total", status="succeeded") == 1
    assert metrics._live == {}


def test_a_routed_task_moved_by_its_retry_leaves_the_gauge_it_was_counted_in() -> None:
    """A retry of a routed task moves it to another deployment (another provider's lane) while it
    runs: its end is reported on the new provider. Before, the end took it out of the new provider's
    in-flight gauge (-1 for ever) and left it in the old one's (+1 for ever)."""
    from aiqsim.core.backoff import ExponentialBackoff
    from aiqsim.runtime.simpy_runtime import SimPyRuntime
    from aiqsim.scheduler.routes import Route
    from tests.test_routes import Deployment

    metrics = PrometheusMetrics(prometheus_client.CollectorRegistry())

    async def body(rt: Any) -> Any:
        a, b = Deployment(rt, "a", fail=frozenset({"x"})), Deployment(rt, "b")
        retry = RetryPolicy(backoff=ExponentialBackoff(base_s=1.0, cap_s=1.0), max_attempts=3)
        routes = {"gpt": Route(["a", "b"], weights=[1000, 1])}  # a first; its retry moves to b
        scheduler = Scheduler(rt, [a, b], routes=routes, retry=retry, rng=random.Random(11), events=metrics)
        record = await scheduler.submit("gpt", {"input": "x"}, task_id="x").wait()
        await scheduler.close()
        return record, a.calls

    runtime = SimPyRuntime()
    record, a_calls = runtime.run(body(runtime))
    assert record.status is TaskStatus.SUCCEEDED and record.provider == "b" and len(a_calls) == 1
    for provider in ("a", "b"):
        assert metrics.value("aiqsim_in_flight", provider=provider) == 0
        assert metrics.value("aiqsim_queue_depth", provider=provider) == 0


def test_a_dropped_sink_leaves_its_gauges_out_of_the_scrape() -> None:
    registry = prometheus_client.CollectorRegistry()
    kept = PrometheusMetrics(registry)
    gone = PrometheusMetrics(registry)
    gone(TaskTransition(0.0, "t", "k", "llm", 0, None, "queued", 0))
    assert kept.value("aiqsim_queue_depth") == 1
    del gone
    gc.collect()
    assert kept.value("aiqsim_queue_depth") == 0
    assert kept.value("aiqsim_tasks_total", status="submitted") == 1  # counters are never lost
    quiet = PrometheusMetrics(registry)
    quiet(TaskTransition(0.0, "u", "k2", "llm", 0, None, "queued", 0))  # held, never read
    del quiet
    gc.collect()
    assert kept.value("aiqsim_tasks_total", status="submitted") == 2


def test_a_live_asyncio_scheduler_feeds_metrics_and_the_call_log_together() -> None:
    """Production: 429s from a scripted provider, both sinks behind one fan_out."""
    runtime = AsyncioRuntime()
    provider = ScriptedProvider(
        runtime, latency_s=0.001, script={"a": ["429:0.01", "ok"], "b": ["500", "ok"]}
    )
    metrics = PrometheusMetrics(prometheus_client.CollectorRegistry())
    log = CallLog()

    async def main() -> list[Any]:
        scheduler = Scheduler(
            runtime,
            [provider],
            retry=RetryPolicy(max_attempts=3),
            rng=random.Random(1),
            events=fan_out(log, metrics),
        )
        handles = [scheduler.submit("llm", {"input": name}, cost_estimate=1) for name in ("a", "b", "c")]
        records = [await handle.wait() for handle in handles]
        await scheduler.close()
        return records

    records = runtime.run(main())
    assert [r.status for r in records] == [TaskStatus.SUCCEEDED] * 3
    classes = Counter(row[9] for row in log.calls_rows)
    assert classes == {"ok": 3, "rate_limited": 1, "server_error": 1}
    for outcome, count in classes.items():
        assert metrics.value("aiqsim_attempts_total", provider="llm", outcome=outcome) == count
    assert metrics.value("aiqsim_rate_limited_total") == 1
    assert metrics.value("aiqsim_tasks_total", status="succeeded", priority="background") == 3


def test_spans_one_per_task_a_child_per_attempt_and_jobs_with_their_stages() -> None:
    provider, exporter = tracer()
    result = simulate(SCENARIO, sinks=[OpenTelemetryTracing(provider)], overrides=OVERRIDES)
    spans = exporter.get_finished_spans()
    tasks = {s.attributes["aiqsim.task_id"]: s for s in spans if s.name == "aiqsim.task"}
    by_span_id = {s.context.span_id: s for s in tasks.values()}
    attempts = [s for s in spans if s.name == "aiqsim.attempt"]
    assert len(tasks) == result.summary["tasks_submitted"]
    assert len(attempts) == result.summary["attempts"]
    for attempt in attempts:
        # the task's id and cost estimate are on its span, not repeated on each attempt
        assert "aiqsim.task_id" not in attempt.attributes and "aiqsim.cost_estimate" not in attempt.attributes
        parent = by_span_id[attempt.parent.span_id]
        assert attempt.attributes["aiqsim.provider"] == parent.attributes["aiqsim.provider"]
        assert attempt.context.trace_id == parent.context.trace_id
        assert parent.start_time <= attempt.start_time <= attempt.end_time <= parent.end_time
    limited = [a for a in attempts if a.attributes["aiqsim.outcome_class"] == "rate_limited"]
    assert len(limited) == result.summary["rate_limited"]
    assert all(a.attributes["aiqsim.retry_after_s"] >= 1.0 for a in limited)  # the server's Retry-After
    ok = [a for a in attempts if a.attributes["aiqsim.outcome"] == "ok"]
    assert ok and all(a.attributes["aiqsim.usage"] > 0 for a in ok)
    assert all("aiqsim.cost_estimate" in s.attributes for s in tasks.values())
    billed = sum(len([e for e in s.events if e.name == "aiqsim.billed"]) for s in tasks.values())
    assert billed > 0  # bills that arrived while their task was open are events on its span
    assert {s.attributes["aiqsim.status"] for s in tasks.values()} <= {"succeeded", "failed"}

    provider, exporter = tracer()
    simulate(
        "scenarios/ai_edit_pipeline.toml",
        sinks=[OpenTelemetryTracing(provider)],
        overrides={"scenario.duration_s": 10},
    )
    spans = exporter.get_finished_spans()
    (job,) = [s for s in spans if s.name == "aiqsim.job"]
    stages = [s for s in spans if s.name == "aiqsim.stage"]
    assert [s.attributes["aiqsim.stage"] for s in stages] == ["understand", "script", "tts", "subtitles"]
    assert all(s.parent.span_id == job.context.span_id for s in stages)
    assert job.attributes["aiqsim.status"] == "succeeded"


def _a_429_then_an_answer_over_http(
    tracing: OpenTelemetryTracing, name: str
) -> tuple[Any, list[HttpRequest]]:
    """One task through a real HttpProvider carrying ``tracing``'s headers, against a loopback server
    answering 429 (Retry-After 0) then 200: the task's record and the two requests the server saw."""
    seen: list[HttpRequest] = []
    body = completion_json("c1", "m", "hi", prompt=3, output=4, created=0)

    async def handle(request: HttpRequest) -> HttpReply:
        seen.append(request)
        if len(seen) == 1:
            return HttpReply.json(429, {"error": {"message": "slow"}}, {"retry-after": "0"})
        return HttpReply.json(200, body)

    runtime = AsyncioRuntime()

    async def main(url: str) -> Any:
        http = HttpProvider("llm", url, request_headers=tracing.headers_for, timeout=5.0)
        scheduler = Scheduler(runtime, [http], retry=RetryPolicy(max_attempts=3), events=tracing)
        record = await scheduler.submit("llm", "q", cost_estimate=1).wait()
        await scheduler.close()
        await http.aclose()
        return record

    with LoopbackHttpServer(handle, name=name) as server:
        return runtime.run(main(server.url)), seen


def test_http_requests_carry_the_attempts_traceparent() -> None:
    """W3C trace context: the provider's side sees the attempt span's ids in ``traceparent``."""
    provider, exporter = tracer()
    tracing = OpenTelemetryTracing(provider)
    record, seen = _a_429_then_an_answer_over_http(tracing, "traced")
    assert record.status is TaskStatus.SUCCEEDED and len(seen) == 2
    spans = exporter.get_finished_spans()
    (task,) = [s for s in spans if s.name == "aiqsim.task"]
    attempts = sorted(
        (s for s in spans if s.name == "aiqsim.attempt"), key=lambda s: s.attributes["aiqsim.attempt"]
    )
    assert [a.attributes["aiqsim.outcome"] for a in attempts] == ["RateLimitError", "ok"]
    for request, attempt in zip(seen, attempts, strict=True):
        version, trace_id, span_id, flags = request.headers["traceparent"].split("-")
        assert version == "00" and int(flags, 16) & 1  # sampled
        assert int(trace_id, 16) == task.context.trace_id == attempt.context.trace_id
        assert int(span_id, 16) == attempt.context.span_id
        assert attempt.parent.span_id == task.context.span_id
    with pytest.raises(ConfigurationError, match="request_headers"):
        HttpProvider("llm", "http://127.0.0.1:9", request_headers="traceparent")  # type: ignore[arg-type]


def test_a_task_sampled_out_records_no_attempt_and_tells_the_provider_so() -> None:
    """A sampler that keeps no trace: the attempts open no span, yet every request carries the
    task's trace context flagged not sampled (the provider's side records nothing either)."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = OpenTelemetryTracing(provider)
    record, seen = _a_429_then_an_answer_over_http(tracing, "unsampled")
    assert record.status is TaskStatus.SUCCEEDED and len(seen) == 2
    assert exporter.get_finished_spans() == ()
    parents = {request.headers["traceparent"] for request in seen}
    assert len(parents) == 1  # both attempts name the task's own (unrecorded) span
    version, trace_id, span_id, flags = parents.pop().split("-")
    assert version == "00" and int(trace_id, 16) and int(span_id, 16) and not int(flags, 16) & 1


def test_tracing_refuses_what_is_not_a_tracer_provider() -> None:
    with pytest.raises(ConfigurationError, match="TracerProvider"):
        OpenTelemetryTracing(tracer_provider=object())
    with pytest.raises(ConfigurationError, match="time_origin_ns"):
        OpenTelemetryTracing(time_origin_ns=1.5)  # type: ignore[arg-type]


def test_simulate_refuses_sinks_it_cannot_call() -> None:
    with pytest.raises(ConfigurationError, match=r"sinks\[1\]"):
        simulate(SCENARIO, sinks=[list().append, "metrics"], overrides=OVERRIDES)  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match="sequence of event sinks"):
        simulate(SCENARIO, sinks=PrometheusMetrics(prometheus_client.CollectorRegistry()))  # type: ignore[arg-type]


class NoSamples(list):
    """A sink that, like CallLog, says it does not want quota samples."""

    wants_quota_samples = False

    def __call__(self, event: Any) -> None:
        self.append(event)


def test_fan_out_sends_quota_samples_only_to_sinks_that_want_them() -> None:
    picky, seen = NoSamples(), []
    both = fan_out(picky, seen.append)
    assert both.wants_quota_samples
    assert not fan_out(picky, CallLog()).wants_quota_samples
    sample = QuotaSample(0.0, "llm", 1.0, 1.0, 0, 0, 0)
    move = TaskTransition(0.0, "t", "k", "llm", 0, None, "queued", 0)
    both(sample)
    both(move)
    assert seen == [sample, move] and picky == [move]
    with pytest.raises(ConfigurationError, match="sink 0"):
        fan_out(None)  # type: ignore[arg-type]


def test_the_served_providers_metrics_match_its_ledger_and_the_workers() -> None:
    """``GET /metrics`` of the simulated provider (``aiqsim serve``): its 429s are the ones the
    worker's PrometheusMetrics counted; its bills are its ledger's, under the same names."""
    import httpx

    from aiqsim.http.server import start_local_server
    from aiqsim.sim.config import ProviderConfig

    config = ProviderConfig(
        name="llm",
        latency_base_s=0.2,
        latency_per_unit_s=0.0,
        server_requests_per_min=6,
        price_per_1k_units=1.0,
    )
    scale = 0.01
    runtime = AsyncioRuntime(time_scale=scale)
    worker = PrometheusMetrics(prometheus_client.CollectorRegistry())

    async def main(url: str) -> list[Any]:
        http = HttpProvider("llm", url, time_scale=scale, timeout=30.0)
        scheduler = Scheduler(
            runtime, [http], retry=RetryPolicy(max_attempts=8), rng=random.Random(0), events=worker
        )
        handles = [scheduler.submit("llm", f"q{i}", cost_estimate=1) for i in range(10)]
        records = [await handle.wait() for handle in handles]
        await scheduler.close()
        await http.aclose()
        return records

    with start_local_server(config, time_scale=scale, seed=0) as server:
        records = runtime.run(main(server.url))
        reply = httpx.get(server.url + "/metrics", timeout=10.0)
        ledger = server.ledger()
    assert all(r.status is TaskStatus.SUCCEEDED for r in records)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    scraped = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(reply.text)
        for sample in family.samples
    }
    limited = scraped[("aiqsim_provider_rate_limited_total", (("provider", "llm"),))]
    assert limited == ledger.outcomes()["rate_limited"] == worker.value("aiqsim_rate_limited_total") > 0
    assert scraped[("aiqsim_billed_calls_total", (("provider", "llm"),))] == len(ledger.bills) == 10
    assert scraped[("aiqsim_billed_cost_total", (("provider", "llm"),))] == pytest.approx(ledger.total_cost)
    assert scraped[("aiqsim_duplicate_billed_calls_total", (("provider", "llm"),))] == ledger.duplicate_bills
    requests = sum(v for (name, _), v in scraped.items() if name == "aiqsim_provider_requests_total")
    assert requests == len(ledger.requests)


def test_a_sampled_out_task_records_no_span_and_costs_its_attempts_nothing() -> None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    result = simulate(SCENARIO, sinks=[OpenTelemetryTracing(provider)], overrides=OVERRIDES)
    assert result.summary["attempts"] > 0 and exporter.get_finished_spans() == ()


def test_aiqsim_serve_answers_get_metrics() -> None:
    """The real command, as a user starts it: the banner names the route and a scrape parses."""
    import httpx

    from tests.helpers_serve import ServedProvider

    with ServedProvider("scenarios/retry_storm_429.toml", "--time-scale", "0.1") as served:
        assert f"GET  {served.root}/metrics" in "\n".join(served.lines)
        httpx.post(
            f"{served.base_url}/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        reply = httpx.get(f"{served.root}/metrics", timeout=30)
        returncode, _, stderr = served.stop()
    assert returncode == 0, stderr
    scraped = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(reply.text)
        for sample in family.samples
    }
    assert scraped[("aiqsim_provider_requests_total", (("outcome", "ok"), ("provider", "llm")))] == 1
    assert scraped[("aiqsim_billed_calls_total", (("provider", "llm"),))] == 1


def test_job_counts_latency_and_stage_times_match_the_lab() -> None:
    metrics = PrometheusMetrics(prometheus_client.CollectorRegistry())
    result = simulate(
        "scenarios/ai_edit_pipeline.toml", sinks=[metrics], overrides={"scenario.duration_s": 120}
    )
    summary = result.summary
    assert summary["jobs_succeeded"] > 1
    for status in ("submitted", "succeeded", "failed", "cancelled", "deduped"):
        assert metrics.value("aiqsim_jobs_total", spec="ai_edit", status=status) == summary[f"jobs_{status}"]
    assert metrics.value("aiqsim_job_latency_seconds", spec="ai_edit") == summary["jobs_succeeded"]
    stages = ("understand", "script", "tts", "subtitles")
    for stage in stages:  # each succeeded job's stages all succeeded once (fallbacks aside)
        assert (
            metrics.value("aiqsim_job_stage_seconds", spec="ai_edit", stage=stage)
            >= summary["jobs_succeeded"]
        )
    jobs = result.jobs
    done = jobs[jobs.status == "succeeded"]
    scrape = prometheus_client.generate_latest(metrics.registry).decode()
    (family,) = [f for f in text_string_to_metric_families(scrape) if f.name == "aiqsim_job_latency_seconds"]
    total = next(s.value for s in family.samples if s.name.endswith("_sum"))
    assert total == pytest.approx(done.latency_s.sum(), rel=1e-9)


def test_a_shared_quota_outage_is_counted_and_traced() -> None:
    """QuotaUnavailable (a fleet's Redis account unreachable): a counter and an error span."""
    from aiqsim.scheduler.events import QuotaUnavailable

    metrics = PrometheusMetrics(prometheus_client.CollectorRegistry())
    provider, exporter = tracer()
    both = fan_out(metrics, OpenTelemetryTracing(provider, time_origin_ns=10**18))
    both(QuotaUnavailable(5.0, "llm", "ConnectionError: redis down"))
    both(QuotaUnavailable(9.0, "llm", "ConnectionError: redis down"))
    assert metrics.value("aiqsim_quota_unavailable_total", provider="llm") == 2
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["aiqsim.quota_unavailable"] * 2
    assert spans[0].start_time == 10**18 + 5 * 10**9 and not spans[0].status.is_ok
    assert spans[0].attributes["aiqsim.error"] == "ConnectionError: redis down"


def test_an_attempt_cancelled_in_flight_ends_its_span_with_its_task() -> None:
    """Before: headers_for opened the attempt's span and only its AttemptRecord ended it; a task
    cancelled while its call was out emits none, so the span stayed open and held for ever (one per
    cancelled call: a leak in a long-lived worker)."""
    import asyncio

    from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse

    provider, exporter = tracer()
    tracing = OpenTelemetryTracing(provider)
    sent = asyncio.Event()

    class Hanging:
        name = "llm"

        async def call(self, request: ProviderRequest) -> ProviderResponse:
            tracing.headers_for(request)  # as HttpProvider(request_headers=...) does
            sent.set()
            await asyncio.sleep(3600)
            raise AssertionError("never answered")

    runtime = AsyncioRuntime()

    async def main() -> Any:
        scheduler = Scheduler(runtime, [Hanging()], events=tracing)
        handle = scheduler.submit("llm", "q", cost_estimate=1)
        await sent.wait()
        assert scheduler.cancel(handle.id)
        record = await handle.wait()
        await scheduler.close()
        return record

    record = runtime.run(main())
    assert record.status is TaskStatus.CANCELLED
    spans = exporter.get_finished_spans()
    assert sorted(s.name for s in spans) == ["aiqsim.attempt", "aiqsim.task"]
    (attempt,) = [s for s in spans if s.name == "aiqsim.attempt"]
    assert attempt.attributes["aiqsim.outcome"] == "cancelled"
    assert tracing._attempts == {}


@pytest.mark.parametrize("sampled", [True, False], ids=["sampled", "sampled-out"])
def test_a_task_lost_to_a_failed_store_write_ends_its_span(sampled: bool) -> None:
    """A task whose change could not be stored leaves this process (StoreWriteFailed; recover()
    reconciles it after a restart): no transition of it follows here. Before, its span stayed in the
    sink for ever (never ended, never exported; sampled out too: one entry per lost task)."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    from aiqsim.stores.base import StoreWriteError
    from aiqsim.stores.memory import MemoryStore
    from tests.failing_stores import FailingWrites

    exporter = InMemorySpanExporter()
    provider = TracerProvider() if sampled else TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = OpenTelemetryTracing(provider, time_origin_ns=10**18)

    async def body(rt: Any) -> Any:
        store = FailingWrites(MemoryStore(), fail_at={2})  # 1: its insert, 2: queued -> running
        scheduler = Scheduler(rt, [ScriptedProvider(rt)], store=store, events=tracing)
        with pytest.raises(StoreWriteError):
            await scheduler.submit("llm", {"input": "a"}).wait()
        done = await scheduler.submit("llm", {"input": "b"}).wait()
        await scheduler.close()
        return done

    from tests.runtimes import run_on

    assert run_on("simpy", body).status is TaskStatus.SUCCEEDED
    assert tracing._tasks == {} and tracing._attempts == {}
    spans = [s for s in exporter.get_finished_spans() if s.name == "aiqsim.task"]
    if not sampled:
        assert spans == []
        return
    assert sorted(str(s.attributes.get("aiqsim.status")) for s in spans) == ["None", "succeeded"]
    (lost,) = [s for s in spans if "aiqsim.status" not in s.attributes]
    assert not lost.status.is_ok and [e.name for e in lost.events] == ["aiqsim.store_write_failed"]
    assert lost.events[0].attributes["aiqsim.lost"].endswith("queued -> running")
