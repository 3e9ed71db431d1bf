"""The simulated provider's stream model: time to first token, token rate, stream cuts.

Driven directly (``call`` and ``stream``) on both runtimes, and through the real Scheduler. With
``ttft_s=2``, ``ttft_per_prompt_unit_s=0.01``, 100 prompt units, 100 output units at 50 tokens/s
and no noise, the first token comes at exactly 3 s and the answer at exactly 5 s (virtual time);
under asyncio timers never fire early, so lower bounds stay exact and upper bounds allow
:data:`tests.runtimes.ASYNCIO_LATENESS_S`.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace

import pytest

from aiqsim import NoBackoff, Priority, RetryPolicy, Scheduler, ServerError, SimPyRuntime, TaskStatus
from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import StreamCutError
from aiqsim.scheduler.events import AttemptRecord
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse, StreamChunk, SupportsStreaming
from aiqsim.sim.config import ProviderConfig
from aiqsim.sim.providers import STREAM_CHUNK_UNITS, SimulatedProvider
from tests.runtimes import ASYNCIO_LATENESS_S, RUNTIMES, run_on

TTFT_S = 3.0  # 2 + 0.01 * 100 prompt units
TOTAL_S = 5.0  # + 100 output units / 50 per s
PRICE = 2.0


def config(**changes) -> ProviderConfig:
    base = ProviderConfig(
        name="llm",
        latency_base_s=0.5,
        price_per_1k_units=PRICE,
        ttft_s=2.0,
        ttft_per_prompt_unit_s=0.01,
        tokens_per_s=50.0,
    )
    return replace(base, **changes)


def request(key: str = "k", prompt: int = 100, output: int = 100, *, attempt: int = 1) -> ProviderRequest:
    body = {"input": key, "prompt_units": prompt, "output_units": output}
    return ProviderRequest(
        task_id=f"t-{key}",
        idempotency_key=key,
        kind="llm",
        payload=body,
        cost_estimate=float(prompt + output),
        attempt=attempt,
        priority=Priority.BACKGROUND,
    )


async def collect(provider: SimulatedProvider, req: ProviderRequest) -> tuple[list, BaseException | None]:
    """Every item the stream yielded with the time it came, and the error that ended it (or None)."""
    items: list[tuple[float, object]] = []
    try:
        async for item in provider.stream(req):
            items.append((provider.runtime.now(), item))
    except Exception as error:  # the test inspects it
        return items, error
    return items, None


def test_a_streaming_provider_implements_the_protocol():
    runtime = SimPyRuntime()
    provider = SimulatedProvider(runtime, config(), random.Random(0))
    assert isinstance(provider, SupportsStreaming)


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_call_takes_ttft_plus_generation_and_states_its_first_token_time(runtime_name):
    async def body(runtime):
        provider = SimulatedProvider(runtime, config(), random.Random(0))
        start = runtime.now()
        response = await provider.call(request())
        return provider, response, runtime.now() - start

    provider, response, elapsed = run_on(runtime_name, body)
    assert response.first_token_s == pytest.approx(TTFT_S)
    assert TOTAL_S - 1e-9 <= elapsed <= TOTAL_S + (1e-9 if runtime_name == "simpy" else ASYNCIO_LATENESS_S)
    [execution] = provider.ledger.executions
    assert execution.outcome == "ok" and execution.billed and execution.service_s == pytest.approx(TOTAL_S)


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_stream_yields_the_first_token_at_ttft_then_chunks_then_the_response(runtime_name):
    async def body(runtime):
        provider = SimulatedProvider(runtime, config(), random.Random(0))
        start = runtime.now()
        items, error = await collect(provider, request())
        return [(at - start, item) for at, item in items], error

    items, error = run_on(runtime_name, body)
    assert error is None
    chunks = [(at, item) for at, item in items if isinstance(item, StreamChunk)]
    last_at, response = items[-1]
    assert isinstance(response, ProviderResponse) and all(isinstance(i, StreamChunk) for _, i in items[:-1])
    lateness = 1e-9 if runtime_name == "simpy" else ASYNCIO_LATENESS_S
    first_at, first = chunks[0]
    assert first.units == 1 and TTFT_S - 1e-9 <= first_at <= TTFT_S + lateness
    assert sum(chunk.units for _, chunk in chunks) == 100
    assert max(chunk.units for _, chunk in chunks) == STREAM_CHUNK_UNITS
    assert [at for at, _ in chunks] == sorted(at for at, _ in chunks)
    assert response.first_token_s == pytest.approx(TTFT_S) and response.output_units == 100
    assert TOTAL_S - 1e-9 <= last_at <= TOTAL_S + lateness
    if runtime_name == "simpy":  # token j of 100 at 3 + 2 * (j - 1) / 100: chunk ends at tokens 17, 33, ...
        assert chunks[1][0] == pytest.approx(TTFT_S + 2.0 * 16 / 100)
        assert chunks[-1][0] == pytest.approx(TTFT_S + 2.0 * 99 / 100)


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_a_cut_stream_ends_in_stream_cut_and_the_server_finishes_bills_and_keeps_the_answer(runtime_name):
    async def body(runtime):
        provider = SimulatedProvider(runtime, config(stream_cut_prob=1.0), random.Random(3))
        start = runtime.now()
        items, error = await collect(provider, request())
        cut_at = runtime.now() - start
        await provider.finish_server_work()
        return provider, [(at - start, item) for at, item in items], error, cut_at

    provider, items, error, cut_at = run_on(runtime_name, body)
    assert isinstance(error, StreamCutError)
    assert items and all(isinstance(item, StreamChunk) for _, item in items)  # no response
    received = sum(item.units for _, item in items)
    assert error.received_units == received and 1 <= received < 100
    first_at = items[0][0]
    assert TTFT_S - 1e-9 <= first_at <= cut_at
    if runtime_name == "simpy":
        assert cut_at < TOTAL_S  # the connection dropped during the generation
        # every chunk received was complete by the cut: token j of 100 at 3 + 2 * (j - 1) / 100
        assert TTFT_S + 2.0 * (received - 1) / 100 <= cut_at + 1e-9
    [execution] = provider.ledger.executions
    assert execution.outcome == "stream_cut" and execution.billed and execution.units == 200
    assert execution.cost == pytest.approx(PRICE * 200 / 1000)
    assert execution.service_s == pytest.approx(TOTAL_S)  # the server finished the answer
    kept = provider.ledger.first_success("llm", "k")
    assert kept is not None and kept[0] is execution


def test_call_meets_the_same_cut_at_the_same_time_without_chunks():
    def run(use_stream: bool):
        runtime = SimPyRuntime()
        provider = SimulatedProvider(runtime, config(stream_cut_prob=1.0), random.Random(3))

        async def body():
            try:
                if use_stream:
                    async for _ in provider.stream(request()):
                        pass
                else:
                    await provider.call(request())
            except StreamCutError as error:
                return runtime.now(), error.received_units
            raise AssertionError("not cut")

        return runtime.run(body()), provider.ledger.executions

    (streamed_at, _), streamed = run(True)
    (called_at, _), called = run(False)
    assert streamed_at == called_at and streamed == called


def test_server_errors_come_before_the_first_token_and_are_not_billed():
    runtime = SimPyRuntime()
    provider = SimulatedProvider(runtime, config(server_error_prob=1.0), random.Random(0))
    items, error = runtime.run(collect(provider, request()))
    assert items == [] and isinstance(error, ServerError)
    assert runtime.now() == pytest.approx(TTFT_S / 2)
    assert provider.ledger.billed_calls == 0


def test_an_idempotent_replay_streams_its_stored_answer_as_one_chunk():
    runtime = SimPyRuntime()
    provider = SimulatedProvider(runtime, config(honours_idempotency=True), random.Random(0))

    async def body():
        await provider.call(request())
        start = runtime.now()
        items, error = await collect(provider, request())
        return start, items, error

    start, items, error = runtime.run(body())
    assert error is None and len(items) == 2
    (chunk_at, chunk), (_, response) = items
    assert chunk.units == 100 and chunk_at - start == pytest.approx(0.5)  # latency_base_s
    assert response.first_token_s == pytest.approx(0.5)
    assert provider.ledger.outcome_counts()["replay"] == 1 and provider.ledger.billed_calls == 1


def test_a_provider_without_the_stream_model_answers_a_stream_in_one_chunk():
    runtime = SimPyRuntime()
    cfg = ProviderConfig(name="plain", latency_base_s=0.5, latency_per_unit_s=0.01)
    provider = SimulatedProvider(runtime, cfg, random.Random(0))
    items, error = runtime.run(collect(provider, request()))
    assert error is None and [type(item) for _, item in items] == [StreamChunk, ProviderResponse]
    assert items[-1][1].first_token_s == pytest.approx(1.5)
    called = runtime.run(provider.call(request("other")))
    assert called.first_token_s is None  # not streamed, no stream model: no time to first token


def test_ttft_noise_has_mean_one_and_cuts_converge_to_their_probability():
    runtime = SimPyRuntime()
    n, sigma, p = 4000, 0.5, 0.2
    provider = SimulatedProvider(
        runtime, config(ttft_sigma=sigma, stream_cut_prob=p, ttft_per_prompt_unit_s=0.0), random.Random(7)
    )

    async def body():
        ttfts, cuts = [], 0
        for i in range(n):
            try:
                response = await provider.call(request(f"k{i}"))
            except StreamCutError:
                cuts += 1
            else:
                ttfts.append(response.first_token_s)
        return ttfts, cuts

    ttfts, cuts = runtime.run(body())
    assert abs(cuts / n - p) <= 4.5 * math.sqrt(p * (1 - p) / n)
    sd = 2.0 * math.sqrt(math.exp(sigma**2) - 1)  # of a mean-2 lognormal of log-sigma 0.5
    assert abs(statistics.fmean(ttfts) - 2.0) <= 4.5 * sd / math.sqrt(len(ttfts))
    median = 2.0 * math.exp(-(sigma**2) / 2)
    assert statistics.median(ttfts) == pytest.approx(median, rel=0.05)


def test_the_stream_model_leaves_the_other_draws_where_they_were():
    """Adding the stream model changes no fate (rate limits, errors): its draws have their own hash."""

    def fates(cfg: ProviderConfig) -> list[str]:
        runtime = SimPyRuntime()
        provider = SimulatedProvider(runtime, cfg, random.Random(11))

        async def body():
            out = []
            for i in range(300):
                try:
                    await provider.call(request(f"k{i}"))
                    out.append("ok")
                except Exception as error:
                    out.append(type(error).__name__)
            return out

        return runtime.run(body())

    plain = ProviderConfig(
        name="llm", rate_limit_prob=0.2, server_error_prob=0.1, rate_limit_retry_after_s=None
    )
    streaming = replace(plain, ttft_s=1.0, tokens_per_s=40.0, ttft_sigma=0.3)
    assert fates(plain) == fates(streaming)


def run_cut_tasks(cfg: ProviderConfig, n: int = 40) -> tuple[list, list, SimulatedProvider]:
    """``n`` streamed tasks through the real Scheduler: their final records, attempts and provider."""
    runtime = SimPyRuntime()
    provider = SimulatedProvider(runtime, cfg, random.Random(1))
    events: list = []
    retry = RetryPolicy(max_attempts=10, backoff=NoBackoff(), attempt_timeout_s=None)
    scheduler = Scheduler(
        runtime, [provider], retry=retry, rng=random.Random(0), events=events.append, background_limit=None
    )

    async def main():
        handles = [
            scheduler.submit("llm", {"input": f"x{i}", "prompt_units": 100, "output_units": 100}, stream=True)
            for i in range(n)
        ]
        records = [await handle.wait() for handle in handles]
        await scheduler.close()
        await provider.finish_server_work()
        return records

    records = runtime.run(main())
    return records, [e for e in events if isinstance(e, AttemptRecord)], provider


@pytest.mark.parametrize(
    ("lookup", "honours", "settled_by"),
    [(True, False, "lookup"), (False, True, "re-send"), (False, False, "failure")],
)
def test_the_scheduler_settles_cut_streams_billing_each_answer_once(lookup, honours, settled_by):
    cfg = config(stream_cut_prob=0.5, supports_lookup=lookup, honours_idempotency=honours)
    records, attempts, provider = run_cut_tasks(cfg)
    ledger = provider.ledger
    cut = ledger.outcome_counts()["stream_cut"]
    assert 5 < cut < 35
    assert ledger.billed_calls == 40 and ledger.duplicate_billed_calls == 0  # never a second bill
    succeeded = [r for r in records if r.status is TaskStatus.SUCCEEDED]
    failed = [r for r in records if r.status is TaskStatus.FAILED]
    if settled_by == "failure":
        assert len(failed) == cut and all("BilledStreamCutError" in r.error for r in failed)
    else:
        assert len(succeeded) == 40
        replays = ledger.outcome_counts()["replay"]
        assert replays == (cut if settled_by == "re-send" else 0)
    ok = [a for a in attempts if a.outcome == "ok"]
    assert ok and all(a.first_token_s == pytest.approx(TTFT_S) for a in ok if a.attempt == 1)
    # a re-sent cut joins the execution still finishing, then gets its answer whole (a replay)
    assert all(0 < a.first_token_s < TOTAL_S for a in ok if a.attempt > 1)
    assert any(a.attempt > 1 for a in ok) == (settled_by == "re-send")


def test_a_first_token_deadline_abandons_the_attempt_and_the_server_still_bills_it():
    cfg = config(ttft_sigma=1.0)
    runtime = SimPyRuntime()
    provider = SimulatedProvider(runtime, cfg, random.Random(2))
    events: list = []
    retry = RetryPolicy(
        max_attempts=6, backoff=NoBackoff(), attempt_timeout_s=None, first_token_timeout_s=4.0
    )
    scheduler = Scheduler(
        runtime, [provider], retry=retry, rng=random.Random(0), events=events.append, background_limit=None
    )

    async def main():
        handles = [
            scheduler.submit("llm", {"input": f"x{i}", "prompt_units": 100, "output_units": 100}, stream=True)
            for i in range(60)
        ]
        records = [await handle.wait() for handle in handles]
        await scheduler.close()
        await provider.finish_server_work()
        return records

    records = runtime.run(main())
    attempts = [e for e in events if isinstance(e, AttemptRecord)]
    abandoned = [a for a in attempts if a.outcome == "FirstTokenTimeoutError"]
    assert abandoned and all(a.end - a.start == pytest.approx(4.0) for a in abandoned)
    assert all(r.status is TaskStatus.SUCCEEDED for r in records)
    assert all(a.first_token_s <= 4.0 for a in attempts if a.outcome == "ok")
    ledger = provider.ledger
    assert ledger.billed_calls == 60 + len(abandoned) and ledger.duplicate_billed_calls == len(abandoned)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"tokens_per_s": None}, "ttft_s needs tokens_per_s"),
        ({"ttft_s": None}, "tokens_per_s needs ttft_s"),
        ({"tokens_per_s": 0.0}, "tokens_per_s must be a finite number > 0"),
        ({"ttft_s": -1.0}, "ttft_s must be a finite number >= 0"),
        ({"ttft_sigma": math.inf}, "ttft_sigma must be a finite number >= 0"),
        ({"stream_cut_prob": 1.5}, "stream_cut_prob must be a probability"),
        (
            {"ttft_s": None, "tokens_per_s": None, "ttft_per_prompt_unit_s": 0.0, "stream_cut_prob": 0.1},
            "stream_cut_prob is part of the stream",
        ),
    ],
)
def test_the_stream_model_is_validated(changes, needle):
    with pytest.raises(ConfigurationError, match=needle):
        SimulatedProvider(SimPyRuntime(), config(**changes), random.Random(0))
