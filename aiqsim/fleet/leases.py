"""Leases: a dead worker's tasks are adopted by a live one, automatically and exactly once.

A worker of a fleet runs a :class:`LeaseKeeper` beside its scheduler. The keeper renews the
worker's lease in the store every ``renew_every_s`` (the lease lasts ``ttl_s`` on the store's
clock, which every host shares) and looks for workers whose lease has expired. An expired
lease is adopted by exactly one live worker (an atomic update in the store), which then
recovers the dead worker's tasks with :meth:`Scheduler.recover(workers=[dead])
<aiqsim.scheduler.Scheduler.recover>`: running orphans are reconciled through the provider's
lookup (no second call, no second bill), queued tasks run here. It is the explicit
``recover(workers=[...])`` takeover, done for you when a heartbeat stops.

The rule that makes this safe is fencing by the lease: a worker that finds its own lease
adopted (it stalled longer than ``ttl_s`` — a long GC pause, a network partition — and was
presumed dead) stops at once (``scheduler.crash()``) and raises :class:`LeaseLostError`, so
two workers never run the same task. A finished adoption stays in the store as a tombstone that
keeps refusing that worker's beats; a new process of the worker id takes a fresh lease at its
start. An adoption cut short (its adopter died, or recovery left orphans undecided) is taken up
again, by the adopter or, once the adopter holds no lease, by another worker. Choose ``ttl_s``
well above the longest stall you expect (several renew periods); a shorter one adopts sooner
after a real crash.

A store that cannot be reached for a while (a database restart, a network cut) misses beats: the
keeper beats again every ``renew_every_s`` (the store makes its connection again), and if the
lease would run out before the next beat can renew it, the keeper stops the scheduler and raises
:class:`LeaseLostError` before another worker may adopt it, as if it had been adopted. A keeper
that stops for any other reason (a failed adoption, a bug) stops its scheduler too: a scheduler
left running without its keeper would lose its lease and run tasks that another worker adopts.

The store must support leases (:class:`aiqsim.stores.PostgresStore` does). The keeper runs on
the scheduler's runtime (no clock of its own).

Starting a worker: ``report = await keeper.recover_and_start()``. It takes the lease *before* it
recovers the worker's own tasks and beats while they are recovered, so there is no moment at which
another worker may adopt the tasks this process is taking up. The two steps called apart in the
other order (``await scheduler.recover()`` then ``keeper.start()``) leave such a moment at every
``await`` between them and inside ``recover()``: an expired lease of the previous process of this
worker id is adopted meanwhile, both processes run its tasks, and a call is billed twice. Called
apart, call ``keeper.start()`` first and ``await scheduler.recover()`` after it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiqsim.core.errors import ConfigurationError, SchedulingError, StoreError
from aiqsim.runtime.protocol import Cancelled, TaskHandle

if TYPE_CHECKING:
    from aiqsim.scheduler.scheduler import RecoveryReport, Scheduler

DEFAULT_TTL_S = 15.0


class LeaseLostError(SchedulingError):
    """This worker's lease was adopted by another worker: it stopped so no task runs twice."""


@dataclass(frozen=True, slots=True)
class Adoption:
    """One dead worker's tasks taken over by this worker, with what recovery found."""

    worker: str
    report: RecoveryReport


_LEASE_METHODS = ("renew_lease", "release_lease", "adopt_expired", "finish_adoption")


