"""notebooks/11_streaming_deadlines.ipynb: the command its decision prints reproduces the figures it
states for the scenario file's own seed (the run the command makes), exactly: the simulator is
deterministic for a seed, so any difference is a notebook that reports one setting and recommends
another."""

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
NOTEBOOK = ROOT / "notebooks" / "11_streaming_deadlines.ipynb"


@pytest.mark.notebook
def test_the_recommended_command_reproduces_the_decisions_figures(tmp_path: Path) -> None:
    text = printed(executed(NOTEBOOK))
    command = shlex.split(text.split("Recommended: ", 1)[1].splitlines()[0])
    assert command[:3] == ["aiqsim", "run", "scenarios/streaming_ttft.toml"]
    assert "retry.first_token_timeout_s" in " ".join(command) and "retry.attempt_timeout_s" in " ".join(
        command
    )
    stated_line = re.search(r"the command runs the file's seed (\d+): (.+)", text)
    assert stated_line, "the decision states the figures of the file's seed"
    stated = {key: float(value) for key, value in re.findall(r"(\w+)=(\S+)", stated_line.group(2))}
    assert set(stated) == {"ttft_p50_s", "ttft_p99_s", "tasks_failed", "cost_total", "cost_duplicated"}
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
