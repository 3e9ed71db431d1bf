"""The ``[tenants.NAME]`` tables: a tenant's weight and queue bound, under a name-like name."""

from __future__ import annotations

from typing import Any

from aiqsim.sim.config import TenantConfig
from aiqsim.sim.scenario.checks import _NAME, _Text
from aiqsim.sim.scenario.errors import describe
from aiqsim.sim.scenario.reader import _Reader


def _tenants(raw: dict[str, dict[str, Any]], reader: _Reader) -> dict[str, TenantConfig]:
    """The ``[tenants.NAME]`` tables; a name must be a name (``tenants.NAME``: letters, digits...)."""
    tenants = {}
    for name, values in raw.items():
        if not _NAME.fullmatch(name):
            raise reader.error(
                f"tenants.{name}", f"expected {_Text(name_like=True).expected}, got {describe(name)}"
            )
        tenants[name] = TenantConfig(**values)
    return tenants
