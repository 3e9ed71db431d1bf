"""Shared pytest configuration: the hypothesis profile every property test runs under.

The "ci" profile (the default) has no per-example deadline, because the machine is shared
and a slow example is not a bug, and a moderate example count to keep the suite fast.
``print_blob=True`` prints a reproduction blob with every failure so it can be replayed
with ``@reproduce_failure``; examples stay randomised (``derandomize=False``) so new runs
keep exploring, and the failure database replays earlier failures first.
Select another profile with ``HYPOTHESIS_PROFILE=dev pytest ...``.

Under ``CI=true`` (as ``.ci/run`` sets it) a skipped test fails: see
:func:`pytest_runtest_makereport`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=60,
    derandomize=False,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", parent=settings.get_profile("ci"), max_examples=300)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# ---------------------------------------------------------------------------------------------
# Real PostgreSQL and Redis servers (see tests/servers.py): a session fixture each.


def _server(kind: str, env_var: str, start):  # type: ignore[no-untyped-def]
    import contextlib

    import pytest

    from tests.servers import ServerUnavailable, in_ci

    given = os.environ.get(env_var)
    if given:
        yield given
        return
    with contextlib.ExitStack() as stack:
        try:
            address = stack.enter_context(start())
        except ServerUnavailable as error:
            if in_ci():
                pytest.fail(f"CI=true and no {kind} server: {error} (set {env_var} or install {kind})")
            pytest.skip(f"no {kind} server here: {error} (set {env_var} to use one)")
        yield address


@pytest.fixture(scope="session")
def postgres_dsn():  # type: ignore[no-untyped-def]
    """A DSN of a real PostgreSQL server (``AIQSIM_TEST_POSTGRES_DSN``, or a throwaway one)."""
    from tests.servers import postgres_server

    yield from _server("PostgreSQL", "AIQSIM_TEST_POSTGRES_DSN", postgres_server)


@pytest.fixture(scope="session")
def redis_url():  # type: ignore[no-untyped-def]
    """A URL of a real Redis server (``AIQSIM_TEST_REDIS_URL``, or a throwaway one)."""
    from tests.servers import redis_server

    yield from _server("Redis", "AIQSIM_TEST_REDIS_URL", redis_server)


@pytest.fixture(scope="session")
def redis_cluster_url():  # type: ignore[no-untyped-def]
    """A URL of a real Redis Cluster node owning every slot (``AIQSIM_TEST_REDIS_CLUSTER_URL``, or a
    throwaway one-node cluster: ``redis-server --cluster-enabled yes``)."""
    import functools

    from tests.servers import redis_server

    start = functools.partial(redis_server, cluster=True)
    yield from _server("Redis Cluster", "AIQSIM_TEST_REDIS_CLUSTER_URL", start)


@pytest.fixture
def account(redis_url: str):  # type: ignore[no-untyped-def]
    """A RedisQuota account name of this test's own on the Redis server, deleted afterwards, so
    tests sharing one server (and xdist workers) never see each other's budget."""
    import random

    import redis

    name = f"acct-{random.Random().getrandbits(40):010x}"
    yield name
    from aiqsim.fleet.redis_quota import quota_key_prefix

    prefix = quota_key_prefix(name)
    redis.Redis.from_url(redis_url).delete(f"{prefix}:state", f"{prefix}:slots", f"{prefix}:definition")


# ------------------------------------------------------------------ CI: a skip is a failure
def running_in_ci() -> bool:
    """True when the ``CI`` environment variable says so (``.ci/run`` sets ``CI=true``)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under CI, turn every skipped test into a failure that says why it was skipped.

    A skip means a prerequisite was missing (a package not declared in ``[test]``, a service not
    started). On a developer's machine that is worth a skip; in CI it would hide exactly the
    missing-dependency failure a user meets, so the run must fail instead (expected failures,
    ``xfail``, are not skips and are left alone).
    """
    outcome = yield
    report = outcome.get_result()
    if running_in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which must run every test: {reason}"


# ------------------------------------------------------------------ which aiqsim is under test
def pytest_report_header(config: pytest.Config) -> str:
    """Say which aiqsim the session imports (a worktree's, an installed copy's)."""
    import aiqsim

    return f"aiqsim under test: {Path(aiqsim.__file__).parent}"


# ------------------------------------------------------------------ temporary files in memory
def pytest_configure(config: pytest.Config) -> None:
    """``tmp_path`` and friends under /dev/shm (tests/memory_tmp.py says why: fsyncs cost nothing there).

    ``PYTEST_DEBUG_TEMPROOT`` is pytest's documented root for them; one set by the caller wins.
    """
    try:
        from memory_tmp import memory_backed_tmp_root
    except ModuleNotFoundError:  # loaded as the plugin ``tests.conftest`` (tests/test_ci_setup.py does)
        from tests.memory_tmp import memory_backed_tmp_root

    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", str(memory_backed_tmp_root()))
    _share_notebooks_between_workers(config, memory_backed_tmp_root())


NOTEBOOKS_SHARED_ENV = "AIQSIM_TEST_NOTEBOOKS_SHARED"
"""A folder the pytest-xdist workers of one run share, where each notebook is executed once
(tests/executed_notebooks.py); made by the controlling process, which the workers inherit it from."""


def _share_notebooks_between_workers(config: pytest.Config, root: Path) -> None:
    """With ``-n 2`` each worker is a test session of its own, and each executed every notebook its
    tests asked for: twice in all. The controlling process (the one that starts the workers) makes a
    folder for them to share the executed notebooks in, and removes it when the run ends."""
    import shutil
    import tempfile

    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return  # a worker (it inherits the folder), or a run in one process (nothing to share)
    shared = tempfile.mkdtemp(prefix="aiqsim-test-notebooks-shared-", dir=root)
    os.environ[NOTEBOOKS_SHARED_ENV] = shared
    config.add_cleanup(lambda: shutil.rmtree(shared, ignore_errors=True))
    config.add_cleanup(lambda: os.environ.pop(NOTEBOOKS_SHARED_ENV, None))


# ------------------------------------------------------------------ notebooks: executed two at a time
def pytest_collection_finish(session: pytest.Session) -> None:
    """Tell tests/executed_notebooks.py which notebooks the selected tests need, so that they execute
    together (two kernels at a time) once the first one is asked for, not one after another."""
    from pathlib import Path

    needed: set[Path] = set()
    for item in session.items:
        if item.get_closest_marker("notebook") and item.module.__name__ == "test_notebooks":
            path = item.callspec.params.get("path") if hasattr(item, "callspec") else None
            if isinstance(path, Path):
                needed.add(path)
    if needed:
        import executed_notebooks

        executed_notebooks.plan(needed)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Drop the notebook executions a failed or interrupted session no longer needs."""
    import sys

    module = sys.modules.get("executed_notebooks")
    if module is not None:
        module.shutdown()
