"""Run every benchmark in this folder, one after another: ``python benchmarks/run_all.py``.

Each ``bench_*.py`` prints a markdown table of absolute figures and of ratios measured in
the same run (the machines are noisy; compare within a run, not across runs). Copy the
output, with the date, into ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    failures = 0
    print(f"# aiqsim benchmarks, {datetime.date.today().isoformat()}\n")
    for script in sorted(HERE.glob("bench_*.py")):
        print(f"## {script.stem}\n", flush=True)
        result = subprocess.run([sys.executable, str(script)], cwd=HERE.parent, check=False)
        failures += result.returncode != 0
        print(flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
