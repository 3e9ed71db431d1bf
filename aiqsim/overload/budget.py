"""Spend budgets: cap what a day's calls may cost, for everyone and per tenant.

:class:`Budget` is an attempt gate (:mod:`aiqsim.overload.gate`)::

    budget = Budget(per_day=50.0, per_tenant_per_day=5.0, prices={"llm": 0.000002})
    scheduler = Scheduler(runtime, providers, gates=[budget])

**Where the price lives.** ``prices`` maps a provider's name to its price per unit, the unit being
the one a task's ``cost_estimate`` and a provider's reported ``usage`` are counted in (the quota's
unit: tokens). An attempt's cost is ``units * price`` in whatever currency the prices are in (the
limits are in the same one). A provider without a price is not budgeted: its calls cost nothing
and are never refused. A :class:`~aiqsim.scheduler.Scheduler` refuses, when it is made, a price
for a provider it was not given (:meth:`Budget.check_providers`).

**Reserve, then reconcile.** Before an attempt is sent, its estimated cost (``cost_estimate *
price``) is reserved in every budget that applies (the day's, and the task's tenant's): all or
nothing, and only if each stays within its limit (:func:`aiqsim.core.budget.admits`). After the
attempt, the estimate is replaced by what the provider billed: ``usage * price`` for a success
(the usage the scheduler reconciles the quota with), the whole estimate for a failure the
provider may have billed (a timeout, a cut stream: ``bills_failure``), nothing for any other
failure (a 429, a 5xx, a refused request). So estimates never take a budget past its limit; a
bill above its estimate can, by at most the underestimates of the calls in flight.

**A spent budget refuses, it does not queue.** An attempt that does not fit fails its task at once
with :class:`~aiqsim.core.failures.BudgetExceeded` (fatal: never retried, since a closed budget
stays closed until it resets), naming the budget and the instant it resets. A retry is priced and
refused like a first attempt.

**Days.** A budget day is ``day_s`` scheduler seconds (a calendar day by default) starting at
``day_origin_s`` on the scheduler's clock (``runtime.now()``; an
:class:`~aiqsim.runtime.AsyncioRuntime` counts from its creation). Nothing reads a wall clock: to
reset at midnight UTC, pass the scheduler-clock instant of a midnight. In a fleet, the shared
ledger (:class:`aiqsim.fleet.RedisBudgetLedger`) keeps days on the Redis server's clock instead.

**Tenants.** ``per_tenant_per_day`` is one limit every tenant has (a number) or a limit per tenant
(a mapping; a tenant it does not name has none). The tenant is the task's ``tenant`` (a task
without one is charged to the day's budget only).

**Reporting.** Every settle and refusal is counted (:attr:`Budget.billed_total`,
:attr:`Budget.refused`, :meth:`Budget.spent`) and, given ``events=`` (a scheduler event sink), sent
as :class:`~aiqsim.scheduler.events.BudgetCharged` and :class:`~aiqsim.scheduler.events.BudgetRefused`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from aiqsim.core.budget import DAY_S, BudgetHold, admits, attempt_cost, budget_window, reconciled
from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import BilledStreamCutError, BudgetExceeded, FailureClass
from aiqsim.core.numeric import is_real
from aiqsim.overload.gate import OverloadGate
from aiqsim.scheduler.events import BudgetCharged, BudgetRefused

if TYPE_CHECKING:
    from random import Random  # the injected generator's type; no randomness is imported

__all__ = [
    "DAILY",
    "Budget",
    "BudgetHold",
    "BudgetLedger",
    "LocalBudgetLedger",
    "bills_failure",
    "tenant_budget_name",
]

DAILY = "per_day"
"""The name of the day's budget (every task of a priced provider)."""


def tenant_budget_name(tenant: str) -> str:
    """The name of one tenant's daily budget: ``per_tenant_per_day[acme]``."""
    return f"per_tenant_per_day[{tenant}]"


def bills_failure(error: BaseException | None) -> bool:
    """Whether a failed attempt may have been billed: a timeout (the provider may have done the
    work after the client stopped waiting) or a cut stream (billed by definition). Not a 429, a
    5xx or a refused request: providers bill none of them."""
    return isinstance(error, TimeoutError | BilledStreamCutError)


class BudgetLedger(Protocol):
    """Where a budget's spend is kept: this process (:class:`LocalBudgetLedger`) or a fleet's Redis
    account (:class:`aiqsim.fleet.RedisBudgetLedger`)."""

    def reserve(
        self, limits: Sequence[tuple[str, float]], amount: float, price: float, now: float
    ) -> BudgetHold | BudgetExceeded:
        """Reserve ``amount`` in every budget of ``limits`` (name, limit) at once if each admits it
        (:func:`~aiqsim.core.budget.admits`), else reserve nothing and return the first refusal."""
        ...

    def settle(self, hold: BudgetHold, billed: float, now: float) -> None:
        """Replace the reservation ``hold`` by ``billed`` (:func:`~aiqsim.core.budget.reconciled`)."""
        ...

    def spent(self, budget: str, now: float) -> float:
        """What ``budget`` has spent and reserved on the day holding ``now``."""
        ...


