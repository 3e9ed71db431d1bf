"""aiqsim.testing: the invariant checks, the crash driver, the SIGKILL helper and the pytest plugin.

Everything runs the real parts: the real scheduler on the SimPy clock, real SQLite and JSON
files, real pytest subprocesses (the plugin loaded through its entry point, in a project with no
conftest), a real worker process killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from aiqsim.core.job import JobRecord
from aiqsim.core.states import transition
from aiqsim.core.task import TaskRecord, TaskStatus
from aiqsim.scheduler.jobs import JobSpec, Stage
from aiqsim.sim.scenario import ScenarioError
from aiqsim.testing import (
    CrashCase,
    CrashDriver,
    CrashOptions,
    InvariantViolation,
    KitOptionError,
    Life,
    ScenarioFailedError,
    StoreFactory,
    WorkerFailedError,
    check_all_terminal,
    check_at_most_once,
    check_finished_work_not_rerun,
    check_job_stages_billed_once,
    check_jobs_not_rebilled,
    check_none_lost,
    check_success_has_result,
    kill_and_restart,
    provider_config,
    select_crash_points,
    select_second_crashes,
)
from aiqsim.testing.options import parse_crash_points, parse_replay, parse_second_crashes, parse_seeds

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "test_my_pipeline.py"
WORKER = Path(__file__).with_name("helpers_store_worker.py")


def record(task_id: str, status: TaskStatus, *, key: str | None = None, result: Any = "r") -> TaskRecord:
    """A task record walked to ``status`` through the legal transitions."""
    rec = TaskRecord(id=task_id, key=key or f"key-{task_id}", kind="llm", provider="llm")
    path = {
        TaskStatus.QUEUED: [],
        TaskStatus.RUNNING: [TaskStatus.RUNNING],
        TaskStatus.SUCCEEDED: [TaskStatus.RUNNING, TaskStatus.SUCCEEDED],
        TaskStatus.FAILED: [TaskStatus.RUNNING, TaskStatus.FAILED],
    }[status]
    for step in path:
        rec = transition(rec, step, 1.0, **({"result": result} if step is TaskStatus.SUCCEEDED else {}))
    return rec


# ------------------------------------------------------------------------------- invariants
def test_check_all_terminal_names_the_stranded_task_and_job() -> None:
    check_all_terminal([record("a", TaskStatus.SUCCEEDED), record("b", TaskStatus.FAILED)])
    job = JobRecord(id="j1", key="jk", name="edit", version="1")
    with pytest.raises(InvariantViolation, match=r"task 'b' \(key 'key-b'\) is still running") as caught:
        check_all_terminal([record("a", TaskStatus.SUCCEEDED), record("b", TaskStatus.RUNNING)], [job])
    assert "job 'j1' (edit) is still queued" in str(caught.value)
    assert caught.value.offenders == ("b", "j1")
    assert isinstance(caught.value, AssertionError)


def test_check_none_lost_names_what_the_store_does_not_have() -> None:
    check_none_lost(["a"], [record("a", TaskStatus.SUCCEEDED)])
    with pytest.raises(InvariantViolation, match="task 'z' was submitted but is not in the store") as caught:
        check_none_lost(["a", "z"], [record("a", TaskStatus.SUCCEEDED)], submitted_jobs=["j9"])
    assert "job 'j9'" in str(caught.value)
    assert caught.value.rule == "none lost"


def test_check_success_has_result() -> None:
    check_success_has_result([record("a", TaskStatus.SUCCEEDED)])
    # a duplicate of a failed owner shares its failure: deduped with an error and no result is fine
    shared_failure = transition(record("d", TaskStatus.QUEUED), TaskStatus.DEDUPED, 2.0, error="poison")
    check_success_has_result([shared_failure])
    shared_success = transition(record("e", TaskStatus.QUEUED), TaskStatus.DEDUPED, 2.0)
    with pytest.raises(InvariantViolation, match=r"task 'e' \(key 'key-e'\) is deduped without a result"):
        check_success_has_result([shared_success])
    with pytest.raises(InvariantViolation, match=r"task 'a' \(key 'key-a'\) is succeeded without a result"):
        check_success_has_result([record("a", TaskStatus.SUCCEEDED, result=None)])


def test_check_at_most_once_counts_per_key_and_lists_the_worst_first() -> None:
    check_at_most_once(["k1", "k2"])
    check_at_most_once({"k1": 1})
    with pytest.raises(InvariantViolation) as caught:
        check_at_most_once(["k1", "k2", "k2", "k1", "k2"], what="billed")
    assert (
        str(caught.value)
        == "work done more than once: key 'k2' was billed 3 times; key 'k1' was billed 2 times"
    )
    many = [f"k{n}" for n in range(8)] * 2
    with pytest.raises(InvariantViolation, match="and 3 more"):
        check_at_most_once(many)


def test_finished_work_and_finished_job_stages_must_not_run_again() -> None:
    check_finished_work_not_rerun({"k1": "a"}, ["k2"])
    with pytest.raises(InvariantViolation, match=r"key 'k1' \(task 'a'\) had succeeded before the crash"):
        check_finished_work_not_rerun({"k1": "a"}, ["k2", "k1"])
    tasks = [record("s1", TaskStatus.SUCCEEDED, key="ks1"), record("s2", TaskStatus.RUNNING, key="ks2")]
    job = JobRecord(
        id="j1",
        key="jk",
        name="edit",
        version="1",
        results={"script": "x"},
        stage_tasks={"script": ["s1"], "tts": ["s2"]},
    )
    check_jobs_not_rebilled([job], tasks, ["ks2"])  # the unfinished stage may run again
    with pytest.raises(
        InvariantViolation, match=r"job 'j1' \(edit\) stage 'script' \(task 's1', key 'ks1'\)"
    ):
        check_jobs_not_rebilled([job], tasks, ["ks2", "ks1"])


def test_a_job_stage_executed_under_two_keys_is_reported() -> None:
    tasks = [
        record("a1", TaskStatus.FAILED, key="ka1"),  # interrupted by the crash, after the provider did it
        record("a2", TaskStatus.SUCCEEDED, key="ka2"),  # the same stage built again: another payload
        record("b1", TaskStatus.SUCCEEDED, key="kb1"),
        record("b2", TaskStatus.SUCCEEDED, key="kb2"),
    ]
    job = JobRecord(
        id="j1",
        key="jk",
        name="edit",
        version="1",
        status=TaskStatus.SUCCEEDED,
        results={"script": "s", "tts": ["p1", "p2"]},
        stage_tasks={"script": ["a1", "a2"], "tts": ["b1", "b2"]},
    )
    check_job_stages_billed_once([job], tasks, ["ka2", "kb1", "kb2"])  # two fan-out elements: fine
    with pytest.raises(InvariantViolation, match=r"job 'j1' \(edit\) stage 'script' was executed under 2"):
        check_job_stages_billed_once([job], tasks, ["ka1", "ka2", "kb1", "kb2"])


# ------------------------------------------------------------------------------- options
def test_option_parsing_and_messages() -> None:
    assert parse_seeds("4") == (0, 1, 2, 3)
    assert parse_crash_points("all") is None
    assert parse_crash_points("sample:7") == 7
    assert parse_replay("3:17") == CrashCase(3, 17)
    assert parse_replay("3:b17") == CrashCase(3, 17, before=True)
    assert parse_replay(None) is None
    bad_values = [("0", parse_seeds), ("x", parse_seeds), ("sample:0", parse_crash_points)]
    bad_values += [("sample:²", parse_crash_points), ("sample:٣", parse_crash_points), ("²", parse_seeds)]
    for bad, parse in bad_values:
        with pytest.raises(KitOptionError, match="expects"):
            parse(bad)
    assert parse_replay("3:e2") == CrashCase(3, 2, effect=True)
    assert str(CrashCase(3, 2, effect=True)) == "seed 3, crash right after side effect #2"
    for bad_replay in ("3-17", "3:b0", "3:e0", "3:b", "3:x17", "²:1", "1:²", "1:b²", "١:1"):
        with pytest.raises(KitOptionError, match="SEED:POINT"):
            parse_replay(bad_replay)
    assert CrashCase(3, 17).replay_option == "--aiqsim-replay 3:17"
    assert CrashCase(3, 17, before=True).replay_option == "--aiqsim-replay 3:b17"
    assert str(CrashCase(3, 17, before=True)) == "seed 3, crash before store write #17"


def test_crash_point_samples_are_seeded_and_within_range() -> None:
    every = [case.point for case in select_crash_points(3, 0, None)]
    assert every == ["b1", "1", "b2", "2", "b3", "3"]  # before and after each write, in time order
    assert [case.point for case in select_crash_points(3, 0, 9)] == every
    first = select_crash_points(100, 3, 10)
    assert first == select_crash_points(100, 3, 10)
    order = [(case.crash_point, not case.before) for case in first]
    assert len(first) == 10 and all(1 <= k <= 100 for k, _ in order) and order == sorted(order)
    assert first != select_crash_points(100, 4, 10)


def test_provider_config_reads_scenario_keys_with_the_scenario_checks() -> None:
    config = provider_config("tts", kind="tts", timeout_prob=0.2, outages=[{"start_s": 1, "end_s": 2}])
    assert config.name == "tts" and config.timeout_prob == 0.2 and config.outages[0].end_s == 2
    with pytest.raises(ScenarioError, match=r"providers\[0\].timeout_prob"):
        provider_config(timeout_prob=2.0)
    with pytest.raises(ScenarioError, match="unknown key"):
        provider_config(retry_prob=0.1)


# ------------------------------------------------------------------------------- the driver
async def documents(life: Life) -> None:
    """Eight requests, two of them double clicks of earlier ones, arriving 0.2 s apart."""
    for n in range(8):
        payload = {"input": f"doc-{n % 6}", "prompt_units": 10, "output_units": 20}
        life.submit("llm", payload, task_id=f"t{n}")
        await life.runtime.sleep(0.2)
    await life.join()


def llm(**fields: Any):  # type: ignore[no-untyped-def]
    def providers(world):  # type: ignore[no-untyped-def]
        return [world.simulated_provider("llm", latency_base_s=0.4, latency_sigma=0.3, **fields)]

    return providers


def test_driver_with_lookup_loses_nothing_and_bills_each_key_once() -> None:
    driver = CrashDriver(CrashOptions(seeds=(0, 1)))
    report = driver.run(
        documents,
        providers=llm(server_error_prob=0.2),
        recover_options={"requeue_interrupted": True},
        keep_outcomes=True,
    )
    assert report.cases == sum(len(p) for p in report.crash_points.values()) + 2
    for seed in (0, 1):
        writes = range(1, report.writes_per_seed[seed] + 1)
        assert report.crash_points[seed] == tuple(p for k in writes for p in (f"b{k}", f"{k}"))
    assert report.duplicate_executions == 0
    completed = sum(r.orphans_completed for o in report.outcomes for r in o.recoveries)
    assert completed > 0  # some crashes did land mid-call, and lookup finished those calls


def test_driver_catches_blind_resends_and_replays_the_exact_case() -> None:
    providers = llm(supports_lookup=False)
    recover = {"requeue_interrupted": True}
    driver = CrashDriver(CrashOptions(seeds=(0, 1, 2)), label="tests/x.py::t")
    with pytest.raises(InvariantViolation) as caught:
        driver.run(documents, providers=providers, recover_options=recover, at_most_once=True)
    message = str(caught.value)
    assert re.search(r"key '[0-9a-f]+' was executed 2 times", message), message
    case = caught.value.case  # type: ignore[attr-defined]
    assert f"pytest 'tests/x.py::t' --aiqsim-replay {case.seed}:{case.point}" in message
    first_line = message.splitlines()[1]

    replayed = CrashDriver(CrashOptions(replay=case), label="tests/x.py::t")
    with pytest.raises(InvariantViolation) as again:
        replayed.run(documents, providers=providers, recover_options=recover, at_most_once=True)
    assert str(again.value).splitlines()[1] == first_line  # the same key broke the same rule

    # the same provider is not held to "at most once" by default: it cannot promise it
    report = driver.run(documents, providers=providers, recover_options=recover)
    assert report.duplicate_executions > 0


def test_lost_responses_retried_within_a_life_are_counted_not_blamed_on_recovery() -> None:
    from aiqsim import RetryPolicy

    providers = llm(timeout_prob=0.3)  # lost after billing: the retry executes the key again
    options = {"retry": RetryPolicy(max_attempts=4, attempt_timeout_s=3)}
    recover = {"requeue_interrupted": True}  # safe: lookup answers for what the provider did
    report = CrashDriver(CrashOptions(seeds=(0,))).run(
        documents, providers=providers, scheduler_options=options, recover_options=recover
    )
    assert report.duplicate_executions > 0  # every one a retry after a lost response, none a re-send
    with pytest.raises(InvariantViolation, match="no crash"):  # "every execution" fails without a crash
        CrashDriver(CrashOptions(seeds=(0,))).run(
            documents,
            providers=providers,
            scheduler_options=options,
            recover_options=recover,
            at_most_once=True,
        )


def test_without_lookup_a_resubmitted_interrupted_key_pays_again_and_is_counted() -> None:
    """recover() fails the orphans (no lookup, no re-send); the double click of an interrupted
    document is a new submission of its key and executes again: the documented cost, counted."""
    report = CrashDriver(CrashOptions(seeds=(0, 1))).run(
        documents, providers=llm(), recover_options={"use_lookup": False}
    )
    assert report.duplicate_executions > 0
    with pytest.raises(
        InvariantViolation, match=r"was executed 2 times \(llm call started at t=.*; llm call"
    ):
        CrashDriver(CrashOptions(seeds=(0, 1))).run(
            documents, providers=llm(), recover_options={"use_lookup": False}, at_most_once=True
        )


def test_driver_replay_of_a_point_beyond_the_run_says_so() -> None:
    driver = CrashDriver(CrashOptions(replay=CrashCase(0, 10_000)))
    with pytest.raises(ValueError, match="never reaches crash point 10000"):
        driver.run(documents, providers=llm())


def test_driver_detects_a_scenario_that_is_not_deterministic() -> None:
    runs = Counter[str]()

    async def drifting(life: Life) -> None:  # submits less each time it is called: a hidden global
        runs["calls"] += 1
        for n in range(max(1, 6 - runs["calls"])):
            life.submit("llm", {"input": f"d{n}", "prompt_units": 1, "output_units": 1}, task_id=f"t{n}")
        await life.join()

    with pytest.raises(InvariantViolation, match="not deterministic"):
        CrashDriver(CrashOptions(seeds=(0,))).run(drifting, providers=llm())


def charge_card(world):  # type: ignore[no-untyped-def]
    """A user's provider that charges a card without an idempotency key and has no lookup."""
    from aiqsim.http import CallableProvider

    async def charge(request):  # type: ignore[no-untyped-def]
        await world.runtime.sleep(0.4)  # the call
        world.effects.record(f"order-{request.payload['id']}", what="charge card")
        await world.runtime.sleep(0.1)
        return {"charged": request.payload["id"]}

    return [CallableProvider("charge", charge)]


