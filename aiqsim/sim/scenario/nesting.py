"""How deep a scenario value may nest: far deeper input is a mistake that the parser, ``copy.deepcopy``
and ``pickle`` would all meet as a RecursionError; it is found without recursing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiqsim.sim.scenario.errors import ScenarioError

MAX_NESTING = 32
"""How many levels of tables and arrays a scenario value may nest. The deepest real key path
(``jobs[0].stages[0].fanout``) is a handful of levels; far deeper input is a mistake, and the parser,
``copy.deepcopy`` and ``pickle`` all recurse, so it would surface as a RecursionError traceback."""


def _too_deep(value: Any) -> str | None:
    """The key path (down to the first array) under which ``value`` nests more than
    :data:`MAX_NESTING` levels, or None. Iterative, so it is safe on input too deep to recurse over."""
    stack: list[tuple[Any, int, str, bool]] = [(value, 0, "", True)]  # node, depth, path, path grows
    while stack:
        node, depth, path, grows = stack.pop()
        if depth > MAX_NESTING:
            return path
        if isinstance(node, Mapping):
            for key, item in node.items():
                child = (f"{path}.{key}" if path else str(key)) if grows else path
                stack.append((item, depth + 1, child, grows))
        elif isinstance(node, list | tuple):  # name the key holding the array, not indices inside it
            stack.extend((item, depth + 1, path, False) for item in node)
    return None


def _nesting_error(file: str, key_path: str) -> ScenarioError:
    return ScenarioError(
        file, key_path, f"nesting too deep: expected at most {MAX_NESTING} levels of arrays and tables"
    )
