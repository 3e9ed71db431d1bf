"""Scenario files: read (bounded, UTF-8, TOML with its line numbers in errors), overridden, validated."""

from __future__ import annotations

import re
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiqsim.sim.config import Scenario
from aiqsim.sim.scenario.errors import ScenarioError
from aiqsim.sim.scenario.nesting import _nesting_error, _too_deep
from aiqsim.sim.scenario.overrides import apply_overrides
from aiqsim.sim.scenario.parse import parse_scenario

_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


MAX_SCENARIO_BYTES = 16 * 1024 * 1024
"""The largest scenario file read (16 MiB; the shipped ones are a few KiB): more is not a scenario
(``/dev/zero`` would otherwise be read until memory runs out)."""


def _read_toml(path: Path, source: str) -> dict[str, Any]:
    try:
        mode = path.stat().st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):  # a FIFO would block the read for ever
            raise ScenarioError(
                source, "", "is not a regular file (a FIFO, a device...), expected a .toml file"
            )
        with path.open("rb") as handle:
            data = handle.read(MAX_SCENARIO_BYTES + 1)
        if len(data) > MAX_SCENARIO_BYTES:
            raise ScenarioError(
                source, "", f"larger than {MAX_SCENARIO_BYTES // 2**20} MiB: not a scenario file"
            )
    except FileNotFoundError:
        raise ScenarioError(source, "", "no such file") from None
    except IsADirectoryError:
        raise ScenarioError(source, "", "is a directory, expected a .toml file") from None
    except OSError as exc:
        raise ScenarioError(source, "", f"cannot read the file: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScenarioError(source, "", f"not UTF-8 text (bad byte at offset {exc.start})") from None
    # A UTF-8 byte order mark (Windows Notepad writes one) is not TOML: tomllib called it an "Invalid
    # statement" at line 1, column 1. It says nothing about the content, so it is dropped.
    text = text.removeprefix("\ufeff")
    try:
        parsed = tomllib.loads(text)
    except RecursionError:  # arrays or inline tables nested deeper than the parser can recurse
        raise _nesting_error(source, "") from None
    except tomllib.TOMLDecodeError as exc:
        detail = str(exc)
        match = _TOML_POSITION.search(detail)
        if match is None:
            raise ScenarioError(source, "", f"invalid TOML: {detail}") from None
        line, column = int(match.group(1)), int(match.group(2))
        reason = detail[: match.start()]
        raise ScenarioError(
            source, "", f"line {line}, column {column}: invalid TOML: {reason}", line=line
        ) from None
    except ValueError as exc:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise ScenarioError(source, "", f"a number is too long to read ({exc})") from None
    deep = _too_deep(parsed)
    if deep is not None:
        raise _nesting_error(source, deep)
    return parsed


def load_scenario(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Scenario:
    """Read, override and validate a scenario file. Raises :class:`ScenarioError`.

    ``overrides`` maps dotted key paths to values (``{"retry.base_s": 0.5,
    "providers.llm.rate_limit_prob": 0.2, "workloads[0].rate_per_s": 3}``).
    """
    source = str(path)
    raw = _read_toml(Path(path), source)
    if overrides:
        raw = apply_overrides(raw, overrides, source=source)
    return parse_scenario(raw, source=source)
