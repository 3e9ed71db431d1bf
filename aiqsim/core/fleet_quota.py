"""Quotas for a fleet of schedulers: one shared in-process quota, or the account's limits split N ways.

A fleet is several :class:`~aiqsim.scheduler.Scheduler` instances (workers, each with its own
queues and dispatchers) drawing on one provider account. There are two ways to respect the
account's limits:

- **Shared**: every worker reserves from the same quota object. Across hosts that object is
  :class:`aiqsim.fleet.RedisQuota`; inside one process (the lab runs N workers on one SimPy
  runtime) it is :class:`SharedMultiQuota`, a :class:`MultiQuota` that several schedulers hold.
  Reservations are atomic because the runtime is single-threaded, exactly as a Lua script makes
  them atomic in Redis.
- **Split**: each worker gets a static share, :func:`split_quota_limits` (the limits divided by N).
  No coordination, but a worker with little traffic cannot lend its share to a busy one.

Either way a worker may also cap its own calls in flight (:class:`WorkerCappedQuota`).

Nothing here reads a clock: every method takes ``now`` like :class:`MultiQuota`.
"""

from __future__ import annotations

import math
from typing import Any

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.token_bucket import MultiQuota, QuotaLimits, Reservation

DEFAULT_SLOT_POLL_S = 0.02
"""How soon a worker looks again when every shared concurrency slot is taken (SharedMultiQuota's
default, and RedisQuota's, in wall seconds there)."""


def poll_full_pool(wait: float, slot_poll_s: float) -> float:
    """The wait a worker on a *shared* concurrency pool is told: ``slot_poll_s`` when the pool is
    full (``wait`` is ``inf``), else ``wait`` unchanged.

    A private pool answers ``inf`` while full because the worker's own release wakes its
    dispatcher. A slot freed by another worker of a fleet sends this one no signal, so a full
    shared pool must be polled instead of waited on for ever. Every shared quota
    (:class:`SharedMultiQuota`, :class:`aiqsim.fleet.RedisQuota`) answers a full pool this way.
    """
    return slot_poll_s if math.isinf(wait) else wait


class SharedMultiQuota(MultiQuota):
    """A :class:`MultiQuota` shared by several schedulers in one process (the in-process RedisQuota).

    The buckets, the concurrency pool and the Retry-After pause are one state for every worker
    holding the object: one worker's reservation is visible to the next, and a 429 seen by one
    worker pauses all of them (as ``RedisQuota.pause_until`` does across hosts).

    The one difference from a private :class:`MultiQuota`: a scheduler waits for a free slot on a
    signal that only its *own* releases fire. A slot freed by another worker sends it nothing, so
    while the pool is full :meth:`time_until` answers ``slot_poll_s`` instead of ``inf``, and the
    waiting dispatcher looks again then — the same polling :class:`aiqsim.fleet.RedisQuota` does.
    """

    def __init__(self, limits: QuotaLimits, *, now: float = 0.0, slot_poll_s: float = DEFAULT_SLOT_POLL_S):
        if isinstance(slot_poll_s, bool) or not (isinstance(slot_poll_s, int | float) and slot_poll_s > 0):
            raise ConfigurationError(f"slot_poll_s: expected a number > 0, got {slot_poll_s!r}")
        if not math.isfinite(slot_poll_s):
            raise ConfigurationError(f"slot_poll_s: expected a finite number, got {slot_poll_s!r}")
        super().__init__(limits, now=now)
        self.slot_poll_s = float(slot_poll_s)

    def time_until(self, tokens: float, now: float) -> float:
        """Seconds until a reservation of ``tokens`` could succeed; ``slot_poll_s`` while all slots
        are busy (another worker may free one without telling this one)."""
        return poll_full_pool(super().time_until(tokens, now), self.slot_poll_s)


def _share(value: float | None, workers: int, floor: float | None = None) -> float | None:
    if value is None:
        return None
    share = value / workers
    return max(share, floor) if floor is not None else share


