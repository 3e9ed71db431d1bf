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
from collections.abc import Sequence

from aiqsim.core.errors import ConfigurationError

__all__ = [
    "EXTRAS",
    "ExtraMissingError",
    "install_line",
    "is_installed",
    "missing_packages",
    "require_extra",
    "require_extras",
]

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

    def __init__(self, feature: str, extras: tuple[str, ...], missing: tuple[str, ...]) -> None:
        self.feature, self.extras, self.missing = feature, extras, missing
        named = " and ".join(f"'{extra}'" for extra in extras)
        super().__init__(
            f"{feature} needs the {named} extra{'s' if len(extras) > 1 else ''} "
            f"({', '.join(missing)} not installed): {install_line(*extras)}"
        )

    def __reduce__(self) -> tuple[type[ExtraMissingError], tuple[str, tuple[str, ...], tuple[str, ...]]]:
        # picklable across processes (a Dask sweep's worker that lacks an extra sends this back)
        return type(self), (self.feature, self.extras, self.missing)


def install_line(*extras: str) -> str:
    """The command that installs ``extras``: ``pip install "aiqsim[lab]"``, ``"aiqsim[lab,http]"``."""
    return f'pip install "aiqsim[{",".join(extras)}]"'


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
    require_extras((extra,), feature)


def require_extras(extras: Sequence[str], feature: str) -> None:
    """:func:`require_extra` for several extras at once: one message, one ``pip install`` line naming
    every extra that is missing (``pip install "aiqsim[lab,http]"``)."""
    missing = {extra: missing_packages(extra) for extra in extras}
    lacking = tuple(extra for extra, packages in missing.items() if packages)
    if lacking:
        raise ExtraMissingError(feature, lacking, tuple(p for e in lacking for p in missing[e]))
