"""The simulator tells the truth: queueing theory and the AWS backoff study, reproduced.

M/M/c: the production scheduler on the SimPy runtime must (a) replay the textbook FIFO
multi-server recursion task by task on the same random draws, and (b) match the Erlang C mean
wait within 3%. Backoff: aiqsim's backoff objects must reproduce the findings of Marc Brooker's
"Exponential Backoff And Jitter" (AWS Architecture Blog, 2015).
"""

from __future__ import annotations

import heapq
import math
import random
import time
from fractions import Fraction
from pathlib import Path

import pytest

from aiqsim.core.backoff import ExponentialBackoff, FullJitter, NoBackoff
from aiqsim.core.errors import ConfigurationError
from aiqsim.core.task import TaskRecord, TaskStatus
from aiqsim.runtime import Cancelled, Signal, SimPyRuntime
from aiqsim.validation import (
    AntitheticRandom,
    Replication,
    aws_jitter_study,
    erlang_c,
    expected_wait_in_queue,
    mmc_check,
    run_means,
    run_occ_contention,
    simulate_replication,
    simulate_waits,
    t_quantile_975,
    wait_sensitivity,
)
from aiqsim.validation.mmc import _t_quantile_975_table, erlang_b

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------- Erlang C


def erlang_c_textbook(servers: int, offered_load: Fraction) -> Fraction:
    """The Erlang C formula as printed in textbooks, in exact rational arithmetic."""
    top = offered_load**servers / math.factorial(servers) * Fraction(servers) / (servers - offered_load)
    bottom = sum(offered_load**k / math.factorial(k) for k in range(servers)) + top
    return top / bottom


@pytest.mark.parametrize("load", [0.05, 0.5, 0.7, 0.99])
def test_erlang_c_with_one_server_is_the_utilisation(load: float) -> None:
    assert erlang_c(1, load) == pytest.approx(load, rel=1e-12)


@pytest.mark.parametrize("load", [0.2, 1.0, 1.6, 1.95])
def test_erlang_c_with_two_servers_matches_the_closed_form(load: float) -> None:
    # M/M/2: P(wait) = a^2 / (2 + a)
    assert erlang_c(2, load) == pytest.approx(load**2 / (2 + load), rel=1e-12)
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3, rel=1e-12)


@pytest.mark.parametrize(
    ("servers", "load"),
    [
        (4, Fraction(16, 5)),
        (10, Fraction(8)),
        (25, Fraction(47, 2)),
        (100, Fraction(90)),
        (300, Fraction(290)),
    ],
)
def test_erlang_c_matches_the_textbook_sum(servers: int, load: Fraction) -> None:
    assert erlang_c(servers, float(load)) == pytest.approx(float(erlang_c_textbook(servers, load)), rel=1e-9)


def test_erlang_c_rejects_unstable_or_meaningless_queues() -> None:
    assert erlang_c(3, 0.0) == 0.0
    with pytest.raises(ValueError, match="unstable"):
        erlang_c(4, 4.0)
    with pytest.raises(ValueError, match="servers"):
        erlang_c(0, 0.5)
    with pytest.raises(ValueError, match="offered_load"):
        erlang_c(2, -1.0)
    with pytest.raises(ValueError, match="offered_load"):
        erlang_c(2, math.nan)


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ((True, 0.0), "servers"),  # a boolean is not a number of servers, even where the load is 0
        (("8", 1.0), "servers"),
        ((math.inf, 1.0), "servers"),
        ((2.5, 1.0), "servers"),
        ((8, True), "offered_load"),
    ],
)
def test_erlang_formulas_refuse_what_is_not_a_queue_with_a_project_error(
    arguments: tuple[object, object], named: str
) -> None:
    for formula in (erlang_b, erlang_c):
        with pytest.raises(ConfigurationError, match=named):
            formula(*arguments)  # type: ignore[arg-type]
    assert erlang_c(8.0, 7.0) == erlang_c(8, 7.0)  # a whole float is a number of servers


