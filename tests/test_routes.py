"""Routes across deployments: each policy's choice, on both runtimes, and the retry that moves.

Each scenario runs on SimPy and on asyncio and must give the same assignment of tasks to
deployments (the parity check): the choices read only the lanes' state and the scheduler's rng.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from aiqsim import (
    ConfigurationError,
    ExponentialBackoff,
    NoBackoff,
    QuotaLimits,
    RetryPolicy,
    Route,
    RouteConfigError,
    Scheduler,
    SimPyRuntime,
    TaskStatus,
)
from aiqsim.core.failures import ServerError
from aiqsim.core.routing import DeploymentState, choose_deployment, ewma
from aiqsim.scheduler.jobs import JobSpec, Stage
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse
from tests.runtimes import RUNTIMES, run_on


@dataclass
class Deployment:
    """A deployment that answers after ``latency_s``; inputs in ``fail`` fail with a 500 on it;
    ``hang`` never answer. Records (input, idempotency key) per call."""

    runtime: Any
    name: str
    latency_s: float = 1.0
    fail: frozenset[str] = frozenset()
    hang: frozenset[str] = frozenset()
    kind: str | None = None
    price_per_1k_units: float | None = None
    calls: list[tuple[str, str]] = field(default_factory=list)

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        name = request.payload["input"]
        self.calls.append((name, request.idempotency_key))
        await self.runtime.sleep(10**6 if name in self.hang else self.latency_s)
        if name in self.fail:
            raise ServerError("boom", status=500)
        return ProviderResponse(result={"output": f"{self.name}:{name}"}, usage=request.cost_estimate)


def _retry() -> RetryPolicy:
    return RetryPolicy(
        backoff=ExponentialBackoff(base_s=1.0, cap_s=1.0), max_attempts=3, attempt_timeout_s=None
    )


def _scheduler(runtime: Any, deployments: list[Deployment], route: Route, **kwargs: Any) -> Scheduler:
    concurrency = kwargs.pop("concurrency", {})
    return Scheduler(
        runtime,
        deployments,
        quotas={name: QuotaLimits(concurrency=c) for name, c in concurrency.items()},
        routes={"gpt": route},
        rng=random.Random(11),
        **{"retry": _retry(), **kwargs},
    )


def _burst(policy: str, n: int, route_kwargs: dict[str, Any], concurrency: dict[str, int], **deploy: Any):
    """``n`` tasks submitted at once to route ``gpt`` over deployments a and b: who ran each."""

    async def body(runtime):
        a = Deployment(runtime, "a", **deploy.get("a", {}))
        b = Deployment(runtime, "b", **deploy.get("b", {}))
        scheduler = _scheduler(
            runtime, [a, b], Route(["a", "b"], policy=policy, **route_kwargs), concurrency=concurrency
        )
        handles = [scheduler.submit("gpt", {"input": f"t{i}"}, task_id=f"t{i}") for i in range(n)]
        records = [await handle.wait() for handle in handles]
        await scheduler.close()
        return [record.provider for record in records]

    return body


# ------------------------------------------------------------------------------ the pure rules
def _state(name: str, **values: Any) -> DeploymentState:
    base: dict[str, Any] = dict(
        weight=1.0, in_flight=0, queued=0, concurrency=None, latency_s=None, headroom=1.0, price=0.0
    )
    base.update(values)
    return DeploymentState(name, **base)


def test_each_rule_reads_only_the_states_it_is_given() -> None:
    rng = random.Random(0)
    loaded = [_state("a", in_flight=3, concurrency=4), _state("b", in_flight=2, queued=1, concurrency=8)]
    assert choose_deployment("least_loaded", loaded, rng) == 1  # 3/8 < 3/4
    timed = [_state("a", latency_s=2.0), _state("b", latency_s=0.5), _state("c", latency_s=None)]
    assert choose_deployment("lowest_latency", timed, rng) == 2  # unmeasured first
    assert choose_deployment("lowest_latency", timed[:2], rng) == 1
    unmeasured = [_state("a", queued=2), _state("b")]
    assert choose_deployment("lowest_latency", unmeasured, rng) == 1  # the least loaded unmeasured one
    room = [_state("a", headroom=0.2), _state("b", headroom=0.7)]
    assert choose_deployment("most_headroom", room, rng) == 1
    priced = [_state("a", price=1.0), _state("b", price=0.2, headroom=0.0), _state("c", price=0.5)]
    assert choose_deployment("cheapest", priced, rng) == 2  # b is cheaper but has no quota left
    full = [_state("a", headroom=0.0, queued=4, concurrency=2), _state("b", headroom=0.0, queued=1)]
    assert choose_deployment("cheapest", full, rng) == 1  # none open: the least loaded
    # ties go to the first listed, with no draw
    state = rng.getstate()
    assert choose_deployment("least_loaded", [_state("a"), _state("b")], rng) == 0
    assert rng.getstate() == state
    assert ewma(None, 3.0, 0.2) == 3.0 and ewma(3.0, 1.0, 0.5) == 2.0


def test_weighted_draws_in_proportion_to_the_weights() -> None:
    rng = random.Random(5)
    states = [_state("a", weight=1.0), _state("b", weight=3.0)]
    picks = [choose_deployment("weighted", states, rng) for _ in range(20_000)]
    assert sum(picks) / len(picks) == pytest.approx(0.75, abs=0.01)


# ------------------------------------------------------------------- each policy on both clocks
@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_weighted_route_sends_each_deployment_its_share(runtime_name: str) -> None:
    providers = run_on(runtime_name, _burst("weighted", 200, {"weights": [1, 3]}, {}))
    share_b = providers.count("b") / len(providers)
    assert 0.68 <= share_b <= 0.82
    # parity: the same rng, the same draws, the same assignment on either clock
    assert providers == run_on("simpy", _burst("weighted", 200, {"weights": [1, 3]}, {}))


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_least_loaded_counts_queued_work_per_concurrency_slot(runtime_name: str) -> None:
    providers = run_on(runtime_name, _burst("least_loaded", 8, {}, {"a": 1, "b": 3}))
    # loads (in flight + queued) / concurrency, ties to a: a, b, b, b, a (1 vs 1), b, b, b
    assert providers == ["a", "b", "b", "b", "a", "b", "b", "b"]


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_lowest_latency_learns_the_faster_deployment(runtime_name: str) -> None:
    async def body(runtime):
        a = Deployment(runtime, "a", latency_s=2.0)
        b = Deployment(runtime, "b", latency_s=0.5)
        scheduler = _scheduler(runtime, [a, b], Route(["a", "b"], policy="lowest_latency"))
        chosen = []
        for i in range(6):  # one after another: each choice has seen the service times before it
            chosen.append((await scheduler.submit("gpt", {"input": f"t{i}"}).wait()).provider)
        await scheduler.close()
        return chosen

    # a (both unmeasured: the first), b (unmeasured), then b: its EWMA 0.5 s is below a's 2 s
    assert run_on(runtime_name, body) == ["a", "b", "b", "b", "b", "b"]


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_most_headroom_fills_the_larger_quota(runtime_name: str) -> None:
    providers = run_on(runtime_name, _burst("most_headroom", 8, {}, {"a": 2, "b": 6}))
    # free slots (net of what waits) / concurrency: a 1 vs b 1 (tie: a), then b down to 3/6 (tie
    # with a's 1/2: a), then b
    assert providers == ["a", "b", "b", "b", "a", "b", "b", "b"]


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_cheapest_fills_the_cheaper_deployment_then_spills(runtime_name: str) -> None:
    deploy = {"a": {"price_per_1k_units": 1.0}, "b": {"price_per_1k_units": 0.2}}
    providers = run_on(runtime_name, _burst("cheapest", 6, {}, {"a": 2, "b": 2}, **deploy))
    # b while it has free slots, then a while it has, then the least loaded (ties to a)
    assert providers == ["b", "b", "a", "a", "a", "b"]
    # explicit prices override the providers' own
    providers = run_on(
        runtime_name, _burst("cheapest", 2, {"prices": {"a": 0.1, "b": 0.2}}, {"a": 2, "b": 2})
    )
    assert providers == ["a", "a"]


# -------------------------------------------------------------- retries, keys, recovery, jobs
@pytest.mark.parametrize("runtime_name", RUNTIMES)
@pytest.mark.parametrize("elsewhere", [True, False])
def test_a_retry_moves_to_another_deployment_under_the_same_key(runtime_name: str, elsewhere: bool) -> None:
    async def body(runtime):
        a = Deployment(runtime, "a", fail=frozenset({"x"}))
        b = Deployment(runtime, "b")
        route = Route(["a", "b"], policy="least_loaded", retry_elsewhere=elsewhere)
        scheduler = _scheduler(runtime, [a, b], route)
        record = await scheduler.submit("gpt", {"input": "x"}, task_id="x").wait()
        stored = scheduler.store.get("x")
        await scheduler.close()
        return record, stored, a.calls, b.calls

    record, stored, a_calls, b_calls = run_on(runtime_name, body)
    if elsewhere:
        assert record.status is TaskStatus.SUCCEEDED and record.result == {"output": "b:x"}
        assert stored is not None and stored.provider == "b"  # the deployment that ran it
        assert len(a_calls) == 1 and len(b_calls) == 1
        assert a_calls[0][1] == b_calls[0][1] == record.key  # one idempotency key for both
    else:
        assert record.status is TaskStatus.FAILED and record.provider == "a"
        assert len(a_calls) == 3 and b_calls == []


def test_the_store_names_the_moved_deployment_before_its_call_so_recovery_asks_it() -> None:
    async def body(runtime):
        a = Deployment(runtime, "a", fail=frozenset({"x"}))
        b = Deployment(runtime, "b", hang=frozenset({"x"}))
        scheduler = _scheduler(runtime, [a, b], Route(["a", "b"], policy="weighted", weights=[1000, 1]))
        scheduler.submit("gpt", {"input": "x"}, task_id="x")
        await runtime.sleep(3.0)  # a failed at 1 s, the retry went to b at 2 s and hangs there
        assert b.calls, "the retry should be at b"
        stored = scheduler.store.get("x")
        scheduler.crash()
        lookups: list[str] = []

        class Looking(Deployment):
            async def lookup(self, key: str) -> ProviderResponse | None:
                lookups.append(self.name)
                return ProviderResponse(result={"output": f"{self.name}:kept"}, usage=0)

        deployments = [Looking(runtime, "a"), Looking(runtime, "b")]
        again = Scheduler(runtime, deployments, store=scheduler.store, routes={"gpt": Route(["a", "b"])})
        report = await again.recover()
        return stored, lookups, report, again.store.get("x")

    runtime = SimPyRuntime()
    stored, lookups, report, final = runtime.run(body(runtime))
    assert stored.provider == "b" and stored.status is TaskStatus.RUNNING
    assert lookups == ["b"] and report.orphans_completed == 1
    assert final.result == {"output": "b:kept"}


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_a_job_stage_can_name_a_route(runtime_name: str) -> None:
    def build(inputs: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
        return {"input": f"s:{inputs['x']}"}

    spec = JobSpec("routed", "1", [Stage("s", "gpt", build=build)])

    async def body(runtime):
        a, b = Deployment(runtime, "a"), Deployment(runtime, "b")
        scheduler = _scheduler(runtime, [a, b], Route(["a", "b"], policy="weighted", weights=[1, 1000]))
        results = await scheduler.submit_job(spec, {"x": 1})
        await scheduler.close()
        return results

    assert run_on(runtime_name, body) == {"s": {"output": "b:s:1"}}


# ------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("routes", "names"),
    [
        ({"gpt": Route(["a", "zz"])}, ["routes['gpt'].providers", "zz"]),
        ({"a": Route(["a", "b"])}, ["routes['a']", "provider is named 'a'"]),
        ({"gpt": "a,b"}, ["routes['gpt']", "Route("]),
    ],
)
def test_a_bad_route_is_refused_naming_the_key_before_any_call(routes: Any, names: list[str]) -> None:
    runtime = SimPyRuntime()
    a, b = Deployment(runtime, "a"), Deployment(runtime, "b")
    with pytest.raises(ConfigurationError) as caught:
        Scheduler(runtime, [a, b], routes=routes)
    for name in names:
        assert name in str(caught.value)
    assert a.calls == b.calls == []


def test_a_route_mixing_kinds_is_refused() -> None:
    runtime = SimPyRuntime()
    a, b = Deployment(runtime, "a", kind="llm"), Deployment(runtime, "b", kind="tts")
    with pytest.raises(RouteConfigError, match=r"routes\['gpt'\]\.providers: mixes kinds"):
        Scheduler(runtime, [a, b], routes={"gpt": Route(["a", "b"])})


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"weights": [1, 0]}, "weights: 'b' has 0"),
        ({"weights": [1, -2]}, "weights: 'b' has -2"),
        ({"weights": [1, float("nan")]}, "weights: 'b' has nan"),
        ({"weights": [1]}, "weights: 1 value(s) for 2 provider(s)"),
        ({"weights": {"a": 1, "c": 2}}, "weights: given for ['c']"),
        ({"policy": "fastest"}, "policy: expected one of"),
        ({"retry_elsewhere": "yes"}, "retry_elsewhere"),
        ({"prices": [1, -1]}, "prices: 'b' has -1"),
    ],
)
def test_a_bad_route_setting_is_refused_naming_it(kwargs: dict[str, Any], key: str) -> None:
    with pytest.raises(RouteConfigError) as caught:
        Route(["a", "b"], **kwargs)
    assert key in str(caught.value)


def test_route_providers_must_be_distinct_names() -> None:
    with pytest.raises(RouteConfigError, match="named more than once"):
        Route(["a", "a"])
    with pytest.raises(RouteConfigError, match="at least one"):
        Route([])


@pytest.mark.parametrize("runtime_name", RUNTIMES)
def test_a_routed_task_keeps_its_tenant_in_the_chosen_lane(runtime_name: str) -> None:
    from aiqsim.scheduler import Tenant

    async def body(runtime):
        a, b = Deployment(runtime, "a"), Deployment(runtime, "b")
        scheduler = _scheduler(
            runtime,
            [a, b],
            Route(["a", "b"], policy="least_loaded"),
            concurrency={"a": 1, "b": 1},
            tenants={"acme": Tenant(weight=1), "globex": Tenant(weight=1)},
        )
        # acme queues four on each deployment first; globex's one call still starts second on its lane
        handles = [scheduler.submit("gpt", {"input": f"n{i}"}, tenant="acme") for i in range(8)]
        quiet = scheduler.submit("gpt", {"input": "q"}, tenant="globex")
        record = await quiet.wait()
        for handle in handles:
            await handle.wait()
        await scheduler.close()
        return record, {"a": [name for name, _ in a.calls], "b": [name for name, _ in b.calls]}

    record, calls = run_on(runtime_name, body)
    assert record.status is TaskStatus.SUCCEEDED and record.tenant == "globex"
    lane = calls[record.provider]
    assert len(lane) == 5 and lane.index("q") == 1  # first come, first served it would be last


@pytest.mark.parametrize("group_commit", [False, True])
def test_the_move_is_committed_in_sqlite_before_the_call_reaches_the_new_deployment(
    tmp_path: Any, group_commit: bool
) -> None:
    """What another process (a restart's recovery) reads when the moved call arrives: the row already
    names the deployment that receives it, also when the store stages writes for a group commit."""
    import sqlite3

    from aiqsim.stores.sqlite import SqliteStore

    path = tmp_path / "tasks.sqlite3"
    seen: list[str | None] = []

    def committed_provider() -> str | None:
        with sqlite3.connect(path) as other:  # another connection sees only committed rows
            row = other.execute("SELECT provider FROM tasks WHERE id = 'x'").fetchone()
        return None if row is None else row[0]

    class Checking(Deployment):
        async def call(self, request: ProviderRequest) -> ProviderResponse:
            seen.append(committed_provider())
            return await Deployment.call(self, request)

    async def body(runtime):
        store = SqliteStore(path, group_commit=group_commit)
        a = Checking(runtime, "a", fail=frozenset({"x"}))
        b = Checking(runtime, "b")
        no_wait = RetryPolicy(backoff=NoBackoff(), max_attempts=3, attempt_timeout_s=None)  # sent at once
        scheduler = _scheduler(
            runtime,
            [a, b],
            Route(["a", "b"], weights=[1000, 1]),
            store=store,
            commit_window_s=0.05,
            retry=no_wait,
        )
        record = await scheduler.submit("gpt", {"input": "x"}, task_id="x").wait()
        await scheduler.close()
        store.close()
        return record

    runtime = SimPyRuntime()
    record = runtime.run(body(runtime))
    assert record.status is TaskStatus.SUCCEEDED and record.provider == "b"
    assert seen == ["a", "b"]  # each call found its own deployment committed


@pytest.mark.parametrize("restart", ["recover", "retry"])
def test_a_task_recovered_after_a_restart_still_moves_its_retry(tmp_path: Any, restart: str) -> None:
    """The route is stored with the task (SQLite, closed and opened again by the next process): a
    task that a restart's ``recover()`` resumes, or that is retried by hand after it failed, moves its
    retry to another deployment as before. Kept in memory only, the recovered task retried on the
    deployment it had, which failed it again (retry_elsewhere lost across the restart)."""
    from aiqsim.stores.sqlite import SqliteStore

    path = tmp_path / "tasks.sqlite3"

    async def body(runtime: Any) -> Any:
        store = SqliteStore(path)
        first = [Deployment(runtime, "a", fail=frozenset({"x"})), Deployment(runtime, "b")]
        before = _scheduler(runtime, first, Route(["a", "b"], weights=[1000, 1]), store=store)
        if restart == "recover":
            before.submit("gpt", {"input": "x"}, task_id="x")  # queued on a; nothing runs before the crash
            before.crash()
        else:
            no_retry = RetryPolicy(max_attempts=1, attempt_timeout_s=None)
            failed = await before.submit("gpt", {"input": "x"}, task_id="x", retry=no_retry).wait()
            assert failed.status is TaskStatus.FAILED and failed.provider == "a"
            await before.close()
        stored = store.get("x")
        store.close()
        store = SqliteStore(path)  # the next process
        a, b = Deployment(runtime, "a", fail=frozenset({"x"})), Deployment(runtime, "b")
        after = _scheduler(runtime, [a, b], Route(["a", "b"], weights=[1000, 1]), store=store)
        if restart == "recover":
            await after.recover()
            handle = after.submission("x")
        else:
            handle = after.retry_failed("x")
        assert handle is not None
        record = await handle.wait()
        await after.close()
        final = store.get("x")
        store.close()
        return stored, record, final, a.calls, b.calls

    runtime = SimPyRuntime()
    stored, record, final, a_calls, b_calls = runtime.run(body(runtime))
    assert stored.route == "gpt" and stored.provider == "a"
    assert record.status is TaskStatus.SUCCEEDED and record.result == {"output": "b:x"}
    assert len(a_calls) == 1 and len(b_calls) == 1  # failed once on a, then moved to b
    assert final.provider == "b" and final.route == "gpt"


def test_a_recovered_task_whose_route_is_gone_stays_on_its_deployment(tmp_path: Any) -> None:
    """The next process has no route of that name: the task keeps its deployment for its retries."""
    from aiqsim.stores.sqlite import SqliteStore

    path = tmp_path / "tasks.sqlite3"

    async def body(runtime: Any) -> Any:
        store = SqliteStore(path)
        before = _scheduler(
            runtime,
            [Deployment(runtime, "a"), Deployment(runtime, "b")],
            Route(["a", "b"], weights=[1000, 1]),
            store=store,
        )
        before.submit("gpt", {"input": "x"}, task_id="x")
        before.crash()
        store.close()
        store = SqliteStore(path)
        a, b = Deployment(runtime, "a", fail=frozenset({"x"})), Deployment(runtime, "b")
        after = Scheduler(runtime, [a, b], store=store, retry=_retry(), rng=random.Random(11))
        await after.recover()
        record = await after.submission("x").wait()  # type: ignore[union-attr]
        await after.close()
        store.close()
        return record, a.calls, b.calls

    runtime = SimPyRuntime()
    record, a_calls, b_calls = runtime.run(body(runtime))
    assert record.status is TaskStatus.FAILED and record.provider == "a"
    assert len(a_calls) == 3 and b_calls == []
