"""The README's "Using the scheduler in production", as a script you can run.

A worker that summarises a batch of support tickets with an OpenAI-style chat API:
AsyncioRuntime + HttpProvider + SqliteStore + quotas + retries, and ``recover()`` first, so a
restart after a crash (even ``kill -9``) picks up where the last run stopped.

Needs the ``http`` extra (``pip install -e ".[http]"``); the local provider server it can be tried
against is part of the lab (``pip install -e ".[lab,http]"`` for both)::

    aiqsim serve scenarios/crash_recovery.toml --port 8000          # in one terminal
    python examples/production_worker.py --base-url http://127.0.0.1:8000/v1

Run it twice: the second run sends nothing (every ticket is answered from the store). Against
OpenAI itself (no lookup endpoint; the API key from ``OPENAI_API_KEY``)::

    python examples/production_worker.py --base-url https://api.openai.com/v1 --no-lookup

What recovery can do depends on the provider; see ``--no-lookup`` and ``--requeue-interrupted``
below and the README. ``examples/crash_and_recover.py`` kills this worker mid-run and shows it.

As one worker of a fleet (several processes sharing a PostgreSQL store, each with its own
``--worker-id``; the ``postgres`` extra), give ``--postgres DSN``: the worker then holds a lease that
a :class:`~aiqsim.fleet.LeaseKeeper` renews, and starts with ``keeper.recover_and_start()``, which
takes the lease before recovering (the one right order: see :mod:`aiqsim.fleet.leases`)::

    python examples/production_worker.py --postgres postgresql://127.0.0.1/aiqsim --worker-id w1

Exit status: 0 when every ticket has its summary, 1 when some failed (listed), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
from collections.abc import Sequence

from aiqsim import (
    AsyncioRuntime,
    FullJitter,
    Priority,
    QuotaLimits,
    RetryPolicy,
    Scheduler,
    SqliteStore,
    TaskFailedError,
    TaskStatus,
)
from aiqsim.fleet import LeaseKeeper
from aiqsim.http import HttpProvider

TICKETS = {
    f"T-{100 + n}": text
    for n, text in enumerate(
        [
            "The export button does nothing on Safari 17.",
            "I was billed twice for the March invoice.",
            "Password reset emails arrive after an hour.",
            "The mobile app logs me out every few minutes.",
            "Can I change the currency of my account?",
            "CSV import fails on files with a BOM.",
            "Dark mode makes the charts unreadable.",
            "Two-factor codes are rejected right after setup.",
            "The API returns 502 for large uploads.",
            "Please delete my account and all my data.",
            "Search results ignore the date filter.",
            "The invoice PDF shows the wrong VAT number.",
        ]
    )
}
"""The work: ticket id -> text. The ticket id is the task's idempotency key."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--base-url",
        default=os.environ.get("AIQSIM_BASE_URL", "http://127.0.0.1:8000/v1"),
        help="OpenAI-style base URL, ending in /v1 (default: $AIQSIM_BASE_URL or http://127.0.0.1:8000/v1)",
    )
    parser.add_argument("--model", default=os.environ.get("AIQSIM_MODEL", "gpt-4o-mini"))
    parser.add_argument("--store", default="tasks.sqlite3", help="SQLite task store (default tasks.sqlite3)")
    parser.add_argument(
        "--postgres",
        metavar="DSN",
        help="a PostgreSQL store shared by a fleet of workers, instead of --store (adds a lease)",
    )
    parser.add_argument("--schema", default="aiqsim", help="the PostgreSQL schema (with --postgres)")
    parser.add_argument("--worker-id", default="summary-worker-1", help="this process's name in the store")
    parser.add_argument("--tickets", type=int, default=8, help=f"how many tickets (1-{len(TICKETS)})")
    parser.add_argument("--concurrency", type=int, default=4, help="calls in flight at most")
    parser.add_argument(
        "--no-lookup",
        action="store_true",
        help="the provider has no GET {base}/lookup/{key} (OpenAI): recovery cannot know what was billed",
    )
    parser.add_argument(
        "--requeue-interrupted",
        action="store_true",
        help="re-send calls a crash interrupted (may bill twice without lookup) instead of failing them",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.tickets <= len(TICKETS):
        parser.error(f"--tickets: expected 1 to {len(TICKETS)}, got {args.tickets}")
    if args.concurrency < 1:
        parser.error(f"--concurrency: expected >= 1, got {args.concurrency}")
    return args


def chat_request(args: argparse.Namespace, text: str) -> dict[str, object]:
    """The chat-completions body for one ticket: a model and a valid messages list."""
    return {
        "model": args.model,
        "messages": [
            {"role": "system", "content": "Summarise the support ticket in one short sentence."},
            {"role": "user", "content": text},
        ],
        "max_tokens": 60,
    }


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    api_key = os.environ.get("OPENAI_API_KEY", "local-test-key")
    runtime = AsyncioRuntime()
    llm = HttpProvider(
        "llm",
        args.base_url,
        path="/chat/completions",
        headers={"authorization": f"Bearer {api_key}"},
        model=args.model,
        # Crash recovery asks the provider what it already did for a key. Without such an
        # endpoint recover() cannot tell a billed orphan from one never sent.
        lookup_path=None if args.no_lookup else "/lookup/{key}",
        timeout=60.0,
    )
    if args.postgres:
        from aiqsim.stores.postgres import PostgresStore

        store = PostgresStore(args.postgres, schema=args.schema)
    else:
        store = SqliteStore(args.store)
    async with (
        llm,
        Scheduler(
            runtime,
            [llm],
            quotas={
                "llm": QuotaLimits(
                    requests_per_min=500,
                    request_burst=10,
                    tokens_per_min=200_000,
                    concurrency=args.concurrency,
                )
            },
            retry=RetryPolicy(backoff=FullJitter(base_s=0.5, cap_s=30), max_attempts=5, attempt_timeout_s=60),
            store=store,
            rng=random.Random(),
            worker_id=args.worker_id,
        ) as scheduler,
    ):
        llm.attach_to(scheduler)  # the server's x-ratelimit-* headers correct our buckets
        keeper = None
        if args.postgres:
            # A fleet worker: take the lease, start renewing it, then recover this worker's own
            # tasks, in one call (recovering first would let another worker adopt them meanwhile).
            keeper = LeaseKeeper(scheduler, requeue_interrupted=args.requeue_interrupted)
            report = await keeper.recover_and_start()
        else:
            report = await scheduler.recover(requeue_interrupted=args.requeue_interrupted)
        print(
            f"recover: {report.orphans_completed} orphan(s) completed from the provider's record, "
            f"{report.orphans_failed} failed as interrupted, {report.orphans_requeued} re-sent, "
            f"{report.queued_resumed} queued task(s) resumed",
            flush=True,
        )
        tickets = list(TICKETS.items())[: args.tickets]
        pending = {}
        failures: list[str] = []
        for ticket, text in tickets:
            previous = store.owner_of(ticket)
            if (
                previous is not None
                and previous.status is TaskStatus.FAILED
                and (previous.error or "").startswith("TaskInterruptedError")
            ):
                # A crash cut this call short and nobody can say whether the provider billed it:
                # re-sending is a decision for a person (or for --requeue-interrupted), not a default.
                failures.append(f"{ticket}: interrupted by a crash, maybe billed; not re-sent")
                continue
            pending[ticket] = scheduler.submit(
                "llm", chat_request(args, text), key=ticket, priority=Priority.BACKGROUND
            )
        for ticket, submission in pending.items():
            try:
                summary = await submission
            except TaskFailedError as error:
                failures.append(f"{ticket}: {error.record.error}")
            else:
                print(f"{ticket}: {summary}", flush=True)
        if keeper is not None:
            await keeper.stop()  # a clean exit releases the lease: nothing is left to adopt
    store.close()
    for failure in failures:
        print(f"failed {failure}", flush=True)
    print(f"done: {len(tickets) - len(failures)} of {len(tickets)} ticket(s) summarised", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
