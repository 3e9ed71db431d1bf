"""Providers given one quota object draw on one account: a slot freed on one lane lets another start.

Each lane's dispatcher waits for a wake-up when every slot is taken; a release used to wake only
the releasing lane, so a call waiting on another lane of the same plain ``MultiQuota`` waited for
ever (``SharedMultiQuota`` hid it by polling every ``slot_poll_s``). Now lanes that share a quota
object wake each other (``LanePump.peers``).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from aiqsim import QuotaLimits, Scheduler
from aiqsim.core.fleet_quota import SharedMultiQuota
from aiqsim.core.token_bucket import MultiQuota
from tests.fakes import ScriptedProvider
from tests.runtimes import ASYNCIO_LATENESS_S, RUNTIMES, run_on


def _starts(runtime_name: str, quota_type: type) -> list[tuple[float, str]]:
    async def body(runtime: Any) -> list[tuple[float, str]]:
        a = ScriptedProvider(runtime, name="a", latency_s=1.0)
        b = ScriptedProvider(runtime, name="b", latency_s=1.0)
        account = quota_type(QuotaLimits(concurrency=1), now=runtime.now())
        scheduler = Scheduler(runtime, [a, b], quotas={"a": account, "b": account}, rng=random.Random(0))
        start = runtime.now()
        for lane, name in (("a", "a1"), ("b", "b1"), ("a", "a2"), ("b", "b2")):
            scheduler.submit(lane, {"input": name})
        await scheduler.join()
        return sorted((t - start, name) for t, name, _ in a.calls + b.calls)

    return run_on(runtime_name, body)


@pytest.mark.parametrize("runtime_name", RUNTIMES)
@pytest.mark.parametrize("quota_type", [MultiQuota, SharedMultiQuota])
def test_a_slot_freed_on_one_lane_starts_the_call_waiting_on_the_other(
    runtime_name: str, quota_type: type
) -> None:
    starts = _starts(runtime_name, quota_type)
    # every call ran (none waits for a wake-up that never comes); a release wakes its own lane
    # first, so a2 takes the slot a1 gave back before b1 does
    assert [name for _, name in starts] == ["a1", "a2", "b1", "b2"]
    times = [t for t, _ in starts]
    if runtime_name == "simpy":  # one slot: back to back, each as soon as the last one ends
        assert times == [0.0, 1.0, 2.0, 3.0]
    else:
        for index, t in enumerate(times):
            assert index <= t < index + ASYNCIO_LATENESS_S
