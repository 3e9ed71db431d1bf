"""Streamed tasks through the scheduler, on both runtimes: chunks reach the caller as they arrive,
retries before the first chunk are unseen, the first-token deadline is distinct from the attempt's,
and a stream cut after its first chunk (billed) is looked up, re-sent only under an honoured key, or
fails saying it was billed and cut."""

from __future__ import annotations

import random
from typing import Any

import pytest

from aiqsim.core.failures import ServerError, StreamCutError
from aiqsim.core.token_bucket import QuotaLimits
from aiqsim.scheduler import RetryPolicy, Scheduler
from aiqsim.scheduler.arguments import SchedulerArgumentError, SchedulerArgumentTypeError
from aiqsim.scheduler.call_log import CALL_LOG_COLUMNS, CallLog
from aiqsim.scheduler.events import AttemptRecord
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse, StreamChunk
from aiqsim.scheduler.scheduler import TaskCancelledError, TaskFailedError
from aiqsim.scheduler.streams import StreamAlreadyReadError, StreamInterruptedError
from tests.runtimes import RUNTIMES, run_on

CHUNKS = 4
TTFT = 2.0
GAP = 0.5


class ChunkProvider:
    """Streams ``CHUNKS`` one-token chunks, the first ``ttft`` seconds after the call, then one every
    ``GAP``. ``ttfts`` gives each call's first-token delay in turn (the last repeats); ``fail_first``
    calls fail with a 503 before any chunk; ``cut_after`` chunks into the first call, it is cut
    (billed). ``bills`` counts the calls the provider billed (each one that began streaming)."""

    name = "p"

    def __init__(
        self,
        runtime: Any,
        *,
        ttfts: tuple[float, ...] = (TTFT,),
        fail_first: int = 0,
        cut_after: int | None = None,
        honours: bool = False,
        gap: float = GAP,
    ) -> None:
        self.runtime = runtime
        self.gap = gap
        self.ttfts = list(ttfts)
        self.fail_first = fail_first
        self.cut_after = cut_after
        self.honours_idempotency_keys = honours
        self.streams = 0
        self.calls = 0
        self.bills = 0
        self.kept: dict[str, ProviderResponse] = {}

    def _ttft(self) -> float:
        return self.ttfts.pop(0) if len(self.ttfts) > 1 else self.ttfts[0]

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        self.calls += 1
        await self.runtime.sleep(self._ttft() + GAP * (CHUNKS - 1))
        self.bills += 1
        return ProviderResponse(result="t0 t1 t2 t3 ", usage=10.0, output_units=CHUNKS)

    async def stream(self, request: ProviderRequest) -> Any:
        self.streams += 1
        if self.fail_first:
            self.fail_first -= 1
            await self.runtime.sleep(0.1)
            raise ServerError("overloaded before the first byte", status=503)
        await self.runtime.sleep(self._ttft())
        self.bills += 1
        response = ProviderResponse(result="t0 t1 t2 t3 ", usage=10.0, output_units=CHUNKS)
        self.kept[request.idempotency_key] = response
        for index in range(CHUNKS):
            if index:
                await self.runtime.sleep(self.gap)
            if self.cut_after is not None and index == self.cut_after:
                self.cut_after = None
                raise StreamCutError("the connection dropped", received_units=index)
            yield StreamChunk(f"t{index} ", units=1.0)
        yield response


class LookupProvider(ChunkProvider):
    """The same, able to say what it kept for a key (as a server's ``GET /lookup/{key}``)."""

    async def lookup(self, idempotency_key: str) -> ProviderResponse | None:
        return self.kept.get(idempotency_key)


class PlainProvider:
    name = "p"

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        return ProviderResponse(result="whole", usage=3.0)


def _scheduler(runtime: Any, provider: Any, events: Any = None, **retry: Any) -> Scheduler:
    policy = RetryPolicy(**{"max_attempts": 4, "attempt_timeout_s": 60.0, **retry})
    return Scheduler(
        runtime,
        [provider],
        quotas={"p": QuotaLimits(requests_per_min=600, tokens_per_min=60_000, concurrency=4)},
        retry=policy,
        rng=random.Random(1),
        events=events,
    )


