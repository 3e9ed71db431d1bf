"""A user's crash-recovery test of their own pipeline, with aiqsim's pytest plugin (no conftest).

The pipeline summarises support tickets with a model and charges the customer one credit per
summary. Its provider is a :class:`~aiqsim.http.CallableProvider` around the user's own async
function, with a ``lookup`` that answers from the user's result cache so ``recover()`` can finish
a call the dead process had made. The ``aiqsim_crash`` fixture runs the pipeline once per crash
point (right before and after each store write, right after each charge) and seed, kills it there,
restarts it with ``recover()`` and checks that no ticket was lost and no charge happened twice.

``charge_once`` passes the task's idempotency key to the billing service, which ignores a key it
has already charged: it survives every crash. ``charge_every_time`` does not: a crash after the
charge and before the result is cached leaves the task running in the store, recovery's lookup
finds no result, re-sends it, and the customer pays twice. That test is marked
``xfail(strict=True)``: it must fail, which proves the kit catches the bug. Run it with
``--runxfail`` to see the message (which key, which seed and crash point, and the option that
replays the case)::

    pytest examples/test_my_pipeline.py                 # 4 passed, 1 xfailed
    pytest examples/test_my_pipeline.py --runxfail -k every_time
    pytest examples/test_my_pipeline.py --aiqsim-seeds 10 --aiqsim-crash-points sample:20
"""

from __future__ import annotations

from typing import Any

import pytest

from aiqsim import QuotaLimits, RetryPolicy
from aiqsim.http import CallableProvider
from aiqsim.scheduler import ProviderRequest
from aiqsim.testing import CrashWorld, EffectLog, InvariantViolation, Life

TICKETS = 6


# ------------------------------------------------------------------------- the user's own code
class Billing:
    """Stand-in for the user's billing service. It records each real charge in ``effects`` (the
    kit's log of what must happen at most once) under the charge's reference."""

    def __init__(self, effects: EffectLog) -> None:
        self.effects = effects
        self.charged_keys: set[str] = set()

    def charge(
        self, account: str, credits: int, *, reference: str, idempotency_key: str | None = None
    ) -> None:
        if idempotency_key is not None:
            if idempotency_key in self.charged_keys:
                return  # the service has seen this key: no second charge
            self.charged_keys.add(idempotency_key)
        self.effects.record(reference, what=f"charge {credits} credit(s) to {account}")


def summariser(world: CrashWorld, *, pass_key_to_billing: bool) -> CallableProvider:
    """The user's provider: call the model, charge the customer, cache the result for ``lookup``."""
    billing = Billing(world.effects)
    results: dict[str, Any] = {}

    async def summarise(request: ProviderRequest) -> dict[str, Any]:
        ticket = request.payload
        await world.runtime.sleep(0.4)  # the model call (virtual time)
        billing.charge(
            ticket["account"],
            1,
            reference=f"ticket-{ticket['id']}",
            idempotency_key=request.idempotency_key if pass_key_to_billing else None,
        )
        await world.runtime.sleep(0.1)  # writing the summary back
        summary = {"ticket": ticket["id"], "summary": f"summary of ticket {ticket['id']}"}
        results[request.idempotency_key] = summary
        return summary

    async def lookup(key: str) -> dict[str, Any] | None:
        return results.get(key)

    return CallableProvider("summarise", summarise, lookup=lookup)


async def pipeline(life: Life) -> None:
    """One process life of the user's worker: submit every ticket once (by a stable id), wait."""
    for n in range(TICKETS):
        ticket = {"id": n, "account": f"acct-{n % 3}", "text": f"ticket {n} text"}
        life.submit("summarise", ticket, task_id=f"ticket-{n}")
    await life.join()


SCHEDULER = {
    "quotas": {"summarise": QuotaLimits(concurrency=3)},
    "retry": RetryPolicy(max_attempts=3, attempt_timeout_s=30),
}
RECOVER = {"requeue_interrupted": True}  # re-send what the lookup cannot vouch for


# ------------------------------------------------------------------------- the user's tests
def test_charge_once_survives_a_crash_at_every_store_write(aiqsim_crash) -> None:
    report = aiqsim_crash.run(
        pipeline,
        providers=lambda world: [summariser(world, pass_key_to_billing=True)],
        scheduler_options=SCHEDULER,
        recover_options=RECOVER,
    )
    assert report.cases > len(report.seeds)  # crash cases ran, not only the crash-free runs
    print(f"\n{report}")


def test_charge_once_on_every_store(aiqsim_crash, aiqsim_store) -> None:
    aiqsim_crash.on(aiqsim_store).run(
        pipeline,
        providers=lambda world: [summariser(world, pass_key_to_billing=True)],
        scheduler_options=SCHEDULER,
        recover_options=RECOVER,
    )


@pytest.mark.xfail(
    strict=True,
    raises=InvariantViolation,
    reason="deliberate bug: the charge ignores the idempotency key, so a re-sent orphan charges twice",
)
def test_charge_every_time_is_caught_charging_twice(aiqsim_crash) -> None:
    aiqsim_crash.run(
        pipeline,
        providers=lambda world: [summariser(world, pass_key_to_billing=False)],
        scheduler_options=SCHEDULER,
        recover_options=RECOVER,
    )
