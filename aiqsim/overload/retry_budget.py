"""Retry budgets: cap how much of the traffic to a provider may be retries.

Backoff spaces out one task's retries; it does nothing about *how many* tasks retry at
once. During an outage every task burns all its attempts and the provider, when it comes
back, meets a multiple of the normal load. A retry budget bounds that multiple per client:

* :class:`RetryTokenBucket` is the AWS SDK "standard" retry mode quota (a token bucket that
  retries drain and successes refill), with presets for the pre-2026 and the 2026 AWS rules;
* :class:`RetryRatioBudget` is the Google SRE per-client retry budget (retries at most a
  fixed fraction of requests over a sliding window).

Both only ever refuse *retries*: first attempts always pass. All state is per provider.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import FailureClass
from aiqsim.overload.gate import OverloadGate
from aiqsim.overload.signals import ErrorPredicate, is_rate_limited, is_timeout
from aiqsim.overload.window import TimeWindow

if TYPE_CHECKING:
    from random import Random  # the injected generator's type; no randomness is imported


def _check_positive(name: str, value: float, *, allow_zero: bool = False) -> float:
    ok = value >= 0 if allow_zero else value > 0
    if not ok or not math.isfinite(value):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigurationError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


@dataclass(slots=True)
class _RetryQuota:
    """One provider's retry quota and what its retries in flight were charged."""

    level: float
    cost_of_last_failure: float
    charged_by_task: dict[str, float] = field(default_factory=dict)
    anonymous_charges: int = 0
    anonymous_total: float = 0.0
    last_charge: float = 0.0


