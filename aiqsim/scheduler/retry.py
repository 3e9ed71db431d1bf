"""Retry policy and the attempt-gate hook for overload protection."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from aiqsim.core.backoff import BackoffStrategy, FullJitter
from aiqsim.core.failures import POISON_AFTER_ATTEMPTS, FailureClass


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a running task retries: strategy, attempt cap, per-attempt timeout.

    Retries happen inside ``running`` (a task never goes back to the queue on its own).
    ``attempt_timeout_s`` bounds one provider call; ``None`` waits forever (not advised:
    a lost response then hangs the task).
    """

    backoff: BackoffStrategy = field(default_factory=lambda: FullJitter(base_s=0.5, cap_s=60.0))
    max_attempts: int = 5
    attempt_timeout_s: float | None = 60.0
    honour_retry_after: bool = True
    poison_after: int = POISON_AFTER_ATTEMPTS

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.attempt_timeout_s is not None and not self.attempt_timeout_s > 0:
            raise ValueError(f"attempt_timeout_s must be > 0 or None, got {self.attempt_timeout_s!r}")
        if self.poison_after < 1:
            raise ValueError(f"poison_after must be >= 1, got {self.poison_after}")


@runtime_checkable
class AttemptGate(Protocol):
    """A guard consulted before every provider attempt and told every outcome.

    Retry budgets, circuit breakers and adaptive throttles implement this. ``before_attempt``
    returns ``None`` to allow the attempt, or a short reason to refuse it (the task then fails
    fast with :class:`~aiqsim.core.failures.AttemptRejectedError`).
    """

    def before_attempt(self, provider: str, is_retry: bool, now: float, rng: random.Random) -> str | None: ...

    def after_attempt(
        self,
        provider: str,
        is_retry: bool,
        failure: FailureClass | None,
        error: BaseException | None,
        now: float,
    ) -> None: ...
