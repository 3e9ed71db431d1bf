"""What recording the call log costs the production scheduler on asyncio.

The scheduler on :class:`aiqsim.AsyncioRuntime` with a memory store sends ``CALLS`` calls to a no-op
provider (one trip through the event loop per call), four ways, interleaved round by round so
machine load hits them alike:

- ``no sink``: ``Scheduler(events=None)``, the baseline;
- ``a sink that drops every event``: what building the events costs the scheduler, for any sink;
- ``CallLog in memory``: ``Scheduler(events=CallLog())`` (rows kept while serving, written after the
  last call: the writing time is shown apart, it is not paid while calls are served);
- ``CallLog streaming``: ``Scheduler(events=CallLog(folder))`` (CSV appended every 1,000 events,
  flushed, closed at the end: the production set-up);
- ``CallLog streaming Parquet``: ``CallLog(folder, format="parquet", flush_rows=10_000)`` (a row group
  per 10,000 events: no float formatted as text on the serving path).

A no-op provider is the worst case: a real call takes milliseconds to seconds, so the log's
microseconds per call vanish against it. Target: <= 10% fewer calls/s.

Run: ``python benchmarks/bench_call_log.py [ROUNDS]`` (5 rounds, about 30 s). Prints a markdown table
with min and median calls/s and the load average before and after.

``python benchmarks/bench_call_log.py ROUNDS --http [LATENCY_MS]``: the realistic case. The same
scheduler drives :class:`aiqsim.http.HttpProvider` against the local provider server
(:func:`aiqsim.http.start_local_server`, a simulated provider with ``LATENCY_MS`` of latency, default
0) over HTTP on 127.0.0.1; the server runs in a child process so its CPU is not this process's.
``HTTP_CALLS`` calls per run at concurrency ``HTTP_CONCURRENCY``, same sinks, same interleaving.

Two clocks: calls per wall-clock second (what a user sees, but on a shared machine other processes'
load moves it by 2x between rounds), and calls per CPU second of this process
(:func:`time.process_time`: what the scheduler and the log cost, much less moved by the neighbours).
The cost of a sink is also given as the median over rounds of its paired ratio to the no-sink run
of the same round, so a slow round slows both sides of the ratio.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aiqsim import AsyncioRuntime, ProviderRequest, ProviderResponse, QuotaLimits, Scheduler
from aiqsim.scheduler.call_log import CallLog
from aiqsim.stores.memory import MemoryStore

CALLS = 10_000
HTTP_CALLS = 300
HTTP_CONCURRENCY = 32

SERVER = """
import sys
from aiqsim.http import start_local_server
from aiqsim.sim.config import ProviderConfig

latency = float(sys.argv[1])
config = ProviderConfig(name="llm", latency_base_s=latency, latency_per_unit_s=0.0)
with start_local_server(config) as server:
    print(server.url, flush=True)
    sys.stdin.read()  # EOF (the benchmark ends) stops the server
