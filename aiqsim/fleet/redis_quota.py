"""A multi-dimension quota shared by every worker of a fleet through Redis.

:class:`RedisQuota` has the interface the scheduler already calls on a lane's
:class:`~aiqsim.core.token_bucket.MultiQuota` (``try_reserve``, ``time_until``, ``release``,
``cancel``, ``reconcile``, ``pause_until``, ``levels``), so ``Scheduler(quotas={"llm":
RedisQuota(...)})`` makes every worker on every host draw from one account-wide budget:

- **All or nothing, atomically.** A reservation (one request, ``cost`` tokens and a concurrency
  slot) is one Lua script: Redis runs it alone, so there is no read-modify-write race between
  workers and nobody ever holds half of what they need. Reconcile (charge or refund the
  difference between the estimate and the actual usage) and cancel are scripts too.
- **One clock.** Refill is computed on the Redis server's clock (``TIME``), never on a
  worker's: hosts' clocks differ, and a runtime's clock (``now``) may be virtual.
- **Shared pause.** A 429's Retry-After pauses the account for every worker (``pause_until``),
  stored in Redis as a server-clock instant.
- **Slots are leases.** A concurrency slot is a member of a sorted set scored by its expiry
  (``slot_ttl_s`` after the reservation), so the slots of a worker killed mid-call come back on
  their own instead of leaking for ever. ``slot_ttl_s`` must exceed the attempt timeout: a
  :class:`~aiqsim.scheduler.Scheduler` refuses a retry policy whose ``attempt_timeout_s`` is
  ``None`` or not below it (for the scheduler's policy when it is made, a task's own at
  ``submit``), rather than renew slots in flight.
- **Redis must keep its state across a restart** (``appendonly yes``): a restart that loses it
  forgets the slots in use, so the fleet may run up to twice its concurrency until those calls
  end, and the buckets start full. Nothing here can tell a lost state from a new account.
- **When Redis is unreachable** the quota fails closed by default: nothing is granted, and
  ``time_until`` asks the lane to try again after ``retry_s`` — a fleet never overruns the
  account's limit because its coordinator is down. With ``fallback=QuotaLimits(...)`` (e.g.
  the account's limits divided by the number of workers) each worker instead runs on that local
  share until Redis answers again; reservations made locally are settled locally. Both are
  counted in :attr:`unavailable`. An answer that means the settings can never work (a database
  index out of range, a wrong password, a missing ACL permission, a key of the wrong type) is
  not unavailability: the reservation raises :class:`QuotaConfigError` saying what Redis
  answered, and the scheduler fails the task with it.
- **Nothing owed is dropped.** A settle (a reconcile's charge or refund, a release, a cancel)
  that Redis did not answer is kept in this worker (:attr:`unsettled`) and sent with the next
  settle, or before the next reservation, once Redis answers: the fleet is charged for tokens
  it used during a blip. A reservation whose answer was lost (a timeout: the script may have
  run) has its slot freed the same way, instead of held by nobody for ``slot_ttl_s``. One race
  remains: a stalled Redis that runs the lost reservation only *after* that release keeps its
  slot until ``slot_ttl_s``. Kept amounts are bounded: the owed requests and tokens to one bucket
  capacity each (a worker's debt never freezes the fleet for more than one burst's refill), the
  slots to free to :data:`MAX_UNSETTLED_SLOTS` (the oldest beyond lapse after ``slot_ttl_s``).
- **A settle is applied at most once.** A settle whose answer was lost (a timeout) may have run in
  Redis all the same: sent again blindly, a reconcile's charge was taken twice (estimate 500,
  actual 9 000: level -7 399 instead of 1 101, the fleet waiting ~51 s for nothing) and a cancel's
  refund given twice (the fleet could exceed the account's limit). So each settle carries a
  sequence number of this worker's, and the script applies it only if it is above the last one it
  applied for this worker (``{aiqsim:quota:<name>}:settled:<worker instance>:<pid>``, one small key
  per worker, created by its first reservation and kept ``2 x`` :data:`SETTLE_RESEND_S` after each
  of its calls that reaches Redis): a settle in doubt is resent as it was (same number), alone,
  before anything newer, so a resend of one Redis already ran does nothing. A missing marker thus
  means no call of this worker reached Redis for that long: a settle in doubt that finds none, more
  than :data:`SETTLE_RESEND_S` of the Redis server's clock after the last answer the worker saw,
  frees its slots but charges or refunds nothing (it may have run and outlived its marker; what it
  owed is that old, long refilled: dropped rather than risk applying it twice). A long call alone
  (a ``slot_ttl_s`` over a day) drops nothing: its reservation kept the marker.
- **A forked process settles only its own.** A child forked from a process with quotas (a
  pre-forking server, ``multiprocessing``'s fork context) starts with nothing to settle: the
  settles its parent still owes (kept, merged or in doubt) and the slots it keeps to free stay
  the parent's, which sends them (``os.register_at_fork``); a child that sent them too applied
  each twice. The child gets an instance id and a sequence of its own, hence its own marker: children
  of one parent shared them, and a child given a dead sibling's pid found the sibling's marker
  above its numbers and had every settle skipped.

The limits are the same :class:`~aiqsim.core.token_bucket.QuotaLimits` as a local quota (per
minute of the scheduler's clock, bursts defaulting to a minute's worth); ``time_scale`` (wall
seconds per scheduler second, as :class:`~aiqsim.runtime.AsyncioRuntime`'s) converts them to
Redis's wall clock, and waits back. Every worker must use the same limits and name.

**The account's definition lives with the account.** Workers given different limits for one
account each enforced their own (a worker at 106 requests a minute and one at 10x that granted 1,002
in 10 s; concurrency 4 and 40 gave 40 slots). So the limits are stored in Redis
(``{aiqsim:quota:<name>}:definition``, :func:`account_definition`: rates per wall-clock minute, bursts,
concurrency): the first worker to reach the account writes them, atomically (one script), and a
worker whose limits differ refuses to start with :class:`QuotaConfigError` naming both definitions.
Every reservation checks them too (same script), so a worker started with ``verify=False``, or one
still running after the account was redefined, refuses its reservations rather than enforce other
limits. To change an account's limits deliberately: stop its workers, make one quota with
``RedisQuota(url, name, new_limits, redefine=True)`` (it replaces the definition), and start the
workers with the new limits. The definition is kept until deleted by hand.

**Outages are reported.** A quota made with ``verify=True`` (the default) asks Redis at once: a URL
that cannot be reached (a typo in the port, a server that is down) raises
:class:`~aiqsim.core.errors.ConfigurationError` naming the URL without its password and what to
check, instead of leaving every task waiting. When a working Redis stops answering, the quota logs a
warning once per outage (and again when it answers) and calls each reporter given to
:meth:`RedisQuota.report_outages_to`: a :class:`~aiqsim.scheduler.Scheduler` given the quota
registers one that emits :class:`~aiqsim.scheduler.events.QuotaUnavailable` through its event sink.
Server header corrections (``x-ratelimit-*``) do not apply to a shared quota (``requests`` and
``tokens`` are ``None`` here): they would let one worker's view overwrite the fleet's. A reported
usage is still clamped to the shared bucket's capacity (:attr:`token_capacity`), as a local
lane's is, so one absurd report cannot freeze every worker.

Each call is one round trip to Redis (about 0.1-0.3 ms on loopback or a LAN), made
synchronously from the scheduler's loop; keep Redis close to the workers. A call that fails
(up to ``socket_timeout_s`` when Redis stalls) is followed by ``retry_s`` of the scheduler's
clock in which Redis is not asked at all (doubled after each failure in a row, up to
:data:`MAX_REST_S`), so a stall blocks the loop once per window rather than once per queued
task; keep ``socket_timeout_s`` well below a lease's ttl (:mod:`aiqsim.fleet.leases`). A clock
reading before the failure's (the quota reused by a new scheduler on a fresh runtime) ends the
window at once, so it never lasts longer than that ``retry_s`` on any clock.

**Keys, and Redis Cluster.** An account ``<name>`` keeps ``{aiqsim:quota:<name>}:state`` (a hash:
the bucket levels and the pause), ``{aiqsim:quota:<name>}:slots`` (a sorted set: the concurrency
slots), ``{aiqsim:quota:<name>}:definition`` (the account's limits, see above) and one
``{aiqsim:quota:<name>}:settled:<instance>:<pid>`` per worker (see above). Every
script names several of them, and a Redis Cluster runs a script only when all its keys are in one
hash slot: the braces make ``aiqsim:quota:<name>`` the *hash tag* that alone picks the slot
(:func:`quota_key_prefix`), so all the keys of an account live on one node and a cluster runs the
scripts instead of refusing them with ``CROSSSLOT``. The tag is never empty and is the same for
every key of one account whatever its name holds (a name with a ``}`` cuts the tag short, for all
its keys alike). On a cluster of several nodes pass ``client=redis.cluster.RedisCluster(...)``,
which sends each script to the node owning its slot; a plain ``redis.Redis`` (the ``url``) works
only when the node it reaches owns that slot (a one-node cluster, a cluster proxy): another node
answers ``MOVED``, which the reservation raises as :class:`QuotaConfigError`. One quota's calls
all go to that one node: a cluster spreads accounts over nodes, not one account's load. The cluster
client raises its own errors outside ``RedisError`` (``RedisClusterUnreachableError`` when no node
answers): those of a cluster that may answer later count as unavailability (fail closed, or the
fallback share), the others as a misconfiguration, as a plain client's errors do.

**Upgrading from a version before the hash tag.** The keys used to be ``aiqsim:quota:<name>:state``,
``...:slots`` and ``...:settled:...``, without braces. Those are different keys: **a worker of the
old version and one of this version on the same account do not share the quota** (each side has
its own buckets, pause and slots, so together they may use up to twice the account's limits).
Stop every worker of the old version before starting one of this version, or upgrade them all at
once. Nothing carries over: the new keys start as a new account's (buckets full, no pause, no
slots). The old state hash never expires (delete ``aiqsim:quota:<name>:state`` by hand once no old
worker runs); the old slots and settle markers lapse on their own (``slot_ttl_s`` + 60 s after the
last reservation, two days).
"""

