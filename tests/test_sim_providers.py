"""The simulated provider, driven directly and through the real Scheduler on virtual time.

Times are asserted exactly (virtual time is deterministic): with ``latency_base_s=0.5``,
``latency_per_unit_s=0.01`` and 100 output units, one execution takes exactly 1.5 s.
Random behaviour is checked against its configured probability with a fixed seed and a
tolerance derived from the sample size (4.5 standard errors).
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from aiqsim import (
    InvalidRequestError,
    NoBackoff,
    Priority,
    ProviderResponse,
    ProviderTimeoutError,
    QuotaExhaustedError,
    QuotaLimits,
    RateLimitError,
    RetryPolicy,
    Scheduler,
    SchemaViolationError,
    ServerError,
    SimPyRuntime,
    TaskStatus,
)
from aiqsim.scheduler.events import AttemptRecord
from aiqsim.scheduler.provider import Provider, ProviderRequest, SupportsLookup
from aiqsim.sim.config import OutageConfig, ProviderConfig
from aiqsim.sim.providers import (
    DRAWS_PER_CALL,
    LOST_RESPONSE_HANG_S,
    Execution,
    ProviderLedger,
    SimulatedProvider,
)
from aiqsim.stores import MemoryStore

LATENCY_S = 1.5  # 0.5 + 0.01 * 100
PRICE = 2.0  # per 1000 units
UNITS = 200  # 100 prompt + 100 output
COST = PRICE * UNITS / 1000


def config(**changes) -> ProviderConfig:
    base = ProviderConfig(name="llm", latency_base_s=0.5, latency_per_unit_s=0.01, price_per_1k_units=PRICE)
    return replace(base, **changes)


def payload(name: str = "a", prompt: int = 100, output: int = 100, poison: bool = False) -> dict:
    return {"input": name, "prompt_units": prompt, "output_units": output, "poison": poison}


def request(key: str = "k", body: dict | None = None, *, task_id: str = "t", attempt: int = 1):
    body = payload(key) if body is None else body
    return ProviderRequest(
        task_id=task_id,
        idempotency_key=key,
        kind="llm",
        payload=body,
        cost_estimate=float(body["prompt_units"] + body["output_units"]),
        attempt=attempt,
        priority=Priority.BACKGROUND,
    )


def make(cfg: ProviderConfig, seed: int = 0, ledger: ProviderLedger | None = None):
    runtime = SimPyRuntime()
    return runtime, SimulatedProvider(runtime, cfg, random.Random(seed), ledger)


async def outcome_of(provider: SimulatedProvider, req: ProviderRequest, timeout: float | None = None):
    """(result or exception, virtual time when the client got it)."""
    try:
        value = await provider.runtime.wait_for(provider.call(req), timeout)
    except Exception as error:
        return error, provider.runtime.now()
    return value, provider.runtime.now()


def tolerance(p: float, n: int) -> float:
    return 4.5 * math.sqrt(p * (1 - p) / n)


# ---------------------------------------------------------------- protocol and latency
def test_implements_the_scheduler_protocols_and_estimates_cost():
    _, provider = make(config())
    assert isinstance(provider, Provider)
    assert isinstance(provider, SupportsLookup)
    assert provider.name == "llm"
    assert provider.estimate_cost("llm", payload(prompt=30, output=12)) == 42.0


def test_latency_formula_without_noise_and_billing():
    runtime, provider = make(config(latency_per_unit_s=0.02))

    async def main():
        first = await outcome_of(provider, request("a", payload("a", output=100)))
        second = await outcome_of(provider, request("b", payload("b", prompt=10, output=25)))
        return first, second

    (first, t1), (second, t2) = runtime.run(main())
    assert t1 == 0.5 + 0.02 * 100
    assert t2 == t1 + 0.5 + 0.02 * 25
    assert first == ProviderResponse(
        result={"input": "a", "output_units": 100, "provider": "llm"}, usage=200.0, output_units=100.0
    )
    assert second.result == {"input": "b", "output_units": 25, "provider": "llm"}
    ok_a, ok_b = provider.ledger.executions
    assert (ok_a.start, ok_a.end, ok_a.outcome, ok_a.billed, ok_a.units) == (0.0, t1, "ok", True, 200)
    assert ok_a.cost == pytest.approx(PRICE * 200 / 1000)
    assert (ok_b.start, ok_b.end, ok_b.units) == (t1, t2, 35)
    assert provider.ledger.billed_calls == 2
    assert provider.ledger.cost_total == pytest.approx(PRICE * 235 / 1000)


def test_latency_noise_is_lognormal_with_mean_one():
    n, sigma = 2000, 0.5
    runtime, provider = make(config(latency_base_s=1.0, latency_per_unit_s=0.0, latency_sigma=sigma), seed=3)

    async def main():
        for i in range(n):
            await provider.call(request(f"k{i}"))

    runtime.run(main())
    latencies = [e.end - e.start for e in provider.ledger.executions]
    mean = sum(latencies) / n
    sd = math.sqrt(math.exp(sigma**2) - 1)
    assert abs(mean - 1.0) < 4.5 * sd / math.sqrt(n)
    logs = [math.log(x) for x in latencies]
    log_mean = sum(logs) / n
    log_sd = math.sqrt(sum((x - log_mean) ** 2 for x in logs) / (n - 1))
    assert abs(log_sd - sigma) < 0.05
    assert len(set(latencies)) == n  # noisy, not constant


def fates(cfg: ProviderConfig, keys: list[str], seed: int = 11) -> dict[tuple[str, int], tuple[str, float]]:
    """(key, n-th arrival of that key) -> (outcome, latency), sending ``keys`` one after another."""
    runtime, provider = make(cfg, seed=seed)

    async def main():
        for key in keys:
            await outcome_of(provider, request(key))

    runtime.run(main())
    seen: dict[str, int] = {}
    result = {}
    for execution in provider.ledger.executions:
        arrival = seen.get(execution.key, 0)
        seen[execution.key] = arrival + 1
        result[(execution.key, arrival)] = (execution.outcome, execution.end - execution.start)
    return result


NOISY = config(rate_limit_prob=0.3, server_error_prob=0.3, invalid_request_prob=0.2, latency_sigma=0.3)


def test_a_requests_fate_depends_on_its_key_and_arrival_count_not_on_the_order_of_keys():
    keys = [f"k{i}" for i in range(40)] * 2  # every key twice: a first arrival and a repeat
    in_order = fates(NOISY, keys)
    shuffled = keys[:]
    random.Random(3).shuffle(shuffled)
    reordered = fates(NOISY, shuffled)
    # each arrival index of a key meets the same fate whatever came in between (latencies are
    # compared as end - start at different absolute times, hence approx)
    assert {k: outcome for k, (outcome, _) in reordered.items()} == {k: o for k, (o, _) in in_order.items()}
    assert {k: latency for k, (_, latency) in reordered.items()} == pytest.approx(
        {k: latency for k, (_, latency) in in_order.items()}, rel=1e-12
    )
    assert len({outcome for outcome, _ in in_order.values()}) >= 3
    assert fates(NOISY, keys, seed=12) != in_order  # the seed still matters


def test_a_repeat_of_a_key_meets_a_fresh_fate():
    outcomes = [outcome for outcome, _ in fates(config(rate_limit_prob=0.5), ["same"] * 40).values()]
    assert 10 < outcomes.count("rate_limited") < 30  # independent draws per arrival, not one fate


def test_any_string_is_a_key_even_one_a_strict_utf8_encoder_refuses():
    fates_seen = fates(NOISY, ["a\ud800", "a\0b", "a"])  # a lone surrogate, a NUL byte
    assert len(fates_seen) == 3


def test_changing_one_probability_leaves_every_other_draw_where_it_was():
    keys = [f"k{i}" for i in range(60)]
    calm = fates(config(latency_sigma=0.3), keys)
    erratic = fates(config(latency_sigma=0.3, server_error_prob=0.4), keys)
    unaffected = [k for k, (outcome, _) in erratic.items() if outcome == "ok"]
    assert 20 < len(unaffected) < 60
    assert {k: erratic[k][1] for k in unaffected} == pytest.approx(
        {k: calm[k][1] for k in unaffected}, rel=1e-12
    )
    assert all(calm[k][0] == "ok" for k in unaffected)
    assert DRAWS_PER_CALL == 6  # rate limit, quota exhausted, invalid, server error, lost, noise


# ---------------------------------------------------------------- server-side quota windows
def test_requests_window_rejects_the_extra_request_with_exact_retry_after():
    runtime, provider = make(config(latency_base_s=0.0, latency_per_unit_s=0.0, server_requests_per_min=3))

    async def at(time: float, key: str):
        await runtime.sleep(time - runtime.now())
        return await outcome_of(provider, request(key))

    async def main():
        seen = [await at(t, f"k{t}") for t in (0.0, 10.0, 20.0, 30.75)]
        await runtime.sleep(seen[-1][0].retry_after_s)  # the client obeys the header: 30.75 + 30 = 60.75
        seen.append(await outcome_of(provider, request("after")))
        seen.append(await outcome_of(provider, request("again")))  # window now 10, 20, 60.75
        return seen

    seen = runtime.run(main())
    assert [type(v).__name__ for v, _ in seen] == [
        "ProviderResponse",
        "ProviderResponse",
        "ProviderResponse",
        "RateLimitError",
        "ProviderResponse",
        "RateLimitError",
    ]
    assert seen[3][0].retry_after_s == 30.0  # the one accepted at 0 leaves at 60: 29.25 s, rounded up
    assert seen[5][0].retry_after_s == 10.0  # the one accepted at 10 leaves at 70: 9.25 s, rounded up
    assert [t for _, t in seen] == [0.0, 10.0, 20.0, 30.75, 60.75, 60.75]
    outcomes = [(e.outcome, e.billed) for e in provider.ledger.executions]
    assert outcomes == [("ok", True)] * 3 + [("rate_limited", False), ("ok", True), ("rate_limited", False)]


def test_request_window_admits_again_exactly_when_the_oldest_request_is_a_minute_old():
    runtime, provider = make(config(latency_base_s=0.0, latency_per_unit_s=0.0, server_requests_per_min=1))

    async def main():
        first = await outcome_of(provider, request("a"))
        await runtime.sleep(59.999)
        early = await outcome_of(provider, request("b"))
        await runtime.sleep(60.0 - runtime.now())
        on_time = await outcome_of(provider, request("c"))
        return first, early, on_time

    first, early, on_time = runtime.run(main())
    assert isinstance(first[0], ProviderResponse)
    assert isinstance(early[0], RateLimitError) and early[0].retry_after_s == 1.0
    assert isinstance(on_time[0], ProviderResponse) and on_time[1] == 60.0


def test_units_window_weights_requests_by_their_units():
    cfg = config(latency_base_s=0.0, latency_per_unit_s=0.0, server_units_per_min=1000)
    runtime, provider = make(cfg)

    async def at(time: float, key: str, prompt: int, output: int):
        await runtime.sleep(time - runtime.now())
        return (await outcome_of(provider, request(key, payload(key, prompt, output))))[0]

    async def main():
        return [
            await at(0.0, "a", 300, 100),  # 400
            await at(5.0, "b", 300, 100),  # 800
            await at(10.0, "c", 300, 100),  # 1200 > 1000: wait until "a" leaves at 60
            await at(10.0, "d", 100, 50),  # 950 fits
            await at(59.0, "e", 300, 300),  # 950 + 600: "a" and "b" must leave -> 65 - 59 = 6
            await at(60.0, "f", 300, 100),  # "a" left: 550 + 400 = 950
        ]

    results = runtime.run(main())
    kinds = [type(r).__name__ for r in results]
    assert kinds == [
        "ProviderResponse",
        "ProviderResponse",
        "RateLimitError",
        "ProviderResponse",
        "RateLimitError",
        "ProviderResponse",
    ]
    assert results[2].retry_after_s == 50.0
    assert results[4].retry_after_s == 6.0


def test_request_larger_than_the_units_limit_is_invalid_not_throttled():
    runtime, provider = make(config(server_units_per_min=100))

    async def main():
        return await outcome_of(provider, request("big", payload("big", 90, 20)))

    error, when = runtime.run(main())
    assert isinstance(error, InvalidRequestError) and "110 units" in str(error)
    assert when == 0.0
    assert provider.ledger.billed_calls == 0


# ---------------------------------------------------------------- failure modes
FAILURE_MODES = [
    # (config field or "poison", error type, ledger outcome, client sees it at, billed)
    ("rate_limit_prob", RateLimitError, "rate_limited", 0.0, False),
    ("quota_exhausted_prob", QuotaExhaustedError, "quota_exhausted", 0.0, False),
    ("invalid_request_prob", InvalidRequestError, "invalid_request", 0.0, False),
    ("server_error_prob", ServerError, "server_error", LATENCY_S / 2, False),
    ("poison", SchemaViolationError, "schema_violation", LATENCY_S, True),
]


@pytest.mark.parametrize(("field", "error_type", "outcome", "at", "billed"), FAILURE_MODES)
def test_each_failure_mode_at_probability_one(field, error_type, outcome, at, billed):
    poison = field == "poison"
    cfg = (
        config(rate_limit_retry_after_s=7.0)
        if poison
        else config(rate_limit_retry_after_s=7.0, **{field: 1.0})
    )
    runtime, provider = make(cfg)

    async def main():
        return [
            await outcome_of(provider, request(f"k{i}", payload(f"k{i}", poison=poison))) for i in range(5)
        ]

    seen = runtime.run(main())
    assert all(isinstance(error, error_type) for error, _ in seen)
    assert [when for _, when in seen] == [at * i + at for i in range(5)]
    if error_type is RateLimitError:
        assert all(error.retry_after_s == 7.0 for error, _ in seen)
    if error_type is ServerError:
        assert all(error.status == 500 for error, _ in seen)
    executions = provider.ledger.executions
    assert [e.outcome for e in executions] == [outcome] * 5
    assert all(e.billed is billed for e in executions)
    assert provider.ledger.cost_total == pytest.approx(5 * COST if billed else 0.0)


@pytest.mark.parametrize(("field", "outcome"), [(f, o) for f, _, o, _, _ in FAILURE_MODES if f != "poison"])
def test_each_failure_mode_never_at_probability_zero(field, outcome):
    others = {f: 0.2 for f, *_ in FAILURE_MODES if f not in ("poison", field)}
    runtime, provider = make(config(**others, **{field: 0.0}), seed=5)

    async def main():
        for i in range(300):
            await outcome_of(provider, request(f"k{i}"))

    runtime.run(main())
    counts = provider.ledger.outcome_counts()
    assert counts[outcome] == 0
    assert sum(counts[o] for f, _, o, _, _ in FAILURE_MODES if f in others) > 100  # the others do fire


def test_random_failure_rates_converge_to_their_probabilities_in_draw_order():
    n = 3000
    p_rl, p_qe, p_inv, p_se, p_lost = 0.1, 0.05, 0.1, 0.2, 0.25
    cfg = config(
        rate_limit_prob=p_rl,
        quota_exhausted_prob=p_qe,
        invalid_request_prob=p_inv,
        server_error_prob=p_se,
        timeout_prob=p_lost,
    )
    runtime, provider = make(cfg, seed=2024)

    async def main():
        for i in range(n):
            await outcome_of(provider, request(f"k{i}"), timeout=10.0)

    runtime.run(main())
    counts = provider.ledger.outcome_counts()
    # each check only sees the calls that passed the ones before it
    expected = {
        "rate_limited": p_rl,
        "quota_exhausted": (1 - p_rl) * p_qe,
        "invalid_request": (1 - p_rl) * (1 - p_qe) * p_inv,
        "server_error": (1 - p_rl) * (1 - p_qe) * (1 - p_inv) * p_se,
    }
    expected["ok"] = 1 - sum(expected.values())
    for outcome, p in expected.items():
        assert abs(counts[outcome] / n - p) < tolerance(p, n), outcome
    executed = [e for e in provider.ledger.executions if e.outcome == "ok"]
    lost = sum(e.response_lost for e in executed) / len(executed)
    assert abs(lost - p_lost) < tolerance(p_lost, len(executed))


def test_malformed_payload_is_an_invalid_request():
    runtime, provider = make(config())

    async def main():
        req = replace(request("x"), payload={"input": "x", "prompt_units": 3})
        return await outcome_of(provider, req)

    error, _ = runtime.run(main())
    assert isinstance(error, InvalidRequestError) and "output_units" in str(error)
    assert provider.ledger.outcome_counts()["invalid_request"] == 1


def test_config_is_validated():
    runtime = SimPyRuntime()
    with pytest.raises(ValueError, match="server_error_prob"):
        SimulatedProvider(runtime, config(server_error_prob=1.5), random.Random(0))
    with pytest.raises(ValueError, match="outage window"):
        SimulatedProvider(runtime, config(outages=(OutageConfig(5.0, 5.0),)), random.Random(0))


# ---------------------------------------------------------------- outages
def test_error_outage_answers_503_after_the_base_latency_and_bills_nothing():
    cfg = config(outages=(OutageConfig(start_s=10.0, end_s=20.0, mode="error"),))
    runtime, provider = make(cfg)

    async def at(time: float, key: str):
        await runtime.sleep(time - runtime.now())
        return await outcome_of(provider, request(key))

    async def main():
        return [await at(t, f"k{t}") for t in (5.0, 10.0, 19.0, 20.0)]

    seen = runtime.run(main())
    assert isinstance(seen[0][0], ProviderResponse) and seen[0][1] == 6.5
    for error, _ in seen[1:3]:
        assert isinstance(error, ServerError) and error.status == 503
    assert [when for _, when in seen[1:3]] == [10.5, 19.5]
    assert isinstance(seen[3][0], ProviderResponse) and seen[3][1] == 21.5
    assert [e.outcome for e in provider.ledger.executions] == ["ok", "outage", "outage", "ok"]
    assert provider.ledger.billed_calls == 2


def test_slow_outage_multiplies_latency():
    cfg = config(outages=(OutageConfig(start_s=0.0, end_s=10.0, mode="slow", slow_factor=4.0),))
    runtime, provider = make(cfg)

    async def main():
        inside = await outcome_of(provider, request("a"))
        await runtime.sleep(10.0 - runtime.now())
        after = await outcome_of(provider, request("b"))
        return inside[1], after[1]

    assert runtime.run(main()) == (LATENCY_S * 4, 10.0 + LATENCY_S)


def test_outage_rejections_do_not_use_server_quota():
    cfg = config(server_requests_per_min=1, outages=(OutageConfig(start_s=0.0, end_s=0.4),))
    runtime, provider = make(cfg)

    async def main():
        down = await outcome_of(provider, request("a"))
        up = await outcome_of(provider, request("b"))
        return down[0], up[0]

    down, up = runtime.run(main())
    assert isinstance(down, ServerError) and isinstance(up, ProviderResponse)


# ---------------------------------------------------------------- idempotency
def repeated_calls(honours: bool):
    runtime, provider = make(config(honours_idempotency=honours))

    async def main():
        return [await outcome_of(provider, request("same", task_id=f"t{i}")) for i in range(3)]

    return provider, runtime.run(main())


def test_honoured_idempotency_bills_a_repeated_key_once():
    provider, seen = repeated_calls(honours=True)
    assert [when for _, when in seen] == [1.5, 2.0, 2.5]  # replays take the base latency only
    assert seen[0][0] == seen[1][0] == seen[2][0]
    ledger = provider.ledger
    assert [e.outcome for e in ledger.executions] == ["ok", "replay", "replay"]
    assert (ledger.billed_calls, ledger.duplicate_billed_calls, ledger.cost_duplicated) == (1, 0, 0.0)
    assert ledger.results == {"same": seen[0][0].result}
    assert [e.task_id for e in ledger.executions_by_key()["same"]] == ["t0", "t1", "t2"]


def test_ignored_idempotency_bills_every_repeat():
    provider, seen = repeated_calls(honours=False)
    assert [when for _, when in seen] == [1.5, 3.0, 4.5]
    ledger = provider.ledger
    assert [e.outcome for e in ledger.executions] == ["ok", "ok", "ok"]
    assert (ledger.billed_calls, ledger.duplicate_billed_calls) == (3, 2)
    assert ledger.cost_duplicated == pytest.approx(2 * COST)
    assert len(ledger.executions_by_key(billed_only=True)["same"]) == 3


@pytest.mark.parametrize(("honours", "billed"), [(True, 1), (False, 2)])
def test_concurrent_repeat_joins_the_running_execution_when_honoured(honours, billed):
    runtime, provider = make(config(honours_idempotency=honours))

    async def main():
        first = runtime.spawn(outcome_of(provider, request("same", task_id="t1")))
        await runtime.sleep(0.2)
        second = await outcome_of(provider, request("same", task_id="t2"))
        return await first, second

    first, second = runtime.run(main())
    assert first[1] == 1.5
    assert second[1] == (1.5 if honours else 1.7)
    assert first[0].result == second[0].result
    assert provider.ledger.billed_calls == billed


# ---------------------------------------------------------------- lost responses
def test_lost_response_is_billed_and_the_client_hangs():
    runtime, provider = make(config(timeout_prob=1.0))

    async def main():
        timed_out = await outcome_of(provider, request("a"), timeout=5.0)
        hung = await outcome_of(provider, request("b"))
        return timed_out, hung

    (timed_out, t1), (hung, t2) = runtime.run(main())
    assert isinstance(timed_out, TimeoutError) and t1 == 5.0
    assert isinstance(hung, ProviderTimeoutError) and t2 == 5.0 + LATENCY_S + LOST_RESPONSE_HANG_S
    lost_a = provider.ledger.executions[0]
    assert (lost_a.outcome, lost_a.billed, lost_a.response_lost, lost_a.end) == ("ok", True, True, 1.5)
    assert provider.ledger.billed_calls == 2


def schedule_one(cfg: ProviderConfig, retry: RetryPolicy):
    runtime, provider = make(cfg)
    events: list = []
    scheduler = Scheduler(runtime, [provider], retry=retry, rng=random.Random(0), events=events.append)

    async def main():
        handle = scheduler.submit("llm", payload("a"))
        record = await handle.wait()
        await scheduler.close()
        when = runtime.now()
        await runtime.sleep(100.0)  # let the server finish work the client gave up on
        return record, when

    record, when = runtime.run(main())
    attempts = [e for e in events if isinstance(e, AttemptRecord)]
    return provider.ledger, record, when, attempts


LOST_EVERY_TIME = RetryPolicy(backoff=NoBackoff(), max_attempts=3, attempt_timeout_s=5.0)


def test_scheduler_timeouts_on_lost_responses_bill_duplicates_when_keys_are_ignored():
    ledger, record, when, attempts = schedule_one(config(timeout_prob=1.0), LOST_EVERY_TIME)
    assert record.status is TaskStatus.FAILED and record.attempts == 3
    assert [a.outcome for a in attempts] == ["TimeoutError"] * 3
    assert when == 15.0
    assert [e.start for e in ledger.executions] == [0.0, 5.0, 10.0]
    assert all(e.response_lost and e.billed for e in ledger.executions)
    assert (ledger.billed_calls, ledger.duplicate_billed_calls) == (3, 2)
    assert ledger.cost_duplicated == pytest.approx(2 * COST)


def test_scheduler_timeouts_on_lost_responses_bill_once_when_keys_are_honoured():
    cfg = config(timeout_prob=1.0, honours_idempotency=True)
    ledger, record, when, attempts = schedule_one(cfg, LOST_EVERY_TIME)
    assert record.status is TaskStatus.SUCCEEDED and record.attempts == 2
    assert [a.outcome for a in attempts] == ["TimeoutError", "ok"]
    assert when == 5.5  # timeout at 5, replay takes the base latency
    assert record.result == ledger.results[record.key]
    assert [e.outcome for e in ledger.executions] == ["ok", "replay"]
    assert (ledger.billed_calls, ledger.duplicate_billed_calls) == (1, 0)


@pytest.mark.parametrize(("honours", "billed", "status"), [(True, 1, "succeeded"), (False, 3, "failed")])
def test_attempt_timeout_shorter_than_latency(honours, billed, status):
    """The client gives up mid-execution; the server finishes and bills anyway."""
    retry = RetryPolicy(backoff=NoBackoff(), max_attempts=3, attempt_timeout_s=1.0)
    ledger, record, when, _ = schedule_one(config(honours_idempotency=honours), retry)
    assert record.status.value == status
    assert ledger.billed_calls == billed
    # honoured: the retry at 1.0 joins the execution that ends at 1.5
    assert when == (1.5 if honours else 3.0)


def many_tasks_with_lost_responses(honours: bool, seed: int = 9):
    cfg = config(timeout_prob=0.3, honours_idempotency=honours, latency_sigma=0.4)
    runtime, provider = make(cfg, seed=seed)
    retry = RetryPolicy(backoff=NoBackoff(), max_attempts=6, attempt_timeout_s=10.0)
    scheduler = Scheduler(runtime, [provider], retry=retry, rng=random.Random(seed), background_limit=None)

    async def main():
        handles = [scheduler.submit("llm", payload(f"in{i}")) for i in range(40)]
        records = [await h.wait() for h in handles]
        await scheduler.close()
        return records

    return provider.ledger, runtime.run(main())


def test_lost_responses_cost_money_only_without_idempotency():
    ignored, ignored_records = many_tasks_with_lost_responses(honours=False)
    honoured, honoured_records = many_tasks_with_lost_responses(honours=True)
    lost_then_retried = sum(e.response_lost for e in ignored.executions if e.outcome == "ok")
    assert lost_then_retried > 0
    assert ignored.duplicate_billed_calls > 0
    # every duplicate follows a lost response of the same task
    assert ignored.duplicate_billed_calls <= lost_then_retried
    assert honoured.duplicate_billed_calls == 0
    assert honoured.billed_calls == 40
    assert honoured.outcome_counts()["replay"] > 0
    assert all(r.status is TaskStatus.SUCCEEDED for r in honoured_records)
    assert sum(r.status is TaskStatus.SUCCEEDED for r in ignored_records) >= 38


# ---------------------------------------------------------------- lookup
def test_lookup_returns_the_stored_result_and_waits_for_running_work():
    runtime, provider = make(config())

    async def main():
        before = await provider.lookup("a")
        runtime.spawn(provider.call(request("a")))
        await runtime.sleep(0.1)
        during = await provider.lookup("a")
        during_at = runtime.now()
        after = await provider.lookup("a")
        return before, during, during_at, after, runtime.now()

    before, during, during_at, after, end = runtime.run(main())
    assert before is None
    assert (
        during
        == after
        == ProviderResponse(result={"input": "a", "output_units": 100, "provider": "llm"}, usage=200.0)
    )
    assert during_at == 1.5 and end == 1.5  # lookups are free once the work is done
    assert len(provider.ledger) == 1  # lookups are not calls


def test_lookup_finds_nothing_for_failed_calls_other_providers_or_without_support():
    ledger = ProviderLedger()
    runtime = SimPyRuntime()
    a = SimulatedProvider(runtime, config(name="a"), random.Random(0), ledger)
    b = SimulatedProvider(runtime, config(name="b"), random.Random(0), ledger)
    silent = SimulatedProvider(runtime, config(name="c", supports_lookup=False), random.Random(0), ledger)
    broken = SimulatedProvider(runtime, config(name="d", server_error_prob=1.0), random.Random(0), ledger)

    async def main():
        for provider in (a, silent, broken):
            await outcome_of(provider, request("k"))
        return [await p.lookup("k") for p in (a, b, silent, broken)]

    found_a, found_b, found_silent, found_broken = runtime.run(main())
    assert found_a is not None and found_a.result["provider"] == "a"
    assert found_b is None and found_silent is None and found_broken is None
    assert [e.provider for e in ledger] == ["a", "c", "d"]
    assert ledger.results == {"k": found_a.result}
    assert ledger.duplicate_billed_calls == 1  # "a" and "c" both billed key "k"


@pytest.mark.parametrize(("supports_lookup", "completed", "failed"), [(True, 1, 0), (False, 0, 1)])
def test_crash_recovery_completes_orphans_from_lookup_without_a_second_bill(
    supports_lookup, completed, failed
):
    runtime, provider = make(config(latency_per_unit_s=0.1, supports_lookup=supports_lookup))  # 10.5 s
    store = MemoryStore()
    first = Scheduler(runtime, [provider], store=store, rng=random.Random(1))

    async def main():
        handle = first.submit("llm", payload("a"))
        await runtime.sleep(3.0)
        first.crash()  # the client dies mid-call; the server keeps working
        await runtime.sleep(2.0)
        second = Scheduler(runtime, [provider], store=store, rng=random.Random(2))
        report = await second.recover()
        when = runtime.now()
        await second.close()
        await runtime.sleep(100.0)  # let the server finish work nobody waits for any more
        return report, when, store.get(handle.id)

    report, when, record = runtime.run(main())
    assert (report.orphans_completed, report.orphans_failed) == (completed, failed)
    assert when == (10.5 if supports_lookup else 5.0)
    assert record.status is (TaskStatus.SUCCEEDED if supports_lookup else TaskStatus.FAILED)
    assert provider.ledger.billed_calls == 1  # the server did the work either way


# ---------------------------------------------------------------- reproducibility
def ledger_of_mixed_run(seed: int) -> list[Execution]:
    cfg = config(
        latency_sigma=0.5,
        rate_limit_prob=0.05,
        server_error_prob=0.1,
        timeout_prob=0.1,
        server_requests_per_min=40,
        honours_idempotency=False,
    )
    runtime, provider = make(cfg, seed=seed)
    retry = RetryPolicy(max_attempts=6, attempt_timeout_s=10.0)
    scheduler = Scheduler(
        runtime,
        [provider],
        quotas={"llm": QuotaLimits(requests_per_min=60, concurrency=8)},
        retry=retry,
        rng=random.Random(seed),
        background_limit=None,
    )

    async def main():
        handles = []
        for i in range(60):
            handles.append(scheduler.submit("llm", payload(f"in{i % 45}", poison=i % 20 == 7)))
            await runtime.sleep(0.25)
        for h in handles:
            await h.wait()
        await scheduler.close()

    runtime.run(main())
    return provider.ledger.executions


def test_same_seed_gives_an_identical_ledger():
    first = ledger_of_mixed_run(seed=7)
    assert len({e.outcome for e in first}) >= 4
    assert ledger_of_mixed_run(seed=7) == first
    assert ledger_of_mixed_run(seed=8) != first


# ---------------------------------------------------------------- end to end with the scheduler
def run_against_server_quota(client: QuotaLimits, tasks: int = 60, server_rpm: int = 30):
    cfg = config(latency_base_s=0.2, latency_per_unit_s=0.0, server_requests_per_min=server_rpm)
    runtime, provider = make(cfg)
    events: list = []
    scheduler = Scheduler(
        runtime,
        [provider],
        quotas={"llm": client},
        retry=RetryPolicy(max_attempts=20, attempt_timeout_s=30.0),
        rng=random.Random(4),
        events=events.append,
        background_limit=None,
    )

    async def main():
        handles = [scheduler.submit("llm", payload(f"in{i}")) for i in range(tasks)]
        records = [await h.wait() for h in handles]
        await scheduler.close()
        return records

    records = runtime.run(main())
    rate_limited = [e for e in events if isinstance(e, AttemptRecord) and e.outcome == "RateLimitError"]
    return records, rate_limited, provider.ledger, runtime.now()


def test_client_quota_equal_to_server_quota_never_sees_a_429():
    records, rate_limited, ledger, end = run_against_server_quota(
        QuotaLimits(requests_per_min=30, request_burst=1)
    )
    assert all(r.status is TaskStatus.SUCCEEDED for r in records)
    assert rate_limited == [] and ledger.outcome_counts()["rate_limited"] == 0
    assert ledger.billed_calls == 60
    assert end == pytest.approx(59 * 2.0 + 0.2)  # paced at one request per 2 s


def test_client_quota_above_server_quota_gets_429s_that_are_retried():
    records, rate_limited, ledger, _ = run_against_server_quota(
        QuotaLimits(requests_per_min=60, request_burst=1)
    )
    assert all(r.status is TaskStatus.SUCCEEDED for r in records)
    assert len(rate_limited) > 0
    assert all(e.decision == "retry" and e.retry_after_s >= 1.0 for e in rate_limited)
    assert ledger.outcome_counts()["rate_limited"] == len(rate_limited)
    assert ledger.billed_calls == 60 and ledger.duplicate_billed_calls == 0


def test_a_full_minute_client_burst_overruns_a_sliding_window_server():
    """Equal per-minute rates are not enough: a bucket that starts full sends a minute's worth
    at once and then keeps refilling, so some 60 s window sees up to twice the limit."""
    records, rate_limited, _, _ = run_against_server_quota(QuotaLimits(requests_per_min=30))
    assert all(r.status is TaskStatus.SUCCEEDED for r in records)
    assert len(rate_limited) > 0