async def _read(runtime: Any, submission: Any) -> list[tuple[float, Any]]:
    seen = []
    async for chunk in submission.stream():
        seen.append((runtime.now(), chunk.data))
    return seen


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_chunks_reach_the_caller_as_they_arrive_and_the_usage_reconciles(runtime_name: str) -> None:
    async def body(runtime: Any) -> None:
        events: list[Any] = []
        provider = ChunkProvider(runtime)
        async with _scheduler(runtime, provider, events.append) as scheduler:
            start = runtime.now()
            submission = scheduler.submit("chat", {"q": 1}, provider="p", cost_estimate=50.0, stream=True)
            seen = await _read(runtime, submission)
            assert await submission == "t0 t1 t2 t3 "
        assert [data for _, data in seen] == ["t0 ", "t1 ", "t2 ", "t3 "]
        if runtime_name == "simpy":  # exact on the virtual clock: each chunk when it was sent
            assert [round(when - start, 9) for when, _ in seen] == [2.0, 2.5, 3.0, 3.5]
        else:  # real time: never early, each one before the stream ended
            assert seen[0][0] - start >= TTFT
        attempts = [e for e in events if type(e) is AttemptRecord]
        assert len(attempts) == 1 and attempts[0].outcome == "ok" and attempts[0].usage == 10.0
        assert attempts[0].first_token_s is not None and attempts[0].first_token_s >= TTFT
        if runtime_name == "simpy":
            assert attempts[0].first_token_s == pytest.approx(TTFT)
            assert attempts[0].tokens_per_s == pytest.approx(CHUNKS / (GAP * (CHUNKS - 1)))
        assert provider.streams == 1 and provider.calls == 0

    run_on(runtime_name, body)


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_a_retry_before_the_first_chunk_is_not_seen_by_the_caller(runtime_name: str) -> None:
    async def body(runtime: Any) -> None:
        provider = ChunkProvider(runtime, fail_first=2)
        async with _scheduler(runtime, provider) as scheduler:
            submission = scheduler.submit("chat", {"q": 2}, provider="p", stream=True)
            seen = await _read(runtime, submission)
            record = await submission.wait()
        assert [data for _, data in seen] == ["t0 ", "t1 ", "t2 ", "t3 "]
        assert record.attempts == 3 and provider.streams == 3 and provider.bills == 1

    run_on(runtime_name, body)


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_the_first_token_deadline_is_not_the_attempt_deadline(runtime_name: str) -> None:
    async def body(runtime: Any) -> None:
        events: list[Any] = []
        # first call: no token for 30 s (the first-token deadline, 5 s, abandons it); then 2 s
        provider = ChunkProvider(runtime, ttfts=(30.0, 2.0))
        async with _scheduler(runtime, provider, events.append, first_token_timeout_s=5.0) as scheduler:
            submission = scheduler.submit("chat", {"q": 3}, provider="p", stream=True)
            seen = await _read(runtime, submission)
            assert await submission == "t0 t1 t2 t3 "
        attempts = [e for e in events if type(e) is AttemptRecord]
        assert [a.outcome for a in attempts] == ["FirstTokenTimeoutError", "ok"]
        assert attempts[0].decision == "retry" and attempts[0].end - attempts[0].start >= 5.0
        if runtime_name == "simpy":
            assert attempts[0].end - attempts[0].start == pytest.approx(5.0)
        assert len(seen) == CHUNKS  # nothing of the abandoned attempt

    run_on(runtime_name, body)


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_without_a_first_token_deadline_the_slow_first_token_is_waited_for(runtime_name: str) -> None:
    async def body(runtime: Any) -> None:
        provider = ChunkProvider(runtime, ttfts=(30.0,))
        async with _scheduler(runtime, provider) as scheduler:
            submission = scheduler.submit("chat", {"q": 4}, provider="p", stream=True)
            assert await submission == "t0 t1 t2 t3 "
        assert provider.streams == 1

    run_on(runtime_name, body)


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_the_attempt_deadline_after_the_first_chunk_cuts_the_stream_billed(runtime_name: str) -> None:
    async def body(runtime: Any) -> None:
        events: list[Any] = []
        provider = ChunkProvider(runtime, ttfts=(2.0,), gap=100.0)
        # the whole attempt may last 60 s: the first chunk at 2, the second would come at 102: cut
        async with _scheduler(runtime, provider, events.append, attempt_timeout_s=60.0) as scheduler:
            submission = scheduler.submit("chat", {"q": 5}, provider="p", stream=True)
            with pytest.raises(StreamInterruptedError) as interrupted:
                await _read(runtime, submission)
            with pytest.raises(TaskFailedError, match="billed and cut"):
                await submission
        assert interrupted.value.chunks == 1
        attempts = [e for e in events if type(e) is AttemptRecord]
        assert [a.outcome for a in attempts] == ["BilledStreamCutError"]
        assert attempts[0].decision == "fatal" and attempts[0].first_token_s is not None
        assert provider.streams == 1 and provider.bills == 1  # never sent again

    run_on(runtime_name, body)


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_a_cut_is_not_resent_to_a_provider_that_neither_looks_up_nor_honours_keys(runtime_name: str) -> None:
    async def body(runtime: Any) -> None:
        provider = ChunkProvider(runtime, cut_after=2)
        async with _scheduler(runtime, provider) as scheduler:
            submission = scheduler.submit("chat", {"q": 6}, provider="p", stream=True)
            with pytest.raises(StreamInterruptedError):
                await _read(runtime, submission)
            record = await submission.wait()
        assert record.status.value == "failed"
        assert "BilledStreamCutError" in record.error and "not sent again" in record.error
        assert provider.streams == 1 and provider.calls == 0 and provider.bills == 1

    run_on(runtime_name, body)


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_a_cut_is_resent_under_an_honoured_key(runtime_name: str) -> None:
    async def body(runtime: Any) -> None:
        events: list[Any] = []
        provider = ChunkProvider(runtime, cut_after=1, honours=True)
        async with _scheduler(runtime, provider, events.append) as scheduler:
            submission = scheduler.submit("chat", {"q": 7}, provider="p", stream=True)
            with pytest.raises(StreamInterruptedError):
                await _read(runtime, submission)
            assert await submission == "t0 t1 t2 t3 "
        attempts = [e for e in events if type(e) is AttemptRecord]
        assert [(a.outcome, a.decision) for a in attempts] == [("StreamCutError", "retry"), ("ok", "done")]
        assert provider.streams == 1 and provider.calls == 1  # the re-send is a whole call

    run_on(runtime_name, body)


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_a_cut_is_completed_from_the_providers_lookup_billed_once(runtime_name: str) -> None:
    async def body(runtime: Any) -> None:
        events: list[Any] = []
        provider = LookupProvider(runtime, cut_after=2)
        async with _scheduler(runtime, provider, events.append) as scheduler:
            submission = scheduler.submit("chat", {"q": 8}, provider="p", stream=True)
            with pytest.raises(StreamInterruptedError):
                await _read(runtime, submission)
            assert await submission == "t0 t1 t2 t3 "
        attempts = [e for e in events if type(e) is AttemptRecord]
        assert [(a.outcome, a.decision, a.usage) for a in attempts] == [("StreamCutError", "lookup", 10.0)]
        assert provider.streams == 1 and provider.calls == 0 and provider.bills == 1

    run_on(runtime_name, body)


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_a_duplicate_gets_the_owners_result_as_one_chunk(runtime_name: str) -> None:
    async def body(runtime: Any) -> None:
        provider = ChunkProvider(runtime)
        async with _scheduler(runtime, provider) as scheduler:
            owner = scheduler.submit("chat", {"q": 9}, provider="p", stream=True)
            duplicate = scheduler.submit("chat", {"q": 9}, provider="p", stream=True)
            live = await _read(runtime, owner)
            replayed = await _read(runtime, duplicate)
        assert len(live) == CHUNKS
        assert [data for _, data in replayed] == ["t0 t1 t2 t3 "]
        assert provider.streams == 1

    run_on(runtime_name, body)


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_a_provider_without_stream_answers_as_one_chunk_and_one_reader_per_task(runtime_name: str) -> None:
    async def body(runtime: Any) -> None:
        async with _scheduler(runtime, PlainProvider()) as scheduler:
            submission = scheduler.submit("chat", {"q": 10}, provider="p", stream=True)
            reader = submission.stream()
            assert (await reader.__anext__()).data == "whole"
            with pytest.raises(StreamAlreadyReadError):
                await submission.stream().__anext__()
            plain = scheduler.submit("chat", {"q": 11}, provider="p")
            assert [data for _, data in await _read(runtime, plain)] == ["whole"]

    run_on(runtime_name, body)


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_a_failure_before_any_chunk_is_raised_by_the_reader(runtime_name: str) -> None:
    async def body(runtime: Any) -> None:
        provider = ChunkProvider(runtime, fail_first=10)
        async with _scheduler(runtime, provider, max_attempts=2) as scheduler:
            submission = scheduler.submit("chat", {"q": 12}, provider="p", stream=True)
            with pytest.raises(TaskFailedError, match="ServerError"):
                await _read(runtime, submission)

    run_on(runtime_name, body)