@pytest.mark.parametrize(
    ("arrival", "service", "named"),
    [(1.0, 0.0, "service_rate"), (1.0, -1.0, "service_rate"), (math.nan, 1.0, "arrival_rate"),
     (-1.0, 1.0, "arrival_rate"), (1.0, math.inf, "service_rate")],
)  # fmt: skip
def test_expected_wait_refuses_rates_that_are_not_rates(arrival: float, service: float, named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):  # 0 used to raise a bare ZeroDivisionError
        expected_wait_in_queue(arrival, service, 2)


def test_expected_wait_is_erlang_c_over_spare_capacity() -> None:
    # M/M/1 with lambda 0.7, mu 1: Wq = rho / (mu - lambda)
    assert expected_wait_in_queue(0.7, 1.0, 1) == pytest.approx(0.7 / 0.3, rel=1e-12)
    # Rates in other units scale the wait inversely
    assert expected_wait_in_queue(7.0, 10.0, 1) == pytest.approx(0.07 / 0.3, rel=1e-12)


def test_t_quantile_fallback_matches_scipy_for_every_df() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    for df in [*range(1, 300), 500, 1_000, 10_000, 10**6]:
        # the fallback used to round df up to an anchor (31 -> 40): 2.021 instead of 2.0395, too narrow
        assert _t_quantile_975_table(df) == pytest.approx(scipy_stats.t.ppf(0.975, df), abs=1e-7)
    for df in range(1, 31):
        assert t_quantile_975(df) == pytest.approx(scipy_stats.t.ppf(0.975, df), rel=1e-9)
    with pytest.raises(ValueError):
        t_quantile_975(0)


def test_wait_sensitivity_matches_the_mm1_derivatives() -> None:
    # M/M/1: Wq(S, A) = S^2 / (A - S) for mean service S and mean inter-arrival A
    s, a = 1.0, 1 / 0.7
    d_service, d_gap = wait_sensitivity(0.7, 1.0, 1)
    assert d_service == pytest.approx((2 * s * (a - s) + s * s) / (a - s) ** 2, rel=1e-5)
    assert d_gap == pytest.approx(-(s * s) / (a - s) ** 2, rel=1e-5)


def test_run_means_measures_waits_from_records_and_inputs_from_draws() -> None:
    def done(created: float, started: float, finished: float) -> TaskRecord:
        return TaskRecord(
            id=f"t{created}",
            key=f"k{created}",
            kind="mmc",
            provider="mmc",
            status=TaskStatus.SUCCEEDED,
            created_at=created,
            started_at=started,
            finished_at=finished,
        )

    records = [done(1.0, 1.0, 3.0), done(2.0, 3.0, 4.0), done(4.0, 4.0, 4.5), done(7.0, 8.0, 10.0)]
    # draws deliberately unlike the records: the controls must come from the inputs only
    replication = Replication(records, interarrival_draws=[1, 2, 4, 6], service_draws=[9, 1, 3, 5])
    means = run_means(replication, warmup=1)
    assert means.wait == pytest.approx((1.0 + 0.0 + 1.0) / 3)
    assert means.service == pytest.approx((1 + 3 + 5) / 3)
    assert means.interarrival == pytest.approx((2 + 4 + 6) / 3)


def test_replication_inputs_match_what_the_scheduler_recorded() -> None:
    replication = simulate_replication(3.2, 1.0, 4, 500, seed=5)
    records = replication.records
    assert [r.finished_at - r.started_at for r in records] == pytest.approx(replication.service_draws)
    created = [r.created_at for r in records]
    gaps = [b - a for a, b in zip([0.0, *created[:-1]], created, strict=True)]
    assert gaps == pytest.approx(replication.interarrival_draws)


def test_antithetic_stream_mirrors_the_plain_stream() -> None:
    plain, mirror = random.Random("s"), AntitheticRandom("s")
    for _ in range(1000):
        u, v = plain.random(), mirror.random()
        assert 0.0 <= v < 1.0
        assert u + v == pytest.approx(1.0, abs=1e-15)


# ---------------------------------------------------------------------------- M/M/c on the scheduler