"""


class NoopProvider:
    """Answers every call after one trip through the event loop."""

    name = "noop"

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        await asyncio.sleep(0)
        return ProviderResponse(result=request.payload, usage=1.0, output_units=1.0)


def _nop(event: object) -> None:
    """A sink that drops everything: what building the events costs the scheduler."""


def run(mode: str, folder: Path, url: str | None = None) -> float:
    """Calls per wall-clock second through the scheduler with the given event sink (the calls per CPU
    second go to :data:`CPU_RATES`); to the no-op provider, or with ``url`` over HTTP to that server."""
    runtime = AsyncioRuntime()
    log: CallLog | None = None
    if mode == "nop":
        log = _nop  # type: ignore[assignment]
    elif mode == "memory":
        log = CallLog()
    elif mode == "stream":
        log = CallLog(folder)
    elif mode == "parquet":
        log = CallLog(folder, format="parquet", flush_rows=10_000)

    calls = CALLS if url is None else HTTP_CALLS

    async def submit_all_and_join() -> None:
        if url is not None:
            await over_http(url, runtime, log)
            return
        scheduler = Scheduler(
            runtime,
            [NoopProvider()],
            quotas={"noop": QuotaLimits(requests_per_min=1e9, concurrency=64)},
            store=MemoryStore(),
            rng=random.Random(0),
            events=log,
            background_limit=CALLS,  # all submitted up front: the queue must hold every call
        )
        for index in range(CALLS):
            scheduler.submit("noop", {"n": index}, key=f"call-{index}", cost_estimate=1.0)
        await scheduler.join()
        await scheduler.close()

    gc.collect()
    cpu_start = time.process_time()
    start = time.perf_counter()
    runtime.run(submit_all_and_join())
    served = time.perf_counter() - start
    CPU_RATES.setdefault(mode, []).append(calls / (time.process_time() - cpu_start))
    if isinstance(log, CallLog):
        if mode == "memory":
            log.write(folder / "memory")
        else:
            log.close()
    WRITE_SECONDS.setdefault(mode, []).append(time.perf_counter() - start - served)
    return calls / served


async def over_http(url: str, runtime: AsyncioRuntime, log: object) -> None:
    """``HTTP_CALLS`` chat calls through the scheduler and HttpProvider (pool sized from the lane)."""
    from aiqsim.http import HttpProvider

    provider = HttpProvider("llm", url, timeout=60.0)
    scheduler = Scheduler(
        runtime,
        [provider],
        quotas={"llm": QuotaLimits(requests_per_min=1e9, concurrency=HTTP_CONCURRENCY)},
        store=MemoryStore(),
        rng=random.Random(0),
        events=log,  # type: ignore[arg-type]
        background_limit=HTTP_CALLS,
    )
    provider.attach_to(scheduler)
    for index in range(HTTP_CALLS):
        body = {"messages": [{"role": "user", "content": f"prompt {index}"}], "max_tokens": 4}
        scheduler.submit("llm", body, key=f"call-{index}", cost_estimate=1.0)
    await scheduler.join()
    await scheduler.close()
    await provider.aclose()


CPU_RATES: dict[str, list[float]] = {}
"""Calls per CPU second of this process while serving, per mode, one per round."""

WRITE_SECONDS: dict[str, list[float]] = {}
"""Seconds spent after the last call writing (memory: the whole CSV; streaming: the last flush)."""


def main() -> int:
    args = sys.argv[1:]
    http = "--http" in args
    if http:
        at = args.index("--http")
        latency_ms = float(args[at + 1]) if len(args) > at + 1 else 0.0
        args = args[:at]
    rounds = int(args[0]) if args else 5
    server = None
    url = None
    if http:
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(latency_ms / 1000)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        if not url.startswith("http://127.0.0.1:"):
            raise RuntimeError(f"the local provider server did not start: {url!r}")
    modes = {
        "none": "no sink",
        "nop": "a sink that drops every event",
        "memory": "CallLog in memory (CSV written after)",
        "stream": "CallLog streaming CSV",
        "parquet": "CallLog streaming Parquet",
    }
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:  # a warm-up round, not counted: imports and first-use costs (pyarrow's)
            run(mode, Path(tmp) / f"{mode}-warm-up", url)
        CPU_RATES.clear()
        WRITE_SECONDS.clear()
        for round_ in range(rounds):
            for mode in modes:
                rates[mode].append(run(mode, Path(tmp) / f"{mode}-{round_}", url))
    if server is not None:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(10)
    after = os.getloadavg()
    what = (
        f"{HTTP_CALLS:,} calls over HTTP on 127.0.0.1 (local provider server, {latency_ms:g} ms latency, "
        f"concurrency {HTTP_CONCURRENCY})"
        if http
        else f"{CALLS:,} no-op calls"
    )
    print(f"{what} per run, {rounds} rounds interleaved; load average {before[0]:.2f} before, "
          f"{after[0]:.2f} after (1 min)\n")  # fmt: skip
    print(
        "| sink | min calls/s | median calls/s | paired vs no sink (median) | median calls/CPU-s "
        "| paired vs no sink, CPU (median) | then writing (median s) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for mode, label in modes.items():
        wall, cpu = rates[mode], CPU_RATES[mode]
        paired = statistics.median(r / b - 1 for r, b in zip(wall, rates["none"], strict=True))
        paired_cpu = statistics.median(r / b - 1 for r, b in zip(cpu, CPU_RATES["none"], strict=True))
        write = statistics.median(WRITE_SECONDS[mode])
        print(
            f"| {label} | {min(wall):,.0f} | {statistics.median(wall):,.0f} | {paired:+.1%} "
            f"| {statistics.median(cpu):,.0f} | {paired_cpu:+.1%} | {write:.3f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