def split_quota_limits(limits: QuotaLimits, workers: int) -> list[QuotaLimits]:
    """The account's ``limits`` split statically over ``workers`` workers (one entry per worker).

    Rates (requests and tokens per minute) and the token burst are divided by N; the request burst
    too, but at least 1 request (a bucket must hold one request to grant anything). Concurrency is
    divided so the shares add up to the total — the first ``concurrency % N`` workers get one slot
    more — and each worker has at least 1, so with fewer slots than workers the fleet holds N slots
    in all (more than the account allows; the provider's server-side limit still applies).
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigurationError(f"workers: expected an integer >= 1, got {workers!r}")
    if workers == 1:
        return [limits]
    request_burst = limits.request_burst
    if request_burst is None and limits.requests_per_min is not None:
        request_burst = limits.requests_per_min  # the default burst: one minute's worth
    shares = []
    for i in range(workers):
        concurrency = None
        if limits.concurrency is not None:
            base, extra = divmod(limits.concurrency, workers)
            concurrency = max(1, base + (1 if i < extra else 0))
        shares.append(
            QuotaLimits(
                requests_per_min=_share(limits.requests_per_min, workers),
                tokens_per_min=_share(limits.tokens_per_min, workers),
                concurrency=concurrency,
                request_burst=_share(request_burst, workers, floor=1.0),
                token_burst=_share(limits.token_burst, workers),
            )
        )
    return shares


class WorkerCappedQuota:
    """A worker's own concurrency cap on top of a quota it may share with other workers.

    A worker process can hold only so many calls at once (its connection pool, its memory),
    whatever the account would allow: this quota grants a reservation only while the worker holds
    fewer than ``concurrency`` slots *and* the ``inner`` quota (a :class:`SharedMultiQuota`, a
    :class:`aiqsim.fleet.RedisQuota` or a private :class:`MultiQuota`) grants it. Waiting for one of
    its own slots is waiting for its own release, which wakes its dispatcher, so ``time_until`` is
    ``inf`` then, as with a private pool. Everything else (buckets, pause, reconcile) is the inner
    quota's.
    """

    def __init__(self, inner: Any, concurrency: int) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigurationError(f"concurrency: expected an integer >= 1, got {concurrency!r}")
        self.inner = inner
        self.concurrency = concurrency
        self.in_flight = 0
        """Slots this worker holds now."""

    @property
    def tokens(self) -> Any:
        """The inner quota's token bucket (``None`` when it has none, or keeps it elsewhere)."""
        return getattr(self.inner, "tokens", None)

    @property
    def slot_ttl_s(self) -> float | None:
        """The inner quota's slot lease, when its slots are leases (a Redis one; see
        :func:`aiqsim.scheduler.lanes.check_slot_lease`)."""
        return getattr(self.inner, "slot_ttl_s", None)

    @property
    def token_capacity(self) -> float | None:
        """The inner quota's declared token capacity, when it keeps its bucket elsewhere (a Redis one)."""
        return getattr(self.inner, "token_capacity", None)

    @property
    def limits(self) -> Any:
        """The inner quota's limits."""
        return getattr(self.inner, "limits", None)

    def check_cost(self, tokens: float) -> None:
        """Raise now if ``tokens`` could never be reserved (the inner quota decides)."""
        self.inner.check_cost(tokens)

    def try_reserve(self, tokens: float, now: float) -> Reservation | None:
        """One slot of this worker's and a reservation of the inner quota, or nothing."""
        if self.in_flight >= self.concurrency:
            return None
        reservation = self.inner.try_reserve(tokens, now)
        if reservation is not None:
            self.in_flight += reservation.slots
        return reservation

    def can_reserve(self, tokens: float, now: float) -> bool:
        """Whether :meth:`try_reserve` would grant ``tokens`` now (the inner quota answers for itself)."""
        if self.in_flight >= self.concurrency:
            return False
        inner = getattr(self.inner, "can_reserve", None)
        if callable(inner):
            return bool(inner(tokens, now))
        return bool(self.inner.time_until(tokens, now) <= 0.0)

    def trial(self) -> WorkerCappedQuota | None:
        """A private copy to try reservations on (see :meth:`MultiQuota.trial`); ``None`` when the
        inner quota has no private copy (a Redis one: its state is the server's)."""
        make_inner = getattr(self.inner, "trial", None)
        inner = make_inner() if callable(make_inner) else None
        if inner is None:
            return None
        twin = WorkerCappedQuota(inner, self.concurrency)
        twin.in_flight = self.in_flight
        return twin

    def time_until(self, tokens: float, now: float) -> float:
        """``inf`` while this worker's own slots are all taken, else the inner quota's wait."""
        if self.in_flight >= self.concurrency:
            return math.inf
        return self.inner.time_until(tokens, now)

    def release(self, reservation: Reservation, now: float) -> None:
        """Free the slot here and in the inner quota."""
        self.in_flight = max(0, self.in_flight - reservation.slots)
        self.inner.release(reservation, now)

    def cancel(self, reservation: Reservation, now: float) -> None:
        """Undo an unused reservation here and in the inner quota."""
        self.in_flight = max(0, self.in_flight - reservation.slots)
        self.inner.cancel(reservation, now)

    def reconcile(self, reservation: Reservation, actual_tokens: float, now: float) -> float:
        """Settle the token estimate in the inner quota; returns actual - estimate."""
        return self.inner.reconcile(reservation, actual_tokens, now)

    def pause_until(self, until: float) -> None:
        """Pause the inner quota (a 429 pauses everyone who shares it)."""
        self.inner.pause_until(until)

    def levels(self, now: float) -> tuple[float, float, int]:
        """The inner quota's bucket levels, and this worker's slots in use."""
        requests, tokens, _ = self.inner.levels(now)
        return requests, tokens, self.in_flight
