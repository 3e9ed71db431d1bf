"""SIGKILL a worker while it receives a streamed answer from a real served provider; after the
restart, recovery completes the task from the provider's lookup, and the provider's ledger shows the
answer billed once (the key was never sent again).

The worker is tests/helpers_stream_worker.py. The kill is deterministic: the worker prints
``streaming`` once its first chunk has arrived, and the parent kills it on that line, while the
served stream (400 tokens at 100 per second, about 4 s) is far from its end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from aiqsim.http.server import start_local_server
from aiqsim.sim.config import ProviderConfig
from aiqsim.stores import open_store
from tests.helpers_stream_worker import KEY, TASK_ID

WORKER = Path(__file__).with_name("helpers_stream_worker.py")
ROOT = Path(__file__).resolve().parent.parent
STREAMING = ProviderConfig(name="llm", ttft_s=0.05, tokens_per_s=100.0, latency_base_s=0.0)
"""Ignores idempotency keys (as OpenAI does) and keeps each answer for lookup."""
LINE_TIMEOUT_S = 120.0
"""Generous: the worker imports aiqsim on a loaded 2-core machine; a hang still fails."""


def _worker(mode: str, store: Path, url: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, str(WORKER), mode, "--store", str(store), "--url", url],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_sigkill_mid_stream_is_reconciled_by_lookup_and_billed_once(tmp_path: Path) -> None:
    store_path = tmp_path / "tasks.sqlite"
    with start_local_server(STREAMING, seed=3) as server:
        worker = _worker("stream", store_path, server.url)
        try:
            assert worker.stdout is not None
            line = worker.stdout.readline()  # blocks until the first chunk arrived in the worker
            assert line.strip() == "streaming", (line, worker.stderr.read() if worker.stderr else "")
            mid_stream = server.ledger()
            worker.send_signal(signal.SIGKILL)
            assert worker.wait(LINE_TIMEOUT_S) == -signal.SIGKILL
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        assert mid_stream.bills == ()  # the kill came before the answer was finished (and billed)

        killed = open_store("sqlite", store_path)
        try:
            orphan = killed.get(TASK_ID)
        finally:
            killed.close()
        assert orphan is not None and orphan.status.value == "running"

        restarted = _worker("recover", store_path, server.url)
        out, err = restarted.communicate(timeout=LINE_TIMEOUT_S)
        assert restarted.returncode == 0, err
        report = json.loads(out.strip().splitlines()[-1])
        ledger = server.ledger()

    assert report["before"] == "running" and report["status"] == "succeeded"
    assert report["completed"] == 1  # completed from the provider's record, not sent again
    assert report["result"].startswith("echo: a long streamed answer")
    assert ledger.bills_for(KEY) == 1 and ledger.duplicate_bills == 0
    chat_requests = [entry for entry in ledger.requests if entry.key == KEY]
    assert len(chat_requests) == 1  # the stream the kill cut; recovery only looked it up
    assert chat_requests[0].outcome == "client_gone"
