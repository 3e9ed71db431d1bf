"""Recovery's provider lookups, retried within a bound so one flaky lookup cannot block a restart.

:meth:`~aiqsim.scheduler.Scheduler.recover` asks the provider, for each orphaned ``running``
task, whether it already did the work (``lookup(key)``). A lookup that raises or hangs is
retried with backoff (``runtime.sleep``, jitter from the scheduler's injected ``rng``) up to
``attempts`` times, each bounded by ``timeout_s``. An orphan whose lookups all failed is
*undecided*: recovery leaves it ``running`` in the store (failing it could bill the work twice
when it is re-submitted; the provider may have done it) and names it in the report.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from aiqsim.core.backoff import BackoffStrategy, FullJitter, retry_delay
from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import ProviderContractError
from aiqsim.core.numeric import is_whole
from aiqsim.runtime.protocol import Runtime
from aiqsim.scheduler.provider import ProviderResponse, SupportsLookup

__all__ = ["LookupOutcome", "LookupRetry", "lookup_all", "lookup_with_retries"]


@dataclass(frozen=True, slots=True)
class LookupRetry:
    """How recovery retries a failed provider lookup.

    ``attempts`` lookups at most per orphan (1: no retry), ``backoff`` between them (full jitter
    from 0.5 s, capped at 10 s, by default: about 3.5 s in the worst case for 4 attempts), each
    lookup cut after ``timeout_s`` (``None``: no limit; not advised, a hung lookup then blocks
    the restart). ``concurrency`` orphans are looked up at once (:func:`lookup_all`): a provider
    whose lookups all hang holds a restart for about ``ceil(orphans / concurrency)`` times one
    orphan's worst case, not ``orphans`` times it.
    """

    attempts: int = 4
    backoff: BackoffStrategy = field(default_factory=lambda: FullJitter(base_s=0.5, cap_s=10.0))
    timeout_s: float | None = 30.0
    concurrency: int = 16

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise ConfigurationError(f"attempts must be an integer >= 1, got {self.attempts!r}")
        if not is_whole(self.concurrency, 1):
            raise ConfigurationError(f"concurrency must be an integer >= 1, got {self.concurrency!r}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ConfigurationError(f"timeout_s must be > 0 or None, got {self.timeout_s!r}")


@dataclass(frozen=True, slots=True)
class LookupOutcome:
    """``decided``: the provider answered (``response`` is its record of the work, or ``None``: it
    has none). Otherwise every attempt failed and ``error`` is the last failure."""

    decided: bool
    response: ProviderResponse | None = None
    error: BaseException | None = None
    attempts: int = 0


async def lookup_with_retries(
    runtime: Runtime, provider: SupportsLookup, key: str, policy: LookupRetry, rng: random.Random
) -> LookupOutcome:
    """Look ``key`` up at ``provider``, retrying failures and timeouts as ``policy`` says."""
    error: BaseException | None = None
    previous: float | None = None
    for attempt in range(1, policy.attempts + 1):
        try:
            lookup = provider.lookup(key)
            if policy.timeout_s is not None:
                response = await runtime.wait_for(lookup, policy.timeout_s)
            else:
                response = await lookup
        except Exception as failure:  # a raising or hung lookup: try again, then give up on this orphan
            error = failure
        else:
            if response is None or isinstance(response, ProviderResponse):
                return LookupOutcome(True, response, None, attempt)
            # an adapter's bug, as for call() (ProviderContractError): asking again would not mend
            # it, and the orphan stays undecided (its work may be done) instead of stopping recovery
            error = ProviderContractError(
                f"lookup({key!r}) returned {type(response).__name__}, not a ProviderResponse or None "
                "(aiqsim.scheduler.provider): a bug in the provider's adapter; the task is left running"
            )
            return LookupOutcome(False, None, error, attempt)
        if attempt < policy.attempts:
            previous = retry_delay(policy.backoff, attempt - 1, rng, previous=previous)
            await runtime.sleep(previous)
    return LookupOutcome(False, None, error, policy.attempts)


async def lookup_all(
    runtime: Runtime,
    lookups: Sequence[tuple[SupportsLookup, str]],
    policy: LookupRetry,
    rng: random.Random,
) -> list[LookupOutcome]:
    """:func:`lookup_with_retries` for each ``(provider, key)``, at most ``policy.concurrency`` at a
    time; the outcomes in the order of ``lookups``. Recovery asked one orphan after another, so a
    provider whose lookup hung held the restart for minutes per orphan."""
    if not lookups:
        return []  # no task to spawn, no instant to yield
    outcomes: list[LookupOutcome | None] = [None] * len(lookups)
    pending = iter(range(len(lookups)))

    async def worker() -> None:
        for index in pending:  # one iterator shared by the workers: each index is taken once
            provider, key = lookups[index]
            outcomes[index] = await lookup_with_retries(runtime, provider, key, policy, rng)

    workers = [
        runtime.spawn(worker(), name=f"recovery-lookup-{n}")
        for n in range(min(policy.concurrency, len(lookups)))
    ]
    try:
        for handle in workers:
            await handle
    finally:
        for handle in workers:  # recovery was cancelled (a crash), or a worker broke: stop the rest
            if not handle.done():
                handle.cancel()
    return [outcome for outcome in outcomes if outcome is not None]