async def one_order(life: Life) -> None:
    life.submit("charge", {"id": 1}, task_id="order-1")
    await life.join()


def test_driver_crashes_before_a_write_after_the_side_effect_since_the_last_one() -> None:
    """One task makes three writes (submitted, running, succeeded); the charge happens between the
    last two. A crash right *after* each write never lands between charge and result; the crash
    right *before* write 3 does, and the re-sent orphan charges the card twice."""
    driver = CrashDriver(CrashOptions(seeds=(0,)), label="t.py::t")
    recover = {"requeue_interrupted": True}
    with pytest.raises(InvariantViolation) as caught:
        driver.run(one_order, providers=charge_card, recover_options=recover)
    message = str(caught.value)
    assert "key 'order-1' was executed 2 times (charge card at t=0.4s in life 0; charge card" in message
    assert "pytest 't.py::t' --aiqsim-replay 0:e1" in message  # right after the charge, first
    assert "also failing (SEED:POINT; bK: before write K, eN: after side effect N): 0:b3\n" in message

    replayed = CrashDriver(CrashOptions(replay=CrashCase(0, 3, before=True)), label="t.py::t")
    with pytest.raises(InvariantViolation, match="crash before store write #3") as again:
        replayed.run(one_order, providers=charge_card, recover_options=recover)
    assert "pytest 't.py::t' --aiqsim-replay 0:b3" in str(again.value)
    after = CrashDriver(CrashOptions(replay=CrashCase(0, 3))).run(
        one_order, providers=charge_card, recover_options=recover, keep_outcomes=True
    )
    assert after.outcomes[0].executions_per_key() == {"order-1": 1}  # after write 3: charged once
    report = CrashDriver(CrashOptions(seeds=(0,), sample=3)).run(
        one_order, providers=charge_card, recover_options={"use_lookup": False}
    )
    assert report.cases == 4 and set(report.crash_points[0]) < {"b1", "1", "b2", "2", "e1", "b3", "3"}


