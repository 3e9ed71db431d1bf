"""The roots of aiqsim's exception tree: one base and its families.

Every public exception aiqsim raises descends from :class:`AiqsimError`, so a caller can write
``except aiqsim.AiqsimError`` the way they write ``except httpx.HTTPError``. Each family also
keeps the builtin base its members always had (``ScenarioError`` is still a ``ValueError``),
so existing ``except ValueError`` clauses keep working.

This module imports nothing: every layer, :mod:`aiqsim.core` included, may derive from it. The
provider family's root is :class:`aiqsim.core.failures.ProviderError`.
``aiqsim.errors`` re-exports the whole tree from one place.
"""

from __future__ import annotations

__all__ = [
    "AiqsimError",
    "ConfigurationError",
    "SchedulingError",
    "StoreError",
]


class AiqsimError(Exception):
    """Base of every exception aiqsim raises on purpose."""


class ConfigurationError(AiqsimError, ValueError):
    """A setting, argument or scenario that cannot be used; raised before any work starts."""


class StoreError(AiqsimError):
    """A task store could not be opened, read or written (what was kept is in the message)."""


class SchedulingError(AiqsimError):
    """The scheduler refused work or a task did not produce a result."""
