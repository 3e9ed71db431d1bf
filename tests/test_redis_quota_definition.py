"""RedisQuota's account definition and its outages, against a real Redis server.

Workers sharing one account with different limits each enforced their own (one at 106 requests a
minute and one at ten times that granted 1,002 in 10 s; concurrency 4 and 40 gave 40 slots): the
account's limits now live in Redis, first writer wins, and a disagreeing worker refuses to start.
A URL that cannot be reached (a typo in the port) was accepted and every task waited for ever, with
no error and no event; an outage of a working Redis was as silent: now the first is an error at
start-up and the second a warning and a :class:`~aiqsim.scheduler.events.QuotaUnavailable` event.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from aiqsim import Scheduler, TaskStatus
from aiqsim.core.errors import ConfigurationError
from aiqsim.core.token_bucket import QuotaConfigError, QuotaLimits
from aiqsim.runtime import AsyncioRuntime
from aiqsim.scheduler.events import QuotaUnavailable
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse
from tests.redis_accounts import quota
from tests.servers import free_port

# ------------------------------------------------------------------ the account's definition


def test_a_worker_whose_limits_differ_from_the_accounts_refuses_to_start(
    redis_url: str, account: str
) -> None:
    quota(redis_url, account, QuotaLimits(requests_per_min=106, concurrency=4), worker="first")
    with pytest.raises(QuotaConfigError) as refused:
        quota(redis_url, account, QuotaLimits(requests_per_min=1060, concurrency=40), worker="second")
    message = str(refused.value)
    assert "requests_per_min=1060" in message and "concurrency=40" in message  # this worker's
    assert "requests_per_min=106," in message and "concurrency=4" in message  # the account's
    assert "redefine=True" in message
    # the same limits, however written, agree: the burst defaults to a minute's worth
    quota(redis_url, account, QuotaLimits(requests_per_min=106.0, request_burst=106, concurrency=4))


def test_a_worker_that_started_unverified_cannot_take_more_than_the_accounts_slots(
    redis_url: str, account: str
) -> None:
    """Concurrency 4 against 40 gave 40 slots: the unverified worker's reservations are refused."""
    small = quota(redis_url, account, QuotaLimits(concurrency=4), worker="small")
    large = quota(redis_url, account, QuotaLimits(concurrency=40), worker="large", verify=False)
    held = [small.try_reserve(0.0, 0.0) for _ in range(4)]
    assert all(h is not None for h in held) and small.try_reserve(0.0, 0.0) is None
    with pytest.raises(QuotaConfigError, match="concurrency=40"):
        large.try_reserve(0.0, 0.0)
    assert small.levels(0.0)[2] == 4


def test_the_first_reservation_defines_an_account_no_worker_verified(redis_url: str, account: str) -> None:
    first = quota(redis_url, account, QuotaLimits(requests_per_min=60), verify=False)
    second = quota(redis_url, account, QuotaLimits(requests_per_min=600), verify=False)
    assert first.try_reserve(0.0, 0.0) is not None  # first writer wins
    with pytest.raises(QuotaConfigError, match="requests_per_min=60,"):
        second.try_reserve(0.0, 0.0)


def test_grants_stay_within_the_accounts_budget_when_a_worker_was_given_ten_times_it(
    redis_url: str, account: str
) -> None:
    """Two workers hammer one account, one of them told 10x its limits: the grants stay within the
    account's budget (burst + rate x elapsed), where they ran to the larger worker's."""
    budget = QuotaLimits(requests_per_min=600, request_burst=10)  # 10 a second after a burst of 10
    right = quota(redis_url, account, budget, worker="right")
    wrong = quota(
        redis_url,
        account,
        QuotaLimits(requests_per_min=6000, request_burst=100),
        worker="wrong",
        verify=False,
    )
    granted = refused = 0
    start = time.monotonic()
    while time.monotonic() - start < 1.0:
        for worker in (right, wrong):
            try:
                held = worker.try_reserve(0.0, 0.0)
            except QuotaConfigError:
                refused += 1
                continue
            if held is not None:
                granted += 1
                worker.release(held, 0.0)
    elapsed = time.monotonic() - start
    assert refused > 0
    assert granted <= 10 + 10 * elapsed + 1, (granted, elapsed)


