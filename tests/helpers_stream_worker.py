"""A real worker process for the SIGKILL mid-stream test (not a test module).

It runs the real :class:`~aiqsim.scheduler.Scheduler` on :class:`~aiqsim.runtime.AsyncioRuntime`
with a SQLite store and an :class:`~aiqsim.http.HttpProvider` pointed at a served provider.

Modes:
    stream    submit one task with ``stream=True`` and read its chunks; print ``streaming`` once
              the first chunk has arrived (the parent SIGKILLs it then), and keep reading.
    recover   reopen the store, ``recover()`` (the provider's lookup completes the orphan), print
              the task's record as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from typing import Any

from aiqsim.core.token_bucket import QuotaLimits
from aiqsim.http import HttpProvider
from aiqsim.runtime import AsyncioRuntime
from aiqsim.scheduler import RetryPolicy, Scheduler
from aiqsim.stores import open_store

TASK_ID = "stream-task"
KEY = "stream-key-1"
PAYLOAD = {"messages": [{"role": "user", "content": "a long streamed answer"}], "max_tokens": 400}


def say(message: Any) -> None:
    print(message if isinstance(message, str) else json.dumps(message), flush=True)


def _scheduler(url: str, store: Any) -> tuple[Scheduler, HttpProvider]:
    provider = HttpProvider("llm", url, lookup_path="/lookup/{key}")
    scheduler = Scheduler(
        AsyncioRuntime(),
        [provider],
        quotas={"llm": QuotaLimits(concurrency=2)},
        store=store,
        rng=random.Random(7),
        retry=RetryPolicy(max_attempts=2, attempt_timeout_s=60.0, first_token_timeout_s=30.0),
        worker_id="stream-worker",
    )
    provider.attach_to(scheduler)
    return scheduler, provider


async def stream(args: argparse.Namespace) -> None:
    store = open_store("sqlite", args.store)
    scheduler, provider = _scheduler(args.url, store)
    async with provider:
        submission = scheduler.submit("chat", PAYLOAD, provider="llm", key=KEY, task_id=TASK_ID, stream=True)
        chunks = 0
        async for _chunk in submission.stream():
            chunks += 1
            if chunks == 1:
                say("streaming")
        say({"finished_unkilled": chunks})  # the parent should have killed this process by now
        await scheduler.close()
    store.close()


async def recover(args: argparse.Namespace) -> None:
    store = open_store("sqlite", args.store)
    before = store.get(TASK_ID)
    scheduler, provider = _scheduler(args.url, store)
    async with provider:
        report = await scheduler.recover()
        await scheduler.join()
        await scheduler.close()
    record = store.get(TASK_ID)
    store.close()
    assert record is not None and before is not None
    say(
        {
            "before": before.status.value,
            "status": record.status.value,
            "result": record.result,
            "attempts": record.attempts,
            "completed": report.orphans_completed,
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["stream", "recover"])
    parser.add_argument("--store", required=True)
    parser.add_argument("--url", required=True)
    args = parser.parse_args()
    asyncio.run(stream(args) if args.mode == "stream" else recover(args))


if __name__ == "__main__":
    main()