class RetryTokenBucket(OverloadGate):
    """The AWS SDK "standard" retry quota, per provider.

    Each provider starts with ``capacity`` tokens. A retry costs what its cause costs
    (:meth:`cost_of_retry_after`): ``throttling_retry_cost`` after a throttling error (a 429),
    ``timeout_retry_cost`` after a timeout, ``retry_cost`` after any other retryable error.
    With fewer tokens left than the cost, the retry is refused ("retry budget exhausted") and
    the task fails with its last error instead of adding load. A success on a first attempt
    returns ``no_retry_refund`` tokens; a success on a retry returns what that retry took.
    The level never exceeds ``capacity``. A failed retry returns nothing. First attempts are
    never refused and cost nothing.

    The AWS rule sets, as named presets (both published, both tested against their numbers):

    * :meth:`aws_standard` (also the constructor's defaults): the pre-2026 standard mode.
      botocore ``botocore/retries/quota.py`` ``RetryQuota.INITIAL_CAPACITY = 500`` and
      ``botocore/retries/standard.py`` ``RetryQuotaChecker._RETRY_COST = 5``,
      ``_TIMEOUT_RETRY_REQUEST = 10``, ``_NO_RETRY_INCREMENT = 1``; "give back whatever quota
      was associated with the last acquisition" on a 2xx after retries. A throttling retry
      costs the ordinary 5. (The JS v3 SDK has the same constants: ``INITIAL_RETRY_TOKENS =
      500``, ``RETRY_COST = 5``, ``TIMEOUT_RETRY_COST = 10``, ``NO_RETRY_INCREMENT = 1``.)
    * :meth:`aws_2026`: the updated standard mode (opt-in with ``AWS_NEW_RETRIES_2026=true``,
      announced as the default from November 2026; "Retry behavior", AWS SDKs and Tools
      Reference Guide, and the "Announcing updated retry behavior for AWS SDKs and Tools"
      post). A retry after a non-throttling error costs 14 tokens, timeouts included ("timeouts
      are no longer treated differently from other transient errors"); a retry after a
      throttling error costs 5 ("a discounted cost of 5 tokens"); capacity 500 and the success
      increment of 1 are unchanged. Sources: aws/aws-sdk-go-v2 PR #3400, aws/aws-cli PR
      #10342 ("a smaller quota cost (5) for throttling errors vs. the standard cost (14)"),
      aws-sdk-kotlin ``STANDARD_RETRY_COST = 14``, ``STANDARD_THROTTLING_RETRY_COST = 5``,
      smithy-python ``TokenBucketRetryStrategy(token_bucket_capacity=500,
      success_increment=1, retry_cost=14, throttling_retry_cost=5)``. Raising ``retry_cost``
      to 14 alone does *not* model it: throttling retries would cost 14 and timeouts 10.

    The other 2026 changes (backoff bases of 50 ms / 1 s for throttling, 3 attempts,
    ``x-amz-retry-after``) belong to the retry policy, not to this quota. Note the AWS rule
    "when the retry quota cannot be acquired, return immediately with no delay": this gate
    is asked in ``before_attempt``; whether that happens before or after the backoff sleep is
    the scheduler's order.

    Bookkeeping. Charging happens in ``before_attempt`` of a retry (the decision to retry
    is the scheduler's, so only then is it known that a retry happens). With the attempt
    context (``task_id``/``cause``, see :mod:`aiqsim.overload.gate`) it is exact: the cost
    comes from this task's own previous error and the refund on success is this retry's own
    charge. Without it (the scheduler as of this writing), two approximations, both exact
    when all failures of a provider are of one kind (all timeouts, or none):

    * the cost of a retry follows the most recent retryable failure reported for the
      provider (any task's), not necessarily this task's;
    * a retry's outcome settles the *mean* charge of the provider's retries in flight, so
      a successful retry refunds that mean. Charges and settlements still sum exactly.

    Parameters ``throttling_retry_cost`` (default: ``retry_cost``, the pre-2026 rule) and
    ``is_throttling_error`` (default: a :class:`~aiqsim.core.failures.RateLimitError`) select
    the throttling discount; ``is_timeout_error`` selects timeouts.
    """

    asks_before_backoff: ClassVar[bool] = True
    """A retry is charged when it is decided, before its backoff: refused, it fails at once (AWS)."""

    def __init__(
        self,
        capacity: float = 500,
        retry_cost: float = 5,
        timeout_retry_cost: float = 10,
        no_retry_refund: float = 1,
        *,
        throttling_retry_cost: float | None = None,
        is_timeout_error: ErrorPredicate = is_timeout,
        is_throttling_error: ErrorPredicate = is_rate_limited,
    ) -> None:
        self.capacity = _check_positive("capacity", capacity)
        self.retry_cost = _check_positive("retry_cost", retry_cost, allow_zero=True)
        self.timeout_retry_cost = _check_positive("timeout_retry_cost", timeout_retry_cost, allow_zero=True)
        self.throttling_retry_cost = (
            self.retry_cost
            if throttling_retry_cost is None
            else _check_positive("throttling_retry_cost", throttling_retry_cost, allow_zero=True)
        )
        self.no_retry_refund = _check_positive("no_retry_refund", no_retry_refund, allow_zero=True)
        self.is_timeout_error = is_timeout_error
        self.is_throttling_error = is_throttling_error
        self._quotas: dict[str, _RetryQuota] = {}

    @classmethod
    def aws_standard(cls) -> RetryTokenBucket:
        """The AWS SDKs' pre-2026 standard-mode retry quota (botocore): capacity 500, a retry
        costs 5 (throttling included), a retry after a timeout 10, a first-attempt success
        returns 1."""
        return cls(
            capacity=500, retry_cost=5, timeout_retry_cost=10, no_retry_refund=1, throttling_retry_cost=5
        )

    @classmethod
    def aws_2026(cls) -> RetryTokenBucket:
        """The AWS SDKs' 2026 standard-mode retry quota (``AWS_NEW_RETRIES_2026``): capacity
        500, a retry after a throttling error costs 5, after any other transient error (a
        timeout included) 14, a first-attempt success returns 1."""
        return cls(
            capacity=500, retry_cost=14, timeout_retry_cost=14, no_retry_refund=1, throttling_retry_cost=5
        )

    def _quota(self, provider: str) -> _RetryQuota:
        quota = self._quotas.get(provider)
        if quota is None:
            quota = self._quotas[provider] = _RetryQuota(
                level=self.capacity, cost_of_last_failure=self.retry_cost
            )
        return quota

    def level(self, provider: str) -> float:
        """Tokens left in ``provider``'s retry quota."""
        return self._quota(provider).level

    def cost_of_retry_after(self, error: BaseException) -> float:
        """What a retry caused by ``error`` costs: the throttling cost for a throttling error,
        else the timeout cost for a timeout, else the ordinary retry cost."""
        if self.is_throttling_error(error):
            return self.throttling_retry_cost
        if self.is_timeout_error(error):
            return self.timeout_retry_cost
        return self.retry_cost

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
        quota = self._quota(provider)
        quota.last_charge = 0.0
        if not is_retry:
            return None
        cost = self.cost_of_retry_after(cause) if cause is not None else quota.cost_of_last_failure
        if cost > quota.level:
            return (
                f"retry budget exhausted: {quota.level:g} of {self.capacity:g} retry tokens left "
                f"for {provider!r}, a retry costs {cost:g}"
            )
        quota.level -= cost
        quota.last_charge = cost
        if task_id is not None:
            quota.charged_by_task[task_id] = cost
        else:
            quota.anonymous_charges += 1
            quota.anonymous_total += cost
        return None

    def _settle(self, quota: _RetryQuota, task_id: str | None) -> float:
        """Forget the charge of one retry in flight and return it."""
        if task_id is not None:
            return quota.charged_by_task.pop(task_id, 0.0)
        if quota.anonymous_charges == 0:
            return 0.0
        mean = quota.anonymous_total / quota.anonymous_charges
        quota.anonymous_charges -= 1
        quota.anonymous_total = 0.0 if quota.anonymous_charges == 0 else quota.anonymous_total - mean
        return mean

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
        quota = self._quota(provider)
        if failure is FailureClass.RETRYABLE and error is not None:
            quota.cost_of_last_failure = self.cost_of_retry_after(error)
        charge = self._settle(quota, task_id) if is_retry else 0.0
        if failure is None:
            refund = charge if is_retry else self.no_retry_refund
            quota.level = min(self.capacity, quota.level + refund)

    def attempt_abandoned(
        self, provider: str, is_retry: bool, sent: bool, now: float, *, task_id: str | None = None
    ) -> None:
        """An unsent retry gets its exact charge back; a sent one whose answer is lost gets nothing."""
        if not is_retry:
            return
        quota = self._quota(provider)
        if sent:
            self._settle(quota, task_id)
            return
        if task_id is not None:
            charge = quota.charged_by_task.pop(task_id, 0.0)
        else:  # rolled back in the same step as its admission: the last charge is this one
            charge = quota.last_charge
            if quota.anonymous_charges > 0:
                quota.anonymous_charges -= 1
                quota.anonymous_total = (
                    0.0 if quota.anonymous_charges == 0 else quota.anonymous_total - charge
                )
        quota.last_charge = 0.0
        quota.level = min(self.capacity, quota.level + charge)


