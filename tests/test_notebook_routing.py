"""notebooks/12_routing_and_fairness.ipynb: the command its decision prints reproduces the figures it
states for the scenario file's own seed (the run the command makes), in its ``check:`` line, which
tests/test_notebooks.py runs: the simulator is deterministic for a seed, so any difference is a
notebook that reports one setting and recommends another. Its noisy-tenant section shows the quiet
tenant unharmed by fair sharing."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from executed_notebooks import executed, printed

from aiqsim.sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "12_routing_and_fairness.ipynb"


@pytest.mark.notebook
def test_the_decision_checks_its_command_on_the_files_own_seed() -> None:
    text = printed(executed(NOTEBOOK))
    command = shlex.split(text.split("Recommended: ", 1)[1].splitlines()[0])
    assert command[:3] == ["aiqsim", "run", "scenarios/multi_deployment_tenants.toml"]
    assert "routes.gpt.policy=" in " ".join(command)
    assert re.search(r"\d+% of the traffic can go to the cheap deployment before the p99 SLO", text)
    quiet = re.search(r"the quiet one's p99 (\S+) s with fair sharing, (\S+) s without", text)
    assert quiet, "the noisy-tenant section states the quiet tenant's p99 with and without fair sharing"
    assert 10 * float(quiet.group(1)) < float(quiet.group(2))  # its wait does not follow the noisy backlog
    # its check: line is the same command on the file's own seed (Decision.checked); tests/test_notebooks.py
    # (REPRODUCED) runs it and compares the figures
    check = re.search(r"^check: (aiqsim run .+) --seed (\d+) -> (.+)$", text, re.MULTILINE)
    assert check, "the decision states the figures of the file's seed"
    assert shlex.split(check.group(1)) == command
    assert int(check.group(2)) == load_scenario(ROOT / command[2]).seed
    stated = {key: float(value) for key, value in re.findall(r"(\w+)=([^,\s]+)", check.group(3))}
    assert set(stated) == {"success_latency_p99_s", "cost_total", "deployment_cheap_call_share"}
