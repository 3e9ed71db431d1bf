"""Retention: how long finished tasks and jobs and idempotency keys stay in a store; a periodic purge.

A store never deletes anything by itself (~440 bytes per finished task in SQLite, a few KB per job
record, growing linearly). :class:`RetentionPolicy` names the two clocks of
:func:`~aiqsim.stores.base.plan_purge`, the rule every store applies to its tasks *and* its jobs,
in the same purge call and the same transaction:

- ``finished_ttl_s`` (default one day, like Celery's ``result_expires``): finished tasks and jobs --
  succeeded, failed, cancelled, deduped -- are deleted this long after they finished;
- ``keys_ttl_s`` (default seven days): a succeeded task that owns its idempotency key, and that key,
  are kept this long, so a duplicate submission within it still returns the stored result instead of
  calling (and paying) the provider again. After it, a duplicate runs again. Likewise a succeeded
  job that owns its job key answers duplicate job submissions until its key is this old;
- queued and running tasks and jobs, the keys of live owners and poison records are never purged;
  a record stamped after ``now`` (another clock origin) is kept.

A duplicate waiting on a task or job run by *another process* learns its outcome by polling the
owner's record every ``duplicate_poll_s``. With a ``finished_ttl_s`` shorter than that, an owner
may end and be purged between two polls: the waiter then finds no record, takes the key over (as
after a cancelled owner) and runs the call itself (``tests/test_purged_owner.py``). Keep the TTL well
above the poll to share the owner's outcome instead.

A live job's finished stage tasks follow the task rule: they may be purged while the job still
runs. Nothing needs them: the job record holds each finished stage's result, which is what later
stages build from and what recovery reads (:mod:`aiqsim.scheduler.jobs`), so the job completes and
recovers as before. What goes with such a task once its *key* expires is only its deduplication: a
stage task still running at a crash whose finished fan-out siblings' keys had expired calls those
siblings again on recovery (at least once, as for any task past the key TTL).

:class:`~aiqsim.stores.base.PurgeReport` counts tasks (``tasks_removed``, ``keys_removed``,
``kept_for_keys``) and jobs (``jobs_removed``, ``job_keys_removed``).

Running it: ``policy.purge(store, now)`` once (e.g. from a cron job with the same store), or
``runtime.spawn(purge_periodically(store, runtime, policy))`` next to the scheduler, on the same
runtime and so the same clock that stamps ``finished_at``. An ``AsyncioRuntime`` clock starts at zero
in every process; a task stamped by an earlier process therefore looks younger than it is (never
older), so a restart can only delay its purge, never bring it forward.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from aiqsim.core.errors import ConfigurationError, StoreError
from aiqsim.stores.base import PurgeReport, TaskStore, check_purge_ttls

if TYPE_CHECKING:  # the stores need no runtime at import time
    from aiqsim.runtime.protocol import Runtime

DAY_S = 86_400.0
DEFAULT_FINISHED_TTL_S = DAY_S
"""Finished tasks are kept one day (Celery's ``result_expires`` default)."""
DEFAULT_KEYS_TTL_S = 7 * DAY_S
"""A succeeded task answers duplicates of its key for seven days."""
DEFAULT_INTERVAL_S = 3_600.0
""":func:`purge_periodically` runs once an hour."""


@dataclass(frozen=True)
class RetentionPolicy:
    """How long a store keeps finished tasks and jobs, and idempotency keys (see module docs)."""

    finished_ttl_s: float = DEFAULT_FINISHED_TTL_S
    keys_ttl_s: float = DEFAULT_KEYS_TTL_S
    interval_s: float = DEFAULT_INTERVAL_S

    def __post_init__(self) -> None:
        check_purge_ttls(self.finished_ttl_s, self.keys_ttl_s)
        if not (isinstance(self.interval_s, int | float) and 0 < self.interval_s < math.inf):
            raise ConfigurationError(
                f"interval_s must be a finite number of seconds > 0, got {self.interval_s!r}"
            )

    def purge(self, store: TaskStore, now: float) -> PurgeReport:
        """Run one purge of ``store``'s tasks and jobs as of ``now`` (the clock that stamped them)."""
        return store.purge(now, finished_older_than_s=self.finished_ttl_s, keys_older_than_s=self.keys_ttl_s)


async def purge_periodically(
    store: TaskStore,
    runtime: Runtime,
    policy: RetentionPolicy,
    *,
    on_report: Callable[[PurgeReport], None] | None = None,
    on_error: Callable[[StoreError], None] | None = None,
) -> NoReturn:
    """Purge ``store`` every ``policy.interval_s`` on ``runtime``'s clock, forever (cancel to stop).

    Each report goes to ``on_report``. A failed purge (a :class:`StoreError`; nothing of it was
    kept, it is one transaction) goes to ``on_error`` and the next interval tries again; without
    ``on_error`` it ends the loop by raising, so it is never lost silently.
    """
    while True:
        await runtime.sleep(policy.interval_s)
        try:
            report = policy.purge(store, runtime.now())
        except StoreError as error:
            if on_error is None:
                raise
            on_error(error)
            continue
        if on_report is not None:
            on_report(report)
