"""Four processes, one SQLite store, the same 30 keys: every key runs exactly once.

Each process runs the real Scheduler on AsyncioRuntime (tests/helpers_store_worker.py, mode
``race``) and submits all 30 keys in its own shuffled order. The provider commits every
execution to a separate ledger file, which is what the assertions count. Duplicates owned by
another process are awaited through the scheduler's foreign-owner polling.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

from aiqsim.core.task import TaskStatus
from aiqsim.stores import SqliteStore
from tests.helpers_store_worker import connect_ledger, expected_result

WORKER = Path(__file__).with_name("helpers_store_worker.py")
PROCESSES = 4
KEYS = 30


def test_four_processes_execute_each_key_exactly_once(tmp_path: Path) -> None:
    store_path, ledger_path, go = tmp_path / "tasks.sqlite", tmp_path / "ledger.sqlite", tmp_path / "go"
    connect_ledger(ledger_path).close()
    names = [f"p{n}" for n in range(PROCESSES)]
    procs = [
        subprocess.Popen(
            [
                *(
                    sys.executable,
                    str(WORKER),
                    "race",
                    "--store",
                    str(store_path),
                    "--ledger",
                    str(ledger_path),
                ),
                *("--name", name, "--keys", str(KEYS), "--seed", str(n), "--go", str(go)),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n, name in enumerate(names)
    ]
    try:
        for proc in procs:  # every racer has opened the store (creating it concurrently) and is waiting
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line.strip() == "ready", proc.communicate(timeout=30)[1]
        go.touch()
        summaries = []
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            summaries.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    conn = sqlite3.connect(ledger_path)
    executions = conn.execute("SELECT key, task_id, pid FROM executions").fetchall()
    conn.close()
    per_key = Counter(key for key, _, _ in executions)
    assert set(per_key) == {f"key{n:02d}" for n in range(KEYS)}
    assert max(per_key.values()) == 1, [key for key, count in per_key.items() if count > 1]

    with SqliteStore(store_path) as store:
        records = store.list_by_status()
        assert len(records) == PROCESSES * KEYS
        assert all(r.status.is_terminal for r in records)
        by_id = {r.id: r for r in records}
        runner = {key: task_id for key, task_id, _ in executions}
        for record in records:
            owner = store.owner_of(record.key)
            assert owner is not None and owner.id == runner[record.key]  # the owner is who ran it
            assert record.result == expected_result(record.key)
            if record.id == owner.id:
                assert record.status is TaskStatus.SUCCEEDED
            else:
                assert record.status is TaskStatus.DEDUPED and record.deduped_from == owner.id
                assert by_id[record.deduped_from].key == record.key

    assert all(s["statuses"].count("succeeded") + s["statuses"].count("deduped") == KEYS for s in summaries)
    winners = Counter(task_id.split("-")[0] for task_id in runner.values())
    # Report who won how many keys (a single winner would still be correct, just less interesting).
    print(f"keys executed per process: {dict(sorted(winners.items()))}")
