"""HttpProvider through the scheduler against bare httpx with the same connection pool.

The server runs in its own process, so the client's event loop and the server do not share a
GIL. By default (``--server canned``) it is :class:`aiqsim.http.loopback.LoopbackHttpServer`
answering every request at once with a fixed chat completion that echoes the request's
``Idempotency-Key``: what is measured is then the clients, not a server model. With
``--server provider`` it is the local provider server (:func:`aiqsim.http.start_local_server`,
zero latency, no failures), whose simulated provider and ledger cost more per request than
the clients do (about 40 requests/s on the shared 2-core machine), so every client measures
nearly the same. Three clients send the same chat requests (``Idempotency-Key`` included) at the
same concurrency:

- ``bare httpx``: one ``httpx.AsyncClient(limits=Limits(C, C))``, an ``asyncio.Semaphore(C)``,
  ``asyncio.gather`` over the calls, each answer's JSON decoded: the floor of what any client
  can do with this pool;
- ``scheduler + HttpProvider``: :class:`aiqsim.Scheduler` (memory store, ``concurrency=C``)
  with an ``HttpProvider`` attached to it, so its pool is sized from the lane (C, all kept
  alive); all tasks submitted, then awaited;
- ``... httpx default pool``: the same, but the provider is handed an ``httpx.AsyncClient()``
  with httpx's default limits (100 connections, 20 kept alive), as before the fix.

Per round and client: requests per second and the TCP connections the server accepted. Five
rounds, in rotating order; min and median reported, with the load average before and after
(2 shared cores: compare the ratios within a run, not absolute figures across runs).

Run: ``python benchmarks/bench_http_pool.py [--concurrency 64] [--requests 1000] [--rounds 5]
[--server canned|provider]`` (about a minute with the defaults).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable

import httpx

from aiqsim import AsyncioRuntime, QuotaLimits, Scheduler
from aiqsim.http import HttpProvider

SERVERS = {
    "provider": textwrap.dedent(
        """
        import sys
        from aiqsim.http import start_local_server
        from aiqsim.sim.config import ProviderConfig

        config = ProviderConfig(name="llm", latency_base_s=0.0, latency_per_unit_s=0.0)
        with start_local_server(config) as server:
            print(server.url, flush=True)
            for line in sys.stdin:  # "count" -> connections accepted so far; EOF stops the server
                print(server.connections_accepted, flush=True)
        """
    ),
    "canned": textwrap.dedent(
        """
        import sys
        from aiqsim.http.chat import completion_json
        from aiqsim.http.loopback import HttpReply, LoopbackHttpServer

        answer = completion_json("chatcmpl-bench", "bench", "ok", prompt=3, output=4, created=0)

        async def handle(request):
            key = request.headers.get("idempotency-key")
            return HttpReply.json(200, answer, {"idempotency-key": key} if key else {})

        with LoopbackHttpServer(handle, name="bench-canned") as server:
            print(server.url, flush=True)
            for line in sys.stdin:  # "count" -> connections accepted so far; EOF stops the server
                print(server.connections_accepted, flush=True)
        """
    ),
}


class ServerProcess:
    """The local provider server in a child process; ``connections()`` asks it for its count."""

    def __init__(self, kind: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVERS[kind]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None and self.process.stdin is not None
        self.url = self.process.stdout.readline().strip()
        if not self.url.startswith("http://127.0.0.1:"):
            raise RuntimeError(f"the server did not start: {self.url!r}")

    def connections(self) -> int:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("count\n")
        self.process.stdin.flush()
        return int(self.process.stdout.readline())

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(10)


def body(index: int) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": f"prompt {index}"}], "max_tokens": 4}


async def bare_httpx(url: str, concurrency: int, requests: int, offset: int) -> None:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    semaphore = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60.0) as client:

        async def one(index: int) -> None:
            async with semaphore:
                response = await client.post(
                    url + "/v1/chat/completions", json=body(index), headers={"Idempotency-Key": f"k{index}"}
                )
                response.raise_for_status()
                response.json()

        await asyncio.gather(*(one(offset + index) for index in range(requests)))


async def through_scheduler(
    url: str, concurrency: int, requests: int, offset: int, *, default_pool: bool = False
) -> None:
    runtime = AsyncioRuntime()
    client = httpx.AsyncClient(timeout=60.0) if default_pool else None
    provider = HttpProvider("llm", url, client=client, timeout=60.0)
    scheduler = Scheduler(
        runtime,
        [provider],
        quotas={"llm": QuotaLimits(concurrency=concurrency)},
        rng=random.Random(0),
        background_limit=None,
    )
    provider.attach_to(scheduler)
    handles = [scheduler.submit("llm", body(offset + index), cost_estimate=1) for index in range(requests)]
    for handle in handles:
        await handle
    await scheduler.close()
    await provider.aclose()
    if client is not None:
        await client.aclose()


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f} / {five:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--server", choices=sorted(SERVERS), default="canned")
    args = parser.parse_args()
    clients: dict[str, Callable[[str, int, int, int], Awaitable[None]]] = {
        "bare httpx, same pool": bare_httpx,
        "scheduler + HttpProvider": through_scheduler,
        "scheduler + HttpProvider, httpx default pool": lambda *a: through_scheduler(*a, default_pool=True),
    }
    server = ServerProcess(args.server)
    rates: dict[str, list[float]] = {name: [] for name in clients}
    connections: dict[str, list[int]] = {name: [] for name in clients}
    load_before = load()
    offset = 0
    try:
        for round_index in range(args.rounds):
            names = list(clients)
            names = names[round_index % len(names) :] + names[: round_index % len(names)]
            for name in names:
                before = server.connections()
                started = time.perf_counter()
                asyncio.run(clients[name](server.url, args.concurrency, args.requests, offset))
                elapsed = time.perf_counter() - started
                offset += args.requests
                rates[name].append(args.requests / elapsed)
                connections[name].append(server.connections() - before)
    finally:
        server.close()
    load_after = load()

    print(
        f"{args.server} server, concurrency {args.concurrency}, {args.requests} requests per round, "
        f"{args.rounds} rounds; "
        f"load average (1 / 5 min) before {load_before}, after {load_after}\n"
    )
    print("| client | requests/s min | requests/s median | connections per round (median) | median vs bare |")
    print("|---|---|---|---|---|")
    bare = statistics.median(rates["bare httpx, same pool"])
    for name in clients:
        median = statistics.median(rates[name])
        print(
            f"| {name} | {min(rates[name]):,.0f} | {median:,.0f} | "
            f"{statistics.median(connections[name]):,.0f} | {median / bare:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
