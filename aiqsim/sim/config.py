"""Scenario configuration records: what a scenario file describes, as frozen dataclasses.

The TOML loader (:mod:`aiqsim.sim.scenario`) validates files into these records; the
simulated providers, workloads and :func:`aiqsim.sim.simulate` read them. Units are in
the field names: ``_s`` seconds, ``_per_min`` per minute, ``_prob`` a probability in [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from aiqsim.core.fleet_quota import DEFAULT_SLOT_POLL_S
from aiqsim.sim.job_config import JobConfig

MAX_CALL_UNITS = 10**12
"""The largest size of one call in provider units (tokens, characters), for a size drawn from a
scenario's distribution and for a row of a trace or a replay file: a trillion is no call, and
larger numbers overflowed the float arithmetic of a run after loading went through."""

ProviderKind = Literal["llm", "tts"]
OutageMode = Literal["error", "slow"]
PriorityName = Literal["interactive", "background"]
WorkloadType = Literal["poisson", "burst", "double_click", "trace", "replay"]
StoreKind = Literal["memory", "json", "sqlite"]
RateLimitScopeName = Literal["lane", "task", "adaptive"]
FleetQuotaMode = Literal["shared", "split"]
FleetRouting = Literal["round_robin", "weighted"]


@dataclass(frozen=True, slots=True)
class OutageConfig:
    """A window during which a simulated provider fails every call (``error``: HTTP 503)
    or answers ``slow_factor`` times slower (``slow``)."""

    start_s: float
    end_s: float
    mode: OutageMode = "error"
    slow_factor: float = 10.0


LATENCY_DISTRIBUTIONS = ("lognormal", "exponential")
"""The noise factors a simulated provider's latency may have (``ProviderConfig.latency_dist``)."""


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    """A simulated provider: its latency model, server-side quota, failure modes and prices.

    Cost units are tokens (prompt + output) for ``llm`` and characters for ``tts``.
    Latency of one call = ``latency_base_s + latency_per_unit_s * output_units``, times a
    noise factor of mean 1: lognormal with ``sigma = latency_sigma`` (``latency_dist = "lognormal"``,
    the default; sigma 0 is deterministic) or exponential (``"exponential"``: memoryless service,
    as queueing theory's M/M/c assumes).
    The server enforces ``server_requests_per_min`` / ``server_units_per_min`` over sliding
    60 s windows and answers 429 with a Retry-After when a client exceeds them.

    The stream model (``ttft_s`` and ``tokens_per_s`` set) replaces the latency formula for calls that
    generate: the first token comes after ``(ttft_s + ttft_per_prompt_unit_s * prompt_units)`` times a
    mean-1 lognormal factor of sigma ``ttft_sigma``, the rest after ``output_units / tokens_per_s``
    more, times the latency noise above (``latency_dist``, ``latency_sigma``); ``latency_per_unit_s``
    is then unused and ``latency_base_s`` only times answers that generate nothing (an outage's 503,
    an idempotent replay). With ``stream_cut_prob`` a stream's connection drops at a uniformly drawn
    point of its generation: the client gets a ``StreamCutError``; the server finishes, bills and
    keeps the answer, as for a lost response (``timeout_prob``).
    """

    name: str
    kind: ProviderKind = "llm"
    latency_base_s: float = 0.5
    latency_per_unit_s: float = 0.01
    latency_sigma: float = 0.0
    latency_dist: str = "lognormal"
    server_requests_per_min: float | None = None
    server_units_per_min: float | None = None
    rate_limit_prob: float = 0.0
    rate_limit_retry_after_s: float | None = 1.0
    reports_quota: bool = True
    server_error_prob: float = 0.0
    timeout_prob: float = 0.0
    quota_exhausted_prob: float = 0.0
    invalid_request_prob: float = 0.0
    honours_idempotency: bool = False
    supports_lookup: bool = True
    price_per_1k_units: float = 0.002
    outages: tuple[OutageConfig, ...] = ()
    ttft_s: float | None = None
    """The stream model (with ``tokens_per_s``; both or neither): base time to first token (s)."""
    ttft_per_prompt_unit_s: float = 0.0
    """Time to first token added per prompt unit (prefill), seconds."""
    ttft_sigma: float = 0.0
    """Log-space sigma of the mean-1 lognormal factor on the time to first token (0: deterministic)."""
    tokens_per_s: float | None = None
    """Generation rate of the stream model: output units per second after the first token."""
    stream_cut_prob: float = 0.0
    """Probability that an answer's stream is cut during its generation (the client gets
    :class:`~aiqsim.core.failures.StreamCutError`; the server finishes and bills). Stream model only."""

    @property
    def streams(self) -> bool:
        """Whether the provider has the stream model (``ttft_s`` and ``tokens_per_s`` set)."""
        return self.tokens_per_s is not None


