"""A small TOML writer for the files the lab produces (calibrated scenarios, tuning patches).

Handles what scenario files hold: tables of strings, numbers and booleans, arrays of scalars and
arrays of tables, nested to any depth. ``None`` values are left out (TOML has no null; an absent
key means the default). Python's standard library reads TOML but does not write it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["dumps_toml"]


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a valid TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_scalar(item) for item in value) + "]"
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) as TOML")


def _key(name: str) -> str:
    return name if name.replace("_", "").replace("-", "").isalnum() else json.dumps(name)


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list | tuple) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _emit(table: Mapping[str, Any], path: list[str], lines: list[str]) -> None:
    scalars = [(k, v) for k, v in table.items() if v is not None and not isinstance(v, Mapping)]
    scalars = [(k, v) for k, v in scalars if not _is_table_array(v)]
    for key, value in scalars:
        lines.append(f"{_key(key)} = {_scalar(value)}")
    for key, value in table.items():
        if isinstance(value, Mapping):
            sub = [*path, _key(key)]
            lines.append("")
            lines.append(f"[{'.'.join(sub)}]")
            _emit(value, sub, lines)
        elif _is_table_array(value):
            sub = [*path, _key(key)]
            for item in value:
                lines.append("")
                lines.append(f"[[{'.'.join(sub)}]]")
                _emit(item, sub, lines)


def dumps_toml(document: Mapping[str, Any]) -> str:
    """``document`` as TOML text (see the module docstring for what it accepts)."""
    lines: list[str] = []
    _emit(document, [], lines)
    return "\n".join(lines).lstrip("\n") + "\n"
