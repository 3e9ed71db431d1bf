"""A failed store write surfaces, never hangs.

Before the fix, a write that raised inside a task's coroutine killed it silently: the submission
never resolved, the concurrency slot was never released, and after ``concurrency`` such failures
the lane never ran again. Here a store wrapper fails the k-th write, for every k a scripted
scenario makes, on both runtimes; and a real SQLite file on a real, full tmpfs.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from aiqsim import (
    AsyncioRuntime,
    ExponentialBackoff,
    MemoryStore,
    QuotaLimits,
    RetryPolicy,
    Scheduler,
    SqliteStore,
    TaskStatus,
)
from aiqsim.scheduler.events import StoreWriteFailed, TaskTransition
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse
from aiqsim.stores.base import StoreWriteError
from tests.failing_stores import FailingWrites
from tests.fakes import ScriptedProvider
from tests.runtimes import RUNTIMES, run_on

SCRIPT = {"retry": ("500", "ok"), "poison": ("schema",)}
"""``a`` succeeds (and is submitted twice: a duplicate of a task in flight), ``retry`` fails once,
``poison`` proves poison after 3 attempts (a poison write), ``c`` is cancelled while queued (its
duplicate then claims the key) and ``b`` is submitted again once finished (a duplicate of a
finished task)."""


class LookupProvider(ScriptedProvider):
    """The scripted provider plus a record of the keys it completed, for recovery's lookup."""

    def __init__(self, runtime, **kwargs) -> None:
        super().__init__(runtime, **kwargs)
        self.done: dict[str, ProviderResponse] = {}
        self.executions: Counter[str] = Counter()

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        response = await super().call(request)
        self.done[request.idempotency_key] = response
        self.executions[request.payload["input"]] += 1
        return response

    async def lookup(self, key: str) -> ProviderResponse | None:
        return self.done.get(key)


def new_scheduler(rt, provider, store, events, seed: int = 7) -> Scheduler:
    return Scheduler(
        rt,
        [provider],
        quotas={"llm": QuotaLimits(concurrency=1)},  # one leaked slot would stall the lane
        store=store,
        retry=RetryPolicy(backoff=ExponentialBackoff(base_s=0.5, cap_s=1.0), max_attempts=3),
        rng=random.Random(seed),  # a restarted process gets its own seed (task ids must not repeat)
        events=events.append,
        interactive_limit=None,
    )


async def outcome(rt, handle):
    """The record a submission resolved with, or its StoreWriteError (bounded: a hang fails)."""
    if handle is None:
        return "refused"
    try:
        return await rt.wait_for(handle.wait(), 200)
    except StoreWriteError as error:
        return error


def submit(scheduler, name):
    try:
        return scheduler.submit("llm", {"input": name})
    except StoreWriteError:
        return None  # the submit's own write failed: refused at the door, nothing queued


async def scenario(rt, store, provider, events):
    scheduler = new_scheduler(rt, provider, store, events)
    handles = [submit(scheduler, name) for name in ("a", "retry", "poison", "a", "b", "c", "c")]
    if handles[5] is not None:
        scheduler.cancel(handles[5].id)
    await rt.wait_for(scheduler.join(), 200)
    handles.append(submit(scheduler, "b"))
    outcomes = [await outcome(rt, handle) for handle in handles]
    await rt.wait_for(scheduler.join(), 200)
    return scheduler, handles, outcomes


def test_the_scenario_makes_every_kind_of_write() -> None:
    async def body(rt):
        store = FailingWrites(MemoryStore())
        provider = LookupProvider(rt, latency_s=1.0, script=SCRIPT)
        _, _, outcomes = await scenario(rt, store, provider, [])
        return store.kinds, [o.status for o in outcomes]

    kinds, statuses = run_on("simpy", body)
    assert statuses == [
        TaskStatus.SUCCEEDED,
        TaskStatus.SUCCEEDED,
        TaskStatus.FAILED,
        TaskStatus.DEDUPED,
        TaskStatus.SUCCEEDED,
        TaskStatus.CANCELLED,
        TaskStatus.SUCCEEDED,
        TaskStatus.DEDUPED,
    ]
    assert set(kinds) == {"insert_and_claim", "claim", "update", "record_poison"}


