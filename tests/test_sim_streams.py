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
def test_a_cut_stream_is_billed_for_what_was_generated_and_raises_stream_cut(runtime_name):
    async def body(runtime):
        provider = SimulatedProvider(runtime, config(stream_cut_prob=1.0), random.Random(3))
        start = runtime.now()
        items, error = await collect(provider, request())
        await provider.finish_server_work()
        return provider, [(at - start, item) for at, item in items], error

    provider, items, error = run_on(runtime_name, body)
    assert isinstance(error, StreamCutError)
    assert items and all(isinstance(item, StreamChunk) for _, item in items)  # no response
    received = sum(item.units for _, item in items)
    assert error.received_units == received
    [execution] = provider.ledger.executions
    assert execution.outcome == "stream_cut" and execution.billed
    generated = execution.units - 100  # prompt units are billed in full
    assert received <= generated <= 100 and generated - received < STREAM_CHUNK_UNITS
    assert execution.cost == pytest.approx(PRICE * execution.units / 1000)
    assert TTFT_S <= execution.service_s <= TOTAL_S
    assert provider.ledger.first_success("llm", "k") is None  # nothing kept to replay


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


def test_a_cut_is_retried_and_billed_again_even_where_keys_are_honoured():
    runtime = SimPyRuntime()
    cfg = config(stream_cut_prob=0.5, honours_idempotency=True)
    provider = SimulatedProvider(runtime, cfg, random.Random(1))
    events: list = []
    retry = RetryPolicy(max_attempts=10, backoff=NoBackoff(), attempt_timeout_s=None)
    scheduler = Scheduler(
        runtime, [provider], retry=retry, rng=random.Random(0), events=events.append, background_limit=None
    )

    async def main():
        handles = [
            scheduler.submit("llm", {"input": f"x{i}", "prompt_units": 100, "output_units": 100})
            for i in range(40)
        ]
        records = [await handle.wait() for handle in handles]
        await scheduler.close()
        return records

    records = runtime.run(main())
    ledger = provider.ledger
    attempts = [e for e in events if isinstance(e, AttemptRecord)]
    cut = [a for a in attempts if a.outcome == "StreamCutError"]
    ok = [a for a in attempts if a.outcome == "ok"]
    assert cut and len(ok) == 40 and all(r.status is TaskStatus.SUCCEEDED for r in records)
    assert all(a.first_token_s == pytest.approx(TTFT_S) for a in ok)
    assert all(a.first_token_s is None for a in cut)
    assert ledger.outcome_counts()["stream_cut"] == len(cut)
    assert ledger.billed_calls == 40 + len(cut) and ledger.duplicate_billed_calls == len(cut)


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
