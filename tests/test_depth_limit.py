"""The depth limit counts requests that wait, not those started at once (aiqsim.scheduler.depth_limit).

A fan-out submitted in one instant used to be refused beyond the limit even with free slots (the
lanes' dispatch runs in a later event of the instant, so every request of the burst sat in a queue
when the next one was counted). A limit of 0 now means "start at once or be refused": a loss
system, checked against Erlang B.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from typing import Any

import pytest

from aiqsim import AsyncioRuntime, Priority, QueueFullError, QuotaLimits, Scheduler, SimPyRuntime
from aiqsim.scheduler.job_spec import JobSpec, Stage
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse
from aiqsim.sim.scenario import parse_scenario
from aiqsim.validation.loss import blocking_check, erlang_b, mmck_blocking
from tests.fakes import ScriptedProvider


def _burst(count: int, *, concurrency: int, limit: int, **quota: Any) -> tuple[int, list[str], Any]:
    """Submit ``count`` interactive calls in one instant; (accepted, refusal messages, provider)."""
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0)
    refusals: list[str] = []

    async def main() -> int:
        scheduler = Scheduler(
            runtime,
            [provider],
            quotas={"llm": QuotaLimits(concurrency=concurrency, **quota)},
            interactive_limit=limit,
            rng=random.Random(0),
        )
        handles = []
        for i in range(count):
            try:
                handles.append(scheduler.submit("llm", {"input": f"c{i}"}, priority=Priority.INTERACTIVE))
            except QueueFullError as refusal:
                refusals.append(str(refusal))
        for handle in handles:
            await handle.wait()
        return len(handles)

    return runtime.run(main()), refusals, provider


@pytest.mark.parametrize(
    ("count", "concurrency", "limit", "accepted"),
    [
        (8, 10, 5, 8),  # every call starts at once: none waits, none is refused
        (20, 10, 5, 15),  # ten start, five wait, five are refused
        (5, 3, 0, 3),  # limit 0: three start at once, two would wait and are refused
        (6, 1, 5, 6),  # one starts, five wait
        (7, 1, 5, 6),
    ],
)
def test_a_burst_in_one_instant_is_refused_only_beyond_what_starts_at_once_plus_the_limit(
    count: int, concurrency: int, limit: int, accepted: int
) -> None:
    got, refusals, provider = _burst(count, concurrency=concurrency, limit=limit)
    assert got == accepted and len(refusals) == count - accepted
    assert len(provider.calls) == accepted
    starts = sorted(t for t, _, _ in provider.calls)
    assert starts[: min(concurrency, accepted)] == [0.0] * min(concurrency, accepted)


def test_limit_zero_refusal_says_nothing_may_wait() -> None:
    _, refusals, _ = _burst(2, concurrency=1, limit=0)
    assert len(refusals) == 1
    assert "interactive_limit=0" in refusals[0] and "cannot start this one now" in refusals[0]


def test_limit_zero_counts_the_request_bucket_as_well_as_the_slots() -> None:
    # 3 requests of burst, refilled at 1/s: three start at once, the fourth would wait for the bucket
    got, refusals, _ = _burst(5, concurrency=10, limit=0, requests_per_min=60, request_burst=3)
    assert got == 3 and len(refusals) == 2


def test_a_request_behind_a_waiting_higher_class_waits_and_is_refused_at_limit_zero() -> None:
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0)

    async def main() -> tuple[bool, bool]:
        scheduler = Scheduler(
            runtime,
            [provider],
            quotas={"llm": QuotaLimits(concurrency=1)},
            interactive_limit=None,
            background_limit=0,
            rng=random.Random(0),
        )
        scheduler.submit("llm", {"input": "i0"}, priority=Priority.INTERACTIVE)  # takes the slot
        scheduler.submit("llm", {"input": "i1"}, priority=Priority.INTERACTIVE)  # waits
        await runtime.sleep(0.5)
        with pytest.raises(QueueFullError):
            scheduler.submit("llm", {"input": "b0"})
        await runtime.sleep(2.0)  # both interactive calls are done: the slot is free
        handle = scheduler.submit("llm", {"input": "b1"})
        return (await handle.wait()).status == "succeeded", provider.calls_for("b0") == 0

    assert runtime.run(main()) == (True, True)


def test_a_fan_out_on_asyncio_is_not_refused_while_slots_are_free() -> None:
    class Echo:
        name = "llm"

        async def call(self, request: ProviderRequest) -> ProviderResponse:
            await asyncio.sleep(0.001)
            return ProviderResponse(result=request.payload)

    async def main() -> list[Any]:
        scheduler = Scheduler(
            AsyncioRuntime(),
            [Echo()],
            quotas={"llm": QuotaLimits(concurrency=10)},
            interactive_limit=5,
            rng=random.Random(0),
        )
        handles = [scheduler.submit("llm", i, priority=Priority.INTERACTIVE) for i in range(8)]
        results = [(await handle.wait()).result for handle in handles]
        await scheduler.close()
        return results

    assert asyncio.run(main()) == list(range(8))


def test_a_job_at_limit_zero_starts_when_its_first_stage_can_and_is_refused_when_it_cannot() -> None:
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0)
    spec = JobSpec(
        "pair",
        "1",
        [
            Stage("first", "llm", build=lambda inputs, results: {"input": f"{inputs}-1"}),
            Stage("second", "llm", after=("first",), build=lambda inputs, results: {"input": f"{inputs}-2"}),
        ],
    )

    async def main() -> str:
        scheduler = Scheduler(
            runtime,
            [provider],
            quotas={"llm": QuotaLimits(concurrency=1)},
            background_limit=0,
            rng=random.Random(0),
        )
        job = scheduler.submit_job(spec, "a")
        with pytest.raises(QueueFullError):
            scheduler.submit_job(spec, "b")  # the slot is taken: its first stage would wait
        await job
        return (await scheduler.submit_job(spec, "c")).keys().__repr__()

    assert runtime.run(main()) == "dict_keys(['first', 'second'])"
    assert [name for _, name, _ in provider.calls] == ["a-1", "a-2", "c-1", "c-2"]


@pytest.mark.parametrize(
    ("servers", "load", "published"),
    [(5, 3.0, 0.1101), (10, 8.0, 0.1217), (1, 1.0, 0.5), (20, 15.0, 0.0456)],
)
def test_erlang_b_matches_the_published_table(servers: int, load: float, published: float) -> None:
    assert erlang_b(servers, load) == pytest.approx(published, abs=6e-5)
    assert mmck_blocking(load, 1.0, servers, 0) == pytest.approx(erlang_b(servers, load), rel=1e-12)


def test_mmck_blocking_of_one_server_is_the_geometric_formula() -> None:
    # M/M/1/K: p_K = (1 - rho) rho**K / (1 - rho**(K+1))
    rho, places = 0.8, 4
    expected = (1 - rho) * rho**places / (1 - rho ** (places + 1))
    assert mmck_blocking(0.8, 1.0, 1, places - 1) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("queue_limit", [0, 2])
def test_the_scheduler_refuses_the_share_queueing_theory_predicts(queue_limit: int) -> None:
    result = blocking_check(3.0, 1.0, 4, queue_limit, arrivals=6_000, seeds=range(4))
    assert result.ci_contains_expected, result
    assert abs(result.simulated / result.expected - 1) < 0.06, result


def test_a_scenario_may_set_a_limit_of_zero_and_refuses_a_negative_one() -> None:
    base = {
        "scenario": {"name": "loss", "duration_s": 10.0, "seed": 1},
        "providers": [{"name": "llm"}],
        "workloads": [{"type": "poisson", "provider": "llm", "rate_per_s": 1.0}],
    }
    scenario = parse_scenario({**base, "dispatch": {"background_limit": 0}})
    assert scenario.dispatch.background_limit == 0
    with pytest.raises(Exception, match="background_limit"):
        parse_scenario({**base, "dispatch": {"background_limit": -1}})


def _shared_quota_burst(quota: Any, count: int) -> tuple[int, int]:
    """``count`` background submissions in one instant at ``background_limit=0`` on asyncio."""

    class Echo:
        name = "llm"

        async def call(self, request: ProviderRequest) -> ProviderResponse:
            await asyncio.sleep(0.001)
            return ProviderResponse(result=request.payload)

    async def main() -> tuple[int, int]:
        scheduler = Scheduler(
            AsyncioRuntime(), [Echo()], quotas={"llm": quota}, background_limit=0, rng=random.Random(0)
        )
        handles, refused = [], 0
        for i in range(count):
            try:
                handles.append(scheduler.submit("llm", i))
            except QueueFullError:
                refused += 1
        for handle in handles:
            await handle.wait()
        await scheduler.close()
        return len(handles), refused

    return asyncio.run(main())


def test_limit_zero_with_a_worker_capped_shared_quota_admits_what_its_slots_allow() -> None:
    from aiqsim.core.fleet_quota import SharedMultiQuota, WorkerCappedQuota

    account = SharedMultiQuota(QuotaLimits(concurrency=5))
    assert _shared_quota_burst(WorkerCappedQuota(account, concurrency=2), 4) == (2, 2)


def test_limit_zero_with_a_redis_quota_admits_what_the_account_allows(redis_url: str) -> None:
    # a Redis quota's time_until never says "now": the rule asks can_reserve, or every call was refused
    from aiqsim.fleet import RedisQuota

    name = f"depth-limit-{uuid.uuid4().hex}"  # an account of its own on the shared test server
    quota = RedisQuota(redis_url, name, QuotaLimits(concurrency=2))
    assert _shared_quota_burst(quota, 4) == (2, 2)


# ---------------------------------------------------------------- the trial dispatch (review findings)


def _scheduler(runtime: Any, providers: list[Any], **options: Any) -> Scheduler:
    return Scheduler(runtime, providers, rng=random.Random(0), **options)


def test_a_duplicate_that_promotes_its_queued_owner_is_accepted_when_the_owner_would_start() -> None:
    # limit 0, one free slot: a background call queued this instant would start, and an
    # interactive duplicate moves it into its own class. It stands for its owner: accepted.
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0)

    async def main() -> tuple[str, str]:
        scheduler = _scheduler(
            runtime, [provider], quotas={"llm": QuotaLimits(concurrency=1)}, interactive_limit=0
        )
        owner = scheduler.submit("llm", {"input": "x"})
        duplicate = scheduler.submit("llm", {"input": "x"}, priority=Priority.INTERACTIVE)
        return (await owner.wait()).status, (await duplicate.wait()).status

    assert runtime.run(main()) == ("succeeded", "deduped")
    assert provider.calls == [(0.0, "x", 1)]


def test_a_duplicate_whose_promoted_owner_would_wait_is_refused_at_limit_zero() -> None:
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0)

    async def main() -> list[str]:
        scheduler = _scheduler(
            runtime, [provider], quotas={"llm": QuotaLimits(concurrency=1)}, interactive_limit=0
        )
        scheduler.submit("llm", {"input": "first"}, priority=Priority.INTERACTIVE)  # takes the slot
        scheduler.submit("llm", {"input": "x"})  # waits in the background queue
        with pytest.raises(QueueFullError):
            scheduler.submit("llm", {"input": "x"}, priority=Priority.INTERACTIVE)
        await scheduler.join()
        return [name for _, name, _ in provider.calls]

    assert runtime.run(main()) == ["first", "x"]


@pytest.mark.parametrize("policy", ["sjf", "sjf_aging"])
def test_sjf_at_the_limit_accepts_a_cheaper_call_it_would_start_before_the_queued_ones(policy: str) -> None:
    # 10 tokens of burst, barely refilled. Queued this instant: x (5, starts) and big (8, waits:
    # the one place of interactive_limit=1). A cheap call (3) would start first under SJF: accepted.
    # Before, the queued calls were dispatched first and cheap was refused behind big.
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0)
    from aiqsim.scheduler.dispatch import dispatch_policy_from_name

    async def main() -> list[tuple[float, str]]:
        scheduler = _scheduler(
            runtime,
            [provider],
            quotas={"llm": QuotaLimits(tokens_per_min=0.6, token_burst=10)},
            interactive_limit=1,
            dispatch=dispatch_policy_from_name(policy),
        )
        for name, cost in (("x", 5), ("big", 8), ("cheap", 3)):
            scheduler.submit("llm", {"input": name}, priority=Priority.INTERACTIVE, cost_estimate=cost)
        with pytest.raises(QueueFullError):  # 2 tokens left, big waits: a dearer fourth would wait too
            scheduler.submit("llm", {"input": "late"}, priority=Priority.INTERACTIVE, cost_estimate=9)
        await scheduler.join()
        return [(t, name) for t, name, _ in provider.calls]

    calls = runtime.run(main())
    assert sorted(calls[:2]) == [(0.0, "cheap"), (0.0, "x")]
    assert calls[2][1] == "big" and calls[2][0] > 0.0


def test_a_job_at_limit_zero_counts_every_first_call_on_a_lane() -> None:
    # two first stages on one lane with one slot: the second would wait, so the job is refused
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0)
    spec = JobSpec(
        "twin",
        "1",
        [
            Stage("left", "llm", build=lambda inputs, results: {"input": f"{inputs}-l"}),
            Stage("right", "llm", build=lambda inputs, results: {"input": f"{inputs}-r"}),
        ],
    )

    def run(concurrency: int) -> list[float]:
        async def main() -> None:
            scheduler = _scheduler(
                runtime, [provider], quotas={"llm": QuotaLimits(concurrency=concurrency)}, background_limit=0
            )
            await scheduler.submit_job(spec, f"c{concurrency}")

        provider.calls.clear()
        runtime.run(main())
        return [t for t, _, _ in provider.calls]

    with pytest.raises(QueueFullError):
        run(1)
    assert provider.calls == []
    assert run(2) == [0.0, 0.0]


@pytest.mark.parametrize(("concurrency", "accepted"), [(2, False), (3, True)])
def test_a_fan_out_first_stage_at_limit_zero_is_accepted_only_if_every_element_starts(
    concurrency: int, accepted: bool
) -> None:
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0)
    spec = JobSpec(
        "fan",
        "1",
        [Stage("each", "llm", fan_out=True, build=lambda inputs, results: [{"input": x} for x in inputs])],
    )

    async def main() -> bool:
        scheduler = _scheduler(
            runtime, [provider], quotas={"llm": QuotaLimits(concurrency=concurrency)}, background_limit=0
        )
        try:
            await scheduler.submit_job(spec, ["a", "b", "c"])
        except QueueFullError:
            return False
        return True

    assert runtime.run(main()) is accepted
    assert [t for t, _, _ in provider.calls] == ([0.0] * 3 if accepted else [])


def test_a_check_at_the_limit_starts_nothing_so_a_later_interactive_call_still_goes_first() -> None:
    # one instant: background work queued on lane b, an interactive call on lane a (at its limit),
    # then an interactive call on lane b. The check for the call on a must not start b's
    # background work: b's one slot goes to the interactive call, as the dispatch order says.
    runtime = SimPyRuntime()
    lane_a = ScriptedProvider(runtime, name="a", latency_s=1.0)
    lane_b = ScriptedProvider(runtime, name="b", latency_s=1.0)

    async def main() -> None:
        scheduler = _scheduler(
            runtime,
            [lane_a, lane_b],
            quotas={"a": QuotaLimits(concurrency=1), "b": QuotaLimits(concurrency=1)},
            interactive_limit=0,
        )
        scheduler.submit("b", {"input": "background"})
        scheduler.submit("a", {"input": "on-a"}, priority=Priority.INTERACTIVE)
        scheduler.submit("b", {"input": "on-b"}, priority=Priority.INTERACTIVE)
        await scheduler.join()

    runtime.run(main())
    assert lane_a.calls == [(0.0, "on-a", 1)]
    assert lane_b.calls == [(0.0, "on-b", 1), (1.0, "background", 1)]


def test_a_quota_sample_sink_that_submits_a_duplicate_of_the_starting_task_does_not_start_it_twice() -> None:
    from aiqsim.scheduler.events import QuotaSample

    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0)
    duplicates: list[Any] = []
    scheduler: Scheduler | None = None

    def sink(event: Any) -> None:
        if isinstance(event, QuotaSample) and event.in_flight == 1 and not duplicates:  # the start
            assert scheduler is not None
            duplicates.append(scheduler.submit("llm", {"input": "x"}, priority=Priority.INTERACTIVE))

    async def main() -> tuple[str, str]:
        nonlocal scheduler
        scheduler = _scheduler(runtime, [provider], quotas={"llm": QuotaLimits(concurrency=2)}, events=sink)
        owner = scheduler.submit("llm", {"input": "x"})
        first = (await owner.wait()).status
        second = (await duplicates[0].wait()).status
        scheduler.submit("llm", {"input": "y"})
        scheduler.submit("llm", {"input": "z"})
        await scheduler.join()
        return first, second

    assert runtime.run(main()) == ("succeeded", "deduped")
    # once, and both slots free after: the task started twice held one of them for ever
    assert provider.calls == [(0.0, "x", 1), (1.0, "y", 1), (1.0, "z", 1)]


def test_the_trial_leaves_the_quota_bit_for_bit_as_it_was() -> None:
    from aiqsim.core.quota_trial import QuotaTrial
    from aiqsim.core.token_bucket import MultiQuota

    quota = MultiQuota(QuotaLimits(requests_per_min=7, tokens_per_min=1000, concurrency=3), now=0.0)
    assert quota.try_reserve(0.1, 0.3) is not None
    before = (quota.levels(0.7), quota.in_flight)
    trial = QuotaTrial(quota)
    granted = [trial.try_reserve(0.7, 0.7) for _ in range(4)]
    trial.discard(0.7)
    assert [g is not None for g in granted] == [True, True, False, False]  # 2 slots were free
    assert (quota.levels(0.7), quota.in_flight) == before


class _QueueWithoutOrder:
    """A policy queue with only what the TaskQueue protocol requires (no ``ordered``)."""

    def __init__(self) -> None:
        self._items: list[Any] = []

    def push(self, item: Any) -> None:
        self._items.append(item)

    def peek(self, now: float) -> Any:
        live = [item for item in self._items if not item.removed]
        return live[0] if live else None

    def pop(self, item: Any) -> None:
        item.removed = True

    def __len__(self) -> int:
        return sum(1 for item in self._items if not item.removed)

    def next_change(self, now: float) -> float:
        return float("inf")


class _PolicyWithoutOrder:
    name = "plain"

    def new_queue(self) -> _QueueWithoutOrder:
        return _QueueWithoutOrder()


def test_a_policy_queue_without_order_still_lets_a_background_call_start_at_limit_zero() -> None:
    # the trial shows such a queue's head only; an empty interactive queue must not end the walk
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0)

    async def main() -> list[str]:
        scheduler = _scheduler(
            runtime,
            [provider],
            quotas={"llm": QuotaLimits(concurrency=2)},
            background_limit=0,
            dispatch=_PolicyWithoutOrder(),
        )
        scheduler.submit("llm", {"input": "a"})
        # beyond the head the trial cannot see the order: a second call of the instant is refused
        with pytest.raises(QueueFullError):
            scheduler.submit("llm", {"input": "b"})
        await scheduler.join()
        return [name for _, name, _ in provider.calls]

    assert runtime.run(main()) == ["a"]


def _one_stage_job() -> JobSpec:
    return JobSpec("j", "1", [Stage("s", "llm", build=lambda inputs, results: {"input": "shared"})])


def test_a_job_whose_first_call_is_a_duplicate_of_a_succeeded_task_is_not_refused_at_limit_zero() -> None:
    # its stage task queues nothing (it ends deduped at once), as a duplicate submit is accepted
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0, script={"long": ["hang"]})

    async def main() -> tuple[str, dict[str, Any]]:
        scheduler = _scheduler(
            runtime, [provider], quotas={"llm": QuotaLimits(concurrency=1)}, background_limit=0
        )
        await scheduler.submit_job(_one_stage_job(), "first")
        scheduler.submit("llm", {"input": "long"})  # holds the one slot from now on
        await runtime.sleep(0.1)
        with pytest.raises(QueueFullError):  # a new call would wait
            scheduler.submit("llm", {"input": "new"})
        results = await scheduler.submit_job(_one_stage_job(), "second")
        return str(scheduler.jobs.list()[-1].status), results

    status, results = runtime.run(main())
    assert "succeeded" in status and set(results) == {"s"}
    assert [name for _, name, _ in provider.calls] == ["shared", "long"]


def test_a_job_below_its_limit_builds_its_first_stage_once() -> None:
    counts = {"build": 0, "cost": 0}

    def build(inputs: Any, results: Any) -> list[dict[str, str]]:
        counts["build"] += 1
        return [{"input": f"{inputs}-{index}"} for index in range(3)]

    def cost(payload: Any) -> float:
        counts["cost"] += 1
        return 1.0

    spec = JobSpec("fan", "1", [Stage("each", "llm", fan_out=True, build=build, cost=cost)])

    def run(limit: int | None) -> dict[str, int]:
        counts.update(build=0, cost=0)
        runtime = SimPyRuntime()
        provider = ScriptedProvider(runtime, latency_s=1.0)

        async def main() -> None:
            scheduler = _scheduler(
                runtime, [provider], quotas={"llm": QuotaLimits(concurrency=10)}, background_limit=limit
            )
            await scheduler.submit_job(spec, "x")

        runtime.run(main())
        return dict(counts)

    assert run(None) == run(1000) == {"build": 1, "cost": 3}
    assert run(0)["build"] == 2  # at the limit the trial builds it too: it must know the first calls


_STAGE_X = JobSpec("j", "1", [Stage("s", "llm", build=lambda inputs, results: {"input": "x"})])
"""A job of one stage whose call is ``{"input": "x"}``."""


def _one_slot_at_interactive_limit_zero(runtime: Any, provider: Any) -> Scheduler:
    return _scheduler(runtime, [provider], quotas={"llm": QuotaLimits(concurrency=1)}, interactive_limit=0)


@pytest.mark.parametrize("as_job", [False, True])
def test_an_interactive_duplicate_that_would_promote_a_waiting_owner_is_refused_at_limit_zero(
    as_job: bool,
) -> None:
    # the one slot is taken and a background call waits for it; an interactive duplicate of that
    # call would move it into the interactive queue, where it would wait: refused, as a submit and
    # as a job's first stage alike (a job used to leave the duplicate out and be accepted)
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0)

    async def main() -> tuple[str, int]:
        scheduler = _one_slot_at_interactive_limit_zero(runtime, provider)
        scheduler.submit("llm", {"input": "long"})
        await runtime.sleep(0.1)
        scheduler.submit("llm", {"input": "x"})  # background, waits behind "long"
        await runtime.sleep(0.1)
        try:
            if as_job:
                scheduler.submit_job(_STAGE_X, "in", priority=Priority.INTERACTIVE)
            else:
                scheduler.submit("llm", {"input": "x"}, priority=Priority.INTERACTIVE)
            outcome = "accepted"
        except QueueFullError:
            outcome = "refused"
        await runtime.sleep(0.1)
        waiting = scheduler.queued(Priority.INTERACTIVE)
        await scheduler.join()
        return outcome, waiting

    assert runtime.run(main()) == ("refused", 0)


def test_a_job_whose_duplicate_would_promote_an_owner_that_starts_at_once_is_accepted_at_limit_zero() -> None:
    # a free slot: the queued background owner would start in this instant anyway, in either class
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=1.0)

    async def main() -> dict[str, Any]:
        scheduler = _one_slot_at_interactive_limit_zero(runtime, provider)
        scheduler.submit("llm", {"input": "x"})  # queued this instant, the slot is free
        return await scheduler.submit_job(_STAGE_X, "in", priority=Priority.INTERACTIVE)

    assert runtime.run(main()) == {"s": {"output": "done:x"}}
    assert provider.calls == [(0, "x", 1)]  # one call, shared by the job's stage


def test_a_manual_retry_is_refused_at_the_depth_limit_and_the_task_stays_failed() -> None:
    """retry_failed() queued the task whatever the limit: at background_limit=0 ("start at once or
    be refused") a retried task waited 10 s in the queue where a fresh submission was refused."""
    from aiqsim import QuotaLimits, Scheduler, SimPyRuntime, TaskStatus
    from aiqsim.scheduler.scheduler import QueueFullError
    from tests.fakes import ScriptedProvider

    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime, latency_s=10.0, script={"bad": ["invalid", "ok"]})

    async def body():
        scheduler = Scheduler(
            runtime, [provider], quotas={"llm": QuotaLimits(concurrency=1)}, background_limit=0
        )
        failed = await scheduler.submit("llm", {"input": "bad"}).wait()
        scheduler.submit("llm", {"input": "long"})  # the only slot, until t = 20
        await runtime.sleep(0)
        with pytest.raises(QueueFullError):
            scheduler.retry_failed(failed.id)
        kept = scheduler.store.get(failed.id)
        queued = scheduler.queued()
        await runtime.sleep(15.0)  # the slot is free again: the retry starts at once
        retried = await scheduler.retry_failed(failed.id).wait()
        await scheduler.close()
        return kept, queued, retried

    kept, queued, retried = runtime.run(body())
    assert kept.status is TaskStatus.FAILED and queued == 0
    assert retried.status is TaskStatus.SUCCEEDED and retried.finished_at == 35.0  # sent at 25


