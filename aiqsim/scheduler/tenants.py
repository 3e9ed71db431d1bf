"""Tenants: the customers one account serves, sharing each lane by weighted fair queuing.

``Scheduler(..., tenants={"acme": Tenant(weight=1), "globex": Tenant(weight=3)})`` and
``submit(..., tenant="acme")``. Within each priority class (interactive still goes before
background, retries before new work) a lane's queue is a :class:`TenantQueue`: one queue per
tenant, built by the dispatch policy (so the order *within* a tenant stays FIFO, SJF or aging
SJF), and between tenants the one with the smallest *pass* goes next (stride scheduling, a
virtual-time form of weighted fair queuing):

- a task that starts charges its tenant ``max(cost_estimate, 1) / weight``: service is shared by
  cost estimate (tokens, when the quota counts tokens), each call counting at least one unit, so
  calls without an estimate share by request;
- a tenant whose queue was empty rejoins at the current virtual time (the pass of the last task
  started), never below: time spent idle earns no credit to burst with later.

So backlogged tenants receive service in proportion to their weights (1:3 gives 25% / 75%), and a
tenant offering ten times its share only lengthens its own queue: a quiet tenant's task goes at the
next dispatch after it arrives (it rejoins at the virtual time, the noisy tenant's pass is at or
beyond it), whatever the noisy tenant has queued.

Decisions, documented here once:

- ``tenant=None`` (or no ``tenant=``) in a scheduler with tenants is the *default tenant*
  (:data:`DEFAULT_TENANT`, weight 1, no depth limit of its own); a tenant name the scheduler was
  not given is refused (a :class:`~aiqsim.scheduler.arguments.SchedulerArgumentError`, a
  ``ConfigurationError``) before anything is stored; so is any ``tenant=`` in a scheduler without
  tenants. A *recovered* task of a tenant this process lacks is queued as the default tenant's
  (its record keeps its tenant).
- ``max_queued`` bounds the tasks of that tenant waiting in dispatch queues (all lanes, both
  classes); past it, ``submit`` raises :class:`~aiqsim.scheduler.refusals.QueueFullError` naming
  the tenant. A duplicate of a live task queues nothing and is not refused. The classes' own
  limits (``interactive_limit``...) still apply, their trial dispatch placing the request in its
  tenant's queue (:mod:`aiqsim.scheduler.depth_limit`).
- A duplicate (a second submission of a live task's idempotency key) shares the owner's run,
  whichever tenant submitted it: the run stays the owner's tenant's, and so does its service.
- A job's stage tasks (fallbacks too) are its tenant's: ``submit_job(tenant=...)``. A recovered
  job of a tenant this process lacks runs its next stages as the default tenant's (records keep it).
- A queued task cancelled while it is the head its lane's dispatcher last looked at is charged to
  its tenant as if it started (the queue cannot tell the two apart); the error is one task's share.
- Without ``tenants`` the lanes use the policy's queues as they are: nothing here runs.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from heapq import heappop, heappush, heapreplace
from math import inf, isfinite
from typing import Any

from aiqsim.scheduler.arguments import SchedulerArgumentError, SchedulerArgumentTypeError
from aiqsim.scheduler.dispatch import DispatchPolicy, QueueItem, TaskQueue

__all__ = ["DEFAULT_TENANT", "Tenant", "TenantQueue", "checked_tenants", "tenant_charge"]

DEFAULT_TENANT = None
"""The tenant of a task submitted without ``tenant=`` to a scheduler with tenants (weight 1)."""


@dataclass(frozen=True, slots=True)
class Tenant:
    """One tenant's share of each lane: ``weight`` (> 0, relative to the other tenants') and
    ``max_queued`` (``None``: unbounded; else the tasks it may have waiting, a whole number >= 0)."""

    weight: float = 1.0
    max_queued: int | None = None

    def __post_init__(self) -> None:
        problem = tenant_problem(self)
        if problem is not None:
            key, message, wrong_type = problem
            error = SchedulerArgumentTypeError if wrong_type else SchedulerArgumentError
            raise error(f"{key}: {message}; no tenant was built")


def tenant_problem(tenant: Any) -> tuple[str, str, bool] | None:
    """What is wrong with ``tenant``'s fields: ``(key, message, wrong type)``, or ``None``."""
    weight = tenant.weight
    if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
        return "weight", f"expected a number > 0 (its share relative to the others), got {weight!r}", True
    if not (isfinite(weight) and weight > 0):
        return (
            "weight",
            f"expected a finite number > 0 (its share relative to the others), got {weight!r}",
            False,
        )
    limit = tenant.max_queued
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, numbers.Integral):
            return "max_queued", f"expected None or a whole number >= 0, got {limit!r}", True
        if limit < 0:
            return "max_queued", f"expected None or a whole number >= 0, got {limit!r}", False
    return None


