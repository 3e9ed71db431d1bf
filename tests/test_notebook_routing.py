"""notebooks/12_routing_and_fairness.ipynb: the command its decision prints reproduces the figures it
states for the scenario file's own seed (the run the command makes), exactly: the simulator is
deterministic for a seed, so any difference is a notebook that reports one setting and recommends
another. Its noisy-tenant section shows the quiet tenant unharmed by fair sharing."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from executed_notebooks import executed, printed

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "12_routing_and_fairness.ipynb"


@pytest.mark.notebook
def test_the_recommended_command_reproduces_the_decisions_figures(tmp_path: Path) -> None:
    text = printed(executed(NOTEBOOK))
    command = shlex.split(text.split("Recommended: ", 1)[1].splitlines()[0])
    assert command[:3] == ["aiqsim", "run", "scenarios/multi_deployment_tenants.toml"]
    assert "routes.gpt.policy=" in " ".join(command)
    assert re.search(r"\d+% of the traffic can go to the cheap deployment before the p99 SLO", text)
    quiet = re.search(r"the quiet one's p99 (\S+) s with fair sharing, (\S+) s without", text)
    assert quiet, "the noisy-tenant section states the quiet tenant's p99 with and without fair sharing"
    assert 10 * float(quiet.group(1)) < float(quiet.group(2))  # its wait does not follow the noisy backlog
    stated_line = re.search(r"the command runs the file's seed (\d+): (.+)", text)
    assert stated_line, "the decision states the figures of the file's seed"
    stated = {key: float(value) for key, value in re.findall(r"(\w+)=(\S+)", stated_line.group(2))}
    assert set(stated) == {"success_latency_p99_s", "cost_total", "deployment_cheap_call_share"}
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    subprocess.run(
        [sys.executable, "-m", "aiqsim", *command[1:], "--out", str(tmp_path), "--no-charts"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    summary = json.loads((tmp_path / "summary.json").read_text(encoding="utf-8"))
    assert summary["seed"] == int(stated_line.group(1))
    assert {key: float(summary[key]) for key in stated} == stated