def _after_an_instant_first_stage(first: Stage) -> JobSpec:
    return JobSpec(
        "instant",
        "1",
        [
            first,
            Stage("b", "llm", after=("a",), build=lambda inputs, results: {"input": f"b:{results['a']}"}),
        ],
    )


@pytest.mark.parametrize(
    "first",
    [
        Stage("a", "llm", fan_out=True, build=lambda inputs, results: []),  # a document with no parts
        Stage(
            "a", "tts", build=lambda inputs, results: {"input": "done before"}
        ),  # its call succeeded before
    ],
    ids=["empty fan-out", "first call already succeeded"],
)
def test_a_job_whose_first_stage_ends_at_once_is_judged_by_the_stage_it_launches(first: Stage) -> None:
    """A first stage that ends in the submit's instant launches the next one in that instant, so
    the depth limit must judge that one's calls. Before, such a job queued nothing by the limit's
    count and was accepted at limit 0 while its second stage waited (a review's reproduction
    of a report)."""
    runtime = SimPyRuntime()
    llm = ScriptedProvider(runtime, name="llm", latency_s=5.0)
    tts = ScriptedProvider(runtime, name="tts", latency_s=1.0)
    spec = _after_an_instant_first_stage(first)

    async def main() -> tuple[Any, float]:
        scheduler = _scheduler(
            runtime, [llm, tts], quotas={"llm": QuotaLimits(concurrency=1)}, background_limit=0
        )
        await scheduler.submit("tts", {"input": "done before"}, key=None)  # t = 1
        busy = scheduler.submit("llm", {"input": "busy"})  # llm's one slot until t = 6
        await runtime.sleep(0)
        with pytest.raises(QueueFullError, match="background"):
            scheduler.submit_job(spec, "x")  # stage b would wait for the slot
        await busy
        job = scheduler.submit_job(spec, "x")  # t = 6: the slot is free, b starts at once
        started = runtime.now()
        return await job.wait(), started

    record, started = runtime.run(main())
    assert started == pytest.approx(6.0)
    assert record.status.value == "succeeded" and record.finished_at == pytest.approx(11.0)
    assert [when for when, _, _ in llm.calls] == [1.0, 6.0]  # busy, then b: nothing else on llm


