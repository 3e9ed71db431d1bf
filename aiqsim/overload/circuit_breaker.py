"""A per-provider circuit breaker: stop calling a provider that keeps failing, probe it, resume.

States (per provider)::

    closed --(failure_threshold failures within window_s)--> open
    open --(cooldown_s after opening)--> half_open
    half_open --(a probe's outcome is not a failure)--> closed
    half_open --(a probe fails)--> open

While open, every attempt (first or retry) is refused with "circuit open"; the task fails
fast instead of waiting out a timeout against a dead provider. Half-open admits
``half_open_probes`` attempts at once and refuses the rest until a probe reports.

What counts as a failure is a predicate on the error; by default the provider's own
failures: 5xx, broken connections and timeouts (:func:`~aiqsim.overload.signals.is_server_failure`).
429 does **not** count by default: a rate-limited provider is up, the scheduler already
pauses the lane for its Retry-After, and opening the breaker on 429 would turn "slow
down" into "stop entirely". ``count_rate_limits=True`` counts it. Client errors (4xx,
schema violations, quota exhausted) never count: they say nothing about the provider's
health, and any outcome that is not a failure closes a half-open breaker.

Successes do not reset the failure count: the breaker trips on ``failure_threshold``
failures in a sliding ``window_s``, whatever the traffic around them (a count, not a rate).

The half-open transition happens at exactly ``opened_at + cooldown_s`` and is logged with
that time, however late the breaker is next consulted. ``transitions`` is the full log.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import FailureClass
from aiqsim.core.numeric import is_positive_finite, is_whole
from aiqsim.overload.gate import OverloadGate
from aiqsim.overload.signals import ErrorPredicate, is_server_failure, is_server_failure_or_rate_limited
from aiqsim.overload.window import TimeWindow

if TYPE_CHECKING:
    from random import Random  # the injected generator's type; no randomness is imported

BreakerMode = Literal["fail_fast", "wait"]


class BreakerState(enum.StrEnum):
    """Where a provider's breaker stands."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class BreakerTransition:
    """The breaker of ``provider`` went from ``old`` to ``new`` at ``time``."""

    time: float
    provider: str
    old: BreakerState
    new: BreakerState


@dataclass(slots=True)
class _Circuit:
    failures: TimeWindow
    state: BreakerState = BreakerState.CLOSED
    opened_at: float = -math.inf
    probes_in_flight: int = 0
    probe_tasks: set[str] = field(default_factory=set)
    last_admission_was_probe: bool = False


