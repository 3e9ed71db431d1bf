"""Checks a run makes of its surroundings before simulating, shared by ``aiqsim run`` and ``validate``.

Scenario parsing checks the file itself (types, ranges, cross-key rules, workload sizes). A few
things only the machine can answer: whether ``store.path`` can be created (its folder exists, no
file from an earlier run is in the way, its name fits the file system). ``aiqsim run`` used to
discover them after generating the arrivals, with a raw ``FileNotFoundError`` (or ``OSError``
ENAMETOOLONG); :func:`check_runnable` answers them at once, so ``validate`` reports every problem
``run`` would meet and ``run`` meets none of them late.

A batch of runs (``sweep``, ``tune``) adds one more: a fixed ``store.path`` holds one run's tasks, so
two runs that would open the same file are refused (:func:`check_store_unshared`) before the first
starts. They used to collide: in parallel the runs after the first failed with ``task id ... already
exists`` (and the one that survived may have read another run's tasks); in series every run after the
first found the file already there.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from aiqsim.sim.config import Scenario
from aiqsim.stores.base import StoreOpenError, check_store_location

__all__ = ["check_runnable", "check_store_unshared"]

SIBLING_NAME_ROOM = 32
"""Bytes the stores add to ``store.path``'s name for files beside it (``.lock``, ``.journal``,
``-wal``, ``.{name}.tmp-{pid}-{id}``): a name that fits only without them fails mid-run."""


def check_runnable(scenario: Scenario) -> None:
    """Raise :class:`~aiqsim.sim.scenario.ScenarioError` if ``scenario`` cannot run on this machine."""
    from aiqsim.sim.scenario import ScenarioError

    store = scenario.store
    if store.kind == "memory" or store.path is None:
        return  # a temporary folder the run makes itself
    path = Path(store.path)
    source = scenario.source or scenario.name
    if "\0" in store.path:  # a Scenario built in Python skips the loader's check
        raise ScenarioError(source, "store.path", "expected a file path, got one holding a NUL character")
    try:
        check_store_location(path)
        too_long = _name_too_long(path)
        exists = path.exists() if too_long is None else False
    except StoreOpenError as error:
        raise ScenarioError(source, "store.path", str(error)) from None
    except OSError as error:  # e.g. ENAMETOOLONG from the file system itself
        message = f"{path}: cannot use this path ({error.strerror or error})"
        raise ScenarioError(source, "store.path", message) from None
    if too_long is not None:
        raise ScenarioError(source, "store.path", f"{path}: {too_long}")
    if exists:
        raise ScenarioError(
            source,
            "store.path",
            f"{path} already exists (from an earlier run?); delete it or choose another path",
        )


def check_store_unshared(runs: Iterable[tuple[Scenario, int]], *, what: str) -> None:
    """Raise :class:`~aiqsim.sim.scenario.ScenarioError` if two of a batch's runs would open one store file.

    ``runs`` pairs each distinct scenario of the batch with how many runs use it (a sweep: each grid
    point with its seeds); ``what`` names the runs in the message (``"sweep runs"``). Scenarios without
    a fixed ``store.path`` are fine: each of their runs gets a temporary folder of its own. Paths are
    compared absolute, so ``a.db`` and ``./a.db`` are the same file. Each path is also checked as
    ``run`` checks it (:func:`check_runnable`), so a batch meets none of those problems run by run.
    """
    from aiqsim.sim.scenario import ScenarioError

    shared: dict[str, tuple[Scenario, int]] = {}
    for scenario, count in runs:
        store = scenario.store
        if store.kind == "memory" or store.path is None or count < 1:
            continue
        key = os.path.abspath(store.path)
        first, total = shared.get(key, (scenario, 0))
        shared[key] = first, total + count
    for scenario, total in shared.values():
        check_runnable(scenario)  # e.g. a file from an earlier run: refused now, not by every run
        if total > 1:
            raise ScenarioError(
                scenario.source or scenario.name,
                "store.path",
                f"{scenario.store.path}: {total:,} {what} would share this one store file, "
                "which holds the tasks of one run; remove store.path (each run then gets a temporary "
                "store of its own) or run one simulation per path",
            )


def _name_too_long(path: Path) -> str | None:
    """Why ``path``, with the stores' files beside it, is too long for the file system its folder is on,
    or None (checked before the run, not when the store first writes one of those files)."""
    try:
        name_max = os.pathconf(path.parent, "PC_NAME_MAX")
        path_max = os.pathconf(path.parent, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):  # no pathconf (Windows) or no answer: the usual limits
        name_max, path_max = 255, 4096
    name_bytes = len(os.fsencode(path.name))
    path_bytes = len(os.fsencode(os.path.abspath(path)))
    if name_bytes + SIBLING_NAME_ROOM > name_max:
        fits = name_max - SIBLING_NAME_ROOM
        return (
            f"the file name is {name_bytes:,} bytes long; at most {fits:,} fit (with the store's own files)"
        )
    if path_bytes + SIBLING_NAME_ROOM > path_max:
        fits = path_max - SIBLING_NAME_ROOM
        return f"the path is {path_bytes:,} bytes long; at most {fits:,} fit (with the store's own files)"
    return None