def test_an_account_is_redefined_deliberately_and_old_workers_refuse(redis_url: str, account: str) -> None:
    old = quota(redis_url, account, QuotaLimits(concurrency=4), worker="old")
    quota(redis_url, account, QuotaLimits(concurrency=8), redefine=True)
    new = quota(redis_url, account, QuotaLimits(concurrency=8), worker="new")  # starts: agrees now
    assert new.try_reserve(0.0, 0.0) is not None
    with pytest.raises(QuotaConfigError, match=r"concurrency=4\).*concurrency=8"):
        old.try_reserve(0.0, 0.0)


# ------------------------------------------------------------------ a Redis that does not answer


def test_a_url_that_refuses_at_start_up_is_an_error_naming_it_without_its_password() -> None:
    from aiqsim.fleet import RedisQuota

    url = f"redis://user:pw-secret@127.0.0.1:{free_port()}/0"  # nothing listens there: a typo in the port
    with pytest.raises(ConfigurationError, match="cannot reach Redis at") as refused:
        RedisQuota(url, "acct", QuotaLimits(concurrency=1), socket_timeout_s=0.5)
    message = str(refused.value)
    assert "pw-secret" not in message and "127.0.0.1" in message and "host and port" in message


class CuttableProxy:
    """A TCP proxy on loopback to the Redis server that can be cut (every connection dropped, new
    ones closed at once) and restored: an outage of a Redis that worked."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.port = self._listener.getsockname()[1]
        self._up = True
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._accepting = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> CuttableProxy:
        self._accepting.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._accepting.join(5)
        self.cut()
        self._listener.close()

    def cut(self) -> None:
        with self._lock:
            self._up = False
            for sock in self._sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
            self._sockets.clear()

    def restore(self) -> None:
        with self._lock:
            self._up = True

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            with self._lock:
                if not self._up:
                    client.close()
                    continue
                upstream = socket.create_connection(self.target)
                self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Instant:
    name = "llm"

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        return ProviderResponse(result="ok")


def test_an_outage_of_a_working_redis_is_reported_once_as_an_event_and_a_warning(
    redis_url: str, account: str, caplog: Any
) -> None:
    parts = urlsplit(redis_url)
    assert parts.hostname is not None and parts.port is not None
    events: list[Any] = []

    def outages() -> list[QuotaUnavailable]:
        return [e for e in events if isinstance(e, QuotaUnavailable)]

    async def until(condition: Any, what: str, limit_s: float = 20.0) -> None:
        deadline = time.monotonic() + limit_s
        while not condition():
            assert time.monotonic() < deadline, f"not within {limit_s} s: {what}"
            await asyncio.sleep(0.02)

    async def body(proxy: CuttableProxy) -> list[TaskStatus]:
        userinfo = parts.netloc.rpartition("@")[0]
        url = urlunsplit(parts._replace(netloc=f"{userinfo + '@' if userinfo else ''}127.0.0.1:{proxy.port}"))
        shared = quota(url, account, QuotaLimits(concurrency=2), retry_s=0.02, socket_timeout_s=0.5)
        statuses = []
        async with Scheduler(
            AsyncioRuntime(), [Instant()], quotas={"llm": shared}, events=events.append
        ) as scheduler:
            statuses.append((await scheduler.submit("llm", {"i": 0}).wait()).status)
            assert outages() == []
            for outage in (1, 2):
                proxy.cut()
                waiting = scheduler.submit("llm", {"i": outage})
                await until(lambda n=outage: len(outages()) == n, f"outage {outage} reported")
                seen = shared.unavailable
                await until(lambda n=seen: shared.unavailable >= n + 3, "the lane retried the quota")
                assert len(outages()) == outage  # once per outage, not once per retry
                assert not waiting.done()  # failing closed: nothing granted while Redis is down
                proxy.restore()
                statuses.append((await asyncio.wait_for(waiting.wait(), 20)).status)
        return statuses

    caplog.set_level(logging.WARNING, logger="aiqsim.fleet.redis_quota")
    with CuttableProxy((parts.hostname, parts.port)) as proxy:
        statuses = asyncio.run(body(proxy))
    assert statuses == [TaskStatus.SUCCEEDED] * 3
    assert [(e.provider, bool(e.error)) for e in outages()] == [("llm", True), ("llm", True)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("does not answer" in w for w in warnings) == 2
    assert sum("answers again" in w for w in warnings) == 2
