"""What the SQLite store's open-time damage checks cost at 100,000 tasks.

Times, on one store file of ``--tasks`` tasks (payload/result as in ``bench_stores.py``), each
check the store could run when it opens, alone, over ``--rounds`` rounds (min and median, ms):

- ``quick_check``: ``PRAGMA quick_check`` -- page structure and record format, O(pages); does NOT
  compare indexes with their table, so a stale or corrupted ``tasks_by_status`` index passes it;
- ``integrity_check``: ``PRAGMA integrity_check`` -- everything ``quick_check`` does, plus every
  index entry against its row, O(n log n);
- ``row_scan``: the SQL scan for rows of the wrong type or value;
- ``utf8_scan``: every row's text columns fetched as bytes, non-ASCII ones decoded (SQLite keeps
  whatever bytes it is given as text; Python's read of an invalid one raises a raw
  ``OperationalError``). Two SQL-side alternatives were slower here: one call of a registered
  Python function per row on its text columns joined (~1.2 s at 100k), and a ``GLOB`` for
  non-ASCII text per column before that call (~3.7 s);
- ``open``: the whole ``SqliteStore(path)`` as shipped (all of the chosen checks).

Run: ``python benchmarks/bench_store_checks.py`` (~1 min at 100k tasks). Prints markdown with the
load average before and after, since the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_stores import record

from aiqsim.core.task import TaskStatus
from aiqsim.stores import SqliteStore
from aiqsim.stores.sqlite import COLUMNS, SCHEMA_VERSION, _suspect_rows


def build(path: Path, size: int) -> None:
    """``size`` tasks, 9 in 10 succeeded, the rest running, loaded in one unsynced transaction."""
    SqliteStore(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("BEGIN")
    for n in range(size):
        status = TaskStatus.RUNNING if n % 10 == 0 else TaskStatus.SUCCEEDED
        rec = record(n, status)
        values = SqliteStore._encode(rec)
        conn.execute(
            f"INSERT INTO tasks ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})", values
        )
        conn.execute("INSERT INTO keys (key, owner_id) VALUES (?, ?)", (rec.key, rec.id))
    conn.execute("COMMIT")
    conn.close()


def pragma(name: str) -> Callable[[sqlite3.Connection], object]:
    def run(conn: sqlite3.Connection) -> object:
        result = [row[0] for row in conn.execute(f"PRAGMA {name}")]
        assert result == ["ok"], result
        return result

    return run


def utf8_scan(store: SqliteStore) -> object:
    store._check_utf8(SCHEMA_VERSION)  # the open-time pass itself
    return None


def row_scan(conn: sqlite3.Connection) -> object:
    rows = conn.execute(_suspect_rows(SCHEMA_VERSION)).fetchall()
    assert rows == [], rows
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "tasks.sqlite"
        build(path, args.tasks)
        size_mb = path.stat().st_size / 1e6
        checks: dict[str, Callable[[], object]] = {}
        conn = sqlite3.connect(path)
        for name, check in (
            ("quick_check", pragma("quick_check")),
            ("integrity_check", pragma("integrity_check")),
            ("row_scan", row_scan),
        ):
            checks[name] = lambda check=check: check(conn)
        opened = SqliteStore(path)
        checks["utf8_scan"] = lambda: utf8_scan(opened)
        checks["open"] = lambda: SqliteStore(path).close()
        samples: dict[str, list[float]] = {name: [] for name in checks}
        cpu: dict[str, list[float]] = {name: [] for name in checks}
        for _ in range(args.rounds):  # rounds rotate over the checks so load bursts hit all alike
            for name, run in checks.items():
                start, start_cpu = time.perf_counter(), time.process_time()
                run()
                samples[name].append((time.perf_counter() - start) * 1e3)
                cpu[name].append((time.process_time() - start_cpu) * 1e3)
        conn.close()
        opened.close()
    load_after = os.getloadavg()
    print(
        f"{args.tasks:,} tasks, {size_mb:.1f} MB file, {args.rounds} rounds; "
        f"load average before {load_before[0]:.2f} / after {load_after[0]:.2f} (1 min), 2 cores\n"
    )
    print("| check | wall min ms | wall median ms | CPU min ms |")
    print("|---|---:|---:|---:|")
    for name, values in samples.items():
        print(f"| {name} | {min(values):.0f} | {statistics.median(values):.0f} | {min(cpu[name]):.0f} |")
    print("\nOn a shared machine the CPU time (this process only) is the steadier figure.")


if __name__ == "__main__":
    main()
