"""relaxed_gc: the collector settings a simulation run uses are restored afterwards, whatever happens."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from aiqsim.runtime.gc_tuning import RUN_GEN0_THRESHOLD, relaxed_gc
from tests.cyclic_garbage import cyclic_garbage


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


def test_repeated_runs_leave_the_oldest_generation_flat() -> None:
    """A sweep runs simulate() many times in one process. Cyclic garbage a run leaves (a failed call's
    traceback holds the future that holds the error) must be freed by the usual young collections:
    moving what a run kept straight to the oldest generation (tried once, to skip one collection at
    the end of a run) grew it by ~36k objects per run of provider_outage, as no full collection came."""
    from aiqsim.sim import simulate

    def oldest() -> int:
        return len(gc.get_objects(generation=2))

    simulate("scenarios/provider_outage.toml", seed=0)
    simulate("scenarios/provider_outage.toml", seed=1)
    settled = oldest()
    for seed in (2, 3, 4):
        simulate("scenarios/provider_outage.toml", seed=seed)
    assert oldest() - settled < 10_000, (settled, oldest())


def test_failed_calls_leave_no_garbage_for_the_cycle_collector() -> None:
    # provider_outage fails ~1,000 calls with 503s and retries them. Each failure's traceback used to
    # hold frames that held the failure (a cycle of ~34 objects per failed call, freed only by the
    # collector); they must now be freed by reference counting as soon as the task is done with them.
    from aiqsim.core.failures import ProviderError
    from aiqsim.sim import simulate

    scenario = Path(__file__).resolve().parent.parent / "scenarios" / "provider_outage.toml"
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        result = simulate(scenario, seed=0)
        assert (result.calls["outcome"] == "outage").sum() > 100  # the failures did happen
        del result
        gc.collect()
        errors = [obj for obj in gc.garbage if isinstance(obj, ProviderError)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()
    assert errors == []


def test_cut_streams_leave_no_failure_for_the_cycle_collector() -> None:
    # streaming_ttft cuts ~5% of its streams after their first chunk and ends a few long ones at the
    # 30 s attempt deadline. The cut is kept for the stream's reader (its channel) and its traceback
    # held the attempt's frames, which held the channel; the simulated provider's stream frame held
    # the future holding the failure: cycles per cut stream, freed only by the collector.
    from aiqsim.sim import simulate

    scenario = Path(__file__).resolve().parent.parent / "scenarios" / "streaming_ttft.toml"

    def run() -> tuple[int, int]:
        result = simulate(scenario, seed=0)
        return int((result.calls["outcome"] == "stream_cut").sum()), int(result.summary["tasks_failed"])

    (cuts, failed), kept = cyclic_garbage(run, BaseException)
    assert cuts >= 10 and failed >= 10  # the cuts did happen
    assert kept == []