from __future__ import annotations

import json
import logging
import math
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiqsim.core.dsn import redacted_dsn
from aiqsim.core.errors import ConfigurationError
from aiqsim.core.fleet_quota import DEFAULT_SLOT_POLL_S, poll_full_pool
from aiqsim.core.numeric import check_time_scale, is_positive_finite, is_wait
from aiqsim.core.token_bucket import MultiQuota, QuotaConfigError, QuotaLimits, Reservation

logger = logging.getLogger(__name__)

DEFAULT_SLOT_TTL_S = 300.0
DEFAULT_RETRY_S = 0.05
MAX_REST_S = 2.0
"""The longest a quota leaves Redis alone after failures in a row (``retry_s`` if longer)."""
MAX_UNSETTLED_SLOTS = 1024
"""How many slot members whose release failed a quota keeps to free later; beyond that the
oldest are forgotten (they lapse on their own after ``slot_ttl_s``)."""
SETTLE_RESEND_S = 86_400.0
"""How long (wall seconds, on the Redis server's clock) a settle whose answer was lost can still be
told apart from one Redis never ran, and so be resent safely: Redis keeps a worker's settle marker
twice as long after the worker's last call (a reservation, a settle, a pause, a read of the levels).
A settle in doubt that finds no marker longer than this after the last answer the worker saw (a
worker cut off from Redis for days) frees its slots but charges or refunds nothing, so it is never
applied twice; a day-old charge or refund no longer matters to per-minute buckets."""

# KEYS[1] = state hash, KEYS[2] = slot sorted set, KEYS[3] = the worker's settle marker (the
# sequence number of its last applied settle). Every script keeps the marker for 2 x SETTLE_RESEND_S
# after the worker's last call (`touch`; the reservation creates it at 0), so a missing marker means
# no call of this worker ran for that long: a settle that ran and then lost its marker is that old.
# State: rl/ru (request level, updated), tl/tu (token level, updated), pause (server instant).
_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function level(prefix, cap, rate)
    if cap <= 0 then return 0 end
    local l = tonumber(redis.call('HGET', KEYS[1], prefix .. 'l'))
    local u = tonumber(redis.call('HGET', KEYS[1], prefix .. 'u'))
    if l == nil then return cap end
    if now > u then l = math.min(cap, l + rate * (now - u)) end
    return l
end
local function store(prefix, l)
    redis.call('HSET', KEYS[1], prefix .. 'l', tostring(l), prefix .. 'u', tostring(now))
end
local function touch(horizon, create)
    local ttl = math.floor(2 * tonumber(horizon) * 1000)
    if create then redis.call('SET', KEYS[3], '0', 'NX', 'PX', ttl) end
    redis.call('PEXPIRE', KEYS[3], ttl)
