"""End to end over real HTTP on 127.0.0.1: the real Scheduler on AsyncioRuntime, HttpProvider,
and the local provider server driven by a ProviderConfig.

Scenario time is compressed with ``time_scale`` on both sides (server and client runtime),
so a minute-long rate-limit window lasts about a second of wall time. Assertions read the
server's ledger: what arrived when, what was executed and what was billed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from aiqsim import (
    AsyncioRuntime,
    ConstantBackoff,
    FullJitter,
    QuotaLimits,
    RetryPolicy,
    Scheduler,
    SimPyRuntime,
    TaskStatus,
)
from aiqsim.core.failures import (
    InvalidRequestError,
    ProviderError,
    ProviderTimeoutError,
    QuotaExhaustedError,
    RateLimitError,
    SchemaViolationError,
    ServerError,
)
from aiqsim.core.task import Priority
from aiqsim.core.token_bucket import MultiQuota
from aiqsim.http import HttpProvider, Ledger, iter_retry_violations, start_local_server
from aiqsim.http.server import CHAT_PATH
from aiqsim.scheduler.provider import ProviderRequest
from aiqsim.sim.config import OutageConfig, ProviderConfig
from aiqsim.sim.providers import WINDOW_S, WINDOW_TOLERANCE_S, SimulatedProvider


def request_for(payload: Any, key: str) -> ProviderRequest:
    return ProviderRequest(
        task_id=key,
        idempotency_key=key,
        kind="llm",
        payload=payload,
        cost_estimate=10.0,
        attempt=1,
        priority=Priority.BACKGROUND,
    )


async def run_clients(
    url: str,
    runtime: AsyncioRuntime,
    clients: dict[str, list[Any]],
    *,
    retry: RetryPolicy,
    concurrency: int = 1,
    seed: int = 0,
) -> dict[str, list[Any]]:
    """One Scheduler + HttpProvider per client, all submitting at once; the final records per client."""
    schedulers: dict[str, Scheduler] = {}
    providers: list[HttpProvider] = []
    handles: dict[str, list[Any]] = {}
    for index, (client, payloads) in enumerate(clients.items()):
        provider = HttpProvider(
            "llm", url, headers={"x-client-id": client}, time_scale=runtime.time_scale, send_task_headers=True
        )
        scheduler = Scheduler(
            runtime,
            [provider],
            quotas={"llm": QuotaLimits(concurrency=concurrency)},
            retry=retry,
            rng=random.Random(seed + index),
            background_limit=None,
        )
        provider.attach_to(scheduler)
        schedulers[client] = scheduler
        providers.append(provider)
        handles[client] = [scheduler.submit("llm", payload) for payload in payloads]
    records = {client: [await handle.wait() for handle in hs] for client, hs in handles.items()}
    for scheduler in schedulers.values():
        await scheduler.close()
    for provider in providers:
        await provider.aclose()
    return records


# ---------------------------------------------------------------------------- 429 storm
def test_429_storm_is_absorbed_and_retry_after_is_honoured() -> None:
    # three clients, 8 tasks each, share a server that admits 8 requests per minute and also
    # throttles 40 % of requests at random: every client has to cross several windows
    config = ProviderConfig(
        name="llm",
        latency_base_s=0.2,
        latency_per_unit_s=0.0,
        server_requests_per_min=8,
        rate_limit_prob=0.4,
        rate_limit_retry_after_s=2.0,
    )
    scale = 0.005  # a 60 s window lasts 0.3 s of wall time
    runtime = AsyncioRuntime(time_scale=scale)
    # the attempt timeout is generous in wall time (1.5 s), so a slow moment on a busy machine
    # cannot turn into a client-side timeout and a second execution
    # every 429 pauses the client's whole lane, which is what iter_retry_violations checks per client
    # (with the adaptive default, a random 429 holds back only the task that saw it)
    retry = RetryPolicy(
        backoff=FullJitter(base_s=0.5, cap_s=5.0),
        max_attempts=30,
        attempt_timeout_s=300.0,
        rate_limit_scope="lane",
    )
    clients = {name: [f"{name} prompt {i}" for i in range(8)] for name in ("a", "b", "c")}
    with start_local_server(config, time_scale=scale, seed=3) as server:
        records = runtime.run(run_clients(server.url, runtime, clients, retry=retry))
        ledger = server.ledger()

    outcomes = ledger.outcomes()
    assert all(r.status is TaskStatus.SUCCEEDED for rs in records.values() for r in rs)
    assert outcomes["ok"] == 24 and len(ledger.bills) == 24
    throttled = [entry for entry in ledger.requests if entry.status == 429]
    assert len(throttled) >= 12, outcomes  # it really was a storm: at least one 429 per two successes
    random_wait = config.rate_limit_retry_after_s * scale  # type: ignore[operator]
    window_waits = [e for e in throttled if e.retry_after_wall != pytest.approx(random_wait)]
    assert len(window_waits) >= 3, "the sliding window must throttle too, with its own Retry-After"
    for client in clients:
        # no request from this client arrived before a 429's Retry-After had passed
        assert list(iter_retry_violations(ledger, client)) == []
    # and the server never admitted more than its limit in any 60 s window. The window runs on the
    # server's admission clock (Execution.start), not on when the HTTP bytes were received: at this
    # time scale 1 ms of wall time between the two is 0.2 s of scenario time on a busy machine.
    admitted = sorted(execution.start for execution in ledger.executions if execution.outcome == "ok")
    for index, start in enumerate(admitted):
        assert len([t for t in admitted[index:] if t < start + WINDOW_S - WINDOW_TOLERANCE_S]) <= 8


def test_with_the_default_scope_each_task_still_waits_out_its_own_retry_after() -> None:
    # random 429s hold back only the task that saw them (rate_limit_scope "adaptive"), but that task's
    # next request never arrives before its Retry-After has passed
    config = ProviderConfig(
        name="llm",
        latency_base_s=0.2,
        latency_per_unit_s=0.0,
        rate_limit_prob=0.4,
        rate_limit_retry_after_s=10.0,
    )
    scale = 0.005
    runtime = AsyncioRuntime(time_scale=scale)
    retry = RetryPolicy(backoff=FullJitter(base_s=0.1, cap_s=1.0), max_attempts=30, attempt_timeout_s=300.0)
    clients = {"a": [f"prompt {i}" for i in range(24)]}
    with start_local_server(config, time_scale=scale, seed=3) as server:
        records = runtime.run(run_clients(server.url, runtime, clients, retry=retry, concurrency=4))
        ledger = server.ledger()
    assert all(r.status is TaskStatus.SUCCEEDED for r in records["a"])
    throttled = [entry for entry in ledger.requests if entry.status == 429]
    assert len(throttled) >= 3, ledger.outcomes()
    by_key: dict[str, list[Any]] = {}
    for entry in sorted(ledger.requests, key=lambda entry: entry.arrived_wall):
        by_key.setdefault(entry.key, []).append(entry)
    for entries in by_key.values():
        not_before = -math.inf
        for entry in entries:
            assert entry.arrived_wall + 1e-3 >= not_before, entry
            if entry.status == 429 and entry.retry_after_wall is not None:
                not_before = entry.responded_wall + entry.retry_after_wall


def test_retry_violation_check_catches_a_client_that_ignores_retry_after() -> None:
    config = ProviderConfig(name="llm", latency_base_s=0.2, latency_per_unit_s=0.0, server_requests_per_min=6)
    scale = 0.01
    runtime = AsyncioRuntime(time_scale=scale)
    impatient = RetryPolicy(
        backoff=ConstantBackoff(0.5), max_attempts=4, honour_retry_after=False, attempt_timeout_s=30.0
    )
    with start_local_server(config, time_scale=scale, seed=0) as server:
        runtime.run(run_clients(server.url, runtime, {"rude": [f"q{i}" for i in range(10)]}, retry=impatient))
        ledger = server.ledger()
    assert list(iter_retry_violations(ledger, "rude")) != []


# ---------------------------------------------------------------------------- duplicates
def test_duplicate_submissions_make_one_request() -> None:
    config = ProviderConfig(name="llm", latency_base_s=1.0, latency_per_unit_s=0.0)
    runtime = AsyncioRuntime(time_scale=0.02)

    async def main(url: str) -> list[Any]:
        provider = HttpProvider("llm", url, time_scale=runtime.time_scale, send_task_headers=True)
        scheduler = Scheduler(
            runtime, [provider], quotas={"llm": QuotaLimits(concurrency=4)}, rng=random.Random(0)
        )
        clicks = [scheduler.submit("llm", "same question") for _ in range(5)]
        first = [await click.wait() for click in clicks]
        later = await scheduler.submit("llm", "same question").wait()
        await scheduler.close()
        await provider.aclose()
        return [*first, later]

    with start_local_server(config, time_scale=0.02) as server:
        records = runtime.run(main(server.url))
        ledger = server.ledger()
    assert Counter(r.status for r in records) == {TaskStatus.SUCCEEDED: 1, TaskStatus.DEDUPED: 5}
    assert {r.result for r in records} == {"echo: same question"}
    (owner,) = [r for r in records if r.status is TaskStatus.SUCCEEDED]
    # Only the owner's attempts reached the server: one, unless a loaded machine made it give up on
    # a late answer (its attempt timeout, 1.2 s of wall time here) and send its key again.
    assert {e.task_id for e in ledger.executions} == {owner.id}, "a duplicate sent its own request"
    assert sorted(e.attempt for e in ledger.executions) == list(range(1, owner.attempts + 1))
    assert len(ledger.requests) == owner.attempts


# ---------------------------------------------------------------------------- lost responses
LOST_SCALE = 0.05
LOST_RETRY = RetryPolicy(backoff=FullJitter(base_s=0.5, cap_s=2.0), max_attempts=10, attempt_timeout_s=10.0)


def lost_response_run(honours: bool, lost_mode: str, seed: int) -> tuple[list[Any], Ledger]:
    config = ProviderConfig(
        name="llm", latency_base_s=0.2, latency_per_unit_s=0.0, timeout_prob=0.3, honours_idempotency=honours
    )
    runtime = AsyncioRuntime(time_scale=LOST_SCALE)
    payloads = {"c": [f"task {i}" for i in range(8)]}
    with start_local_server(config, time_scale=LOST_SCALE, seed=seed, lost_mode=lost_mode) as server:  # type: ignore[arg-type]
        records = runtime.run(run_clients(server.url, runtime, payloads, retry=LOST_RETRY, concurrency=4))
        return records["c"], server.ledger()


@pytest.mark.parametrize("lost_mode", ["hold", "close"])
def test_lost_response_is_billed_once_when_keys_are_honoured(lost_mode: str) -> None:
    records, ledger = lost_response_run(honours=True, lost_mode=lost_mode, seed=0)
    assert all(r.status is TaskStatus.SUCCEEDED for r in records)
    lost = [e for e in ledger.executions if e.response_lost]
    assert lost, "the seed must lose at least one response"
    assert ledger.outcomes().get("replay", 0) >= len(lost)
    for record in records:
        assert ledger.bills_for(record.key) == 1
        assert record.result == f"echo: {record.payload}"
    owners = {record.key: record for record in records}
    for execution in ledger.executions:  # the server saw the scheduler's task ids and attempt numbers
        owner = owners[execution.key]
        assert execution.task_id == owner.id and 1 <= execution.attempt <= owner.attempts
    lost_keys = {e.key for e in lost}
    assert all(r.attempts >= 2 for r in records if r.key in lost_keys)


def test_lost_response_is_billed_again_when_the_server_ignores_keys() -> None:
    records, ledger = lost_response_run(honours=False, lost_mode="hold", seed=0)
    assert all(r.status is TaskStatus.SUCCEEDED for r in records)
    lost_per_key = Counter(e.key for e in ledger.executions if e.response_lost)
    assert lost_per_key, "the seed must lose at least one response"
    assert "replay" not in ledger.outcomes()
    for record in records:
        # Counted by the client's attempt numbers (the server logs them), not by the lost ones
        # alone: on a loaded machine the client may also give up (its attempt timeout, 0.5 s of
        # wall time here) on an answer that was delivered late, and that attempt is billed too.
        # The old count, 1 + lost, failed then; no wall-clock margin can rule that out.
        executions = [e for e in ledger.executions if e.key == record.key]
        attempts = sorted(e.attempt for e in executions)
        assert len(set(attempts)) == len(attempts), "each attempt executed once"
        assert ledger.bills_for(record.key) == len(executions), "every execution billed: keys ignored"
        assert attempts[-1] == record.attempts  # the answer taken came from the last attempt ...
        last = next(e for e in executions if e.attempt == record.attempts)
        assert last.outcome == "ok" and not last.response_lost  # ... which was not lost
        # every lost (but billed) execution was followed by a retry that was executed and billed again
        assert all(e.attempt < record.attempts for e in executions if e.response_lost)
        assert ledger.bills_for(record.key) >= 1 + lost_per_key[record.key]
    assert sum(ledger.bills_for(r.key) for r in records) > len(records)


def test_lookup_finds_work_whose_response_was_lost() -> None:
    config = ProviderConfig(name="llm", latency_base_s=0.1, latency_per_unit_s=0.0, timeout_prob=1.0)

    async def main(url: str) -> tuple[Any, Any, Any]:
        provider = HttpProvider("llm", url, timeout=0.3, lookup_path="/lookup/{key}")
        try:
            with pytest.raises(ProviderTimeoutError):
                await provider.call(request_for("lost work", key="k/1"))
            return await provider.lookup("k/1"), await provider.lookup("never"), None
        finally:
            await provider.aclose()

    with start_local_server(config, time_scale=0.1) as server:
        found, missing, _ = asyncio.run(main(server.url))
        assert server.ledger().executions[0].response_lost
    assert found is not None and found.result == "echo: lost work"
    assert missing is None


# ---------------------------------------------------------------------------- server knobs over HTTP
@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"server_error_prob": 1.0}, ServerError),
        ({"quota_exhausted_prob": 1.0}, QuotaExhaustedError),
        ({"invalid_request_prob": 1.0}, InvalidRequestError),
        ({"rate_limit_prob": 1.0, "rate_limit_retry_after_s": 2.0}, RateLimitError),
        ({"outages": (OutageConfig(start_s=0.0, end_s=1e6, mode="error"),)}, ServerError),
        ({"server_units_per_min": 10.0}, InvalidRequestError),  # one request larger than the minute's budget
    ],
)
def test_server_failure_modes_reach_the_client_as_the_right_errors(
    changes: dict[str, Any], expected: type[ProviderError]
) -> None:
    config = dataclasses.replace(
        ProviderConfig(name="llm", latency_base_s=0.0, latency_per_unit_s=0.0), **changes
    )

    async def main(url: str) -> None:
        provider = HttpProvider("llm", url, time_scale=0.5)
        try:
            await provider.call(
                request_for({"messages": [{"role": "user", "content": "x"}], "max_tokens": 20}, "k")
            )
        finally:
            await provider.aclose()

    with start_local_server(config, time_scale=0.5) as server:
        with pytest.raises(expected) as caught:
            asyncio.run(main(server.url))
        ledger = server.ledger()
    assert ledger.bills == () and len(ledger.requests) == 1
    if expected is RateLimitError:
        assert caught.value.retry_after_s == pytest.approx(2.0)  # 1 wall second at time_scale 0.5


def test_latency_follows_base_plus_per_output_token_in_scaled_time() -> None:
    config = ProviderConfig(name="llm", latency_base_s=0.5, latency_per_unit_s=0.01)
    scale = 0.1
    body = {"messages": [{"role": "user", "content": "abcdefgh"}], "max_tokens": 100}

    async def main(url: str) -> tuple[float, Any]:
        provider = HttpProvider("llm", url)
        try:
            started = time.perf_counter()
            response = await provider.call(request_for(body, "lat"))
            return time.perf_counter() - started, response
        finally:
            await provider.aclose()

    with start_local_server(config, time_scale=scale) as server:
        elapsed, response = asyncio.run(main(server.url))
        execution = server.ledger().executions[0]
    expected_wall = (0.5 + 0.01 * 100) * scale
    assert expected_wall <= elapsed < expected_wall + 0.5
    assert response.usage == 2 + 100  # 8 characters = 2 prompt tokens, plus 100 output tokens
    assert execution.units == 102 and execution.billed
    assert execution.cost == pytest.approx(102 / 1000 * config.price_per_1k_units)


def test_ratelimit_headers_track_the_window_and_correct_the_client_quota() -> None:
    config = ProviderConfig(
        name="llm",
        latency_base_s=0.0,
        latency_per_unit_s=0.0,
        server_requests_per_min=30,
        server_units_per_min=1000,
    )
    quota = MultiQuota(QuotaLimits(requests_per_min=600, tokens_per_min=100_000), now=0.0)
    body = {"messages": [{"role": "user", "content": "x" * 40}], "max_tokens": 10}  # 10 + 10 tokens

    async def main(url: str) -> list[tuple[float, float]]:
        provider = HttpProvider("llm", url, quota=quota, clock=lambda: 0.0)
        levels = []
        try:
            for index in range(5):
                await provider.call(request_for(body, f"k{index}"))
                levels.append(quota.levels(0.0)[:2])
        finally:
            await provider.aclose()
        return levels

    with start_local_server(config, time_scale=1.0) as server:
        levels = asyncio.run(main(server.url))
        connections = server.connections_accepted
    assert levels == [(30.0 - n, 1000.0 - 20.0 * n) for n in range(1, 6)]
    assert connections == 1  # keep-alive: five requests over one connection


def test_ledger_is_served_as_json_and_unknown_routes_are_404() -> None:
    config = ProviderConfig(name="llm", latency_base_s=0.0, latency_per_unit_s=0.0, supports_lookup=False)

    async def main(url: str) -> None:
        provider = HttpProvider("llm", url, lookup_path="/lookup/{key}")
        try:
            await provider.call(request_for("a", "k1"))
            assert await provider.lookup("k1") is None  # this provider offers no lookup
        finally:
            await provider.aclose()

    with start_local_server(config) as server:
        asyncio.run(main(server.url))
        served = httpx.get(server.url + "/ledger").json()
        missing = httpx.get(server.url + "/nothing-here")
        local = server.ledger()
    assert Ledger.from_dict(served) == local
    assert served["total_cost"] == pytest.approx(local.total_cost)
    assert missing.status_code == 404


def test_workload_payloads_pass_through_and_poison_is_a_billed_schema_violation() -> None:
    config = ProviderConfig(name="llm", latency_base_s=0.0, latency_per_unit_s=0.0)
    good = {"input": "a", "prompt_units": 30, "output_units": 12}
    poison = {"input": "b", "prompt_units": 3, "output_units": 5, "poison": True}

    async def main(url: str) -> Any:
        provider = HttpProvider("llm", url)
        assert provider.estimate_cost("llm", good) == 42
        try:
            response = await provider.call(request_for(good, "g"))
            with pytest.raises(SchemaViolationError):
                await provider.call(request_for(poison, "p"))
            return response
        finally:
            await provider.aclose()

    with start_local_server(config) as server:
        response = asyncio.run(main(server.url))
        ledger = server.ledger()
    assert response.result == "echo: a" and response.usage == 42
    assert [(e.key, e.outcome, e.units) for e in ledger.bills] == [
        ("g", "ok", 42),
        ("p", "schema_violation", 8),
    ]


def test_same_config_and_seed_give_the_same_outcomes_in_simulation_and_over_http() -> None:
    """The server runs the simulator's provider model: with the same seed and no time-dependent
    limits, every key meets the same outcomes in virtual and in wall time."""
    config = ProviderConfig(
        name="llm",
        latency_base_s=0.3,
        latency_per_unit_s=0.001,
        rate_limit_prob=0.2,
        rate_limit_retry_after_s=1.0,
        server_error_prob=0.15,
        invalid_request_prob=0.05,
    )
    payloads = [{"input": f"job {i}", "prompt_units": 40 + i, "output_units": 10 + i} for i in range(12)]
    # No call here should ever time out (latencies are ~0.35 s); the attempt timeout is only a
    # safety net, and 300 s (3 s of wall time over HTTP) keeps a stalled moment on a busy machine
    # from turning into a client timeout and a retry that the simulation never made.
    retry = RetryPolicy(backoff=ConstantBackoff(0.5), max_attempts=6, attempt_timeout_s=300.0)
    quotas = {"llm": QuotaLimits(concurrency=1)}

    async def submit_all(scheduler: Scheduler) -> list[Any]:
        handles = [scheduler.submit("llm", payload) for payload in payloads]
        records = [await handle.wait() for handle in handles]
        await scheduler.close()
        return records

    sim_runtime = SimPyRuntime()
    simulated = SimulatedProvider(sim_runtime, config, random.Random(11))
    sim_scheduler = Scheduler(sim_runtime, [simulated], quotas=quotas, retry=retry, rng=random.Random(5))
    sim_records = sim_runtime.run(submit_all(sim_scheduler))

    scale = 0.01
    runtime = AsyncioRuntime(time_scale=scale)
    with start_local_server(config, time_scale=scale, seed=11) as server:

        async def over_http() -> list[Any]:
            provider = HttpProvider("llm", server.url, time_scale=scale)
            scheduler = Scheduler(runtime, [provider], quotas=quotas, retry=retry, rng=random.Random(5))
            try:
                return await submit_all(scheduler)
            finally:
                await provider.aclose()

        http_records = runtime.run(over_http())
        http_ledger = server.ledger()

    # each request's fate depends on its key and how often that key came before, not on when it
    # arrived: the outcomes per key agree even where wall-clock timing interleaves keys differently
    def outcomes_by_key(executions: Any) -> dict[str, list[str]]:
        by_key: dict[str, list[str]] = {}
        for execution in executions:
            by_key.setdefault(execution.key, []).append(execution.outcome)
        return by_key

    assert outcomes_by_key(http_ledger.executions) == outcomes_by_key(simulated.ledger.executions)
    assert len(set(e.outcome for e in http_ledger.executions)) >= 3  # the run exercised several outcomes
    assert [(r.status, r.attempts) for r in http_records] == [(r.status, r.attempts) for r in sim_records]
    assert http_ledger.total_cost == pytest.approx(simulated.ledger.cost_total)


def test_requests_without_a_key_meet_seeded_fates_in_arrival_order() -> None:
    """A client that sends no Idempotency-Key (nor task headers) still gets a reproducible run."""
    config = ProviderConfig(
        name="llm", latency_base_s=0.01, latency_per_unit_s=0.0, rate_limit_prob=0.3, server_error_prob=0.2
    )
    body = {"messages": [{"role": "user", "content": "hello"}]}

    def statuses(seed: int) -> list[int]:
        with start_local_server(config, time_scale=0.01, seed=seed) as server, httpx.Client() as client:
            return [
                client.post(server.url + "/v1/chat/completions", json=body).status_code for _ in range(30)
            ]

    first = statuses(seed=4)
    assert statuses(seed=4) == first
    assert {200, 429, 500} <= set(first)
    assert statuses(seed=5) != first


# ---------------------------------------------------------------------------- header corrections
@pytest.mark.parametrize("attach", [False, True])
def test_header_corrections_never_let_more_through_than_the_client_quota(attach: bool) -> None:
    """With ``attach_to``, every response's ``x-ratelimit-remaining-requests`` used to
    refill the client bucket to its burst, so a client limited to 600/min (burst 10) sent 559
    requests in 5 s to a server allowing 660/min. A token bucket grants at most
    ``burst + rate x t`` in ``t`` seconds; counting the server's arrivals *before* reading the
    client's clock makes that an exact bound, with no timing tolerance. The client quota is
    small against what the loop can send (2/s of client time, 8/s of wall time), so the bug
    shows on a loaded machine too."""
    config = ProviderConfig(
        name="llm", latency_base_s=0.01, latency_per_unit_s=0.0, server_requests_per_min=660
    )
    scale = 0.25  # 4 s of client time in 1 s of wall time
    runtime = AsyncioRuntime(time_scale=scale)
    limits = QuotaLimits(requests_per_min=120, request_burst=10, concurrency=16)
    retry = RetryPolicy(backoff=ConstantBackoff(0.1), max_attempts=3, attempt_timeout_s=60.0)
    horizon_s = 4.0

    async def main(server_url: str, ledger: Any) -> tuple[int, float]:
        provider = HttpProvider("llm", server_url, time_scale=scale)
        scheduler = Scheduler(
            runtime,
            [provider],
            quotas={"llm": limits},
            retry=retry,
            rng=random.Random(5),
            background_limit=None,
        )
        if attach:
            provider.attach_to(scheduler)
        started = runtime.now()
        for index in range(400):
            scheduler.submit("llm", f"prompt {index}", cost_estimate=1)
        await runtime.sleep(horizon_s)
        arrived = len(ledger().requests)  # read before the clock: the bound below is then exact
        elapsed = runtime.now() - started
        await scheduler.close()
        await provider.aclose()
        return arrived, elapsed

    with start_local_server(config, time_scale=scale, seed=1) as server:
        arrived, elapsed = runtime.run(main(server.url, server.ledger))
    bound = 10 + 120 / 60 * elapsed
    assert arrived <= bound + 1e-9, (
        f"{arrived} requests in {elapsed:.2f} s; the client quota allows {bound:.1f}"
    )
    # and the bucket refilled and was used again (the test would pass vacuously for a stalled client)
    assert arrived > 10


def test_every_chat_answer_echoes_the_idempotency_key() -> None:
    """The echo lets HttpProvider refuse an answer that belongs to another request."""
    config = ProviderConfig(name="llm", latency_base_s=0.0, latency_per_unit_s=0.0, rate_limit_prob=0.5)
    body = {"messages": [{"role": "user", "content": "hi"}]}

    async def main(url: str) -> list[tuple[int, str | None]]:
        async with httpx.AsyncClient(base_url=url) as client:
            seen = []
            for index in range(8):
                response = await client.post(
                    CHAT_PATH, json=body, headers={"Idempotency-Key": f"key-{index}"}
                )
                seen.append((response.status_code, response.headers.get("idempotency-key")))
            keyless = await client.post(CHAT_PATH, json=body)
            seen.append((keyless.status_code, keyless.headers.get("idempotency-key")))
            return seen

    with start_local_server(config, seed=4) as server:
        seen = asyncio.run(main(server.url))
    assert [key for _, key in seen] == [f"key-{index}" for index in range(8)] + [None]
    assert {status for status, _ in seen[:8]} == {200, 429}  # 429s echo it too


# ---------------------------------------------------------------------------- connection pool
def run_through_pool(provider_options: dict[str, Any], concurrency: int) -> tuple[int, int, int]:
    """Two waves of ``concurrency`` tasks each through Scheduler + HttpProvider, the second after the
    first has finished (so its connections sat idle in the pool in between); each request takes
    0.5 s, so a whole wave is in flight at once. Returns (accepted connections, requests, most
    requests the server had in flight at once)."""
    config = ProviderConfig(name="llm", latency_base_s=0.5, latency_per_unit_s=0.0)
    runtime = AsyncioRuntime()

    async def main(url: str) -> None:
        provider = HttpProvider("llm", url, timeout=30.0, **provider_options)
        scheduler = Scheduler(
            runtime,
            [provider],
            quotas={"llm": QuotaLimits(concurrency=concurrency)},
            rng=random.Random(6),
            background_limit=None,
        )
        provider.attach_to(scheduler)
        for wave in range(2):
            handles = [
                scheduler.submit("llm", f"wave {wave} {index}", cost_estimate=1)
                for index in range(concurrency)
            ]
            records = [await handle.wait() for handle in handles]
            assert all(record.status is TaskStatus.SUCCEEDED for record in records)
        await scheduler.close()
        await provider.aclose()

    with start_local_server(config, seed=2) as server:
        runtime.run(main(server.url))
        ledger = server.ledger()
        accepted = server.connections_accepted
    steps = sorted(
        [(e.arrived_wall, 1) for e in ledger.requests] + [(e.responded_wall, -1) for e in ledger.requests]
    )
    in_flight = peak = 0
    for _, step in steps:
        in_flight += step
        peak = max(peak, in_flight)
    return accepted, len(ledger.requests), peak


def test_the_pool_keeps_one_connection_per_concurrent_attempt_alive() -> None:
    """httpx's default pool keeps only 20 connections alive, so at concurrency 256 the
    server accepted 4,823 connections for 13,900 requests. Sized from the lane's concurrency, the
    pool keeps every connection of the first wave alive and the second wave reuses them all
    (httpx's default keeps 20, and httpcore 1.0 closes every idle one while more than 20 are open).
    Concurrency 40, not more: httpcore's pool bookkeeping is quadratic in its connections, and on
    a loaded machine a slower second wave would let idle connections reach their 5 s keep-alive
    expiry, which is right to close them but not what this test is about."""
    accepted, requests, peak = run_through_pool({}, concurrency=40)
    assert requests == 80
    assert peak > 30, f"the waves must overlap well above 20 kept-alive connections (peak {peak})"
    assert accepted <= 40, f"{accepted} connections for {requests} requests"


def test_an_explicit_pool_size_wins_over_the_lane_concurrency() -> None:
    accepted, requests, peak = run_through_pool({"max_connections": 8}, concurrency=16)
    assert requests == 32 and accepted <= 8 and peak <= 8


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"stream": "yes"}, "stream must be true or false"),  # not what the API allows
        ({"stream_options": {"include_usage": True}}, "stream_options is only allowed when stream is true"),
        ({"n": 5}, "n=5: this server returns one choice"),  # answered with one choice
        ({"max_tokens": -5}, "max_tokens must be a whole number from 1"),  # billed as 16 tokens
        ({"max_tokens": 10**400}, "max_tokens must be a whole number from 1"),  # a 500, retried, unlogged
        ({"max_tokens": 10**12}, "max_tokens must be a whole number from 1"),  # held the connection
    ],
    ids=["stream", "stream_options", "n", "negative", "huge", "absurd"],
)
def test_requests_this_server_cannot_answer_as_the_api_would_are_a_logged_400(extra: dict, said: str) -> None:
    config = ProviderConfig(name="llm", latency_base_s=0.0, latency_per_unit_s=0.0)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    with start_local_server(config) as server:
        answer = httpx.post(server.url + "/v1/chat/completions", content=json.dumps(body), timeout=10)
        nested = httpx.post(server.url + "/v1/chat/completions", content=b"[" * 100_000, timeout=10)
        ledger = server.ledger()
    assert answer.status_code == 400 and said in answer.json()["error"]["message"]
    assert nested.status_code == 400  # was a 500 'handler failed: RecursionError'
    assert ledger.total_cost == 0


@pytest.mark.parametrize("reports_quota", [True, False])
@pytest.mark.parametrize(
    "window", [{"server_requests_per_min": 2}, {"server_requests_per_min": 100, "rate_limit_prob": 1.0}]
)
def test_a_429_says_over_http_what_it_says_in_the_simulation_about_the_quota(
    reports_quota: bool, window: dict[str, Any]
) -> None:
    """Before: with ``reports_quota = false`` the simulated 429s said nothing about the quota
    (quota_spent None) while the same provider served over HTTP sent x-ratelimit-remaining-*
    anyway, and its 'server quota exceeded' body read as a spent quota: the adaptive rate-limit
    scope paused the lane live and not in the simulation, so compare set different schedulers side
    by side. Both now say the same thing: nothing, or what the quota windows hold."""
    from aiqsim.runtime import SimPyRuntime
    from aiqsim.scheduler.provider import new_request

    config = ProviderConfig(name="llm", latency_base_s=0.01, reports_quota=reports_quota, **window)

    def request(n: int) -> ProviderRequest:
        return new_request(
            f"t{n}", f"k{n}", "llm", {"input": f"q{n}", "prompt_units": 10, "output_units": 5}, 1.0, 1, 0
        )

    runtime = SimPyRuntime()
    simulated = SimulatedProvider(runtime, config, random.Random(0))

    async def simulate_three() -> list[bool | None]:
        said = []
        for n in range(3):
            try:
                await simulated.call(request(n))
            except RateLimitError as error:
                said.append(error.quota_spent)
        return said

    async def serve_three(url: str) -> list[bool | None]:
        said = []
        async with HttpProvider("llm", url) as provider:
            for n in range(3):
                try:
                    await provider.call(request(n))
                except RateLimitError as error:
                    said.append(error.quota_spent)
        return said

    in_simulation = runtime.run(simulate_three())
    with start_local_server(config) as server:
        over_http = asyncio.run(serve_three(server.url))
    assert in_simulation and over_http == in_simulation
    if not reports_quota:
        assert set(over_http) == {None}
