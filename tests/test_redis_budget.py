"""A spend budget shared through a fleet's Redis account (real Redis): N worker processes, each
with its own client, all starting at once, cannot overspend it; the settle applies at most once;
workers whose budgets differ refuse to start; an unreachable Redis refuses attempts (fail closed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aiqsim.core.failures import AttemptRejectedError, BudgetExceeded
from aiqsim.core.token_bucket import QuotaConfigError, QuotaLimits
from aiqsim.overload import Budget
from tests.redis_accounts import quota

WORKER = Path(__file__).with_name("helpers_budget_worker.py")
WORKERS = 4
TASKS_EACH = 40
CONCURRENCY = 8
"""The account's fleet-wide concurrency: at most this many attempts are in flight at once."""
ESTIMATE, PRICE, LIMIT = 10.0, 0.01, 5.0
"""Each attempt is estimated at 10 units = 0.1; the day's budget of 5.0 fits exactly 50 of them."""


def ledger_for(redis_url: str, account: str, **options: Any):  # type: ignore[no-untyped-def]
    from aiqsim.fleet import RedisBudgetLedger

    return RedisBudgetLedger(quota(redis_url, account, QuotaLimits(concurrency=CONCURRENCY)), **options)


def run_fleet(redis_url: str, account: str, tmp_path: Path, billed: float) -> list[dict[str, Any]]:
    go = tmp_path / f"go-{billed}"
    procs = []
    for n in range(WORKERS):
        command = [
            sys.executable, str(WORKER), "--redis", redis_url, "--account", account, "--go", str(go),
            "--name", f"w{n}", "--tasks", str(TASKS_EACH), "--concurrency", str(CONCURRENCY),
            "--estimate", str(ESTIMATE), "--billed", str(billed), "--price", str(PRICE),
            "--limit", str(LIMIT), "--latency", "0.01",
        ]  # fmt: skip
        procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    summaries = []
    try:
        for proc in procs:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line.strip() == "ready", proc.communicate(timeout=60)[1][-3000:]
        go.touch()
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err[-3000:]
            summaries.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return summaries


def test_workers_sharing_a_redis_budget_cannot_overspend_it(
    redis_url: str, account: str, tmp_path: Path
) -> None:
    # bills equal to the estimates: no overshoot at all, and exactly 50 of the 160 attempts fit
    summaries = run_fleet(redis_url, account, tmp_path, billed=ESTIMATE)
    assert all(s["failed_otherwise"] == 0 for s in summaries), summaries
    succeeded = sum(s["succeeded"] for s in summaries)
    billed = sum(s["billed"] for s in summaries)
    assert succeeded == LIMIT / (ESTIMATE * PRICE) == 50, summaries
    assert sum(s["refused"] for s in summaries) == WORKERS * TASKS_EACH - 50
    assert billed == pytest.approx(LIMIT) and billed <= LIMIT + 1e-9
    assert sum(s["succeeded"] > 0 for s in summaries) >= 2, (
        summaries
    )  # a race between workers, not one worker
    budget = Budget(per_day=LIMIT, prices={"llm": PRICE}, ledger=ledger_for(redis_url, account))
    assert budget.spent(0.0) == pytest.approx(LIMIT)


def test_bills_above_their_estimates_overshoot_by_at_most_the_calls_in_flight(
    redis_url: str, account: str, tmp_path: Path
) -> None:
    billed_units = 1.5 * ESTIMATE  # each bill is 0.05 above its estimate of 0.1
    summaries = run_fleet(redis_url, account, tmp_path, billed=billed_units)
    billed = sum(s["billed"] for s in summaries)
    overshoot_bound = CONCURRENCY * (billed_units - ESTIMATE) * PRICE  # 8 calls in flight x 0.05
    assert LIMIT - ESTIMATE * PRICE < billed <= LIMIT + overshoot_bound + 1e-9, summaries
    budget = Budget(per_day=LIMIT, prices={"llm": PRICE}, ledger=ledger_for(redis_url, account))
    assert budget.spent(0.0) == pytest.approx(billed)  # Redis's spend is the sum of the workers' bills


def test_a_settle_resent_after_a_lost_answer_applies_once(redis_url: str, account: str) -> None:
    ledger = ledger_for(redis_url, account)
    Budget(per_day=1.0, prices={"llm": 1.0}, ledger=ledger)
    hold = ledger.reserve([("per_day", 1.0)], 0.5, 1.0, 0.0)
    assert not isinstance(hold, AttemptRejectedError)
    ledger.settle(hold, 0.2, 0.0)
    ledger.settle(hold, 0.2, 0.0)  # as a resend would: the hold is gone, nothing applied
    assert ledger.spent("per_day", 0.0) == pytest.approx(0.2)
    refusal = ledger.reserve([("per_day", 1.0)], 0.9, 1.0, 5.0)
    assert isinstance(refusal, BudgetExceeded) and refusal.budget == "per_day"
    assert refusal.spent == pytest.approx(0.2) and refusal.resets_at > 5.0


def test_workers_with_different_budgets_refuse_to_start(redis_url: str, account: str) -> None:
    Budget(per_day=1.0, prices={"llm": 1.0}, ledger=ledger_for(redis_url, account))
    with pytest.raises(QuotaConfigError, match="differs from the account's"):
        Budget(per_day=2.0, prices={"llm": 1.0}, ledger=ledger_for(redis_url, account))
    Budget(per_day=2.0, prices={"llm": 1.0}, ledger=ledger_for(redis_url, account, redefine=True))


def test_an_unreachable_redis_refuses_the_attempt(account: str) -> None:
    import redis

    from aiqsim.fleet import RedisBudgetLedger

    client = redis.Redis(host="127.0.0.1", port=1, socket_timeout=0.2, socket_connect_timeout=0.2)
    ledger = RedisBudgetLedger(client=client, name=account)
    ledger.definition = '{"per_day": 1.0}'  # as if defined before the outage
    refusal = ledger.reserve([("per_day", 1.0)], 0.5, 1.0, 0.0)
    assert isinstance(refusal, AttemptRejectedError) and not isinstance(refusal, BudgetExceeded)
    assert "fail closed" in str(refusal) and ledger.unavailable == 1


def test_the_budget_scripts_run_on_a_redis_cluster(redis_cluster_url: str) -> None:
    """Every key a budget script names carries the account's hash tag: a cluster runs them (no CROSSSLOT)."""
    import random

    import redis
    from redis.cluster import RedisCluster

    from aiqsim.fleet import RedisBudgetLedger

    name = f"acct-{random.Random().getrandbits(40):010x}"
    ledger = RedisBudgetLedger(client=RedisCluster.from_url(redis_cluster_url), name=name)
    Budget(per_day=1.0, prices={"llm": 1.0}, ledger=ledger)
    hold = ledger.reserve([("per_day", 1.0), ("per_tenant_per_day[a]", 0.5)], 0.5, 1.0, 0.0)
    assert not isinstance(hold, AttemptRejectedError)
    ledger.settle(hold, 0.25, 0.0)
    assert ledger.spent("per_day", 0.0) == pytest.approx(0.25) and ledger.unsettled == []
    plain = redis.Redis.from_url(redis_cluster_url)
    keys = [ledger._hash, ledger._definition_key, hold.token]
    assert len({int(plain.execute_command("CLUSTER", "KEYSLOT", key)) for key in keys}) == 1
    for key in plain.keys(f"{{aiqsim:quota:{name}}}*"):
        plain.delete(key)