def fifo_multi_server_waits(
    arrival_rate: float, service_rate: float, servers: int, tasks: int, seed: int, antithetic: bool
) -> list[float]:
    """The Kiefer-Wolfowitz recursion for a FIFO M/M/c queue, on mmc's random streams.

    Under FIFO the k-th service time drawn belongs to the k-th arrival, so the scheduler, if it
    is right, must produce these waits exactly.
    """
    stream = AntitheticRandom if antithetic else random.Random
    arrivals, services = stream(f"mmc-arrivals-{seed}"), stream(f"mmc-service-{seed}")
    free_at = [0.0] * servers
    now, waits = 0.0, []
    for _ in range(tasks):
        now += arrivals.expovariate(arrival_rate)
        start = max(now, heapq.heappop(free_at))
        waits.append(start - now)
        heapq.heappush(free_at, start + services.expovariate(service_rate))
    return waits


@pytest.mark.parametrize(("arrival_rate", "servers"), [(0.7, 1), (3.2, 4), (9.5, 10)])
@pytest.mark.parametrize("antithetic", [False, True])
def test_scheduler_replays_the_textbook_queue_task_by_task(
    arrival_rate: float, servers: int, antithetic: bool
) -> None:
    simulated = simulate_waits(arrival_rate, 1.0, servers, 3000, seed=11, antithetic=antithetic)
    textbook = fifo_multi_server_waits(arrival_rate, 1.0, servers, 3000, seed=11, antithetic=antithetic)
    assert sum(w > 0 for w in simulated) > 300  # a real queue formed
    assert simulated == pytest.approx(textbook, abs=1e-9)


def test_mmc_check_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="two seeds"):
        mmc_check(0.5, 1.0, 1, tasks=100, seeds=[0], warmup=10)
    with pytest.raises(ValueError, match="warmup"):
        mmc_check(0.5, 1.0, 1, tasks=100, seeds=[0, 1], warmup=100)
    with pytest.raises(ValueError, match="unstable"):
        mmc_check(2.0, 1.0, 2, tasks=100, seeds=[0, 1], warmup=10)


def test_mmc_check_small_run_reports_consistent_fields() -> None:
    result = mmc_check(0.5, 2.0, 2, tasks=2000, seeds=range(3), warmup=200)
    assert result.utilisation == pytest.approx(0.125)
    assert result.expected_mean_wait == pytest.approx(expected_wait_in_queue(0.5, 2.0, 2))
    assert len(result.per_seed_means) == 3
    assert result.ci_low <= result.simulated_mean_wait <= result.ci_high
    assert result.relative_error == pytest.approx(result.simulated_mean_wait / result.expected_mean_wait - 1)
    assert result.antithetic and result.control_variates
    plain = mmc_check(
        0.5, 2.0, 2, tasks=2000, seeds=range(3), warmup=200, antithetic=False, control_variates=False
    )
    assert plain.simulated_mean_wait == pytest.approx(plain.raw_mean_wait)
    assert "M/M/2" in result.summary()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arrival_rate", "servers", "tasks", "seeds", "warmup"),
    [
        pytest.param(0.7, 1, 30_000, 3, 2_000, id="M/M/1 rho=0.7"),
        pytest.param(3.2, 4, 60_000, 5, 5_000, id="M/M/4 rho=0.8"),
    ],
)
def test_scheduler_on_simpy_matches_erlang_c_within_3_percent(
    arrival_rate: float, servers: int, tasks: int, seeds: int, warmup: int
) -> None:
    started = time.perf_counter()
    result = mmc_check(arrival_rate, 1.0, servers, tasks=tasks, seeds=range(seeds), warmup=warmup)
    print(result.summary(), f"[{time.perf_counter() - started:.1f} s]")
    assert abs(result.relative_error) < 0.03, result.summary()
    assert abs(result.raw_relative_error) < 0.05, result.summary()


# ---------------------------------------------------------------------------- AWS backoff study


def test_one_call_is_four_network_hops() -> None:
    run = run_occ_contention(1, NoBackoff(), seed=0, network_sd_s=0.0)
    assert (run.calls, run.failed_calls) == (1, 0)
    assert run.time_s == pytest.approx(4 * 0.010)


def test_a_losing_client_backs_off_then_reads_and_writes_again() -> None:
    # Both read version 0; one write wins at 30 ms. The loser hears at 40 ms, backs off, calls again.
    no_wait = run_occ_contention(2, NoBackoff(), seed=0, network_sd_s=0.0)
    assert (no_wait.calls, no_wait.failed_calls) == (3, 1)
    assert no_wait.time_s == pytest.approx(0.080)
    # The blog's simulator numbers the first retry 1: the first exponential delay is 2 * base.
    backoff = run_occ_contention(2, ExponentialBackoff(base_s=0.005, cap_s=2.0), seed=0, network_sd_s=0.0)
    assert backoff.time_s == pytest.approx(0.080 + 0.010)


