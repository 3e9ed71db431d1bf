"""The ``[store]`` section and the ``[[crashes]]`` it must survive: paths only for file stores, group
commit only with SQLite, torn writes only with JSON, crashes within the run."""

from __future__ import annotations

from typing import Any

from aiqsim.sim.config import CrashConfig, StoreConfig
from aiqsim.sim.scenario.errors import _fmt, describe
from aiqsim.sim.scenario.reader import _Reader


def _store(values: dict[str, Any], reader: _Reader) -> StoreConfig:
    store = StoreConfig(**values)
    if store.kind == "memory" and store.path is not None:
        raise reader.error(
            "store.path", 'does not apply to the memory store; set store.kind = "json" or "sqlite"'
        )
    if store.path is not None and "\0" in store.path:  # no file system takes it; open() raises ValueError
        raise reader.error(
            "store.path", f"expected a file path, got {describe(store.path)} (it holds a NUL character)"
        )
    if store.group_commit and store.kind != "sqlite":
        raise reader.error("store.group_commit", 'needs store.kind = "sqlite" (the store with group commit)')
    return store


def _crash(
    values: dict[str, Any], path: str, store: StoreConfig, horizon_s: float, reader: _Reader
) -> CrashConfig:
    crash = CrashConfig(**values)
    if (crash.at_s is None) == (crash.after_writes is None):
        got = "both" if crash.at_s is not None else "neither"
        raise reader.error(path, f"expected exactly one of at_s or after_writes, got {got}")
    if crash.at_s is not None and crash.at_s > horizon_s:
        raise reader.error(
            f"{path}.at_s",
            f"expected a number <= duration_s + drain_s ({_fmt(horizon_s)}), got {describe(values['at_s'])} "
            "(the run is over by then)",
        )
    if crash.torn_write and store.kind != "json":
        raise reader.error(
            f"{path}.torn_write", f'only applies to the json store, but store.kind is "{store.kind}"'
        )
    return crash
