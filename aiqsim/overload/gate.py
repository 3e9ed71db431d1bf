"""How the overload policies plug into the scheduler, and how to chain several of them.

The scheduler's :class:`~aiqsim.scheduler.retry.AttemptGate` protocol has two calls:
``before_attempt(provider, is_retry, now, rng)`` (``None`` admits the attempt, a string
refuses it and the task fails fast) and ``after_attempt(provider, is_retry, failure, error,
now)`` (``failure is None`` on success). Every policy here implements it as is, so
``Scheduler(gates=[CircuitBreaker(), RetryTokenBucket()])`` works today.

Three optional extensions make the policies exact; each is backward compatible (a gate
without them keeps working, a scheduler that does not call them loses only precision):

*Attempt context.* A gate whose ``accepts_attempt_context`` is true also accepts the
keyword arguments ``task_id=`` (both hooks) and ``cause=`` (``before_attempt``: the error
of the previous attempt, i.e. why this one is a retry). With them a retry budget charges
exactly the cost of *this* task's failure and refunds exactly what *this* retry took, and a
circuit breaker recognises its probe's own outcome. Without them (``task_id=None``) the
policies fall back to per-provider bookkeeping and document their approximation.

*Abandoned attempts.* ``attempt_abandoned(provider, is_retry, sent, now, *, task_id=None)``
tells a gate that an attempt it admitted will never report an outcome: ``sent=False`` when
the attempt was not sent after all (a later gate refused it), ``sent=True`` when it was
sent but nobody waits for the answer any more (the task was cancelled mid-call). Without it
a refusal by a second gate leaks the first gate's admission (retry tokens charged for an
attempt never made; worse, a half-open breaker's probe slot held forever).

*Waiting instead of refusing.* ``seconds_until_attempt(provider, is_retry, now) -> float``
is a pure query: how long the caller should wait before ``before_attempt`` can admit the
attempt (``0.0``: now). A scheduler that sleeps until every gate answers ``0.0`` and then
calls ``before_attempt`` in the same step (no await in between) never sees a refusal
from a delaying gate (AWS adaptive mode, circuit breaker ``mode="wait"``).

*Attempt cost.* A gate that also sets ``accepts_attempt_cost`` receives ``estimate=`` and
``tenant=`` in ``before_attempt`` (the task's ``cost_estimate`` in quota units, its tenant) and
``usage=`` in ``after_attempt`` (the units the provider billed for a success; ``None`` after a
failure). A spend budget (:class:`~aiqsim.overload.Budget`) prices attempts with them, and
refuses with its own error (:class:`~aiqsim.core.failures.BudgetExceeded`): ``before_attempt``
may return an :class:`~aiqsim.core.failures.AttemptRejectedError` instead of a reason string.

:class:`GateChain` implements all four over a list of gates, so one chained gate gives the
current scheduler the refusal rollback; the helper functions (defined next to the protocol in
:mod:`aiqsim.scheduler.retry`, re-exported here) call a gate with whatever it supports.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from aiqsim.core.failures import FailureClass
from aiqsim.scheduler.retry import (  # the calling convention lives with the protocol
    GateRefusal,
    abandon_at_gate,
    accepts_attempt_context,
    ask_gate,
    ask_gates,
    gate_wait_s,
    tell_gate,
)

if TYPE_CHECKING:
    from random import Random  # the injected generator's type; no randomness is imported

__all__ = [
    "GateChain",
    "OverloadGate",
    "abandon_at_gate",
    "accepts_attempt_context",
    "ask_gate",
    "ask_gates",
    "gate_wait_s",
    "tell_gate",
]


class OverloadGate:
    """Base of the overload policies: the attempt-context flag and no-op optional hooks."""

    accepts_attempt_context: ClassVar[bool] = True

    def before_attempt(
        self,
        provider: str,
        is_retry: bool,
        now: float,
        rng: Random,
        *,
        task_id: str | None = None,
        cause: BaseException | None = None,
    ) -> str | None:
        return None

    def after_attempt(
        self,
        provider: str,
        is_retry: bool,
        failure: FailureClass | None,
        error: BaseException | None,
        now: float,
        *,
        task_id: str | None = None,
    ) -> None:
        return None

    def attempt_abandoned(
        self, provider: str, is_retry: bool, sent: bool, now: float, *, task_id: str | None = None
    ) -> None:
        return None

    def seconds_until_attempt(self, provider: str, is_retry: bool, now: float) -> float:
        return 0.0


class GateChain(OverloadGate):
    """Several gates consulted in order, acting as one.

    ``before_attempt`` asks each gate in turn and stops at the first refusal; the gates
    that had already admitted the attempt are told it was abandoned unsent (in reverse
    order), so no gate keeps a charge or a probe slot for an attempt that never happened.
    Outcomes and abandonments go to every gate; the wait is the longest any gate asks for.

    Order matters only for what a gate *sees*: a gate after a refusing one never hears of
    that attempt. Put cheap state checks first (circuit breaker), then the throttle, then
    budgets that spend tokens (retry budget, adaptive send rate).
    """

    accepts_attempt_cost: ClassVar[bool] = True  # forwarded to the members that take it

    def __init__(self, gates: Iterable[Any]) -> None:
        self.gates: tuple[Any, ...] = tuple(gates)

    def before_attempt(
        self,
        provider: str,
        is_retry: bool,
        now: float,
        rng: Random,
        *,
        task_id: str | None = None,
        cause: BaseException | None = None,
        estimate: float | None = None,
        tenant: str | None = None,
    ) -> GateRefusal | None:
        return ask_gates(
            self.gates,
            provider,
            is_retry,
            now,
            rng,
            task_id=task_id,
            cause=cause,
            estimate=estimate,
            tenant=tenant,
        )

    def after_attempt(
        self,
        provider: str,
        is_retry: bool,
        failure: FailureClass | None,
        error: BaseException | None,
        now: float,
        *,
        task_id: str | None = None,
        usage: float | None = None,
    ) -> None:
        for gate in self.gates:
            tell_gate(gate, provider, is_retry, failure, error, now, task_id=task_id, usage=usage)

    def attempt_abandoned(
        self, provider: str, is_retry: bool, sent: bool, now: float, *, task_id: str | None = None
    ) -> None:
        for gate in reversed(self.gates):
            abandon_at_gate(gate, provider, is_retry, sent, now, task_id=task_id)

    def seconds_until_attempt(self, provider: str, is_retry: bool, now: float) -> float:
        return max((gate_wait_s(gate, provider, is_retry, now) for gate in self.gates), default=0.0)
