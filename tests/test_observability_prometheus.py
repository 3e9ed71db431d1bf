"""A real Prometheus scrapes a running worker's metrics and answers for ``aiqsim_tasks_total``.

The worker is a real asyncio scheduler whose provider answers some calls with 429, exporting through
``PrometheusMetrics`` on ``prometheus_client.start_http_server`` (127.0.0.1, a free port). The
Prometheus server is the one ``.ci/services.sh`` starts (``AIQSIM_TEST_PROMETHEUS_URL``), else a
throwaway one (tests/prometheus_server.py); the test adds the worker as a scrape target of its own
and asks Prometheus's HTTP API. Scrapes run every second; the wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

prometheus_client = pytest.importorskip("prometheus_client")

from aiqsim.core.task import TaskStatus  # noqa: E402
from aiqsim.observability import PrometheusMetrics  # noqa: E402
from aiqsim.runtime import AsyncioRuntime  # noqa: E402
from aiqsim.scheduler import Scheduler  # noqa: E402
from aiqsim.scheduler.retry import RetryPolicy  # noqa: E402
from tests.fakes import ScriptedProvider  # noqa: E402
from tests.prometheus_server import SCRAPE_INTERVAL_S, prometheus_server, query, scrape_target  # noqa: E402
from tests.servers import ServerUnavailable, in_ci  # noqa: E402

WAIT_S = 60.0
"""Upper bound on the wait for the scraped values: a target file is picked up within a second and
scraped every second; 60 s leaves room for a loaded 2-core machine without letting a hang run on."""


@pytest.fixture(scope="module")
def prometheus() -> Iterator[tuple[str, Path]]:
    url, targets = (
        os.environ.get("AIQSIM_TEST_PROMETHEUS_URL"),
        os.environ.get("AIQSIM_TEST_PROMETHEUS_TARGETS"),
    )
    if url and targets:
        yield url, Path(targets)
        return
    with contextlib.ExitStack() as stack:
        try:
            yield stack.enter_context(prometheus_server())
        except ServerUnavailable as error:
            if in_ci():
                pytest.fail(f"CI=true and no Prometheus server: {error}")
            pytest.skip(f"no Prometheus server here: {error} (set AIQSIM_TEST_PROMETHEUS_URL/_TARGETS)")


def run_worker(metrics: PrometheusMetrics) -> list[object]:
    """A short production run: 8 tasks, two of which meet a 429 first and one a 500."""
    runtime = AsyncioRuntime()
    script = {"a": ["429:0.01", "ok"], "b": ["429:0.01", "429:0.01", "ok"], "c": ["500", "ok"]}
    provider = ScriptedProvider(runtime, latency_s=0.001, script=script)

    async def main() -> list[object]:
        scheduler = Scheduler(
            runtime, [provider], retry=RetryPolicy(max_attempts=4), rng=random.Random(5), events=metrics
        )
        inputs = ["a", "b", "c", "d", "e", "f", "g", "h"]
        handles = [scheduler.submit("llm", {"input": name}, cost_estimate=1) for name in inputs]
        records = [await handle.wait() for handle in handles]
        await scheduler.close()
        return records

    return runtime.run(main())


def test_a_real_prometheus_scrapes_the_workers_task_counts(prometheus: tuple[str, Path]) -> None:
    url, targets = prometheus
    registry = prometheus_client.CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    records = run_worker(metrics)
    assert all(r.status is TaskStatus.SUCCEEDED for r in records)  # type: ignore[attr-defined]
    server, thread = prometheus_client.start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        with scrape_target(targets, server.server_port) as run:
            deadline = time.monotonic() + WAIT_S
            while True:
                succeeded = query(url, f'aiqsim_tasks_total{{aiqsim_test_run="{run}",status="succeeded"}}')
                limited = query(url, f'aiqsim_rate_limited_total{{aiqsim_test_run="{run}"}}')
                if succeeded and limited:
                    break
                assert time.monotonic() < deadline, f"Prometheus at {url} never scraped the worker"
                time.sleep(SCRAPE_INTERVAL_S / 4)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    (series,) = succeeded
    assert series["metric"]["provider"] == "llm" and series["metric"]["priority"] == "background"
    assert series["metric"]["job"] == "aiqsim-tests"
    assert float(series["value"][1]) == 8 == metrics.value("aiqsim_tasks_total", status="succeeded")
    (series,) = limited
    assert float(series["value"][1]) == 3 == metrics.value("aiqsim_rate_limited_total")


def test_every_dashboard_query_is_promql_prometheus_accepts(prometheus: tuple[str, Path]) -> None:
    """The Grafana dashboard's queries, with Grafana's variables filled in, parse and evaluate."""
    from tests.test_deploy_observability import expressions

    url, _ = prometheus
    for expr in expressions():
        query(url, expr)  # asserts status == "success"; a syntax error is a 400 (an HTTPError)


def test_ci_services_start_a_prometheus_the_tests_can_use(tmp_path: Path) -> None:
    """.ci/services.sh's Prometheus: ready on loopback, its targets folder exported, gone on stop."""
    import shutil
    import subprocess

    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not installed (Debian: apt-get install prometheus)")
    script = (
        'source .ci/services.sh; SERVICES_DIR="$1"; _start_prometheus; '
        'echo "$AIQSIM_TEST_PROMETHEUS_URL $AIQSIM_TEST_PROMETHEUS_TARGETS"; '
        'cat "$SERVICES_DIR/prometheus/prometheus.pid"; stop_services'
    )
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        ["bash", "-c", script, "services", str(tmp_path / "services")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "CI"},
    )
    assert done.returncode == 0, done.stderr
    line, pid = done.stdout.split("\n")[:2]
    url, targets = line.split()
    assert url.startswith("http://127.0.0.1:") and targets.endswith("/prometheus/targets")
    assert "services: Prometheus on " + url in done.stderr
    assert not (tmp_path / "services").exists()  # stop_services removed its files
    with pytest.raises(OSError):
        os.kill(int(pid), 0)  # and the server is gone
