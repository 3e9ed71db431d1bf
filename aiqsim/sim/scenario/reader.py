"""Reading a raw mapping against the spec tables: unknown keys, missing keys, wrong values.

The result is plain checked values (dicts, tuples); every problem is a
:class:`~aiqsim.sim.scenario.ScenarioError` naming the dotted key path. The section builders
make records from these values and check what spans several keys; the reader also holds the one
rule every array of named entries shares (a name at most once).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiqsim.sim.scenario.checks import _Invalid
from aiqsim.sim.scenario.errors import ScenarioError, _join, describe
from aiqsim.sim.scenario.spec import _Array, _Map, _Table


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, path: str, message: str) -> ScenarioError:
        return ScenarioError(self.source, path, message)

    def expected(self, path: str, expected: str, value: Any) -> ScenarioError:
        return self.error(path, f"expected {expected}, got {describe(value)}")

    def read(self, raw: Any, path: str, schema: Any) -> Any:
        if isinstance(schema, _Table):
            return self.table(raw, path, schema)
        if isinstance(schema, _Array):
            if not isinstance(raw, list | tuple):
                raise self.expected(path, schema.expected, raw)
            return tuple(self.read(item, f"{path}[{i}]", schema.item) for i, item in enumerate(raw))
        if isinstance(schema, _Map):
            if not isinstance(raw, Mapping):
                raise self.expected(path, schema.expected, raw)
            values = {}
            for key, item in raw.items():
                if not isinstance(key, str):
                    raise self.error(_join(path, key), f"expected {schema.key} as the key")
                values[key] = self.read(item, _join(path, key), schema.item)
            return values
        try:
            return schema(raw)
        except _Invalid:
            raise self.expected(path, schema.expected, raw) from None

    def table(self, raw: Any, path: str, schema: _Table) -> dict[str, Any]:
        if not isinstance(raw, Mapping):
            raise self.expected(path or "(top level)", schema.expected, raw)
        allowed = list(schema.fields)
        required = set(schema.required)
        variant = None
        if schema.variant_key is not None:
            key = schema.variant_key
            if key in raw:
                variant = self.read(raw[key], _join(path, key), schema.fields[key])
            elif schema.variant_default is not None:
                variant = schema.variant_default
            else:
                raise self.error(_join(path, key), f"missing; expected {schema.fields[key].expected}")
            allowed = [name for name in schema.fields if name in schema.variants[variant]]
            required |= schema.required_by_variant.get(variant, frozenset())
        for key in raw:
            if key in allowed:
                continue
            if key in schema.fields:
                raise self.error(
                    _join(path, key),
                    f"does not apply to a {variant} {schema.what}; "
                    f"keys for a {variant} {schema.what}: {', '.join(allowed)}",
                )
            raise self.error(_join(path, key), f"unknown key; expected one of: {', '.join(allowed)}")
        values: dict[str, Any] = {}
        for key in allowed:
            check = schema.fields[key]
            if key in raw:
                values[key] = self.read(raw[key], _join(path, key), check)
            elif key in required:
                needs = (
                    f"a {variant} {schema.what} needs it; " if variant and key != schema.variant_key else ""
                )
                raise self.error(_join(path, key), f"missing; {needs}expected {check.expected}")
        if variant is not None:
            values[schema.variant_key] = variant
        return values

    def unique_name(self, seen: dict[str, int], section: str, index: int, what: str, name: str) -> None:
        """Record ``name`` as the entry ``section[index]``'s, or raise naming the earlier entry that has
        it: the entries of ``[[providers]]``, ``[[routes]]`` and ``[[jobs]]`` are addressed by name."""
        if name in seen:
            raise self.error(
                f"{section}[{index}].name",
                f"expected a unique {what} name, got {describe(name)} (also {section}[{seen[name]}])",
            )
        seen[name] = index
