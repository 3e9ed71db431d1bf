"""Dispatch policies: which queued task of a priority class starts next.

A policy builds the queue structure it needs. The scheduler peeks the policy's choice,
starts it if the provider's quota can cover it now, and otherwise waits (it never skips
the choice, which is what makes FIFO block behind a large task and SJF not).
"""

from __future__ import annotations

import numbers
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from heapq import (  # names, not heapq.x: one lookup fewer per call in the hot path
    heapify,
    heappop,
    heappush,
)
from math import inf  # names, not math.x: one lookup fewer per call in the hot path
from typing import Protocol

from aiqsim.core.slot_init import compile_builder
from aiqsim.scheduler.arguments import SchedulerArgumentError, SchedulerArgumentTypeError


@dataclass(slots=True, eq=False)
class QueueItem:
    """A task waiting in a dispatch queue."""

    task_id: str
    cost: float
    enqueued_at: float
    seq: int
    removed: bool = False
    tenant: str | None = None
    """The task's tenant (:mod:`aiqsim.scheduler.tenants`); read only by tenant-sharing queues."""


new_queue_item: Callable[..., QueueItem] = compile_builder(QueueItem)
"""``QueueItem(...)`` without the cost of a class call (one per queued task)."""


class TaskQueue(Protocol):
    """One priority class's waiting tasks, ordered by a policy. Removal is lazy."""

    def push(self, item: QueueItem) -> None: ...
    def peek(self, now: float) -> QueueItem | None: ...
    def pop(self, item: QueueItem) -> None: ...
    def __len__(self) -> int: ...
    def ordered(self, now: float) -> Iterator[QueueItem]:
        """The waiting items in the order ``peek``/``pop`` at ``now`` would take them, without
        taking any (the depth limit asks which would start in this instant). Optional: a queue
        without it is treated as showing only its head."""
        ...

    def next_change(self, now: float) -> float:
        """Virtual time at which ``peek`` may change without a push/pop (aging), else ``inf``."""
        ...


class DispatchPolicy(Protocol):
    """A named factory of task queues."""

    name: str

    def new_queue(self) -> TaskQueue: ...


def _first_live(items: deque[QueueItem]) -> QueueItem | None:
    """The first item of ``items`` not removed yet; removed items at the front are dropped now."""
    while items and items[0].removed:
        items.popleft()
    return items[0] if items else None


_COMPACT_SLACK = 64
"""Removals (beyond one per live item) after which a queue sheds the removed items it still holds."""


class _LazyQueue:
    """What every queue shares: lazy removal. ``pop`` only marks the item removed and counts it
    out; each queue drops marked items when they reach its front (no search through the queue).

    An item removed far from the front may never reach it (an expensive one under SJF while cheaper
    work keeps arriving, or the depth limit's probes), so once the removals since the last clean-up
    outnumber the live items (plus a slack), the queue rebuilds itself from its live items: the
    memory held stays within about twice the live items, at an amortised O(1) per removal. The
    order is by each item's own key, so a rebuild changes nothing a ``peek`` returns."""

    __slots__ = ("_removals", "_size")

    def __init__(self) -> None:
        self._size = 0
        self._removals = 0

    def pop(self, item: QueueItem) -> None:
        if not item.removed:
            item.removed = True
            size = self._size = self._size - 1
            removals = self._removals = self._removals + 1
            if removals > size + _COMPACT_SLACK:
                self._removals = 0
                self._compact()

    def _compact(self) -> None:
        """Drop every removed item still held (new containers: a suspended ``ordered`` is unharmed)."""
        raise NotImplementedError

    def __len__(self) -> int:
        return self._size


class _FifoQueue(_LazyQueue):
    __slots__ = ("_items",)

    def __init__(self) -> None:
        super().__init__()
        self._items: deque[QueueItem] = deque()

    def push(self, item: QueueItem) -> None:
        self._items.append(item)
        self._size += 1

    def peek(self, now: float) -> QueueItem | None:
        items = self._items  # _first_live, inlined: every dispatch reads the head of every FIFO queue
        while items and items[0].removed:
            items.popleft()
        return items[0] if items else None

    def ordered(self, now: float) -> Iterator[QueueItem]:
        return (item for item in self._items if not item.removed)

    def _compact(self) -> None:
        self._items = deque(item for item in self._items if not item.removed)

    def next_change(self, now: float) -> float:
        return inf


