"""Every script in examples/ runs, as a user runs it, against the local provider server (``aiqsim serve``)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers_serve import ROOT, ServedProvider

EXAMPLES = ROOT / "examples"
TIMEOUT_S = 300


def run_example(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def test_every_example_is_tested() -> None:
    tested = {"production_worker.py", "crash_and_recover.py"}
    assert {path.name for path in EXAMPLES.glob("*.py")} == tested


def test_the_production_worker_runs_and_a_rerun_sends_nothing(tmp_path: Path) -> None:
    store = tmp_path / "tasks.sqlite3"
    with ServedProvider("scenarios/crash_recovery.toml", "--time-scale", "0.1") as served:
        first = run_example("production_worker.py", "--base-url", served.base_url, "--store", str(store))
        assert first.returncode == 0, first.stdout + first.stderr
        assert first.stderr == ""
        lines = first.stdout.splitlines()
        assert lines[0].startswith("recover: 0 orphan(s) completed")
        assert "T-100: echo: The export button does nothing on Safari 17." in lines
        assert lines[-1] == "done: 8 of 8 ticket(s) summarised"
        bills = Counter(bill["key"] for bill in served.ledger()["bills"])
        assert bills == Counter({f"T-{100 + n}": 1 for n in range(8)})
        # the bodies were chat requests with a model: the server counted their messages, not a default
        assert all(bill["units"] > 60 for bill in served.ledger()["bills"])

        again = run_example("production_worker.py", "--base-url", served.base_url, "--store", str(store))
        assert again.returncode == 0, again.stdout + again.stderr
        assert again.stdout.splitlines()[-1] == "done: 8 of 8 ticket(s) summarised"
        assert len(served.ledger()["requests"]) == 8  # every answer came from the store
        returncode, _, stderr = served.stop()
    assert returncode == 0, stderr


def test_the_production_worker_refuses_bad_arguments() -> None:
    result = run_example("production_worker.py", "--tickets", "0")
    assert result.returncode == 2 and "--tickets: expected 1 to 12" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "verdict"),
    [
        ((), "lookup reconciled the orphan(s)"),
        (("--openai-style",), "no lookup, requeue_interrupted=False: the orphan(s) failed"),
        (
            ("--openai-style", "--requeue-interrupted"),
            "no lookup, requeue_interrupted=True: orphan(s) re-sent",
        ),
    ],
)
def test_the_crash_example_shows_what_the_readme_says(args: tuple[str, ...], verdict: str) -> None:
    """SIGKILL the worker mid-call, restart it, read /ledger: the README's recovery table, line by line."""
    result = run_example("crash_and_recover.py", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "worker killed (SIGKILL) with " in result.stdout
    assert f"verdict: as documented: {verdict}" in result.stdout
