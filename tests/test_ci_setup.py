"""CI runs what a user runs: the README's test command in a fresh venv, and no silent skips.

``.ci/run`` builds its own virtual environment and runs the README's command word for word, and
under ``CI=true`` the suite's conftest turns a skipped test into a failure (a skip there means a
prerequisite the project forgot to declare). Both are checked here with real subprocesses.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README_TEST_COMMAND = 'pip install -e ".[test]" && python -m pytest'

SKIPPING_TEST = """
import pytest


def test_needs_a_missing_package():
    pytest.importorskip("a_package_nobody_declared")


def test_runs():
    assert True
"""


def _pytest_with_project_conftest(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    test_file = tmp_path / "test_skips.py"
    test_file.write_text(SKIPPING_TEST, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-q", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(test_file)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_a_skip_fails_under_ci_and_stays_a_skip_elsewhere(tmp_path: Path) -> None:
    local = _pytest_with_project_conftest(tmp_path, ci=None)
    assert local.returncode == 0, local.stdout + local.stderr
    assert "1 passed, 1 skipped" in local.stdout
    ci = _pytest_with_project_conftest(tmp_path, ci="true")
    assert ci.returncode == 1, ci.stdout + ci.stderr
    assert "1 failed, 1 passed" in ci.stdout
    assert "skipped under CI=true" in ci.stdout and "a_package_nobody_declared" in ci.stdout


def test_ci_runs_the_readme_command_in_a_venv_of_its_own() -> None:
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert README_TEST_COMMAND in readme
    commands = [line.strip() for line in script.splitlines() if not line.lstrip().startswith("#")]
    assert any(line.startswith(README_TEST_COMMAND) for line in commands)  # word for word
    assert "set -euo pipefail" in commands  # pytest's exit 5 (nothing collected) fails the run
    assert re.search(r'-m venv "\$venv"', script) and "mktemp -d" in script  # fresh, outside the clone
    assert 'source "$venv/bin/activate"' in script and "export CI=true" in script
    syntax = subprocess.run(["bash", "-n", str(ROOT / ".ci" / "run")], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    assert os.access(ROOT / ".ci" / "run", os.X_OK)