def charge_then_cache(world):  # type: ignore[no-untyped-def]
    """A provider whose charge (no idempotency key) and result cache for ``lookup`` sit in one call:
    no store write can fall between them, so only a crash right after the charge shows the bug."""
    from aiqsim.http import CallableProvider

    results: dict[str, Any] = {}

    async def charge(request):  # type: ignore[no-untyped-def]
        await world.runtime.sleep(0.4)
        world.effects.record(f"order-{request.payload['id']}", what="charge card")
        await world.runtime.sleep(0.1)
        results[request.idempotency_key] = {"charged": request.payload["id"]}
        return results[request.idempotency_key]

    async def lookup(key: str) -> Any:
        return results.get(key)

    return [CallableProvider("charge", charge, lookup=lookup)]


def test_driver_crashes_right_after_each_recorded_side_effect() -> None:
    recover = {"requeue_interrupted": True}
    with pytest.raises(InvariantViolation) as caught:
        CrashDriver(CrashOptions(seeds=(0,))).run(
            one_order, providers=charge_then_cache, recover_options=recover
        )
    message = str(caught.value)
    assert "failed at seed 0, crash right after side effect #1" in message, message
    assert "key 'order-1' was executed 2 times" in message and "--aiqsim-replay 0:e1" in message

    report = CrashDriver(CrashOptions(replay=parse_replay("0:3"))).run(  # after write 3: cached, once
        one_order, providers=charge_then_cache, recover_options=recover, keep_outcomes=True
    )
    assert report.outcomes[0].effects_after == (2,)  # the charge came after write 2 (running)
    every = select_crash_points(3, 0, None, effects_after=(2,))
    assert [case.point for case in every] == ["b1", "1", "b2", "2", "e1", "b3", "3"]
    with pytest.raises(
        ValueError, match="3 store writes and 1 side effects, so it never reaches crash point e2"
    ):
        CrashDriver(CrashOptions(replay=parse_replay("0:e2"))).run(one_order, providers=charge_then_cache)


