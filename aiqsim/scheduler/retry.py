"""Retry policy and the attempt-gate hook for overload protection."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from aiqsim.core.backoff import BackoffStrategy, FullJitter
from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import POISON_AFTER_ATTEMPTS, AttemptRejectedError, FailureClass
from aiqsim.core.numeric import LARGEST_WHOLE, is_real, is_whole
from aiqsim.scheduler.arguments import SchedulerArgumentError, SchedulerArgumentTypeError
from aiqsim.scheduler.rate_limit_scope import (
    DEFAULT_RATE_LIMIT_SCOPE,
    AdaptiveScopeRule,
    RateLimitScope,
    rate_limit_scope,
)

DEFAULT_MAX_RETRY_AFTER_S = 300.0
"""Five minutes: longer than any per-minute quota window, short of a spent daily quota."""


_NOT_BUILT = "no RetryPolicy was built"


def _whole_at_least_one(value: float) -> bool:
    """A count from 1 to :data:`~aiqsim.core.numeric.LARGEST_WHOLE`, the bound a scenario file sets
    on every integer: ``1e308`` is a whole float, but no attempt count, and was accepted."""
    return is_whole(value, 1, LARGEST_WHOLE)


_COUNT = "a whole number >= 1 and <= 2**63"


def _check(name: str, value: Any, accepted: str, ok: Callable[[float], bool]) -> None:
    """Refuse a :class:`RetryPolicy` field that is no number (``None`` passes where ``accepted`` allows
    it) or that ``ok`` rejects, naming the field and what it accepts."""
    if value is None and "None" in accepted:
        return
    message = f"{name} must be {accepted}, got {value!r}; {_NOT_BUILT}"
    if not is_real(value):
        raise SchedulerArgumentTypeError(message)
    if not ok(value):
        raise SchedulerArgumentError(message)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a running task retries: strategy, attempt cap, per-attempt timeout.

    Retries happen inside ``running`` (a task never goes back to the queue on its own).
    ``attempt_timeout_s`` bounds one provider call; ``None`` waits forever (not advised:
    a lost response then hangs the task).

    ``max_retry_after_s`` is the longest Retry-After the scheduler will wait out. A 429 asking
    for more (a day: a spent daily quota, or a broken header) fails that task at once instead
    of retrying before the server allows it, and pauses the provider for at most this long, so
    one answer cannot freeze a lane for days. ``None`` trusts any value.

    ``rate_limit_scope`` says what a 429's Retry-After pauses: ``"lane"`` (every task of the
    provider), ``"task"`` (only the task that saw it) or ``"adaptive"`` (the default: the lane when
    the 429 says the quota is spent, per ``adaptive_rule``, else the task); see
    :mod:`aiqsim.scheduler.rate_limit_scope`. The task that saw the 429 always waits it out.

    ``first_token_timeout_s`` bounds, for a streamed task (``submit(..., stream=True)``), the wait
    for the answer's first chunk; ``attempt_timeout_s`` still bounds the whole attempt. A first-token
    deadline that passes abandons the attempt before anything reached the consumer
    (:class:`~aiqsim.core.failures.FirstTokenTimeoutError`, retried like a timeout); the whole-attempt
    deadline passing after the first chunk cuts the stream (:class:`~aiqsim.core.failures.StreamCutError`,
    billed). ``None`` (the default): only ``attempt_timeout_s`` applies. Ignored for calls that do not
    stream.
    """

    backoff: BackoffStrategy = field(default_factory=lambda: FullJitter(base_s=0.5, cap_s=60.0))
    max_attempts: int = 5
    attempt_timeout_s: float | None = 60.0
    honour_retry_after: bool = True
    poison_after: int = POISON_AFTER_ATTEMPTS
    max_retry_after_s: float | None = DEFAULT_MAX_RETRY_AFTER_S
    rate_limit_scope: RateLimitScope = DEFAULT_RATE_LIMIT_SCOPE
    adaptive_rule: AdaptiveScopeRule = field(default_factory=AdaptiveScopeRule)
    first_token_timeout_s: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate_limit_scope", rate_limit_scope(self.rate_limit_scope))
        if not isinstance(self.adaptive_rule, AdaptiveScopeRule):
            raise SchedulerArgumentTypeError(
                f"adaptive_rule must be an AdaptiveScopeRule, got {self.adaptive_rule!r}; {_NOT_BUILT}"
            )
        if not callable(getattr(self.backoff, "delay", None)):  # what the attempt loop calls
            raise SchedulerArgumentTypeError(
                f"backoff must be a backoff strategy (FullJitter(), ExponentialBackoff()..., or "
                f"backoff_from_name('full_jitter')), got {self.backoff!r}; {_NOT_BUILT}"
            )
        _check("max_attempts", self.max_attempts, f"{_COUNT} (1: no retries)", _whole_at_least_one)
        _check("attempt_timeout_s", self.attempt_timeout_s, "> 0 or None (None: no limit)", lambda n: n > 0)
        _check(
            "first_token_timeout_s",
            self.first_token_timeout_s,
            "a finite number > 0 or None (None: only attempt_timeout_s applies)",
            lambda n: 0 < n < math.inf,
        )
        _check(
            "poison_after",
            self.poison_after,
            f"{_COUNT} (attempts before a key is poison)",
            _whole_at_least_one,
        )
        # a whole float (3.0) or a numpy integer is kept as the int it stands for
        object.__setattr__(self, "max_attempts", int(self.max_attempts))
        object.__setattr__(self, "poison_after", int(self.poison_after))
        longest = self.max_retry_after_s
        _check("max_retry_after_s", longest, "> 0 or None (None: trust any value)", lambda n: n > 0)
        if not isinstance(self.honour_retry_after, bool):  # "no" or 0 would read as a truth value
            raise SchedulerArgumentTypeError(
                f"honour_retry_after must be True or False, got {self.honour_retry_after!r}; {_NOT_BUILT}"
            )

    def retry_after_wait(self, retry_after_s: float | None) -> tuple[float | None, bool]:
        """How long a 429's Retry-After pauses the provider, and whether it is too long to wait out.

        ``(None, False)`` when there is no Retry-After or the policy ignores it.
        """
        if retry_after_s is None or not self.honour_retry_after:
            return None, False
        cap = self.max_retry_after_s
        if cap is not None and retry_after_s > cap:
            return cap, True
        return retry_after_s, False


