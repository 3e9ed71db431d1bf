"""Every script in examples/ runs, as a user runs it, against the local provider server (``aiqsim serve``)."""

from __future__ import annotations

import re
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
    tested.add("test_my_pipeline.py")  # run with pytest by tests/test_testing_kit.py
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


def test_the_production_worker_as_a_fleet_worker_on_postgres_takes_and_releases_its_lease(
    postgres_dsn: str,
) -> None:
    import random

    import psycopg

    from aiqsim.stores.postgres import PostgresStore

    schema = f"example_{random.Random().getrandbits(40):010x}"
    fleet = ("--postgres", postgres_dsn, "--schema", schema, "--worker-id", "w1", "--tickets", "3")
    try:
        with ServedProvider("scenarios/crash_recovery.toml", "--time-scale", "0.1") as served:
            first = run_example("production_worker.py", "--base-url", served.base_url, *fleet)
            assert first.returncode == 0, first.stdout + first.stderr
            assert first.stdout.splitlines()[-1] == "done: 3 of 3 ticket(s) summarised"
            again = run_example("production_worker.py", "--base-url", served.base_url, *fleet)
            assert again.returncode == 0, again.stdout + again.stderr
            assert len(served.ledger()["requests"]) == 3  # the rerun's answers came from the store
            served.stop()
        with PostgresStore(postgres_dsn, schema=schema) as store:
            assert store.leases() == {}  # each run took the lease and released it at its clean exit
            assert {r.worker for r in store.list_by_status()} == {"w1"}
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


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
    assert "  server | aiqsim serve: stopped after " in result.stdout  # SIGINT stopped it cleanly
    # the bill as /ledger gave it, read independently of the example's own verdict
    bills = {
        found.group(1): int(found.group(2))
        for found in re.finditer(r"^ledger: (T-\d+) billed (\d+) time\(s\)$", result.stdout, re.MULTILINE)
    }
    # an orphan whose request had not reached the server when the kill landed was never billed
    assert set(bills) <= {f"T-{100 + n}" for n in range(8)} and len(bills) >= 5
    billed_twice = [key for key, count in bills.items() if count > 1]
    assert bool(billed_twice) == ("--requeue-interrupted" in args)


def readme_production_snippet() -> str:
    """The Python block of the README's "Using the scheduler in production" section."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Using the scheduler in production", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readme_production_snippet_runs_as_written(tmp_path: Path) -> None:
    """Word for word, but for the base URL: it points at the local provider server."""
    snippet = readme_production_snippet()
    assert "asyncio.run(main())" in snippet and '"http://127.0.0.1:8000/v1"' in snippet
    with ServedProvider("scenarios/crash_recovery.toml", "--time-scale", "0.1") as served:
        script = tmp_path / "snippet.py"
        script.write_text(snippet.replace("http://127.0.0.1:8000/v1", served.base_url), encoding="utf-8")
        result = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout == "echo: Hello!\n"
        assert len(served.ledger()["bills"]) == 1
        returncode, _, stderr = served.stop()
    assert returncode == 0, stderr
    assert (tmp_path / "tasks.sqlite3").exists()
