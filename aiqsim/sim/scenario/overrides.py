"""Overrides (``retry.base_s=0.5``, ``providers.llm.timeout_prob``): key paths parsed and walked through
the spec, applied to the raw mapping before validation, so they are checked exactly like the file."""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Mapping
from typing import Any

from aiqsim.sim.scenario.errors import ScenarioError, _join, describe
from aiqsim.sim.scenario.nesting import _nesting_error, _too_deep
from aiqsim.sim.scenario.spec import _FILE, _Array, _Map, _Table

_PATH_PART = re.compile(r"([^.\[\]]+)|\[([0-9]+)\]")


def split_key_path(path: str, *, source: str = "<override>") -> list[str | int]:
    """``providers[1].outages[0].start_s`` -> ``["providers", 1, "outages", 0, "start_s"]``.

    A purely numeric dotted part (``workloads.0.rate_per_s``) is an index too.
    """
    parts: list[str | int] = []
    text = path.strip()
    position = 0
    expect_key = True
    while position < len(text):
        if text[position] == "." and not expect_key and position + 1 < len(text):
            position += 1
            expect_key = True
            continue
        match = _PATH_PART.match(text, position)
        if match is None or (match.group(1) is not None and not expect_key):
            raise ScenarioError(
                source, path, "cannot parse the key path; expected e.g. providers[0].timeout_prob"
            )
        if match.group(1) is not None:
            key = match.group(1).strip()
            parts.append(int(key) if key.isascii() and key.isdigit() else key)
        else:
            parts.append(int(match.group(2)))
        position = match.end()
        expect_key = False
    if not parts or expect_key:
        raise ScenarioError(
            source, path, "cannot parse the key path; expected e.g. providers[0].timeout_prob"
        )
    return parts


def _render_path(parts: list[str | int]) -> str:
    text = ""
    for part in parts:
        text = f"{text}[{part}]" if isinstance(part, int) else _join(text, part)
    return text


def _set_override(root: dict[str, Any], path: str, value: Any, source: str) -> tuple[str | int, ...]:
    """Set ``path`` in ``root`` to ``value``; returns the field's canonical path (entries addressed by
    name become their index: ``providers.llm.timeout_prob`` -> ``("providers", 0, "timeout_prob")``)."""
    parts = split_key_path(path, source=source)
    node: Any = root
    schema: Any = _FILE
    walked: list[str | int] = []

    def fail(message: str) -> ScenarioError:
        return ScenarioError(source, path, f"unknown override path: {message}")

    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        here = _render_path(walked) or "(top level)"
        if isinstance(schema, _Table):
            if not isinstance(part, str) or part not in schema.fields:
                raise fail(f"{here} has no key {part!r}; expected one of: {', '.join(schema.fields)}")
            if not isinstance(node, dict):
                raise ScenarioError(
                    source, path, f"cannot set it: {here} is {describe(node)}, expected {schema.expected}"
                )
            child_schema = schema.fields[part]
            if last:
                node[part] = copy.deepcopy(value)
                return (*walked, part)
            if isinstance(node.get(part), tuple):
                node[part] = list(node[part])
            if part not in node:
                if isinstance(child_schema, _Array):
                    raise fail(f"the scenario has no {child_schema.header} to address")
                if not isinstance(child_schema, _Table | _Map):
                    raise fail(f"{_render_path([*walked, part])} is a single value and has no keys")
                node[part] = {}
            node, schema = node[part], child_schema
        elif isinstance(schema, _Array):
            if not isinstance(node, list):
                raise ScenarioError(
                    source, path, f"cannot set it: {here} is {describe(node)}, expected {schema.expected}"
                )
            if isinstance(part, int):
                if part >= len(node):
                    raise fail(f"{here}[{part}] does not exist; the scenario has {len(node)} {schema.header}")
                index = part
            elif schema.named:
                names = [item.get("name") for item in node if isinstance(item, dict)]
                if part not in names:
                    listed = ", ".join(str(name) for name in names)
                    raise fail(f"no {here} entry named {part!r}; declared: {listed}")
                index = names.index(part)
                part = index
            else:
                raise fail(f"{here} entries are addressed by index, e.g. {here}[0]")
            if last:
                node[index] = copy.deepcopy(value)
                return (*walked, index)
            node, schema = node[index], schema.item
        elif isinstance(schema, _Map):
            if not isinstance(node, dict):
                raise ScenarioError(
                    source, path, f"cannot set it: {here} is {describe(node)}, expected {schema.expected}"
                )
            if not isinstance(part, str):
                raise fail(f"{here} entries are addressed by provider name, e.g. {here}.llm")
            if last:
                node[part] = copy.deepcopy(value)
                return (*walked, part)
            node = node.setdefault(part, {})
            schema = schema.item
        else:
            raise fail(f"{here} is a single value and has no keys")
        walked.append(part)
    raise fail("the key path is empty")  # split_key_path never returns no parts


def apply_overrides(
    raw: Mapping[str, Any], overrides: Mapping[str, Any], *, source: str = "<scenario>"
) -> dict:
    """A deep copy of the raw scenario mapping with ``overrides`` (dotted path -> value) applied.

    Paths must exist in the scenario layout (an unknown key is an error naming the path);
    values are not checked here but by :func:`~aiqsim.sim.scenario.parse_scenario` afterwards.
    Two paths that address the same field (``providers.llm.timeout_prob`` and
    ``providers[0].timeout_prob``), or a field and the table holding it, are refused: one would
    silently overwrite the other, and a sweep would label its rows with a value that was never used.
    """
    if not isinstance(raw, Mapping):
        raise ScenarioError(source, "", f"expected a table at the top level, got {describe(raw)}")
    root = copy.deepcopy(dict(raw))
    targets: dict[tuple[str | int, ...], str] = {}
    for path, value in overrides.items():
        if not isinstance(path, str):
            raise ScenarioError(source, repr(path), "expected a dotted key path string")
        target = _set_override(root, path, value, source)
        for other_target, other in targets.items():
            shorter = min(len(target), len(other_target))
            if target[:shorter] == other_target[:shorter]:
                if len(target) == len(other_target):
                    clash = f"addresses the same field as {other} ({_render_path(list(target))})"
                else:
                    outer = _render_path(list(target[:shorter]))
                    clash = f"overlaps {other} (both set {outer} or a key inside it)"
                raise ScenarioError(source, path, f"{clash}; set each field once")
        targets[target] = path
    return root


def parse_override(text: str) -> tuple[str, Any]:
    """``"retry.base_s=0.5"`` -> ``("retry.base_s", 0.5)``.

    The value is read as a TOML value (``0.5``, ``true``, ``"sjf"``, ``[1, 2]``,
    ``{dist = "fixed", mean = 10}``), else kept as a bare string (``sjf``, ``none``).
    """
    key, sep, value_text = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ScenarioError("<override>", text, "expected KEY=VALUE, e.g. retry.base_s=0.5")
    split_key_path(key)  # reject malformed paths early, with the path in the message
    value_text = value_text.strip()
    try:
        value = tomllib.loads(f"value = {value_text}")["value"]
    except RecursionError:  # e.g. --set key=[[[[...: too deep for the parser
        raise _nesting_error("<override>", key) from None
    except tomllib.TOMLDecodeError:
        value = value_text
    except ValueError as exc:  # an integer of more digits than Python converts
        raise ScenarioError("<override>", key, f"a number is too long to read ({exc})") from None
    if _too_deep(value) is not None:
        raise _nesting_error("<override>", key)
    return key, value
