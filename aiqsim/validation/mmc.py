"""M/M/c validation: the production scheduler, run in virtual time, against Erlang C.

A queue with Poisson arrivals (rate ``lambda``), exponential service (rate ``mu``) and
``c`` servers has a closed-form mean wait in queue (Erlang C):

    Wq = C(c, a) / (c * mu - lambda),   a = lambda / mu (offered load in Erlangs)

:func:`mmc_check` builds exactly that queue out of the real parts: a
:class:`~aiqsim.scheduler.Scheduler` on a :class:`~aiqsim.runtime.SimPyRuntime`, a
provider whose call sleeps an exponential service time, ``QuotaLimits(concurrency=c)`` as
the ``c`` servers and FIFO dispatch. A task's wait in queue is ``started_at - created_at``
of its stored record. If the simulated mean wait matches Wq, the scheduler's queueing,
slot accounting and the SimPy runtime's clock all tell the truth.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.numeric import is_real, is_whole
from aiqsim.core.task import TaskRecord, TaskStatus
from aiqsim.core.token_bucket import QuotaLimits
from aiqsim.runtime.gc_tuning import relaxed_gc
from aiqsim.runtime.protocol import Runtime
from aiqsim.runtime.simpy_runtime import SimPyRuntime
from aiqsim.scheduler.dispatch import FifoPolicy
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse, new_response
from aiqsim.scheduler.retry import RetryPolicy
from aiqsim.scheduler.scheduler import Scheduler
from aiqsim.stores.memory import MemoryStore

__all__ = [
    "AntitheticRandom",
    "ExponentialServiceProvider",
    "MMcResult",
    "Replication",
    "RunMeans",
    "erlang_c",
    "expected_wait_in_queue",
    "mmc_check",
    "run_means",
    "simulate_records",
    "simulate_replication",
    "simulate_waits",
    "t_quantile_975",
    "wait_sensitivity",
]

PROVIDER_NAME = "mmc"

# Two-sided 95% Student t quantiles (0.975 one-sided) for 1..30 degrees of freedom, to 9 decimals;
# used when scipy is not installed.
_T_975 = (
    12.706204736, 4.302652730, 3.182446305, 2.776445105, 2.570581836,
    2.446911851, 2.364624252, 2.306004135, 2.262157163, 2.228138852,
    2.200985160, 2.178812830, 2.160368656, 2.144786688, 2.131449546,
    2.119905299, 2.109815578, 2.100922040, 2.093024054, 2.085963447,
    2.079613845, 2.073873068, 2.068657610, 2.063898562, 2.059538553,
    2.055529439, 2.051830516, 2.048407142, 2.045229642, 2.042272456,
)  # fmt: skip
_Z_975 = 1.959963984540054  # the standard normal's 0.975 quantile
# Beyond 30 degrees of freedom: the Cornish-Fisher expansion of t around the normal quantile
# (Abramowitz & Stegun 26.7.5), terms in 1/df .. 1/df**4; within 3e-8 of the exact quantile there.
_Z = _Z_975
_CORNISH_FISHER_975 = (
    (_Z**3 + _Z) / 4,
    (5 * _Z**5 + 16 * _Z**3 + 3 * _Z) / 96,
    (3 * _Z**7 + 19 * _Z**5 + 17 * _Z**3 - 15 * _Z) / 384,
    (79 * _Z**9 + 776 * _Z**7 + 1482 * _Z**5 - 1920 * _Z**3 - 945 * _Z) / 92160,
)


def check_erlang_arguments(servers: int, offered_load: float) -> None:
    """Refuse what is not a whole number of servers >= 1 (``8.0`` is 8; ``True`` is not one) and a
    finite offered load >= 0, with a :class:`ConfigurationError` naming the argument."""
    if not is_whole(servers, 1):
        raise ConfigurationError(f"servers must be a positive integer, got {servers!r}")
    check_rate("offered_load", offered_load, zero_allowed=True)


def check_rate(name: str, value: float, *, zero_allowed: bool) -> None:
    """Refuse what is not a finite rate >= 0 (> 0 unless ``zero_allowed``), naming ``name``."""
    number = is_real(value) and math.isfinite(value)
    if not number or value < 0 or (value == 0 and not zero_allowed):
        least = ">= 0" if zero_allowed else "> 0"
        raise ConfigurationError(f"{name} must be a finite number {least}, got {value!r}")


def erlang_b(servers: int, offered_load: float) -> float:
    """The Erlang B formula: the probability that an arrival finds all ``servers`` busy and is lost
    (M/M/c/c). By the recursion ``B(k) = a B(k-1) / (k + a B(k-1))``, accurate for thousands of servers."""
    check_erlang_arguments(servers, offered_load)
    blocking = 1.0  # Erlang B with 0 servers
    for k in range(1, int(servers) + 1):
        blocking = offered_load * blocking / (k + offered_load * blocking)
    return blocking


def t_interval_95(values: list[float] | tuple[float, ...]) -> tuple[float, float]:
    """The mean of ``values`` and the half-width of its 95% t-interval (at least two values)."""
    mean = statistics.fmean(values)
    return mean, t_quantile_975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def erlang_c(servers: int, offered_load: float) -> float:
    """Probability that an arrival has to wait in an M/M/c queue (the Erlang C formula).

    ``offered_load`` is ``a = lambda / mu`` in Erlangs; the queue is stable only for
    ``a < servers``. Computed through the Erlang B recursion, which stays accurate for
    hundreds of servers where the textbook sum of ``a**k / k!`` would overflow.
    """
    check_erlang_arguments(servers, offered_load)
    if offered_load >= servers:
        raise ConfigurationError(
            f"unstable queue: offered load {offered_load:g} Erlangs needs more than {servers} servers"
        )
    if offered_load == 0:
        return 0.0
    blocking = erlang_b(servers, offered_load)
    return servers * blocking / (servers - offered_load * (1.0 - blocking))


def expected_wait_in_queue(arrival_rate: float, service_rate: float, servers: int) -> float:
    """Erlang C mean wait in queue ``Wq = C(c, a) / (c * mu - lambda)`` in the rates' time unit."""
    check_rate("arrival_rate", arrival_rate, zero_allowed=True)
    check_rate("service_rate", service_rate, zero_allowed=False)
    offered = arrival_rate / service_rate
    return erlang_c(servers, offered) / (servers * service_rate - arrival_rate)


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (scipy if installed)."""
    if df < 1:
        raise ConfigurationError(f"degrees of freedom must be >= 1, got {df}")
    try:
        from scipy.stats import t as student_t
    except ImportError:
        return _t_quantile_975_table(df)
    return float(student_t.ppf(0.975, df))


def _t_quantile_975_table(df: int) -> float:
    if df <= len(_T_975):
        return _T_975[df - 1]
    g1, g2, g3, g4 = _CORNISH_FISHER_975
    return _Z_975 + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


class AntitheticRandom(random.Random):
    """A ``random.Random`` whose uniforms are ``1 - u`` for the ``u`` the same seed would give.

    Exponential draws made through it (``expovariate`` inverts ``random()``) are the mirror
    images of the plain stream's: a long service time becomes a short one. Averaging a run with
    its antithetic twin cancels much of the run-to-run noise of queueing simulations (about
    half the variance here) without biasing the mean, since each twin alone is a correct run.
    """

    def random(self) -> float:
        u = super().random()
        return 1.0 - u if u > 0.0 else 0.0  # keep the result in [0, 1)


class ExponentialServiceProvider:
    """A provider whose every call succeeds after an exponential service time (rate ``service_rate``).

    Randomness comes only from the injected ``rng``, so one seed replays one run exactly.
    """

    __slots__ = ("__dict__", "__weakref__", "_rng", "_runtime", "_service_rate", "name", "service_draws")

    def __init__(
        self, runtime: Runtime, service_rate: float, rng: random.Random, name: str = PROVIDER_NAME
    ) -> None:
        if not service_rate > 0:
            raise ConfigurationError(f"service_rate must be > 0, got {service_rate!r}")
        self.name = name
        self._runtime = runtime
        self._service_rate = service_rate
        self._rng = rng
        self.service_draws: list[float] = []
        """Every service time drawn, in call order (the inputs; what the tasks took is in the store)."""

    @property
    def calls(self) -> int:
        return len(self.service_draws)

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        service = self._rng.expovariate(self._service_rate)
        self.service_draws.append(service)
        await self._runtime.sleep(service)
        return new_response(result=None)


@dataclass(frozen=True, slots=True)
class MMcResult:
    """Simulated against expected mean wait in queue for one M/M/c configuration.

    ``simulated_mean_wait`` is the estimate compared with Erlang C: the mean observed wait,
    corrected by control variates when they were used (``raw_mean_wait`` is always the plain
    mean). ``relative_error`` is signed: ``simulated / expected - 1``. The confidence interval is
    the 95% t-interval of the per-seed estimates (each seed is one independent replication, or
    one antithetic pair of replications).
    """

    arrival_rate: float
    service_rate: float
    servers: int
    tasks: int
    warmup: int
    seeds: tuple[int, ...]
    antithetic: bool
    control_variates: bool
    utilisation: float
    erlang_c: float
    simulated_mean_wait: float
    raw_mean_wait: float
    expected_mean_wait: float
    ci_low: float
    ci_high: float
    per_seed_means: tuple[float, ...]
    relative_error: float

    @property
    def raw_relative_error(self) -> float:
        """``raw_mean_wait / expected - 1``: the error without control variates."""
        return self.raw_mean_wait / self.expected_mean_wait - 1.0

    @property
    def ci_contains_expected(self) -> bool:
        """Whether the 95% confidence interval covers the Erlang C value."""
        return self.ci_low <= self.expected_mean_wait <= self.ci_high

    def summary(self) -> str:
        """One line for logs and reports."""
        method = " + ".join(
            name
            for name, used in (
                ("antithetic pairs", self.antithetic),
                ("control variates", self.control_variates),
            )
            if used
        )
        return (
            f"M/M/{self.servers} rho={self.utilisation:.2f}: simulated Wq={self.simulated_mean_wait:.4f} "
            f"(95% CI {self.ci_low:.4f}..{self.ci_high:.4f}; raw {self.raw_mean_wait:.4f}) "
            f"vs Erlang C {self.expected_mean_wait:.4f}, error {self.relative_error:+.2%} "
            f"over {len(self.seeds)} seeds x {self.tasks - self.warmup} tasks"
            f"{f' ({method})' if method else ''}"
        )


@dataclass(frozen=True, slots=True)
class Replication:
    """One simulated run: what the scheduler recorded, and the random inputs it was fed."""

    records: list[TaskRecord]
    """Final task records in arrival order."""
    interarrival_draws: list[float]
    """The feeder's inter-arrival times, in order."""
    service_draws: list[float]
    """The provider's service times, in call order."""