@dataclass(frozen=True, slots=True)
class ClientQuotaConfig:
    """Client-side limits for one provider (maps to :class:`aiqsim.core.token_bucket.QuotaLimits`)."""

    requests_per_min: float | None = None
    units_per_min: float | None = None
    concurrency: int | None = None
    request_burst: float | None = None
    unit_burst: float | None = None


@dataclass(frozen=True, slots=True)
class RetryConfig:
    """Retry policy: backoff strategy by name plus its parameters."""

    strategy: str = "full_jitter"
    base_s: float = 0.5
    cap_s: float = 30.0
    max_attempts: int = 5
    attempt_timeout_s: float | None = 30.0
    honour_retry_after: bool = True
    max_retry_after_s: float | None = 300.0
    rate_limit_scope: RateLimitScopeName = "adaptive"
    first_token_timeout_s: float | None = None
    """For calls to a provider with the stream model (streamed): how long an attempt may wait for its
    first chunk (``RetryPolicy.first_token_timeout_s``); ``attempt_timeout_s`` still bounds the whole."""


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    """Dispatch policy and queue depth limits."""

    policy: str = "fifo"
    max_wait_s: float = 30.0
    interactive_limit: int | None = 5
    background_limit: int | None = 2_000


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Where task records live during a simulation (``json``/``sqlite`` use a temp dir unless ``path``)."""

    kind: StoreKind = "memory"
    path: str | None = None
    requeue_interrupted: bool = False
    reconcile_on_restart: bool = True
    group_commit: bool = False
    """SQLite only: stage writes and flush them once per ``commit_window_s`` (group commit)."""
    commit_window_s: float = 0.002


@dataclass(frozen=True, slots=True)
class CostConfig:
    """A distribution of per-task sizes in the provider's units.

    ``fixed``: always ``mean``. ``lognormal``: mean ``mean``, log-space sigma ``sigma``.
    ``uniform``: between ``low`` and ``high``. Values are rounded to whole units, at least 1.
    ``output_fraction`` of the units is output (drives latency), the rest prompt.
    """

    dist: Literal["fixed", "lognormal", "uniform"] = "fixed"
    mean: float = 500.0
    sigma: float = 0.5
    low: float = 1.0
    high: float = 1000.0
    output_fraction: float = 0.2


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """One source of submissions.

    - ``poisson``: arrivals at ``rate_per_s`` from ``start_s`` to ``end_s`` (or ``count`` arrivals).
    - ``burst``: ``count`` arrivals spread evenly over ``burst_s`` starting at ``start_s``.
    - ``double_click``: ``count`` user actions (Poisson at ``rate_per_s``), each submitted
      ``clicks`` times ``click_gap_s`` apart with identical input.
    - ``trace``: replay a CSV with TIMESTAMP, ContextTokens, GeneratedTokens (``trace`` is a path
      or the built-in name ``azure_code``), times divided by ``speedup``, first ``count`` rows.
    - ``replay``: submit the rows of the ``arrivals`` CSV (offset_s, prompt_units, output_units, input;
      see :mod:`aiqsim.sim.replay_arrivals`) at ``start_s + offset_s``, first ``count`` rows.

    Inputs are drawn from ``distinct_inputs`` distinct values when set (so identical inputs
    recur and deduplicate), else each arrival is unique. ``poison_fraction`` of distinct
    inputs always violate the response schema.
    """

    type: WorkloadType
    provider: str = ""
    priority: PriorityName = "background"
    rate_per_s: float = 1.0
    start_s: float = 0.0
    end_s: float | None = None
    count: int | None = None
    burst_s: float = 0.0
    clicks: int = 2
    click_gap_s: float = 0.05
    cost: CostConfig = field(default_factory=CostConfig)
    distinct_inputs: int | None = None
    poison_fraction: float = 0.0
    trace: str | None = None
    speedup: float = 1.0
    arrivals: str | None = None
    """A ``replay`` workload's arrivals CSV (a path relative to the scenario file)."""
    job: str | None = None
    """Name of a ``[[jobs]]`` template: each arrival submits one job instead of one call to ``provider``."""
    route: str | None = None
    """Name of a ``[[routes]]`` entry: each arrival is submitted to that route (instead of ``provider``),
    which gives it one of its deployments by its policy."""
    tenant: str | None = None
    """Name of a ``[tenants.NAME]`` table: the tenant its calls are submitted for (``None``: the default)."""

    @property
    def target(self) -> str:
        """What each arrival is submitted to: the route when the workload names one, else the provider."""
        return self.route if self.route is not None else self.provider