@dataclass(slots=True)
class LocalBudgetLedger:
    """A ledger in this process: days of ``day_s`` seconds from ``day_origin_s`` on the scheduler's
    clock; a budget's spend starts again at 0 each day (a settle of a past day's reservation is
    dropped with that day)."""

    day_origin_s: float = 0.0
    day_s: float = DAY_S
    _days: dict[str, tuple[int, float]] = field(default_factory=dict)

    def _spent_on(self, budget: str, day: int) -> float:
        stored = self._days.get(budget)
        return stored[1] if stored is not None and stored[0] == day else 0.0

    def reserve(
        self, limits: Sequence[tuple[str, float]], amount: float, price: float, now: float
    ) -> BudgetHold | BudgetExceeded:
        window = budget_window(now, self.day_origin_s, self.day_s)
        for name, limit in limits:
            spent = self._spent_on(name, window.day)
            if not admits(spent, amount, limit):
                return BudgetExceeded(
                    name, spent=spent, limit=limit, estimate=amount, resets_at=window.resets_at
                )
        for name, _ in limits:
            self._days[name] = (window.day, self._spent_on(name, window.day) + amount)
        return BudgetHold(
            budgets=tuple(name for name, _ in limits), amount=amount, day=window.day, price=price
        )

    def settle(self, hold: BudgetHold, billed: float, now: float) -> None:
        for name in hold.budgets:
            stored = self._days.get(name)
            if stored is not None and stored[0] == hold.day:
                self._days[name] = (hold.day, reconciled(stored[1], hold.amount, billed))

    def spent(self, budget: str, now: float) -> float:
        return self._spent_on(budget, budget_window(now, self.day_origin_s, self.day_s).day)


def _amount(name: str, value: Any, *, none_ok: bool = False) -> float | None:
    """``value`` as a finite number >= 0, or a :class:`ConfigurationError` naming ``name``."""
    if value is None and none_ok:
        return None
    if not is_real(value) or not 0 <= value < math.inf:
        accepted = "a finite number >= 0" + (" or None (no limit)" if none_ok else "")
        raise ConfigurationError(f"Budget {name} must be {accepted}, got {value!r}; no budget was made")
    return float(value)


