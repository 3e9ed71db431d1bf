"""The layout of a scenario file: every table, its keys, the check of each value, which are required.

One definition: the reader validates files against it, :func:`~aiqsim.sim.scenario.scenario_to_dict`
writes records back through it, and :mod:`aiqsim.sim.scenario_schema` turns it into the JSON Schema.
:data:`SECTION_FIELDS` says which table describes which config record (defaults come from the records).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiqsim.core.backoff import BACKOFF_STRATEGIES
from aiqsim.core.routing import ROUTE_POLICIES
from aiqsim.scheduler.dispatch import DISPATCH_POLICIES
from aiqsim.sim.config import (
    LATENCY_DISTRIBUTIONS,
    BudgetConfig,
    ClientQuotaConfig,
    CostConfig,
    CrashConfig,
    DispatchConfig,
    FleetConfig,
    OutageConfig,
    OverloadConfig,
    ProviderConfig,
    RetryConfig,
    RouteConfig,
    Scenario,
    StoreConfig,
    TenantConfig,
    WorkloadConfig,
)
from aiqsim.sim.job_config import FanoutConfig, JobConfig, StageConfig, StageSizeConfig
from aiqsim.sim.scenario.checks import (
    _NON_NEGATIVE,
    _POSITIVE,
    _PROBABILITY,
    _SIZE_MEAN,
    _SIZE_SIGMA,
    _SPREAD_SIGMA,
    _Boolean,
    _Choice,
    _Integer,
    _Names,
    _Number,
    _Optional,
    _Prices,
    _Text,
    _Weights,
)

MAX_PRICE_PER_1K_UNITS = 1_000_000.0
"""Most a provider may charge per 1,000 units: thousands of times any real API's price (cents or
dollars), so a larger one is a typo or a unit mix-up. The bound also keeps the run's costs finite:
``price_per_1k_units = 1e308`` passed validation, the first call's cost overflowed to inf, and
``aiqsim run --out`` failed after the simulation, writing summary.json."""


@dataclass(frozen=True)
class _Table:
    """A TOML table with a fixed set of keys.

    With ``variant_key`` (``type`` of a workload, ``dist`` of a cost) only the keys listed in
    ``variants[value]`` apply; ``required_by_variant`` names the keys a variant cannot do without.
    ``one_of``: keys of which a table sets exactly one (a stage's ``provider`` or ``route``); the
    section builder refuses both or neither with a message naming what each may be.
    """

    fields: Mapping[str, Any]
    required: frozenset[str] = frozenset()
    what: str = ""
    variant_key: str | None = None
    variant_default: str | None = None
    variants: Mapping[str, frozenset[str]] = field(default_factory=dict)
    required_by_variant: Mapping[str, frozenset[str]] = field(default_factory=dict)
    expected: str = "a table"
    one_of: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Array:
    """An array of tables (``[[providers]]``); ``named`` items may be addressed by their name."""

    item: _Table
    header: str
    named: bool = False

    @property
    def expected(self) -> str:
        return f"an array of tables ({self.header})"


@dataclass(frozen=True)
class _Map:
    """A table of tables keyed by provider name (``[quotas.llm]``), or by another ``key`` name; or a
    table of values (a route's weights)."""

    item: Any
    expected: str = "a table of tables keyed by provider name ([quotas.NAME])"
    key: str = "a provider name"


_OUTAGE = _Table(
    {
        "start_s": _NON_NEGATIVE,
        "end_s": _NON_NEGATIVE,
        "mode": _Choice(("error", "slow")),
        "slow_factor": _Number(1.0),
    },
    required=frozenset({"start_s", "end_s"}),
    what="outage",
)

_PROVIDER = _Table(
    {
        "name": _Text(name_like=True),
        "kind": _Choice(("llm", "tts")),
        "latency_base_s": _NON_NEGATIVE,
        "latency_per_unit_s": _NON_NEGATIVE,
        "latency_sigma": _NON_NEGATIVE,
        "latency_dist": _Choice(LATENCY_DISTRIBUTIONS),
        "server_requests_per_min": _Optional(_Number(1.0)),  # as the simulated provider requires
        "server_units_per_min": _Optional(_Number(1.0)),
        "rate_limit_prob": _PROBABILITY,
        "rate_limit_retry_after_s": _Optional(_NON_NEGATIVE),
        "reports_quota": _Boolean(),
        "server_error_prob": _PROBABILITY,
        "timeout_prob": _PROBABILITY,
        "quota_exhausted_prob": _PROBABILITY,
        "invalid_request_prob": _PROBABILITY,
        "honours_idempotency": _Boolean(),
        "supports_lookup": _Boolean(),
        "price_per_1k_units": _Number(0.0, MAX_PRICE_PER_1K_UNITS),
        "outages": _Array(_OUTAGE, "[[providers.outages]]"),
        "ttft_s": _Optional(_NON_NEGATIVE),
        "ttft_per_prompt_unit_s": _NON_NEGATIVE,
        "ttft_sigma": _SPREAD_SIGMA,
        "tokens_per_s": _Optional(_POSITIVE),
        "stream_cut_prob": _PROBABILITY,
    },
    required=frozenset({"name"}),
    what="provider",
)

_QUOTA = _Table(
    {
        "requests_per_min": _Optional(_POSITIVE),
        "units_per_min": _Optional(_POSITIVE),
        "concurrency": _Optional(_Integer(1)),
        "request_burst": _Optional(_Number(1.0)),
        "unit_burst": _Optional(_POSITIVE),
    },
    what="client quota",
)

_RETRY = _Table(
    {
        "strategy": _Choice(tuple(BACKOFF_STRATEGIES)),
        "base_s": _NON_NEGATIVE,
        "cap_s": _NON_NEGATIVE,
        "max_attempts": _Integer(1),
        "attempt_timeout_s": _Optional(_POSITIVE),
        "honour_retry_after": _Boolean(),
        "max_retry_after_s": _Optional(_POSITIVE),
        "rate_limit_scope": _Choice(("lane", "task", "adaptive")),
        "first_token_timeout_s": _Optional(_POSITIVE),
    },
    what="retry policy",
)

_DISPATCH = _Table(
    {
        "policy": _Choice(tuple(DISPATCH_POLICIES)),
        "max_wait_s": _NON_NEGATIVE,
        "interactive_limit": _Optional(_Integer(0)),
        "background_limit": _Optional(_Integer(0)),
    },
    what="dispatch policy",
)

_STORE = _Table(
    {
        "kind": _Choice(("memory", "json", "sqlite")),
        "path": _Optional(_Text(non_empty=True)),
        "requeue_interrupted": _Boolean(),
        "reconcile_on_restart": _Boolean(),
        "group_commit": _Boolean(),
        "commit_window_s": _NON_NEGATIVE,
    },
    what="store",
)

_COST_KEYS = {
    "fixed": frozenset({"dist", "mean", "output_fraction"}),
    "lognormal": frozenset({"dist", "mean", "sigma", "output_fraction"}),
    "uniform": frozenset({"dist", "low", "high", "output_fraction"}),
}

_COST = _Table(
    {
        "dist": _Choice(tuple(_COST_KEYS)),
        "mean": _SIZE_MEAN,
        "sigma": _SIZE_SIGMA,
        "low": _NON_NEGATIVE,
        "high": _NON_NEGATIVE,
        "output_fraction": _PROBABILITY,
    },
    what="cost distribution",
    variant_key="dist",
    variant_default="fixed",
    variants=_COST_KEYS,
)

_WORKLOAD_COMMON = frozenset(
    {
        "type",
        "provider",
        "priority",
        "start_s",
        "cost",
        "distinct_inputs",
        "poison_fraction",
        "job",
        "route",
        "tenant",
    }
)
_WORKLOAD_KEYS = {
    "poisson": _WORKLOAD_COMMON | {"rate_per_s", "end_s", "count"},
    "burst": _WORKLOAD_COMMON | {"count", "burst_s"},
    "double_click": _WORKLOAD_COMMON | {"rate_per_s", "end_s", "count", "clicks", "click_gap_s"},
    # a trace brings its own sizes and one input per row
    "trace": (_WORKLOAD_COMMON - {"cost", "distinct_inputs", "job"}) | {"trace", "speedup", "count", "end_s"},
    # a replay brings its own times, sizes and inputs (aiqsim/sim/replay_arrivals.py)
    "replay": (_WORKLOAD_COMMON - {"cost", "distinct_inputs", "job"}) | {"arrivals", "count", "end_s"},
}

_WORKLOAD = _Table(
    {
        "type": _Choice(tuple(_WORKLOAD_KEYS)),
        "provider": _Text(),
        "priority": _Choice(("interactive", "background")),
        "rate_per_s": _POSITIVE,
        "start_s": _NON_NEGATIVE,
        "end_s": _Optional(_NON_NEGATIVE),
        "count": _Optional(_Integer(1)),
        "burst_s": _NON_NEGATIVE,
        "clicks": _Integer(1),
        "click_gap_s": _NON_NEGATIVE,
        "cost": _COST,
        "distinct_inputs": _Optional(_Integer(1)),
        "poison_fraction": _PROBABILITY,
        "trace": _Text(non_empty=True),
        "speedup": _POSITIVE,
        "arrivals": _Text(non_empty=True),
        "job": _Text(name_like=True),
        "route": _Text(name_like=True),
        "tenant": _Text(name_like=True),
    },
    required=frozenset({"type"}),
    what="workload",
    variant_key="type",
    variants=_WORKLOAD_KEYS,
    required_by_variant={
        "burst": frozenset({"count"}),
        "trace": frozenset({"trace"}),
        "replay": frozenset({"arrivals"}),
    },
)

# Job templates ([[jobs]]): see aiqsim/sim/job_config.py for what each key means.
_SIZE_KEYS = {  # a stage's size: any workload cost distribution, or a ratio of an earlier stage's
    **_COST_KEYS,
    "from_stage": frozenset({"dist", "stage", "ratio", "output_fraction"}),
}

_STAGE_SIZE = _Table(
    {
        "dist": _Choice(tuple(_SIZE_KEYS)),
        "mean": _SIZE_MEAN,
        "sigma": _SIZE_SIGMA,
        "low": _NON_NEGATIVE,
        "high": _NON_NEGATIVE,
        "stage": _Text(name_like=True),
        "ratio": _POSITIVE,
        "output_fraction": _PROBABILITY,
    },
    what="stage size",
    variant_key="dist",
    variant_default="fixed",
    variants=_SIZE_KEYS,
    required_by_variant={"from_stage": frozenset({"stage"})},
)

_FANOUT_KEYS = {
    "fixed": frozenset({"dist", "mean"}),
    "lognormal": frozenset({"dist", "mean", "sigma"}),
    "uniform": frozenset({"dist", "low", "high"}),
}

_FANOUT = _Table(
    {
        "dist": _Choice(tuple(_FANOUT_KEYS)),
        "mean": _Number(1.0),
        "sigma": _SIZE_SIGMA,
        "low": _Number(1.0),
        "high": _Number(1.0),
    },
    what="fan-out",
    variant_key="dist",
    variant_default="fixed",
    variants=_FANOUT_KEYS,
)

_STAGE = _Table(
    {
        "name": _Text(name_like=True),
        "provider": _Text(),
        "after": _Names(),
        "size": _STAGE_SIZE,
        "fanout": _FANOUT,
        "fallback": _Optional(_Text()),
        "route": _Text(name_like=True),
    },
    required=frozenset({"name"}),
    what="stage",
    one_of=("provider", "route"),
)

_JOB = _Table(
    {
        "name": _Text(name_like=True),
        "description": _Text(),
        "stages": _Array(_STAGE, "[[jobs.stages]]", named=True),
    },
    required=frozenset({"name", "stages"}),
    what="job template",
)

_CRASH = _Table(
    {
        "at_s": _Optional(_NON_NEGATIVE),
        "after_writes": _Optional(_Integer(1)),
        "restart_after_s": _NON_NEGATIVE,
        "torn_write": _Boolean(),
    },
    what="crash",
)

_OVERLOAD = _Table(
    {
        "retry_budget": _Choice(("none", "token_bucket", "ratio")),
        "budget_capacity": _POSITIVE,
        "budget_retry_cost": _NON_NEGATIVE,
        "budget_timeout_retry_cost": _NON_NEGATIVE,
        "budget_ratio": _PROBABILITY,
        "budget_window_s": _POSITIVE,
        "circuit_breaker": _Boolean(),
        "breaker_failure_threshold": _Integer(1),
        "breaker_window_s": _POSITIVE,
        "breaker_cooldown_s": _POSITIVE,  # CircuitBreaker refuses 0: it would never stay open
        "breaker_half_open_probes": _Integer(1),
        "throttle": _Boolean(),
        "throttle_k": _POSITIVE,
        "throttle_window_s": _POSITIVE,
        "adaptive_rate": _Boolean(),
    },
    what="overload protection",
)

_TENANT = _Table(
    {"weight": _POSITIVE, "max_queued": _Optional(_Integer(0))},
    what="tenant",
)

_BUDGET = _Table(
    {
        "per_day": _Optional(_NON_NEGATIVE),
        "per_tenant_per_day": _Optional(_NON_NEGATIVE),
        "prices": _Prices(),
        "day_s": _POSITIVE,
    },
    what="spend budget",
)


_FLEET = _Table(
    {
        "workers": _Integer(1),
        "quota": _Choice(("shared", "split")),
        "routing": _Choice(("round_robin", "weighted")),
        "weights": _Weights(),
        "slot_poll_s": _Number(0.001),  # a poll more often than every millisecond spins the run
        "worker_concurrency": _Optional(_Integer(1)),
    },
    what="fleet",
)

_ROUTE = _Table(
    {
        "name": _Text(name_like=True),
        "providers": _Names(),
        "policy": _Choice(ROUTE_POLICIES),
        "weights": _Map(_POSITIVE, "a table of numbers > 0 keyed by provider name (weights = { east = 3 })"),
        "retry_elsewhere": _Boolean(),
    },
    required=frozenset({"name", "providers"}),
    what="route",
)

_SCENARIO_SECTION = _Table(
    {
        "name": _Text(non_empty=True),
        "description": _Text(),
        "seed": _Integer(0),
        "duration_s": _POSITIVE,
        "drain_s": _NON_NEGATIVE,
        "timeline_step_s": _POSITIVE,
    },
    required=frozenset({"name"}),
    what="scenario section",
)

_FILE = _Table(
    {
        "scenario": _SCENARIO_SECTION,
        "providers": _Array(_PROVIDER, "[[providers]]", named=True),
        "quotas": _Map(_QUOTA),
        "retry": _RETRY,
        "dispatch": _DISPATCH,
        "store": _STORE,
        "workloads": _Array(_WORKLOAD, "[[workloads]]"),
        "crashes": _Array(_CRASH, "[[crashes]]"),
        "overload": _OVERLOAD,
        "jobs": _Array(_JOB, "[[jobs]]", named=True),
        "fleet": _FLEET,
        "routes": _Array(_ROUTE, "[[routes]]", named=True),
        "tenants": _Map(_TENANT, "a table of tables keyed by tenant name ([tenants.NAME])", "a tenant name"),
        "budget": _BUDGET,
    },
    required=frozenset({"scenario", "providers", "workloads"}),
    what="scenario file",
)

SECTION_FIELDS: dict[type, _Table] = {
    Scenario: _SCENARIO_SECTION,
    ProviderConfig: _PROVIDER,
    OutageConfig: _OUTAGE,
    ClientQuotaConfig: _QUOTA,
    RetryConfig: _RETRY,
    DispatchConfig: _DISPATCH,
    StoreConfig: _STORE,
    WorkloadConfig: _WORKLOAD,
    CostConfig: _COST,
    CrashConfig: _CRASH,
    OverloadConfig: _OVERLOAD,
    JobConfig: _JOB,
    StageConfig: _STAGE,
    StageSizeConfig: _STAGE_SIZE,
    FanoutConfig: _FANOUT,
    FleetConfig: _FLEET,
    RouteConfig: _ROUTE,
    TenantConfig: _TENANT,
    BudgetConfig: _BUDGET,
}
"""Which file table describes which config record (tests check they list the same fields)."""


_JOB_WORKLOAD_EXCLUDED = ("provider", "cost", "poison_fraction")
"""Workload keys a job workload has no use for: its stages name the providers and the sizes."""