def test_second_crash_options_parse_print_and_select() -> None:
    assert parse_replay("3:b4+2") == CrashCase(3, 4, before=True, then=2)
    assert parse_replay("3:e1+b1") == CrashCase(3, 1, effect=True, then=1, then_before=True)
    assert CrashCase(3, 4, then=2, then_before=True).replay_option == "--aiqsim-replay 3:4+b2"
    assert str(CrashCase(3, 4, before=True, then=2)) == (
        "seed 3, crash before store write #4, then after write #2 of the restarted life"
    )
    for bad in ("3:4+", "3:4+0", "3:0+1", "3:4+x", "3:4+b", "3:4+2+1", "3:4+²"):
        with pytest.raises(KitOptionError, match="SEED:POINT"):
            parse_replay(bad)
    assert parse_second_crashes("all") == "all" and parse_second_crashes(" 2 ") == 2
    assert parse_second_crashes("0") == 0
    for bad in ("-1", "x", "²", "1.5"):
        with pytest.raises(KitOptionError, match="second-crashes"):
            parse_second_crashes(bad)
    for bad_count in (-1, True, 1.5, "some"):
        with pytest.raises(KitOptionError, match="second_crashes"):
            CrashOptions(second_crashes=bad_count)  # type: ignore[arg-type]
    first = CrashCase(0, 5, before=True)
    every = [case.point for case in select_second_crashes(first, 3, "all")]
    assert every == ["b5+b1", "b5+1", "b5+b2", "b5+2", "b5+b3", "b5+3"]
    sample = select_second_crashes(first, 50, 4)
    assert sample == select_second_crashes(first, 50, 4) and len(sample) == 4
    assert [(c.then, not c.then_before) for c in sample] == sorted(
        (c.then, not c.then_before) for c in sample
    )
    assert sample != select_second_crashes(CrashCase(0, 5), 50, 4)  # seeded by the first case too
    assert select_second_crashes(first, 0, "all") == []


def consume_once_lookup(world):  # type: ignore[no-untyped-def]
    """A provider whose ``lookup`` hands a result over once and forgets it (a result queue). The
    result is cached before the (unkeyed) charge, in one step: any one crash is recovered without a
    second charge. Two are not: the first recovery's lookup takes the answer, the process dies again
    before it is recorded, the second recovery finds nothing and re-sends: a second charge."""
    from aiqsim.http import CallableProvider

    results: dict[str, Any] = {}

    async def charge(request):  # type: ignore[no-untyped-def]
        await world.runtime.sleep(0.4)
        results[request.idempotency_key] = {"charged": request.payload["id"]}
        world.effects.record(f"order-{request.payload['id']}", what="charge card")
        return results[request.idempotency_key]

    async def lookup(key: str) -> Any:
        return results.pop(key, None)

    return [CallableProvider("charge", charge, lookup=lookup)]


