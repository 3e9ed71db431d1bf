"""Spend budgets: the day arithmetic, the gate's reserve/reconcile, and the scheduler failing work a
spent budget refuses with BudgetExceeded (never retried), on both runtimes."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from aiqsim import RetryPolicy, Scheduler, SimPyRuntime, TaskStatus
from aiqsim.core.backoff import ConstantBackoff
from aiqsim.core.budget import admits, attempt_cost, budget_day, budget_resets_at, budget_window, reconciled
from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import (
    AttemptRejectedError,
    BudgetExceeded,
    ProviderTimeoutError,
    RateLimitError,
    ServerError,
    classify_failure,
)
from aiqsim.overload import Budget, CircuitBreaker, GateChain, LocalBudgetLedger
from aiqsim.scheduler.events import AttemptRecord, BudgetCharged, BudgetRefused
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse
from tests.runtimes import RUNTIMES, run_on

# -- the arithmetic ------------------------------------------------------------------------------


def test_budget_days_start_at_the_origin_and_reset_at_their_end() -> None:
    assert budget_day(0.0) == 0 and budget_resets_at(0.0) == 86_400.0
    assert budget_day(86_399.9) == 0 and budget_day(86_400.0) == 1
    assert budget_resets_at(86_400.0) == 172_800.0
    # an origin of 10 s: day 0 is [10, 110) with 100-second days; before the origin, day -1
    assert budget_day(9.0, 10.0, 100.0) == -1 and budget_resets_at(9.0, 10.0, 100.0) == 10.0
    assert budget_window(109.0, 10.0, 100.0).day == 0
    assert budget_window(110.0, 10.0, 100.0).resets_at == 210.0


def test_reservation_and_reconcile_arithmetic() -> None:
    assert attempt_cost(1_000, 0.002) == pytest.approx(2.0)
    assert admits(7.0, 3.0, 10.0) and not admits(7.5, 3.0, 10.0)
    assert admits(9.0, 0.0, 10.0) and not admits(10.0, 0.0, 10.0)  # a spent day refuses even free work
    assert reconciled(9.0, 3.0, 2.0) == 8.0  # billed below the estimate: the difference comes back
    assert reconciled(9.0, 3.0, 0.0) == 6.0  # not billed: the whole estimate comes back


# -- the gate, called directly --------------------------------------------------------------------


def ask(budget: Budget, now: float, task_id: str, estimate: float, tenant: str | None = None, provider="llm"):
    return budget.before_attempt(
        provider, False, now, random.Random(0), task_id=task_id, estimate=estimate, tenant=tenant
    )


def test_the_gate_reserves_the_estimate_and_reconciles_with_the_bill() -> None:
    events: list[Any] = []
    budget = Budget(per_day=10.0, prices={"llm": 0.5}, day_s=100.0, events=events.append)
    assert ask(budget, 1.0, "a", 8) is None  # 4.0 reserved
    assert ask(budget, 1.0, "b", 8) is None  # 8.0
    assert budget.spent(1.0) == 8.0
    refusal = ask(budget, 2.0, "c", 8)  # 8 + 4 > 10
    assert isinstance(refusal, BudgetExceeded) and isinstance(refusal, AttemptRejectedError)
    assert (refusal.budget, refusal.spent, refusal.limit, refusal.estimate, refusal.resets_at) == (
        "per_day",
        8.0,
        10.0,
        4.0,
        100.0,
    )
    assert "per_day" in str(refusal) and "t=100" in str(refusal)
    budget.after_attempt("llm", False, None, None, 3.0, task_id="a", usage=2)  # billed 1.0
    assert budget.spent(3.0) == 5.0
    budget.after_attempt(
        "llm", False, classify_failure(ServerError("x", status=500), 1), ServerError("x"), 3.0, task_id="b"
    )
    assert budget.spent(3.0) == 1.0  # a 500 is not billed
    assert budget.billed_total == 1.0 and budget.refused == {"per_day": 1}
    assert events == [
        BudgetRefused(2.0, "c", "llm", None, "per_day", 8.0, 10.0, 4.0, 100.0),
        BudgetCharged(3.0, "a", "llm", None, 4.0, 1.0),
        BudgetCharged(3.0, "b", "llm", None, 4.0, 0.0),
    ]
    assert budget.spent(100.0) == 0.0  # a new day


def test_timeouts_and_sent_abandoned_attempts_keep_their_estimate() -> None:
    budget = Budget(per_day=100.0, prices={"llm": 1.0})
    for task in ("t", "r", "u", "s"):
        assert ask(budget, 0.0, task, 10) is None
    for task, error in (("t", ProviderTimeoutError("late")), ("r", RateLimitError("slow"))):
        budget.after_attempt("llm", False, classify_failure(error, 1), error, 1.0, task_id=task)
    budget.attempt_abandoned("llm", False, False, 1.0, task_id="u")  # never sent
    budget.attempt_abandoned("llm", False, True, 1.0, task_id="s")  # sent, nobody waits
    assert budget.spent(1.0) == 20.0


def test_per_tenant_budgets_and_unpriced_providers() -> None:
    budget = Budget(per_day=100.0, per_tenant_per_day={"acme": 5.0}, prices={"llm": 1.0})
    assert ask(budget, 0.0, "a", 5, tenant="acme") is None
    refusal = ask(budget, 0.0, "b", 1, tenant="acme")
    assert isinstance(refusal, BudgetExceeded) and refusal.budget == "per_tenant_per_day[acme]"
    assert budget.spent(0.0) == 5.0  # the refusal reserved nothing in the day's budget either
    assert ask(budget, 0.0, "c", 50, tenant="globex") is None  # no limit of its own
    assert ask(budget, 0.0, "d", 10**9, provider="free") is None  # not priced: not budgeted
    assert budget.spent(0.0) == 55.0 and budget.spent(0.0, "acme") == 5.0
    shared = Budget(per_tenant_per_day=5.0, prices={"llm": 1.0})
    assert ask(shared, 0.0, "e", 5, tenant="x") is None and ask(shared, 0.0, "f", 5, tenant="y") is None
    assert isinstance(ask(shared, 0.0, "g", 1, tenant="x"), BudgetExceeded)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"per_day": -1.0}, "per_day"),
        ({"per_day": math.nan}, "per_day"),
        ({"per_day": math.inf}, "per_day"),
        ({"per_day": "10"}, "per_day"),
        ({"per_tenant_per_day": -0.5}, "per_tenant_per_day"),
        ({"per_tenant_per_day": {"acme": math.nan}}, "per_tenant_per_day['acme']"),
        ({"prices": {"llm": -1e-6}}, "prices['llm']"),
        ({"prices": {"llm": math.nan}}, "prices['llm']"),
        ({"day_s": 0}, "day_s"),
        ({"day_origin_s": math.nan}, "day_origin_s"),
    ],
)
def test_bad_budget_settings_are_refused_naming_the_key(options: dict[str, Any], named: str) -> None:
    settings: dict[str, Any] = {"per_day": 1.0, "prices": {"llm": 1.0}, **options}
    with pytest.raises(ConfigurationError, match=f"Budget {named}".replace("[", r"\[")):
        Budget(**settings)


def test_a_price_for_an_unknown_provider_is_refused_before_any_call() -> None:
    runtime = SimPyRuntime()
    provider = BilledProvider(runtime)
    for gates in ([Budget(per_day=1.0, prices={"gpt": 1.0})], [GateChain([Budget(prices={"gpt": 1.0})])]):
        with pytest.raises(ConfigurationError, match=r"Budget prices: \['gpt'\] name no provider"):
            Scheduler(runtime, [provider], gates=gates)
    assert provider.calls == []


# -- through the scheduler, both runtimes -----------------------------------------------------------


class BilledProvider:
    """Answers after 1 s, billing ``payload["billed"]`` units (or failing as ``payload["fail"]`` says)."""

    name = "llm"

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self.calls: list[str] = []

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        self.calls.append(request.payload["input"])
        await self.runtime.sleep(1.0)
        if request.payload.get("fail") == "timeout":
            raise ProviderTimeoutError("no answer in time")
        return ProviderResponse(result="ok", usage=request.payload["billed"])


@pytest.mark.parametrize("rt_name", RUNTIMES)
def test_a_spent_budget_fails_new_work_at_once_naming_it_until_the_day_resets(rt_name: str) -> None:
    events: list[Any] = []

    async def body(runtime: Any) -> tuple[list[Any], list[Any], list[Any], Any, list[str]]:
        budget = Budget(per_day=10.0, prices={"llm": 1.0}, day_s=100.0, events=events.append)
        provider = BilledProvider(runtime)
        scheduler = Scheduler(runtime, [provider], gates=[budget], events=events.append)

        def submit(name: str, estimate: float, billed: float) -> Any:
            return scheduler.submit("llm", {"input": name, "billed": billed}, cost_estimate=estimate)

        first = [await submit(f"a{i}", 3, 2).wait() for i in range(1)]  # 2 spent
        wave = [submit(f"b{i}", 3, 2) for i in range(4)]  # 2 + 3 * 3 = 11 > 10: two fit
        wave_records = [await h.wait() for h in wave]
        spent_after_wave = budget.spent(runtime.now())
        late = [await submit("c", 3, 2).wait()]  # 6 spent: fits (9)
        refused = [await submit("d", 3, 2).wait()]  # 8 spent: 11 > 10
        await runtime.sleep(100.0 - runtime.now() + 1.0)  # into the next day
        next_day = [await submit("e", 3, 2).wait()]
        assert spent_after_wave == 6.0
        await scheduler.close()
        return first + wave_records, late, refused, next_day, provider.calls

    early, late, refused, next_day, calls = run_on(rt_name, body)
    statuses = [r.status for r in early]
    assert statuses.count(TaskStatus.SUCCEEDED) == 3 and statuses.count(TaskStatus.FAILED) == 2
    assert late[0].status is TaskStatus.SUCCEEDED
    record = refused[0]
    assert record.status is TaskStatus.FAILED
    assert record.error.startswith("BudgetExceeded: budget per_day spent: 8 of 10 used")
    assert "resets at t=100 s" in record.error
    assert next_day[0].status is TaskStatus.SUCCEEDED
    # the refused tasks never reached the provider
    assert sorted(calls) == sorted(
        r.payload["input"] for r in [*early, *late, *next_day] if r.status is TaskStatus.SUCCEEDED
    )
    refusals = [e for e in events if isinstance(e, BudgetRefused)]
    assert [e.resets_at for e in refusals] == [100.0, 100.0, 100.0]
    assert sum(e.billed for e in events if isinstance(e, BudgetCharged)) == 2.0 * 5
    rejected = [e for e in events if isinstance(e, AttemptRecord) and e.decision == "rejected"]
    assert len(rejected) == 3 and all(e.outcome == "BudgetExceeded" for e in rejected)


@pytest.mark.parametrize("rt_name", RUNTIMES)
def test_a_retry_against_a_spent_budget_is_refused_not_stormed(rt_name: str) -> None:
    async def body(runtime: Any) -> tuple[Any, list[str], float]:
        budget = Budget(per_day=5.0, prices={"llm": 1.0})
        provider = BilledProvider(runtime)
        retry = RetryPolicy(backoff=ConstantBackoff(delay_s=1.0), max_attempts=10, attempt_timeout_s=None)
        scheduler = Scheduler(runtime, [provider], gates=[GateChain([CircuitBreaker(), budget])], retry=retry)
        handle = scheduler.submit("llm", {"input": "t", "fail": "timeout", "billed": 0}, cost_estimate=3)
        record = await handle.wait()
        spent = budget.spent(runtime.now())
        await scheduler.close()
        return record, provider.calls, spent

    record, calls, spent = run_on(rt_name, body)
    # the timed-out attempt keeps its 3 (it may have been billed); the retry needs 3 more: refused
    assert calls == ["t"]
    assert record.status is TaskStatus.FAILED and record.attempts == 2
    assert record.error.startswith("BudgetExceeded: budget per_day spent: 3 of 5 used, the attempt needs 3")
    assert spent == 3.0


def test_a_shared_ledger_is_the_one_the_gate_uses() -> None:
    ledger = LocalBudgetLedger(day_origin_s=0.0, day_s=10.0)
    one = Budget(per_day=4.0, prices={"llm": 1.0}, ledger=ledger)
    two = Budget(per_day=4.0, prices={"llm": 1.0}, ledger=ledger)
    assert ask(one, 0.0, "a", 3) is None
    assert isinstance(ask(two, 0.0, "b", 3), BudgetExceeded)


@pytest.mark.parametrize("rt_name", RUNTIMES)
def test_a_tenant_that_spent_its_budget_is_refused_while_the_others_run(rt_name: str) -> None:
    from aiqsim.scheduler.tenants import Tenant

    async def body(runtime: Any) -> tuple[dict[str, list[Any]], Budget]:
        budget = Budget(per_day=100.0, per_tenant_per_day={"acme": 5.0}, prices={"llm": 1.0})
        scheduler = Scheduler(
            runtime,
            [BilledProvider(runtime)],
            gates=[budget],
            tenants={"acme": Tenant(weight=1), "globex": Tenant(weight=1)},
        )
        handles = {
            tenant: [
                scheduler.submit(
                    "llm", {"input": f"{tenant}{i}", "billed": 2}, cost_estimate=2, tenant=tenant
                )
                for i in range(4)
            ]
            for tenant in ("acme", "globex")
        }
        records = {tenant: [await h.wait() for h in hs] for tenant, hs in handles.items()}
        await scheduler.close()
        return records, budget

    records, budget = run_on(rt_name, body)
    acme = [r.status for r in records["acme"]]
    assert acme.count(TaskStatus.SUCCEEDED) == 2 and acme.count(TaskStatus.FAILED) == 2  # 2 + 2 + 2 > 5
    assert all(r.status is TaskStatus.SUCCEEDED for r in records["globex"])
    refused = [r for r in records["acme"] if r.status is TaskStatus.FAILED]
    assert all(r.error.startswith("BudgetExceeded: budget per_tenant_per_day[acme] spent") for r in refused)
    assert budget.billed_by_tenant == {"acme": 4.0, "globex": 8.0}
    assert budget.refused == {"per_tenant_per_day[acme]": 2}


def test_a_limit_for_an_unknown_tenant_is_refused_before_any_call() -> None:
    from aiqsim.scheduler.tenants import Tenant

    runtime = SimPyRuntime()
    provider = BilledProvider(runtime)
    budget = Budget(per_tenant_per_day={"acme": 1.0, "initech": 2.0}, prices={"llm": 1.0})
    with pytest.raises(ConfigurationError, match=r"per_tenant_per_day: \['initech'\] name no tenant"):
        Scheduler(runtime, [provider], gates=[budget], tenants={"acme": Tenant(weight=1)})
    assert provider.calls == []