@dataclass(slots=True)
class _RatioWindow:
    requests: TimeWindow
    retries: TimeWindow


class RetryRatioBudget(OverloadGate):
    """The Google SRE per-client retry budget, per provider.

    "Implement a per-client retry budget. Each client keeps track of the ratio of requests
    that correspond to retries. A request will only be retried as long as this ratio is
    below 10%." (Site Reliability Engineering, Google/O'Reilly 2016, chapter 21 "Handling
    Overload", section "Deciding to Retry", https://sre.google/sre-book/handling-overload/).
    Requests are all attempts admitted (first attempts and retries) in
    the last ``window_s`` seconds; a retry is admitted iff ``retries / requests < ratio``
    counted *before* it (an empty window counts as ratio 0), so the ratio can end at most
    one retry above the limit. Attempts refused by this or another gate are not requests.
    """

    def __init__(self, ratio: float = 0.1, window_s: float = 60.0) -> None:
        if not 0 < ratio <= 1:
            raise ConfigurationError(f"ratio must be in (0, 1], got {ratio!r}")
        self.ratio = float(ratio)
        self.window_s = _check_positive("window_s", window_s)
        self._windows: dict[str, _RatioWindow] = {}

    def _window(self, provider: str) -> _RatioWindow:
        window = self._windows.get(provider)
        if window is None:
            window = self._windows[provider] = _RatioWindow(
                TimeWindow(self.window_s), TimeWindow(self.window_s)
            )
        return window

    def counts(self, provider: str, now: float) -> tuple[int, int]:
        """``(requests, retries)`` admitted for ``provider`` in the window ending at ``now``."""
        window = self._window(provider)
        return window.requests.count(now), window.retries.count(now)

    def retry_ratio(self, provider: str, now: float) -> float:
        """Retries over requests in the window (0 for an empty window)."""
        requests, retries = self.counts(provider, now)
        return retries / requests if requests else 0.0

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
        window = self._window(provider)
        if is_retry:
            ratio = self.retry_ratio(provider, now)
            if ratio >= self.ratio:
                return (
                    f"retry budget exhausted: retries are {ratio:.1%} of requests to {provider!r} "
                    f"over the last {self.window_s:g} s (limit {self.ratio:.0%})"
                )
            window.retries.add(now)
        window.requests.add(now)
        return None

    def attempt_abandoned(
        self, provider: str, is_retry: bool, sent: bool, now: float, *, task_id: str | None = None
    ) -> None:
        """An unsent attempt is no request; a sent one stays counted."""
        if sent:
            return
        window = self._window(provider)
        window.requests.remove_latest()
        if is_retry:
            window.retries.remove_latest()
