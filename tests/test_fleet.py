"""A fleet against one provider account: four worker processes, one real Redis, one HTTP server.

Two "hosts" of two worker processes each (they share nothing but Redis and the provider) drive
the local provider server, whose server-side limit is the account's. With the quota shared
through Redis, the fleet uses the account's whole limit and causes (almost) no 429s, whatever
each worker's own load; with the limit split statically between the workers, an uneven load
leaves capacity unused. Both figures are printed.

Time: the server runs at ``TIME_SCALE`` (wall seconds per scenario second), so its 60 s
window passes in a few wall seconds; the workers use the same scale for their runtimes and
their quota, and RedisQuota converts the limit to Redis's wall clock.

Cost: both configurations run at the same time, in one module fixture (two servers, eight
workers, 45 s of wall time instead of twice that). They share no state (each has its own server,
account, go-file and Redis keys), and the workers are mostly idle, waiting on the clock: eight
of them make 16 requests per wall second in all.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from aiqsim.sim.config import ProviderConfig

WORKER = Path(__file__).with_name("helpers_fleet_worker.py")
TIME_SCALE = 0.25
LIMIT_PER_MIN = 120.0
"""The account's server-side limit (scenario time): 2 requests per scenario second, 8 per wall second."""
DURATION_S = 180.0
"""Scenario seconds of submissions: three server windows, 45 s of wall time."""
WARMUP_S = 60.0
"""Utilisation is measured after the first window (the first minute allows a burst of the limit)."""
UNEVEN_RATES = (2.4, 0.6, 0.15, 0.15)
"""Offered tasks per scenario second of each worker: 3.3 in all (1.65x the limit), very uneven."""
MAX_SHARED_429S = 3
"""Server 429s a correctly shared quota may still cause, from timer lateness, not from over-granting.

The bucket grants at most the limit per 60 s on Redis's clock; a request reaches the server's window
later by the worker's timer lateness, so lateness that varies by L wall seconds can put 8 x L more
requests (8 per wall second) into one server window. Measured (2026-11-30): exactly 1 in 8 runs at load
averages 2.4-4.3 (the day replay on one core, up to two CPU hogs), 2 once in a full CI run under load;
3 allows ~250 ms of lateness spread. A quota that is not shared (each worker the whole limit: the split
mode with share 1.0) gave 32, so a real over-grant still fails this."""


def _run_fleet(redis_url: str | None, mode: str, account: str, go: Path) -> tuple[list[dict], object, float]:
    """Run the four workers: their summaries, the server's ledger, the scenario time they started."""
    from aiqsim.http.server import start_local_server

    config = ProviderConfig(
        name="llm", latency_base_s=0.2, latency_per_unit_s=0.0, server_requests_per_min=LIMIT_PER_MIN
    )
    with start_local_server(config, time_scale=TIME_SCALE, seed=1) as server:
        procs = []
        for n, rate in enumerate(UNEVEN_RATES):
            host = "host-a" if n < 2 else "host-b"
            command = [
                sys.executable, str(WORKER), "--name", f"{host}/w{n}", "--url", server.url,
                "--mode", mode, "--limit-per-min", str(LIMIT_PER_MIN), "--share", str(1 / len(UNEVEN_RATES)),
                "--rate", str(rate), "--duration", str(DURATION_S), "--drain", "5",
                "--time-scale", str(TIME_SCALE), "--seed", str(n), "--account", account, "--go", str(go),
            ]  # fmt: skip
            if redis_url is not None:
                command += ["--redis", redis_url]
            procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        summaries = []
        try:
            for proc in procs:  # every worker has imported everything and is waiting
                line = proc.stdout.readline()  # type: ignore[union-attr]
                assert line.strip() == "ready", proc.communicate(timeout=60)[1][-3000:]
            started = server.runtime.now()
            go.touch()
            for proc in procs:
                out, err = proc.communicate(timeout=180)
                assert proc.returncode == 0, err[-3000:]
                summaries.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        return summaries, server.ledger(), started


def _window_figures(ledger: object, started: float) -> tuple[int, float]:
    """(server 429s, admitted requests per scenario minute after the warm-up) from the ledger."""
    requests = ledger.requests  # type: ignore[attr-defined]
    rate_limited = sum(1 for entry in requests if entry.status == 429)
    admitted = [entry.arrived_s - started for entry in requests if entry.status == 200]
    steady = [t for t in admitted if WARMUP_S <= t < DURATION_S]
    return rate_limited, len(steady) / ((DURATION_S - WARMUP_S) / 60.0)


FleetRun = tuple[list[dict], object, float]


@pytest.fixture(scope="module")
def fleet_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Future[FleetRun]]:
    """Both configurations, run concurrently: ``"shared"`` (Redis quota) and ``"split"`` (static split).

    Each test takes its own run's result, so a failure of one configuration fails only its test.
    Without Redis (outside CI) only the split runs, and the shared test is skipped as before.
    """
    runs: dict[str, Future[FleetRun]] = {}
    with ThreadPoolExecutor(2, thread_name_prefix="fleet") as pool:
        runs["split"] = pool.submit(
            _run_fleet, None, "split", "unused", tmp_path_factory.mktemp("split") / "go"
        )
        try:
            redis_url = request.getfixturevalue("redis_url")
        except pytest.skip.Exception as no_redis:
            runs["shared"] = Future()
            runs["shared"].set_exception(no_redis)
        else:
            # An account of this fixture's own: when the module's two tests are given to different
            # xdist workers, each runs this fixture, and two fleets on one account each got half its
            # quota (utilisation 0.43-0.56 whenever the tests were scheduled apart).
            account = f"fleet-shared-{uuid.uuid4().hex[:12]}"
            runs["shared"] = pool.submit(
                _run_fleet, redis_url, "shared", account, tmp_path_factory.mktemp("shared") / "go"
            )
    return runs


@pytest.mark.slow
def test_a_shared_quota_uses_the_accounts_limit_without_429s(fleet_runs: dict[str, Future[FleetRun]]) -> None:
    summaries, ledger, started = fleet_runs["shared"].result()
    rate_limited, per_min = _window_figures(ledger, started)
    utilisation = per_min / LIMIT_PER_MIN
    print(
        f"shared Redis quota, 4 workers (uneven load {UNEVEN_RATES}/s): {rate_limited} server 429s, "
        f"{per_min:.1f} admitted/min = {utilisation:.3f} of the limit"
    )
    assert rate_limited <= MAX_SHARED_429S, f"{rate_limited} server 429s: the fleet overran the limit"
    assert utilisation >= 0.95
    assert sum(s["submitted"] for s in summaries) > 1.4 * LIMIT_PER_MIN * DURATION_S / 60  # it was saturated


@pytest.mark.slow
def test_a_static_split_wastes_capacity_under_uneven_load(fleet_runs: dict[str, Future[FleetRun]]) -> None:
    _, ledger, started = fleet_runs["split"].result()
    rate_limited, per_min = _window_figures(ledger, started)
    utilisation = per_min / LIMIT_PER_MIN
    offered_share = [min(rate * 60, LIMIT_PER_MIN / 4) for rate in UNEVEN_RATES]
    print(
        f"static split (each worker 1/4 of the limit), same load: {rate_limited} server 429s, "
        f"{per_min:.1f} admitted/min = {utilisation:.3f} of the limit; "
        f"{1 - utilisation:.1%} of the account's capacity wasted "
        f"(expected about {1 - sum(offered_share) / LIMIT_PER_MIN:.1%})"
    )
    assert rate_limited <= 1
    assert utilisation < 0.8  # the two light workers cannot use their shares, the heavy one may not
