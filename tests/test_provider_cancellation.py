"""A provider that raises a cancellation nobody asked for fails its task; a real cancel still cancels.

``asyncio.CancelledError`` raised from inside a provider's ``call()`` (an adapter bug, or an inner
task of a library cancelled by mistake) used to end the task ``cancelled``, as if its user had
cancelled it. The runtime's ``cancelling()`` tells the two apart on both runtimes.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from aiqsim import AsyncioRuntime, Scheduler, SimPyRuntime, TaskStatus
from aiqsim.errors import ProviderCancelledError, ProviderError
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse
from aiqsim.scheduler.retry import RetryPolicy


class SelfCancellingProvider:
    """``"cancel"`` payloads raise ``CancelledError`` after a short wait; others succeed."""

    name = "llm"

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self.calls: list[Any] = []

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        self.calls.append(request.payload)
        await self.runtime.sleep(0.01)
        if request.payload == "cancel":
            raise asyncio.CancelledError()
        if request.payload == "slow":
            await self.runtime.sleep(100.0)
        return ProviderResponse(result=request.payload)


def _run(runtime_name: str, timeout: float | None) -> tuple[dict[str, Any], list[Any]]:
    runtime: Any = SimPyRuntime() if runtime_name == "simpy" else AsyncioRuntime()
    provider = SelfCancellingProvider(runtime)

    async def main() -> dict[str, Any]:
        scheduler = Scheduler(
            runtime,
            [provider],
            retry=RetryPolicy(max_attempts=3, attempt_timeout_s=timeout),
            rng=random.Random(0),
        )
        bad = scheduler.submit("llm", "cancel")
        slow = scheduler.submit("llm", "slow")
        good = scheduler.submit("llm", "fine")
        await runtime.sleep(0.05)
        assert scheduler.cancel(slow.id)
        records = {
            name: await handle.wait() for name, handle in [("bad", bad), ("slow", slow), ("good", good)]
        }
        await scheduler.close()
        return records

    return runtime.run(main()), provider.calls


@pytest.mark.parametrize("timeout", [None, 60.0])
@pytest.mark.parametrize("runtime_name", ["simpy", "asyncio"])
def test_a_cancellation_raised_by_the_provider_fails_the_task_once(
    runtime_name: str, timeout: float | None
) -> None:
    records, calls = _run(runtime_name, timeout)
    bad = records["bad"]
    assert bad.status is TaskStatus.FAILED
    assert bad.error is not None and bad.error.startswith("ProviderCancelledError:")
    assert "nobody requested" in bad.error
    assert calls.count("cancel") == 1  # fatal: not sent (and billed) again
    assert records["slow"].status is TaskStatus.CANCELLED  # a cancel the user asked for is still one
    assert records["good"].status is TaskStatus.SUCCEEDED


def test_the_error_is_a_provider_error() -> None:
    assert issubclass(ProviderCancelledError, ProviderError)
    assert not issubclass(ProviderCancelledError, asyncio.CancelledError)


def test_cancelling_is_false_outside_a_task_and_true_once_a_task_is_cancelled() -> None:
    runtime = SimPyRuntime()
    seen: list[bool] = []

    async def victim() -> None:
        seen.append(runtime.cancelling())
        try:
            await runtime.sleep(10)
        except asyncio.CancelledError:
            seen.append(runtime.cancelling())
            raise

    async def main() -> None:
        task = runtime.spawn(victim())
        await runtime.sleep(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    assert runtime.cancelling() is False
    runtime.run(main())
    assert seen == [False, True]
