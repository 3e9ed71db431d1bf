"""The files a workload reads (a trace, replayed arrivals): found relative to the scenario's folder and
read in full, so ``aiqsim validate`` catches what ``aiqsim run`` would trip on."""

from __future__ import annotations

import json
from pathlib import Path

from aiqsim.sim.scenario.errors import describe
from aiqsim.sim.scenario.reader import _Reader
from aiqsim.sim.workloads import BUILTIN_TRACES, TraceError, is_builtin_trace, read_trace


def _scenario_relative_file(value: str, path: str, reader: _Reader, expected: str) -> str:
    """The absolute path of the existing file ``value`` names (relative: from the scenario's folder)."""
    try:
        candidate = Path(value).expanduser()
        source = Path(reader.source)
        if not candidate.is_absolute() and source.is_file():
            candidate = source.parent / candidate
        found = candidate.is_file()
        why = (
            ""
            if found
            else "a directory"
            if candidate.is_dir()
            else "not a regular file"
            if candidate.exists()
            else ""
        )
    except (OSError, RuntimeError) as error:  # a name too long for the OS, ~user with no such user
        raise reader.error(
            path, f"expected {expected} (relative to the scenario file), got {describe(value)} ({error})"
        ) from None
    if not found:
        why = why or "no such file"
        raise reader.error(
            path,
            f"expected {expected} (relative to the scenario file), got {describe(value)} "
            f"({why}: {candidate})",
        )
    return str(candidate.resolve())


def _resolve_trace(value: str, path: str, reader: _Reader) -> str:
    if is_builtin_trace(value):
        return value
    builtins = " or ".join(json.dumps(name) for name in BUILTIN_TRACES)
    resolved = _scenario_relative_file(value, path, reader, f"{builtins} or the path of a CSV file")
    try:
        read_trace(resolved)  # every row, so `aiqsim validate` catches what `run` would trip on
    except TraceError as exc:
        raise reader.error(path, str(exc)) from None
    return resolved


def _resolve_replay_arrivals(value: str, path: str, reader: _Reader) -> str:
    """A replay workload's arrivals file, resolved against the scenario's folder and read in full."""
    from aiqsim.sim.replay_arrivals import ReplayArrivalsError, read_replay_arrivals

    resolved = _scenario_relative_file(value, path, reader, "the path of a CSV file")
    try:
        read_replay_arrivals(resolved)
    except ReplayArrivalsError as exc:
        raise reader.error(path, str(exc)) from None
    return resolved