def _behind_a_wait_mode_breaker(runtime: Any, concurrency: int, **limits: Any) -> tuple[Scheduler, Any]:
    """A scheduler of one provider, ``llm``, behind a wait-mode circuit breaker that two failed calls
    (inputs ``bad0`` and ``bad1``) open for 60 s; and that breaker."""
    from aiqsim import RetryPolicy
    from aiqsim.overload import CircuitBreaker

    provider = ScriptedProvider(runtime, latency_s=1.0, script={"bad0": ["500"], "bad1": ["500"]})
    breaker = CircuitBreaker(failure_threshold=2, window_s=60, cooldown_s=60, mode="wait")
    scheduler = Scheduler(
        runtime,
        [provider],
        quotas={"llm": QuotaLimits(concurrency=concurrency)},
        gates=[breaker],
        retry=RetryPolicy(max_attempts=1),
        **limits,
    )
    return scheduler, breaker


@pytest.mark.parametrize("limit", [0, 5])
def test_first_attempts_a_wait_mode_gate_holds_back_count_against_the_limit(limit: int) -> None:
    """Before: while a wait-mode circuit breaker was open, every submission was dispatched at once,
    found the gate shut, gave its quota back and slept outside the queues: the depth limit never
    saw them (interactive_limit=5 accepted 200 in 20 s, none refused; review). A first attempt a
    gate holds back waits, so it counts; and a request its gate would hold does not 'start now'."""
    runtime = SimPyRuntime()
    scheduler, breaker = _behind_a_wait_mode_breaker(runtime, 2, interactive_limit=limit)

    async def main() -> tuple[int, int, list[str]]:
        for n in range(2):
            await scheduler.submit("llm", {"input": f"bad{n}"}).wait()
        assert breaker.state("llm", runtime.now()) == "open"
        accepted, refused, handles = 0, 0, []
        for n in range(50):
            await runtime.sleep(0.1)
            try:
                handles.append(scheduler.submit("llm", {"input": f"x{n}"}, priority=Priority.INTERACTIVE))
                accepted += 1
            except QueueFullError:
                refused += 1
        finished = [(await handle.wait()).status.value for handle in handles]
        return accepted, refused, finished

    accepted, refused, finished = runtime.run(main())
    assert (accepted, refused) == (limit, 50 - limit)
    assert finished == ["succeeded"] * limit  # the held ones still run once the breaker lets them