def writes_in_scenario() -> int:
    async def body(rt):
        store = FailingWrites(MemoryStore())
        await scenario(rt, store, LookupProvider(rt, latency_s=1.0, script=SCRIPT), [])
        return store.writes

    return run_on("simpy", body)


@pytest.mark.parametrize("rt_name", RUNTIMES)
def test_a_failed_write_at_any_point_resolves_every_submission_and_the_lane_keeps_serving(
    rt_name: str,
) -> None:
    total = writes_in_scenario()
    failures_seen = 0
    for k in range(1, total + 1):

        async def body(rt, k=k):
            store = FailingWrites(MemoryStore(), fail_at={k})
            provider = LookupProvider(rt, latency_s=1.0, script=SCRIPT)
            events: list = []
            scheduler, handles, outcomes = await scenario(rt, store, provider, events)
            assert store.failed == [k], "the injected failure happened"
            assert scheduler.in_flight == 0
            assert scheduler.quota("llm").in_flight == 0, "no concurrency slot leaked"
            lost = [e for e in events if isinstance(e, StoreWriteFailed)]
            assert len(lost) == scheduler.store_write_failures
            errors = [o for o in outcomes if isinstance(o, StoreWriteError)]
            assert len(errors) == scheduler.store_write_failures
            assert errors or "refused" in outcomes, f"write {k} failed and nobody was told"
            for handle, result in zip(handles, outcomes, strict=True):
                stored = store.get(handle.id) if handle is not None else None
                if isinstance(result, StoreWriteError):
                    # lost means not persisted, unless a later duplicate wrote the outcome late or the
                    # scheduler wrote it again in the background (a terminal transition is only
                    # reported once its write went through)
                    healed = any(getattr(o, "deduped_from", None) == handle.id for o in outcomes)
                    written_late = [
                        e.new for e in events if isinstance(e, TaskTransition) and e.task_id == handle.id
                    ]
                    assert (
                        stored is None
                        or not stored.status.is_terminal
                        or healed
                        or (written_late and written_late[-1] == stored.status.value)
                    )
                elif handle is not None:
                    assert stored == result, "what was reported is what the store holds"
            # The lane still serves: a fresh task on the single slot runs and succeeds.
            fresh = scheduler.submit("llm", {"input": "fresh"})
            assert (await rt.wait_for(fresh.wait(), 200)).status is TaskStatus.SUCCEEDED
            await scheduler.close()
            # A restart reconciles what was left behind: every task terminal, none executed twice.
            restarted = new_scheduler(rt, provider, store.inner, [], seed=8)
            report = await rt.wait_for(restarted.recover(), 200)
            assert report.undecided == ()
            await rt.wait_for(restarted.join(), 200)
            assert all(r.status.is_terminal for r in store.inner.list_by_status())
            assert max(provider.executions.values()) == 1
            await restarted.close()
            return len(errors)

        failures_seen += run_on(rt_name, body)
    assert failures_seen >= total // 2


@pytest.mark.parametrize("rt_name", RUNTIMES)
def test_a_duplicate_of_a_task_whose_outcome_was_not_persisted_does_not_wait_for_ever(rt_name: str) -> None:
    async def body(rt):
        store = FailingWrites(MemoryStore())
        provider = LookupProvider(rt, latency_s=1.0)
        scheduler = new_scheduler(rt, provider, store, [])
        owner = scheduler.submit("llm", {"input": "a"})
        await rt.sleep(0.5)  # running: the next write is its terminal one
        store.fail_at = {store.writes + 1}
        with pytest.raises(StoreWriteError, match="running -> succeeded"):
            await rt.wait_for(owner.result(), 200)
        assert store.get(owner.id).status is TaskStatus.RUNNING  # what recover() would reconcile
        # The disk is still full: the duplicate's own insert lands, the late outcome write fails.
        store.fail_at = {store.writes + 2}
        duplicate = scheduler.submit("llm", {"input": "a"})
        with pytest.raises(StoreWriteError, match="not persisted"):
            await rt.wait_for(duplicate.result(), 5)  # at once, not after a poll that never ends
        # Space again: the next duplicate writes the owner's outcome late and shares its result.
        again = scheduler.submit("llm", {"input": "a"})
        result = await rt.wait_for(again.result(), 5)
        owner_now = store.get(owner.id)
        await scheduler.close()
        return result, owner_now.status, owner_now.result, provider.executions["a"]

    # never sent a second time: the provider's one execution serves all three submissions
    assert run_on(rt_name, body) == ({"output": "done:a"}, TaskStatus.SUCCEEDED, {"output": "done:a"}, 1)