def test_a_second_crash_while_recovering_finds_a_lookup_that_forgets_its_answer() -> None:
    recover = {"requeue_interrupted": True}
    once = CrashDriver(CrashOptions(seeds=(0, 1))).run(
        one_order, providers=consume_once_lookup, recover_options=recover, keep_outcomes=True
    )
    assert all(len(o.snapshots) <= 1 for o in once.outcomes)  # off by default: every case crashes once
    completed = sum(r.orphans_completed for o in once.outcomes for r in o.recoveries)
    assert completed > 0  # single crashes mid-call were completed from the lookup, charged once

    twice = CrashDriver(CrashOptions(seeds=(0,), second_crashes="all"), label="t.py::t")
    with pytest.raises(InvariantViolation) as caught:
        twice.run(one_order, providers=consume_once_lookup, recover_options=recover)
    message = str(caught.value)
    assert "key 'order-1' was executed 2 times" in message, message
    case = caught.value.case  # type: ignore[attr-defined]
    assert case.then >= 1 and f"--aiqsim-replay 0:{case.point}" in message
    assert "of the restarted life" in message
    replayed = CrashDriver(CrashOptions(replay=case))
    with pytest.raises(InvariantViolation, match="executed 2 times"):
        replayed.run(one_order, providers=consume_once_lookup, recover_options=recover)


def test_second_crashes_during_recovery_keep_every_invariant_with_lookup() -> None:
    """Every first crash point of the eight-document run, each followed by a few seeded second
    crashes in the restarted life (during ``recover()`` and after it): nothing lost or billed twice."""
    driver = CrashDriver(CrashOptions(seeds=(0,), second_crashes=3))
    report = driver.run(
        documents,
        providers=llm(server_error_prob=0.2),
        recover_options={"requeue_interrupted": True},
        keep_outcomes=True,
    )
    doubles = [o for o in report.outcomes if o.case.then]
    singles = [o for o in report.outcomes if o.case.crash_point and not o.case.then]
    assert len(doubles) >= 2 * len(singles)  # up to three second crashes per first crash point
    assert all(len(o.snapshots) == 2 and len(o.writes_at_crashes) == 2 for o in doubles)
    assert report.cases == 1 + len(singles) + len(doubles)
    assert len(report.crash_points[0]) == len(singles) + len(doubles)
    # some second crashes hit recover() itself: that life never returned a recovery report
    during_recovery = [o for o in doubles if len(o.recoveries) == 1]
    assert during_recovery, "no second crash landed inside recover()"
    assert report.duplicate_executions == 0
    assert all(o.snapshots[0].restart_at < o.snapshots[1].restart_at for o in doubles)


def test_a_replayed_second_crash_beyond_the_restarted_life_says_so() -> None:
    driver = CrashDriver(CrashOptions(replay=parse_replay("0:2+500")))
    with pytest.raises(ValueError, match="never reaches its second crash"):
        driver.run(one_order, providers=charge_then_cache, recover_options={"requeue_interrupted": True})


def test_a_crash_before_a_write_leaves_the_store_as_the_write_before_left_it() -> None:
    from aiqsim.sim.crash import CrashingStore, SimulatedCrash
    from aiqsim.stores.memory import MemoryStore

    crashes: list[str] = []
    store = CrashingStore(
        MemoryStore(), counter=[0], crash_points=set(), crash_before={2}, on_crash=lambda: crashes.append("x")
    )
    store.insert_and_claim(record("t1", TaskStatus.QUEUED))
    with pytest.raises(SimulatedCrash, match="crash before store write #2"):
        store.insert_and_claim(record("t2", TaskStatus.QUEUED))
    assert crashes == ["x"] and store.dead
    assert [t.id for t in store.list_by_status()] == ["t1"]  # write 2 never landed
    with pytest.raises(SimulatedCrash, match="dead"):
        store.update(record("t1", TaskStatus.QUEUED))


def test_a_scenario_that_raises_is_reported_with_its_error_and_the_case() -> None:
    """The user's own error ends the case at once and is raised, chained, with the seed, the crash
    point, the life and the replay option (it used to end as "SimulationDeadlock: main task still
    waiting", the user's error nowhere)."""

    async def raises_at_once(life: Life) -> None:
        raise ValueError("boom in my worker")

    with pytest.raises(ScenarioFailedError) as caught:
        CrashDriver(CrashOptions(seeds=(0,)), label="t.py::t").run(raises_at_once, providers=llm())
    message = str(caught.value)
    assert message.startswith("aiqsim crash test failed at seed 0, no crash [store: memory]"), message
    assert "ValueError: boom in my worker" in message and "--aiqsim-replay 0:0" in message
    assert isinstance(caught.value.__cause__, ValueError)

    async def breaks_on_restart(life: Life) -> None:
        life.submit("llm", {"input": "x", "prompt_units": 1, "output_units": 1}, task_id="t0")
        if life.restarted:
            raise RuntimeError(f"restart code is broken: {life.recovery}")
        await life.join()

    with pytest.raises(ScenarioFailedError, match="in process life 1") as restarted:
        CrashDriver(CrashOptions(seeds=(0,))).run(breaks_on_restart, providers=llm())
    assert "crash before store write #1" in str(restarted.value)  # the first crash case
    assert "--aiqsim-replay 0:b1" in str(restarted.value)
    assert isinstance(restarted.value.__cause__, RuntimeError)

    async def bad_payload(life: Life) -> None:  # a simulated provider refuses it at submit
        life.submit("llm", {"id": 1}, task_id="t0")
        await life.join()

    with pytest.raises(ScenarioFailedError, match="InvalidRequestError: payload lacks input"):
        CrashDriver(CrashOptions(seeds=(0,))).run(bad_payload, providers=llm())


def test_driver_reports_a_stranded_task() -> None:
    async def walks_away(life: Life) -> None:
        life.submit("llm", {"input": "x", "prompt_units": 1, "output_units": 1}, task_id="t0")

    driver = CrashDriver(CrashOptions(seeds=(0,)), horizon_s=0.1)  # cut before the call can end
    with pytest.raises(InvariantViolation, match=r"task 't0' \(key '[0-9a-f]+'\) is still running"):
        driver.run(walks_away, providers=llm())