def check_retry_policy(value: Any, name: str, consequence: str) -> None:
    """Refuse ``value`` unless it is a :class:`RetryPolicy`, naming ``name`` and what was not done."""
    if not isinstance(value, RetryPolicy):
        raise SchedulerArgumentTypeError(f"{name}: expected a RetryPolicy, got {value!r}; {consequence}")


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


# Optional extensions of the protocol (see aiqsim.overload.gate for the full story): a gate may set
# ``accepts_attempt_context = True`` to receive ``task_id=``/``cause=``, define
# ``attempt_abandoned(provider, is_retry, sent, now)`` and ``seconds_until_attempt(provider, is_retry, now)``;
# one that also sets ``accepts_attempt_cost = True`` receives the attempt's ``estimate=`` and ``tenant=``
# (before) and the billed ``usage=`` (after). ``before_attempt`` may refuse with an
# :class:`~aiqsim.core.failures.AttemptRejectedError` instead of a string: the task fails with that error.
# The scheduler calls every gate through these helpers, so plain two-method gates keep working.

GateRefusal = str | AttemptRejectedError
"""What a gate's ``before_attempt`` refuses with: a short reason, or the error the task fails with."""


def accepts_attempt_context(gate: Any) -> bool:
    """Whether ``gate`` takes the ``task_id=`` / ``cause=`` keyword arguments."""
    return bool(getattr(gate, "accepts_attempt_context", False))


def accepts_attempt_cost(gate: Any) -> bool:
    """Whether ``gate`` also takes ``estimate=`` / ``tenant=`` (before) and ``usage=`` (after): the
    attempt's estimated units (the task's ``cost_estimate``), its tenant (``None``: none) and the units
    the provider billed (``None``: the attempt failed, nothing reported). A spend budget needs them."""
    return bool(getattr(gate, "accepts_attempt_cost", False)) and accepts_attempt_context(gate)


def rejection_error(refusal: GateRefusal) -> AttemptRejectedError:
    """The error a task refused by a gate fails with: the gate's own, or an
    :class:`~aiqsim.core.failures.AttemptRejectedError` carrying its reason."""
    return refusal if isinstance(refusal, AttemptRejectedError) else AttemptRejectedError(refusal)


def ask_gate(
    gate: Any,
    provider: str,
    is_retry: bool,
    now: float,
    rng: random.Random,
    *,
    task_id: str | None = None,
    cause: BaseException | None = None,
    estimate: float | None = None,
    tenant: str | None = None,
) -> GateRefusal | None:
    """Call ``gate.before_attempt`` with the context it accepts; its refusal or ``None``."""
    if accepts_attempt_cost(gate):
        return gate.before_attempt(
            provider, is_retry, now, rng, task_id=task_id, cause=cause, estimate=estimate, tenant=tenant
        )
    if accepts_attempt_context(gate):
        return gate.before_attempt(provider, is_retry, now, rng, task_id=task_id, cause=cause)
    return gate.before_attempt(provider, is_retry, now, rng)


def tell_gate(
    gate: Any,
    provider: str,
    is_retry: bool,
    failure: FailureClass | None,
    error: BaseException | None,
    now: float,
    *,
    task_id: str | None = None,
    usage: float | None = None,
) -> None:
    """Call ``gate.after_attempt`` with the context it accepts."""
    if accepts_attempt_cost(gate):
        gate.after_attempt(provider, is_retry, failure, error, now, task_id=task_id, usage=usage)
    elif accepts_attempt_context(gate):
        gate.after_attempt(provider, is_retry, failure, error, now, task_id=task_id)
    else:
        gate.after_attempt(provider, is_retry, failure, error, now)


