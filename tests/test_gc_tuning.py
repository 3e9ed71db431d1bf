"""relaxed_gc: the collector settings a simulation run uses are restored afterwards, whatever happens."""

from __future__ import annotations

import gc

import pytest

from aiqsim.runtime.gc_tuning import RUN_GEN0_THRESHOLD, relaxed_gc


def test_raises_the_threshold_and_freezes_during_the_block_then_restores() -> None:
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    with relaxed_gc():
        assert gc.get_threshold() == (RUN_GEN0_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_restores_when_the_block_raises_and_is_reentrant() -> None:
    before = gc.get_threshold()
    with pytest.raises(ZeroDivisionError), relaxed_gc(), relaxed_gc(1234):
        assert gc.get_threshold()[0] == RUN_GEN0_THRESHOLD  # the inner block changed nothing
        1 / 0  # noqa: B018
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_leaves_a_callers_own_freeze_alone() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        # Frozen objects still die by reference counting, so the count may only fall: relaxed_gc must
        # neither freeze more (a rise) nor unfreeze the caller's (a drop to zero).
        with relaxed_gc():
            assert 0 < gc.get_freeze_count() <= frozen
        assert 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


def test_simulate_restores_the_collector_settings(tmp_path) -> None:
    from aiqsim.sim import simulate

    before = gc.get_threshold()
    result = simulate("scenarios/sjf_vs_fifo.toml", seed=1)
    assert result.summary["tasks_submitted"] > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_what_the_run_kept_leaves_as_long_lived_and_its_cycles_are_still_freed() -> None:
    """On the way out, the objects made in the block are not left in the young generation (whose
    next collection, at the default threshold, would scan them all: 37 ms after one simulation run),
    and a reference cycle made in the block is still collected by a full collection."""
    gc.collect()
    with relaxed_gc():
        kept = [{"n": i} for i in range(20_000)]
        cycle = _Node()
        cycle.other = _Node()
        cycle.other.other = cycle
        del cycle
    young = gc.get_count()[0]
    assert young < 1_000, young  # not the 20,000 dicts
    assert gc.get_freeze_count() == 0
    assert any(obj is kept for obj in gc.get_objects(generation=2))
    assert gc.collect() >= 2  # the two nodes of the cycle
    assert len(kept) == 20_000
