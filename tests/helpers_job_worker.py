"""A real worker process running jobs, for the SIGKILL job test (not a test module).

It opens a store file, builds the real :class:`~aiqsim.scheduler.Scheduler` on
:class:`~aiqsim.runtime.AsyncioRuntime` with the job spec registered, calls ``recover()`` (tasks
reconciled, unfinished jobs re-driven), submits the jobs of the fixed workload that the store does
not hold yet, and waits for all of them. Its three providers commit every execution to a ledger
file (see :mod:`tests.helpers_store_worker`), the ground truth the parent checks against.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiqsim import JobSpec, Priority, QuotaLimits, RetryPolicy, Scheduler, Stage
from aiqsim.runtime import AsyncioRuntime
from aiqsim.stores import open_store
from tests.helpers_store_worker import (
    RECOVER_LATENCY_S,
    LedgerProvider,
    LookupLedgerProvider,
    connect_ledger,
)


def script(inputs, results):
    return {"key": f"script:{inputs['clip']}"}


def paragraphs(inputs, results):
    return [{"key": f"tts:{inputs['clip']}:{i}"} for i in range(3)]


def subtitles(inputs, results):
    return {"key": f"align:{inputs['clip']}:{len(results['tts'])}"}


PIPELINE = JobSpec(
    "edit",
    "1",
    [
        Stage("script", "llm", build=script),
        Stage("tts", "tts", after=("script",), build=paragraphs, fan_out=True),
        Stage("subtitles", "align", after=("tts",), build=subtitles),
    ],
)
CLIPS = [f"c{n}" for n in range(8)]
WORKLOAD = [(f"job-{clip}", clip) for clip in CLIPS] + [("job-c1-again", "c1"), ("job-c5-again", "c5")]
"""(job id, clip): eight jobs and two double clicks."""
STAGE_KEYS = sorted(
    key
    for clip in CLIPS
    for key in (f"script:{clip}", *(f"tts:{clip}:{i}" for i in range(3)), f"align:{clip}:3")
)


def say(message: object) -> None:
    print(message if isinstance(message, str) else json.dumps(message), flush=True)


async def run(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    store = open_store(args.kind, args.store)
    say("opened")
    ledger = connect_ledger(args.ledger)
    latency = tuple(bound * args.latency_scale for bound in RECOVER_LATENCY_S)
    provider_class = LookupLedgerProvider if args.lookup else LedgerProvider
    providers = []
    for name in ("llm", "tts", "align"):
        provider = provider_class(ledger, rng, latency)  # type: ignore[arg-type]
        provider.name = name  # type: ignore[misc]
        providers.append(provider)
    scheduler = Scheduler(
        AsyncioRuntime(),
        providers,
        quotas={"llm": QuotaLimits(concurrency=2), "tts": QuotaLimits(concurrency=2)},
        store=store,
        rng=rng,
        retry=RetryPolicy(attempt_timeout_s=10.0 * args.latency_scale),
    )
    scheduler.jobs.register(PIPELINE)
    report = await scheduler.recover(requeue_interrupted=True)
    job_report = scheduler.job_recovery
    say({"recovered": report.orphans_completed, "jobs_resumed": job_report.resumed if job_report else 0})
    for job_id, clip in WORKLOAD:
        if store.get_job(job_id) is None:
            priority = Priority.INTERACTIVE if clip in ("c1", "c5") else Priority.BACKGROUND
            scheduler.submit_job(PIPELINE, {"clip": clip}, job_id=job_id, priority=priority)
            await asyncio.sleep(0.003)
    await scheduler.jobs.join()
    await scheduler.close()
    store.close()
    say({"done": os.getpid()})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kind", choices=["sqlite", "json"], required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--lookup", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--latency-scale", type=float, default=1.0)
    asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
