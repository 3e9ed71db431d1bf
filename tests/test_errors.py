"""One exception tree: every public exception class in the package descends from AiqsimError."""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil

import pytest

import aiqsim
import aiqsim.errors
from aiqsim.core.errors import AiqsimError, ConfigurationError, SchedulingError, StoreError
from aiqsim.core.failures import ProviderError

OUTSIDE_THE_TREE = {"aiqsim.sim.crash.SimulatedCrash", "aiqsim.sim.sweep.SweepInterrupted"}
"""Deliberately BaseExceptions (see aiqsim.errors): a simulated death must not be caught as a failure,
and a sweep's Ctrl-C is a KeyboardInterrupt."""

FAMILIES = (ConfigurationError, StoreError, SchedulingError, ProviderError)


def _all_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(aiqsim.__path__, prefix="aiqsim."):
        if not info.name.endswith("__main__"):  # importing it would run the command line
            names.append(info.name)
    return sorted(names)


@functools.cache
def _exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in _all_modules():
        try:
            module = importlib.import_module(name)
        except ImportError as error:  # an optional extra that is not installed
            pytest.skip(f"{name} needs an optional dependency: {error}")
        for attr, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == name
                and not attr.startswith("_")
            ):
                found[f"{name}.{attr}"] = value
    return found


def test_the_walk_finds_the_known_exceptions() -> None:
    classes = _exception_classes()
    assert "aiqsim.sim.scenario.ScenarioError" in classes
    assert "aiqsim.stores.base.StoreWriteError" in classes
    assert len(classes) >= 25


def test_every_public_exception_descends_from_aiqsim_error() -> None:
    strays = [
        qualified
        for qualified, cls in _exception_classes().items()
        if qualified not in OUTSIDE_THE_TREE and not issubclass(cls, AiqsimError)
    ]
    assert not strays, f"exceptions outside the aiqsim.AiqsimError tree: {strays}"


def test_every_public_exception_belongs_to_a_family() -> None:
    loose = [
        qualified
        for qualified, cls in _exception_classes().items()
        if issubclass(cls, AiqsimError)
        and cls not in (AiqsimError, *FAMILIES)
        and not issubclass(cls, FAMILIES)
        and qualified != "aiqsim.sim.sweep.SweepError"
    ]
    assert not loose, f"exceptions in no family (configuration, store, scheduling, provider): {loose}"


def test_the_errors_module_exports_every_public_exception() -> None:
    exported = {getattr(aiqsim.errors, name) for name in aiqsim.errors.__all__}
    missing = [
        qualified
        for qualified, cls in _exception_classes().items()
        if cls not in exported and qualified not in OUTSIDE_THE_TREE and qualified != "aiqsim.cli.UsageError"
    ]
    assert not missing, f"add these to aiqsim/errors.py: {missing}"


@pytest.mark.parametrize(
    ("qualified", "builtin"),
    [
        ("aiqsim.sim.scenario.ScenarioError", ValueError),
        ("aiqsim.core.token_bucket.QuotaConfigError", ValueError),
        ("aiqsim.core.fingerprint.FingerprintError", TypeError),
        ("aiqsim.stores.base.StoreCorruptError", RuntimeError),
        ("aiqsim.scheduler.refusals.QueueFullError", RuntimeError),
        ("aiqsim.core.failures.ProviderTimeoutError", TimeoutError),
    ],
)
def test_existing_builtin_bases_are_kept(qualified: str, builtin: type[BaseException]) -> None:
    assert issubclass(_exception_classes()[qualified], builtin)


def test_the_base_is_exported_at_the_top() -> None:
    assert aiqsim.AiqsimError is AiqsimError
    assert aiqsim.ConfigurationError is ConfigurationError
    with pytest.raises(aiqsim.AiqsimError):
        aiqsim.QuotaLimits(requests_per_min=-1) and aiqsim.MultiQuota(aiqsim.QuotaLimits(requests_per_min=-1))


# Where aiqsim may still raise a bare ValueError on purpose: control flow its own callers catch.
_BARE_VALUE_ERRORS_ALLOWED = {
    "aiqsim/core/retry_after.py",  # delta_seconds: "not delta-seconds, try an HTTP date" (caught beside it)
    "aiqsim/scheduler/lane_pump.py",  # a dispatch policy's bad wait: reported under the lane's name
}


def test_no_module_raises_a_bare_value_error_for_a_bad_argument() -> None:
    # A bad argument is a ConfigurationError (still a ValueError): `except AiqsimError` catches it.
    # 64 constructor and argument checks raised builtin ValueError before.
    import ast
    from pathlib import Path

    package = Path(aiqsim.__file__).parent
    offenders = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package.parent).as_posix()
        if relative in _BARE_VALUE_ERRORS_ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                called = node.exc.func
                if isinstance(called, ast.Name) and called.id == "ValueError":
                    offenders.append(f"{relative}:{node.lineno}")
    assert offenders == []


def test_errors_the_change_added_survive_a_trip_between_processes() -> None:
    """Before: each took several arguments and pickled only its message, so unpickling it (a Dask
    worker sending it back; a multiprocessing pool) raised TypeError about missing arguments."""
    import pickle

    from aiqsim.core.extras import ExtraMissingError
    from aiqsim.core.failures import StreamCutError
    from aiqsim.scheduler.job_spec import FanOutLimitError
    from aiqsim.scheduler.streams import StreamInterruptedError

    for error in (
        ExtraMissingError("aiqsim run", ("lab",), ("simpy",)),
        FanOutLimitError("embed", 20_000, 10_000),
        FanOutLimitError("embed", None, 10_000),
        StreamInterruptedError("t1", StreamCutError("cut after 3 chunks", received_units=3.0), 3),
    ):
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error) and str(again) == str(error)
        assert {k: str(v) for k, v in vars(again).items()} == {k: str(v) for k, v in vars(error).items()}
