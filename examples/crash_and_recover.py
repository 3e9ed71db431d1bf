"""Kill the production worker with SIGKILL in the middle of a call, restart it, and read the bill.

Self-contained: it starts ``aiqsim serve scenarios/crash_recovery.toml`` on a free loopback port,
runs ``examples/production_worker.py`` against it, waits until the server is working on one of
the worker's calls, sends the worker SIGKILL, restarts it on the same SQLite store, and then
reads the server's ``GET /ledger``: which tickets were executed and billed, and how many times.
Needs the ``lab`` and ``http`` extras (``pip install -e ".[lab,http]"``): the server runs the lab's
simulated provider, the worker calls it with httpx.

Three modes, one per line of the README's recovery table::

    python examples/crash_and_recover.py                        # provider with lookup
    python examples/crash_and_recover.py --openai-style         # no lookup, keys ignored: fail the orphan
    python examples/crash_and_recover.py --openai-style --requeue-interrupted   # ... or re-send it

Exit status 0 when the run shows what the README says of that mode (printed as ``verdict``),
1 when it does not, 2 when the demo itself could not run (no server, the worker finished
before any call was under way...).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORKER = HERE / "production_worker.py"
SCENARIO = HERE.parent / "scenarios" / "crash_recovery.toml"
OPENAI_STYLE = ("providers.llm.supports_lookup=false", "providers.llm.honours_idempotency=false")
TIME_SCALE = 2.0
"""Wall seconds per scenario second on the server: a call takes about 1.5 s, time enough to kill it."""
WAIT_S = 60.0


class DemoError(Exception):
    """The demo could not be carried out (not a finding about recovery)."""


def start_server(openai_style: bool) -> tuple[subprocess.Popen[str], str]:
    """``aiqsim serve`` as a child process; returns it and its root URL (without ``/v1``)."""
    command = [sys.executable, "-m", "aiqsim", "serve", str(SCENARIO), "--port", "0"]
    command += ["--time-scale", str(TIME_SCALE)]
    for override in OPENAI_STYLE if openai_style else ():
        command += ["--set", override]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    root = None
    for line in server.stdout:  # the whole banner, so nothing is left in this reader's buffer
        print(f"  server | {line.rstrip()}", flush=True)
        found = re.search(r"base URL: (http://\S+)/v1$", line.strip())
        if found:
            root = found.group(1)
        if line.startswith("Ctrl-C") and root is not None:
            return server, root
    server.wait()
    raise DemoError(f"aiqsim serve exited with status {server.returncode} before printing its URL")


def ledger(root: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{root}/ledger", timeout=10) as response:
        return json.load(response)


def worker_command(root: str, store: Path, args: argparse.Namespace) -> list[str]:
    command = [sys.executable, str(WORKER), "--base-url", f"{root}/v1", "--store", str(store)]
    command += ["--tickets", "8", "--concurrency", "4"]
    if args.openai_style:
        command.append("--no-lookup")
    if args.requeue_interrupted:
        command.append("--requeue-interrupted")
    return command


def kill_mid_call(command: list[str], root: str) -> None:
    """Start the worker and SIGKILL it while the server is working on at least one of its calls."""
    worker = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + WAIT_S
    try:
        while time.monotonic() < deadline and worker.poll() is None:
            if ledger(root)["in_flight"] >= 1:
                worker.send_signal(signal.SIGKILL)
                worker.wait()
                print(
                    f"worker killed (SIGKILL) with {ledger(root)['in_flight']} call(s) under way", flush=True
                )
                return
            time.sleep(0.01)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    raise DemoError("the worker finished (or the wait ran out) before any call was under way")


def run_to_end(command: list[str]) -> str:
    finished = subprocess.run(command, capture_output=True, text=True, timeout=WAIT_S * 2)
    for line in finished.stdout.splitlines():
        print(f"  worker | {line}", flush=True)
    if finished.stderr.strip():
        raise DemoError(f"the restarted worker failed:\n{finished.stderr}")
    return finished.stdout


def wait_until_idle(root: str) -> dict[str, Any]:
    """The ledger once the server has finished every call (a killed client's too)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        snapshot = ledger(root)
        if snapshot["in_flight"] == 0:
            return snapshot
        time.sleep(0.05)
    raise DemoError("the server was still busy after the wait")


def recovery_counts(output: str) -> dict[str, int]:
    found = re.search(
        r"recover: (\d+) orphan\(s\) completed .*?, (\d+) failed as interrupted, (\d+) re-sent", output
    )
    if found is None:
        raise DemoError("the restarted worker printed no recovery report")
    completed, failed, requeued = (int(group) for group in found.groups())
    return {"completed": completed, "failed": failed, "requeued": requeued}


def verdict(args: argparse.Namespace, recovered: dict[str, int], bills: Counter[str]) -> tuple[bool, str]:
    """Whether the run shows what the README says of this mode."""
    twice = sorted(key for key, count in bills.items() if count > 1)
    if not args.openai_style:
        ok = recovered["completed"] >= 1 and not twice
        return (
            ok,
            "lookup reconciled the orphan(s): completed from the provider's record, nothing billed twice",
        )
    if not args.requeue_interrupted:
        ok = recovered["failed"] >= 1 and not twice
        return ok, "no lookup, requeue_interrupted=False: the orphan(s) failed, nothing was billed twice"
    ok = recovered["requeued"] >= 1 and bool(twice)
    return ok, f"no lookup, requeue_interrupted=True: orphan(s) re-sent and billed twice: {', '.join(twice)}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--openai-style", action="store_true", help="the provider has no lookup, ignores keys"
    )
    parser.add_argument(
        "--requeue-interrupted", action="store_true", help="re-send orphans instead of failing"
    )
    args = parser.parse_args(argv)
    server, root = start_server(args.openai_style)
    try:
        with tempfile.TemporaryDirectory() as workdir:
            command = worker_command(root, Path(workdir) / "tasks.sqlite3", args)
            kill_mid_call(command, root)
            output = run_to_end(command)
            recovered = recovery_counts(output)
            final = wait_until_idle(root)
    except DemoError as error:
        print(f"demo failed: {error}", file=sys.stderr)
        return 2
    finally:
        server.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            for line in server.communicate(timeout=30)[0].splitlines():
                print(f"  server | {line}", flush=True)
        if server.poll() is None:
            server.kill()
            server.wait()
    bills = Counter(bill["key"] for bill in final["bills"])
    print(f"ledger: {len(final['bills'])} bill(s) for {len(bills)} ticket(s)")
    for key in sorted(bills):
        print(f"ledger: {key} billed {bills[key]} time(s)")
    ok, what = verdict(args, recovered, bills)
    print(f"verdict: {'as documented' if ok else 'NOT as documented'}: {what}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
