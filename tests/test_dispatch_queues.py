"""The dispatch queues against a plain model: random pushes, pops and peeks, seeded so a failure replays.

Each queue removes lazily (``pop`` marks, the front is cleaned on ``peek``); the model keeps a
plain list of live items and picks by the policy's rule directly, so any bookkeeping slip
(a count off by one, a removed item served, a wrong order) shows as a difference.
"""

from __future__ import annotations

import random

import pytest

from aiqsim.scheduler.dispatch import (
    AgingShortestJobFirstPolicy,
    FifoPolicy,
    QueueItem,
    ShortestJobFirstPolicy,
)

POLICIES = [FifoPolicy(), ShortestJobFirstPolicy(), AgingShortestJobFirstPolicy(max_wait_s=5.0)]


def _model_choice(policy: object, live: list[QueueItem], now: float) -> QueueItem | None:
    if not live:
        return None
    if isinstance(policy, FifoPolicy):
        return min(live, key=lambda item: item.seq)
    if isinstance(policy, AgingShortestJobFirstPolicy):
        oldest = min(live, key=lambda item: item.seq)
        if now - oldest.enqueued_at >= policy.max_wait_s:
            return oldest
    return min(live, key=lambda item: (item.cost, item.seq))


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
@pytest.mark.parametrize("seed", range(5))
def test_a_queue_serves_what_its_rule_picks_and_counts_only_live_items(policy: object, seed: int) -> None:
    rng = random.Random(seed)
    queue = policy.new_queue()  # type: ignore[attr-defined]
    live: list[QueueItem] = []
    now = 0.0
    for seq in range(400):
        now += rng.expovariate(1.0)
        action = rng.random()
        if action < 0.5 or not live:
            item = QueueItem(f"t{seq}", float(rng.randint(1, 20)), now, seq)
            queue.push(item)
            live.append(item)
        elif action < 0.75:  # the dispatcher starts what it peeked
            chosen = queue.peek(now)
            assert chosen is _model_choice(policy, live, now)
            queue.pop(chosen)
            live.remove(chosen)
        else:  # a cancel removes any waiting item, twice to check pop is idempotent
            victim = rng.choice(live)
            queue.pop(victim)
            queue.pop(victim)
            live.remove(victim)
        assert len(queue) == len(live)
        assert queue.peek(now) is _model_choice(policy, live, now)


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
@pytest.mark.parametrize("seed", range(5))
def test_ordered_lists_what_repeated_peek_and_pop_would_serve_and_touches_nothing(
    policy: object, seed: int
) -> None:
    # the depth limit's trial dispatch walks ``ordered`` instead of popping: it must be the same
    # sequence as the dispatcher's peek/pop at that instant, and leave the queue as it was
    rng = random.Random(seed)
    queue = policy.new_queue()  # type: ignore[attr-defined]
    live: list[QueueItem] = []
    now = 0.0
    for seq in range(300):
        now += rng.expovariate(2.0)
        if rng.random() < 0.7 or not live:
            item = QueueItem(f"t{seq}", float(rng.randint(1, 6)), now, seq)  # many equal costs
            queue.push(item)
            live.append(item)
        else:
            victim = rng.choice(live)
            queue.pop(victim)
            live.remove(victim)
        if seq % 25:
            continue
        at = now + rng.choice([0.0, 2.0, 6.0])  # before, around and after items become overdue
        listed = list(queue.ordered(at))
        assert len(queue) == len(live) and queue.peek(at) is _model_choice(policy, live, at)
        served, remaining = [], list(live)
        while remaining:
            chosen = _model_choice(policy, remaining, at)
            served.append(chosen)
            remaining.remove(chosen)
        assert listed == served


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_items_removed_far_from_the_front_do_not_accumulate(policy: object) -> None:
    # under SJF an expensive item behind a steady stream of cheap ones never reaches the front:
    # lazy removal alone kept every removed one (refused probes, cancellations) for ever
    queue = policy.new_queue()  # type: ignore[attr-defined]
    head = QueueItem("head", 1.0, 0.0, 0)
    queue.push(head)
    for seq in range(1, 20_001):
        item = QueueItem(f"t{seq}", 100.0, 0.0, seq)
        queue.push(item)
        queue.pop(item)
    held = queue._items if isinstance(policy, FifoPolicy) else queue._heap  # type: ignore[attr-defined]
    assert len(queue) == 1 and len(held) <= 2 * 64
    assert queue.peek(0.0) is head and list(queue.ordered(0.0)) == [head]
