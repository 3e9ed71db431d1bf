"""The aiqsim pytest plugin: crash-recovery fixtures for any project that installs aiqsim.

Registered through the ``pytest11`` entry point (``aiqsim = "aiqsim.testing.plugin"``), so pytest
loads it in every run once aiqsim is installed; no conftest needed. It stays light at import
time (no pandas, matplotlib or SimPy): everything heavier is imported by the fixture that needs it.
Naming it explicitly as well (``pytest_plugins = ["aiqsim.testing.plugin"]`` in a conftest,
``-p aiqsim.testing.plugin``) is harmless: the first registration, under either name, blocks the
other (see :func:`pytest_plugin_registered`). ``-p no:aiqsim`` turns the entry point off.

Fixtures:

- ``aiqsim_runtime``: a :class:`~aiqsim.runtime.SimPyRuntime` (virtual clock).
- ``aiqsim_provider``: ``make(name="llm", **fields)`` -> a
  :class:`~aiqsim.sim.providers.SimulatedProvider` on ``aiqsim_runtime``, configured by a
  scenario's ``[[providers]]`` keys (``server_error_prob``, ``timeout_prob``, ``outages``,
  ``honours_idempotency``, ``supports_lookup``, ...).
- ``aiqsim_store``: a :class:`~aiqsim.testing.stores.StoreFactory`, the test parametrised over
  memory / json / sqlite (and postgres with ``AIQSIM_TEST_POSTGRES_DSN`` or ini
  ``aiqsim_postgres_dsn``).
- ``aiqsim_crash``: a :class:`~aiqsim.testing.crash_driver.CrashDriver` set up from the options
  below (memory store; ``aiqsim_crash.on(aiqsim_store)`` for the store variants).
- ``aiqsim_sigkill``: :func:`~aiqsim.testing.sigkill.kill_and_restart` with the first seed.

Options (and ini keys): ``--aiqsim-seeds N`` (``aiqsim_seeds``), ``--aiqsim-crash-points
all|sample:K`` (``aiqsim_crash_points``), ``--aiqsim-replay SEED:POINT``.
"""

from __future__ import annotations

import functools
import os
import sys
import zlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from aiqsim.testing.options import (
    DEFAULT_SEEDS,
    CrashOptions,
    KitOptionError,
    parse_crash_points,
    parse_replay,
    parse_second_crashes,
    parse_seeds,
)

if TYPE_CHECKING:
    from aiqsim.runtime.simpy_runtime import SimPyRuntime
    from aiqsim.sim.providers import SimulatedProvider
    from aiqsim.testing.crash_driver import CrashDriver
    from aiqsim.testing.sigkill import KillReport
    from aiqsim.testing.stores import StoreFactory

POSTGRES_ENV = "AIQSIM_TEST_POSTGRES_DSN"

PLUGIN_NAMES = ("aiqsim", __name__)
"""The names this module is registered under: the ``pytest11`` entry point's, and its module path
(what ``pytest_plugins = [...]`` and ``-p`` register it as)."""


def pytest_plugin_registered(plugin: object, manager: pytest.PytestPluginManager) -> None:
    """Once this module is registered under one of :data:`PLUGIN_NAMES`, block the other one.

    pytest loads the entry point as ``aiqsim`` and an explicit ``pytest_plugins`` / ``-p`` as the
    module path; registering the same module under a second name fails ("Plugin already
    registered under a different name"). A blocked name is skipped, so the second load is a no-op.
    """
    if plugin is not sys.modules[__name__]:
        return
    registered = manager.get_name(plugin)
    for name in PLUGIN_NAMES:
        if name != registered and manager.get_plugin(name) is None and not manager.is_blocked(name):
            manager.set_blocked(name)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("aiqsim", "aiqsim crash-recovery tests")
    group.addoption(
        "--aiqsim-seeds",
        default=None,
        metavar="N",
        help=f"seeds 0..N-1 for every crash test (default {DEFAULT_SEEDS}; ini aiqsim_seeds)",
    )
    group.addoption(
        "--aiqsim-crash-points",
        default=None,
        metavar="all|sample:K",
        help="crash before and after every store write, or at K seeded ones of those points per seed "
        "(ini aiqsim_crash_points)",
    )
    group.addoption(
        "--aiqsim-replay",
        default=None,
        metavar="SEED:POINT",
        help="re-run only this case of every crash test, as a failure prints it "
        "(POINT: K, after store write K; bK, before it; eN, after side effect N; +M / +bM, a second "
        "crash after / before the restarted life's write M)",
    )
    group.addoption(
        "--aiqsim-second-crashes",
        default=None,
        metavar="N|all",
        help="after each first crash, crash the restarted process again (while it recovers) at N seeded "
        "points of its life, or at all of them (default 0: none; ini aiqsim_second_crashes)",
    )
    parser.addini("aiqsim_seeds", "seeds per crash test (--aiqsim-seeds)", default=str(DEFAULT_SEEDS))
    parser.addini("aiqsim_crash_points", "all | sample:K (--aiqsim-crash-points)", default="all")
    parser.addini("aiqsim_second_crashes", "N | all (--aiqsim-second-crashes)", default="0")
    parser.addini("aiqsim_postgres_dsn", f"PostgreSQL DSN for the store fixture (or env {POSTGRES_ENV})")


