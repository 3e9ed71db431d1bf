"""Two worker processes share one SQLite store; one is SIGKILLed and restarted again and again.

Worker "b" runs its workload slowly and is never killed. Worker "a" is killed at seeded random
moments and restarted with the same ``worker_id`` while b is busy. Each restart's ``recover()``
must reconcile a's orphans and leave b's running and queued tasks alone: every key runs exactly
once (the provider can look keys up), and none of b's keys is ever executed by an "a" process.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from aiqsim.core.task import TaskStatus
from tests.helpers_store_worker import WORKLOAD, connect_ledger
from tests.test_sigkill_recovery import check_store, read_ledger

WORKER = Path(__file__).with_name("helpers_store_worker.py")
KILLS = 5
KILL_WINDOW_S = 0.25
A_LATENCY_SCALE = 3.0
"""a's workload needs at least 1.44 s of provider sleeps, more than its 5 kill windows add up to (1.25 s),
so every kill lands before a is done, however fast the machine."""
B_LATENCY_SCALE = 10.0
"""b's calls take ten times as long (at least 4.8 s of work), so b is still busy while a is killed and
restarted."""


def start(
    worker_id: str, store: Path, ledger: Path, seed: int, latency_scale: float = 1.0
) -> subprocess.Popen[str]:
    command = [sys.executable, str(WORKER), "recover", "--kind", "sqlite", "--store", str(store)]
    command += ["--ledger", str(ledger), "--lookup", "--seed", str(seed), "--worker-id", worker_id]
    command += ["--prefix", f"{worker_id}-", "--latency-scale", str(latency_scale)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()  # type: ignore[union-attr]
    if first.strip() != "opened":
        proc.kill()
        raise AssertionError(f"worker {worker_id} failed to open the store: {first}{proc.communicate()[1]}")
    return proc


def test_killing_one_worker_never_touches_the_tasks_of_the_other(tmp_path: Path) -> None:
    rng = random.Random(404)
    store, ledger = tmp_path / "shared.sqlite", tmp_path / "ledger.sqlite"
    connect_ledger(ledger).close()
    b = start("b", store, ledger, seed=1, latency_scale=B_LATENCY_SCALE)
    a_pids: set[int] = set()
    a_recoveries: list[dict[str, int]] = []
    try:
        kills = 0
        while True:
            a = start("a", store, ledger, seed=rng.randrange(2**31), latency_scale=A_LATENCY_SCALE)
            a_pids.add(a.pid)
            killed = False
            if kills < KILLS:
                try:
                    a.wait(timeout=rng.uniform(0.0, KILL_WINDOW_S))
                except subprocess.TimeoutExpired:
                    a.send_signal(signal.SIGKILL)
                    killed = True
            out, err = a.communicate(timeout=120)
            a_recoveries += [
                json.loads(line)["recovered"] for line in out.splitlines() if '"recovered"' in line
            ]
            if killed:
                kills += 1
                check_store("sqlite", store, ledger)  # loads, and no success without the work
                continue
            assert a.returncode == 0 and out.splitlines()[-1:] == ["done"], err
            break
        b_out, b_err = b.communicate(timeout=120)
        assert b.returncode == 0 and b_out.splitlines()[-1:] == ["done"], b_err
    finally:
        for proc in (b,):
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    # the restarts overlapped b's work: some recovery found b's live tasks and left them alone
    assert kills == KILLS
    assert max(r["left_to_other_workers"] for r in a_recoveries) > 0, a_recoveries
    statuses = check_store("sqlite", store, ledger)
    expected_ids = {f"{w}-{task_id}" for w in "ab" for task_id, _ in WORKLOAD}
    assert set(statuses) == expected_ids
    assert all(s in (TaskStatus.SUCCEEDED, TaskStatus.DEDUPED) for s in statuses.values()), statuses
    executions, _ = read_ledger(ledger)
    runs: dict[str, list[int]] = defaultdict(list)
    for key, _, pid in executions:
        runs[key].append(pid)
    assert {key: pids for key, pids in runs.items() if len(pids) > 1} == {}  # every key ran once
    b_keys_run_by_a = {key: pids for key, pids in runs.items() if key.startswith("b-") and set(pids) & a_pids}
    assert b_keys_run_by_a == {}
    print(
        f"\n[shared store] a killed {kills} times, {len(a_recoveries)} recoveries, "
        f"b tasks left alone per recovery: {[r['left_to_other_workers'] for r in a_recoveries]}, "
        f"executions={len(executions)}"
    )
