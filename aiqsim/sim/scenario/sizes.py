"""Size distributions (a workload's cost, a stage's size and fan-out): the rules they share, and the
largest call a bounded one can produce (checked against client quotas)."""

from __future__ import annotations

from typing import Any

from aiqsim.sim.config import CostConfig
from aiqsim.sim.job_config import FanoutConfig, StageSizeConfig
from aiqsim.sim.scenario.errors import _fmt, describe
from aiqsim.sim.scenario.reader import _Reader


def _uniform_bounds_checked(config: Any, values: dict[str, Any], path: str, reader: _Reader) -> Any:
    """The one rule every ``dist = "uniform"`` table shares (costs, stage sizes, fan-out): ``high >= low``."""
    if config.dist == "uniform" and not config.high >= config.low:
        raise reader.error(
            f"{path}.high",
            f"expected a number >= low ({_fmt(config.low)}), got {describe(values.get('high', config.high))}",
        )
    return config


def _cost(values: dict[str, Any], path: str, reader: _Reader) -> CostConfig:
    return _uniform_bounds_checked(CostConfig(**values), values, path, reader)


def _largest_fixed_units(cost: CostConfig | StageSizeConfig) -> int | None:
    """The largest task a bounded size distribution can produce (None for unbounded ones, and for a
    stage's size taken from an earlier stage)."""
    if cost.dist == "fixed":
        return max(1, round(cost.mean))
    if cost.dist == "uniform":
        return max(1, round(cost.high))
    return None


def _stage_size(values: dict[str, Any], path: str, reader: _Reader) -> StageSizeConfig:
    return _uniform_bounds_checked(StageSizeConfig(**values), values, path, reader)


def _fanout(values: dict[str, Any], path: str, reader: _Reader) -> FanoutConfig:
    return _uniform_bounds_checked(FanoutConfig(**values), values, path, reader)