def test_bad_stream_arguments_are_refused_by_name() -> None:
    with pytest.raises(SchedulerArgumentError, match="first_token_timeout_s"):
        RetryPolicy(first_token_timeout_s=0)
    with pytest.raises(SchedulerArgumentTypeError, match="first_token_timeout_s"):
        RetryPolicy(first_token_timeout_s="5")  # type: ignore[arg-type]

    async def body(runtime: Any) -> None:
        async with _scheduler(runtime, PlainProvider()) as scheduler:
            with pytest.raises(SchedulerArgumentTypeError, match="stream: expected True or False"):
                scheduler.submit("chat", {}, provider="p", stream="yes")  # type: ignore[arg-type]
            assert scheduler.in_flight == 0

    run_on("simpy", body)


def test_the_call_log_records_time_to_first_token_and_token_rate() -> None:
    async def body(runtime: Any) -> None:
        log = CallLog()
        async with _scheduler(runtime, ChunkProvider(runtime), log) as scheduler:
            await scheduler.submit("chat", {"q": 13}, provider="p", stream=True)
        _, calls = log.as_dicts()
        assert calls[0]["first_token_s"] == pytest.approx(TTFT)
        assert calls[0]["tokens_per_s"] == pytest.approx(CHUNKS / (GAP * (CHUNKS - 1)))
        assert CALL_LOG_COLUMNS[-6:][0] == "limit_requests"

    run_on("simpy", body)