def tell_gates(gates: Any, *outcome: Any, task_id: str | None = None, usage: float | None = None) -> None:
    """:func:`tell_gate` for each of ``gates`` (``outcome``: its provider, is_retry, failure, error,
    now). A gate that raises does not keep the others from hearing the outcome (a breaker not told
    would wait on its probe for ever); the first error is raised once all were told."""
    broken: Exception | None = None
    for gate in gates:
        try:
            tell_gate(gate, *outcome, task_id=task_id, usage=usage)
        except Exception as error:
            broken = broken or error
    if broken is not None:
        raise broken


def abandon_at_gate(
    gate: Any, provider: str, is_retry: bool, sent: bool, now: float, *, task_id: str | None = None
) -> None:
    """Tell ``gate`` an admitted attempt will report no outcome (if it listens)."""
    hook = getattr(gate, "attempt_abandoned", None)
    if hook is None:
        return
    if accepts_attempt_context(gate):
        hook(provider, is_retry, sent, now, task_id=task_id)
    else:
        hook(provider, is_retry, sent, now)


def gate_wait_s(gate: Any, provider: str, is_retry: bool, now: float) -> float:
    """Seconds ``gate`` asks to wait before the attempt (``0.0`` for gates that never delay)."""
    query = getattr(gate, "seconds_until_attempt", None)
    if query is None:
        return 0.0
    wait = query(provider, is_retry, now)
    # a gate's bug must not hold a slot for ever (inf) or spin (NaN): the attempt fails, naming it
    seconds = math.nan
    if is_real(wait):
        try:
            seconds = float(wait)  # type: ignore[arg-type]
        except OverflowError:  # an int past any float (10**400): no finite wait either
            pass
    if not seconds < math.inf:
        raise ConfigurationError(
            f"{type(gate).__name__}.seconds_until_attempt({provider!r}) returned {wait!r}; "
            "expected a finite number of seconds (0 or less: no wait)"
        )
    return max(0.0, seconds)


def ask_gates(
    gates: Iterable[Any],
    provider: str,
    is_retry: bool,
    now: float,
    rng: random.Random,
    *,
    task_id: str | None = None,
    cause: BaseException | None = None,
    estimate: float | None = None,
    tenant: str | None = None,
) -> GateRefusal | None:
    """Ask each gate in turn; the first refusal wins, and the gates that had already admitted the
    attempt are told (in reverse order) that it was abandoned unsent, so none keeps a charge for it."""
    admitted: list[Any] = []
    for gate in gates:
        reason = ask_gate(
            gate, provider, is_retry, now, rng, task_id=task_id, cause=cause, estimate=estimate, tenant=tenant
        )
        if reason is not None:
            for earlier in reversed(admitted):
                abandon_at_gate(earlier, provider, is_retry, False, now, task_id=task_id)
            return reason
        admitted.append(gate)
    return None


def check_gate_providers(
    gates: Iterable[Any], providers: Iterable[str], tenants: Iterable[str] | None = None
) -> None:
    """Let each gate (and each member of a chain) that names providers or tenants refuse names it
    does not know, before any call: a gate may define ``check_providers(providers)`` and
    ``check_tenants(tenants)`` (called only for a scheduler with tenants) raising a
    :class:`~aiqsim.core.errors.ConfigurationError` (a spend budget's price for an unknown provider,
    its limit for an unknown tenant)."""
    names = sorted(providers)
    known = None if tenants is None else sorted(tenants)
    for gate in gates:
        members = getattr(gate, "gates", None)
        if isinstance(members, tuple):
            check_gate_providers(members, names, known)
        check = getattr(gate, "check_providers", None)
        if callable(check):
            check(names)
        check = getattr(gate, "check_tenants", None)
        if known is not None and callable(check):
            check(known)


def asks_before_backoff(gate: Any) -> bool:
    """Whether ``gate`` decides a retry the moment it is decided, before the backoff sleep.

    A retry quota does (``asks_before_backoff = True`` on the gate): the AWS SDKs ask their retry
    quota first and, when it cannot pay for the retry, give up at once with no delay, instead of
    sleeping the backoff only to be refused. Every other gate (breaker, throttle, send rate) is
    asked just before the attempt is sent, so it judges the provider as it is then.
    """
    return bool(getattr(gate, "asks_before_backoff", False))


def split_gates(gates: Iterable[Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``(asked before a retry's backoff, asked before sending)``, in the given order.

    A chain of gates (an object whose ``gates`` attribute is a tuple of gates, e.g.
    :class:`~aiqsim.overload.GateChain`) that holds a gate of the first kind is split into its
    members; a chain without one stays whole.
    """
    early: list[Any] = []
    late: list[Any] = []
    for gate in gates:
        members = getattr(gate, "gates", None)
        if isinstance(members, tuple) and any(asks_before_backoff(m) for m in members):
            inner_early, inner_late = split_gates(members)
            early.extend(inner_early)
            late.extend(inner_late)
        elif asks_before_backoff(gate):
            early.append(gate)
        else:
            late.append(gate)
    return tuple(early), tuple(late)
