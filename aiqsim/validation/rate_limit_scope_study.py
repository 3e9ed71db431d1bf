"""The evidence behind the default rate-limit scope: both sides of a 429, on the virtual clock.

A 429 pause must be wide enough and no wider. Two lab experiments, each run with the production
scheduler on SimPy against a simulated provider, measure the two ways a scope can be wrong:

- :func:`random_429_throughput`: an otherwise instant provider answers a random 5% of requests
  with 429 (Retry-After 1 s) while its quota has room. Pausing the lane on each of them throws
  the throughput away; the target is >= 80% of the same run without 429s.
- :func:`server_quota_overrun`: the client's own quota is set above the server's real
  ``server_requests_per_min``, so the server's window fills and it refuses every request until
  it has room again. Pausing only the task lets every other queued task walk into the same 429;
  the target is near-zero server 429s after the first.

:func:`rate_limit_scope_study` runs both for every scope. ``benchmarks/bench_rate_limit_scope.py``
prints the table recorded in ``benchmarks/RESULTS.md``; ``tests/test_rate_limit_scope.py`` holds
the default to both targets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiqsim.scheduler.events import LanePaused
from aiqsim.scheduler.rate_limit_scope import RateLimitScope
from aiqsim.sim.scenario import parse_scenario
from aiqsim.sim.simulate import simulate

__all__ = [
    "OverrunRun",
    "ThroughputRun",
    "random_429_throughput",
    "rate_limit_scope_study",
    "server_quota_overrun",
]


@dataclass(frozen=True, slots=True)
class ThroughputRun:
    """One run of the random-429 experiment: ``tasks_per_s`` finished tasks per virtual second."""

    scope: str
    rate_limit_prob: float
    seed: int
    tasks: int
    tasks_per_s: float
    rate_limited: int
    lane_pauses: int


@dataclass(frozen=True, slots=True)
class OverrunRun:
    """One run of the server-quota experiment.

    ``rate_limited`` counts every 429 the server sent; ``accepted`` the requests it admitted.
    ``tasks_failed`` tasks ran out of attempts (each spent its retries on 429s).
    """

    scope: str
    reports_quota: bool
    seed: int
    tasks: int
    rate_limited: int
    accepted: int
    lane_pauses: int
    tasks_failed: int
    tasks_per_s: float

    @property
    def rate_limited_after_first(self) -> int:
        """Server 429s after the first one (the first is how the client learns of the limit)."""
        return max(0, self.rate_limited - 1)


def _lane_pauses(events: Any) -> int:
    return sum(1 for event in events if isinstance(event, LanePaused))


def random_429_throughput(
    scope: RateLimitScope | str,
    *,
    rate_limit_prob: float = 0.05,
    retry_after_s: float = 1.0,
    tasks: int = 2000,
    client_requests_per_min: float = 6000.0,
    seed: int = 0,
) -> ThroughputRun:
    """Finished tasks per virtual second for a burst of ``tasks`` through an instant provider.

    The client quota (``client_requests_per_min``, burst 1: 100 requests/s by default) is the only
    limit; the provider answers at once and sends a 429 with ``retry_after_s`` to a random
    ``rate_limit_prob`` of requests. The server has no quota windows, so its 429s say nothing
    about a quota (``quota_spent`` is ``None``).
    """
    scenario = parse_scenario(
        {
            "scenario": {"name": "random_429_throughput", "seed": seed, "duration_s": 1.0, "drain_s": 3600},
            "providers": [
                {
                    "name": "llm",
                    "latency_base_s": 0.0,
                    "latency_per_unit_s": 0.0,
                    "rate_limit_prob": rate_limit_prob,
                    "rate_limit_retry_after_s": retry_after_s,
                }
            ],
            "quotas": {"llm": {"requests_per_min": client_requests_per_min, "request_burst": 1}},
            "retry": {
                "strategy": "full_jitter",
                "base_s": 0.1,
                "cap_s": 2.0,
                "max_attempts": 10,
                "rate_limit_scope": str(RateLimitScope(scope)),
            },
            "dispatch": {"background_limit": tasks},
            "workloads": [
                {
                    "type": "burst",
                    "provider": "llm",
                    "count": tasks,
                    "burst_s": 0.0,
                    "cost": {"dist": "fixed", "mean": 10},
                }
            ],
        },
        source="<random_429_throughput>",
    )
    result = simulate(scenario, seed=seed)
    summary = result.summary
    return ThroughputRun(
        scope=str(RateLimitScope(scope)),
        rate_limit_prob=rate_limit_prob,
        seed=seed,
        tasks=tasks,
        tasks_per_s=float(summary["goodput_per_s"]),
        rate_limited=int(summary["rate_limited"]),
        lane_pauses=_lane_pauses(result.events),
    )


def server_quota_overrun(
    scope: RateLimitScope | str,
    *,
    server_requests_per_min: float = 600.0,
    client_requests_per_min: float = 1200.0,
    arrivals_per_s: float = 15.0,
    duration_s: float = 120.0,
    reports_quota: bool = True,
    seed: int = 0,
) -> OverrunRun:
    """Server 429s when the client's quota (``client_requests_per_min``) is above the server's.

    Poisson arrivals at ``arrivals_per_s`` (above the server's rate) for ``duration_s``; the
    provider takes 0.2 s a call and enforces ``server_requests_per_min`` over a sliding 60 s window,
    answering 429 with the seconds until it has room (``quota_spent`` is ``True``, as
    ``x-ratelimit-remaining-requests: 0`` says; ``reports_quota=False``: a server that does not
    say, so ``adaptive`` has only the streak of 429s to go by).
    """
    scenario = parse_scenario(
        {
            "scenario": {
                "name": "server_quota_overrun",
                "seed": seed,
                "duration_s": duration_s,
                "drain_s": 3600,
            },
            "providers": [
                {
                    "name": "llm",
                    "latency_base_s": 0.2,
                    "latency_per_unit_s": 0.0,
                    "server_requests_per_min": server_requests_per_min,
                    "reports_quota": reports_quota,
                }
            ],
            "quotas": {
                "llm": {"requests_per_min": client_requests_per_min, "request_burst": 5, "concurrency": 32}
            },
            "retry": {
                "strategy": "full_jitter",
                "base_s": 0.5,
                "cap_s": 30.0,
                "max_attempts": 8,
                "rate_limit_scope": str(RateLimitScope(scope)),
            },
            "dispatch": {"background_limit": "none"},
            "workloads": [
                {
                    "type": "poisson",
                    "provider": "llm",
                    "rate_per_s": arrivals_per_s,
                    "cost": {"dist": "fixed", "mean": 10},
                }
            ],
        },
        source="<server_quota_overrun>",
    )
    result = simulate(scenario, seed=seed)
    summary = result.summary
    accepted = sum(1 for e in result.executions if e.outcome != "rate_limited")
    return OverrunRun(
        scope=str(RateLimitScope(scope)),
        reports_quota=reports_quota,
        seed=seed,
        tasks=int(summary["tasks_submitted"]),
        rate_limited=int(summary["rate_limited"]),
        accepted=accepted,
        lane_pauses=_lane_pauses(result.events),
        tasks_failed=int(summary["tasks_failed"]),
        tasks_per_s=float(summary["goodput_per_s"]),
    )


def rate_limit_scope_study(seeds: range | list[int] = range(3)) -> dict[str, Any]:
    """Both experiments for every scope (and the no-429 baseline), per seed.

    Returns ``{"baseline": [ThroughputRun...], "random_429": {scope: [...]}, "overrun": {scope: [...]},
    "overrun_unreported": {scope: [...]}}`` (the last: a server whose 429s do not say whether its
    quota is spent).
    """
    seeds = list(seeds)
    return {
        "baseline": [random_429_throughput("task", rate_limit_prob=0.0, seed=s) for s in seeds],
        "random_429": {
            str(scope): [random_429_throughput(scope, seed=s) for s in seeds] for scope in RateLimitScope
        },
        "overrun": {
            str(scope): [server_quota_overrun(scope, seed=s) for s in seeds] for scope in RateLimitScope
        },
        "overrun_unreported": {
            str(scope): [server_quota_overrun(scope, reports_quota=False, seed=s) for s in seeds]
            for scope in RateLimitScope
        },
    }