@dataclass(frozen=True, slots=True)
class RouteConfig:
    """One model served by several deployments (``[[routes]]``): maps to :class:`aiqsim.core.routing.Route`.

    ``weights`` (``weighted`` policy) maps each deployment to a weight > 0, equal when unset; with
    ``retry_elsewhere`` a retryable failure moves the retry to another deployment of the route.
    """

    name: str
    providers: tuple[str, ...]
    policy: str = "weighted"
    weights: dict[str, float] | None = None
    retry_elsewhere: bool = True


@dataclass(frozen=True, slots=True)
class CrashConfig:
    """Kill the scheduler at ``at_s`` (virtual seconds) or right after its ``after_writes``-th
    store write, then restart it on the same store ``restart_after_s`` later.

    ``torn_write`` (JSON store) leaves a half-written temp file behind, as a kill in the
    middle of a write would.
    """

    at_s: float | None = None
    after_writes: int | None = None
    restart_after_s: float = 5.0
    torn_write: bool = False


@dataclass(frozen=True, slots=True)
class OverloadConfig:
    """Client-side overload protection for every provider (all off by default).

    ``retry_budget``: ``token_bucket`` (AWS SDK standard mode: capacity, a retry costs
    ``budget_retry_cost``, ``budget_timeout_retry_cost`` after a timeout) or ``ratio`` (Google SRE:
    retries below ``budget_ratio`` of requests over ``budget_window_s``). ``circuit_breaker``:
    open after ``breaker_failure_threshold`` failures within ``breaker_window_s``, half-open after
    ``breaker_cooldown_s``. ``throttle``: Google SRE adaptive throttling with ``throttle_k`` over
    ``throttle_window_s``. ``adaptive_rate``: AWS SDK adaptive mode (CUBIC send rate; waits, never fails).
    """

    retry_budget: Literal["none", "token_bucket", "ratio"] = "none"
    budget_capacity: float = 500.0
    budget_retry_cost: float = 5.0
    budget_timeout_retry_cost: float = 10.0
    budget_ratio: float = 0.1
    budget_window_s: float = 60.0
    circuit_breaker: bool = False
    breaker_failure_threshold: int = 5
    breaker_window_s: float = 30.0
    breaker_cooldown_s: float = 30.0
    breaker_half_open_probes: int = 1
    throttle: bool = False
    throttle_k: float = 2.0
    throttle_window_s: float = 120.0
    adaptive_rate: bool = False


