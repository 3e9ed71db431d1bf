"""Job templates in scenario files: what one user action sets off, as frozen records.

A job is a DAG of stages; each stage calls one provider, or one route over several deployments
(``fanout`` times, e.g. one TTS call per paragraph) with a size drawn per job or derived from an
earlier stage's output (script tokens driving TTS characters). The loader
(:mod:`aiqsim.sim.scenario`) validates ``[[jobs]]`` tables into these records;
:mod:`aiqsim.sim.job_workloads` draws each job's inputs and :mod:`aiqsim.sim.job_templates` turns a
template into the production scheduler's job spec.
Units are the provider's (tokens for ``llm``, characters for ``tts``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from aiqsim.core.errors import ConfigurationError

SizeDist = Literal["fixed", "lognormal", "uniform", "from_stage"]
CountDist = Literal["fixed", "lognormal", "uniform"]

MAX_FANOUT = 1000
"""Most calls one stage of one job may fan out to; larger draws are clipped (a typo guard)."""


@dataclass(frozen=True, slots=True)
class StageSizeConfig:
    """How many units one stage of one job asks for, in total over its fan-out calls.

    ``fixed``: ``mean``. ``lognormal``: mean ``mean``, log-space sigma ``sigma``. ``uniform``:
    between ``low`` and ``high``. These are drawn once per job when it arrives (so the clicks of a
    double-click carry identical jobs). ``from_stage``: ``ratio`` times the output units the stage
    named ``stage`` produced (summed over its fan-out calls), known only once that stage is done.
    Whole units, at least 1 per call; ``output_fraction`` of an ``llm`` call's units are output.
    """

    dist: SizeDist = "fixed"
    mean: float = 500.0
    sigma: float = 0.5
    low: float = 1.0
    high: float = 1000.0
    stage: str | None = None
    ratio: float = 1.0
    output_fraction: float = 0.2


@dataclass(frozen=True, slots=True)
class FanoutConfig:
    """How many calls one stage makes per job (drawn per job; whole, at least 1, at most
    :data:`MAX_FANOUT`). The stage's units are split evenly over them."""

    dist: CountDist = "fixed"
    mean: float = 1.0
    sigma: float = 0.5
    low: float = 1.0
    high: float = 1.0


@dataclass(frozen=True, slots=True)
class StageConfig:
    """One stage of a job template: calls to ``provider`` (or to ``route``: exactly one of the two is
    set) once the stages in ``after`` are done.

    ``route`` names a ``[[routes]]`` entry: each of the stage's calls is submitted to that route, whose
    policy gives it one of the route's deployments, as a production :class:`~aiqsim.scheduler.jobs.Stage`
    naming a route does. ``fallback`` names a provider that takes the stage's calls when they fail
    (fatal error or retries exhausted).
    """

    name: str
    provider: str | None = None
    after: tuple[str, ...] = ()
    size: StageSizeConfig = field(default_factory=StageSizeConfig)
    fanout: FanoutConfig = field(default_factory=FanoutConfig)
    fallback: str | None = None
    route: str | None = None

    def __post_init__(self) -> None:
        if (self.provider is None) == (self.route is None):
            raise ConfigurationError(
                f"stage {self.name!r}: expected exactly one of provider or route, "
                f"got provider={self.provider!r}, route={self.route!r}"
            )

    @property
    def target(self) -> str:
        """What the stage's calls are submitted to: the route when the stage names one, else the provider."""
        if self.route is not None:
            return self.route
        assert self.provider is not None  # __post_init__: exactly one of the two
        return self.provider


@dataclass(frozen=True, slots=True)
class JobConfig:
    """A job template: named stages forming a DAG (a stage may only wait for stages declared
    before it, so a template can never have a cycle)."""

    name: str
    stages: tuple[StageConfig, ...]
    description: str = ""

    def stage(self, name: str) -> StageConfig:
        """The stage called ``name``; ``KeyError`` if there is none."""
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)
