"""A real fleet worker with a lease, for tests/test_leases.py (not a test module).

It runs the real Scheduler on AsyncioRuntime with a PostgresStore, an HttpProvider (with the
local provider server's lookup endpoint) and a LeaseKeeper. It submits its own tasks, then
keeps serving — renewing its lease, adopting dead workers' tasks — until the store holds no
unfinished task of anyone, and prints one JSON summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from aiqsim.core.task import TaskStatus
from aiqsim.core.token_bucket import QuotaLimits
from aiqsim.fleet import LeaseKeeper
from aiqsim.http.httpx_provider import HttpProvider
from aiqsim.runtime import AsyncioRuntime
from aiqsim.scheduler import RetryPolicy, Scheduler
from aiqsim.stores.postgres import PostgresStore


async def work(args: argparse.Namespace) -> dict[str, object]:
    runtime = AsyncioRuntime()
    store = PostgresStore(args.dsn, schema=args.schema)
    provider = HttpProvider(
        "llm", args.url, lookup_path="/lookup/{key}", headers={"x-client-id": args.worker}
    )
    scheduler = Scheduler(
        runtime,
        [provider],
        quotas={"llm": QuotaLimits(concurrency=2)},
        store=store,
        retry=RetryPolicy(attempt_timeout_s=20.0),
        worker_id=args.worker,
        duplicate_poll_s=0.05,
    )
    keeper = LeaseKeeper(scheduler, ttl_s=args.ttl, renew_every_s=args.ttl / 4, requeue_interrupted=True)
    await keeper.recover_and_start(requeue_interrupted=False)  # the lease first, then its own tasks
    print("ready", flush=True)
    for n in range(args.tasks):
        key = f"{args.worker}-k{n:03d}"
        scheduler.submit("llm", {"input": key, "prompt_units": 1, "output_units": 1}, key=key, task_id=key)
        await asyncio.sleep(0.002)
    while True:  # serve until nothing in the store is unfinished (ours or adopted)
        await scheduler.join()
        unfinished = store.list_by_status(TaskStatus.QUEUED, TaskStatus.RUNNING)
        if not unfinished and args.stay_for_adoptions <= 0:
            break
        if not unfinished:
            args.stay_for_adoptions -= 0.1
        await asyncio.sleep(0.1)
    await keeper.stop()
    await scheduler.close()
    await provider.aclose()
    store.close()
    return {
        "worker": args.worker,
        "adopted": [{"worker": a.worker, "completed": a.report.orphans_completed,
                     "failed": a.report.orphans_failed,
                     "resumed": a.report.queued_resumed + a.report.orphans_requeued}
                    for a in keeper.adoptions],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--ttl", type=float, default=1.5)
    parser.add_argument("--stay-for-adoptions", type=float, default=0.0, help="seconds to wait idle")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(work(args))), flush=True)


if __name__ == "__main__":
    main()