def script_payload(inputs: Any, results: Any) -> dict[str, Any]:
    return {"input": f"script-{inputs['n']}", "prompt_units": 10, "output_units": 30}


def voice_payload(inputs: Any, results: Any) -> list[dict[str, Any]]:
    return [
        {"input": f"{results['script']['input']}-p{i}", "prompt_units": 5, "output_units": 5}
        for i in range(2)
    ]


PIPELINE = JobSpec(
    "narrate",
    "1",
    [
        Stage("script", "llm", build=script_payload),
        Stage("voice", "tts", after=("script",), build=voice_payload, fan_out=True),
    ],
)


async def narrations(life: Life) -> None:
    for n in range(3):
        life.submit_job(PIPELINE, {"n": n}, job_id=f"job-{n}")
        await life.runtime.sleep(0.3)
    await life.join()


@pytest.mark.parametrize("kind", ["memory", "sqlite", "json"])
def test_driver_resumes_jobs_without_rebilling_finished_stages(kind: str, tmp_path: Path) -> None:
    def providers(world):  # type: ignore[no-untyped-def]
        return [
            world.simulated_provider("llm", latency_base_s=0.5, server_error_prob=0.1),
            world.simulated_provider("tts", kind="tts", latency_base_s=0.3),
        ]

    # every crash point of two seeds in memory; a seeded sample of 12 on the (slower) file stores
    options = CrashOptions(seeds=(0, 1)) if kind == "memory" else CrashOptions(seeds=(0,), sample=12)
    driver = CrashDriver(options, store=StoreFactory(kind, tmp_path))
    report = driver.run(narrations, providers=providers, jobs=[PIPELINE], keep_outcomes=True)
    assert report.cases == sum(len(points) + 1 for points in report.crash_points.values())
    assert report.cases >= (60 if kind == "memory" else 13)
    finals = [o for o in report.outcomes if o.case.crash_point == 0]
    assert all(j.status is TaskStatus.SUCCEEDED for o in finals for j in o.jobs)
    assert all(len(o.jobs) == 3 for o in report.outcomes)


BUILDS = Counter[str]()


def stamped_script(inputs: Any, results: Any) -> dict[str, Any]:
    """A user's bug: the payload carries a value that changes each time it is built (a timestamp)."""
    BUILDS["script"] += 1
    return {
        "input": f"script-{inputs['n']} built #{BUILDS['script']}",
        "prompt_units": 10,
        "output_units": 30,
    }


STAMPED = JobSpec(
    "stamped",
    "1",
    [
        Stage("script", "llm", build=stamped_script),
        Stage("voice", "tts", after=("script",), build=voice_payload, fan_out=True),
    ],
)


async def stamped_narrations(life: Life) -> None:
    for n in range(3):
        life.submit_job(STAMPED, {"n": n}, job_id=f"job-{n}")
        await life.runtime.sleep(0.3)
    await life.join()


def test_driver_catches_a_job_stage_whose_build_is_not_deterministic() -> None:
    def providers(world):  # type: ignore[no-untyped-def]
        return [
            world.simulated_provider("llm", latency_base_s=0.5),
            world.simulated_provider("tts", kind="tts"),
        ]

    # Recovery follows the stage's stored tasks (it used to rebuild and send the stage again, under a
    # second key); the rebuilt payload's different key is what gives the bug away now.
    with pytest.raises(
        InvariantViolation, match="stage 'script' built a different payload after the restart"
    ) as caught:
        CrashDriver(CrashOptions(seeds=(0,))).run(stamped_narrations, providers=providers, jobs=[STAMPED])
    assert "is its build function deterministic?" in str(caught.value)
    assert caught.value.rule == "deterministic job builds"


# ------------------------------------------------------------------------------- SIGKILL helper
def test_kill_and_restart_a_real_worker_loses_nothing(tmp_path: Path) -> None:
    from tests.helpers_store_worker import WORKLOAD, connect_ledger

    store_path, ledger_path = tmp_path / "tasks.sqlite", tmp_path / "ledger.sqlite"
    connect_ledger(ledger_path).close()
    opened_after_kill: list[int] = []

    def command(number: int, rng):  # type: ignore[no-untyped-def]
        return [
            sys.executable,
            str(WORKER),
            "recover",
            "--kind",
            "sqlite",
            "--store",
            str(store_path),
            "--ledger",
            str(ledger_path),
            "--lookup",
            "--seed",
            str(rng.randrange(2**31)),
            "--latency-scale",
            "3",
        ]

    def after_kill(run) -> None:  # type: ignore[no-untyped-def]
        from aiqsim.stores import open_store

        store = open_store("sqlite", store_path)  # loads after every kill
        opened_after_kill.append(len(store.list_by_status()))
        store.close()

    report = kill_and_restart(
        command, kills=3, seed=7, ready_line="opened", kill_window_s=0.2, after_kill=after_kill
    )
    assert report.kills == 3 and len(opened_after_kill) == 3
    assert report.final.lines[-1] == "done" and not report.final.killed
    assert all(run.returncode == -9 for run in report.runs if run.killed)

    from aiqsim.stores import open_store

    store = open_store("sqlite", store_path)
    try:
        tasks = store.list_by_status()
    finally:
        store.close()
    check_all_terminal(tasks)
    check_none_lost([task_id for task_id, _ in WORKLOAD], tasks)
    check_success_has_result(tasks)
    with sqlite3.connect(ledger_path) as ledger:
        executed = [key for (key,) in ledger.execute("SELECT key FROM executions")]
    check_at_most_once(executed)  # the worker's provider supports lookup


