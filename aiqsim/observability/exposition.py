"""Prometheus text exposition (format 0.0.4), rendered by hand for servers without prometheus_client.

``aiqsim serve`` answers ``GET /metrics`` with this: a handful of counters, so the simulated
provider can be scraped by the same Prometheus and shown on the same dashboard as a worker, with
no extra package on the server's side.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from aiqsim.core.errors import ConfigurationError
from aiqsim.observability.definitions import METRIC_NAMES

__all__ = ["CONTENT_TYPE", "MetricFamily", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""What Prometheus expects of a text-format scrape."""


@dataclass(frozen=True)
class MetricFamily:
    """One metric: ``name`` (a counter's ends in ``_total``), ``kind`` (``counter`` or ``gauge``),
    its label names and one value per tuple of label values."""

    name: str
    kind: str
    labels: tuple[str, ...]
    samples: Mapping[tuple[str, ...], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in ("counter", "gauge"):
            raise ConfigurationError(
                f"MetricFamily {self.name}: kind must be counter or gauge, not {self.kind!r}"
            )
        if self.name not in METRIC_NAMES:
            raise ConfigurationError(f"MetricFamily {self.name}: not one of aiqsim's documented metric names")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def render(families: Iterable[MetricFamily]) -> str:
    """The families as a scrape body: ``# HELP`` (from :data:`METRIC_NAMES`), ``# TYPE``, samples."""
    lines = []
    for family in families:
        base = family.name.removesuffix("_total") if family.kind == "counter" else family.name
        lines.append(f"# HELP {base} {_escape(METRIC_NAMES[family.name])}")
        lines.append(f"# TYPE {base} {family.kind}")
        for values, value in sorted(family.samples.items()):
            pairs = ",".join(
                f'{label}="{_escape(str(item))}"' for label, item in zip(family.labels, values, strict=True)
            )
            lines.append(
                f"{family.name}{{{pairs}}} {_number(value)}" if pairs else f"{family.name} {_number(value)}"
            )
    return "\n".join(lines) + "\n"
