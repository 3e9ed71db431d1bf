"""``aiqsim serve`` as a real child process, for tests: start it, read its URL, query /ledger, stop it."""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 120.0
"""Generous: starting means importing aiqsim on a loaded 2-core machine; a hang still fails."""
STOP_TIMEOUT_S = 60.0
BASE_URL = re.compile(r"^base URL: (http://\S+)/v1$")
BANNER_END = "Ctrl-C (SIGINT) or SIGTERM stops it."


class ServedProvider:
    """One ``python -m aiqsim serve ARGS...`` process on a free loopback port (``--port 0``)."""

    def __init__(self, *args: str) -> None:
        command = [sys.executable, "-m", "aiqsim", "serve", *args]
        if "--port" not in args:
            command += ["--port", "0"]
        self.process = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self._stderr_thread = threading.Thread(target=self._pump_stderr, daemon=True)
        self._stderr_thread.start()
        self.root = self._wait_for_url()
        self.base_url = f"{self.root}/v1"

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def _pump_stderr(self) -> None:
        assert self.process.stderr is not None
        self._stderr.extend(self.process.stderr)

    def _wait_for_url(self) -> str:
        """Read the banner to its last line; return the root URL it gave."""
        root = ""
        while True:
            try:
                line = self._lines.get(timeout=START_TIMEOUT_S)
            except queue.Empty:
                self.process.kill()
                raise AssertionError(f"aiqsim serve printed no URL in {START_TIMEOUT_S} s") from None
            if line is None:
                self.process.wait()
                raise AssertionError(
                    f"aiqsim serve exited with {self.process.returncode}: {''.join(self._stderr)}"
                )
            self.lines.append(line)
            found = BASE_URL.match(line)
            if found:
                root = found.group(1)
            if line.startswith(BANNER_END):
                return root

    def ledger(self) -> dict[str, Any]:
        """``GET /ledger``, decoded."""
        with urllib.request.urlopen(f"{self.root}/ledger", timeout=30) as response:
            return json.load(response)

    def stop(self, signum: int = signal.SIGINT) -> tuple[int, list[str], str]:
        """Send ``signum``; return the exit status, every stdout line and the stderr text."""
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            returncode = self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(
                f"aiqsim serve did not stop within {STOP_TIMEOUT_S} s of {signum!r}"
            ) from None
        while (line := self._lines.get(timeout=STOP_TIMEOUT_S)) is not None:
            self.lines.append(line)
        self._lines.put(None)  # a second stop() returns at once
        self._stderr_thread.join(STOP_TIMEOUT_S)
        return returncode, list(self.lines), "".join(self._stderr)

    def __enter__(self) -> ServedProvider:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
