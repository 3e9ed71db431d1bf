"""The simulated provider's fast paths give what the general code gives.

Each fast path skips work for the usual case (a plain payload, a provider without server windows
or outages); these tests drive both the fast and the general path and compare them, so a change to
one that the other does not follow fails here instead of shifting simulated results.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import math
import random
import struct
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiqsim.core.failures import InvalidRequestError, ProviderError
from aiqsim.core.ratelimit import RateLimitSnapshot
from aiqsim.core.task import Priority
from aiqsim.runtime import SimPyRuntime
from aiqsim.scheduler.provider import ProviderRequest
from aiqsim.sim.config import OutageConfig, ProviderConfig
from aiqsim.sim.providers import DRAWS_PER_CALL, SimJob, SimulatedProvider, _Draws


class _Units(enum.IntEnum):
    TEN = 10


class _Text(str):
    pass


# Payload fields as callers might pass them: the plain types of the fast path and everything the
# general path converts or refuses (bools and int subclasses as units, negative units, non-str
# input, truthy non-bool poison, missing keys).
units = st.integers(min_value=-3, max_value=10**6) | st.booleans() | st.just(_Units.TEN) | st.floats(0, 9)
texts = st.text(max_size=5) | st.text(max_size=3).map(_Text) | st.integers() | st.none()
poisons = st.booleans() | st.integers(-1, 2) | st.text(max_size=2) | st.none()
payloads = st.fixed_dictionaries(
    {},
    optional={"input": texts, "prompt_units": units, "output_units": units, "poison": poisons, "x": units},
) | st.one_of(st.none(), st.lists(st.integers(), max_size=2), st.text(max_size=3))


def _outcome(build: Any, payload: Any) -> Any:
    try:
        job = build(payload)
    except InvalidRequestError as error:
        return ("InvalidRequestError", str(error))
    return (job, [type(getattr(job, name)) for name in ("input", "prompt_units", "output_units", "poison")])


@given(payload=payloads)
def test_from_payload_equals_the_full_checks(payload: Any) -> None:
    assert _outcome(SimJob.from_payload, payload) == _outcome(SimJob._checked, payload)


def test_from_payload_takes_the_fast_path_only_for_plain_payloads(monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[Any] = []
    general = SimJob._checked.__func__  # type: ignore[attr-defined]

    def spy(cls: type[SimJob], payload: Any) -> SimJob:
        checked.append(payload)
        return general(cls, payload)

    monkeypatch.setattr(SimJob, "_checked", classmethod(spy))
    plain = {"input": "a", "prompt_units": 1, "output_units": 2, "poison": True}
    assert SimJob.from_payload(plain) == SimJob("a", 1, 2, True)
    assert checked == []
    for other in (
        {"input": 3, "prompt_units": 1, "output_units": 2},
        {"input": "a", "prompt_units": True, "output_units": 2},
        {"input": "a", "prompt_units": _Units.TEN, "output_units": 2},
    ):
        with contextlib.suppress(InvalidRequestError):  # a bool is no unit count: refused
            SimJob.from_payload(other)
    assert len(checked) == 3


def test_draws_are_the_documented_keyed_hash() -> None:
    # The recipe written out independently: blake2b(f"{arrival}\0{key}", key=secret), 8 bytes per
    # draw, little-endian, top 53 bits / 2**53.
    rng = random.Random(7)
    for _ in range(50):
        secret = rng.randbytes(32)
        key = "".join(chr(rng.randrange(32, 0x3000)) for _ in range(rng.randrange(0, 12)))
        arrival = rng.randrange(0, 5)
        digest = hashlib.blake2b(
            f"{arrival}\0{key}".encode("utf-8", "surrogatepass"), key=secret, digest_size=8 * DRAWS_PER_CALL
        ).digest()
        words = struct.unpack(f"<{DRAWS_PER_CALL}Q", digest)
        expected = [(word >> 11) / 2**53 for word in words]
        draws = _Draws.for_request(secret, key, arrival)
        got = [
            draws.rate_limit,
            draws.quota_exhausted,
            draws.invalid_request,
            draws.server_error,
            draws.response_lost,
            draws.noise,
        ]
        assert got == expected


def _snapshot_from_window_usage(provider: SimulatedProvider, now: float) -> RateLimitSnapshot | None:
    """The snapshot as the provider built it before its fast path: from ``window_usage``."""
    windows = provider.window_usage(now)
    if not windows:
        return None
    fields: dict[str, float] = {}
    for name, (limit, used, reset) in windows.items():
        suffix = "requests" if name == "requests" else "tokens"
        fields[f"limit_{suffix}"] = limit
        fields[f"remaining_{suffix}"] = float(math.floor(max(0.0, limit - used)))
        fields[f"reset_{suffix}_s"] = reset
    return RateLimitSnapshot(**fields)


@pytest.mark.parametrize(("rpm", "upm"), [(None, None), (5, None), (None, 700), (4, 500)])
def test_ratelimit_snapshot_matches_the_window_usage_it_reports(rpm: int | None, upm: int | None) -> None:
    base = ProviderConfig(name="llm", latency_base_s=0.5, latency_per_unit_s=0.0, price_per_1k_units=1.0)
    cfg = replace(base, server_requests_per_min=rpm, server_units_per_min=upm)
    runtime = SimPyRuntime()
    provider = SimulatedProvider(runtime, cfg, random.Random(0))
    rng = random.Random(1)
    now = 0.0
    for _ in range(60):  # admissions and expiries at uneven times, so used/remaining/reset vary
        now += rng.expovariate(0.5)
        units = rng.randrange(1, 200)
        if provider._quota_wait(units, now) is None:
            provider._admit(units, now)
        snapshot = provider.ratelimit_snapshot(now)
        assert snapshot == _snapshot_from_window_usage(provider, now)
        assert (snapshot is None) == (rpm is None and upm is None)


def test_outage_lookup_without_outages_and_with_them() -> None:
    base = ProviderConfig(name="llm", latency_base_s=0.5, latency_per_unit_s=0.0, price_per_1k_units=1.0)
    runtime = SimPyRuntime()
    none = SimulatedProvider(runtime, base, random.Random(0))
    assert none._outage_at(5.0) is None
    slow = OutageConfig(start_s=1.0, end_s=10.0, mode="slow", slow_factor=3.0)
    error = OutageConfig(start_s=4.0, end_s=6.0, mode="error")
    some = SimulatedProvider(runtime, replace(base, outages=(slow, error)), random.Random(0))
    assert [some._outage_at(t) for t in (0.5, 2.0, 5.0, 6.0, 10.0)] == [None, slow, error, slow, None]


def test_a_recorded_execution_names_its_fields() -> None:
    # The provider builds Execution (and RateLimitSnapshot) positionally: a field order change
    # must show here, not as swapped columns in the calls frame.
    cfg = ProviderConfig(
        name="llm",
        latency_base_s=0.5,
        latency_per_unit_s=0.01,
        latency_sigma=0.0,
        price_per_1k_units=2.0,
        timeout_prob=1.0,
        server_requests_per_min=10,
    )
    runtime = SimPyRuntime()
    provider = SimulatedProvider(runtime, cfg, random.Random(0))
    body = {"input": "a", "prompt_units": 30, "output_units": 70}
    request = ProviderRequest(
        task_id="task-1",
        idempotency_key="key-1",
        kind="llm",
        payload=body,
        cost_estimate=100.0,
        attempt=3,
        priority=Priority.BACKGROUND,
    )

    async def main() -> None:
        await runtime.sleep(2.0)
        try:
            await runtime.wait_for(provider.call(request), 5.0)
        except TimeoutError:
            pass

    runtime.run(main())
    (execution,) = provider.ledger.executions
    assert execution.provider == "llm"
    assert (execution.task_id, execution.key, execution.attempt) == ("task-1", "key-1", 3)
    assert (execution.start, execution.end, execution.service_s) == (2.0, 3.2, pytest.approx(1.2))
    assert execution.outcome == "ok" and execution.billed and execution.response_lost
    assert (execution.units, execution.cost) == (100, pytest.approx(0.2))
    snapshot = provider.ratelimit_snapshot(3.2)
    assert (snapshot.limit_requests, snapshot.remaining_requests, snapshot.reset_requests_s) == (
        10.0,
        9.0,
        pytest.approx(58.8),
    )
    assert snapshot.limit_tokens is None and snapshot.remaining_tokens is None


def test_a_provider_draws_what_the_pure_function_draws() -> None:
    # The provider hashes from a keyed state built once (copied per request); the documented pure
    # function builds it per call. Same draws for every key and arrival, lone surrogates included.
    cfg = ProviderConfig(name="llm", latency_base_s=0.5, latency_per_unit_s=0.0, price_per_1k_units=1.0)
    provider = SimulatedProvider(SimPyRuntime(), cfg, random.Random(5))
    rng = random.Random(6)
    for number in range(200):
        key = f"k{rng.randrange(20)}" if number % 7 else "\ud800-lone"
        arrival = provider._arrivals.get(key, 0)
        request = ProviderRequest(
            task_id="t",
            idempotency_key=key,
            kind="llm",
            payload={},
            cost_estimate=1.0,
            attempt=1,
            priority=Priority.BACKGROUND,
        )
        assert provider._draws(request) == _Draws.for_request(provider._draw_secret, key, arrival)


@pytest.mark.parametrize(("rpm", "upm"), [(None, None), (30, None), (None, 4000), (30, 4000)])
def test_every_answer_carries_the_snapshot_of_its_instant(rpm: int | None, upm: int | None) -> None:
    # call() skips the snapshot when the provider has no server windows (the usual case) and attaches
    # one otherwise: both paths, for responses and for errors, against the snapshot built from
    # window_usage at the instant of the answer. A lost response is no answer and carries nothing.
    cfg = ProviderConfig(
        name="llm",
        latency_base_s=0.5,
        latency_per_unit_s=0.01,
        latency_sigma=0.3,
        price_per_1k_units=1.0,
        server_error_prob=0.2,
        timeout_prob=0.1,
        server_requests_per_min=rpm,
        server_units_per_min=upm,
    )
    runtime = SimPyRuntime()
    provider = SimulatedProvider(runtime, cfg, random.Random(3))
    answers: list[tuple[str, Any, Any]] = []

    async def client(number: int) -> None:
        await runtime.sleep(number * 0.7)
        body = {"input": f"x{number}", "prompt_units": 20 * (number % 5), "output_units": 40}
        request = ProviderRequest(f"t{number}", f"k{number % 9}", "llm", body, 1.0, 1, Priority.BACKGROUND)
        try:
            response = await runtime.wait_for(provider.call(request), 30.0)
        except TimeoutError:
            answers.append(("lost", None, None))
            return
        except ProviderError as error:  # every answered error carries the snapshot
            answers.append(
                (type(error).__name__, error.ratelimit, _snapshot_from_window_usage(provider, runtime.now()))
            )
            return
        answers.append(("ok", response.ratelimit, _snapshot_from_window_usage(provider, runtime.now())))

    async def main() -> None:
        tasks = [runtime.spawn(client(number)) for number in range(60)]
        for task in tasks:
            await task

    runtime.run(main())
    kinds = {kind for kind, _, _ in answers}
    assert {"ok", "ServerError", "lost"} <= kinds
    if rpm is not None:
        assert "RateLimitError" in kinds  # ~85 requests a minute against 30: the window refuses some
    for kind, attached, expected in answers:
        if kind != "lost":
            assert attached == expected
            assert (attached is None) == (rpm is None and upm is None)


@pytest.mark.parametrize("direct", [True, False])
def test_lognormal_noise_is_the_normal_dists_quantile_either_way(
    monkeypatch: pytest.MonkeyPatch, direct: bool
) -> None:
    # lognormal_noise calls the function NormalDist.inv_cdf ends in directly when the Python has it
    # (and the method otherwise): both give exp(sigma * NormalDist().inv_cdf(p) - sigma^2 / 2) bit for
    # bit, over the whole range of draws (the clamped ends included).
    import statistics

    from aiqsim.sim import providers

    assert providers._NORMAL_QUANTILE is getattr(statistics, "_normal_dist_inv_cdf", None)
    if not direct:
        monkeypatch.setattr(providers, "_NORMAL_QUANTILE", None)
    standard = statistics.NormalDist()
    rng = random.Random(11)
    draws = [0.0, 1e-300, 1e-12, 0.5, 1.0 - 1e-12, 1.0 - 2**-53] + [rng.random() for _ in range(2000)]
    for sigma in (0.0, 0.05, 0.4, 1.5):
        for uniform in draws:
            p = min(max(uniform, 1e-12), 1.0 - 1e-12)
            expected = 1.0 if sigma == 0 else math.exp(sigma * standard.inv_cdf(p) - 0.5 * sigma * sigma)
            assert providers.lognormal_noise(sigma, uniform) == expected
