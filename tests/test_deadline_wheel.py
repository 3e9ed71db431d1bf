"""The SimPy runtime's deadline wheel: wait_for deadlines expire at their time, in (time, order) order,
whichever of its two stores (in-order FIFO, out-of-order heap) holds them."""

from __future__ import annotations

import random

import pytest

from aiqsim.runtime import SimPyRuntime


@pytest.mark.parametrize("seed", range(5))
def test_timeouts_fire_at_their_deadline_in_deadline_order(seed: int) -> None:
    rng = random.Random(seed)
    rt = SimPyRuntime()
    fired: list[tuple[float, int]] = []
    timeouts = [rng.choice([1.0, 2.0, 2.0, 5.0, 0.5]) for _ in range(40)]
    starts = sorted(rng.uniform(0, 10) for _ in range(40))

    async def forever() -> None:
        await rt.sleep(1e9)

    async def one(index: int, start: float, timeout: float) -> None:
        await rt.sleep(start)
        try:
            await rt.wait_for(forever(), timeout)
        except TimeoutError:
            fired.append((rt.now(), index))

    async def main() -> None:
        tasks = [rt.spawn(one(i, s, t)) for i, (s, t) in enumerate(zip(starts, timeouts, strict=True))]
        for task in tasks:
            await task

    rt.run(main())
    expected = sorted((s + t, i) for i, (s, t) in enumerate(zip(starts, timeouts, strict=True)))
    assert [index for _, index in fired] == [index for _, index in expected]
    pairs = zip(fired, expected, strict=True)
    assert all(time == pytest.approx(deadline) for (time, _), (deadline, _) in pairs)


def test_a_finished_call_leaves_no_timeout_behind() -> None:
    rt = SimPyRuntime()
    results: list[object] = []

    async def quick(value: int) -> int:
        await rt.sleep(0.5)
        return value

    async def main() -> None:
        for value in range(3):  # deadlines at 60.5, 61.0, 61.5 added in order (FIFO store)
            results.append(await rt.wait_for(quick(value), 60))
        results.append(await rt.wait_for(quick(9), 0.25))  # an earlier deadline (heap store)

    with pytest.raises(TimeoutError):
        rt.run(main())
    assert results == [0, 1, 2] and rt.now() == pytest.approx(1.75)
