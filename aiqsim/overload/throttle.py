"""Google SRE client-side adaptive throttling.

Each client keeps, per provider and over the last ``window_s`` seconds, the number of
*requests* it attempted and the number of *accepts* (requests the backend took rather than
turned away) and rejects a new request locally with probability

    max(0, (requests − K·accepts) / (requests + 1))

(Site Reliability Engineering, Google/O'Reilly 2016, chapter 21 "Handling Overload",
section "Client-Side Throttling", equation 21-1; https://sre.google/sre-book/handling-overload/).
While the backend accepts everything the probability is 0. When it starts rejecting, the
client keeps sending until requests reach K times accepts, then sheds the excess locally,
so the traffic that reaches the backend stays near K × what it can take. K = 2 wastes some
backend work on rejections in exchange for reacting faster when it recovers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import FailureClass
from aiqsim.overload.gate import OverloadGate
from aiqsim.overload.signals import ErrorPredicate, is_overload_rejection
from aiqsim.overload.window import TimeWindow

if TYPE_CHECKING:
    from random import Random  # the injected generator's type; no randomness is imported


def rejection_probability(requests: float, accepts: float, k: float) -> float:
    """``max(0, (requests − k·accepts) / (requests + 1))``: SRE adaptive throttling's drop probability."""
    return max(0.0, (requests - k * accepts) / (requests + 1))


@dataclass(slots=True)
class _History:
    requests: TimeWindow
    accepts: TimeWindow


class ClientSideThrottle(OverloadGate):
    """Reject attempts locally, at random, once a provider accepts less than 1/K of them.

    Counting, per provider, over the window ``(now − window_s, now]``:

    * *requests*: every attempt this gate is asked about, counted when it is asked,
      including the ones it rejects itself (that is what makes the probability climb
      while the backend stays down). An attempt admitted here but refused by a later gate
      of a :class:`~aiqsim.overload.gate.GateChain` is taken back: it was never sent.
    * *accepts*: outcomes that show the backend took the request, counted when reported:
      a success or any error for which ``is_rejection`` is false. By default 429, 5xx and
      timeouts are rejections (:func:`~aiqsim.overload.signals.is_overload_rejection`).

    The probability uses the counts *before* the attempt being decided. The rng is drawn
    only when the probability is positive, so a healthy run consumes the same random
    numbers with or without the throttle. First attempts and retries are treated alike.
    The window should outlast the slowest answer (attempt timeout), else an accept may
    land after its request left the window.

    Recovery is slow by design. Once the backend is healthy again, a window of traffic
    rejected with probability ``p`` yields ``1 − p' ≈ 2(1 − p)`` for the next window (K = 2):
    the admitted fraction at most doubles per window, so from ``p ≈ 0.98`` at the end of a
    long outage it takes about six windows to stop shedding, and with the scheduler's
    fail-fast refusal every shed attempt is a failed task. (Measured in
    ``tests/test_overload.py``'s outage scenario: with a 120 s window, about 60% of the
    tasks submitted in the minute after the provider recovered were still rejected.)
    """

    def __init__(
        self, k: float = 2.0, window_s: float = 120.0, *, is_rejection: ErrorPredicate = is_overload_rejection
    ) -> None:
        if not k > 0 or not math.isfinite(k):
            raise ConfigurationError(f"k must be a positive finite number, got {k!r}")
        self.k = float(k)
        self.window_s = float(window_s)
        TimeWindow(window_s)  # validates window_s
        self.is_rejection = is_rejection
        self._histories: dict[str, _History] = {}

    def _history(self, provider: str) -> _History:
        history = self._histories.get(provider)
        if history is None:
            history = self._histories[provider] = _History(
                TimeWindow(self.window_s), TimeWindow(self.window_s)
            )
        return history

    def counts(self, provider: str, now: float) -> tuple[int, int]:
        """``(requests, accepts)`` for ``provider`` in the window ending at ``now``."""
        history = self._history(provider)
        return history.requests.count(now), history.accepts.count(now)

    def rejection_probability(self, provider: str, now: float) -> float:
        """The probability the next attempt to ``provider`` at ``now`` is rejected locally."""
        requests, accepts = self.counts(provider, now)
        return rejection_probability(requests, accepts, self.k)

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
        probability = self.rejection_probability(provider, now)
        self._history(provider).requests.add(now)
        if probability > 0 and rng.random() < probability:
            return (
                f"throttled client-side: {provider!r} accepted too few recent requests "
                f"(rejection probability {probability:.3f})"
            )
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
        if failure is None or error is None or not self.is_rejection(error):
            self._history(provider).accepts.add(now)

    def attempt_abandoned(
        self, provider: str, is_retry: bool, sent: bool, now: float, *, task_id: str | None = None
    ) -> None:
        """An attempt never sent is no request; one sent and lost stays a request, unaccepted."""
        if not sent:
            self._history(provider).requests.remove_latest()