class CountingBackoff:
    """Wraps a real strategy and records every delay it was asked for."""

    def __init__(self, inner: FullJitter) -> None:
        self.inner = inner
        self.name = inner.name
        self.asked: list[tuple[int, float | None]] = []

    def delay(self, retry: int, rng: random.Random, previous: float | None = None) -> float:
        self.asked.append((retry, previous))
        return self.inner.delay(retry, rng, previous)


def test_every_failed_write_asks_the_strategy_for_one_delay() -> None:
    strategy = CountingBackoff(FullJitter(base_s=0.005, cap_s=2.0))
    run = run_occ_contention(20, strategy, seed=3)
    assert run.failed_calls == run.calls - 20 == len(strategy.asked) > 0
    assert min(retry for retry, _ in strategy.asked) == 1


def test_study_is_reproducible_and_seed_dependent() -> None:
    first = aws_jitter_study(clients=(5,), runs=3, seed=1)
    again = aws_jitter_study(clients=(5,), runs=3, seed=1)
    other = aws_jitter_study(clients=(5,), runs=3, seed=2)
    assert first.equals(again)
    assert not first.equals(other)
    assert list(first.columns) == [
        "clients",
        "strategy",
        "calls_mean",
        "calls_std",
        "time_ms_mean",
        "time_ms_std",
        "runs",
    ]
    assert list(first["strategy"]) == [
        "none",
        "exponential",
        "equal_jitter",
        "full_jitter",
        "decorrelated_jitter",
    ]


@pytest.fixture(scope="module")
def study() -> dict[tuple[int, str], dict[str, float]]:
    frame = aws_jitter_study(clients=(10, 100), runs=100, seed=0)
    return {(row.clients, row.strategy): row._asdict() for row in frame.itertuples(index=False)}


BACKOFF_STRATEGIES = ("exponential", "equal_jitter", "full_jitter", "decorrelated_jitter")


def test_work_grows_about_quadratically_without_jitter(study) -> None:
    ratio = study[(100, "exponential")]["calls_mean"] / study[(10, "exponential")]["calls_mean"]
    assert ratio > 20  # 10x the clients, far more than 10x the work (N^2 would be 100x)


@pytest.mark.parametrize("clients", [10, 100])
def test_exponential_without_jitter_is_the_worst_backoff(study, clients: int) -> None:
    for column in ("calls_mean", "time_ms_mean"):
        worst = max(BACKOFF_STRATEGIES, key=lambda name: study[(clients, name)][column])
        assert worst == "exponential", column


def test_no_backoff_is_fastest_but_does_the_most_work(study) -> None:
    # As in the blog: without backoff the herd finishes soonest, by doing the most calls.
    names = ("none", *BACKOFF_STRATEGIES)
    assert min(names, key=lambda name: study[(100, name)]["time_ms_mean"]) == "none"
    assert max(names, key=lambda name: study[(100, name)]["calls_mean"]) == "none"


def test_full_jitter_cuts_work_by_more_than_half(study) -> None:
    assert study[(100, "full_jitter")]["calls_mean"] < 0.5 * study[(100, "exponential")]["calls_mean"]


@pytest.mark.parametrize("clients", [10, 100])
def test_full_and_equal_jitter_do_about_the_same_work(study, clients: int) -> None:
    full, equal = (
        study[(clients, "full_jitter")]["calls_mean"],
        study[(clients, "equal_jitter")]["calls_mean"],
    )
    assert abs(full / equal - 1) < 0.25
    # ...but equal jitter takes longer (the blog's "loser" among the jittered approaches)
    assert study[(clients, "equal_jitter")]["time_ms_mean"] > study[(clients, "full_jitter")]["time_ms_mean"]


def test_decorrelated_jitter_calls_more_but_finishes_a_little_sooner(study) -> None:
    full, decorrelated = study[(100, "full_jitter")], study[(100, "decorrelated_jitter")]
    assert decorrelated["calls_mean"] > full["calls_mean"]
    assert 0.7 * full["time_ms_mean"] < decorrelated["time_ms_mean"] < full["time_ms_mean"]