def checked_tenants(tenants: Any, refused: str = "no scheduler was created") -> dict[str, Tenant] | None:
    """``tenants`` as a dict name -> :class:`Tenant` (``None`` when not given or empty), or a
    :class:`~aiqsim.scheduler.arguments.SchedulerArgumentError` naming the key that is wrong."""
    if tenants is None:
        return None
    if not isinstance(tenants, Mapping):
        raise SchedulerArgumentTypeError(
            "tenants: expected a mapping tenant name -> Tenant(weight=..., max_queued=...), "
            f"got {tenants!r}; {refused}"
        )
    checked: dict[str, Tenant] = {}
    for name, tenant in tenants.items():
        if type(name) is not str or not name:
            raise SchedulerArgumentTypeError(
                f"tenants: a tenant's name must be a non-empty string, got {name!r}; {refused}"
            )
        if not isinstance(tenant, Tenant):
            raise SchedulerArgumentTypeError(
                f"tenants[{name!r}]: expected Tenant(weight=..., max_queued=...), got {tenant!r}; {refused}"
            )
        checked[name] = tenant
    return checked or None


def tenant_charge(cost: float, weight: float) -> float:
    """What starting a task of ``cost`` adds to its tenant's pass: ``max(cost, 1) / weight``."""
    return (cost if cost > 1.0 else 1.0) / weight


class _Share:
    """One tenant's queue within a :class:`TenantQueue`, its weight and its pass."""

    __slots__ = ("in_line", "order", "pass_", "queue", "weight")

    def __init__(self, queue: TaskQueue, weight: float, order: int) -> None:
        self.queue = queue
        self.weight = weight
        self.order = order
        self.pass_ = 0.0
        self.in_line = False
        """Whether it has a live entry in the queue's line (it has, or may have, queued items)."""

    def __lt__(self, other: _Share) -> bool:  # two entries of one share with one pass: either will do
        return False


