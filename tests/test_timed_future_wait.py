"""SimPyRuntime.wait_for on a future: an expired deadline resumes the task with a marker instead of
throwing Cancelled through it; every outcome must stay what the thrown cancellation gave."""

from __future__ import annotations

from typing import Any

import pytest

from aiqsim.runtime import SimPyRuntime
from aiqsim.runtime.protocol import Cancelled


def test_timeout_raises_and_cancels_the_future() -> None:
    rt = SimPyRuntime()
    future = rt.create_future()

    async def main() -> str:
        try:
            await rt.wait_for(future, 2.0)
        except TimeoutError:
            return f"timeout at {rt.now():g}"
        return "no timeout"

    assert rt.run(main()) == "timeout at 2"
    assert future.cancelled()


def test_a_result_set_at_the_deadline_instant_wins() -> None:
    rt = SimPyRuntime()
    future = rt.create_future()

    async def resolve_at(t: float) -> None:
        await rt.sleep(t)
        future.set_result("value")

    async def main() -> Any:
        await rt.sleep(0)  # the wheel's timer is scheduled before the resolver's sleep ends
        rt.spawn(resolve_at(2.0))
        return await rt.wait_for(future, 2.0)

    assert rt.run(main()) == "value"


def test_an_outside_cancel_at_the_deadline_instant_is_a_cancel_not_a_timeout() -> None:
    rt = SimPyRuntime()
    future = rt.create_future()
    seen: list[str] = []

    async def waiter() -> None:
        try:
            await rt.wait_for(future, 2.0)
        except TimeoutError:
            seen.append("timeout")
        except Cancelled:
            seen.append("cancelled")
            raise

    async def main() -> None:
        task = rt.spawn(waiter())
        await rt.sleep(2.0)
        task.cancel()
        with pytest.raises(Cancelled):
            await task

    rt.run(main())
    assert seen == ["cancelled"]


def test_an_outer_deadline_at_the_same_instant_wins_over_the_inner_one() -> None:
    rt = SimPyRuntime()
    future = rt.create_future()
    inner_saw: list[str] = []

    async def inner() -> None:
        try:
            await rt.wait_for(future, 3.0)
        except TimeoutError:
            inner_saw.append("timeout")  # would keep running past the outer deadline
            await rt.sleep(100)

    async def main() -> float:
        with pytest.raises(TimeoutError):
            await rt.wait_for(inner(), 3.0)
        return rt.now()

    assert rt.run(main()) == 3.0
    assert inner_saw == []


def test_many_expiring_waits_leave_no_events_behind() -> None:
    rt = SimPyRuntime()

    async def main() -> int:
        timeouts = 0
        for _ in range(50):
            try:
                await rt.wait_for(rt.create_future(), 1.0)
            except TimeoutError:
                timeouts += 1
        return timeouts

    assert rt.run(main()) == 50
    assert rt.now() == 50.0
    assert len(rt.env._queue) == 0  # no stale wake-up of a cancelled future, no leftover timer
