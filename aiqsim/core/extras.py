"""Optional extras: which packages each one brings, and one clear refusal when they are missing.

``pip install aiqsim`` installs the production scheduler only (asyncio runtime, stores, retries,
quotas, jobs, fleet): no simulation, plotting or notebook package. The lab (SimPy, numpy, pandas,
matplotlib, ipywidgets, tqdm) is the ``lab`` extra; HTTP providers, Dask sweeps, Optuna tuning and
Parquet tables have extras of their own. A feature that needs an extra calls :func:`require_extra`
*before* doing any work, so a user without it reads the one ``pip install`` line that mends it, not
a traceback after minutes of simulation.

The check asks the import system whether each package can be found (``importlib.util.find_spec``):
it imports nothing, so checking the lab does not load matplotlib.
"""

from __future__ import annotations

import importlib.util

from aiqsim.core.errors import ConfigurationError

__all__ = ["EXTRAS", "ExtraMissingError", "install_line", "is_installed", "missing_packages", "require_extra"]

EXTRAS: dict[str, tuple[str, ...]] = {
    "lab": ("simpy", "numpy", "pandas", "matplotlib", "ipywidgets", "tqdm"),
    "notebooks": ("jupyterlab", "nbformat"),
    "http": ("httpx",),
    "dask": ("dask", "distributed"),
    "optuna": ("optuna",),
    "parquet": ("pyarrow",),
    "postgres": ("psycopg",),
    "redis": ("redis",),
}
"""Each extra of ``pyproject.toml`` a feature may need, and the importable packages it installs
(tests/test_light_install.py checks these lists against ``pyproject.toml``)."""


class ExtraMissingError(ConfigurationError, ImportError):
    """A feature was asked for whose optional packages are not installed; the message gives the
    ``pip install`` line. Raised before any work starts (a :class:`ConfigurationError`: the command
    line prints it without a traceback)."""

    def __init__(self, feature: str, extra: str, missing: tuple[str, ...]) -> None:
        self.feature, self.extra, self.missing = feature, extra, missing
        names = ", ".join(missing)
        super().__init__(
            f"{feature} needs the '{extra}' extra ({names} not installed): {install_line(extra)}"
        )


def install_line(extra: str) -> str:
    """The command that installs ``extra``: ``pip install "aiqsim[lab]"``."""
    return f'pip install "aiqsim[{extra}]"'


def is_installed(package: str) -> bool:
    """Whether ``package`` can be imported here (found, not imported)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a finder that refuses the name, a module with no spec
        return False


def missing_packages(extra: str) -> tuple[str, ...]:
    """The packages of ``extra`` that cannot be imported here (empty: the extra is installed)."""
    try:
        packages = EXTRAS[extra]
    except KeyError:
        raise ConfigurationError(f"unknown extra {extra!r}; known: {', '.join(sorted(EXTRAS))}") from None
    return tuple(package for package in packages if not is_installed(package))


def require_extra(extra: str, feature: str) -> None:
    """Raise :class:`ExtraMissingError` now if ``extra`` is not installed; ``feature`` names what
    needed it (``"aiqsim run"``, ``"SimPyRuntime"``) in the message."""
    missing = missing_packages(extra)
    if missing:
        raise ExtraMissingError(feature, extra, missing)