end
"""

# ARGV: cost, rcap, rrate, tcap, trate, concurrency, member, slot_ttl, slack, resend horizon, the
# worker's definition of the account (KEYS[4] holds the account's: first writer wins). Answers
# {granted, detail, server time}; {-1, the account's definition, server time} when they differ.
# Run only with no settle in doubt (it is resent first), so
# creating a missing marker at 0 never makes a settle that ran long ago look new.
_RESERVE = (
    _PRELUDE
    + """
local cost, rcap, rrate = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tcap, trate, conc = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local member, ttl, slack = ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9])
local defined = redis.call('GET', KEYS[4])
if not defined then redis.call('SET', KEYS[4], ARGV[11])
elseif defined ~= ARGV[11] then return {-1, defined, tostring(now)} end
touch(ARGV[10], true)
local pause = tonumber(redis.call('HGET', KEYS[1], 'pause') or '0')
if pause > now then return {0, tostring(pause - now), tostring(now)} end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if conc > 0 and redis.call('ZCARD', KEYS[2]) >= conc then return {0, 'slot', tostring(now)} end
local wait = 0
local rl = level('r', rcap, rrate)
local tl = level('t', tcap, trate)
if rcap > 0 and rl + slack * rcap < 1 then wait = math.max(wait, (1 - rl) / rrate) end
if tcap > 0 and tl + slack * tcap < cost then wait = math.max(wait, (cost - tl) / trate) end
if wait > 0 then return {0, tostring(wait), tostring(now)} end
if rcap > 0 then store('r', math.max(0, rl - 1)) end
if tcap > 0 then store('t', math.max(0, tl - cost)) end
redis.call('ZADD', KEYS[2], now + ttl, member)
redis.call('PEXPIRE', KEYS[2], math.floor((ttl + 60) * 1000))
return {1, '0', tostring(now)}
"""
)

# ARGV: refund_requests, refund_tokens (>= 0: refund; < 0: charge), rcap, rrate, tcap, trate,
# sequence number, resend horizon (SETTLE_RESEND_S), server time last seen before a resend ('' on a
# first send), then the members of the slots to free (none, one, or those of earlier settles).
# The call answered at that server time touched the marker, so a resend that finds none more than
# the horizon after it is of a worker that no call reached Redis from for that long: the settle may
# have run and its marker expired. Answers {1 applied or 0 already applied (or too old to tell),
# server time}. Freeing a slot is
# idempotent, so it is done either way; the amounts only on the settle's first application.
_SETTLE = (
    _PRELUDE
    + """
local dr, dt = tonumber(ARGV[1]), tonumber(ARGV[2])
local rcap, rrate, tcap, trate = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local seq, horizon, since = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
for i = 10, #ARGV do redis.call('ZREM', KEYS[2], ARGV[i]) end
local done = tonumber(redis.call('GET', KEYS[3]) or '')
if done ~= nil and seq <= done then touch(horizon, false) return {0, tostring(now)} end
if done == nil and since ~= nil and now - since > horizon then return {0, tostring(now)} end
redis.call('SET', KEYS[3], tostring(seq), 'PX', math.floor(2 * horizon * 1000))
if rcap > 0 and dr ~= 0 then store('r', math.min(rcap, level('r', rcap, rrate) + dr)) end
if tcap > 0 and dt ~= 0 then store('t', math.min(tcap, level('t', tcap, trate) + dt)) end
return {1, tostring(now)}
"""
)

# KEYS[1] = the account's definition; ARGV[1] = this worker's, ARGV[2] = '1' to replace it.
# Answers the definition the account has now (first writer wins, unless replaced deliberately).
_DEFINE = """
local defined = redis.call('GET', KEYS[1])
if not defined or ARGV[2] == '1' then
    redis.call('SET', KEYS[1], ARGV[1])
    return ARGV[1]
end
return defined
"""

# ARGV: seconds to pause from now (the later of this and any existing pause wins), resend horizon
_PAUSE = (
    _PRELUDE
    + """
touch(ARGV[2], false)
local resume = now + tonumber(ARGV[1])
local pause = tonumber(redis.call('HGET', KEYS[1], 'pause') or '0')
if resume > pause then redis.call('HSET', KEYS[1], 'pause', tostring(resume)) end
return tostring(resume - now)
"""
)

# ARGV: rcap, rrate, tcap, trate, resend horizon
_LEVELS = (
    _PRELUDE
    + """
