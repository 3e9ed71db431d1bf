"""Scenario files: TOML in, a validated :class:`~aiqsim.sim.config.Scenario` out.

A scenario file looks like this (units are in the key names)::

    [scenario]                # name, description, seed, duration_s, drain_s, timeline_step_s
    name = "retry_storm_429"
    duration_s = 120

    [[providers]]             # one table per provider (ProviderConfig fields)
    name = "llm"
    server_requests_per_min = 120
      [[providers.outages]]   # OutageConfig: start_s, end_s, mode, slow_factor
      start_s = 30
      end_s = 40

    [quotas.llm]              # client-side quota per provider name (ClientQuotaConfig)
    concurrency = 8
    [retry]                   # RetryConfig
    [dispatch]                # DispatchConfig
    [store]                   # StoreConfig
    [[workloads]]             # WorkloadConfig, with [workloads.cost] for CostConfig
    type = "poisson"
    provider = "llm"
    [[crashes]]               # CrashConfig: exactly one of at_s / after_writes
    [[jobs]]                  # JobConfig (aiqsim/sim/job_config.py): a template of stages
      [[jobs.stages]]         # StageConfig: name, provider, after, size, fanout, fallback
    [[workloads]]             # a job workload names a template instead of a provider
    type = "poisson"
    job = "edit"
    [fleet]                   # FleetConfig: workers, quota ("shared"/"split"), routing, weights
    [tenants.acme]            # TenantConfig: weight, max_queued; a workload says tenant = "acme"

Everything is validated before a :class:`Scenario` exists: unknown keys, wrong types (a bool
is not a number), out-of-range values and broken references all raise :class:`ScenarioError`
naming the file, the dotted key path (``providers[1].timeout_prob``) and what was expected.
TOML has no null: an optional setting whose default is a value (``retry.attempt_timeout_s``)
is switched off with the string ``"none"``.

Overrides (``load_scenario(path, overrides={"retry.base_s": 0.5})`` or the CLI's
``--set retry.base_s=0.5`` through :func:`parse_override`) are applied to the raw mapping
before validation, so they are checked exactly like the file. Providers can be addressed by
name (``providers.llm.timeout_prob``) or by index (``providers[0].timeout_prob``).
"""

from __future__ import annotations

import copy
import re
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiqsim.sim.config import FleetConfig, RouteConfig, Scenario, WorkloadConfig
from aiqsim.sim.scenario.errors import ScenarioError, _join
from aiqsim.sim.scenario.errors import describe as describe
from aiqsim.sim.scenario.fleet import MAX_FLEET_WORKERS as MAX_FLEET_WORKERS
from aiqsim.sim.scenario.parse import MAX_TIMELINE_STEPS as MAX_TIMELINE_STEPS
from aiqsim.sim.scenario.parse import parse_scenario
from aiqsim.sim.scenario.providers import provider_from_table as provider_from_table
from aiqsim.sim.scenario.spec import (
    _BUDGET,
    _CRASH,
    _DISPATCH,
    _FILE,
    _FLEET,
    _JOB,
    _JOB_WORKLOAD_EXCLUDED,
    _OVERLOAD,
    _PROVIDER,
    _QUOTA,
    _RETRY,
    _ROUTE,
    _SCENARIO_SECTION,
    _STORE,
    _TENANT,
    _WORKLOAD,
    _Array,
    _Map,
    _Table,
)
from aiqsim.sim.scenario.spec import MAX_PRICE_PER_1K_UNITS as MAX_PRICE_PER_1K_UNITS
from aiqsim.sim.scenario.spec import SECTION_FIELDS as SECTION_FIELDS

__all__ = [
    "ScenarioError",
    "apply_overrides",
    "load_scenario",
    "parse_override",
    "parse_scenario",
    "scenario_to_dict",
]


_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")

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
    values are not checked here but by :func:`parse_scenario` afterwards. Two paths that address
    the same field (``providers.llm.timeout_prob`` and ``providers[0].timeout_prob``), or a field
    and the table holding it, are refused: one would silently overwrite the other, and a sweep
    would label its rows with a value that was never used.
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


def _record_dict(record: Any, schema: _Table) -> dict[str, Any]:
    allowed = list(schema.fields)
    if schema.variant_key is not None:
        variant = getattr(record, schema.variant_key)
        allowed = [name for name in schema.fields if name in schema.variants[variant]]
    values: dict[str, Any] = {}
    for key in allowed:
        value = getattr(record, key)
        sub = schema.fields[key]
        if isinstance(sub, _Table):
            value = _record_dict(value, sub)
        elif isinstance(sub, _Array):
            value = [_record_dict(item, sub.item) for item in value]
        values[key] = value
    return values


def _workload_dict(workload: WorkloadConfig) -> dict[str, Any]:
    """A workload's keys: a job workload has no provider, cost or poison share, a call workload no job."""
    values = _record_dict(workload, _WORKLOAD)
    dropped = _JOB_WORKLOAD_EXCLUDED if workload.job is not None else ("job",)
    dropped += ("provider",) if workload.route is not None else ("route",)
    if workload.tenant is None:
        dropped = (*dropped, "tenant")
    return {key: value for key, value in values.items() if key not in dropped}


def scenario_to_dict(scenario: Scenario) -> dict[str, Any]:
    """The scenario as a plain mapping in the file layout (JSON-serialisable; ``None`` for unset).

    ``parse_scenario(scenario_to_dict(s), source=s.source) == s``.
    """
    return {
        "scenario": _record_dict(scenario, _SCENARIO_SECTION),
        "providers": [_record_dict(provider, _PROVIDER) for provider in scenario.providers],
        "quotas": {name: _record_dict(quota, _QUOTA) for name, quota in scenario.quotas.items()},
        "retry": _record_dict(scenario.retry, _RETRY),
        "dispatch": _record_dict(scenario.dispatch, _DISPATCH),
        "store": _record_dict(scenario.store, _STORE),
        "workloads": [_workload_dict(workload) for workload in scenario.workloads],
        "crashes": [_record_dict(crash, _CRASH) for crash in scenario.crashes],
        "overload": _record_dict(scenario.overload, _OVERLOAD),
        "jobs": [_record_dict(job, _JOB) for job in scenario.jobs],
        "fleet": _fleet_dict(scenario.fleet),
        "routes": [_route_dict(route) for route in scenario.routes],
        "tenants": {name: _record_dict(tenant, _TENANT) for name, tenant in scenario.tenants.items()},
        "budget": {**_record_dict(scenario.budget, _BUDGET), "prices": dict(scenario.budget.prices)},
    }


def _route_dict(route: RouteConfig) -> dict[str, Any]:
    """A route's keys (``providers`` as a list, no ``weights`` when unset)."""
    values = _record_dict(route, _ROUTE)
    values["providers"] = list(route.providers)
    if route.weights is None:
        del values["weights"]
    else:
        values["weights"] = dict(route.weights)
    return values


def _fleet_dict(fleet: FleetConfig) -> dict[str, Any]:
    """The fleet's keys (``weights`` as a list, as in the file)."""
    values = _record_dict(fleet, _FLEET)
    values["weights"] = list(fleet.weights)
    return values