@dataclass(frozen=True, slots=True)
class RunMeans:
    """Means of one replication over the tasks after the warm-up."""

    wait: float
    """Mean ``started_at - created_at`` of the stored records: the measurement."""
    service: float
    """Mean of the service times drawn for calls ``warmup..``: an input, for the control variate."""
    interarrival: float
    """Mean of the inter-arrival times drawn for tasks ``warmup..``: an input, for the control variate."""


def simulate_replication(
    arrival_rate: float,
    service_rate: float,
    servers: int,
    tasks: int,
    seed: int,
    *,
    antithetic: bool = False,
    attempt_timeout_s: float | None = None,
) -> Replication:
    """Run one replication on the production scheduler.

    ``attempt_timeout_s`` puts a deadline on every call (``None``, the default, as in
    :func:`mmc_check`: a deadline longer than any service time changes no result, only the cost,
    which ``benchmarks/bench_mmc_peers.py`` measures).

    Arrivals, service times and the scheduler's own randomness use three independent streams
    derived from ``seed``; with ``antithetic`` the arrival and service streams are the mirror
    images (:class:`AntitheticRandom`) of the plain run with the same seed.
    """
    stream = AntitheticRandom if antithetic else random.Random
    runtime = SimPyRuntime()
    arrivals = stream(f"mmc-arrivals-{seed}")
    provider = ExponentialServiceProvider(runtime, service_rate, stream(f"mmc-service-{seed}"))
    store = MemoryStore()
    scheduler = Scheduler(
        runtime,
        [provider],
        quotas={provider.name: QuotaLimits(concurrency=servers)},
        store=store,
        dispatch=FifoPolicy(),
        retry=RetryPolicy(max_attempts=1, attempt_timeout_s=attempt_timeout_s),
        background_limit=None,
        rng=random.Random(f"mmc-scheduler-{seed}"),
    )
    task_ids: list[str] = []  # the ids only: a run keeps no handle (nor its future) per task
    gaps: list[float] = []

    async def feed_and_drain() -> None:
        for index in range(tasks):
            gap = arrivals.expovariate(arrival_rate)
            gaps.append(gap)
            await runtime.sleep(gap)
            task_ids.append(scheduler.submit(provider.name, index, key=f"mmc-{index}", cost_estimate=0.0).id)
        await scheduler.join()
        await scheduler.close()

    with relaxed_gc():  # as simulate() does: the cycle collector would rescan every live record
        runtime.run(feed_and_drain())
    records: list[TaskRecord] = []
    for task_id in task_ids:
        record = store.get(task_id)
        if record is None or record.status is not TaskStatus.SUCCEEDED or record.started_at is None:
            raise RuntimeError(f"task {task_id} did not complete cleanly: {record!r}")
        records.append(record)
    if provider.calls != tasks:
        raise RuntimeError(f"{tasks} tasks made {provider.calls} provider calls; expected one each")
    return Replication(records, gaps, provider.service_draws)