def _open_wait_breaker(runtime: Any, scheduler: Scheduler, provider: str = "llm") -> Any:
    """Fail two calls of ``provider`` so that the scheduler's wait-mode breaker opens."""

    async def fail_twice() -> None:
        for n in range(2):
            await scheduler.submit("llm", {"input": f"bad{n}"}, provider=provider, cost_estimate=1).wait()

    return fail_twice()


def test_a_gated_request_that_would_not_get_its_quota_still_holds_a_shared_lane() -> None:
    """Before (the first version of the gate rule, review): the trial dispatch skipped a queued
    request held by its provider's gate even when the shared quota could not grant it, and so
    accepted a cheap request of the other provider at the limit, which then waited 20 s (the real
    dispatch never skips the policy's choice). A gated request is skipped only once granted."""
    from aiqsim import RetryPolicy
    from aiqsim.core.token_bucket import MultiQuota
    from aiqsim.overload import CircuitBreaker

    runtime = SimPyRuntime()
    a = ScriptedProvider(runtime, name="a", latency_s=1.0, script={"bad0": ["500"], "bad1": ["500"]})
    b = ScriptedProvider(runtime, name="b", latency_s=5.0)
    shared = MultiQuota(QuotaLimits(tokens_per_min=60, token_burst=30))
    breaker = CircuitBreaker(failure_threshold=2, window_s=600, cooldown_s=600, mode="wait")
    scheduler = Scheduler(
        runtime,
        [a, b],
        quotas={"a": shared, "b": shared},
        gates=[breaker],
        retry=RetryPolicy(max_attempts=1),
        background_limit=1,
    )

    async def main() -> str:
        await _open_wait_breaker(runtime, scheduler, "a")
        scheduler.submit(
            "llm", {"input": "hog"}, provider="b", cost_estimate=25, priority=Priority.INTERACTIVE
        )
        await runtime.sleep(0.1)
        scheduler.submit("llm", {"input": "big"}, provider="a", cost_estimate=25)  # waits for tokens
        await runtime.sleep(0.1)
        try:
            scheduler.submit("llm", {"input": "small"}, provider="b", cost_estimate=1)
        except QueueFullError as refused:
            return str(refused)
        return "accepted"

    assert "1 already queued (limit 1)" in runtime.run(main(), until=700)


