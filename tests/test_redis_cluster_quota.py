"""RedisQuota on a Redis Cluster: every key of one account hashes to one slot.

Each of the quota's Lua scripts names several keys (the account's state, its slots, the worker's
settle marker), and a cluster runs a script only when all of them are in one hash slot: without a
hash tag it answered ``CROSSSLOT`` (a plain client: :class:`QuotaConfigError` on every reservation)
or redis-py's ``RedisCluster`` refused the call itself. :func:`keyslot` is the cluster's key hash
written out from the spec, checked against published values and against a real server's
``CLUSTER KEYSLOT``; the scripts then run on a one-node cluster (``redis-server --cluster-enabled
yes`` owning all 16384 slots, which refuses cross-slot scripts exactly as a cluster of many does).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from aiqsim.core.token_bucket import QuotaLimits

SLOTS = 16384


def crc16_xmodem(data: bytes) -> int:
    """CRC16/XMODEM (polynomial 0x1021, initial value 0), the checksum Redis Cluster hashes keys with."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def keyslot(key: str | bytes) -> int:
    """A key's hash slot, as the Redis Cluster spec defines it: CRC16 of the hash tag (the bytes
    between the first ``{`` and the first ``}`` after it) when that is not empty, else of the whole
    key, modulo 16384."""
    data = key.encode() if isinstance(key, str) else key
    start = data.find(b"{")
    if start != -1:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    return crc16_xmodem(data) % SLOTS


PUBLISHED = {
    "123456789": 12739,  # the spec's check value: CRC16/XMODEM("123456789") = 0x31C3
    "somekey": 11058,  # the CLUSTER KEYSLOT page's examples
    "foo{hash_tag}": 2515,
    "bar{hash_tag}": 2515,
}

NAMES = ["openai-prod", "acct", "a}b", "}x", "{x}", "x{", "{}", "ünïcode", "a:b:c"]
"""Account names, some with braces: whatever a name holds, all of its keys must share one slot."""


def _quota(url: str, name: str, client: Any = None, *, verify: bool = True) -> Any:
    from aiqsim.fleet import RedisQuota

    limits = QuotaLimits(requests_per_min=600, tokens_per_min=6000, concurrency=2)
    return RedisQuota(None if client is not None else url, name, limits, client=client, verify=verify)


def _keys(quota: Any) -> list[str]:
    return [*quota._keys, quota._marker(), quota._definition_key]


def test_keyslot_gives_the_published_values() -> None:
    assert crc16_xmodem(b"123456789") == 0x31C3
    for key, slot in PUBLISHED.items():
        assert keyslot(key) == slot, key
    # the spec's hash tag rules: the first {...} that is not empty; an empty one hashes the whole key
    assert keyslot("{user1000}.following") == keyslot("{user1000}.followers") == keyslot("user1000")
    assert keyslot("foo{bar}{zap}") == keyslot("bar")
    assert keyslot("foo{{bar}}zap") == keyslot("{bar")
    assert keyslot("foo{}{bar}") == crc16_xmodem(b"foo{}{bar}") % SLOTS


@pytest.mark.parametrize("name", NAMES)
def test_every_key_of_an_account_hashes_to_one_slot(name: str) -> None:
    quota = _quota("redis://127.0.0.1:1/0", name, verify=False)  # never connects: only the key names are read
    keys = _keys(quota)
    assert len(keys) == 4 and len(set(keys)) == 4  # state, slots, settle marker, definition
    assert len({keyslot(key) for key in keys}) == 1, {key: keyslot(key) for key in keys}


def test_the_key_names_are_documented_ones() -> None:
    """The names the module docs give (and tell an upgrading fleet to look for)."""
    quota = _quota("redis://127.0.0.1:1/0", "openai-prod", verify=False)
    state, slots, marker, definition = _keys(quota)
    assert definition == "{aiqsim:quota:openai-prod}:definition"
    assert (state, slots) == ("{aiqsim:quota:openai-prod}:state", "{aiqsim:quota:openai-prod}:slots")
    assert marker.startswith("{aiqsim:quota:openai-prod}:settled:")