touch(ARGV[5], false)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local rcap, rrate, tcap, trate = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
return {tostring(level('r', rcap, rrate)), tostring(level('t', tcap, trate)), redis.call('ZCARD', KEYS[2])}
"""
)


@dataclass(frozen=True, slots=True)
class SharedReservation(Reservation):
    """A reservation of a :class:`RedisQuota`: ``member`` names its concurrency slot in Redis.

    ``local`` is True when it was granted by the fallback share while Redis was unreachable.
    """

    member: str = ""
    local: bool = False


@dataclass(frozen=True, slots=True)
class _Settle:
    """A settle sent to Redis whose answer was lost: resent exactly as it was (same ``marker`` key
    and ``sequence``), so Redis applies it at most once. ``since`` is the Redis server time in the
    last answer the quota saw before sending it (``None``: none yet). That call kept this worker's
    marker alive until at least ``since + 2 x SETTLE_RESEND_S``, and the settle cannot have run
    before it, so a marker missing within that time means the settle never ran — however long ago
    ``since`` was when the settle was sent (a call of a day)."""

    marker: str
    sequence: int
    requests: float
    tokens: float
    members: tuple[str, ...]
    since: float | None


_LIVE: weakref.WeakSet[RedisQuota] = weakref.WeakSet()
"""Every live :class:`RedisQuota` of this process, for :func:`_after_fork_in_child` (weakly: the
hook keeps no quota alive)."""


def _after_fork_in_child() -> None:
    """Registered once with :func:`os.register_at_fork`: a child forked from a process with quotas
    (a worker pool's preloaded objects, ``multiprocessing``'s fork context) leaves what they owe to
    the parent (:meth:`RedisQuota._after_fork_in_child`)."""
    for quota in list(_LIVE):
        quota._after_fork_in_child()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)


def quota_key_prefix(name: str) -> str:
    """The part every Redis key of account ``name`` starts with: ``{aiqsim:quota:<name>}``.

    In braces, it is the keys' Redis Cluster hash tag, so all the keys of one account (state, slots,
    the workers' settle markers) hash to one slot and each Lua script, which names several, runs on a
    cluster (see the module docs). The tag holds the ``aiqsim:quota:`` prefix as well as the name, so
    it is never empty: a name starting with ``}`` would otherwise leave ``{}``, which Redis ignores,
    and hash each key whole, into different slots."""
    return f"{{aiqsim:quota:{name}}}"


def _redis_module() -> Any:
    try:
        import redis
    except ImportError as error:  # pragma: no cover - exercised only without the extra
        raise ConfigurationError("RedisQuota needs redis-py: pip install 'aiqsim[redis]'") from error
    return redis


class RedisQuota:
    """Requests, tokens and concurrency of one provider account, shared through Redis.

    Parameters:
        url: the Redis server (``redis://host:6379/0``).
        name: the account's name; every worker sharing the quota uses the same one.
        limits: the account's limits (``requests_per_min``, ``tokens_per_min``, ``concurrency``, bursts).
        worker: this worker's name, used in slot members (for inspection); any string.
        slot_ttl_s: how long a concurrency slot is held without release before it lapses.
        fallback: limits of a local share used while Redis is unreachable; ``None`` fails closed.
        retry_s: how soon to try Redis again after it failed (doubled after each failure in a row,
            up to :data:`MAX_REST_S`): until then no call is sent to it (each goes to the fallback
            share, or fails closed), so a stalled Redis blocks the loop for ``socket_timeout_s``
            once per such window, not once per call.
        socket_timeout_s: how long one Redis call may take (connect, or wait for the answer),
            wall seconds; a positive finite number.
        client: an existing ``redis.Redis`` to use instead of connecting to ``url``, or a
            ``redis.cluster.RedisCluster`` for a Redis Cluster of several nodes (see the module
            docs: every key of the account is in one hash slot).
        verify: ask Redis at once, when the quota is made: a server that cannot be reached
            raises :class:`~aiqsim.core.errors.ConfigurationError` naming the URL (without its
            password) and what to check, and limits that disagree with the account's definition
            raise :class:`QuotaConfigError` naming both. ``False`` starts without asking (a worker
            that must start during an outage, on its ``fallback`` share): the first reservation
            that reaches Redis checks the definition instead.
        redefine: replace the account's definition in Redis with ``limits`` — the one deliberate way
            to change an account's limits (see "The account's definition" in the module docs).
    """

    requests = None
    """No local bucket: header corrections do not apply to a shared quota (see module docs)."""
    tokens = None

    def __init__(
        self,
        url: str | None,
        name: str,
        limits: QuotaLimits,
        *,
        worker: str = "worker",
        slot_ttl_s: float = DEFAULT_SLOT_TTL_S,
        fallback: QuotaLimits | None = None,
        retry_s: float = DEFAULT_RETRY_S,
        socket_timeout_s: float = 1.0,
        time_scale: float = 1.0,
        client: Any = None,
        verify: bool = True,
        redefine: bool = False,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"RedisQuota needs a non-empty account name, got {name!r}")
        if not isinstance(limits, QuotaLimits):
            raise ConfigurationError(f"limits must be a QuotaLimits, got {type(limits).__name__}")
        if not is_positive_finite(slot_ttl_s):
            raise ConfigurationError(f"slot_ttl_s must be a positive number of seconds, got {slot_ttl_s!r}")
        if not is_positive_finite(retry_s):
            raise ConfigurationError(f"retry_s must be a positive number of seconds, got {retry_s!r}")
        if not is_positive_finite(socket_timeout_s):
            # 0 made every call time out at once (the lane stalled, failing closed for ever); -1 or nan
            # made redis-py raise a bare ValueError out of the dispatcher
            raise ConfigurationError(
                f"socket_timeout_s must be a positive finite number of seconds, got {socket_timeout_s!r}"
            )
        check_time_scale(time_scale)  # as the runtime's (1e-320 passed a plain finite > 0 check)
        self.time_scale = float(time_scale)
        # A local MultiQuota validates the limits exactly as a local lane would, and does the
        # pure arithmetic the shared one mirrors (capacities, rates, cost checks).
        self._shape = MultiQuota(limits)
        self.limits = limits
        self.name = name
        self.worker = worker
        self.slot_ttl_s = float(slot_ttl_s)
        self.retry_s = float(retry_s)
        self.fallback = MultiQuota(fallback) if fallback is not None else None
        self.unavailable = 0
        """Calls that found Redis unreachable, or were not sent in the ``retry_s`` after a failure
        (each fell back or failed closed)."""
        self._redis = _redis_module()
        self._failed: tuple[type[Exception], ...] = (
            self._redis.RedisError,
            self._redis.exceptions.RedisClusterException,
        )
        """What a failed call raises: redis-py's cluster client raises its own family, outside
        ``RedisError``, for a cluster it cannot reach; caught as a ``RedisError`` is, the quota fails
        closed (or falls back) as it does with a plain client, instead of raising into the lane."""
        self.url = url
        if client is None:
            if not isinstance(url, str) or not url:
                raise ConfigurationError(f"RedisQuota needs a Redis URL, got {url!r}")
            try:
                client = self._redis.Redis.from_url(
                    url, socket_timeout=socket_timeout_s, socket_connect_timeout=socket_timeout_s
                )
            except ValueError as error:  # a scheme redis-py does not know, a database that is no number
                raise ConfigurationError(
                    f"RedisQuota {name!r}: {redacted_dsn(url)} is not a Redis URL ({error}); expected "
                    "redis://host:port/db, rediss://... or unix://..."
                ) from None
        self._client = client
        prefix = quota_key_prefix(name)  # one hash tag: one Redis Cluster slot for every key
        self._keys = (f"{prefix}:state", f"{prefix}:slots")
        self._reserve = client.register_script(_RESERVE)
        self._settle = client.register_script(_SETTLE)
        self._pause = client.register_script(_PAUSE)
        self._levels = client.register_script(_LEVELS)
        self._define = client.register_script(_DEFINE)
        self._definition_key = f"{prefix}:definition"
        self.definition = account_definition(limits, self.time_scale)
        """This worker's definition of the account (:func:`account_definition`)."""
        self._reporters: list[Callable[[str], None]] = []
        self._outage = False
        """Redis failed and has not answered since: the outage was reported once (:meth:`_down`)."""
        self._encoded: tuple[tuple[float, float], tuple[bytes, ...], tuple[bytes, ...]] | None = None
        """The reservation's unchanging arguments, encoded (:meth:`_reserve_constants`)."""
        self._sequence = 0
        self._instance = os.urandom(6).hex()
        """Names this quota's slots apart from every other's, with the process id: two processes
        forked with the same objects made slots of the same names, which Redis counted once."""
        self._last_now = 0.0
        self._local_slots = 0
        self._owed_requests = 0.0
        self._owed_tokens = 0.0
        self._unsettled_members: list[str] = []
        self._in_doubt: _Settle | None = None
        """The settle whose answer was lost (it may have run): resent alone, before anything newer."""
        self._server_now: float | None = None
        """The Redis server time in the last answer (see :class:`_Settle`)."""
        self._last_error: Exception | None = None
        self._retry_at = -math.inf
        """Redis is not asked before this instant of the scheduler's clock (``retry_s`` after a failure)."""
        self._failed_at = -math.inf
        """The instant of the scheduler's clock the window after the last failure started from."""
        self._failures = 0
        _LIVE.add(self)
        if verify or redefine:
            self._check_definition(redefine)

    @property
    def client(self) -> Any:
        """The Redis client the quota calls (a shared budget ledger uses it too)."""
        return self._client

    def _where(self) -> str:
        """The server, for messages: the URL without its password, or "the given client"."""
        return redacted_dsn(self.url) if isinstance(self.url, str) else "the given client"

    def _check_definition(self, redefine: bool) -> None:
        """Store this worker's definition as the account's if it has none (first writer wins) or
        ``redefine`` says so; refuse to start when the account's differs, or Redis cannot be reached."""
        try:
            stored = self._define(
                keys=[self._definition_key], args=[self.definition, "1" if redefine else "0"]
            )
        except self._failed as error:
            self._refuse_if_misconfigured(error)
            raise ConfigurationError(
                f"RedisQuota {self.name!r}: cannot reach Redis at {self._where()} at start-up "
                f"({type(error).__name__}: {error}); check the host and port of the URL, that the "
                "Redis server runs and accepts connections from this host, its password and TLS "
                "(rediss://); or pass verify=False to start anyway (nothing is granted, or the "
                "fallback share is used, until Redis answers)"
            ) from None
        stored = stored.decode() if isinstance(stored, bytes) else str(stored)
        if redefine:
            logger.warning("RedisQuota %r: the account is redefined as %s", self.name, _described(stored))
        elif stored != self.definition:
            raise self._disagreement(stored)

    def _disagreement(self, stored: str) -> QuotaConfigError:
        """The refusal of a worker whose limits differ from the account's definition in Redis."""
        return QuotaConfigError(
            f"RedisQuota {self.name!r}: this worker's limits ({_described(self.definition)}) differ "
            f"from the account's definition in Redis at {self._where()} ({_described(stored)}); every "
            "worker of an account must use the same limits (per wall-clock minute): start it with the "
            "account's, or change the account's limits deliberately with "
            "RedisQuota(url, name, new_limits, redefine=True) (workers still running with the old "
            "ones then refuse their next reservation)"
        )

    def report_outages_to(self, report: Callable[[str], None]) -> None:
        """Call ``report(error)`` once each time Redis stops answering (``error``: what the client
        said), not once per call that finds it down. The seam by which a
        :class:`~aiqsim.scheduler.Scheduler` given this quota emits
        :class:`~aiqsim.scheduler.events.QuotaUnavailable` through its event sink; an outage is
        also logged as a warning on this module's logger, reported or not."""
        self._reporters.append(report)

    def _after_fork_in_child(self) -> None:
        """Called in a child process just after ``os.fork()`` (see :func:`_after_fork_in_child`):
        become a worker of its own and forget what the parent still owns.

        A new instance id and a fresh sequence: children of one parent shared its id and started
        at the same number, so a child the kernel gave a dead sibling's pid (within the marker's
        two days) found the sibling's marker above its own numbers and all its settles were
        skipped. The settles the parent owes (merged, or in doubt) and the slots it keeps to free
        are the parent's: the parent sends them, and a child that sent them too applied each twice
        (under its own marker, which says nothing of the parent's). So are the slots held by its
        calls in flight."""
        self._instance = os.urandom(6).hex()
        self._sequence = 0
        self._in_doubt = None
        self._owed_requests = self._owed_tokens = 0.0
        self._unsettled_members = []
        self._local_slots = 0

    @property
    def unsettled(self) -> tuple[float, float, int]:
        """What failed settles left to send: (requests, tokens, slots to free); refunds are
        positive, charges negative. Sent with the next settle, or before the next reservation.
        Includes a settle whose answer was lost (it may already have been applied, then its resend
        does nothing)."""
        doubt = self._in_doubt
        if doubt is None:
            return self._owed_requests, self._owed_tokens, len(self._unsettled_members)
        return (
            doubt.requests + self._owed_requests,
            doubt.tokens + self._owed_tokens,
            len(doubt.members) + len(self._unsettled_members),
        )

    # ------------------------------------------------------------------ shape of the limits
    def _bucket_args(self) -> tuple[float, float, float, float]:
        """(request capacity, per wall second, token capacity, per wall second); 0 for unlimited."""
        requests, tokens = self._shape.requests, self._shape.tokens
        scale = self.time_scale
        return (
            requests.capacity if requests is not None else 0.0,
            requests.rate / scale if requests is not None else 0.0,
            tokens.capacity if tokens is not None else 0.0,
            tokens.rate / scale if tokens is not None else 0.0,
        )

    def _reserve_constants(self) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
        """The reservation script's arguments that do not change from call to call (the bucket
        shapes and concurrency; the slot ttl, slack and resend horizon), encoded once, as redis-py
        encodes a number (``repr``), so the bytes on the wire are the same. Encoding them on every
        call was the largest client-side cost of a reservation besides the round trip itself
        (``benchmarks/bench_redis_reservation.py``: packing its 13 arguments took about as long as
        the script takes to run in Redis). Made again if ``time_scale`` or ``slot_ttl_s`` change."""
        shape = (self.time_scale, self.slot_ttl_s)
        cached = self._encoded
        if cached is None or cached[0] != shape:
            head = (*self._bucket_args(), self.limits.concurrency or 0)
            tail = (self.slot_ttl_s * self.time_scale, 1e-9, SETTLE_RESEND_S)
            cached = self._encoded = (
                shape,
                tuple(repr(value).encode() for value in head),
                tuple(repr(value).encode() for value in tail),
            )
        return cached[1], cached[2]

    def check_cost(self, tokens: float) -> None:
        """Raise :class:`QuotaConfigError` now if ``tokens`` could never be reserved."""
        self._shape.check_cost(tokens)

    @property
    def token_capacity(self) -> float | None:
        """The shared token bucket's capacity (``None``: tokens unlimited): the bound the scheduler
        clamps a reported usage to before :meth:`reconcile` (:func:`aiqsim.core.usage.usage_bound`),
        as it does with a local bucket's."""
        tokens = self._shape.tokens
        return tokens.capacity if tokens is not None else None

    @property
    def concurrency(self) -> int | None:
        return self.limits.concurrency

    @property
    def in_flight(self) -> int:
        """Slots this worker holds locally (fallback); the fleet's count is in :meth:`levels`."""
        return self._local_slots

    # ------------------------------------------------------------------ the quota interface
    def _marker(self) -> str:
        """This worker's settle marker key in Redis (see the module docs): one per quota instance
        and process."""
        return f"{quota_key_prefix(self.name)}:settled:{self._instance}:{os.getpid()}"

    def _call(self, script: Any, args: list[Any], *keys: str) -> Any:
        answer = script(keys=[*self._keys, *keys], args=args)
        self._failures = 0
        if self._outage:
            self._outage = False
            logger.warning("RedisQuota %r: Redis at %s answers again", self.name, self._where())
        return answer

    def _down(self, error: Exception) -> None:
        """A Redis call failed: counted, and Redis is not asked again for ``retry_s``, doubled after
        each failure in a row up to :data:`MAX_REST_S` (see :meth:`_resting`). Doubled because the
        clock reading the window starts from was taken before the call, which may have taken
        ``socket_timeout_s`` (longer than ``retry_s``) to fail."""
        self.unavailable += 1
        self._failures += 1
        if not self._outage and not _misconfiguration(self._redis.exceptions, error):
            self._outage = True  # reported once per outage: the next answer ends it (_call)
            said = f"{type(error).__name__}: {error}"
            logger.warning(
                "RedisQuota %r: Redis at %s does not answer (%s); %s until it does",
                self.name,
                self._where(),
                said,
                "nothing is granted" if self.fallback is None else "this worker runs on its fallback share",
            )
            for report in list(self._reporters):
                try:
                    report(said)
                except Exception:  # a reporter's failure must not fail the call that found the outage
                    logger.exception("RedisQuota %r: reporting the outage failed", self.name)
        rest = min(self.retry_s * 2.0 ** min(self._failures - 1, 60), max(self.retry_s, MAX_REST_S))
        self._failed_at = self._last_now
        self._retry_at = self._last_now + rest

    def _resting(self) -> bool:
        """Whether Redis failed less than ``retry_s`` ago (on the scheduler's clock): the call is
        not sent, and counts in :attr:`unavailable` as one that failed. Each call is synchronous, so
        while Redis stalls every one of them blocked the loop for ``socket_timeout_s``: 8 queued
        tasks, an 8 s stall, long enough for a lease to lapse. Now a stall costs one timeout per
        ``retry_s``, not one per queued task.

        A clock reading before the failure's means the clock went back (a new runtime: a new
        Scheduler on a fresh AsyncioRuntime starts at 0): the window is over. Measured on that clock
        it never was (a failure at now=3600 left a new scheduler's task queued for about an hour,
        with Redis healthy), and the quota cannot measure it any other way: the fleet package reads
        no clock of its own (tests/test_architecture.py)."""
        if self._last_now < self._failed_at:
            self._failed_at = self._retry_at = -math.inf
        if self._last_now < self._retry_at:
            self.unavailable += 1
            return True
        return False

    def try_reserve(self, tokens: float, now: float) -> Reservation | None:
        """One request, ``tokens`` tokens and one fleet-wide slot, or nothing (``None``)."""
        self._last_now = now
        self._shape.check_cost(tokens)
        if self._resting():
            return self._reserve_locally(tokens, now)
        if not self._settle_backlog():  # Redis still does not answer: no second wait for it
            self._refuse_if_misconfigured(self._last_error)
            return self._reserve_locally(tokens, now)
        self._sequence += 1
        member = f"{self.worker}:{os.getpid()}:{self._instance}:{self._sequence}"
        try:
            limits, tail = self._reserve_constants()
            granted, detail, server_now = self._call(
                self._reserve,
                [tokens, *limits, member, *tail, self.definition],
                self._marker(),
                self._definition_key,
            )
        except self._failed as error:
            self._down(error)
            self._refuse_if_misconfigured(error)
            self._answer_lost(member)
            return self._reserve_locally(tokens, now)
        self._server_now = float(server_now)
        if int(granted) == -1:  # nothing taken: the account is defined otherwise
            raise self._disagreement(detail.decode() if isinstance(detail, bytes) else str(detail))
        if int(granted) != 1:
            full = detail in (b"slot", "slot")  # every shared slot is taken: poll (see poll_full_pool)
            wall = poll_full_pool(math.inf if full else self._answered_wait(detail), DEFAULT_SLOT_POLL_S)
            self._last_wait = wall / self.time_scale
            return None
        self._local_slots += 1
        return SharedReservation(
            requests=1.0 if self._shape.requests is not None else 0.0,
            tokens=tokens if self._shape.tokens is not None else 0.0,
            slots=1,
            member=member,
        )

    def _answered_wait(self, detail: object) -> float:
        """The wait (seconds of Redis's clock) in a refusal's ``detail``, if it is a number >= 0;
        else a :class:`QuotaConfigError` saying what Redis answered. A NaN passed ``max(wait, 1e-6)``
        into the lane's timer, and the lane stalled with nothing said: the script never answers one,
        so something else (another version's script, a hand-written key) speaks for the account."""
        text = detail.decode(errors="replace") if isinstance(detail, bytes) else str(detail)
        try:
            wait = float(text)
        except ValueError:
            wait = math.nan
        if is_wait(wait):
            return wait
        raise QuotaConfigError(
            f"RedisQuota {self.name!r}: Redis at {self._where()} answered a wait of {text!r} s for a "
            f"reservation; expected a number of seconds >= 0. Check that every worker of the account "
            f"runs this version of aiqsim and that nothing else writes {quota_key_prefix(self.name)}:*"
        )

    def _refuse_if_misconfigured(self, error: Exception | None) -> None:
        """Raise :class:`QuotaConfigError` saying what Redis answered when ``error`` means no call
        can ever succeed with these settings (a database index out of range, a wrong password, an
        ACL without the permission, a key of the wrong type): failing closed would stall the lane
        for ever with nothing but :attr:`unavailable` counting. Raised from :meth:`try_reserve`, so
        the scheduler fails the task it was reserving for with this error. An unreachable or
        busy server (timeouts, refused connections, LOADING, BUSY, READONLY during a failover, OOM)
        is not a configuration error: the quota fails closed (or falls back) and tries again."""
        if error is None or not _misconfiguration(self._redis.exceptions, error):
            return
        where = self._where()
        raise QuotaConfigError(
            f"RedisQuota {self.name!r}: Redis at {where} refused the call "
            f"({type(error).__name__}: {error}); check the URL's database, the credentials and the "
            f"ACL, and that nothing else writes {quota_key_prefix(self.name)}:*"
        ) from None

    def _answer_lost(self, member: str) -> None:
        """A reservation whose answer was lost (a timeout) may have taken ``member``'s slot in Redis
        all the same, held by nobody until ``slot_ttl_s``: with ``concurrency=1`` the whole fleet
        would wait that long. Its member is freed with the next settle that Redis answers (a no-op
        if the script never ran). Its request and tokens are not refunded: whether they were taken
        is unknown, and over-refunding would let the fleet overrun the account."""
        rcap, _, tcap, _ = self._bucket_args()
        members = [*self._unsettled_members, member]
        self._keep_unsettled(members, self._owed_requests, self._owed_tokens, rcap, tcap)

    def _reserve_locally(self, tokens: float, now: float) -> Reservation | None:
        if self.fallback is None:
            self._last_wait = self.retry_s
            return None
        local = self.fallback.try_reserve(tokens, now)
        if local is None:
            wait = self.fallback.time_until(tokens, now)  # a MultiQuota: a number >= 0, or inf when full
            self._last_wait = self.retry_s if math.isinf(wait) else wait
            return None
        return SharedReservation(local.requests, local.tokens, local.slots, member="", local=True)

    def time_until(self, tokens: float, now: float) -> float:
        """Seconds until a reservation could succeed (as the last refusal said); never ``inf``,
        since slots freed by other workers send no signal here."""
        wait = getattr(self, "_last_wait", 0.0)
        return max(wait, 1e-6)

    def can_reserve(self, tokens: float, now: float) -> bool:  # pragma: no cover - for API parity
        reservation = self.try_reserve(tokens, now)
        if reservation is None:
            return False
        self.cancel(reservation, now)
        return True

    def _settle_call(self, member: str, refund_requests: float, refund_tokens: float) -> bool:
        """Free ``member``'s slot (``""``: none) and refund (or, negative, charge) the buckets, with
        whatever earlier settles left unsent; on a Redis error keep it all for the next one.
        Returns whether Redis took it (and any settle in doubt before it).

        A settle whose answer was lost is kept as it was sent (:attr:`_in_doubt`) and resent alone,
        first: Redis may have run it, and its sequence number makes the resend a no-op then. What
        is settled meanwhile waits, merged, for it to be answered, so at most one settle is ever in
        doubt and Redis sees this worker's sequence numbers in increasing order."""
        rcap, _, tcap, _ = self._bucket_args()
        members = [*self._unsettled_members, member] if member else self._unsettled_members
        self._keep_unsettled(
            members, self._owed_requests + refund_requests, self._owed_tokens + refund_tokens, rcap, tcap
        )
        if self._resting():
            return False
        if self._in_doubt is not None:
            if not self._send_settle(self._in_doubt, resend=True):
                return False
            self._in_doubt = None
        if not (self._unsettled_members or self._owed_requests or self._owed_tokens):
            return True
        self._sequence += 1
        batch = _Settle(
            marker=self._marker(),
            sequence=self._sequence,
            requests=self._owed_requests,
            tokens=self._owed_tokens,
            members=tuple(self._unsettled_members),
            since=self._server_now,
        )
        self._owed_requests = self._owed_tokens = 0.0
        self._unsettled_members = []
        if self._send_settle(batch, resend=False):
            return True
        self._in_doubt = batch
        return False

    def _send_settle(self, batch: _Settle, *, resend: bool) -> bool:
        """One settle script call for ``batch``; whether Redis answered (applied now or before)."""
        # A first send passes no `since`: it cannot have run before. A resend that finds no marker
        # SETTLE_RESEND_S after `since` (unknown: 0) applies nothing, as the marker may have expired.
        since = "" if not resend else repr(batch.since) if batch.since is not None else "0"
        try:
            _, server_now = self._call(
                self._settle,
                [batch.requests, batch.tokens, *self._bucket_args(), batch.sequence, SETTLE_RESEND_S,
                 since, *batch.members],
                batch.marker,
            )  # fmt: skip
        except self._failed as error:
            self._down(error)
            self._last_error = error
            return False
        self._server_now = float(server_now)
        return True

    def _keep_unsettled(
        self, members: list[str], requests: float, tokens: float, rcap: float, tcap: float
    ) -> None:
        """Remember what a settle could not send, bounded (see the module docs): owed amounts to one
        bucket capacity each, slots to the newest :data:`MAX_UNSETTLED_SLOTS` — counting the
        settle in doubt, if any, with what is kept."""
        doubt = self._in_doubt
        doubt_requests, doubt_tokens = (doubt.requests, doubt.tokens) if doubt is not None else (0.0, 0.0)
        self._owed_requests = _bounded(doubt_requests + requests, rcap) - doubt_requests
        self._owed_tokens = _bounded(doubt_tokens + tokens, tcap) - doubt_tokens
        room = MAX_UNSETTLED_SLOTS - (len(doubt.members) if doubt is not None else 0)
        self._unsettled_members = members[-room:] if room > 0 else []

    def _settle_backlog(self) -> bool:
        """Send what earlier settles left (nothing to send: True at once); whether Redis took it."""
        if not (
            self._in_doubt is not None or self._unsettled_members or self._owed_requests or self._owed_tokens
        ):
            return True
        return self._settle_call("", 0.0, 0.0)

    def release(self, reservation: Reservation, now: float) -> None:
        """Free the reservation's slot (the buckets keep what was spent)."""
        self._last_now = now
        if isinstance(reservation, SharedReservation) and reservation.local:
            assert self.fallback is not None
            self.fallback.release(reservation, now)
            return
        self._local_slots = max(0, self._local_slots - reservation.slots)
        assert isinstance(reservation, SharedReservation)
        self._settle_call(reservation.member, 0.0, 0.0)

    def cancel(self, reservation: Reservation, now: float) -> None:
        """Undo an unused reservation: slot freed, request and tokens refunded."""
        self._last_now = now
        if isinstance(reservation, SharedReservation) and reservation.local:
            assert self.fallback is not None
            self.fallback.cancel(reservation, now)
            return
        self._local_slots = max(0, self._local_slots - reservation.slots)
        assert isinstance(reservation, SharedReservation)
        self._settle_call(reservation.member, reservation.requests, reservation.tokens)

    def reconcile(self, reservation: Reservation, actual_tokens: float, now: float) -> float:
        """Charge (or refund) actual - estimate on the shared token bucket; returns the difference.

        The slot is kept: :meth:`release` frees it. When Redis does not answer, the difference is
        kept here and sent with the next settle (see :attr:`unsettled`).
        """
        self._last_now = now
        if not (actual_tokens >= 0 and math.isfinite(actual_tokens)):
            raise ConfigurationError(
                f"actual token amount must be a finite number >= 0, got {actual_tokens!r}"
            )
        difference = actual_tokens - reservation.tokens
        if isinstance(reservation, SharedReservation) and reservation.local:
            assert self.fallback is not None
            return self.fallback.reconcile(reservation, actual_tokens, now)
        if self._shape.tokens is not None and difference != 0:
            self._settle_call("", 0.0, -difference)  # the slot is kept; a failed charge is kept too
        return difference

    def pause_until(self, until: float) -> None:
        """Pause every worker of the account until ``until`` on this runtime's clock (converted to a
        duration from the last ``now`` seen, and stored as a Redis server instant)."""
        seconds = until - self._last_now
        if seconds <= 0:
            return
        try:
            if not self._resting():
                self._call(self._pause, [seconds * self.time_scale, SETTLE_RESEND_S], self._marker())
        except self._failed as error:
            self._down(error)
        if self.fallback is not None:
            self.fallback.pause_until(until)

    @property
    def paused_until(self) -> float:
        """Kept for inspection parity with MultiQuota: the fleet's pause lives in Redis."""
        return -math.inf

    def levels(self, now: float) -> tuple[float, float, int]:
        """(request tokens, token tokens, fleet-wide slots in use); ``nan`` for unlimited or unreachable."""
        self._last_now = now
        if self._resting() or not self._settle_backlog():
            return math.nan, math.nan, self._local_slots
        try:
            requests, tokens, slots = self._call(
                self._levels, [*self._bucket_args(), SETTLE_RESEND_S], self._marker()
            )
        except self._failed as error:
            self._down(error)
            return math.nan, math.nan, self._local_slots
        req = float(requests) if self._shape.requests is not None else math.nan
        tok = float(tokens) if self._shape.tokens is not None else math.nan
        return req, tok, int(slots)

    def reset(self) -> None:
        """Forget the account's shared state (buckets full, no pause, no slots) — for tests and setup.

        Raises :class:`~aiqsim.core.errors.ConfigurationError` naming the server when Redis cannot
        be reached (nothing was reset)."""
        try:
            self._client.delete(*self._keys)
        except self._failed as error:
            where = redacted_dsn(self.url) if isinstance(self.url, str) else "the given client"
            raise ConfigurationError(
                f"RedisQuota {self.name!r}: cannot reset the shared state at {where} "
                f"({type(error).__name__}: {error}); nothing was reset"
            ) from None


_TRANSIENT_REPLIES = (
    "BUSY",
    "LOADING",
    "MASTERDOWN",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "READONLY",
    "MISCONF",
    "NOREPLICAS",
)
"""Error replies of a server that is busy, starting or failing over: it may answer later."""

_TRANSIENT_CLUSTER_ERRORS = ("RedisClusterUnreachableError", "SlotNotCoveredError")
"""redis-py cluster client errors (not server replies) of a cluster that may answer later."""


def _misconfiguration(exceptions: Any, error: Exception) -> bool:
    """Whether a redis-py ``error`` means these settings can never work (see
    :meth:`RedisQuota._refuse_if_misconfigured`), rather than that Redis is unavailable now."""
    if isinstance(error, exceptions.AuthenticationError):
        return True
    if isinstance(error, exceptions.RedisClusterException):  # redis-py's cluster client, not a reply
        # a cluster it cannot reach, or a slot no node serves (mid-failover), may answer later; the
        # rest (keys of one call in different slots) is how the client is used and never works
        later = tuple(getattr(exceptions, name, ()) for name in _TRANSIENT_CLUSTER_ERRORS)
        return not isinstance(error, later)
    if not isinstance(error, exceptions.ResponseError):
        return False  # timeouts, refused or dropped connections
    if isinstance(error, exceptions.ReadOnlyError | exceptions.OutOfMemoryError):
        return False
    return not str(error).lstrip().startswith(_TRANSIENT_REPLIES)


_DEFINED_FIELDS = ("requests_per_min", "request_burst", "tokens_per_min", "token_burst", "concurrency")


def account_definition(limits: QuotaLimits, time_scale: float = 1.0) -> str:
    """The canonical text of an account's limits that Redis keeps with the account
    (``{aiqsim:quota:<name>}:definition``) and every worker's must equal: rates per wall-clock minute
    (``time_scale`` converts the scheduler's), bursts as the buckets' capacities (their defaults made
    explicit), the concurrency; unlimited dimensions ``null``. Numbers to 12 significant digits, so
    the same limits reached by different arithmetic give the same text."""
    shape = MultiQuota(limits)
    requests, tokens = shape.requests, shape.tokens

    def number(value: float | None) -> float | None:
        return None if value is None else float(format(value, ".12g"))

    fields = {
        "requests_per_min": number(requests.rate * 60.0 / time_scale) if requests is not None else None,
        "request_burst": number(requests.capacity) if requests is not None else None,
        "tokens_per_min": number(tokens.rate * 60.0 / time_scale) if tokens is not None else None,
        "token_burst": number(tokens.capacity) if tokens is not None else None,
        "concurrency": limits.concurrency,
    }
    return json.dumps(fields, sort_keys=True, separators=(",", ":"))


def _described(definition: str) -> str:
    """A definition as a reader knows limits: ``requests_per_min=106, request_burst=106``."""
    try:
        fields = json.loads(definition)
        shown = [f"{name}={fields[name]:g}" for name in _DEFINED_FIELDS if fields.get(name) is not None]
    except (ValueError, TypeError, KeyError, AttributeError):
        return repr(definition)
    return ", ".join(shown) or "unlimited"


def _bounded(amount: float, capacity: float) -> float:
    """``amount`` kept within one bucket ``capacity`` either way (0 when the bucket is unlimited)."""
    return max(-capacity, min(capacity, amount)) if capacity > 0 else 0.0


__all__ = ["QuotaConfigError", "RedisQuota", "SharedReservation", "account_definition"]
