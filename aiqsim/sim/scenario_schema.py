"""The JSON Schema of scenario files, generated from the loader's own spec tables.

:mod:`aiqsim.sim.scenario` validates files against one definition: the value checks (``_Number``,
``_Integer``, ``_Choice``, ... in :mod:`aiqsim.sim.scenario.checks`) and the table specs (``_PROVIDER``,
``_RETRY``, ..., ``_FILE`` in :mod:`aiqsim.sim.scenario.spec`) built from them. This module walks
that definition and writes it as JSON Schema (draft 7, which VS Code, taplo / Even Better TOML and
PyCharm all read), so editors complete keys and flag mistakes while
typing. There is no second copy of the rules: a new key, bound or choice added to a spec table is
in the schema the next time it is generated (``aiqsim schema > scenarios/scenario.schema.json``;
``tests/test_schema.py`` checks the shipped file is up to date and that the schema and the loader
agree on every shipped scenario and on a catalogue of bad ones).

Defaults shown on hover come from the config records the tables build (``SECTION_FIELDS``).

What JSON Schema cannot say is listed in :data:`RULES_NOT_IN_SCHEMA` (and in the schema's own
``description``): those checks span several keys or look outside the file, and only the loader
(``aiqsim validate``) makes them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from aiqsim.core.numeric import LARGEST_WHOLE
from aiqsim.sim.scenario.checks import (
    _NAME,
    _Boolean,
    _Choice,
    _Integer,
    _Names,
    _Number,
    _Optional,
    _Prices,
    _Text,
    _Weights,
)
from aiqsim.sim.scenario.spec import _FILE, SECTION_FIELDS, _Array, _Map, _Table

__all__ = ["RULES_NOT_IN_SCHEMA", "SCHEMA_DIRECTIVE", "scenario_json_schema", "scenario_schema_text"]

SCHEMA_DIRECTIVE = "#:schema ./scenario.schema.json"
"""The first line of every shipped scenario: taplo / Even Better TOML read the schema it names."""

RULES_NOT_IN_SCHEMA: tuple[str, ...] = (
    "numbers must be finite (nan is refused), integers are written as integers (1, not 1.0) "
    "and no number exceeds 2**63 in size",
    "at least one [[providers]], one [[workloads]] and, per [[jobs]], one [[jobs.stages]]",
    "provider names, job names and stage names within a job are unique",
    "[quotas.NAME], workloads' provider, stages' provider and fallback name a declared provider; "
    "a workload's job names a [[jobs]] template; a stage's after names earlier stages; "
    "a workload's or a stage's route names a [[routes]] entry; "
    "a workload's tenant names a [tenants.NAME] table",
    "a workload names exactly one of provider or job; a job workload has no cost, poison_fraction or route",
    "a provider's ttft_s and tokens_per_s are set together (the stream model); ttft_per_prompt_unit_s, "
    "ttft_sigma and stream_cut_prob need them; latency_per_unit_s stays unset with them",
    "end_s > start_s (outages, workloads); high >= low (cost, size, fanout); retry.cap_s >= retry.base_s",
    "a workload's start_s < scenario.duration_s; a crash's at_s <= duration_s + drain_s",
    "a crash sets exactly one of at_s or after_writes; torn_write needs the json store",
    "store.path does not apply to the memory store; store.group_commit needs the sqlite store",
    "request_burst / unit_burst need requests_per_min / units_per_min; "
    "a call's size fits the client quota's unit burst",
    'overload.budget_ratio > 0 when retry_budget = "ratio"; a size from_stage names a stage in after',
    "budget.prices names declared providers",
    "a trace workload's trace is a built-in trace name or an existing CSV file relative to the scenario",
    "a replay workload's arrivals is an existing, readable arrivals CSV relative to the scenario",
    "at most 1,000,000 timeline steps over duration_s + drain_s; arrivals within the workload size limit",
)
"""Rules the loader checks that a JSON Schema cannot express (cross-references, relations between
keys, the file system). ``tests/test_schema.py`` keeps them out of its agreement catalogue."""

_RECORD_OF: dict[int, type] = {id(table): record for record, table in SECTION_FIELDS.items()}


def scenario_json_schema() -> dict[str, Any]:
    """The scenario file format as a JSON Schema document (a plain dict, JSON-serialisable)."""
    schema = _table(_FILE, title="aiqsim scenario file")
    rules = "\n".join(f"- {rule}" for rule in RULES_NOT_IN_SCHEMA)
    schema["description"] = (
        "A scenario for aiqsim (https://github.com/aiqsim): providers, client quotas, policies, "
        "workloads, crashes, horizon and seed. Generated from the loader's spec tables by `aiqsim schema`. "
        "Units are in the key names (_s seconds, _per_min per minute, _prob a probability). TOML has no "
        'null: "none" switches an optional setting off.\n'
        "`aiqsim validate FILE` also checks what this schema cannot express:\n" + rules
    )
    return {"$schema": "http://json-schema.org/draft-07/schema#", **schema}


def scenario_schema_text() -> str:
    """The schema as the shipped file holds it (sorted keys are not used: the order is the loader's)."""
    return json.dumps(scenario_json_schema(), indent=2, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------------------------------------
# One function per kind of spec


def _node(spec: Any, default: Any = dataclasses.MISSING) -> dict[str, Any]:
    """The schema of one value spec (a check, a table, an array or a map of tables)."""
    if isinstance(spec, _Table):
        return _table(spec)
    if isinstance(spec, _Array):
        return {"type": "array", "description": spec.expected, "items": _table(spec.item)}
    if isinstance(spec, _Map):
        item = _table(spec.item) if isinstance(spec.item, _Table) else _check(spec.item)
        return {"type": "object", "description": spec.expected, "additionalProperties": item}
    node = _check(spec)
    node["description"] = f"expected {spec.expected}"
    if default is not dataclasses.MISSING:
        shown = _json_default(spec, default)
        if shown is not None:
            node["default"] = shown
    return node


def _check(spec: Any) -> dict[str, Any]:
    """The constraint part of a value check (no description)."""
    if isinstance(spec, _Optional):
        return {"anyOf": [_check(spec.inner), {"const": "none"}]}
    if isinstance(spec, _Number):
        node: dict[str, Any] = {"type": "number"}
        if spec.low is not None:
            node["exclusiveMinimum" if spec.low_open else "minimum"] = spec.low
        if spec.high is not None:
            node["maximum"] = spec.high
        return node
    if isinstance(spec, _Integer):
        return {
            "type": "integer",
            "minimum": -LARGEST_WHOLE if spec.low is None else spec.low,
            "maximum": LARGEST_WHOLE,
        }
    if isinstance(spec, _Boolean):
        return {"type": "boolean"}
    if isinstance(spec, _Choice):
        return {"type": "string", "enum": list(spec.options)}
    if isinstance(spec, _Text):
        node = {"type": "string"}
        if spec.name_like:
            node["pattern"] = _anchored(_NAME.pattern)
        elif spec.non_empty:
            node["pattern"] = r"\S"
        return node
    if isinstance(spec, _Names):
        return {
            "type": "array",
            "items": {"type": "string", "pattern": _anchored(_NAME.pattern)},
            "uniqueItems": True,
        }
    if isinstance(spec, _Prices):
        return {"type": "object", "additionalProperties": {"type": "number", "minimum": 0}}
    if isinstance(spec, _Weights):
        return {"type": "array", "items": {"type": "number", "exclusiveMinimum": 0}}
    raise TypeError(f"no JSON Schema for the spec {spec!r}")  # a new kind of check: teach it here


def _table(spec: _Table, title: str = "") -> dict[str, Any]:
    """An object with exactly the table's keys; a variant table (``type``, ``dist``) narrows them."""
    defaults = _defaults(spec)
    node: dict[str, Any] = {"type": "object", "title": title or spec.what}
    node["properties"] = {
        key: _node(check, defaults.get(key, dataclasses.MISSING)) for key, check in spec.fields.items()
    }
    node["additionalProperties"] = False
    if spec.required:
        node["required"] = [key for key in spec.fields if key in spec.required]
    if spec.variant_key is not None:
        node["allOf"] = [_variant(spec, variant) for variant in spec.variants]
    if spec.one_of:  # exactly one of them: both match two branches, neither matches none
        node["oneOf"] = [{"required": [key]} for key in spec.one_of]
        for key in spec.one_of:
            others = " or ".join(f"`{other}`" for other in spec.one_of if other != key)
            node["properties"][key]["description"] += f" (or {others} instead: exactly one of them)"
    return node


def _variant(spec: _Table, variant: str) -> dict[str, Any]:
    """``if`` the variant key selects ``variant`` (or is absent and it is the default), ``then`` its keys."""
    key = spec.variant_key
    assert key is not None
    selects: dict[str, Any] = {"properties": {key: {"const": variant}}, "required": [key]}
    if variant == spec.variant_default:
        selects = {"anyOf": [selects, {"not": {"required": [key]}}]}
    allowed = [name for name in spec.fields if name in spec.variants[variant]]
    then: dict[str, Any] = {"propertyNames": {"enum": allowed}}
    needed = spec.required_by_variant.get(variant)
    if needed:
        then["required"] = sorted(needed)
    return {"if": selects, "then": then}


def _defaults(spec: _Table) -> dict[str, Any]:
    """Field defaults of the config record this table builds (empty for the file itself)."""
    record = _RECORD_OF.get(id(spec))
    if record is None:
        return {}
    found = {}
    for item in dataclasses.fields(record):
        if item.default is not dataclasses.MISSING:
            found[item.name] = item.default
    return found


def _json_default(spec: Any, value: Any) -> Any:
    """A record default as a scenario file would write it, or None when it has no such form."""
    if value is None:
        return "none" if isinstance(spec, _Optional) else None
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int | float) and math.isfinite(value):
        return value
    return None


def _anchored(pattern: str) -> str:
    """JSON Schema patterns match anywhere; the loader uses ``fullmatch``."""
    return f"^(?:{pattern})$"