# ---------------------------------------------------------------------------- the study notebook

NOTEBOOK = REPO / "notebooks" / "backoff_jitter_study.ipynb"


def test_study_notebook_is_stored_without_outputs() -> None:
    nbformat = pytest.importorskip("nbformat")
    book = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in book.cells if cell.cell_type == "code"]
    assert code and all(cell.outputs == [] and cell.execution_count is None for cell in code)


@pytest.mark.notebook
def test_study_notebook_runs_headless_and_draws_both_charts() -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    book = nbformat.read(NOTEBOOK, as_version=4)
    parameters = [cell for cell in book.cells if "parameters" in cell.metadata.get("tags", [])]
    assert len(parameters) == 1 and "RUNS" in parameters[0].source
    parameters[0].source = "RUNS = 3\nCLIENTS = (5, 20)\nSEED = 0\nFAST = False"
    nbclient.NotebookClient(
        book, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()
    outputs = [output for cell in book.cells if cell.cell_type == "code" for output in cell.outputs]
    assert [o for o in outputs if o.get("output_type") == "error"] == []
    charts = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(charts) == 2
    tables = "".join(o.get("data", {}).get("text/plain", "") for o in outputs)
    assert "decorrelated_jitter" in tables and "full jitter / exponential calls" in tables


# ---------------------------------------------------------------------------- SimPy runtime hot path
# The benchmark work runs ``wait_for(coroutine, timeout)`` inside the awaiting task under a deadline
# instead of a child task per provider call. These pin the contract that change must keep.


def run_sim(body):
    runtime = SimPyRuntime()
    return runtime.run(body(runtime)), runtime


def test_wait_for_deadline_is_disarmed_when_the_work_finishes_in_time() -> None:
    async def body(rt):
        async def quick():
            await rt.sleep(1)
            return "done"

        value = await rt.wait_for(quick(), 5)
        await rt.sleep(10)  # past the old deadline: nothing may cancel us now
        return value, rt.now()

    assert run_sim(body)[0] == ("done", 11)


def test_wait_for_timeout_wins_even_if_the_work_swallows_the_cancel() -> None:
    async def body(rt):
        seen = []

        async def stubborn():
            try:
                await rt.sleep(10)
            except Cancelled:
                seen.append(rt.now())
                return "swallowed"
            return "late"

        async def failing_cleanup():
            try:
                await rt.sleep(10)
            except Cancelled:
                raise ValueError("cleanup failed") from None

        try:
            await rt.wait_for(stubborn(), 2)
        except TimeoutError:
            seen.append("timeout")
        try:
            await rt.wait_for(failing_cleanup(), 2)
        except TimeoutError:
            seen.append("timeout despite the cleanup error")
        return seen

    assert run_sim(body)[0] == [2, "timeout", "timeout despite the cleanup error"]


@pytest.mark.parametrize("cancel_at", [1.0, 3.0])
def test_a_cancel_from_outside_wins_over_the_deadline(cancel_at: float) -> None:
    async def body(rt):
        inner = []

        async def work():
            try:
                await rt.sleep(10)
            except Cancelled:
                inner.append(rt.now())
                raise

        async def caller():
            await rt.wait_for(work(), 3)

        handle = rt.spawn(caller())
        await rt.sleep(cancel_at)  # at 3.0 the cancel and the deadline come at the same instant
        handle.cancel()
        try:
            await handle
        except Cancelled:
            return "cancelled", inner
        except TimeoutError:
            return "timeout", inner
        return "finished", inner

    assert run_sim(body)[0] == ("cancelled", [cancel_at])


def test_nested_wait_for_and_wait_for_in_a_spawned_task() -> None:
    async def body(rt):
        log = []

        async def slow():
            await rt.sleep(10)

        async def outer_work():
            try:
                await rt.wait_for(slow(), 1)  # inner deadline first: handled inside
            except TimeoutError:
                log.append(("inner timeout", rt.now()))
            await rt.sleep(10)

        try:
            await rt.wait_for(outer_work(), 4)  # then the outer deadline
        except TimeoutError:
            log.append(("outer timeout", rt.now()))
        spawned = rt.spawn(rt.wait_for(slow(), 2))  # the deadline belongs to the spawned task
        try:
            await spawned
        except TimeoutError:
            log.append(("spawned timeout", rt.now()))
        log.append(("caller still running", rt.now()))
        return log

    assert run_sim(body)[0] == [
        ("inner timeout", 1),
        ("outer timeout", 4),
        ("spawned timeout", 6),
        ("caller still running", 6),
    ]


def test_wait_for_on_futures_and_without_timeout() -> None:
    async def body(rt):
        never = rt.create_future()
        try:
            await rt.wait_for(never, 2)
        except TimeoutError:
            pass
        soon = rt.create_future()

        async def resolve():
            await rt.sleep(1)
            soon.set_result("ok")

        rt.spawn(resolve())
        return never.cancelled(), await rt.wait_for(soon, None), rt.now()

    (cancelled, value, now), runtime = run_sim(body)
    assert (cancelled, value, now) == (True, "ok", 3)
    assert runtime.task_errors == []


def test_wait_for_a_future_keeps_the_result_or_times_out_without_a_timer_of_its_own() -> None:
    async def body(rt):
        log = []
        in_time = rt.create_future()
        at_deadline = rt.create_future()
        never = rt.create_future()

        async def resolve(future, delay, value):
            await rt.sleep(delay)
            future.set_result(value)

        rt.spawn(resolve(in_time, 1, "in time"))
        log.append((await rt.wait_for(in_time, 5), rt.now()))
        # resolved by an event at the very instant the deadline fires: the result wins, as in asyncio
        rt.spawn(resolve(at_deadline, 2, "at the deadline"))
        log.append((await rt.wait_for(at_deadline, 2), rt.now()))
        try:
            await rt.wait_for(never, 3)
        except TimeoutError:
            log.append(("timeout", rt.now(), never.cancelled()))
        await rt.sleep(10)  # no stale deadline of the first waits may cancel us later
        log.append(("still running", rt.now()))
        return log

    log, runtime = run_sim(body)
    assert log == [("in time", 1), ("at the deadline", 3), ("timeout", 6, True), ("still running", 16)]
    assert runtime.task_errors == []


def test_wait_for_a_future_passes_on_its_cancellation_and_an_outside_cancel() -> None:
    async def body(rt):
        outcomes = []
        dropped = rt.create_future()

        async def drop():
            await rt.sleep(1)
            dropped.cancel()

        rt.spawn(drop())
        try:
            await rt.wait_for(dropped, 5)
        except TimeoutError:
            outcomes.append("timeout")
        except Cancelled:
            outcomes.append(("future cancelled", rt.now()))
        pending = rt.create_future()

        async def waiter():
            await rt.wait_for(pending, 5)

        handle = rt.spawn(waiter())
        await rt.sleep(2)
        handle.cancel()
        try:
            await handle
        except Cancelled:
            outcomes.append(("task cancelled", rt.now(), pending.done()))
        return outcomes

    assert run_sim(body)[0] == [("future cancelled", 1), ("task cancelled", 3, False)]


def test_an_outer_deadline_at_the_same_instant_as_an_inner_one_is_not_swallowed() -> None:
    """Both expire together; the one cancellation must reach the outer wait_for, or code that handles
    the inner timeout (Signal.wait returns False) would run on past the outer deadline."""

    async def body(rt):
        signal = Signal(rt)
        polls = []

        async def poller():
            while len(polls) < 50:  # bounded, so a swallowed deadline fails the test instead of hanging it
                polls.append(await signal.wait(1.0))

        async def nested_coroutine():
            async def inner():
                await rt.wait_for(rt.sleep(5), 2.0)

            await rt.wait_for(inner(), 2.0)

        outcomes = []
        for work in (poller, nested_coroutine):
            try:
                await rt.wait_for(work(), 2.0 if work is nested_coroutine else 1.0)
            except TimeoutError:
                outcomes.append((work.__name__, rt.now()))
        return outcomes, polls

    (outcomes, polls), runtime = run_sim(body)
    assert outcomes == [("poller", 1.0), ("nested_coroutine", 3.0)]
    assert polls == []  # the inner timeout at t=1 did not count as a poll that came back empty
    assert runtime.task_errors == []