class CircuitBreaker(OverloadGate):
    """Closed / open / half-open circuit breaker, one circuit per provider.

    Parameters:
        failure_threshold: failures within ``window_s`` that open a closed circuit.
        window_s: the sliding window the failures are counted in.
        cooldown_s: how long an open circuit refuses everything before probing.
        half_open_probes: attempts let through at once while half-open.
        mode: ``"fail_fast"`` refuses attempts while open. ``"wait"`` refuses them too when
            consulted, but answers :meth:`seconds_until_attempt` with the time left until
            the circuit half-opens (or ``half_open_poll_s`` while every probe slot is
            busy), so a scheduler that honours that query parks tasks instead of failing
            them (see :mod:`aiqsim.overload.gate`).
        count_rate_limits: whether a 429 counts as a failure (default no, see module doc).
        is_failure: a custom failure predicate; overrides ``count_rate_limits``.
        half_open_poll_s: the wait suggested in ``"wait"`` mode while probes are out.

    Probe outcomes. With the attempt context (``task_id``), only the probes' own outcomes
    move a half-open circuit; outcomes of attempts admitted before it opened are ignored.
    Without it, the first outcome reported while a probe is out is taken as the probe's
    (an attempt admitted before the circuit opened that reports during half-open decides
    in its place; with short attempts and a cooldown longer than the attempt timeout this
    cannot happen). Outcomes reported while open are ignored.
    """

    def __init__(
        self,
        failure_threshold: int = 5,
        window_s: float = 30.0,
        cooldown_s: float = 30.0,
        half_open_probes: int = 1,
        mode: BreakerMode = "fail_fast",
        *,
        count_rate_limits: bool = False,
        is_failure: ErrorPredicate | None = None,
        half_open_poll_s: float = 1.0,
    ) -> None:
        for name, count in (("failure_threshold", failure_threshold), ("half_open_probes", half_open_probes)):
            if not is_whole(count, 1):  # NaN and inf failed later in int(), 2.5 was truncated
                raise ConfigurationError(f"{name} must be a whole number >= 1, got {count!r}")
        for name, value in (
            ("window_s", window_s),
            ("cooldown_s", cooldown_s),
            ("half_open_poll_s", half_open_poll_s),
        ):
            if not is_positive_finite(value):
                raise ConfigurationError(f"{name} must be a positive finite number of seconds, got {value!r}")
        if mode not in ("fail_fast", "wait"):
            raise ConfigurationError(f"mode must be 'fail_fast' or 'wait', got {mode!r}")
        self.failure_threshold = int(failure_threshold)
        self.window_s = float(window_s)
        self.cooldown_s = float(cooldown_s)
        self.half_open_probes = int(half_open_probes)
        self.mode: BreakerMode = mode
        self.half_open_poll_s = float(half_open_poll_s)
        if is_failure is None:
            is_failure = is_server_failure_or_rate_limited if count_rate_limits else is_server_failure
        self.is_failure = is_failure
        self.transitions: list[BreakerTransition] = []
        self._circuits: dict[str, _Circuit] = {}

    # ------------------------------------------------------------------ inspection
    def _circuit(self, provider: str) -> _Circuit:
        circuit = self._circuits.get(provider)
        if circuit is None:
            circuit = self._circuits[provider] = _Circuit(failures=TimeWindow(self.window_s))
        return circuit

    def state(self, provider: str, now: float) -> BreakerState:
        """``provider``'s circuit state at ``now`` (an expired cooldown half-opens it)."""
        circuit = self._circuit(provider)
        self._advance(circuit, provider, now)
        return circuit.state

    def half_opens_at(self, provider: str) -> float | None:
        """When an open circuit will half-open; ``None`` unless open."""
        circuit = self._circuit(provider)
        if circuit.state is not BreakerState.OPEN:
            return None
        return circuit.opened_at + self.cooldown_s

    def recent_failures(self, provider: str, now: float) -> int:
        """Failures counted towards opening (closed state only) in the window ending at ``now``."""
        return self._circuit(provider).failures.count(now)

    def transitions_of(self, provider: str) -> list[BreakerTransition]:
        """The transition log of one provider."""
        return [t for t in self.transitions if t.provider == provider]

    # ------------------------------------------------------------------ state changes
    def _move(self, circuit: _Circuit, provider: str, new: BreakerState, at: float) -> None:
        self.transitions.append(BreakerTransition(time=at, provider=provider, old=circuit.state, new=new))
        circuit.state = new
        circuit.failures.clear()
        circuit.probes_in_flight = 0
        circuit.probe_tasks.clear()
        if new is BreakerState.OPEN:
            circuit.opened_at = at

    def _advance(self, circuit: _Circuit, provider: str, now: float) -> None:
        if circuit.state is BreakerState.OPEN and now >= circuit.opened_at + self.cooldown_s:
            self._move(circuit, provider, BreakerState.HALF_OPEN, circuit.opened_at + self.cooldown_s)

    # ------------------------------------------------------------------ gate protocol
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
        circuit = self._circuit(provider)
        self._advance(circuit, provider, now)
        circuit.last_admission_was_probe = False
        if circuit.state is BreakerState.CLOSED:
            return None
        if circuit.state is BreakerState.OPEN:
            return (
                f"circuit open for {provider!r} since t={circuit.opened_at:g}; "
                f"probing from t={circuit.opened_at + self.cooldown_s:g}"
            )
        if circuit.probes_in_flight >= self.half_open_probes:
            return f"circuit half-open for {provider!r}: waiting for the probe's outcome"
        circuit.probes_in_flight += 1
        circuit.last_admission_was_probe = True
        if task_id is not None:
            circuit.probe_tasks.add(task_id)
        return None

    def _take_probe_outcome(self, circuit: _Circuit, task_id: str | None) -> bool:
        """Whether an outcome reported while half-open is a probe's (and forget that probe)."""
        if task_id is not None:
            if task_id not in circuit.probe_tasks:
                return False
            circuit.probe_tasks.discard(task_id)
        elif circuit.probes_in_flight == 0:
            return False
        circuit.probes_in_flight -= 1
        return True

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
        circuit = self._circuit(provider)
        self._advance(circuit, provider, now)
        failed = failure is not None and error is not None and self.is_failure(error)
        if circuit.state is BreakerState.CLOSED:
            if failed:
                circuit.failures.add(now)
                if circuit.failures.count(now) >= self.failure_threshold:
                    self._move(circuit, provider, BreakerState.OPEN, now)
        elif circuit.state is BreakerState.HALF_OPEN and self._take_probe_outcome(circuit, task_id):
            self._move(circuit, provider, BreakerState.OPEN if failed else BreakerState.CLOSED, now)

    def attempt_abandoned(
        self, provider: str, is_retry: bool, sent: bool, now: float, *, task_id: str | None = None
    ) -> None:
        """A probe that will never report frees its slot (else half-open would wait forever)."""
        circuit = self._circuit(provider)
        if circuit.state is not BreakerState.HALF_OPEN:
            return
        if not sent and task_id is None:
            if not circuit.last_admission_was_probe:
                return
            circuit.last_admission_was_probe = False
            circuit.probes_in_flight = max(0, circuit.probes_in_flight - 1)
            return
        self._take_probe_outcome(circuit, task_id)

    def seconds_until_attempt(self, provider: str, is_retry: bool, now: float) -> float:
        """``"wait"`` mode: time until an attempt could be admitted; always 0 in ``"fail_fast"``."""
        if self.mode != "wait":
            return 0.0
        state = self.state(provider, now)
        circuit = self._circuit(provider)
        if state is BreakerState.OPEN:
            return max(0.0, circuit.opened_at + self.cooldown_s - now)
        if state is BreakerState.HALF_OPEN and circuit.probes_in_flight >= self.half_open_probes:
            return self.half_open_poll_s
        return 0.0
