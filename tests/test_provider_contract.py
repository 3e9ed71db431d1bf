"""An adapter whose ``call()`` returns something other than a ``ProviderResponse`` (a bug in the
adapter): the task fails with a ProviderContractError that names the provider and what it returned,
the call is not retried (it may have been billed), and the lane goes on."""

from __future__ import annotations

import types

import pytest

from aiqsim import QuotaLimits, RetryPolicy, Scheduler, TaskStatus
from aiqsim.errors import ProviderContractError, ProviderError
from aiqsim.scheduler.events import AttemptRecord
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse
from tests.runtimes import RUNTIMES, run_on


class SloppyAdapter:
    """Answers after 1 s; for the input ``"bad"`` it returns ``answer`` instead of a response."""

    name = "llm"

    def __init__(self, runtime, answer: object) -> None:
        self.runtime = runtime
        self.answer = answer
        self.calls: list[str] = []

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        self.calls.append(request.payload["input"])
        await self.runtime.sleep(1.0)
        if request.payload["input"] == "bad":
            return self.answer  # type: ignore[return-value]
        return ProviderResponse(result="ok")


@pytest.mark.parametrize("rt_name", RUNTIMES)
@pytest.mark.parametrize("answer", [None, {"result": "ok"}, "ok"], ids=["None", "dict", "str"])
def test_a_call_that_returns_no_provider_response_fails_the_task_once_and_the_lane_goes_on(
    rt_name: str, answer: object
) -> None:
    async def body(rt):
        events: list = []
        provider = SloppyAdapter(rt, answer)
        scheduler = Scheduler(
            rt,
            [provider],
            quotas={"llm": QuotaLimits(concurrency=1)},  # the next task needs the slot given back
            retry=RetryPolicy(max_attempts=5),
            events=events.append,
        )
        bad = scheduler.submit("llm", {"input": "bad"})
        good = scheduler.submit("llm", {"input": "good"})
        failed = await rt.wait_for(bad.wait(), 100)
        succeeded = await rt.wait_for(good.wait(), 100)
        attempts = [
            (e.outcome, e.decision) for e in events if isinstance(e, AttemptRecord) and e.task_id == bad.id
        ]
        return failed, succeeded, provider.calls, attempts

    failed, succeeded, calls, attempts = run_on(rt_name, body)
    assert failed.status is TaskStatus.FAILED
    assert failed.error.startswith("ProviderContractError: provider 'llm' returned ")
    assert f"returned {type(answer).__name__} from call()" in failed.error
    assert calls == ["bad", "good"]  # fatal: the bad call is not sent again
    assert attempts == [("ProviderContractError", "fatal")]
    assert succeeded.status is TaskStatus.SUCCEEDED


def test_the_contract_error_is_a_provider_error() -> None:
    assert issubclass(ProviderContractError, ProviderError)


class SyncAdapter:
    """A provider whose ``call`` is a plain function: it does the work when called and returns
    the response itself, which cannot be awaited."""

    name = "llm"

    def __init__(self, runtime) -> None:
        self.runtime = runtime
        self.calls: list[str] = []

    def call(self, request: ProviderRequest) -> ProviderResponse:
        self.calls.append(request.payload["input"])
        return ProviderResponse(result="ok")


@pytest.mark.parametrize("rt_name", RUNTIMES)
def test_a_call_that_is_no_coroutine_function_fails_once_naming_the_provider(rt_name: str) -> None:
    """Before: the task failed with asyncio's 'An asyncio.Future, a coroutine or an awaitable is
    required' (or SimPy's 'object ProviderResponse can't be used in await'), retried as a
    TypeError would be, without naming the provider."""

    async def body(rt):
        provider = SyncAdapter(rt)
        scheduler = Scheduler(rt, [provider], retry=RetryPolicy(max_attempts=5, attempt_timeout_s=30.0))
        record = await rt.wait_for(scheduler.submit("llm", {"input": "a"}).wait(), 100)
        await scheduler.close()
        return record, provider.calls

    record, calls = run_on(rt_name, body)
    assert record.status is TaskStatus.FAILED
    assert record.error.startswith("ProviderContractError: provider 'llm': call() returned ProviderResponse")
    assert "async def" in record.error
    assert calls == ["a"]  # it ran (and may have billed): not sent again


@pytest.mark.parametrize("rt_name", RUNTIMES)
def test_a_call_returning_another_awaitable_is_awaited(rt_name: str) -> None:
    """A plain ``call`` that returns an awaitable (a wrapper around an async function) is a provider."""

    class Wrapped:
        name = "llm"

        def __init__(self, runtime) -> None:
            self.runtime = runtime

        async def _call(self, request):
            await self.runtime.sleep(1.0)
            return ProviderResponse(result=request.payload)

        def call(self, request):
            return self._call(request)

    async def body(rt):
        scheduler = Scheduler(rt, [Wrapped(rt)])
        record = await rt.wait_for(scheduler.submit("llm", "x").wait(), 100)
        await scheduler.close()
        return record

    record = run_on(rt_name, body)
    assert (record.status, record.result) == (TaskStatus.SUCCEEDED, "x")


