"""Overload protection beyond backoff: retry budgets, circuit breakers, adaptive throttling.

Every policy is an :class:`~aiqsim.scheduler.retry.AttemptGate`: the scheduler asks it
before each provider attempt and tells it each outcome. All state is per provider, all
arithmetic is pure (time comes in as ``now``, randomness from the ``rng`` passed in), so
the same objects protect production traffic and run in the SimPy lab.

* :class:`RetryTokenBucket`: AWS SDK standard-mode retry quota (retries drain, successes refill).
* :class:`RetryRatioBudget`: Google SRE per-client retry budget (retries < 10% of requests).
* :class:`CircuitBreaker`: closed / open / half-open per provider, with a transition log.
* :class:`ClientSideThrottle`: Google SRE adaptive throttling (local random rejection).
* :class:`AdaptiveRateLimiter`: AWS SDK adaptive mode (CUBIC client send rate).
* :class:`Budget`: daily spend budgets, overall and per tenant (refuses with ``BudgetExceeded``).
* :class:`GateChain`: several gates as one, rolling back admissions a later gate refuses.

Example::

    gates = [GateChain([CircuitBreaker(), RetryTokenBucket()])]
    scheduler = Scheduler(runtime, providers, gates=gates, rng=random.Random(0))
"""

from aiqsim.overload.adaptive_rate import (
    AdaptiveRateLimiter,
    AdaptiveSendRate,
    CubicParams,
    CubicRateCurve,
    SendRateMeter,
    SendTokenBucket,
    cubic_rate,
    cubic_zero_point,
)
from aiqsim.overload.budget import Budget, BudgetHold, BudgetLedger, LocalBudgetLedger, bills_failure
from aiqsim.overload.circuit_breaker import BreakerState, BreakerTransition, CircuitBreaker
from aiqsim.overload.gate import (
    GateChain,
    OverloadGate,
    abandon_at_gate,
    accepts_attempt_context,
    ask_gate,
    gate_wait_s,
    tell_gate,
)
from aiqsim.overload.retry_budget import RetryRatioBudget, RetryTokenBucket
from aiqsim.overload.signals import (
    is_overload_rejection,
    is_rate_limited,
    is_server_failure,
    is_server_failure_or_rate_limited,
    is_timeout,
)
from aiqsim.overload.throttle import ClientSideThrottle, rejection_probability
from aiqsim.overload.window import TimeWindow

__all__ = [
    "AdaptiveRateLimiter",
    "AdaptiveSendRate",
    "BreakerState",
    "BreakerTransition",
    "Budget",
    "BudgetHold",
    "BudgetLedger",
    "CircuitBreaker",
    "ClientSideThrottle",
    "CubicParams",
    "CubicRateCurve",
    "GateChain",
    "LocalBudgetLedger",
    "OverloadGate",
    "RetryRatioBudget",
    "RetryTokenBucket",
    "SendRateMeter",
    "SendTokenBucket",
    "TimeWindow",
    "abandon_at_gate",
    "accepts_attempt_context",
    "ask_gate",
    "bills_failure",
    "cubic_rate",
    "cubic_zero_point",
    "gate_wait_s",
    "is_overload_rejection",
    "is_rate_limited",
    "is_server_failure",
    "is_server_failure_or_rate_limited",
    "is_timeout",
    "rejection_probability",
    "tell_gate",
]
