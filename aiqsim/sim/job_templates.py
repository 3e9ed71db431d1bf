"""From a scenario's job template to the payloads of its stage calls (pure functions).

A stage's build function is a plain function of the job's inputs and the results of the stages it
waits for, so it runs inside the production scheduler and gives the same payloads on every run and
after every crash (the stage fingerprints, hence the idempotency keys, stay the same).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiqsim.scheduler.jobs import JobSpec, Stage
from aiqsim.sim.config import ProviderKind, Scenario
from aiqsim.sim.job_config import JobConfig, StageConfig
from aiqsim.sim.workloads import split_units

__all__ = ["StageBuilder", "job_spec", "job_specs", "output_units_of", "stage_payloads", "stage_units"]


def output_units_of(result: Any) -> int:
    """Output units a finished stage produced: its result's ``output_units``, summed over a fan-out.

    A simulated provider's result is ``{"input", "output_units", "provider"}``; a fan-out stage's
    result is the list of its calls' results.
    """
    if isinstance(result, list | tuple):
        return sum(output_units_of(item) for item in result)
    if isinstance(result, Mapping):
        value = result.get("output_units", 0)
        return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0
    return 0


def stage_units(stage: StageConfig, inputs: Mapping[str, Any], results: Mapping[str, Any]) -> int:
    """The stage's total units for this job: drawn at arrival (``inputs["units"]``) or ``ratio`` times
    the output of the stage named by ``size.stage`` (at least 1)."""
    if stage.size.dist == "from_stage":
        assert stage.size.stage is not None
        return max(1, round(stage.size.ratio * output_units_of(results[stage.size.stage])))
    return int(inputs["units"][stage.name])


def stage_payloads(
    stage: StageConfig, kind: ProviderKind, inputs: Mapping[str, Any], results: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The payloads of the stage's calls for this job: ``inputs["fanout"][stage]`` of them, the stage's
    units split evenly (the first calls take the remainder), each at least 1 unit.

    Each call's input label is ``{job input}/{stage}/{call}``: distinct per stage and call, identical
    for identical jobs (a double-clicked job's stages deduplicate call by call).
    """
    total = stage_units(stage, inputs, results)
    calls = max(1, int(inputs["fanout"].get(stage.name, 1)))
    base, extra = divmod(total, calls)
    payloads = []
    for call in range(calls):
        units = max(1, base + (1 if call < extra else 0))
        prompt, output = split_units(units, kind, stage.size.output_fraction)
        payloads.append(
            {
                "input": f"{inputs['input']}/{stage.name}/{call}",
                "prompt_units": prompt,
                "output_units": output,
                "poison": False,
            }
        )
    return payloads


def fans_out(stage: StageConfig) -> bool:
    """Whether the stage may make more than one call per job (its build then returns a list)."""
    fanout = stage.fanout
    return not (fanout.dist == "fixed" and round(fanout.mean) <= 1)


@dataclass(frozen=True)
class StageBuilder:
    """The ``build`` of one template stage: ``(inputs, results) -> payload`` (a list when it fans out).

    A frozen value object rather than a closure, so it is a plain deterministic function of its
    arguments and of the template, as the scheduler requires of a build.
    """

    stage: StageConfig
    kind: ProviderKind
    fan_out: bool

    def __call__(self, inputs: Mapping[str, Any], results: Mapping[str, Any]) -> Any:
        payloads = stage_payloads(self.stage, self.kind, inputs, results)
        return payloads if self.fan_out else payloads[0]


def _deployment(stage: StageConfig, scenario: Scenario) -> str:
    """A provider the stage calls, for its kind: its own, or its route's first deployment (a route's
    deployments are all of one kind)."""
    return scenario.route(stage.route).providers[0] if stage.route is not None else stage.target


def job_spec(template: JobConfig, scenario: Scenario) -> JobSpec:
    """The production scheduler's :class:`~aiqsim.scheduler.job_spec.JobSpec` for a scenario's template.

    The spec's version is a digest of the template and of its providers' kinds: change the
    template and its jobs get new keys (a build's code is known to the job key only by name). A stage
    naming a route becomes a :class:`~aiqsim.scheduler.job_spec.Stage` whose ``provider`` is the route's
    name, which the production scheduler resolves to one of the route's deployments per call.
    """
    kinds = {stage.name: scenario.provider(_deployment(stage, scenario)).kind for stage in template.stages}
    digest = hashlib.sha256(repr((template, sorted(kinds.items()))).encode("utf-8")).hexdigest()[:16]
    stages = tuple(
        Stage(
            name=stage.name,
            provider=stage.target,  # a route's name: the scheduler's route picks each call's deployment
            after=stage.after,
            build=StageBuilder(stage, kinds[stage.name], fans_out(stage)),
            fan_out=fans_out(stage),
            fallback=stage.fallback,
        )
        for stage in template.stages
    )
    return JobSpec(name=template.name, version=digest, stages=stages)


def job_specs(scenario: Scenario) -> dict[str, JobSpec]:
    """A spec for every template a workload of the scenario submits, by template name."""
    used = {workload.job for workload in scenario.workloads if workload.job is not None}
    return {t.name: job_spec(t, scenario) for t in scenario.jobs if t.name in used}