def test_a_call_log_written_before_the_stream_columns_still_reads(tmp_path: Any) -> None:
    import csv

    from aiqsim.lab.calibrate import read_call_log

    async def body(runtime: Any) -> None:
        log = CallLog()
        async with _scheduler(runtime, ChunkProvider(runtime), log) as scheduler:
            await scheduler.submit("chat", {"q": 14}, provider="p", stream=True)
        log.write(tmp_path)

    run_on("simpy", body)
    calls = tmp_path / "calls.csv"
    rows = list(csv.reader(calls.read_text().splitlines()))
    dropped = [i for i, name in enumerate(rows[0]) if name in ("first_token_s", "tokens_per_s")]
    calls.write_text("\n".join(",".join(c for i, c in enumerate(r) if i not in dropped) for r in rows) + "\n")
    _, frame = read_call_log(tmp_path)
    assert frame["first_token_s"].isna().all() and len(frame) == 1


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_cancelling_a_task_mid_stream_ends_its_reader_and_closes_the_stream(runtime_name: str) -> None:
    async def body(runtime: Any) -> None:
        provider = ChunkProvider(runtime, gap=100.0)
        closed: list[bool] = []
        stream = provider.stream

        async def watched(request: ProviderRequest) -> Any:
            try:
                async for item in stream(request):
                    yield item
            finally:
                closed.append(True)

        provider.stream = watched  # type: ignore[method-assign]
        async with _scheduler(runtime, provider) as scheduler:
            submission = scheduler.submit("chat", {"q": 15}, provider="p", stream=True)
            seen = []
            with pytest.raises(TaskCancelledError):
                async for chunk in submission.stream():
                    seen.append(chunk.data)
                    scheduler.cancel(submission.id)
        assert seen == ["t0 "] and closed == [True]

    run_on(runtime_name, body)


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_a_cut_before_any_chunk_is_billed_and_a_resend_still_streams_to_the_reader(runtime_name: str) -> None:
    async def body(runtime: Any) -> None:
        events: list[Any] = []
        provider = ChunkProvider(runtime, cut_after=0, honours=True)  # begun (billed), nothing sent
        async with _scheduler(runtime, provider, events.append) as scheduler:
            submission = scheduler.submit("chat", {"q": 16}, provider="p", stream=True)
            seen = await _read(runtime, submission)
        assert [data for _, data in seen] == ["t0 ", "t1 ", "t2 ", "t3 "]
        attempts = [e for e in events if type(e) is AttemptRecord]
        assert [(a.outcome, a.decision) for a in attempts] == [("StreamCutError", "retry"), ("ok", "done")]
        assert provider.streams == 2

        refused = ChunkProvider(runtime, cut_after=0)  # no lookup, keys not honoured: not re-sent
        async with _scheduler(runtime, refused) as scheduler:
            submission = scheduler.submit("chat", {"q": 17}, provider="p", stream=True)
            with pytest.raises(TaskFailedError, match="billed and cut"):
                await _read(runtime, submission)
        assert refused.streams == 1

    run_on(runtime_name, body)
