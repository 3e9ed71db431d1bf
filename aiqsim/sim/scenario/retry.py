"""The ``[retry]`` and ``[overload]`` sections: how failed calls are retried, and what holds retries
back (retry budgets, breakers, throttling)."""

from __future__ import annotations

from typing import Any

from aiqsim.sim.config import OverloadConfig, RetryConfig
from aiqsim.sim.scenario.errors import _fmt
from aiqsim.sim.scenario.reader import _Reader


def _retry(values: dict[str, Any], reader: _Reader) -> RetryConfig:
    retry = RetryConfig(**values)
    if not retry.cap_s >= retry.base_s:
        raise reader.error(
            "retry.cap_s" if "cap_s" in values else "retry.base_s",
            f"expected cap_s >= base_s, got cap_s = {_fmt(retry.cap_s)} and base_s = {_fmt(retry.base_s)}",
        )
    return retry


def _overload(values: dict[str, Any], reader: _Reader) -> OverloadConfig:
    overload = OverloadConfig(**values)
    if overload.budget_ratio <= 0 and overload.retry_budget == "ratio":
        raise reader.error("overload.budget_ratio", 'expected a number > 0 with retry_budget = "ratio"')
    return overload
