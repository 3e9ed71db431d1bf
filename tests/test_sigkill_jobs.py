"""SIGKILL a real process running jobs on a SQLite (and a JSON) store; restart it until the jobs are done.

The worker (tests/helpers_job_worker.py) runs a pipeline (script -> three TTS calls -> subtitles)
for eight clips plus two double clicks, on three providers that commit every execution to a ledger
file. The parent kills it with SIGKILL at seeded random moments and restarts it; each restart calls
``recover()``, which reconciles the orphaned stage tasks by lookup and re-drives the unfinished jobs.

Checked after every kill: the store loads. At the end: every workload job is in the store and
succeeded (the double clicks deduped), with every stage's result; every stage task is terminal; and
every stage key was executed (billed) at most once across all the processes.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from aiqsim import JobStatus
from aiqsim.stores import open_store
from tests.helpers_job_worker import STAGE_KEYS, WORKLOAD
from tests.helpers_store_worker import connect_ledger, expected_result

WORKER = Path(__file__).with_name("helpers_job_worker.py")
KILL_WINDOW_S = 0.25
"""Kills land uniformly in this window after the worker reports the store open."""
LATENCY_SCALE = 2.0
"""40 stage calls, at most two at a time per provider along a three-stage chain, of two sleeps of >= 30 ms
each: well over a second of work, more than the kill windows add up to, so every wanted kill lands."""
KILLS = 6
MAX_RUNS = 40


def run_with_kills(kind: str, seed: int, directory: Path) -> tuple[int, int, list[dict]]:
    rng = random.Random(seed)
    store_path, ledger_path = directory / f"jobs.{kind}", directory / "ledger.sqlite"
    connect_ledger(ledger_path).close()
    kills = runs = 0
    reports: list[dict] = []
    while runs < MAX_RUNS:
        runs += 1
        command = [sys.executable, str(WORKER), "--kind", kind, "--store", str(store_path)]
        command += ["--ledger", str(ledger_path), "--seed", str(rng.randrange(2**31))]
        command += ["--latency-scale", str(LATENCY_SCALE)]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = proc.stdout.readline()  # type: ignore[union-attr]
            assert first.strip() == "opened", (
                f"worker failed to open the store: {first}{proc.communicate()[1]}"
            )
            killed = False
            if kills < KILLS:
                try:
                    proc.wait(timeout=rng.uniform(0.0, KILL_WINDOW_S))
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGKILL)
                    killed = True
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        lines = out.splitlines()
        reports += [json.loads(line) for line in lines if line.startswith('{"recovered"')]
        if killed:
            assert proc.returncode == -signal.SIGKILL
            kills += 1
            open_store(kind, store_path).close()  # a kill never leaves a store that does not load
            continue
        assert proc.returncode == 0 and lines[-1].startswith('{"done"'), err
        return kills, runs, reports
    raise AssertionError(f"jobs not finished after {MAX_RUNS} runs")


@pytest.mark.parametrize("kind", ["sqlite", "json"])
def test_sigkilled_job_runs_finish_after_restarts_and_bill_each_stage_once(kind: str, tmp_path: Path) -> None:
    kills, runs, reports = run_with_kills(kind, {"sqlite": 15, "json": 16}[kind], tmp_path)
    assert kills == KILLS

    store = open_store(kind, tmp_path / f"jobs.{kind}")
    try:
        jobs = {job.id: job for job in store.list_jobs()}
        tasks = store.list_by_status()
    finally:
        store.close()
    assert set(jobs) == {job_id for job_id, _ in WORKLOAD}  # nothing lost, nothing invented
    for job_id, job in jobs.items():
        expected = JobStatus.DEDUPED if job_id.endswith("-again") else JobStatus.SUCCEEDED
        assert job.status is expected, (job_id, job.status, job.error)
        assert set(job.results) == {"script", "tts", "subtitles"} and len(job.results["tts"]) == 3
    assert all(task.status.is_terminal for task in tasks)

    conn = connect_ledger(tmp_path / "ledger.sqlite")
    try:
        executions = conn.execute("SELECT key, pid FROM executions").fetchall()
    finally:
        conn.close()
    per_key = Counter(key for key, _ in executions)
    assert len(per_key) == len(STAGE_KEYS)  # every stage ran ...
    assert max(per_key.values()) == 1, {k: n for k, n in per_key.items() if n > 1}  # ... and was billed once
    for task in tasks:
        if task.result is not None:
            assert task.result == expected_result(task.key)
    resumed = sum(report["jobs_resumed"] for report in reports)
    print(
        f"\n[{kind}] kills={kills} runs={runs} executions={len(executions)} stage keys={len(per_key)} "
        f"orphans completed by lookup={sum(r['recovered'] for r in reports)} jobs re-driven={resumed}"
    )