class LeaseKeeper:
    """Renews this worker's lease and adopts the tasks of workers whose lease expired.

    Parameters:
        scheduler: a scheduler with a ``worker_id`` and a store that supports leases.
        ttl_s: how long a lease lasts without renewal (store clock, seconds).
        renew_every_s: how often to renew and look for expired leases (default ``ttl_s / 3``).
        requeue_interrupted: passed to ``recover`` for orphans the provider cannot account for.

    Start a worker with ``report = await keeper.recover_and_start()`` (take the lease, start the
    beats, then recover this worker's own tasks; see the module docs for why in that order), and
    ``await keeper.stop()`` on a clean shutdown (which releases the lease, so nobody adopts a worker
    that left on purpose).
    """

    def __init__(
        self,
        scheduler: Scheduler,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        renew_every_s: float | None = None,
        requeue_interrupted: bool = False,
    ) -> None:
        if scheduler.worker_id is None:
            raise ConfigurationError("a LeaseKeeper needs a scheduler with a worker_id")
        store = scheduler.store
        missing = [name for name in _LEASE_METHODS if not callable(getattr(store, name, None))]
        if missing:
            raise ConfigurationError(
                f"{type(store).__name__} does not support leases (lacks {', '.join(missing)}); "
                "use PostgresStore"
            )
        if not (isinstance(ttl_s, int | float) and ttl_s > 0 and math.isfinite(ttl_s)):
            raise ConfigurationError(f"ttl_s must be a positive number of seconds, got {ttl_s!r}")
        renew = ttl_s / 3 if renew_every_s is None else renew_every_s
        if not (isinstance(renew, int | float) and 0 < renew < ttl_s):
            raise ConfigurationError(f"renew_every_s must be > 0 and < ttl_s ({ttl_s}), got {renew!r}")
        self.scheduler = scheduler
        self.store: Any = store
        self.worker = scheduler.worker_id
        self.ttl_s = float(ttl_s)
        self.renew_every_s = float(renew)
        self.requeue_interrupted = requeue_interrupted
        self.adoptions: list[Adoption] = []
        """Every takeover this keeper made, in order."""
        self.missed_beats = 0
        """Beats (renewals or adoptions) that failed because the store could not be reached."""
        self._crashed_scheduler = False
        self._handle: TaskHandle[None] | None = None
        self._adopting = True
        """Whether the beats adopt expired leases (not while :meth:`recover_and_start` recovers)."""

    def beat(self) -> None:
        """Renew the lease now; if it was adopted, stop the scheduler and raise :class:`LeaseLostError`."""
        if not self.store.renew_lease(self.worker, self.ttl_s):
            self._lost()

    def _lost(self) -> None:
        self._crash()
        raise LeaseLostError(
            f"worker {self.worker!r}: its lease was adopted by another worker (it was presumed dead); "
            "this scheduler stopped so that no task runs twice — restart the process (a new process "
            "of the worker takes a fresh lease once the adoption is finished)"
        )

    async def adopt(self) -> list[Adoption]:
        """Take over every worker whose lease expired, recovering its tasks here.

        An adoption is finished only when recovery decided every orphan and left no task for a
        provider this scheduler lacks; otherwise the store keeps it under way, and the next call
        recovers again what is left (``recover()``: "call it again once the provider answers")."""
        taken = []
        for dead in self.store.adopt_expired(self.worker):
            report = await self.scheduler.recover(
                workers=[dead], requeue_interrupted=self.requeue_interrupted, unknown_providers="leave"
            )
            if not report.undecided and not report.left_for_unknown_providers:
                self.store.finish_adoption(dead, self.worker)
            adoption = Adoption(dead, report)
            self.adoptions.append(adoption)
            taken.append(adoption)
        return taken

    async def run(self) -> None:
        """Beat every ``renew_every_s`` until cancelled (or the lease is lost), adopting beside it.

        The beats go on while an adoption's recovery runs (its lookups may take minutes): an
        adopter that stopped beating meanwhile was presumed dead itself. A beat or an adoption that
        fails because the store cannot be reached is tried again at the next beat, unless the lease
        would run out first (see the module docs); if the keeper stops for any reason but
        :meth:`stop`, it stops the scheduler with it."""
        runtime = self.scheduler.runtime
        scale = float(getattr(runtime, "time_scale", 1.0))  # the store's clock runs in wall seconds
        adopting: TaskHandle[list[Adoption]] | None = None
        renewed_at = runtime.now()  # start() has just taken the lease
        slowest_renewal_s = 0.0
        try:
            while True:
                beat_at = runtime.now()
                try:
                    self.beat()
                except StoreError as error:
                    self.missed_beats += 1
                    # The lease runs ttl_s from the last renewal's start. The next beat starts
                    # renew_every_s from now and may take as long as this one did (a connect timeout)
                    # before it renews: stop unless all of that fits before the lease runs out.
                    now = runtime.now()
                    since_s = (now - renewed_at) * scale
                    beat_s = max((now - beat_at) * scale, slowest_renewal_s)
                    if since_s + self.renew_every_s + beat_s >= self.ttl_s:
                        self._out_of_reach(error, since_s)
                else:
                    renewed_at = beat_at
                    slowest_renewal_s = max(slowest_renewal_s, (runtime.now() - beat_at) * scale)
                if self._adopting and (adopting is None or adopting.done()):
                    if adopting is not None:
                        adopting.result()  # an adoption that failed (not for the store) stops the keeper
                    adopting = runtime.spawn(self._adopt_between_beats(), name=f"adopt-{self.worker}")
                await runtime.sleep(self.renew_every_s / scale)
        except (Cancelled, LeaseLostError):
            raise  # stop() releases the lease; a lost lease has stopped the scheduler already
        except BaseException:
            self._crash()  # never a scheduler running on a lease nobody renews
            raise
        finally:
            if adopting is not None and not adopting.done():
                adopting.cancel()

    async def _adopt_between_beats(self) -> list[Adoption]:
        """:meth:`adopt`, with a store that cannot be reached counted as a missed beat: the next beat
        starts the adoption again (an adoption cut short is taken up again, see :meth:`adopt`)."""
        try:
            return await self.adopt()
        except StoreError:
            self.missed_beats += 1
            return []

    def _crash(self) -> None:
        """Stop the scheduler as a dead worker stops; its lease is then left to run out (not released
        by :meth:`stop`), so that another worker adopts what it left running."""
        self._crashed_scheduler = True
        self.scheduler.crash()

    def _out_of_reach(self, error: StoreError, since_s: float) -> None:
        """The store could not be reached to renew the lease, which may run out before the next beat
        can renew it: stop as a worker whose lease was adopted stops, before anyone may adopt it."""
        self._crash()
        raise LeaseLostError(
            f"worker {self.worker!r}: its lease could not be renewed for {since_s:.3g} s of its "
            f"ttl_s={self.ttl_s:g} (the store could not be reached: {error}); this scheduler stopped "
            "before the lease ran out, so that no task runs twice when another worker adopts its "
            "tasks — restart the process once the store is back"
        ) from error

    def start(self) -> TaskHandle[None]:
        """Take the lease (:meth:`acquire_lease <aiqsim.stores.PostgresStore.acquire_lease>`) and start
        :meth:`run` on the scheduler's runtime. Raises :class:`LeaseLostError` while another worker
        is still taking over this worker id's tasks.

        Prefer :meth:`recover_and_start`. Called on its own, call it *before*
        ``await scheduler.recover()``, never after: until it returns, the previous process's
        expired lease may be adopted by another worker, which then runs the very tasks this
        process recovered (the module docs)."""
        acquire = getattr(self.store, "acquire_lease", self.store.renew_lease)
        if not acquire(self.worker, self.ttl_s):
            self._lost()
        self._handle = self.scheduler.runtime.spawn(self.run(), name=f"lease-{self.worker}")
        return self._handle

    async def recover_and_start(self, **recover_options: Any) -> RecoveryReport:
        """Start this worker: take its lease, start the beats, recover its own tasks; the report.

        The one right way to start a fleet worker. The lease is taken first, in the same step as
        the beats start (no ``await`` between them), so from the moment this process holds the
        lease until recovery is over no other worker can adopt this worker id's tasks; the lease is
        renewed while recovery runs (its provider lookups may take a while). This keeper adopts
        other workers' expired leases only once its own recovery is done.

        ``recover_options`` go to :meth:`Scheduler.recover <aiqsim.scheduler.Scheduler.recover>`
        (``requeue_interrupted`` defaults to the keeper's). Raises :class:`LeaseLostError`, having
        recovered nothing, while another worker is still taking over this worker id's tasks
        (restart later). If recovery raises, the keeper stops the scheduler as a dead worker stops
        (:meth:`stop` then leaves the lease to run out, and another worker adopts what is left)
        and the error is raised.
        """
        recover_options.setdefault("requeue_interrupted", self.requeue_interrupted)
        self._adopting = False
        self.start()  # the lease, then the beats: both before anything is recovered
        try:
            report = await self.scheduler.recover(**recover_options)
        except BaseException:
            if self._handle is not None:
                self._handle.cancel()
            self._crash()
            raise
        self._adopting = True
        return report

    async def stop(self) -> None:
        """Stop renewing and release the lease (a clean shutdown leaves nothing to adopt).

        After the scheduler stopped as a dead worker (its lease lost or out of reach, or
        ``scheduler.crash()``), the lease is not released but left to run out: another worker must
        adopt what it left running (review: releasing it stranded those tasks for good)."""
        if self._handle is not None:
            self._handle.cancel()
            try:
                await self._handle
            except (Cancelled, LeaseLostError):
                pass
            self._handle = None
        if not (self._crashed_scheduler or self.scheduler._crashed):
            self.store.release_lease(self.worker)