def test_keyslot_agrees_with_a_real_cluster(redis_cluster_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_cluster_url)
    keys = [*PUBLISHED, *(key for name in NAMES for key in _keys(_quota(redis_cluster_url, name)))]
    for key in keys:
        assert int(client.execute_command("CLUSTER", "KEYSLOT", key)) == keyslot(key), key


@pytest.mark.parametrize("through", ["Redis", "RedisCluster"])
def test_every_script_runs_on_a_cluster(redis_cluster_url: str, through: str) -> None:
    """Reserve, reconcile, release, cancel, pause, levels and reset, through a plain client to the
    node owning the slot and through redis-py's cluster client: no CROSSSLOT, nothing unsettled."""
    from redis.cluster import RedisCluster

    client = RedisCluster.from_url(redis_cluster_url) if through == "RedisCluster" else None
    name = f"acct-{random.Random().getrandbits(40):010x}"
    a, b = _quota(redis_cluster_url, name, client), _quota(redis_cluster_url, name, client)
    try:
        first, second = a.try_reserve(100.0, 0.0), b.try_reserve(100.0, 0.0)
        assert first is not None and second is not None
        assert a.try_reserve(100.0, 0.0) is None  # concurrency 2, shared by both workers
        assert a.reconcile(first, 300.0, 0.1) == 200.0
        a.release(first, 0.2)
        b.cancel(second, 0.2)
        requests, tokens, slots = a.levels(0.3)
        assert slots == 0 and 598.0 <= requests <= 600.0 and 5_700.0 <= tokens <= 5_800.0
        a.pause_until(60.0)
        assert b.try_reserve(1.0, 0.4) is None and b.time_until(1.0, 0.4) > 50.0  # the pause is shared
        assert (a.unavailable, b.unavailable) == (0, 0)
        assert a.unsettled == b.unsettled == (0.0, 0.0, 0)
    finally:
        a.reset()
    assert b.try_reserve(1.0, 0.5) is not None  # reset: no pause, buckets full
    a.reset()


@pytest.mark.parametrize("fallback", [None, QuotaLimits(concurrency=1)])
def test_an_unreachable_cluster_fails_closed_through_the_cluster_client(fallback: QuotaLimits | None) -> None:
    """redis-py's cluster client raises ``RedisClusterUnreachableError`` (no ``RedisError``) when no
    node answers: it escaped the quota into the lane. It is unavailability, as a plain client's
    refused connection is: nothing granted (or the fallback share), the slot's release kept."""
    from redis.cluster import RedisCluster

    from aiqsim.fleet import RedisQuota
    from tests.servers import ServerUnavailable, in_ci, redis_server

    limits = QuotaLimits(requests_per_min=600, concurrency=2)
    try:
        with redis_server(cluster=True) as url:
            client = RedisCluster.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
            quota = RedisQuota(None, "acct", limits, client=client, fallback=fallback)
            held = quota.try_reserve(0.0, 0.0)
            assert held is not None and not held.local
    except ServerUnavailable as error:  # pragma: no cover - only without redis-server
        if in_ci():
            pytest.fail(f"CI=true and no Redis Cluster server: {error}")
        pytest.skip(f"no Redis Cluster server here: {error}")
    # the server is stopped: the cluster client cannot reach any node
    granted = quota.try_reserve(0.0, 10.0)
    if fallback is None:
        assert granted is None and quota.time_until(0.0, 10.0) > 0
    else:
        assert granted is not None and granted.local
    assert quota.unavailable >= 1
    quota.release(held, 20.0)  # kept to send when the cluster answers again, with the slot of the
    assert quota.unsettled == (0.0, 0.0, 2)  # failed reservation (it may have run: its answer was lost)


def test_which_cluster_client_errors_mean_the_settings_never_work() -> None:
    import redis

    from aiqsim.fleet.redis_quota import _misconfiguration

    exceptions = redis.exceptions
    unreachable = exceptions.RedisClusterUnreachableError("Redis Cluster cannot be connected")
    assert not _misconfiguration(exceptions, unreachable)
    assert not _misconfiguration(exceptions, exceptions.SlotNotCoveredError("slot 12739 is not covered"))
    cross = exceptions.RedisClusterException("EVALSHA - all keys must map to the same key slot")
    assert _misconfiguration(exceptions, cross)
