"""deploy/: the Grafana dashboard, the Prometheus configuration, the compose file and the demo worker.

No Grafana runs here (nor docker): the dashboard is checked against a JSON Schema of the parts of
Grafana's dashboard model it uses, every PromQL expression is parsed by a real Prometheus
(tests/test_observability_prometheus.py) and must name only metrics aiqsim exports, and
deploy/prometheus.yml goes through ``promtool check config`` when promtool is installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

jsonschema = pytest.importorskip("jsonschema")
yaml = pytest.importorskip("yaml")
prometheus_client = pytest.importorskip("prometheus_client")

from aiqsim.observability.definitions import METRIC_NAMES  # noqa: E402
from aiqsim.observability.prometheus import PrometheusMetrics  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "aiqsim.json"

PANEL_TYPES = {"timeseries", "stat", "gauge", "bargauge", "table", "heatmap", "text", "row"}

DASHBOARD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["uid", "title", "schemaVersion", "panels", "time", "templating"],
    "properties": {
        "uid": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$"},
        "title": {"type": "string", "minLength": 1},
        "schemaVersion": {"type": "integer", "minimum": 36},
        "refresh": {"type": "string"},
        "time": {
            "type": "object",
            "required": ["from", "to"],
            "properties": {"from": {"type": "string"}, "to": {"type": "string"}},
        },
        "templating": {
            "type": "object",
            "required": ["list"],
            "properties": {
                "list": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "type"],
                        "properties": {
                            "name": {"type": "string"},
                            "type": {"enum": ["datasource", "query", "custom", "constant", "interval"]},
                        },
                    },
                }
            },
        },
        "panels": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["id", "type", "title", "gridPos", "targets", "datasource"],
                "properties": {
                    "id": {"type": "integer", "minimum": 1},
                    "type": {"enum": sorted(PANEL_TYPES)},
                    "title": {"type": "string", "minLength": 1},
                    "datasource": {
                        "type": "object",
                        "required": ["type", "uid"],
                        "properties": {"type": {"const": "prometheus"}},
                    },
                    "gridPos": {
                        "type": "object",
                        "required": ["x", "y", "w", "h"],
                        "properties": {
                            "x": {"type": "integer", "minimum": 0, "maximum": 23},
                            "y": {"type": "integer", "minimum": 0},
                            "w": {"type": "integer", "minimum": 1, "maximum": 24},
                            "h": {"type": "integer", "minimum": 1},
                        },
                    },
                    "targets": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["refId", "expr"],
                            "properties": {
                                "refId": {"type": "string", "pattern": "^[A-Z]$"},
                                "expr": {"type": "string", "minLength": 1},
                            },
                        },
                    },
                },
            },
        },
    },
}
"""The parts of Grafana's dashboard JSON model (schemaVersion 36+) the dashboard uses."""

PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "by", "without", "rate", "increase", "irate",
    "histogram_quantile", "le", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "label_values",
}  # fmt: skip
GRAFANA_SUBSTITUTIONS = {"$__rate_interval": "1m", "$__range": "15m", "$provider": ".*"}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def expressions() -> list[str]:
    """Every panel query, with Grafana's variables replaced as Grafana would before sending it."""
    found = []
    for panel in dashboard()["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in GRAFANA_SUBSTITUTIONS.items():
                expr = expr.replace(variable, value)
            found.append(expr)
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers outside label matchers, ranges and
    grouping clauses that are not functions, aggregations or keywords."""
    bare = re.sub(r'"[^"]*"', "", expr)
    bare = re.sub(r"\{[^}]*\}", "", bare)
    bare = re.sub(r"\[[^\]]*\]", "", bare)
    bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", bare)
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare))
    return {word for word in words if word not in PROMQL_WORDS}


def exported_series() -> set[str]:
    """Series names a scrape of a worker and of ``aiqsim serve`` can hold (a histogram's three)."""
    metrics = PrometheusMetrics(prometheus_client.CollectorRegistry())
    names = set()
    for family in metrics.registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names |= {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
        else:
            names.add(family.name)
    from aiqsim.http.server import Ledger, ledger_metrics

    names |= {family.name for family in ledger_metrics(Ledger((), ()), "llm")}
    return names


def test_the_dashboard_matches_grafanas_model() -> None:
    board = dashboard()
    jsonschema.validate(board, DASHBOARD_SCHEMA)
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    variables = {item["name"] for item in board["templating"]["list"]}
    for panel in board["panels"]:
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for source in [
            panel["datasource"],
            *(t.get("datasource", panel["datasource"]) for t in panel["targets"]),
        ]:
            assert source["uid"].removeprefix("${").removesuffix("}") in variables
    with pytest.raises(jsonschema.ValidationError):  # the schema can fail
        jsonschema.validate(
            {**board, "panels": [{**board["panels"][0], "gridPos": {"x": 30}}]}, DASHBOARD_SCHEMA
        )


def test_every_query_names_only_metrics_aiqsim_exports() -> None:
    exported = exported_series()
    assert exported - {n for n in exported if n.startswith("aiqsim_")} == set()
    used = set()
    for expr in expressions():
        names = metric_names(expr)
        assert names, expr
        assert names <= exported, (expr, names - exported)
        used |= names
    # the panels the dashboard exists for
    for needed in (
        "aiqsim_queue_depth",
        "aiqsim_rate_limited_total",
        "aiqsim_task_latency_seconds_bucket",
        "aiqsim_quota_utilization",
        "aiqsim_duplicate_cost_total",
    ):
        assert needed in used, needed
    assert any("histogram_quantile(0.99" in expr for expr in expressions())
    assert metric_names('sum by (provider) (rate(aiqsim_nope_total{provider="x"}[1m]))') == {
        "aiqsim_nope_total"
    }


def test_the_documented_names_are_the_exported_ones() -> None:
    documented = set(METRIC_NAMES)
    exported = exported_series()
    histograms = {n.removesuffix("_bucket") for n in exported if n.endswith("_bucket")}
    plain = {n for n in exported if not n.endswith(("_bucket", "_sum", "_count"))} | histograms
    assert plain == documented


def test_the_prometheus_configuration_is_valid() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text(encoding="utf-8"))
    targets = {
        target
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    }
    assert targets == {"127.0.0.1:9464", "127.0.0.1:8000"}
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    checked = subprocess.run(
        [promtool, "check", "config", str(DEPLOY / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_compose_file_wires_prometheus_and_grafana_beside_a_worker() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))
    services = compose["services"]
    assert {"provider", "worker", "prometheus", "grafana", "postgres", "redis"} <= set(services)
    for name, service in services.items():
        assert service.get("image"), name
        mode = service.get("network_mode", "")
        if mode:
            assert mode.removeprefix("service:") in services, name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), (name, source)
    assert "deploy/worker.py" in " ".join(services["worker"]["command"])
    datasource = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text(encoding="utf-8")
    )
    (source,) = datasource["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://127.0.0.1:9090"
    published = {port.split(":")[1] for port in services["provider"]["ports"]}
    assert {"9090", "3000"} <= published


def test_the_demo_worker_runs_against_the_simulated_provider(tmp_path: Path) -> None:
    from aiqsim.http.server import start_local_server
    from aiqsim.sim.config import ProviderConfig

    config = ProviderConfig(name="llm", latency_base_s=0.01, latency_per_unit_s=0.0)
    with start_local_server(config, seed=0) as server:
        done = subprocess.run(
            [sys.executable, str(DEPLOY / "worker.py"), "--base-url", server.url + "/v1",
             "--metrics-port", "0", "--tasks", "6", "--rate", "50"],
            capture_output=True, text=True, timeout=120, cwd=ROOT,
        )  # fmt: skip
        ledger = server.ledger()
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.match(r"metrics on http://127\.0\.0\.1:\d+/metrics", done.stdout)
    assert len(ledger.bills) == 6
    refused = subprocess.run(
        [sys.executable, str(DEPLOY / "worker.py"), "--rate", "0"], capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2 and "--rate" in refused.stderr