@pytest.mark.parametrize("call", [None, "not callable"], ids=["missing", "not-callable"])
def test_a_provider_without_a_call_method_is_refused_when_the_scheduler_is_made(call: object) -> None:
    from aiqsim import SimPyRuntime
    from aiqsim.scheduler.arguments import SchedulerArgumentError

    class NoCall:
        name = "llm"

    provider = NoCall()
    if call is not None:
        provider.call = call  # type: ignore[attr-defined]
    with pytest.raises(SchedulerArgumentError, match=r"'llm' \(NoCall\) has no call\(\) method"):
        Scheduler(SimPyRuntime(), [provider])
    with pytest.raises(SchedulerArgumentError, match="has no call"):
        Scheduler(SimPyRuntime(), {"lane": provider})


@pytest.mark.parametrize("rt_name", RUNTIMES)
def test_a_plain_generator_is_refused_after_an_awaitable_generator_was_accepted(rt_name: str) -> None:
    """The scheduler remembers the types of awaitables it checked (the check runs on every
    attempt), but a generator is awaitable only when its code is a ``@types.coroutine``: having
    awaited one must not let a plain generator through (it would fail inside the runtime instead,
    retried as a TypeError, without naming the provider)."""

    class Generators:
        name = "llm"

        def __init__(self, runtime) -> None:
            self.runtime = runtime

        @types.coroutine
        def _marked(self, request):
            yield from self.runtime.sleep(1.0).__await__()
            return ProviderResponse(result=request.payload)

        def call(self, request):
            if request.payload == "marked":
                return self._marked(request)
            return (part for part in ("not", "awaitable"))

    async def body(rt):
        scheduler = Scheduler(rt, [Generators(rt)], retry=RetryPolicy(max_attempts=3))
        marked = await rt.wait_for(scheduler.submit("llm", "marked").wait(), 100)
        plain = await rt.wait_for(scheduler.submit("llm", "plain").wait(), 100)
        await scheduler.close()
        return marked, plain

    marked, plain = run_on(rt_name, body)
    assert (marked.status, marked.result) == (TaskStatus.SUCCEEDED, "marked")
    assert plain.status is TaskStatus.FAILED and plain.attempts == 1
    assert plain.error.startswith("ProviderContractError: provider 'llm': call() returned generator")


class _Proxy:
    """A proxy whose ``__class__`` names the wrapped object's class, as wrapt's and lazy proxies do."""

    def __init__(self, wrapped: object) -> None:
        self._wrapped = wrapped

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return type(self._wrapped)

    def __getattr__(self, name: str) -> object:
        return getattr(self._wrapped, name)


@pytest.mark.parametrize("rt_name", RUNTIMES)
def test_a_proxy_of_a_dict_is_refused_after_a_proxy_of_a_coroutine_was_accepted(rt_name: str) -> None:
    """The remembered awaitable types must not answer for an object that disguises its class: the
    second proxy is no awaitable, whatever the first one was (seen in review: it failed inside the
    runtime with an error that did not name the provider)."""

    async def body(rt):
        async def answer():
            await rt.sleep(1.0)
            return ProviderResponse(result="ok")

        wrapped = answer()
        answers = [_Proxy(wrapped), _Proxy({"not": "awaitable"})]

        class Proxies:
            name = "llm"

            def call(self, request):
                return answers[request.payload]

        scheduler = Scheduler(rt, [Proxies()], retry=RetryPolicy(max_attempts=1))
        first = await rt.wait_for(scheduler.submit("llm", 0).wait(), 100)
        second = await rt.wait_for(scheduler.submit("llm", 1).wait(), 100)
        await scheduler.close()
        wrapped.close()  # a runtime that cannot await the proxy never started it: no "never awaited"
        return first, second

    first, second = run_on(rt_name, body)
    assert first.status is not TaskStatus.QUEUED  # (awaiting a proxy is the runtime's business)
    assert second.error.startswith("ProviderContractError: provider 'llm': call() returned _Proxy")


def test_the_remembered_awaitable_types_are_bounded() -> None:
    """A program that makes a class per answer (``unittest.mock`` makes one per mock) must not grow
    the set for ever, nor keep the classes alive in it."""
    from aiqsim.scheduler import attempts

    def awaitable_of_a_new_class() -> object:
        return type("Fresh", (), {"__await__": lambda self: iter(())})()

    for _ in range(3 * attempts.MAX_AWAITABLE_TYPES):
        assert attempts._is_awaitable(awaitable_of_a_new_class())
    assert len(attempts._AWAITABLE_TYPES) <= attempts.MAX_AWAITABLE_TYPES
