"""``aiqsim serve``: how long it takes to start, and what one call costs on top of the modelled latency.

- start: wall seconds from launching ``python -m aiqsim serve`` to its banner (imports + listen);
- overhead per call: the served provider has zero latency, so a chat completion's round trip is
  all transport: the real ``openai`` SDK (sync client, keep-alive) and a bare ``httpx`` client,
  ``--calls`` sequential calls per round.

``--rounds`` rounds (default 5), min and median; the load average is printed with the figures.
Needs the ``openai`` extra. Run: ``python benchmarks/bench_serve.py``.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = """
[scenario]
name = "bench_serve"

[[providers]]
name = "instant"
latency_base_s = 0.0
latency_per_unit_s = 0.0

[[workloads]]
type = "poisson"
provider = "instant"
"""
MESSAGES = [{"role": "user", "content": "How long does a call take?"}]


def start(scenario: Path) -> tuple[subprocess.Popen[str], str, float]:
    began = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "aiqsim", "serve", str(scenario), "--port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    root = None
    for line in process.stdout:
        found = re.match(r"base URL: (http://\S+)/v1$", line.strip())
        if found:
            root = found.group(1)
        if line.startswith("Ctrl-C") and root is not None:
            return process, root, time.perf_counter() - began
    raise RuntimeError(f"aiqsim serve exited with {process.wait()} before its banner")


def stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGINT)
    if process.wait(timeout=60) != 0:
        raise RuntimeError(f"aiqsim serve exited with {process.returncode}")


def per_call_ms(call: object, calls: int) -> float:
    call()  # type: ignore[operator]  # connect once: keep-alive from then on
    began = time.perf_counter()
    for _ in range(calls):
        call()  # type: ignore[operator]
    return (time.perf_counter() - began) / calls * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    starts, sdk_ms, httpx_ms = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        scenario = Path(tmp) / "bench_serve.toml"
        scenario.write_text(SCENARIO, encoding="utf-8")
        for _ in range(args.rounds):
            process, root, started = start(scenario)
            try:
                starts.append(started)
                client = openai.OpenAI(base_url=f"{root}/v1", api_key="k", max_retries=0)
                sdk_ms.append(
                    per_call_ms(
                        lambda client=client: client.chat.completions.create(model="m", messages=MESSAGES),
                        args.calls,
                    )
                )
                client.close()
                with httpx.Client() as bare:
                    body = {"model": "m", "messages": MESSAGES}
                    url = f"{root}/v1/chat/completions"
                    httpx_ms.append(
                        per_call_ms(
                            lambda bare=bare, url=url, body=body: bare.post(
                                url, json=body
                            ).raise_for_status(),
                            args.calls,
                        )
                    )
            finally:
                stop(process)
    load = " / ".join(f"{value:.2f}" for value in os.getloadavg())
    print(
        f"{args.rounds} rounds, {args.calls} sequential calls per round; load average {load} (1/5/15 min)\n"
    )
    print("| what | min | median |")
    print("|---|---|---|")
    print(f"| `aiqsim serve` start to banner (s) | {min(starts):.2f} | {statistics.median(starts):.2f} |")
    print(f"| chat completion, openai SDK, zero modelled latency (ms) | {min(sdk_ms):.2f} | "
          f"{statistics.median(sdk_ms):.2f} |")  # fmt: skip
    print(f"| chat completion, bare httpx, zero modelled latency (ms) | {min(httpx_ms):.2f} | "
          f"{statistics.median(httpx_ms):.2f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
