"""The ``[quotas.NAME]`` tables: a client-side quota for a declared provider, bursts only with their rate;
and the most units a quota can ever grant at once, which workloads, job stages and a split fleet are
checked against (a larger call would wait for ever)."""

from __future__ import annotations

from typing import Any

from aiqsim.sim.config import ClientQuotaConfig
from aiqsim.sim.scenario.errors import ScenarioError, _fmt, describe
from aiqsim.sim.scenario.reader import _Reader


def _quotas(
    raw: dict[str, dict[str, Any]], names: list[str], reader: _Reader
) -> dict[str, ClientQuotaConfig]:
    quotas = {}
    for name, values in raw.items():
        if name not in names:
            raise reader.error(
                f"quotas.{name}",
                f"expected the name of a declared provider ({', '.join(names)}), got {describe(name)}",
            )
        quota = ClientQuotaConfig(**values)
        for burst, rate in (("request_burst", "requests_per_min"), ("unit_burst", "units_per_min")):
            if getattr(quota, burst) is not None and getattr(quota, rate) is None:
                raise reader.error(
                    f"quotas.{name}.{burst}", f"only applies together with {rate}, which is not set"
                )
        if quota.request_burst is None and quota.requests_per_min is not None and quota.requests_per_min < 1:
            # the rule QuotaLimits applies when the run starts (request_burst itself is checked >= 1)
            raise reader.error(
                f"quotas.{name}.requests_per_min",
                "a request burst (request_burst, else one minute of requests_per_min) of at least 1, got "
                f"{quota.requests_per_min:g}: every call takes one request, so a smaller bucket never "
                "grants one (set request_burst = 1)",
            )
        quotas[name] = quota
    return quotas


def _unit_capacity(quota: ClientQuotaConfig | None) -> float | None:
    """The most units a client quota can ever grant at once (``unit_burst``, else ``units_per_min``), or
    None when it sets no unit rate: a larger call could never be granted."""
    if quota is None or quota.units_per_min is None:
        return None
    return quota.unit_burst if quota.unit_burst is not None else quota.units_per_min


def _never_granted(
    reader: _Reader, path: str, provider: str, capacity: float, got: int, *, per_call: bool = False
) -> ScenarioError:
    """The error for a size larger than ``provider``'s client quota can ever grant (see
    :func:`_unit_capacity`); ``per_call``: a job stage's size, split over its fan-out's calls."""
    expected, unit = ("calls of at most", " per call") if per_call else ("at most", "")
    return reader.error(
        path,
        f"expected {expected} {_fmt(capacity)} units (the client quota of {provider!r} can never grant "
        f"more: quotas.{provider}.unit_burst, or units_per_min when unset), got {got}{unit}",
    )