class _CostHeapQueue(_LazyQueue):
    """Smallest cost first; ties by arrival. Optionally the oldest task goes first once it is overdue."""

    __slots__ = ("_arrivals", "_heap", "_max_wait")

    def __init__(self, max_wait_s: float | None) -> None:
        super().__init__()
        self._heap: list[tuple[float, int, QueueItem]] = []
        self._arrivals: deque[QueueItem] = deque()
        self._max_wait = max_wait_s

    def push(self, item: QueueItem) -> None:
        heappush(self._heap, (item.cost, item.seq, item))
        if self._max_wait is not None:
            self._arrivals.append(item)
        self._size += 1

    def _compact(self) -> None:
        heap = [entry for entry in self._heap if not entry[2].removed]
        heapify(heap)
        self._heap = heap
        self._arrivals = deque(item for item in self._arrivals if not item.removed)

    def _oldest(self) -> QueueItem | None:
        return _first_live(self._arrivals)

    def peek(self, now: float) -> QueueItem | None:
        if self._max_wait is not None:
            oldest = self._oldest()
            if oldest is not None and now - oldest.enqueued_at >= self._max_wait:
                return oldest
        heap = self._heap
        while heap and heap[0][2].removed:
            heappop(heap)
        return heap[0][2] if heap else None

    def ordered(self, now: float) -> Iterator[QueueItem]:
        # the overdue items oldest first (as long as the oldest waiting one is overdue), then the
        # rest by (cost, arrival): the heap walked smallest first through a frontier of its
        # nodes, so taking k items costs O(k log k) and the heap itself is not touched
        taken: set[int] = set()
        if self._max_wait is not None:
            for item in self._arrivals:
                if item.removed:
                    continue
                if now - item.enqueued_at < self._max_wait:
                    break
                taken.add(item.seq)
                yield item
        heap = self._heap
        frontier = [(heap[0][0], heap[0][1], 0)] if heap else []
        while frontier:
            _, _, index = heappop(frontier)
            item = heap[index][2]
            if not item.removed and item.seq not in taken:
                yield item
            for child in (2 * index + 1, 2 * index + 2):
                if child < len(heap):
                    cost, seq, _ = heap[child]
                    heappush(frontier, (cost, seq, child))

    def next_change(self, now: float) -> float:
        if self._max_wait is None:
            return inf
        oldest = self._oldest()
        if oldest is None:
            return inf
        due = oldest.enqueued_at + self._max_wait
        return due if due > now else inf


@dataclass(frozen=True, slots=True)
class FifoPolicy:
    """First come, first served: the head waits for its quota even if smaller tasks could go."""

    name: str = "fifo"

    def new_queue(self) -> TaskQueue:
        return _FifoQueue()


@dataclass(frozen=True, slots=True)
class ShortestJobFirstPolicy:
    """Quota-aware shortest job first: the cheapest queued task starts whenever quota covers it,
    so one 100k-token job does not hold thirty small ones behind it (but may itself starve)."""

    name: str = "sjf"

    def new_queue(self) -> TaskQueue:
        return _CostHeapQueue(None)


@dataclass(frozen=True, slots=True)
class AgingShortestJobFirstPolicy:
    """SJF, except that a task waiting ``max_wait_s`` or longer goes next (oldest first), and the
    quota accumulates for it: a large task's wait is bounded by ``max_wait_s`` plus its refill time."""

    max_wait_s: float = 30.0
    name: str = "sjf_aging"

    def __post_init__(self) -> None:
        message = (
            f"max_wait_s must be a number of seconds >= 0 (how long a task may wait before it goes next), "
            f"got {self.max_wait_s!r}; no policy was built"
        )
        if isinstance(self.max_wait_s, bool) or not isinstance(self.max_wait_s, numbers.Real):
            raise SchedulerArgumentTypeError(message)
        if not self.max_wait_s >= 0:
            raise SchedulerArgumentError(message)

    def new_queue(self) -> TaskQueue:
        return _CostHeapQueue(self.max_wait_s)


DISPATCH_POLICIES = ("fifo", "sjf", "sjf_aging")
"""Policy names accepted by :func:`dispatch_policy_from_name` and scenario files."""


def dispatch_policy_from_name(name: str, *, max_wait_s: float = 30.0) -> DispatchPolicy:
    """Build a policy from its scenario-file name."""
    if name == "fifo":
        return FifoPolicy()
    if name == "sjf":
        return ShortestJobFirstPolicy()
    if name == "sjf_aging":
        return AgingShortestJobFirstPolicy(max_wait_s=max_wait_s)
    raise SchedulerArgumentError(
        f"name: unknown dispatch policy {name!r}; expected one of {list(DISPATCH_POLICIES)}. "
        "No policy was built"
    )
