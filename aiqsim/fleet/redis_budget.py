"""A spend budget shared by every worker of a fleet, kept in the Redis account of its quota.

:class:`RedisBudgetLedger` is the ledger of a :class:`~aiqsim.overload.Budget` (``Budget(...,
ledger=RedisBudgetLedger(quota))``): every worker's budget reserves and settles in Redis, under the
quota account's hash tag (``{aiqsim:quota:<name>}``, :func:`~aiqsim.fleet.redis_quota.quota_key_prefix`),
so a Redis Cluster runs its scripts on the account's node:

- ``{aiqsim:quota:<name>}:budget``: a hash, per budget (``per_day``, ``per_tenant_per_day[acme]``)
  its day and what that day spent and reserved;
- ``{aiqsim:quota:<name>}:budget-hold:<id>``: one per reservation not yet settled;
- ``{aiqsim:quota:<name>}:budget-definition``: the budget's limits and prices, which every worker's
  must equal (first writer wins, as the quota's definition).

**No overspend by N workers.** A reservation is one Lua script: it reads every budget the attempt
must fit in, checks ``spent + estimate <= limit`` for each (:func:`aiqsim.core.budget.admits`) and
adds the estimate to all of them, or to none; Redis runs it alone, so two workers can never both
take the last room. The settle (estimate replaced by the bill) is a script too, applied at most
once: it applies only while the reservation's hold key exists and deletes it, so a settle resent
after a lost answer does nothing the second time. Total spend therefore stays within the limit
except for bills above their estimates, by at most the sum of those underestimates over the calls in
flight at once (zero when estimates are upper bounds).

**Days on the Redis server's clock.** Workers' scheduler clocks start at different instants, so a
fleet's budget day is kept on one clock, Redis's (``TIME``, Unix seconds): days of ``day_s`` wall
seconds from ``day_origin_unix_s`` (``0``: days reset at midnight UTC). A refusal's ``resets_at`` is
converted back to the asking worker's scheduler clock (``now + seconds left / time_scale``).

**When Redis does not answer** a reservation, the attempt is refused (fail closed: an unknown spend
is not overspent), as :class:`~aiqsim.core.failures.AttemptRejectedError` saying so; a settle that
Redis did not answer is kept (:attr:`RedisBudgetLedger.unsettled`) and sent again before the next
call. A reservation whose answer was lost is released the same way (its hold, if it was made).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiqsim.core.budget import DAY_S, BudgetHold
from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import AttemptRejectedError, BudgetExceeded
from aiqsim.core.numeric import check_time_scale, is_positive_finite, is_real
from aiqsim.core.token_bucket import QuotaConfigError
from aiqsim.fleet.redis_quota import quota_key_prefix

__all__ = ["RedisBudgetLedger", "SharedBudgetHold"]

# KEYS[1] = the budget hash, KEYS[2] = the definition, KEYS[3] = this reservation's hold key.
# ARGV: origin (Unix s), day_s, amount, definition, n, then n (name, limit) pairs.
# Answers {1, '', spent, limit, seconds to reset, day} when reserved, {0, name, spent, limit, seconds
# to reset, day} when budget `name` refuses (nothing reserved), {-1, the account's definition}.
_RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local defined = redis.call('GET', KEYS[2])
if not defined then redis.call('SET', KEYS[2], ARGV[4])
elseif defined ~= ARGV[4] then return {-1, defined} end
local origin, days, amount = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local day = math.floor((now - origin) / days)
local left = string.format('%.17g', origin + (day + 1) * days - now)
local n = tonumber(ARGV[5])
local spent = {}
for i = 1, n do
    local name, limit = ARGV[4 + 2 * i], tonumber(ARGV[5 + 2 * i])
    local s = 0
    if tonumber(redis.call('HGET', KEYS[1], name .. ':day') or '') == day then
        s = tonumber(redis.call('HGET', KEYS[1], name .. ':spent'))
    end
    local ok
    if amount <= 0 then ok = s < limit else ok = s + amount <= limit end
    if not ok then
        return {0, name, string.format('%.17g', s), ARGV[5 + 2 * i], left, tostring(day)}
    end
    spent[i] = s
end
for i = 1, n do
    local name = ARGV[4 + 2 * i]
    local total = string.format('%.17g', spent[i] + amount)
    redis.call('HSET', KEYS[1], name .. ':day', tostring(day), name .. ':spent', total)
end
redis.call('SET', KEYS[3], tostring(day), 'PX', math.floor(2 * days * 1000))
redis.call('PEXPIRE', KEYS[1], math.floor(2 * days * 1000))
return {1, '', '', '', left, tostring(day)}
"""