def test_a_failing_submit_write_raises_from_submit_and_queues_nothing() -> None:
    async def body(rt):
        store = FailingWrites(MemoryStore(), fail_at={1})
        scheduler = new_scheduler(rt, LookupProvider(rt), store, [])
        with pytest.raises(StoreWriteError, match=r"new -> queued.*OSError") as caught:
            scheduler.submit("llm", {"input": "a"})
        assert isinstance(caught.value.__cause__, OSError)
        return scheduler.in_flight, scheduler.queued()

    assert run_on("simpy", body) == (0, 0)


# ---------------------------------------------------------------------------------- a real full disk


@pytest.fixture
def tiny_tmpfs(tmp_path: Path):
    """A 512 KiB tmpfs mounted at a fresh directory (needs root; skipped where mounting is refused)."""
    mount = shutil.which("mount")
    target = tmp_path / "tiny"
    target.mkdir()
    if mount is None:
        pytest.skip("no mount(8) on this machine: cannot make a real full filesystem")
    done = subprocess.run(
        [mount, "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(target)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here ({done.stderr.strip()})")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def fill(directory: Path) -> Path:
    """Fill the filesystem holding ``directory`` to the last byte; the filler file's path."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 4096)
        except OSError:
            pass
        try:
            while True:
                out.write(b"\0")
        except OSError:
            pass
    return filler


def test_on_a_real_full_disk_writes_fail_loudly_and_service_resumes_when_space_returns(
    tiny_tmpfs: Path,
) -> None:
    runtime = AsyncioRuntime()

    async def body():
        store = SqliteStore(tiny_tmpfs / "tasks.sqlite3")
        provider = LookupProvider(runtime, latency_s=0.01)
        events: list = []
        scheduler = new_scheduler(runtime, provider, store, events)
        first = await runtime.wait_for(scheduler.submit("llm", {"input": "before"}).result(), 30)
        filler = fill(tiny_tmpfs)
        results = []
        for i in range(40):  # enough writes to outgrow the WAL's free pages
            try:
                handle = scheduler.submit("llm", {"input": f"full-{i}", "pad": "x" * 2000})
            except StoreWriteError:
                results.append("refused")
                continue
            try:
                results.append(await runtime.wait_for(handle.result(), 30))
            except StoreWriteError:
                results.append("lost")
        assert scheduler.quota("llm").in_flight == 0
        filler.unlink()  # space returns
        after = await runtime.wait_for(scheduler.submit("llm", {"input": "after"}).result(), 30)
        await scheduler.close()
        store.close()
        return first, results, after, scheduler.store_write_failures

    first, results, after, failures = runtime.run(body())
    assert first == {"output": "done:before"}
    assert "refused" in results or "lost" in results, "a full disk must surface"
    assert results.count("lost") == failures
    assert after == {"output": "done:after"}


def test_data_that_cannot_be_stored_is_the_callers_error_not_a_write_failure() -> None:
    async def body(rt):
        scheduler = new_scheduler(rt, LookupProvider(rt), MemoryStore(), [])
        scheduler.submit("llm", {"input": "a"}, task_id="same")
        with pytest.raises(ValueError, match="already exists") as caught:
            scheduler.submit("llm", {"input": "b"}, task_id="same")
        await scheduler.close()
        return isinstance(caught.value, StoreWriteError), scheduler.store_write_failures

    assert run_on("simpy", body) == (False, 0)