def crash_options(config: pytest.Config) -> CrashOptions:
    """The :class:`CrashOptions` of this pytest run (command line over ini over defaults)."""
    seeds = config.getoption("aiqsim_seeds") or config.getini("aiqsim_seeds")
    points = config.getoption("aiqsim_crash_points") or config.getini("aiqsim_crash_points")
    second = config.getoption("aiqsim_second_crashes") or config.getini("aiqsim_second_crashes")
    return CrashOptions(
        seeds=parse_seeds(seeds),
        sample=parse_crash_points(points),
        replay=parse_replay(config.getoption("aiqsim_replay")),
        second_crashes=parse_second_crashes(second),
    )


def postgres_dsn(config: pytest.Config) -> str | None:
    """The DSN the store fixture uses for ``postgres`` (env first, then the ini key), or None."""
    return os.environ.get(POSTGRES_ENV) or config.getini("aiqsim_postgres_dsn") or None


def pytest_configure(config: pytest.Config) -> None:
    try:
        config.stash[_OPTIONS] = crash_options(config)
    except KitOptionError as error:
        raise pytest.UsageError(str(error)) from None


def pytest_report_header(config: pytest.Config) -> str:
    options = config.stash[_OPTIONS]
    from aiqsim.testing.stores import store_kinds

    depth = "all crash points" if options.sample is None else f"{options.sample} crash points per seed"
    if options.second_crashes:
        depth += f", {options.second_crashes} second crash points per first crash"
    replay = f", replaying {options.replay.seed}:{options.replay.point}" if options.replay else ""
    kinds = "/".join(store_kinds(postgres_dsn(config)))
    return f"aiqsim: {len(options.seeds)} seeds, {depth}{replay}; stores {kinds}"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "aiqsim_store_kind" in metafunc.fixturenames:
        from aiqsim.testing.stores import store_kinds

        kinds = store_kinds(postgres_dsn(metafunc.config))
        metafunc.parametrize("aiqsim_store_kind", kinds, ids=[f"store={kind}" for kind in kinds])


_OPTIONS = pytest.StashKey[CrashOptions]()


@pytest.fixture
def aiqsim_runtime() -> SimPyRuntime:
    """A fresh SimPy runtime: ``aiqsim_runtime.run(main())`` runs ``main`` on a virtual clock."""
    from aiqsim.runtime.simpy_runtime import SimPyRuntime

    return SimPyRuntime()


@pytest.fixture
def aiqsim_provider(aiqsim_runtime: SimPyRuntime) -> Callable[..., SimulatedProvider]:
    """``make(name="llm", seed=0, **fields)``: a simulated provider on ``aiqsim_runtime``, configured
    like a scenario's ``[[providers]]`` table (bad keys raise ``ScenarioError`` naming the key)."""
    from aiqsim.testing.providers import simulated_provider

    def make(name: str = "llm", seed: int = 0, **fields: Any) -> SimulatedProvider:
        return simulated_provider(aiqsim_runtime, seed, name=name, **fields)

    return make


@pytest.fixture
def aiqsim_store_kind() -> str:
    """The store kind of this test's parametrisation (overridden by ``pytest_generate_tests``)."""
    return "memory"


@pytest.fixture
def aiqsim_store(
    aiqsim_store_kind: str, tmp_path: Any, request: pytest.FixtureRequest
) -> Iterator[StoreFactory]:
    """A :class:`StoreFactory` of this parametrisation's kind, in ``tmp_path`` (or its own schema)."""
    from aiqsim.testing.stores import StoreFactory

    schema = f"aiqsim_kit_{zlib.crc32(request.node.nodeid.encode()):08x}"
    factory = StoreFactory(
        aiqsim_store_kind, tmp_path / "aiqsim-store", postgres_dsn=postgres_dsn(request.config), schema=schema
    )
    yield factory
    factory.cleanup()


@pytest.fixture
def aiqsim_crash_options(request: pytest.FixtureRequest) -> CrashOptions:
    """This run's seeds, crash-point sample and replay case (from the ``--aiqsim-*`` options)."""
    return request.config.stash[_OPTIONS]


@pytest.fixture
def aiqsim_crash(aiqsim_crash_options: CrashOptions, request: pytest.FixtureRequest) -> CrashDriver:
    """A :class:`CrashDriver` on a memory store; ``aiqsim_crash.on(aiqsim_store)`` for other stores.
    Its failures name this test, so the replay hint can be pasted as it is."""
    from aiqsim.testing.crash_driver import CrashDriver

    return CrashDriver(aiqsim_crash_options, label=request.node.nodeid)


@pytest.fixture
def aiqsim_sigkill(aiqsim_crash_options: CrashOptions) -> Callable[..., KillReport]:
    """:func:`kill_and_restart` seeded with this run's first seed (pass ``seed=`` to choose another)."""
    from aiqsim.testing.sigkill import kill_and_restart

    return functools.partial(kill_and_restart, seed=aiqsim_crash_options.seeds[0])