def test_kill_and_restart_reports_a_worker_that_never_gets_ready(tmp_path: Path) -> None:
    from aiqsim.testing import WorkerFailedError

    command = [sys.executable, "-c", "import sys; print('not ready'); sys.exit(3)"]
    with pytest.raises(WorkerFailedError, match="expected the ready line 'ready' first, got 'not ready"):
        kill_and_restart(command, kills=1, seed=0)


SLEEPER = (
    "import os, sys, time\n"
    "marker = sys.argv[1]\n"
    "print('ready', flush=True)\n"
    "first = not os.path.exists(marker)\n"
    "open(marker, 'a').close()\n"
    "time.sleep(60 if first else 0)\n"
    "print('done')\n"
)


TICKER = """
import os, sys, time
log, ticks = sys.argv[1], int(sys.argv[2])
first = not os.path.exists(log)
print("ready", flush=True)
with open(log, "a") as out:
    for _ in range(ticks if first else 0):
        out.write(f"{os.getpid()}\\n")
        out.flush()
        time.sleep(0.02)
"""


def ticks_by_pid(log: Path) -> Counter[str]:
    return Counter(log.read_text().split())


def test_a_kill_reaches_a_worker_started_through_a_wrapper(tmp_path: Path) -> None:
    """``sh -c "python worker.py"``: the kill hits the whole process group, not only the shell, so
    the worker does not live on as an orphan (it used to write all its ticks after its "kill")."""
    (tmp_path / "ticker.py").write_text(TICKER, encoding="utf-8")
    log = tmp_path / "ticks.log"
    command = ["sh", "-c", f"'{sys.executable}' ticker.py '{log}' 100; echo wrapper-done"]
    report = kill_and_restart(command, kills=1, seed=0, kill_window_s=0.1, cwd=tmp_path, timeout_s=30)
    assert [run.killed for run in report.runs] == [True, False]
    first = ticks_by_pid(log)
    assert len(first) == 1 and sum(first.values()) < 50  # killed within 0.1 s of 100 ticks of 0.02 s
    assert report.final.lines == ["ready", "wrapper-done"]
    time.sleep(0.3)
    assert ticks_by_pid(log) == first  # nothing of the first run is still writing


def test_a_worker_that_outlives_the_timeout_is_killed_and_reported(tmp_path: Path) -> None:
    (tmp_path / "ticker.py").write_text(TICKER, encoding="utf-8")
    log = tmp_path / "ticks.log"
    command = ["sh", "-c", f"'{sys.executable}' ticker.py '{log}' 1000"]
    with pytest.raises(WorkerFailedError, match=r"run 0 .* still running .* after timeout_s=0.5s"):
        kill_and_restart(command, kills=0, seed=0, cwd=tmp_path, timeout_s=0.5)
    stopped = ticks_by_pid(log)
    time.sleep(0.3)
    assert ticks_by_pid(log) == stopped and sum(stopped.values()) < 100  # the worker died too


def test_the_sigkill_fixture_kills_at_a_seeded_moment_and_restarts(aiqsim_sigkill, tmp_path: Path) -> None:
    command = [sys.executable, "-c", SLEEPER, str(tmp_path / "started")]
    report = aiqsim_sigkill(command, kills=1, kill_window_s=0.05)
    assert report.seed == 0  # the run's first seed
    assert [run.killed for run in report.runs] == [True, False]
    assert report.runs[0].kill_after_s is not None and report.runs[0].kill_after_s < 0.05
    assert report.runs[0].returncode == -9 and report.final.lines == ["ready", "done"]


