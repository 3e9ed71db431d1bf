"""The one error of the scenario loader, and how values are written in its messages.

:class:`ScenarioError` names where (the file, the dotted key path) and what was expected;
:func:`describe` writes a value as it would appear in a scenario file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from aiqsim.core.errors import ConfigurationError


class ScenarioError(ConfigurationError):
    """A scenario that cannot be used, with where (file, dotted key path) and what was expected.

    ``str(error)`` reads ``scenarios/x.toml: retry.base_s: expected a number >= 0, got "fast"``.
    ``key_path`` is empty for problems with the file as a whole (missing, not TOML); ``line``
    is set for TOML syntax errors.
    """

    # its public home, as before the loader was split into modules: tracebacks, pickles and the
    # exception tree (aiqsim.errors) name aiqsim.sim.scenario.ScenarioError
    __module__ = "aiqsim.sim.scenario"

    def __init__(self, file: str, key_path: str, message: str, *, line: int | None = None) -> None:
        self.file = file
        self.key_path = key_path
        self.message = message
        self.line = line
        super().__init__(self._render())

    def _render(self) -> str:
        where = [self.file]
        if self.key_path:
            where.append(self.key_path)
        return ": ".join([*where, self.message])

    def __str__(self) -> str:
        return self._render()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_scenario_error, (self.file, self.key_path, self.message, self.line))


def _rebuild_scenario_error(file: str, key_path: str, message: str, line: int | None) -> ScenarioError:
    return ScenarioError(file, key_path, message, line=line)


def describe(value: Any) -> str:
    """A value as it would be written in a scenario file (or what kind of thing it is)."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= 60 else text[:57] + '..."'
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list | tuple):
        return "an array"
    if callable(getattr(value, "isoformat", None)):  # TOML dates and times
        return f"the date/time {value.isoformat()}"
    return f"a {type(value).__name__}"


def _join(path: str, key: Any) -> str:
    text = key if isinstance(key, str) else repr(key)
    return f"{path}.{text}" if path else text


def _fmt(number: float) -> str:
    return f"{number:g}"