class TenantQueue:
    """One priority class's waiting tasks on a lane, shared among tenants by weight.

    A :class:`~aiqsim.scheduler.dispatch.TaskQueue`: ``peek`` returns the head (by the dispatch
    policy) of the tenant with the smallest pass (ties: the order the tenants were given in, the
    default tenant last); ``pop`` of that head charges its tenant (:func:`tenant_charge`).
    """

    __slots__ = ("_head", "_line", "_shares", "_size", "_virtual")

    def __init__(self, policy: DispatchPolicy, tenants: Mapping[str, Tenant]) -> None:
        self._shares: dict[str | None, _Share] = {
            name: _Share(policy.new_queue(), tenant.weight, order)
            for order, (name, tenant) in enumerate(tenants.items())
        }
        self._shares[DEFAULT_TENANT] = _Share(policy.new_queue(), 1.0, len(tenants))
        self._line: list[tuple[float, int, _Share]] = []
        """``(pass, order, share)`` of the tenants with queued work; an entry whose pass is no
        longer its share's (or whose share left the line) is stale and dropped when it surfaces."""
        self._virtual = 0.0
        """The virtual time: the pass of the last task started (a rejoining tenant starts there)."""
        self._head: tuple[QueueItem, _Share] | None = None
        self._size = 0

    def _share(self, tenant: str | None) -> _Share:
        share = self._shares.get(tenant)
        return share if share is not None else self._shares[DEFAULT_TENANT]

    def push(self, item: QueueItem) -> None:
        share = self._shares.get(item.tenant)  # _share, inlined: once per queued task
        if share is None:
            share = self._shares[DEFAULT_TENANT]
        share.queue.push(item)
        self._size += 1
        if not share.in_line:
            share.in_line = True
            if share.pass_ < self._virtual:
                share.pass_ = self._virtual  # idle time earns no credit
            heappush(self._line, (share.pass_, share.order, share))

    def peek(self, now: float) -> QueueItem | None:
        line = self._line
        while line:
            pass_, _, share = line[0]
            if not share.in_line or pass_ != share.pass_:
                heappop(line)  # stale
                continue
            item = share.queue.peek(now)
            if item is None:
                heappop(line)
                share.in_line = False
                continue
            self._head = (item, share)
            return item
        self._head = None
        return None

    def pop(self, item: QueueItem) -> None:
        if item.removed:
            return
        head = self._head
        if head is not None and head[0] is item:
            share = head[1]
            self._head = None
            virtual = self._virtual = share.pass_
            cost = item.cost  # tenant_charge, inlined: once per start
            share.pass_ = new_pass = virtual + (cost if cost > 1.0 else 1.0) / share.weight
            share.queue.pop(item)
            line = self._line
            top = line[0] if line else None
            on_top = top is not None and top[2] is share and top[0] == virtual  # the usual case
            if len(share.queue):
                if on_top:
                    heapreplace(line, (new_pass, share.order, share))
                else:
                    heappush(line, (new_pass, share.order, share))  # the old entry is stale now
            else:
                share.in_line = False  # it rejoins at the virtual time when work comes back
                if on_top:
                    heappop(line)
        else:
            share = self._share(item.tenant)
            share.queue.pop(item)
            if not len(share.queue):  # cancelled, or a depth-limit probe taken out: its last item
                share.in_line = False
        self._size -= 1

    def __len__(self) -> int:
        return self._size

    def queued(self, tenant: str | None) -> int:
        """How many tasks of ``tenant`` wait in this queue."""
        share = self._shares.get(tenant)
        return 0 if share is None else len(share.queue)

    def ordered(self, now: float) -> Iterator[QueueItem]:
        """The items in the order successive ``peek``/``pop`` pairs at ``now`` would take them
        (the passes advanced on a copy; nothing is taken)."""
        line: list[tuple[float, int, Iterator[QueueItem], QueueItem, float]] = []
        for share in self._shares.values():
            if not len(share.queue):
                continue
            items = _ordered(share.queue, now)
            first = next(items, None)
            if first is not None:
                start = share.pass_ if share.in_line else max(share.pass_, self._virtual)
                heappush(line, (start, share.order, items, first, share.weight))
        while line:
            pass_, order, items, item, weight = heappop(line)
            yield item
            following = next(items, None)
            if following is not None:
                heappush(line, (pass_ + tenant_charge(item.cost, weight), order, items, following, weight))

    def next_change(self, now: float) -> float:
        """When ``peek`` may change without a push or pop: when the chosen tenant's own head may
        (aging). Which tenant is chosen depends on the passes only, which time does not move."""
        self.peek(now)
        head = self._head
        return inf if head is None else head[1].queue.next_change(now)


def _ordered(queue: TaskQueue, now: float) -> Iterator[QueueItem]:
    ordered = getattr(queue, "ordered", None)
    if callable(ordered):
        return iter(ordered(now))
    head = queue.peek(now)
    return iter(() if head is None else (head,))
