"""From a scenario's job template to the payloads of its stage calls (pure functions).

A stage's build function is a plain function of the job's inputs and the results of the stages it
waits for, so it runs inside the production scheduler and gives the same payloads on every run and
after every crash (the stage fingerprints, hence the idempotency keys, stay the same).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiqsim.sim.config import ProviderKind
from aiqsim.sim.job_config import StageConfig
from aiqsim.sim.workloads import split_units

__all__ = ["output_units_of", "stage_payloads", "stage_units"]


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
