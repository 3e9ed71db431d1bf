"""The production scheduler on asyncio against plain asyncio + tenacity + aiolimiter doing the same calls.

Every call goes to a no-op provider that only ``await asyncio.sleep(0)``: what is measured is
the overhead per call of each stack, not a provider.

- scheduler: :class:`aiqsim.Scheduler` on :class:`aiqsim.AsyncioRuntime`, memory store,
  ``QuotaLimits(requests_per_min=1e9, concurrency=64)`` (the request bucket never runs dry),
  the default retry policy (full jitter, 5 attempts, 60 s attempt timeout). All calls are
  submitted, then ``join``. Measured with the idempotency key computed by ``submit`` (the
  default: a fingerprint of kind and payload) and with a caller-supplied key.
- plain: one coroutine per call under ``asyncio.gather``: an ``asyncio.Semaphore(64)``, an
  ``aiolimiter.AsyncLimiter`` with the same rate, a tenacity ``@retry`` with the same policy
  (full jitter, 5 attempts, retry on 429/timeout/5xx) and ``asyncio.wait_for(call, 60)``.
  No idempotency, no task records, no dispatch order, no cancellation handles.

Then the scheduler with the durable :class:`aiqsim.stores.sqlite.SqliteStore` (skipped if that
module is absent): calls/s with ``synchronous=FULL`` (the default, an fsync per state change)
and ``NORMAL``.

Run: ``python benchmarks/bench_asyncio_vs_tenacity.py`` (about 30 s). Prints markdown tables.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from aiolimiter import AsyncLimiter
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from aiqsim import (
    AsyncioRuntime,
    Priority,
    ProviderRequest,
    ProviderResponse,
    QuotaLimits,
    RateLimitError,
    Scheduler,
    ServerError,
)
from aiqsim.stores.memory import MemoryStore

CALLS = 20_000
SQLITE_CALLS = {"FULL": 500, "NORMAL": 2_000}  # FULL fsyncs on every state change: fewer calls
CONCURRENCY = 64
REQUESTS_PER_MIN = 1e9
REPEAT = 5


class NoopProvider:
    """Answers every call after one trip through the event loop."""

    name = "noop"

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        await asyncio.sleep(0)
        return ProviderResponse(result=request.payload)


# ---------------------------------------------------------------------------- the scheduler


def run_scheduler(
    calls: int, *, explicit_keys: bool, store_factory: Callable[[], object] = MemoryStore
) -> float:
    """Wall seconds for ``calls`` calls through the scheduler on asyncio."""
    runtime = AsyncioRuntime()

    async def submit_all_and_join() -> None:
        store = store_factory()
        scheduler = Scheduler(
            runtime,
            [NoopProvider()],
            quotas={"noop": QuotaLimits(requests_per_min=REQUESTS_PER_MIN, concurrency=CONCURRENCY)},
            store=store,  # type: ignore[arg-type]
            rng=random.Random(0),
            background_limit=None,  # all calls are submitted at once, as to the tenacity stack
        )
        for index in range(calls):
            scheduler.submit("noop", {"n": index}, key=f"call-{index}" if explicit_keys else None)
        await scheduler.join()
        await scheduler.close()
        records = store.list_by_status()  # type: ignore[attr-defined]
        failed = [record for record in records if record.status.value != "succeeded"]
        if len(records) != calls or failed:
            raise RuntimeError(f"{len(failed)} of {len(records)} calls did not succeed")
        store.close()  # type: ignore[attr-defined]

    gc.collect()
    start = time.perf_counter()
    runtime.run(submit_all_and_join())
    return time.perf_counter() - start


# ---------------------------------------------------------------------------- plain asyncio


def run_plain(calls: int) -> float:
    """Wall seconds for the same calls with asyncio + tenacity + aiolimiter."""
    provider = NoopProvider()

    async def gather_all() -> None:
        slots = asyncio.Semaphore(CONCURRENCY)
        limiter = AsyncLimiter(REQUESTS_PER_MIN, 60)

        @retry(
            stop=stop_after_attempt(5),
            wait=wait_random_exponential(multiplier=0.5, max=60),
            retry=retry_if_exception_type((RateLimitError, TimeoutError, ServerError)),
            reraise=True,
        )
        async def attempt(request: ProviderRequest) -> ProviderResponse:
            async with limiter:
                return await asyncio.wait_for(provider.call(request), 60)

        async def one(index: int) -> object:
            request = ProviderRequest(
                task_id=f"t{index}",
                idempotency_key=f"call-{index}",
                kind="noop",
                payload={"n": index},
                cost_estimate=0.0,
                attempt=1,
                priority=Priority.BACKGROUND,
            )
            async with slots:
                return (await attempt(request)).result

        results = await asyncio.gather(*(one(index) for index in range(calls)))
        if len(results) != calls:
            raise RuntimeError("lost calls")

    gc.collect()
    start = time.perf_counter()
    asyncio.run(gather_all())
    return time.perf_counter() - start


def min_median(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f}"


def main() -> None:
    versions = f"tenacity {metadata.version('tenacity')}, aiolimiter {metadata.version('aiolimiter')}"
    load_before = os.getloadavg()[0]
    stacks: dict[str, Callable[[], float]] = {
        "plain": lambda: run_plain(CALLS),
        "auto_key": lambda: run_scheduler(CALLS, explicit_keys=False),
        "given_key": lambda: run_scheduler(CALLS, explicit_keys=True),
    }
    walls: dict[str, list[float]] = {name: [] for name in stacks}
    ratios: dict[str, list[float]] = {"auto_key": [], "given_key": []}
    for round_no in range(REPEAT):  # interleaved, so a load burst hits every stack of a round alike
        order = list(stacks) if round_no % 2 == 0 else list(reversed(stacks))
        this_round = {name: stacks[name]() for name in order}
        for name, seconds in this_round.items():
            walls[name].append(seconds)
        for name in ratios:
            ratios[name].append(this_round["plain"] / this_round[name])
    print(
        f"{CALLS:,} calls to a no-op provider (await asyncio.sleep(0)), concurrency {CONCURRENCY}, "
        f"{REPEAT} interleaved rounds, min / median; load average before {load_before:.2f}, after "
        f"{os.getloadavg()[0]:.2f}. Python {sys.version.split()[0]}, {versions}.\n"
    )
    print("| stack | wall s | throughput vs plain, per round (goal >= 0.7x) |")
    print("|---|---|---|")
    print(f"| plain asyncio + tenacity + aiolimiter | {min_median(walls['plain'])} | 1.00x |")
    for name, label in (
        ("auto_key", "Scheduler on asyncio, memory store, key computed by submit"),
        ("given_key", "Scheduler on asyncio, memory store, caller's key"),
    ):
        print(f"| {label} | {min_median(walls[name])} | {min_median(ratios[name])}x |")
    auto_key = statistics.median(walls["auto_key"])

    if importlib.util.find_spec("aiqsim.stores.sqlite") is None:
        print("\n(aiqsim.stores.sqlite is not available: SQLite figures skipped)")
        return
    from aiqsim.stores.sqlite import SqliteStore

    print(f"\nScheduler on asyncio with SqliteStore (temp file, WAL), min / median of {REPEAT}:\n")
    print("| synchronous | calls | wall s | calls / s (median) | share of the memory store's calls / s |")
    print("|---|---|---|---|---|")
    memory_rate = CALLS / auto_key
    for level, calls in SQLITE_CALLS.items():

        def sqlite_run(level: str = level, calls: int = calls) -> float:
            with tempfile.TemporaryDirectory() as folder:
                path = Path(folder) / "bench.db"
                return run_scheduler(
                    calls, explicit_keys=False, store_factory=lambda: SqliteStore(path, synchronous=level)
                )

        runs = [sqlite_run() for _ in range(REPEAT)]
        rate = calls / statistics.median(runs)
        print(f"| {level} | {calls:,} | {min_median(runs)} | {rate:,.0f} | {rate / memory_rate:.1%} |")


if __name__ == "__main__":
    main()
