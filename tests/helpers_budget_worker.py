"""A fleet worker process for tests/test_redis_budget.py (not a test module).

It runs the real Scheduler on AsyncioRuntime with a shared RedisQuota and a Budget kept in that
account (RedisBudgetLedger), submits ``--tasks`` tasks at once as soon as the ``--go`` file exists,
and prints one JSON summary line: what its attempts were billed, how many succeeded and how many
the budget refused.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from aiqsim.core.task import TaskStatus
from aiqsim.core.token_bucket import QuotaLimits
from aiqsim.overload import Budget
from aiqsim.runtime import AsyncioRuntime
from aiqsim.scheduler import RetryPolicy, Scheduler
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse


class Billing:
    """Answers after ``latency_s`` of wall time, billing ``billed`` units."""

    name = "llm"

    def __init__(self, latency_s: float, billed: float) -> None:
        self.latency_s = latency_s
        self.billed = billed

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        await asyncio.sleep(self.latency_s)
        return ProviderResponse(result="ok", usage=self.billed)


async def work(args: argparse.Namespace) -> dict[str, object]:
    from aiqsim.fleet import RedisBudgetLedger, RedisQuota

    runtime = AsyncioRuntime()
    quota = RedisQuota(args.redis, args.account, QuotaLimits(concurrency=args.concurrency), worker=args.name)
    budget = Budget(per_day=args.limit, prices={"llm": args.price}, ledger=RedisBudgetLedger(quota))
    scheduler = Scheduler(
        runtime,
        [Billing(args.latency, args.billed)],
        quotas={"llm": quota},  # type: ignore[dict-item]
        gates=[budget],
        retry=RetryPolicy(max_attempts=1, attempt_timeout_s=30.0),
        background_limit=None,
    )
    print("ready", flush=True)
    go = Path(args.go)
    while not go.exists():  # start together with the rest of the fleet
        await asyncio.sleep(0.002)
    async with scheduler:
        handles = [
            scheduler.submit("llm", {"n": n, "worker": args.name}, cost_estimate=args.estimate)
            for n in range(args.tasks)
        ]
        records = [await h.wait() for h in handles]
    refused = [r for r in records if r.error and r.error.startswith("BudgetExceeded")]
    return {
        "billed": budget.billed_total,
        "succeeded": sum(r.status is TaskStatus.SUCCEEDED for r in records),
        "refused": len(refused),
        "failed_otherwise": sum(r.status is TaskStatus.FAILED for r in records) - len(refused),
        "errors": sorted({r.error for r in records if r.error})[:3],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    for name, kind in (
        ("--redis", str), ("--account", str), ("--go", str), ("--name", str), ("--tasks", int),
        ("--concurrency", int), ("--estimate", float), ("--billed", float), ("--price", float),
        ("--limit", float), ("--latency", float),
    ):  # fmt: skip
        parser.add_argument(name, type=kind, required=True)
    print(json.dumps(asyncio.run(work(parser.parse_args()))), flush=True)


if __name__ == "__main__":
    main()