@dataclass(frozen=True, slots=True)
class BudgetConfig:
    """A daily spend budget (:class:`aiqsim.overload.Budget`; off by default).

    ``per_day``: the day's limit over every priced call; ``per_tenant_per_day``: each tenant's daily
    limit (a task without a tenant counts in ``per_day`` only); ``prices``: provider name -> price
    per unit of its calls' cost (a provider without a price is not budgeted; no prices at all: each
    provider's own ``price_per_1k_units / 1000``, what the simulated providers bill). Limits and
    prices are in one currency. ``day_s``: a budget day's length (simulated seconds from the start
    of the run), shorter than a calendar day to see a reset within a run. One budget serves every worker of a
    fleet and outlives crashes (it models a shared ledger: money spent stays spent).
    """

    per_day: float | None = None
    per_tenant_per_day: float | None = None
    prices: dict[str, float] = field(default_factory=dict)
    day_s: float = 86_400.0

    @property
    def enabled(self) -> bool:
        """Whether any limit is set."""
        return self.per_day is not None or self.per_tenant_per_day is not None


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """N scheduler instances (workers, each with its own queues and dispatchers) on one simulation.

    ``quota``: ``shared`` gives every worker the same quota object per provider (in production,
    :class:`aiqsim.fleet.RedisQuota`); ``split`` gives each the ``[quotas.*]`` limits divided by
    ``workers`` (:func:`aiqsim.core.fleet_quota.split_quota_limits`). Arrivals go to workers
    ``round_robin`` or at random in proportion to ``weights`` (``weighted``: one weight per worker).
    ``slot_poll_s``: how soon a worker looks again when every shared concurrency slot is taken.
    ``worker_concurrency``: each worker's own cap on calls in flight per provider, on top of the quota
    (a process holds only so many). The default (one worker) is the plain single scheduler.
    """

    workers: int = 1
    quota: FleetQuotaMode = "shared"
    routing: FleetRouting = "round_robin"
    weights: tuple[float, ...] = ()
    slot_poll_s: float = DEFAULT_SLOT_POLL_S
    worker_concurrency: int | None = None


@dataclass(frozen=True, slots=True)
class TenantConfig:
    """One ``[tenants.NAME]`` table: the tenant's weight in each lane's fair sharing and the tasks it
    may have waiting (:class:`aiqsim.scheduler.tenants.Tenant`; ``None``: unbounded)."""

    weight: float = 1.0
    max_queued: int | None = None


@dataclass(frozen=True, slots=True)
class Scenario:
    """A whole simulation: providers, client quotas, policies, workload, crashes, horizon, seed.

    ``duration_s`` bounds the arrivals; the run then drains until every task is terminal or
    ``drain_s`` more seconds pass (tasks still live then are reported as lost).
    ``timeline_step_s`` is the bucket width of the ``timeline`` DataFrame.
    """

    name: str
    providers: tuple[ProviderConfig, ...]
    workloads: tuple[WorkloadConfig, ...]
    description: str = ""
    seed: int = 0
    duration_s: float = 60.0
    drain_s: float = 3600.0
    timeline_step_s: float = 1.0
    quotas: dict[str, ClientQuotaConfig] = field(default_factory=dict)
    retry: RetryConfig = field(default_factory=RetryConfig)
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    crashes: tuple[CrashConfig, ...] = ()
    overload: OverloadConfig = field(default_factory=OverloadConfig)
    jobs: tuple[JobConfig, ...] = ()
    """Job templates (``[[jobs]]``) that ``job`` workloads submit."""
    fleet: FleetConfig = field(default_factory=FleetConfig)
    """How many scheduler instances run, how they share the quota, how arrivals reach them."""
    routes: tuple[RouteConfig, ...] = ()
    """Routes across deployments (``[[routes]]``) that workloads may submit to (``route =``)."""
    tenants: dict[str, TenantConfig] = field(default_factory=dict)
    """The tenants sharing each lane by weight (``[tenants.NAME]``); empty: no tenants."""
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    """The daily spend budget (``[budget]``), if any."""
    source: str | None = None
    """Path of the file it was loaded from, for error messages and reports."""

    def route(self, name: str) -> RouteConfig:
        """The route called ``name``; ``KeyError`` if there is none."""
        for route in self.routes:
            if route.name == name:
                return route
        raise KeyError(name)

    def provider(self, name: str) -> ProviderConfig:
        """The provider called ``name``; ``KeyError`` if there is none."""
        for provider in self.providers:
            if provider.name == name:
                return provider
        raise KeyError(name)
