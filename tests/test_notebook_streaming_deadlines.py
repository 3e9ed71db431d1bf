"""notebooks/11_streaming_deadlines.ipynb: the command its decision prints reproduces the figures it
states for the scenario file's own seed (the run the command makes), in its ``check:`` line, which
tests/test_notebooks.py runs: the simulator is deterministic for a seed, so any difference is a
notebook that reports one setting and recommends another."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from executed_notebooks import executed, printed

from aiqsim.sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "11_streaming_deadlines.ipynb"


@pytest.mark.notebook
def test_the_decision_checks_its_command_on_the_files_own_seed() -> None:
    text = printed(executed(NOTEBOOK))
    command = shlex.split(text.split("Recommended: ", 1)[1].splitlines()[0])
    assert command[:3] == ["aiqsim", "run", "scenarios/streaming_ttft.toml"]
    assert "retry.first_token_timeout_s" in " ".join(command) and "retry.attempt_timeout_s" in " ".join(
        command
    )
    # its check: line is the same command on the file's own seed (Decision.checked); tests/test_notebooks.py
    # (REPRODUCED) runs it and compares the figures
    check = re.search(r"^check: (aiqsim run .+) --seed (\d+) -> (.+)$", text, re.MULTILINE)
    assert check, "the decision states the figures of the file's seed"
    assert shlex.split(check.group(1)) == command
    assert int(check.group(2)) == load_scenario(ROOT / command[2]).seed
    stated = {key: float(value) for key, value in re.findall(r"(\w+)=([^,\s]+)", check.group(3))}
    assert set(stated) == {"ttft_p50_s", "ttft_p99_s", "tasks_failed", "cost_total", "cost_duplicated"}