def simulate_records(
    arrival_rate: float,
    service_rate: float,
    servers: int,
    tasks: int,
    seed: int,
    *,
    antithetic: bool = False,
) -> list[TaskRecord]:
    """The final task records of one replication (:func:`simulate_replication`), in arrival order."""
    return simulate_replication(
        arrival_rate, service_rate, servers, tasks, seed, antithetic=antithetic
    ).records


def simulate_waits(
    arrival_rate: float,
    service_rate: float,
    servers: int,
    tasks: int,
    seed: int,
    *,
    antithetic: bool = False,
) -> list[float]:
    """Every task's wait in queue (``started_at - created_at``) of one replication, in arrival order."""
    records = simulate_records(arrival_rate, service_rate, servers, tasks, seed, antithetic=antithetic)
    return [record.started_at - record.created_at for record in records]  # type: ignore[operator]


def run_means(replication: Replication, warmup: int) -> RunMeans:
    """Mean measured wait, and mean drawn service and inter-arrival times, after the first ``warmup``.

    The input means cover a fixed index range, so their expectations are exactly ``1/mu`` and
    ``1/lambda`` whatever the scheduler did; that is what lets them serve as control variates
    without ever hiding a scheduler error.
    """
    waits = [
        record.started_at - record.created_at  # type: ignore[operator]
        for record in replication.records[warmup:]
    ]
    return RunMeans(
        wait=statistics.fmean(waits),
        service=statistics.fmean(replication.service_draws[warmup:]),
        interarrival=statistics.fmean(replication.interarrival_draws[warmup:]),
    )