# ------------------------------------------------------------------------------- the plugin
def pytest_in(directory: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``python -m pytest`` in ``directory`` with the installed aiqsim (the plugin by entry point),
    as a user's project would: without this suite's PostgreSQL (so the store kinds are the three local
    ones) and without CI=true (which this suite's own conftest, not the plugin, gives a meaning)."""
    env = {k: v for k, v in os.environ.items() if k not in ("AIQSIM_TEST_POSTGRES_DSN", "CI")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


FRESH_TEST = """
from aiqsim.sim.providers import SimulatedProvider
from aiqsim.scheduler import Scheduler


def test_runtime_and_provider(aiqsim_runtime, aiqsim_provider):
    provider = aiqsim_provider("llm", latency_base_s=2.0, honours_idempotency=True)
    assert isinstance(provider, SimulatedProvider) and provider.config.honours_idempotency

    async def main():
        scheduler = Scheduler(aiqsim_runtime, [provider])
        handle = scheduler.submit("llm", {"input": "x", "prompt_units": 1, "output_units": 0})
        result = await handle
        await scheduler.close()
        return result

    assert aiqsim_runtime.run(main())["input"] == "x"
    assert aiqsim_runtime.now() >= 2.0  # virtual seconds
    print("FIXTURE runtime+provider resolved")


def test_store(aiqsim_store):
    store = aiqsim_store.open()
    assert store.list_by_status() == []
    store.close()
    print(f"FIXTURE store {aiqsim_store.kind} resolved")


async def one_call(life):
    life.submit("llm", {"input": "x", "prompt_units": 1, "output_units": 1}, task_id="t0")
    await life.join()


def test_crash(aiqsim_crash):
    report = aiqsim_crash.run(one_call, providers=lambda world: [world.simulated_provider("llm")])
    print(f"FIXTURE crash seeds={list(report.seeds)} cases={report.cases}")
"""


def test_a_fresh_project_gets_the_fixtures_without_a_conftest(tmp_path: Path) -> None:
    (tmp_path / "test_fresh.py").write_text(FRESH_TEST, encoding="utf-8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test_fresh.py"]
    done = pytest_in(tmp_path, "-s", "-v")
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "aiqsim: 3 seeds, all crash points; stores memory/json/sqlite" in out
    assert "FIXTURE runtime+provider resolved" in out
    for kind in ("memory", "json", "sqlite"):
        assert f"test_store[store={kind}] FIXTURE store {kind} resolved" in out
    assert "FIXTURE crash seeds=[0, 1, 2]" in out
    assert "5 passed" in out

    deeper = pytest_in(
        tmp_path, "-s", "-k", "crash", "--aiqsim-seeds", "5", "--aiqsim-crash-points", "sample:2"
    )
    assert deeper.returncode == 0, deeper.stdout + deeper.stderr
    assert "aiqsim: 5 seeds, 2 crash points per seed" in deeper.stdout
    assert "FIXTURE crash seeds=[0, 1, 2, 3, 4] cases=15" in deeper.stdout  # 5 x (no crash + 2 points)

    bad = pytest_in(tmp_path, "--aiqsim-crash-points", "some")
    assert bad.returncode == 4  # pytest's usage error
    assert "--aiqsim-crash-points expects 'all' or 'sample:K'" in bad.stderr
    unicode = pytest_in(tmp_path, "--aiqsim-replay", "²:1")  # was an INTERNALERROR (int() refused "²")
    assert unicode.returncode == 4 and "--aiqsim-replay expects SEED:POINT" in unicode.stderr


def test_the_plugin_can_also_be_named_explicitly(tmp_path: Path) -> None:
    """``pytest_plugins = ["aiqsim.testing.plugin"]`` or ``-p aiqsim.testing.plugin`` next to the entry
    point used to stop pytest: "Plugin already registered under a different name"."""
    (tmp_path / "test_fresh.py").write_text(FRESH_TEST, encoding="utf-8")
    flag = pytest_in(tmp_path, "-q", "-k", "crash", "-p", "aiqsim.testing.plugin")
    assert flag.returncode == 0, flag.stdout + flag.stderr
    assert "1 passed" in flag.stdout
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["aiqsim.testing.plugin"]\n', encoding="utf-8")
    for extra in ((), ("-p", "aiqsim.testing.plugin"), ("-p", "no:aiqsim")):
        done = pytest_in(tmp_path, "-q", "-k", "crash", *extra)
        assert done.returncode == 0, (extra, done.stdout + done.stderr)
        assert "1 passed" in done.stdout


def test_the_plugin_imports_nothing_heavy() -> None:
    code = (
        "import sys, aiqsim.testing.plugin; "
        "print([m for m in ('pandas', 'matplotlib', 'numpy', 'ipywidgets') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


# ------------------------------------------------------------------------------- the example
def test_the_example_catches_the_users_non_idempotent_charge() -> None:
    # plain pytest, as the example's docstring runs it: its own settings (examples/pytest.ini), not
    # the suite's `-n 2`, which without pytest-xdist was "unrecognized arguments: -n"
    run = pytest_in(ROOT, str(EXAMPLE), "-q", "-p", "no:xdist", "--aiqsim-seeds", "1")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "4 passed, 1 xfailed" in run.stdout

    shown = pytest_in(ROOT, str(EXAMPLE), "-q", "--runxfail", "-k", "every_time")
    assert shown.returncode == 1, shown.stdout + shown.stderr
    caught = re.search(r"key 'ticket-\d+' was executed 2 times", shown.stdout)
    assert caught, shown.stdout
    replay = re.search(r"--aiqsim-replay (\d+:[be]?\d+)", shown.stdout)
    assert replay, shown.stdout
    print(f"\n[example] caught: {caught.group(0)}; replay {replay.group(1)}")

    again = pytest_in(
        ROOT, str(EXAMPLE), "-q", "--runxfail", "-k", "every_time", "--aiqsim-replay", replay.group(1)
    )
    assert again.returncode == 1
    assert caught.group(0) in again.stdout  # the replayed case breaks the same key


def test_report_outcomes_are_plain_data() -> None:
    report = CrashDriver(CrashOptions(seeds=(0,))).run(documents, providers=llm(), keep_outcomes=True)
    outcome = report.outcomes[-1]
    json.dumps({"case": str(outcome.case), "per_key": outcome.executions_per_key()})
    assert outcome.crashed and outcome.snapshot is not None


# ------------------------------------------------------------------------------- PostgreSQL
def test_driver_and_store_fixture_on_postgres(postgres_dsn: str, tmp_path: Path) -> None:
    import os

    import psycopg

    factory = StoreFactory("postgres", tmp_path, postgres_dsn=postgres_dsn, schema="kit_test")
    driver = CrashDriver(CrashOptions(seeds=(0,), sample=8), store=factory)
    report = driver.run(
        documents, providers=llm(server_error_prob=0.2), recover_options={"requeue_interrupted": True}
    )
    assert report.cases == 9
    with psycopg.connect(postgres_dsn) as conn:  # every case's schema was dropped afterwards
        left = conn.execute(
            "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE 'kit_test%'"
        ).fetchall()
    assert left == []

    (tmp_path / "test_fresh.py").write_text(FRESH_TEST, encoding="utf-8")
    env = {**os.environ, "AIQSIM_TEST_POSTGRES_DSN": postgres_dsn}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-v", "-k", "store"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "stores memory/json/sqlite/postgres" in done.stdout
    assert "test_store[store=postgres] FIXTURE store postgres resolved" in done.stdout
