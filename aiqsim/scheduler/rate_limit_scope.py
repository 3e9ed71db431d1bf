"""How far a 429 reaches: the whole provider lane, or only the task that saw it.

A 429 with Retry-After means one of two things. Either the account's quota window is spent, and
every request of the provider would be refused until it refills: then the whole lane should pause,
or every queued task walks into the same 429. Or one request was turned away (an overloaded
replica, a random shed): then pausing the lane throws away the throughput of every other task for
the length of the Retry-After (5% random 429s at Retry-After 1 s cut an instant provider from 101
to 20 tasks/s). :class:`RateLimitScope` names the policy; :func:`pauses_lane` is the decision rule.

- ``lane``: every 429 with Retry-After pauses the lane (the behaviour before the policy existed).
- ``task``: only the task that saw the 429 waits (its retry delay is floored by Retry-After).
- ``adaptive``: the lane pauses when the signal says the quota is spent, else only the task.
  The signal, in order: ``RateLimitError.quota_spent`` when the provider said
  (``x-ratelimit-remaining-*: 0`` or an explicit quota error: ``True`` pauses, ``False`` does
  not); when it did not say, the lane's recent outcomes: a large share of 429s
  (:class:`AdaptiveScopeRule`, 30% by default) from several different tasks.

A hard :class:`~aiqsim.core.failures.QuotaExhaustedError` is fatal for its task and carries no
Retry-After, so it never pauses anything here.

Everything here is pure bookkeeping on the time it is given (no clock, no I/O): the scheduler
keeps one :class:`RateLimitHistory` per lane and asks :func:`pauses_lane` on each 429.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from math import (  # names, not math.x: one lookup fewer per call in the hot path
    exp,
    inf,
    isfinite,
)

from aiqsim.core.errors import ConfigurationError

__all__ = [
    "DEFAULT_RATE_LIMIT_SCOPE",
    "AdaptiveScopeRule",
    "RateLimitHistory",
    "RateLimitScope",
    "pauses_lane",
    "rate_limit_scope",
]


class RateLimitScope(enum.StrEnum):
    """What a 429's Retry-After pauses (see the module docstring)."""

    LANE = "lane"
    TASK = "task"
    ADAPTIVE = "adaptive"


DEFAULT_RATE_LIMIT_SCOPE = RateLimitScope.ADAPTIVE
"""Chosen by the lab (``benchmarks/RESULTS.md``, "Scope of a 429 pause"): with 5% random 429s at
Retry-After 1 s it keeps the throughput of ``task`` (``lane`` loses most of it), and when the client
overruns a real server quota it sends as few requests into the spent window as ``lane``."""


def rate_limit_scope(value: RateLimitScope | str) -> RateLimitScope:
    """``value`` as a :class:`RateLimitScope`; :class:`ConfigurationError` names the choices."""
    try:
        return RateLimitScope(value)
    except ValueError:
        choices = ", ".join(repr(scope.value) for scope in RateLimitScope)
        raise ConfigurationError(f"rate_limit_scope must be one of {choices}, got {value!r}") from None


@dataclass(frozen=True, slots=True)
class AdaptiveScopeRule:
    """When ``adaptive`` reads 429s that carry no quota signal as "the quota is spent".

    The lane looks spent when, over the last ``window_s`` or so (exponentially decayed counts), 429s
    were at least ``min_share`` of its attempts that either succeeded or got a 429 (other failures
    are not counted), and the recent 429s came from at least ``min_tasks`` different tasks (one task
    retrying into its own 429s proves nothing).
    Random 429s stay near their own rate (5% is far below 0.3); a spent server window refuses
    about the share of requests the client sends above the server's rate (half at twice it), and
    all of them while it is full.
    """

    min_share: float = 0.3
    min_tasks: int = 3
    window_s: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 < self.min_share <= 1.0:
            raise ConfigurationError(f"min_share must be in (0, 1], got {self.min_share!r}")
        if isinstance(self.min_tasks, bool) or not isinstance(self.min_tasks, int) or self.min_tasks < 1:
            raise ConfigurationError(f"min_tasks must be an integer >= 1, got {self.min_tasks!r}")
        if not self.window_s > 0:
            raise ConfigurationError(f"window_s must be > 0, got {self.window_s!r}")


@dataclass(slots=True)
class RateLimitHistory:
    """One lane's recent attempt outcomes, as counts decayed with time constant ``rule.window_s``.

    ``attempts`` and ``rate_limited`` are the decayed counts of outcomes and of 429s;
    ``recent_tasks`` the different tasks behind the 429s of the last ``window_s`` (at most
    ``rule.min_tasks`` are kept: more cannot change the decision). O(1) time and memory per outcome.
    """

    attempts: float = 0.0
    rate_limited: float = 0.0
    updated_at: float = -inf
    last_rate_limit_at: float = -inf
    recent_tasks: list[str] = field(default_factory=list)

    def _decay(self, now: float, rule: AdaptiveScopeRule) -> None:
        elapsed = now - self.updated_at
        if elapsed > 0:
            factor = exp(-elapsed / rule.window_s) if isfinite(elapsed) else 0.0
            self.attempts *= factor
            self.rate_limited *= factor
            self.updated_at = now

    def record_success(self, now: float, rule: AdaptiveScopeRule) -> None:
        """An attempt of the lane succeeded (other failures are not counted either way)."""
        self._decay(now, rule)
        self.attempts += 1.0

    def record_rate_limit(self, task_id: str, now: float, rule: AdaptiveScopeRule) -> bool:
        """Count a 429 seen by ``task_id`` at ``now``; whether the lane now looks spent (see the rule)."""
        self._decay(now, rule)
        self.attempts += 1.0
        self.rate_limited += 1.0
        tasks = self.recent_tasks
        if now - self.last_rate_limit_at > rule.window_s:
            tasks.clear()
        self.last_rate_limit_at = now
        if len(tasks) < rule.min_tasks and task_id not in tasks:
            tasks.append(task_id)
        return len(tasks) >= rule.min_tasks and self.rate_limited >= rule.min_share * self.attempts


def pauses_lane(scope: RateLimitScope, quota_spent: bool | None, looks_spent: bool) -> bool:
    """Whether a 429 with Retry-After pauses the whole lane (else only the task that saw it waits).

    ``quota_spent`` is the provider's own statement (``RateLimitError.quota_spent``); ``looks_spent``
    what the lane's recent 429s suggest when it said nothing (:meth:`RateLimitHistory.record_rate_limit`).
    """
    if scope is RateLimitScope.LANE:
        return True
    if scope is RateLimitScope.TASK:
        return False
    if quota_spent is not None:
        return quota_spent
    return looks_spent