def wait_sensitivity(arrival_rate: float, service_rate: float, servers: int) -> tuple[float, float]:
    """``(dWq/dS, dWq/dA)``: how the Erlang C wait moves with the mean service time ``S`` and the
    mean inter-arrival time ``A``, by central differences. The control-variate coefficients."""

    def wq(mean_service: float, mean_gap: float) -> float:
        return expected_wait_in_queue(1.0 / mean_gap, 1.0 / mean_service, servers)

    service, gap = 1.0 / service_rate, 1.0 / arrival_rate
    hs, ha = service * 1e-6, gap * 1e-6
    d_service = (wq(service + hs, gap) - wq(service - hs, gap)) / (2 * hs)
    d_gap = (wq(service, gap + ha) - wq(service, gap - ha)) / (2 * ha)
    return d_service, d_gap


def mmc_check(
    arrival_rate: float,
    service_rate: float,
    servers: int,
    tasks: int = 20000,
    seeds: Iterable[int] = range(5),
    warmup: int = 2000,
    *,
    antithetic: bool = True,
    control_variates: bool = True,
) -> MMcResult:
    """Simulate an M/M/c queue on the production scheduler and compare with Erlang C.

    Each seed is one replication of ``tasks`` arrivals; the first ``warmup`` tasks of each run
    are dropped (the queue starts empty, which biases early waits low). The confidence interval
    is over seeds, so it needs at least two.

    Two standard variance reductions are on by default; neither can bias the estimate:

    - ``antithetic``: each seed runs a pair, the plain run and its mirror image
      (:class:`AntitheticRandom`), and averages them. Twice the work, about four times less
      variance per seed.
    - ``control_variates``: a run whose service times happened to be long has long waits too.
      The estimate per run is ``mean wait - gS * (mean service - 1/mu) - gA * (mean gap - 1/lambda)``,
      where the service and gap means are of the random *inputs* (the draws), never of what the
      scheduler recorded, so a scheduler error cannot be corrected away. The corrections have
      expectation zero whatever the coefficients, so only the variance depends on them; the
      coefficients are the Erlang C sensitivities of :func:`wait_sensitivity` (close to the
      regression optimum).
    """
    seeds = tuple(seeds)
    if len(seeds) < 2:
        raise ConfigurationError("mmc_check needs at least two seeds for a confidence interval")
    if not 0 <= warmup < tasks:
        raise ConfigurationError(f"warmup must be in [0, tasks), got warmup={warmup}, tasks={tasks}")
    if not (arrival_rate > 0 and service_rate > 0):
        raise ConfigurationError("arrival_rate and service_rate must be > 0")
    offered = arrival_rate / service_rate
    probability_wait = erlang_c(servers, offered)  # also rejects unstable configurations
    expected = probability_wait / (servers * service_rate - arrival_rate)
    d_service, d_gap = wait_sensitivity(arrival_rate, service_rate, servers) if control_variates else (0, 0)

    def estimate(means: RunMeans) -> float:
        return (
            means.wait
            - d_service * (means.service - 1.0 / service_rate)
            - d_gap * (means.interarrival - 1.0 / arrival_rate)
        )

    raw: list[float] = []
    per_seed: list[float] = []
    for seed in seeds:
        variants = [False, True] if antithetic else [False]
        runs = [
            run_means(
                simulate_replication(arrival_rate, service_rate, servers, tasks, seed, antithetic=mirror),
                warmup,
            )
            for mirror in variants
        ]
        raw.append(statistics.fmean(run.wait for run in runs))
        per_seed.append(statistics.fmean(estimate(run) for run in runs))
    mean, half_width = t_interval_95(per_seed)
    return MMcResult(
        arrival_rate=arrival_rate,
        service_rate=service_rate,
        servers=servers,
        tasks=tasks,
        warmup=warmup,
        seeds=seeds,
        antithetic=antithetic,
        control_variates=control_variates,
        utilisation=offered / servers,
        erlang_c=probability_wait,
        simulated_mean_wait=mean,
        raw_mean_wait=statistics.fmean(raw),
        expected_mean_wait=expected,
        ci_low=mean - half_width,
        ci_high=mean + half_width,
        per_seed_means=tuple(per_seed),
        relative_error=mean / expected - 1.0,
    )
