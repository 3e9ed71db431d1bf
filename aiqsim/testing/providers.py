"""Simulated providers for tests, configured exactly like a scenario file's ``[[providers]]`` table.

There is one provider model: :class:`aiqsim.sim.providers.SimulatedProvider` with its
:class:`~aiqsim.sim.config.ProviderConfig`. This module only reads the configuration with the
scenario file's own checks (same keys, same defaults, same messages), so a test can say
``simulated_provider(runtime, seed, name="llm", server_error_prob=0.2, honours_idempotency=False,
outages=[{"start_s": 5, "end_s": 9, "mode": "error"}])``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from aiqsim.runtime.protocol import Runtime
from aiqsim.sim.config import ProviderConfig
from aiqsim.sim.providers import ProviderLedger, SimulatedProvider

__all__ = ["provider_config", "simulated_provider"]


def provider_config(name: str = "llm", **fields: Any) -> ProviderConfig:
    """A :class:`ProviderConfig` from ``[[providers]]`` keys, checked as a scenario file's are.

    Raises :class:`~aiqsim.sim.scenario.ScenarioError` (a ``ConfigurationError``) naming the key
    (``providers[0].timeout_prob``) for an unknown key or a value out of range.
    """
    # The scenario reader's own table schema and builder: one definition of what a provider accepts.
    from aiqsim.sim.scenario import provider_from_table

    raw: dict[str, Any] = {"name": name, **fields}
    if "outages" in raw:
        raw["outages"] = [dict(o) if isinstance(o, Mapping) else o for o in raw["outages"]]
    return provider_from_table(raw, "aiqsim.testing provider")


def simulated_provider(
    runtime: Runtime,
    seed: int | str | random.Random = 0,
    *,
    ledger: ProviderLedger | None = None,
    name: str = "llm",
    **fields: Any,
) -> SimulatedProvider:
    """A :class:`SimulatedProvider` on ``runtime`` configured by ``[[providers]]`` keys.

    ``seed`` seeds its random stream (a :class:`random.Random` is used as it is); executions are
    recorded in ``ledger`` (a new one by default, available as ``provider.ledger``). Keep the one
    instance across simulated crashes: it is the server, which does not die with the client.
    """
    rng = seed if isinstance(seed, random.Random) else random.Random(f"{seed}:provider:{name}")
    return SimulatedProvider(runtime, provider_config(name, **fields), rng, ledger)
