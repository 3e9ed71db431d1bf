"""Checks a run makes of its surroundings before simulating, shared by ``aiqsim run`` and ``validate``.

Scenario parsing checks the file itself (types, ranges, cross-key rules, workload sizes). A few
things only the machine can answer: whether ``store.path`` can be created (its folder exists, no
file from an earlier run is in the way). ``aiqsim run`` used to discover them after generating
the arrivals, with a raw ``FileNotFoundError``; :func:`check_runnable` answers them at once, so
``validate`` reports every problem ``run`` would meet and ``run`` meets none of them late.
"""

from __future__ import annotations

from pathlib import Path

from aiqsim.sim.config import Scenario
from aiqsim.stores.base import StoreOpenError, check_store_location

__all__ = ["check_runnable"]


def check_runnable(scenario: Scenario) -> None:
    """Raise :class:`~aiqsim.sim.scenario.ScenarioError` if ``scenario`` cannot run on this machine."""
    from aiqsim.sim.scenario import ScenarioError

    store = scenario.store
    if store.kind == "memory" or store.path is None:
        return  # a temporary folder the run makes itself
    path = Path(store.path)
    source = scenario.source or scenario.name
    try:
        check_store_location(path)
    except StoreOpenError as error:
        raise ScenarioError(source, "store.path", str(error)) from None
    if path.exists():
        raise ScenarioError(
            source,
            "store.path",
            f"{path} already exists (from an earlier run?); delete it or choose another path",
        )