def test_a_jobs_calls_held_by_a_gate_count_once_and_a_lifted_one_in_its_new_class() -> None:
    """Before (the first version of the gate rule, review): the 5 calls of a fanned-out job held by
    an open breaker counted 5 against the limit (queued, the same job counted once), and a
    held task lifted to interactive by a duplicate still counted as background."""
    spec = JobSpec(
        "fan",
        "1",
        [
            Stage(
                "each",
                "llm",
                fan_out=True,
                build=lambda inputs, _: [{"input": f"{inputs}-{n}"} for n in range(5)],
            )
        ],
    )
    runtime = SimPyRuntime()
    scheduler, _ = _behind_a_wait_mode_breaker(runtime, 5, background_limit=3, interactive_limit=2)

    async def main() -> list[int]:
        await _open_wait_breaker(runtime, scheduler)
        scheduler.submit_job(spec, "A")
        await runtime.sleep(0.01)
        depths = [scheduler._depth(Priority.BACKGROUND)]
        scheduler.submit_job(spec, "B")  # accepted: A counts once
        owner = scheduler.submit("llm", {"input": "x"})
        await runtime.sleep(0.01)
        depths.append(scheduler._depth(Priority.BACKGROUND))
        scheduler.submit("llm", {"input": "x"}, priority=Priority.INTERACTIVE)  # lifts the held owner
        await runtime.sleep(0.01)
        assert scheduler._live[owner.id].record.priority is Priority.INTERACTIVE
        depths += [scheduler._depth(Priority.BACKGROUND), scheduler._depth(Priority.INTERACTIVE)]
        return depths

    assert runtime.run(main(), until=5) == [1, 3, 2, 1]