class Budget(OverloadGate):
    """A daily spend budget, for all the traffic and per tenant, as an attempt gate (see the module
    docstring: prices, reserve and reconcile, days, tenants, reporting).

    ``per_day``: the day's limit over every priced call (``None``: none). ``per_tenant_per_day``: each
    tenant's daily limit (a number for every tenant, a mapping tenant -> limit, or ``None``).
    ``prices``: provider name -> price per unit. ``day_origin_s``/``day_s``: the budget days on the
    scheduler's clock (a local ledger's). ``ledger``: where the spend is kept (default: this process;
    :class:`aiqsim.fleet.RedisBudgetLedger` shares it across a fleet). ``events``: a sink for
    :class:`~aiqsim.scheduler.events.BudgetCharged`/``BudgetRefused``. ``bills_failure``: whether a
    failed attempt keeps its estimate charged (default :func:`bills_failure`).
    """

    accepts_attempt_cost: ClassVar[bool] = True

    def __init__(
        self,
        per_day: float | None = None,
        per_tenant_per_day: float | Mapping[str, float] | None = None,
        *,
        prices: Mapping[str, float],
        day_origin_s: float = 0.0,
        day_s: float = DAY_S,
        ledger: BudgetLedger | None = None,
        events: Callable[[Any], None] | None = None,
        bills_failure: Callable[[BaseException | None], bool] = bills_failure,
    ) -> None:
        self.per_day = _amount("per_day", per_day, none_ok=True)
        self.per_tenant_per_day: float | dict[str, float] | None
        if isinstance(per_tenant_per_day, Mapping):
            self.per_tenant_per_day = {
                str(t): _amount(f"per_tenant_per_day[{t!r}]", v) for t, v in per_tenant_per_day.items()
            }  # type: ignore[misc]
        else:
            self.per_tenant_per_day = _amount("per_tenant_per_day", per_tenant_per_day, none_ok=True)
        if not isinstance(prices, Mapping):
            raise ConfigurationError(
                f"Budget prices must be a mapping provider name -> price per unit, got {prices!r}; "
                "no budget was made"
            )
        self.prices: dict[str, float] = {
            str(name): _amount(f"prices[{name!r}]", price)  # type: ignore[misc]
            for name, price in prices.items()
        }
        if not is_real(day_origin_s) or not math.isfinite(day_origin_s):
            raise ConfigurationError(
                f"Budget day_origin_s must be a finite number (scheduler seconds), got {day_origin_s!r}; "
                "no budget was made"
            )
        if not is_real(day_s) or not 0 < day_s < math.inf:
            raise ConfigurationError(
                f"Budget day_s must be a finite number > 0, got {day_s!r}; no budget was made"
            )
        self.ledger: BudgetLedger = (
            ledger if ledger is not None else LocalBudgetLedger(float(day_origin_s), float(day_s))
        )
        self.events = events
        self.bills_failure = bills_failure
        define = getattr(self.ledger, "define", None)
        if callable(define):  # a shared ledger keeps the budget's definition: every worker's must agree
            define(self.definition())
        self.refused: Counter[str] = Counter()
        """Attempts refused, by budget name."""
        self.billed_total = 0.0
        """Everything settled so far (currency), all days together."""
        self.billed_by_tenant: Counter[str] = Counter()
        """What each tenant's attempts were billed, all days together."""
        self._holds: dict[Any, tuple[BudgetHold, str | None]] = {}
        self._anonymous = 0

    def definition(self) -> dict[str, Any]:
        """The limits and prices, as a shared ledger stores them for every worker to agree on."""
        return {"per_day": self.per_day, "per_tenant_per_day": self.per_tenant_per_day, "prices": self.prices}

    def check_providers(self, providers: Iterable[str]) -> None:
        """Refuse a price for a provider not in ``providers`` (a scheduler calls this when made)."""
        known = set(providers)
        unknown = sorted(set(self.prices) - known)
        if unknown:
            raise ConfigurationError(
                f"Budget prices: {unknown} name no provider of this scheduler (its providers: "
                f"{sorted(known)}); no scheduler was created"
            )

    def check_tenants(self, tenants: Iterable[str]) -> None:
        """Refuse a per-tenant limit for a tenant not in ``tenants`` (a scheduler with tenants calls this)."""
        per_tenant = self.per_tenant_per_day
        unknown = sorted(set(per_tenant) - set(tenants)) if isinstance(per_tenant, dict) else []
        if unknown:
            raise ConfigurationError(
                f"Budget per_tenant_per_day: {unknown} name no tenant of this scheduler (its tenants: "
                f"{sorted(tenants)}); no scheduler was created"
            )

    def limits_for(self, tenant: str | None) -> list[tuple[str, float]]:
        """The budgets (name, limit) an attempt of ``tenant`` must fit in."""
        limits = [] if self.per_day is None else [(DAILY, self.per_day)]
        per_tenant = self.per_tenant_per_day
        if tenant is not None and per_tenant is not None:
            limit = per_tenant.get(tenant) if isinstance(per_tenant, dict) else per_tenant
            if limit is not None:
                limits.append((tenant_budget_name(tenant), limit))
        return limits

    def spent(self, now: float, tenant: str | None = None) -> float:
        """What the day holding ``now`` has spent and reserved: overall, or ``tenant``'s."""
        return self.ledger.spent(DAILY if tenant is None else tenant_budget_name(tenant), now)

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
    ) -> BudgetExceeded | None:
        price = self.prices.get(provider)
        if price is None:
            return None
        limits = self.limits_for(tenant)
        if not limits:
            return None
        amount = attempt_cost(max(0.0, float(estimate or 0.0)), price)
        answer = self.ledger.reserve(limits, amount, price, now)
        if isinstance(answer, BudgetExceeded):
            self.refused[answer.budget] += 1
            if self.events is not None:
                self.events(
                    BudgetRefused(
                        now,
                        task_id,
                        provider,
                        tenant,
                        answer.budget,
                        answer.spent,
                        answer.limit,
                        answer.estimate,
                        answer.resets_at,
                    )
                )
            return answer
        self._holds[self._key(provider, task_id, new=True)] = (answer, tenant)
        return None

    def _key(self, provider: str, task_id: str | None, *, new: bool = False) -> Any:
        if task_id is not None:
            return task_id
        # without task ids (a caller outside the scheduler), holds settle first in, first out
        if new:
            self._anonymous += 1
            return (provider, self._anonymous)
        return min((k for k in self._holds if isinstance(k, tuple) and k[0] == provider), default=None)

    def _settle(
        self, provider: str, task_id: str | None, billed_units: float | None, keep: bool, now: float
    ) -> None:
        key = self._key(provider, task_id)
        held = self._holds.pop(key, None) if key is not None else None
        if held is None:
            return  # not priced, or not admitted by this budget
        hold, tenant = held
        if billed_units is not None:
            billed = attempt_cost(max(0.0, float(billed_units)), hold.price)
        else:
            billed = hold.amount if keep else 0.0
        self.ledger.settle(hold, billed, now)
        self.billed_total += billed
        if tenant is not None:
            self.billed_by_tenant[tenant] += billed
        if self.events is not None:
            self.events(BudgetCharged(now, task_id, provider, tenant, hold.amount, billed))

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
        if failure is None:
            self._settle(provider, task_id, usage, True, now)
        else:
            self._settle(provider, task_id, None, self.bills_failure(error), now)

    def attempt_abandoned(
        self, provider: str, is_retry: bool, sent: bool, now: float, *, task_id: str | None = None
    ) -> None:
        # unsent: nothing to bill; sent and no longer awaited: the provider may bill it
        self._settle(provider, task_id, None, sent, now)