# KEYS[1] = the budget hash, KEYS[2] = the hold key. ARGV: delta (billed - estimate), then the names.
# Applied only if the hold exists (at most once); only to budgets still on the hold's day.
_SETTLE = """
local day = redis.call('GET', KEYS[2])
if not day then return 0 end
redis.call('DEL', KEYS[2])
local delta = tonumber(ARGV[1])
for i = 2, #ARGV do
    local name = ARGV[i]
    if redis.call('HGET', KEYS[1], name .. ':day') == day then
        local s = tonumber(redis.call('HGET', KEYS[1], name .. ':spent')) + delta
        redis.call('HSET', KEYS[1], name .. ':spent', string.format('%.17g', math.max(0, s)))
    end
end
return 1
"""

# KEYS[1] = the budget hash. ARGV: origin, day_s, name. Answers what `name` spent today.
_SPENT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local day = math.floor((now - tonumber(ARGV[1])) / tonumber(ARGV[2]))
if tonumber(redis.call('HGET', KEYS[1], ARGV[3] .. ':day') or '') ~= day then return '0' end
return redis.call('HGET', KEYS[1], ARGV[3] .. ':spent')
"""

# KEYS[1] = the definition; ARGV[1] = this worker's, ARGV[2] = '1' to replace it.
_DEFINE = """
local defined = redis.call('GET', KEYS[1])
if not defined or ARGV[2] == '1' then redis.call('SET', KEYS[1], ARGV[1]) return ARGV[1] end
return defined
"""


@dataclass(frozen=True, slots=True)
class SharedBudgetHold:
    """A settle Redis did not answer: sent again (it applies at most once, see the module docs)."""

    hold_key: str
    delta: float
    budgets: tuple[str, ...]


class RedisBudgetLedger:
    """The spend of a :class:`~aiqsim.overload.Budget`, shared through the Redis account of ``quota``
    (a :class:`~aiqsim.fleet.RedisQuota`: its client, account name and ``time_scale``), or of the
    account ``name`` on ``client``. See the module docs.

    ``day_origin_unix_s``: a Unix instant a budget day starts at (``0``: midnight UTC); ``day_s``:
    a day's length in wall seconds. ``redefine`` replaces the budget's definition in Redis (to change
    its limits deliberately; workers still running with the old ones then refuse their attempts).
    """

    def __init__(
        self,
        quota: Any = None,
        *,
        client: Any = None,
        name: str | None = None,
        time_scale: float | None = None,
        day_origin_unix_s: float = 0.0,
        day_s: float = DAY_S,
        redefine: bool = False,
    ) -> None:
        if quota is not None:
            client = quota.client if client is None else client
            name = quota.name if name is None else name
            time_scale = quota.time_scale if time_scale is None else time_scale
        if client is None or not isinstance(name, str) or not name:
            raise ConfigurationError(
                "RedisBudgetLedger needs a RedisQuota (quota=) or a Redis client and an account name "
                f"(client=, name=), got quota={quota!r}, client={client!r}, name={name!r}"
            )
        time_scale = 1.0 if time_scale is None else time_scale
        check_time_scale(time_scale)
        if not is_real(day_origin_unix_s) or not math.isfinite(day_origin_unix_s):
            raise ConfigurationError(
                f"RedisBudgetLedger day_origin_unix_s must be a finite number, got {day_origin_unix_s!r}"
            )
        if not is_positive_finite(day_s):
            raise ConfigurationError(f"RedisBudgetLedger day_s must be a finite number > 0, got {day_s!r}")
        import redis  # the fleet extra; present since a client was given

        self._failed: tuple[type[Exception], ...] = (redis.RedisError, redis.exceptions.RedisClusterException)
        self.name = name
        self.time_scale = float(time_scale)
        self.day_origin_unix_s = float(day_origin_unix_s)
        self.day_s = float(day_s)
        self.redefine = redefine
        self._client = client
        prefix = quota_key_prefix(name)
        self._hash = f"{prefix}:budget"
        self._definition_key = f"{prefix}:budget-definition"
        self._hold_prefix = f"{prefix}:budget-hold:"
        self._reserve = client.register_script(_RESERVE)
        self._settle = client.register_script(_SETTLE)
        self._spent = client.register_script(_SPENT)
        self._define = client.register_script(_DEFINE)
        self._instance = f"{os.urandom(6).hex()}:{os.getpid()}"
        self._sequence = 0
        self.definition = ""
        """The budget's definition this worker enforces (set by :meth:`define`)."""
        self.unsettled: list[SharedBudgetHold] = []
        """Settles Redis did not answer, sent again before the next call."""
        self.unavailable = 0
        """Calls that found Redis unreachable (each reservation refused, each settle kept)."""

    def define(self, budget: dict[str, Any]) -> None:
        """Store ``budget`` (limits and prices) as the account budget's definition if it has none (or
        ``redefine``); refuse, with :class:`~aiqsim.core.token_bucket.QuotaConfigError` naming both, a
        worker whose definition differs. Called by :class:`~aiqsim.overload.Budget` when it is made."""
        budget = {**budget, "day_origin_unix_s": self.day_origin_unix_s, "day_s": self.day_s}
        self.definition = json.dumps(budget, sort_keys=True, separators=(",", ":"))
        try:
            stored = self._define(
                keys=[self._definition_key], args=[self.definition, "1" if self.redefine else "0"]
            )
        except self._failed as error:
            raise ConfigurationError(
                f"RedisBudgetLedger {self.name!r}: cannot reach Redis at start-up "
                f"({type(error).__name__}: {error})"
            ) from None
        stored = stored.decode() if isinstance(stored, bytes) else str(stored)
        if stored != self.definition:
            raise self._disagreement(stored)

    def _disagreement(self, stored: str) -> QuotaConfigError:
        return QuotaConfigError(
            f"RedisBudgetLedger {self.name!r}: this worker's budget ({self.definition}) differs from the "
            f"account's in Redis ({stored}); every worker must use the same limits and prices, or "
            "redefine it deliberately with RedisBudgetLedger(..., redefine=True)"
        )

    def _flush(self) -> bool:
        """Send the settles kept from an outage; False if Redis still does not answer."""
        while self.unsettled:
            kept = self.unsettled[0]
            try:
                self._settle(keys=[self._hash, kept.hold_key], args=[kept.delta, *kept.budgets])
            except self._failed:
                self.unavailable += 1
                return False
            self.unsettled.pop(0)
        return True

    def reserve(self, limits: Sequence[tuple[str, float]], amount: float, price: float, now: float) -> Any:
        """Reserve ``amount`` in every budget of ``limits`` at once, in Redis (see the module docs):
        a :class:`~aiqsim.overload.BudgetHold`, a :class:`~aiqsim.core.failures.BudgetExceeded`, or an
        :class:`~aiqsim.core.failures.AttemptRejectedError` when Redis does not answer."""
        if not self.definition:
            raise ConfigurationError(
                f"RedisBudgetLedger {self.name!r} has no definition: give it to a Budget"
            )
        self._sequence += 1
        hold_key = f"{self._hold_prefix}{self._instance}:{self._sequence}"
        names = [name for name, _ in limits]
        args: list[Any] = [
            self.day_origin_unix_s,
            self.day_s,
            repr(float(amount)),
            self.definition,
            len(limits),
        ]
        for name, limit in limits:
            args += [name, repr(float(limit))]
        if not self._flush():
            return self._unanswered("settles kept from an outage could not be sent")
        try:
            answer = self._reserve(keys=[self._hash, self._definition_key, hold_key], args=args)
        except self._failed as error:
            self.unavailable += 1
            self.unsettled.append(SharedBudgetHold(hold_key, -float(amount), tuple(names)))  # if it ran
            return self._unanswered(f"{type(error).__name__}: {error}")
        code = int(answer[0])
        if code == -1:
            raise self._disagreement(_text(answer[1]))
        resets_at = now + float(_text(answer[4])) / self.time_scale
        if code == 0:
            return BudgetExceeded(
                _text(answer[1]),
                spent=float(_text(answer[2])),
                limit=float(_text(answer[3])),
                estimate=float(amount),
                resets_at=resets_at,
            )
        return BudgetHold(
            budgets=tuple(names), amount=float(amount), day=int(answer[5]), price=price, token=hold_key
        )

    def _unanswered(self, why: str) -> AttemptRejectedError:
        return AttemptRejectedError(
            f"budget ledger {self.name!r}: Redis does not answer ({why}); "
            "the attempt is refused (fail closed)"
        )

    def settle(self, hold: Any, billed: float, now: float) -> None:
        """Replace ``hold``'s estimate by ``billed`` in Redis (at most once; kept while Redis does
        not answer)."""
        self.unsettled.append(SharedBudgetHold(hold.token, float(billed) - hold.amount, hold.budgets))
        self._flush()

    def spent(self, budget: str, now: float) -> float:
        """What ``budget`` has spent and reserved today (Redis's day); ``nan`` if Redis does not answer."""
        try:
            return float(
                _text(self._spent(keys=[self._hash], args=[self.day_origin_unix_s, self.day_s, budget]))
            )
        except self._failed:
            self.unavailable += 1
            return math.nan


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
