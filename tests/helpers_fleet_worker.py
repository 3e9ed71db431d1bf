"""A real fleet worker process for tests/test_fleet.py (not a test module).

It runs the real Scheduler on AsyncioRuntime with an HttpProvider pointed at a local provider
server, and submits tasks at its own offered rate for a fixed time. Its quota is either the
fleet's :class:`~aiqsim.fleet.RedisQuota` (``--mode shared``) or a static local share of the
account's limit (``--mode split``). It prints one JSON summary line at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from pathlib import Path

from aiqsim.core.task import TaskStatus
from aiqsim.core.token_bucket import QuotaLimits
from aiqsim.http.httpx_provider import HttpProvider
from aiqsim.runtime import AsyncioRuntime
from aiqsim.scheduler import RetryPolicy, Scheduler


async def work(args: argparse.Namespace) -> dict[str, object]:
    runtime = AsyncioRuntime(time_scale=args.time_scale)
    rng = random.Random(args.seed)
    provider = HttpProvider("llm", args.url, time_scale=args.time_scale, headers={"x-client-id": args.name})
    if args.mode == "shared":
        from aiqsim.fleet import RedisQuota

        quota: object = RedisQuota(
            args.redis,
            args.account,
            # A bucket that can never overrun the server's sliding 60 s window: rate x 60 s + burst
            # <= the limit. A burst of a few absorbs the workers' timer lateness on a busy machine.
            QuotaLimits(requests_per_min=args.limit_per_min - args.burst, request_burst=args.burst),
            worker=args.name,
            time_scale=args.time_scale,
        )
    else:
        share_burst = max(1.0, args.burst * args.share)
        quota = QuotaLimits(
            requests_per_min=args.limit_per_min * args.share - share_burst, request_burst=share_burst
        )
    scheduler = Scheduler(
        runtime,
        [provider],
        quotas={"llm": quota},  # type: ignore[dict-item]
        retry=RetryPolicy(max_attempts=1, attempt_timeout_s=30.0),
        rng=rng,
        background_limit=None,
    )
    print("ready", flush=True)
    go = Path(args.go)
    while not go.exists():  # start together with the rest of the fleet
        await asyncio.sleep(0.002)
    handles = []
    n = 0
    async with scheduler:
        end = runtime.now() + args.duration
        while runtime.now() < end:
            handles.append(
                scheduler.submit("llm", {"input": f"{args.name}-{n}", "prompt_units": 1, "output_units": 1})
            )
            n += 1
            await runtime.sleep(rng.expovariate(args.rate))
        await runtime.sleep(args.drain)
        records = [handle for handle in handles if handle.done()]
        await scheduler.close(cancel_pending=True)
    statuses = [(await handle.wait()).status for handle in handles]
    await provider.aclose()
    return {
        "name": args.name,
        "submitted": len(handles),
        "succeeded": statuses.count(TaskStatus.SUCCEEDED),
        "failed": statuses.count(TaskStatus.FAILED),
        "done_before_close": len(records),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--redis", default=None)
    parser.add_argument("--account", default="fleet")
    parser.add_argument("--mode", choices=["shared", "split"], required=True)
    parser.add_argument(
        "--limit-per-min", type=float, required=True, help="the account's limit, scenario time"
    )
    parser.add_argument("--share", type=float, default=1.0, help="this worker's fraction (split mode)")
    parser.add_argument("--burst", type=float, default=3.0, help="the quota's request burst")
    parser.add_argument("--rate", type=float, required=True, help="offered tasks per scenario second")
    parser.add_argument("--duration", type=float, required=True, help="scenario seconds of submissions")
    parser.add_argument("--drain", type=float, default=0.0)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--go", required=True, help="start submitting once this file exists")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(work(args))), flush=True)


if __name__ == "__main__":
    main()
