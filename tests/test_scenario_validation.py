"""Scenario files: every kind of mistake is reported with file, key path and expectation;
overrides are validated the same way; the shipped scenarios all load."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
import math
import os
import pickle
import random
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiqsim.core.backoff import backoff_from_name
from aiqsim.core.token_bucket import MultiQuota, QuotaLimits
from aiqsim.scheduler.dispatch import dispatch_policy_from_name
from aiqsim.sim.config import Scenario
from aiqsim.sim.job_workloads import generate_job_arrivals
from aiqsim.sim.scenario import (
    MAX_SCENARIO_BYTES,
    SECTION_FIELDS,
    ScenarioError,
    apply_overrides,
    load_scenario,
    parse_override,
    parse_scenario,
    scenario_to_dict,
    split_key_path,
)
from aiqsim.sim.workloads import generate_arrivals

SCENARIOS_DIR = Path(__file__).resolve().parent.parent / "scenarios"


# --- a minimal TOML writer, so test cases can be written as mappings ---------------------------


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)


def to_toml(mapping: dict[str, Any]) -> str:
    lines: list[str] = []

    def emit(prefix: str, table: dict[str, Any]) -> None:
        for key, value in table.items():
            if not isinstance(value, dict) and not _is_table_array(value):
                lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
        for key, value in table.items():
            name = f"{prefix}.{_toml_key(key)}" if prefix else _toml_key(key)
            if isinstance(value, dict):
                lines.append(f"\n[{name}]")
                emit(name, value)
            elif _is_table_array(value):
                for item in value:
                    lines.append(f"\n[[{name}]]")
                    emit(name, item)

    emit("", mapping)
    return "\n".join(lines) + "\n"


# --- a valid mapping that uses every key ---------------------------------------------------------


def full_mapping() -> dict[str, Any]:
    """A valid scenario that sets every key of every table at least once."""
    return {
        "scenario": {
            "name": "everything",
            "description": "uses every key",
            "seed": 3,
            "duration_s": 60.0,
            "drain_s": 300.0,
            "timeline_step_s": 1.0,
        },
        "providers": [
            {
                "name": "llm",
                "kind": "llm",
                "latency_base_s": 0.5,
                "latency_per_unit_s": 0.01,
                "latency_sigma": 0.2,
                "server_requests_per_min": 600.0,
                "server_units_per_min": 900000.0,
                "rate_limit_prob": 0.01,
                "rate_limit_retry_after_s": 1.0,
                "server_error_prob": 0.01,
                "timeout_prob": 0.01,
                "quota_exhausted_prob": 0.0,
                "invalid_request_prob": 0.0,
                "honours_idempotency": True,
                "supports_lookup": True,
                "price_per_1k_units": 0.002,
                "outages": [{"start_s": 10.0, "end_s": 20.0, "mode": "slow", "slow_factor": 5.0}],
            },
            {
                "name": "tts",
                "kind": "tts",
                "timeout_prob": 0.05,
                "ttft_s": 0.2,
                "ttft_per_prompt_unit_s": 0.001,
                "ttft_sigma": 0.3,
                "tokens_per_s": 50.0,
                "stream_cut_prob": 0.01,
            },
        ],
        "quotas": {
            "llm": {
                "requests_per_min": 300.0,
                "units_per_min": 600000.0,
                "concurrency": 8,
                "request_burst": 20.0,
                "unit_burst": 50000.0,
            },
            "tts": {"concurrency": 2},
        },
        "retry": {
            "strategy": "full_jitter",
            "base_s": 0.5,
            "cap_s": 20.0,
            "max_attempts": 4,
            "attempt_timeout_s": 15.0,
            "honour_retry_after": True,
        },
        "dispatch": {
            "policy": "sjf_aging",
            "max_wait_s": 20.0,
            "interactive_limit": 10,
            "background_limit": 500,
        },
        "store": {
            "kind": "json",
            "path": "tasks.json",
            "requeue_interrupted": False,
            "reconcile_on_restart": True,
        },
        "workloads": [
            {
                "type": "poisson",
                "provider": "llm",
                "priority": "background",
                "rate_per_s": 2.0,
                "start_s": 0.0,
                "end_s": 50.0,
                "count": 80,
                "distinct_inputs": 30,
                "poison_fraction": 0.1,
                "cost": {"dist": "lognormal", "mean": 400.0, "sigma": 0.5, "output_fraction": 0.2},
            },
            {
                "type": "burst",
                "provider": "tts",
                "priority": "background",
                "count": 20,
                "start_s": 5.0,
                "burst_s": 2.0,
                "cost": {"dist": "uniform", "low": 10.0, "high": 200.0, "output_fraction": 1.0},
            },
            {
                "type": "double_click",
                "provider": "llm",
                "priority": "interactive",
                "rate_per_s": 0.5,
                "end_s": 40.0,
                "clicks": 3,
                "click_gap_s": 0.1,
                "cost": {"dist": "fixed", "mean": 300.0, "output_fraction": 0.3},
            },
            {
                "type": "trace",
                "provider": "llm",
                "trace": "azure_code",
                "speedup": 20.0,
                "count": 300,
                "start_s": 1.0,
                "end_s": 59.0,
                "poison_fraction": 0.0,
                "priority": "background",
            },
            {"type": "burst", "route": "gpt", "count": 5, "start_s": 2.0},
        ],
        "crashes": [
            {"at_s": 25.0, "restart_after_s": 3.0, "torn_write": True},
            {"after_writes": 200, "restart_after_s": 1.0, "torn_write": False},
        ],
        "routes": [
            {
                "name": "gpt",
                "providers": ["llm"],
                "policy": "weighted",
                "weights": {"llm": 2.0},
                "retry_elsewhere": False,
            }
        ],
    }


def leaf_paths(node: Any, path: str = "") -> list[str]:
    """Dotted paths (with [i] indices) of every scalar value in a mapping."""
    if isinstance(node, dict):
        out = []
        for key, value in node.items():
            out += leaf_paths(value, f"{path}.{key}" if path else key)
        return out
    if isinstance(node, list):
        out = []
        for i, value in enumerate(node):
            out += leaf_paths(value, f"{path}[{i}]")
        return out
    return [path]


def table_paths(node: Any, path: str = "") -> list[str]:
    """Paths of every table and array in a mapping (not the top level)."""
    out = []
    if isinstance(node, dict):
        for key, value in node.items():
            child = f"{path}.{key}" if path else key
            if isinstance(value, dict | list):
                out.append(child)
                out += table_paths(value, child)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out.append(f"{path}[{i}]")
            out += table_paths(value, f"{path}[{i}]")
    return out


def set_path(mapping: dict[str, Any], path: str, value: Any) -> None:
    parts = split_key_path(path)
    node: Any = mapping
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value


def delete_path(mapping: dict[str, Any], path: str) -> None:
    parts = split_key_path(path)
    node: Any = mapping
    for part in parts[:-1]:
        node = node[part]
    del node[parts[-1]]


def write(tmp_path: Path, mapping: dict[str, Any], name: str = "case.toml") -> Path:
    path = tmp_path / name
    path.write_text(to_toml(mapping), encoding="utf-8")
    return path


def test_full_mapping_is_valid_and_the_writer_round_trips(tmp_path):
    import tomllib

    mapping = full_mapping()
    assert tomllib.loads(to_toml(mapping)) == mapping
    scenario = load_scenario(write(tmp_path, mapping))
    assert isinstance(scenario, Scenario)
    assert scenario.name == "everything"
    assert scenario.providers[0].outages[0].mode == "slow"
    assert scenario.quotas["llm"].concurrency == 8
    assert [w.type for w in scenario.workloads] == ["poisson", "burst", "double_click", "trace", "burst"]
    assert scenario.workloads[1].cost.dist == "uniform"
    assert scenario.crashes[1].after_writes == 200
    assert scenario.source == str(tmp_path / "case.toml")


def test_every_config_field_has_a_key_in_the_file_layout():
    """If a field is added to aiqsim.sim.config, the loader must learn it (and vice versa)."""
    top_level = {
        *("providers", "workloads", "quotas", "retry", "dispatch", "store", "crashes", "overload", "source"),
        "jobs",
        "fleet",
        "routes",
        "tenants",
        "budget",
    }
    for record, table in SECTION_FIELDS.items():
        names = {f.name for f in dataclasses.fields(record)}
        if record is Scenario:
            names -= top_level
        assert set(table.fields) == names, record.__name__


# --- the catalogue of mistakes: one case per kind ---------------------------------------------


def mutate(*changes: tuple[str, Any]):
    """A mutation setting each path to a value (value DELETE removes the key)."""

    def apply(mapping: dict[str, Any]) -> None:
        for path, value in changes:
            if value is DELETE:
                delete_path(mapping, path)
            else:
                set_path(mapping, path, value)

    return apply


DELETE = object()

CATALOGUE = [
    # (id, mutation, expected key path, fragments the message must contain)
    ("unknown_top_level_table", mutate(("retries", {"base_s": 1})), "retries", ["unknown key", "retry"]),
    (
        "unknown_key_lists_allowed_keys",
        mutate(("retry.bse_s", 1.0)),
        "retry.bse_s",
        ["unknown key", "base_s", "cap_s", "max_attempts"],
    ),
    (
        "misspelled_provider_key",
        mutate(("providers[1].timout_prob", 0.1)),
        "providers[1].timout_prob",
        ["unknown key", "timeout_prob"],
    ),
    (
        "string_for_number",
        mutate(("retry.base_s", "fast")),
        "retry.base_s",
        ['expected a number >= 0, got "fast"'],
    ),
    (
        "bool_is_not_a_number",
        mutate(("providers[0].latency_base_s", True)),
        "providers[0].latency_base_s",
        ["expected a number >= 0, got true"],
    ),
    (
        "probability_above_one",
        mutate(("providers[1].timeout_prob", 1.5)),
        "providers[1].timeout_prob",
        ["expected a number in [0, 1], got 1.5"],
    ),
    (
        "negative_probability",
        mutate(("providers[0].rate_limit_prob", -0.1)),
        "providers[0].rate_limit_prob",
        ["in [0, 1]", "-0.1"],
    ),
    (
        "absurd_price",  # regression: 1e308 passed, then the run's cost overflowed to inf
        mutate(("providers[0].price_per_1k_units", 1e308)),
        "providers[0].price_per_1k_units",
        ["expected a number in [0, 1e+06], got 1e+308"],
    ),
    (
        "negative_duration",
        mutate(("scenario.duration_s", -1)),
        "scenario.duration_s",
        ["expected a number > 0, got -1"],
    ),
    ("negative_drain", mutate(("scenario.drain_s", -5.0)), "scenario.drain_s", ["expected a number >= 0"]),
    ("nan_is_not_a_number", mutate(("retry.cap_s", math.nan)), "retry.cap_s", ["got nan"]),
    ("inf_is_not_a_number", mutate(("scenario.duration_s", math.inf)), "scenario.duration_s", ["got inf"]),
    (
        "count_below_one",
        mutate(("workloads[1].count", 0)),
        "workloads[1].count",
        ["an integer >= 1", "got 0"],
    ),
    (
        "float_for_integer",
        mutate(("retry.max_attempts", 2.5)),
        "retry.max_attempts",
        ["expected an integer >= 1, got 2.5"],
    ),
    (
        "concurrency_zero",
        mutate(("quotas.llm.concurrency", 0)),
        "quotas.llm.concurrency",
        ["an integer >= 1", "got 0"],
    ),
    (
        "cap_below_base",
        mutate(("retry.base_s", 5.0), ("retry.cap_s", 1.0)),
        "retry.cap_s",
        ["cap_s >= base_s", "cap_s = 1", "base_s = 5"],
    ),
    (
        "outage_ends_before_it_starts",
        mutate(("providers[0].outages[0].end_s", 10.0)),
        "providers[0].outages[0].end_s",
        ["expected a number > start_s (10), got 10.0"],
    ),
    (
        "outage_without_end",
        mutate(("providers[0].outages[0].end_s", DELETE)),
        "providers[0].outages[0].end_s",
        ["missing", "a number >= 0"],
    ),
    (
        "outage_unknown_mode",
        mutate(("providers[0].outages[0].mode", "down")),
        "providers[0].outages[0].mode",
        ['one of "error", "slow"', '"down"'],
    ),
    (
        "workload_names_unknown_provider",
        mutate(("workloads[0].provider", "gpt")),
        "workloads[0].provider",
        ["a declared provider (llm, tts)", '"gpt"'],
    ),
    (
        "quota_names_unknown_provider",
        mutate(("quotas.image", {"concurrency": 2})),
        "quotas.image",
        ["a declared provider (llm, tts)", '"image"'],
    ),
    (
        "duplicate_provider_names",
        mutate(("providers[1].name", "llm")),
        "providers[1].name",
        ["unique provider name", '"llm"', "providers[0]"],
    ),
    (
        "provider_name_with_a_dot",
        mutate(("providers[0].name", "open.ai")),
        "providers[0].name",
        ["a name (letters, digits"],
    ),
    ("provider_without_name", mutate(("providers[1].name", DELETE)), "providers[1].name", ["missing"]),
    (
        "unknown_provider_kind",
        mutate(("providers[1].kind", "image")),
        "providers[1].kind",
        ['one of "llm", "tts"'],
    ),
    (
        "trace_workload_without_trace",
        mutate(("workloads[3].trace", DELETE)),
        "workloads[3].trace",
        ["missing", "a trace workload needs it"],
    ),
    (
        "trace_file_does_not_exist",
        mutate(("workloads[3].trace", "nowhere/trace.csv")),
        "workloads[3].trace",
        ['"azure_code" or the path of a CSV file', "no such file"],
    ),
    (
        "trace_file_is_a_directory",  # was reported as "no such file"
        mutate(("workloads[3].trace", ".")),
        "workloads[3].trace",
        ['"azure_code" or the path of a CSV file', "(a directory: "],
    ),
    (
        "burst_without_count",
        mutate(("workloads[1].count", DELETE)),
        "workloads[1].count",
        ["missing", "a burst workload needs it", "an integer >= 1"],
    ),
    (
        "poisson_rate_zero",
        mutate(("workloads[0].rate_per_s", 0)),
        "workloads[0].rate_per_s",
        ["a number > 0"],
    ),
    (  # every click is an arrival: 0.5/s over 40 s is few actions, but 500,000 clicks each are not
        "double_click_clicks_past_the_arrival_limit",
        mutate(("workloads[2].clicks", 500_000)),
        "workloads[2].clicks",
        ["clicks 500,000 times rate_per_s 0.5 over 40 s", "at most 2,000,000 fit"],
    ),
    (
        "double_click_count_times_clicks_past_the_arrival_limit",
        mutate(
            ("workloads[2].count", 1_000), ("workloads[2].rate_per_s", 1e9), ("workloads[2].clicks", 3_000)
        ),
        "workloads[2].clicks",
        ["clicks 3,000 times count 1,000 means", "3,000,000 arrivals", "at most 2,000,000 fit"],
    ),
    (  # a fraction of a request per minute passed here, then the simulated provider refused it
        "server_requests_per_min_below_one",
        mutate(("providers[0].server_requests_per_min", 0.5)),
        "providers[0].server_requests_per_min",
        ['expected a number >= 1 or "none", got 0.5'],
    ),
    (
        "server_units_per_min_below_one",
        mutate(("providers[1].server_units_per_min", 0.25)),
        "providers[1].server_units_per_min",
        ['expected a number >= 1 or "none", got 0.25'],
    ),
    (
        "key_that_does_not_apply_to_the_type",
        mutate(("workloads[0].clicks", 2)),
        "workloads[0].clicks",
        ["does not apply to a poisson workload", "rate_per_s"],
    ),
    (
        "cost_key_that_does_not_apply_to_the_dist",
        mutate(("workloads[2].cost.sigma", 0.5)),
        "workloads[2].cost.sigma",
        ["does not apply to a fixed cost distribution", "mean"],
    ),
    (
        "trace_workload_with_a_cost",
        mutate(("workloads[3].cost", {"dist": "fixed", "mean": 5})),
        "workloads[3].cost",
        ["does not apply to a trace workload"],
    ),
    (
        "unknown_workload_type",
        mutate(("workloads[0].type", "steady")),
        "workloads[0].type",
        ['one of "poisson", "burst", "double_click", "trace"', '"steady"'],
    ),
    ("workload_without_type", mutate(("workloads[0].type", DELETE)), "workloads[0].type", ["missing"]),
    (
        "uniform_high_below_low",
        mutate(("workloads[1].cost.high", 5.0)),
        "workloads[1].cost.high",
        ["a number >= low (10)", "got 5.0"],
    ),
    (
        "end_before_start",
        mutate(("workloads[2].start_s", 30.0), ("workloads[2].end_s", 20.0)),
        "workloads[2].end_s",
        ["a number > start_s (30)"],
    ),
    (
        "workload_starts_after_the_scenario",
        mutate(("workloads[1].start_s", 90.0)),
        "workloads[1].start_s",
        ["< scenario.duration_s (60)"],
    ),
    (
        "task_larger_than_the_client_quota",
        mutate(("workloads[2].cost.mean", 60000.0)),
        "workloads[2].cost.mean",
        ["at most 50000 units", "quotas.llm.unit_burst"],
    ),
    (
        "burst_without_its_rate",
        mutate(("quotas.llm.units_per_min", DELETE)),
        "quotas.llm.unit_burst",
        ["only applies together with units_per_min"],
    ),
    (
        "unknown_backoff_strategy",
        mutate(("retry.strategy", "fibonacci")),
        "retry.strategy",
        ['"full_jitter"', '"decorrelated_jitter"', '"fibonacci"'],
    ),
    (
        "unknown_dispatch_policy",
        mutate(("dispatch.policy", "lifo")),
        "dispatch.policy",
        ['"fifo"', '"sjf"', '"sjf_aging"', '"lifo"'],
    ),
    (
        "unknown_store_kind",
        mutate(("store.kind", "redis"), ("store.path", DELETE)),
        "store.kind",
        ['"memory", "json", "sqlite"'],
    ),
    (
        "store_path_for_memory_store",
        mutate(("store.kind", "memory"), ("crashes[0].torn_write", False)),
        "store.path",
        ["does not apply to the memory store"],
    ),
    (  # no file system takes a NUL: the store's open() raised a raw ValueError mid-run
        "store_path_with_a_nul_character",
        mutate(("store.path", "tasks\x00.json")),
        "store.path",
        ['expected a file path, got "tasks\\u0000.json" (it holds a NUL character)'],
    ),
    (
        "crash_with_both_triggers",
        mutate(("crashes[0].after_writes", 10)),
        "crashes[0]",
        ["exactly one of at_s or after_writes, got both"],
    ),
    (
        "crash_with_no_trigger",
        mutate(("crashes[1].after_writes", DELETE)),
        "crashes[1]",
        ["exactly one of at_s or after_writes, got neither"],
    ),
    (
        "torn_write_needs_the_json_store",
        mutate(("store.kind", "sqlite"), ("store.path", "t.db")),
        "crashes[0].torn_write",
        ["only applies to the json store", '"sqlite"'],
    ),
    (
        "crash_after_the_run_is_over",
        mutate(("crashes[0].at_s", 1000.0)),
        "crashes[0].at_s",
        ["<= duration_s + drain_s (360)"],
    ),
    (
        "scenario_without_name",
        mutate(("scenario.name", DELETE)),
        "scenario.name",
        ["missing", "a non-empty string"],
    ),
    ("missing_scenario_table", mutate(("scenario", DELETE)), "scenario", ["missing", "a table"]),
    ("missing_providers", mutate(("providers", DELETE)), "providers", ["missing", "[[providers]]"]),
    ("empty_providers", mutate(("providers", [])), "providers", ["at least one [[providers]]"]),
    ("empty_workloads", mutate(("workloads", [])), "workloads", ["at least one [[workloads]]"]),
    (
        "providers_is_not_an_array",
        mutate(("providers", "llm")),
        "providers",
        ['an array of tables ([[providers]]), got "llm"'],
    ),
    ("section_is_not_a_table", mutate(("retry", 3)), "retry", ["expected a table, got 3"]),
    (
        # before: validate said ok and run failed with QuotaLimits' message, naming no file or key
        "request_rate_below_one_per_minute_without_a_burst",
        mutate(("quotas.llm.requests_per_min", 0.5), ("quotas.llm.request_burst", DELETE)),
        "quotas.llm.requests_per_min",
        ["of at least 1, got 0.5", "never grants one"],
    ),
    (
        "table_where_a_value_belongs",
        mutate(("dispatch.max_wait_s", {"value": 3})),
        "dispatch.max_wait_s",
        ["got a table"],
    ),
    ("array_where_a_value_belongs", mutate(("scenario.seed", [1, 2])), "scenario.seed", ["got an array"]),
    (
        "stream_model_without_its_rate",
        mutate(("providers[1].tokens_per_s", DELETE)),
        "providers[1].tokens_per_s",
        ["expected a number > 0 (output units per second) with ttft_s set", "got none"],
    ),
    (
        "stream_model_without_its_first_token_time",
        mutate(("providers[1].ttft_s", "none")),
        "providers[1].ttft_s",
        ["expected a number >= 0 with tokens_per_s set"],
    ),
    (
        "stream_key_without_the_stream_model",
        mutate(("providers[0].stream_cut_prob", 0.1)),
        "providers[0].stream_cut_prob",
        ["expected 0 (unset) without the stream model", "got 0.1"],
    ),
    (
        "per_unit_latency_with_the_stream_model",
        mutate(("providers[1].latency_per_unit_s", 0.02)),
        "providers[1].latency_per_unit_s",
        ["expected unset with the stream model", "got 0.02"],
    ),
    (
        "token_rate_zero",
        mutate(("providers[1].tokens_per_s", 0)),
        "providers[1].tokens_per_s",
        ['expected a number > 0 or "none", got 0'],
    ),
    (
        "first_token_spread_too_wide",
        mutate(("providers[1].ttft_sigma", 25.0)),
        "providers[1].ttft_sigma",
        ["expected a number in [0, 20], got 25.0"],
    ),
    (
        "none_where_a_value_is_required",
        mutate(("retry.max_attempts", "none")),
        "retry.max_attempts",
        ['expected an integer >= 1, got "none"'],
    ),
]


@pytest.mark.parametrize(
    ("mutation", "key_path", "fragments"), [c[1:] for c in CATALOGUE], ids=[c[0] for c in CATALOGUE]
)
def test_catalogue_of_mistakes(tmp_path, mutation, key_path, fragments):
    mapping = full_mapping()
    mutation(mapping)
    path = write(tmp_path, mapping, "broken.toml")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    error = caught.value
    message = str(error)
    assert error.file == str(path)
    assert error.key_path == key_path
    assert message.startswith(f"{path}: {key_path}: ")
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_message_reads_file_key_path_expected_got(tmp_path):
    path = tmp_path / "x.toml"
    mapping = full_mapping()
    mapping["retry"]["base_s"] = "fast"
    path.write_text(to_toml(mapping))
    with pytest.raises(
        ScenarioError, match=re.escape(f'{path}: retry.base_s: expected a number >= 0, got "fast"')
    ):
        load_scenario(path)


def test_toml_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "syntax.toml"
    path.write_text('[scenario]\nname = "x"\n\n[retry]\nbase_s = = 1\n', encoding="utf-8")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert caught.value.line == 5
    assert str(caught.value).startswith(f"{path}: line 5, column")
    assert "invalid TOML" in str(caught.value)


def test_duplicate_toml_table_is_a_syntax_error_with_its_line(tmp_path):
    path = tmp_path / "dup.toml"
    path.write_text('[scenario]\nname = "x"\n[scenario]\nname = "y"\n', encoding="utf-8")
    with pytest.raises(ScenarioError, match=r"dup\.toml: line 3, column \d+: invalid TOML"):
        load_scenario(path)


def test_missing_file_and_directory_and_non_utf8(tmp_path):
    with pytest.raises(ScenarioError, match=re.escape(f"{tmp_path / 'nope.toml'}: no such file")):
        load_scenario(tmp_path / "nope.toml")
    with pytest.raises(ScenarioError, match="is a directory"):
        load_scenario(tmp_path)
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'[scenario]\nname = "caf\xe9"\n')
    with pytest.raises(ScenarioError, match="not UTF-8"):
        load_scenario(latin)


def test_what_is_no_regular_file_or_too_large_is_refused_without_reading_it_all(tmp_path):
    """A FIFO blocked the loader for ever; /dev/zero was read until memory ran out."""
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(ScenarioError, match=r"fifo\.toml: is not a regular file"):
        load_scenario(fifo)
    with pytest.raises(ScenarioError, match="is not a regular file"):
        load_scenario("/dev/zero")
    huge = tmp_path / "huge.toml"
    with huge.open("wb") as handle:
        handle.truncate(MAX_SCENARIO_BYTES + 1)  # sparse: no disk used
    with pytest.raises(ScenarioError, match=r"huge\.toml: larger than 16 MiB"):
        load_scenario(huge)


def test_an_integer_too_long_for_python_is_a_scenario_error(tmp_path):
    """tomllib raised a bare ValueError (int max str digits, 4300) for a 5000-digit seed."""
    path = tmp_path / "digits.toml"
    path.write_text(f'[scenario]\nname = "x"\nseed = 1{"0" * 5000}\n', encoding="utf-8")
    with pytest.raises(ScenarioError, match=r"digits\.toml: a number is too long to read"):
        load_scenario(path)
    with pytest.raises(ScenarioError, match=r"<override>: scenario\.seed: a number is too long to read"):
        parse_override(f"scenario.seed=1{'0' * 5000}")


def test_a_utf8_byte_order_mark_is_accepted(tmp_path):
    """Regression: a file saved with a BOM (Windows Notepad) was 'line 1, column 1: invalid TOML'."""
    mapping = full_mapping()
    plain = write(tmp_path, mapping, "plain.toml")
    with_bom = tmp_path / "bom.toml"
    with_bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert load_scenario(with_bom) == dataclasses.replace(load_scenario(plain), source=str(with_bom))
    broken = tmp_path / "broken.toml"  # errors after the mark still point at the right line
    broken.write_bytes(b'\xef\xbb\xbf[scenario]\nname = = "x"\n')
    with pytest.raises(ScenarioError, match=r"line 2, column \d+: invalid TOML"):
        load_scenario(broken)


@pytest.mark.parametrize(
    ("value", "key_path"),
    [
        ("[" * 40 + "]" * 40, "scenario.description"),  # parses, but deeper than a scenario can be
        ("[" * 1000 + "]" * 1000, ""),  # too deep for the TOML parser's recursion
        ("{a=" * 1000 + "1" + "}" * 1000, ""),  # inline tables likewise
    ],
    ids=["arrays_40", "arrays_1000", "inline_tables_1000"],
)
def test_deeply_nested_toml_is_a_scenario_error_naming_the_file(tmp_path, value, key_path):
    """Regression: nesting past Python's recursion limit raised RecursionError from every command."""
    path = tmp_path / "deep.toml"
    path.write_text(f'[scenario]\nname = "x"\ndescription = {value}\n', encoding="utf-8")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert caught.value.file == str(path) and caught.value.key_path == key_path
    assert "nesting too deep: expected at most 32 levels" in str(caught.value)


@pytest.mark.parametrize("depth", [40, 1000])
def test_deeply_nested_override_is_a_scenario_error_naming_the_key(depth):
    with pytest.raises(ScenarioError) as caught:
        parse_override("retry.base_s=" + "[" * depth + "]" * depth)
    assert str(caught.value).startswith("<override>: retry.base_s: nesting too deep")


def test_trace_file_with_wrong_columns(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("time,prompt,output\n2024-01-01 00:00:00.0,1,1\n")
    mapping = full_mapping()
    mapping["workloads"][3]["trace"] = "trace.csv"  # relative to the scenario file
    with pytest.raises(ScenarioError) as caught:
        load_scenario(write(tmp_path, mapping))
    assert caught.value.key_path == "workloads[3].trace"
    assert "lacks column(s) TIMESTAMP, ContextTokens, GeneratedTokens" in str(caught.value)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            b"TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01 00:00:00.0,5,-6\n",
            "line 2: negative token count",
        ),
        (b"TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01 00:00:00.0,5,six\n", "line 2: cannot parse"),
        (b"TIMESTAMP,ContextTokens,GeneratedTokens\n", "has a header but no rows"),
        (b"TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01 00:00:00.0,5,\xff\n", "is not UTF-8 text"),
        (
            b"TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01 00:00:00.0,5," + b"9" * 200_000 + b"\n",
            "is not a readable CSV file: field larger than field limit",
        ),
    ],
    ids=["negative-tokens", "unparseable-row", "no-rows", "not-utf8", "field-too-large"],
)
def test_a_bad_trace_row_is_caught_when_the_scenario_loads(tmp_path, content: bytes, expected: str):
    """Loading (and so ``aiqsim validate``) reads every row, not just the header: a file that
    validates must not fail later in ``aiqsim run``."""
    (tmp_path / "trace.csv").write_bytes(content)
    mapping = full_mapping()
    mapping["workloads"][3]["trace"] = "trace.csv"
    with pytest.raises(ScenarioError) as caught:
        load_scenario(write(tmp_path, mapping))
    assert caught.value.key_path == "workloads[3].trace"
    assert expected in str(caught.value)


def test_relative_trace_path_resolves_against_the_scenario_file(tmp_path):
    folder = tmp_path / "sub"
    folder.mkdir()
    (folder / "mine.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-01-01 00:00:00.0000000,5,6\n"
        "2024-01-01 00:00:01.0000000,7,8\n"
    )
    mapping = full_mapping()
    mapping["workloads"][3]["trace"] = "mine.csv"
    scenario = load_scenario(write(folder, mapping))
    assert scenario.workloads[3].trace == str((folder / "mine.csv").resolve())
    arrivals = [a for a in generate_arrivals(scenario, random.Random(0)) if a.task_id.startswith("w3-")]
    assert [(a.payload["prompt_units"], a.payload["output_units"]) for a in arrivals] == [(5, 6), (7, 8)]


def test_none_switches_off_optional_settings(tmp_path):
    mapping = full_mapping()
    mapping["retry"]["attempt_timeout_s"] = "none"
    mapping["providers"][0]["rate_limit_retry_after_s"] = "none"
    mapping["dispatch"]["interactive_limit"] = "none"
    scenario = load_scenario(write(tmp_path, mapping))
    assert scenario.retry.attempt_timeout_s is None
    assert scenario.providers[0].rate_limit_retry_after_s is None
    assert scenario.dispatch.interactive_limit is None


def test_parse_scenario_accepts_python_mappings_and_rejects_non_mappings():
    mapping = full_mapping()
    mapping["retry"]["attempt_timeout_s"] = None
    mapping["providers"] = tuple(mapping["providers"])
    scenario = parse_scenario(mapping, source="inline")
    assert scenario.retry.attempt_timeout_s is None
    assert scenario.source == "inline"
    with pytest.raises(ScenarioError, match=r"^inline: \(top level\): expected a table, got an array"):
        parse_scenario([1, 2], source="inline")  # type: ignore[arg-type]


def test_scenario_error_pickles_and_is_a_value_error():
    error = ScenarioError("a.toml", "retry.base_s", "expected a number >= 0, got -1")
    again = pickle.loads(pickle.dumps(error))
    assert isinstance(again, ValueError)
    assert (again.file, again.key_path, again.message, str(again)) == (
        "a.toml",
        "retry.base_s",
        "expected a number >= 0, got -1",
        "a.toml: retry.base_s: expected a number >= 0, got -1",
    )


# --- overrides --------------------------------------------------------------------------------


def test_overrides_address_providers_by_name_or_index_and_reach_every_section(tmp_path):
    path = write(tmp_path, full_mapping())
    scenario = load_scenario(
        path,
        overrides={
            "retry.base_s": 0.25,
            "dispatch.policy": "sjf",
            "providers.llm.rate_limit_prob": 0.2,
            "providers[1].timeout_prob": 0.3,
            "providers.llm.outages[0].end_s": 30.0,
            "quotas.llm.concurrency": 16,
            "quotas.tts.requests_per_min": 30,
            "workloads[0].rate_per_s": 3,
            "workloads.2.cost.mean": 100,
            "crashes[1].after_writes": 7,
            "scenario.seed": 99,
        },
    )
    assert scenario.retry.base_s == 0.25
    assert scenario.dispatch.policy == "sjf"
    assert scenario.provider("llm").rate_limit_prob == 0.2
    assert scenario.provider("tts").timeout_prob == 0.3
    assert scenario.provider("llm").outages[0].end_s == 30.0
    assert scenario.quotas["llm"].concurrency == 16
    assert scenario.quotas["tts"].requests_per_min == 30.0
    assert scenario.workloads[0].rate_per_s == 3.0
    assert scenario.workloads[2].cost.mean == 100.0
    assert scenario.crashes[1].after_writes == 7
    assert scenario.seed == 99


def test_overrides_create_missing_tables(tmp_path):
    mapping = full_mapping()
    del mapping["quotas"], mapping["retry"]
    scenario = load_scenario(
        write(tmp_path, mapping), overrides={"quotas.tts.concurrency": 3, "retry.strategy": "none"}
    )
    assert scenario.quotas == {"tts": scenario.quotas["tts"]}
    assert scenario.quotas["tts"].concurrency == 3
    assert scenario.retry.strategy == "none"


def test_override_values_are_validated_like_the_file(tmp_path):
    mapping = full_mapping()
    path = write(tmp_path, mapping, "base.toml")
    mapping["retry"]["base_s"] = "fast"
    broken = write(tmp_path, mapping, "base2.toml")
    with pytest.raises(ScenarioError) as from_file:
        load_scenario(broken)
    with pytest.raises(ScenarioError) as from_override:
        load_scenario(path, overrides={"retry.base_s": "fast"})
    assert from_file.value.key_path == from_override.value.key_path == "retry.base_s"
    assert from_file.value.message == from_override.value.message
    with pytest.raises(
        ScenarioError, match=r"providers\[0\]\.timeout_prob: expected a number in \[0, 1\], got 2"
    ):
        load_scenario(path, overrides={"providers.llm.timeout_prob": 2})
    with pytest.raises(ScenarioError, match=r"quotas\.gpt: expected the name of a declared provider"):
        load_scenario(path, overrides={"quotas.gpt.concurrency": 2})
    with pytest.raises(ScenarioError, match=r"workloads\[0\]\.clicks: does not apply to a poisson workload"):
        load_scenario(path, overrides={"workloads[0].clicks": 2})


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("retry.bse_s", "retry has no key 'bse_s'"),
        ("retries.base_s", "has no key 'retries'"),
        ("providers.gpt.timeout_prob", "no providers entry named 'gpt'; declared: llm, tts"),
        ("providers[5].timeout_prob", "providers[5] does not exist; the scenario has 2"),
        ("workloads.llm.rate_per_s", "addressed by index"),
        ("scenario.name.first", "scenario.name is a single value"),
        ("providers.llm.outages[3].end_s", "outages[3] does not exist"),
        ("workloads[0].cost.shape", "has no key 'shape'"),
        ("retry..base_s", "cannot parse the key path"),
        ("retry.base_s.", "cannot parse the key path"),
        ("", "cannot parse the key path"),
    ],
)
def test_unknown_override_paths_are_errors_naming_the_path(tmp_path, path, fragment):
    scenario_file = write(tmp_path, full_mapping())
    with pytest.raises(ScenarioError) as caught:
        load_scenario(scenario_file, overrides={path: 1})
    assert caught.value.key_path == path
    assert fragment in str(caught.value)


def test_overrides_on_arrays_the_file_does_not_have(tmp_path):
    mapping = full_mapping()
    del mapping["crashes"]
    with pytest.raises(
        ScenarioError, match=r"crashes\[0\]\.at_s: unknown override path: .*no \[\[crashes\]\]"
    ):
        load_scenario(write(tmp_path, mapping), overrides={"crashes[0].at_s": 3})


def test_override_errors_render_a_nested_path_once():
    """Regression: the walked path was doubled after an index (``providers[0]providers[0].outages[3]``)."""
    mapping = full_mapping()
    with pytest.raises(ScenarioError) as caught:
        apply_overrides(mapping, {"providers.llm.outages[3].start_s": 1})
    assert "unknown override path: providers[0].outages[3] does not exist" in str(caught.value)


def test_apply_overrides_refuses_a_non_table():
    with pytest.raises(ScenarioError, match="expected a table at the top level, got an array"):
        apply_overrides([1], {"retry.base_s": 1})  # type: ignore[arg-type]


def test_apply_overrides_leaves_the_input_untouched():
    mapping = full_mapping()
    before = copy.deepcopy(mapping)
    changed = apply_overrides(mapping, {"providers.llm.timeout_prob": 0.5, "quotas.tts.concurrency": 4})
    assert mapping == before
    assert changed["providers"][0]["timeout_prob"] == 0.5


@pytest.mark.parametrize(
    ("first", "second", "fragment"),
    [
        ("providers.llm.timeout_prob", "providers[0].timeout_prob", "the same field as providers.llm"),
        ("workloads.0.rate_per_s", "workloads[0].rate_per_s", "the same field as workloads.0.rate_per_s"),
        ("quotas.llm.concurrency", "quotas.llm", "overlaps quotas.llm.concurrency"),
        ("providers[0]", "providers.llm.timeout_prob", "overlaps providers[0] (both set providers[0]"),
    ],
)
def test_two_overrides_of_one_field_are_refused(first, second, fragment):
    """Under two spellings the second override silently replaced the first (a sweep labelled its rows
    with values that were never used), so two paths to one field, or to a table and a key in it, are
    refused, naming both."""
    values = {"providers[0]": {"name": "llm"}, "quotas.llm": {"concurrency": 2}}
    overrides = {first: values.get(first, 1), second: values.get(second, 1)}
    with pytest.raises(ScenarioError, match="set each field once") as caught:
        apply_overrides(full_mapping(), overrides, source="f.toml")
    assert caught.value.key_path == second and fragment in caught.value.message
    assert str(caught.value).startswith(f"f.toml: {second}: ")
    # different fields of one entry, under either spelling, are fine
    changed = apply_overrides(
        full_mapping(), {"providers.llm.timeout_prob": 0.5, "providers[0].rate_limit_prob": 0.1}
    )
    assert (
        changed["providers"][0]["timeout_prob"] == 0.5 and changed["providers"][0]["rate_limit_prob"] == 0.1
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("retry.base_s=0.5", ("retry.base_s", 0.5)),
        ("retry.max_attempts = 3", ("retry.max_attempts", 3)),
        ("retry.honour_retry_after=true", ("retry.honour_retry_after", True)),
        ("dispatch.policy=sjf", ("dispatch.policy", "sjf")),
        ('dispatch.policy="sjf"', ("dispatch.policy", "sjf")),
        ("retry.attempt_timeout_s=none", ("retry.attempt_timeout_s", "none")),
        ("workloads[0].cost={dist = 'fixed', mean = 5}", ("workloads[0].cost", {"dist": "fixed", "mean": 5})),
        ("scenario.description=a=b", ("scenario.description", "a=b")),
        ("scenario.name=", ("scenario.name", "")),
    ],
)
def test_parse_override_coerces_toml_values_then_bare_strings(text, expected):
    assert parse_override(text) == expected


@pytest.mark.parametrize("text", ["retry.base_s", "=3", "retry..base_s=1"])
def test_parse_override_rejects_malformed_text(text):
    with pytest.raises(ScenarioError):
        parse_override(text)


def test_cli_style_overrides_end_to_end(tmp_path):
    path = write(tmp_path, full_mapping())
    overrides = dict(
        parse_override(text)
        for text in ["retry.base_s=0.5", "dispatch.policy=fifo", "providers.llm.honours_idempotency=false"]
    )
    scenario = load_scenario(path, overrides=overrides)
    assert (scenario.retry.base_s, scenario.dispatch.policy) == (0.5, "fifo")
    assert scenario.provider("llm").honours_idempotency is False
    with pytest.raises(ScenarioError, match=r"retry\.max_attempts: expected an integer >= 1, got \"many\""):
        load_scenario(path, overrides=dict([parse_override("retry.max_attempts=many")]))


# --- generated malformed input --------------------------------------------------------------

FULL = full_mapping()
# an array of names is one value (its error names the array): its items are no leaves of their own
LEAVES = [path for path in leaf_paths(FULL) if not path.startswith("routes[0].providers[")]
TABLES = table_paths(FULL)

junk_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(
        ["none", "llm", "tts", "fifo", "sjf", "json", "sqlite", "memory", "azure_code", "poisson"]
    ),
    st.datetimes(),
    st.dates(),
)
junk = st.recursive(
    junk_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
wrong_type = st.one_of(
    st.lists(junk_scalars, max_size=3),
    st.dictionaries(st.text(max_size=6), junk_scalars, max_size=2),
    st.datetimes(),
    st.times(),
)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def parse_or_error(mapping: Any) -> Scenario | ScenarioError:
    try:
        return parse_scenario(mapping, source="gen.toml")
    except ScenarioError as error:
        assert error.file == "gen.toml"
        assert str(error).startswith("gen.toml: ")
        return error


def check_usable(scenario: Scenario) -> None:
    """A scenario that validated can be handed to the real building blocks without errors."""
    backoff_from_name(scenario.retry.strategy, scenario.retry.base_s, scenario.retry.cap_s)
    dispatch_policy_from_name(scenario.dispatch.policy, max_wait_s=scenario.dispatch.max_wait_s)
    for quota in scenario.quotas.values():
        MultiQuota(
            QuotaLimits(
                requests_per_min=quota.requests_per_min,
                tokens_per_min=quota.units_per_min,
                concurrency=quota.concurrency,
                request_burst=quota.request_burst,
                token_burst=quota.unit_burst,
            )
        )
    assert parse_scenario(scenario_to_dict(scenario), source=scenario.source or "") == scenario


@FAST
@given(path=st.sampled_from(LEAVES), value=junk)
def test_random_values_at_valid_key_paths_raise_only_scenario_errors(path, value):
    mapping = copy.deepcopy(FULL)
    set_path(mapping, path, value)
    outcome = parse_or_error(mapping)
    if isinstance(outcome, Scenario):
        check_usable(outcome)


@FAST
@given(path=st.sampled_from(LEAVES), value=wrong_type)
def test_wrong_type_at_a_value_is_reported_at_that_path(path, value):
    mapping = copy.deepcopy(FULL)
    set_path(mapping, path, value)
    outcome = parse_or_error(mapping)
    assert isinstance(outcome, ScenarioError)
    assert outcome.key_path == path
    assert "expected" in outcome.message


@FAST
@given(
    deletions=st.lists(st.sampled_from(LEAVES + TABLES), max_size=3),
    replacements=st.lists(st.tuples(st.sampled_from(TABLES), junk), max_size=2),
    extra_key=st.one_of(
        st.none(), st.tuples(st.sampled_from(["", *TABLES]), st.text(min_size=1, max_size=8), junk)
    ),
)
def test_structural_damage_raises_only_scenario_errors(deletions, replacements, extra_key):
    mapping = copy.deepcopy(FULL)
    for path in deletions:
        try:
            delete_path(mapping, path)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier change removed it
    for path, value in replacements:
        try:
            set_path(mapping, path, value)
        except (KeyError, IndexError, TypeError):
            pass
    if extra_key is not None:
        where, key, value = extra_key
        try:
            node: Any = mapping
            for part in split_key_path(where) if where else []:
                node = node[part]
            if isinstance(node, dict):
                node[key] = value
        except (KeyError, IndexError, TypeError):
            pass
    outcome = parse_or_error(mapping)
    if isinstance(outcome, Scenario):
        check_usable(outcome)


@FAST
@given(raw=junk)
def test_arbitrary_junk_raises_only_scenario_errors(raw):
    assert isinstance(parse_or_error(raw), ScenarioError)


@FAST
@given(path=st.sampled_from(LEAVES), value=junk)
def test_random_overrides_raise_only_scenario_errors(path, value):
    try:
        changed = apply_overrides(FULL, {path: value}, source="gen.toml")
    except ScenarioError:
        return
    outcome = parse_or_error(changed)
    if isinstance(outcome, Scenario):
        check_usable(outcome)


@FAST
@given(path=st.text(max_size=30), value=junk_scalars)
def test_arbitrary_override_paths_raise_only_scenario_errors(path, value):
    try:
        changed = apply_overrides(FULL, {path: value}, source="gen.toml")
    except ScenarioError as error:
        assert error.key_path == path
        return
    parse_or_error(changed)


@FAST
@given(text=st.text(max_size=40))
def test_parse_override_never_raises_anything_else(text):
    try:
        key, _value = parse_override(text)
    except ScenarioError:
        return
    assert key == text.partition("=")[0].strip()


# --- the shipped scenarios ------------------------------------------------------------------

SCENARIO_FILES = sorted(SCENARIOS_DIR.glob("*.toml"))
EXPECTED_SCENARIOS = {
    "double_click_storm",
    "retry_storm_429",
    "timeout_duplicate_billing",
    "crash_recovery",
    "sjf_vs_fifo",
    "interactive_vs_background",
    "azure_trace_replay",
}


def test_all_expected_scenarios_are_shipped():
    assert {path.stem for path in SCENARIO_FILES} >= EXPECTED_SCENARIOS


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=[p.stem for p in SCENARIO_FILES])
def test_every_shipped_scenario_loads_and_is_small(path):
    scenario = load_scenario(path)
    assert scenario.name == path.stem
    assert "Look at" in scenario.description
    assert parse_scenario(scenario_to_dict(scenario), source=scenario.source or "") == scenario
    json.dumps(scenario_to_dict(scenario))  # reports can serialise it
    arrivals = generate_arrivals(scenario, random.Random(scenario.seed))
    jobs = generate_job_arrivals(scenario, scenario.seed)  # a job is one submission too
    assert 100 <= len(arrivals) + len(jobs) <= 5000


def test_shipped_scenarios_show_what_their_names_say():
    storm = load_scenario(SCENARIOS_DIR / "retry_storm_429.toml")
    offered_per_min = sum(w.rate_per_s for w in storm.workloads) * 60
    assert storm.provider("llm").server_requests_per_min < offered_per_min  # the storm comes from the quota
    assert storm.provider("llm").rate_limit_prob == 0
    assert storm.quotas.get("llm") is None or storm.quotas["llm"].requests_per_min is None

    billing = load_scenario(SCENARIOS_DIR / "timeout_duplicate_billing.toml").provider("llm")
    assert billing.timeout_prob > 0 and not billing.honours_idempotency

    crash = load_scenario(SCENARIOS_DIR / "crash_recovery.toml")
    assert crash.store.kind == "sqlite" and len(crash.crashes) >= 1
    assert all(c.at_s is not None and c.at_s < crash.duration_s for c in crash.crashes)

    sjf = load_scenario(SCENARIOS_DIR / "sjf_vs_fifo.toml")
    sizes = [a.cost_estimate for a in generate_arrivals(sjf, random.Random(0))]
    assert max(sizes) == 100_000 and sorted(sizes)[-2] < 10_000
    quota = sjf.quotas["llm"]
    assert quota.unit_burst is not None and quota.unit_burst >= 100_000 > quota.units_per_min

    clicks = load_scenario(SCENARIOS_DIR / "double_click_storm.toml")
    assert {w.type for w in clicks.workloads} == {"double_click"}
    assert {w.clicks for w in clicks.workloads} == {2, 3}

    mixed = load_scenario(SCENARIOS_DIR / "interactive_vs_background.toml")
    assert {w.priority for w in mixed.workloads} == {"interactive", "background"}

    trace = load_scenario(SCENARIOS_DIR / "azure_trace_replay.toml")
    assert trace.workloads[0].type == "trace" and trace.workloads[0].trace == "azure_code"


def test_dates_in_a_file_are_described_readably(tmp_path):
    mapping = full_mapping()
    mapping["scenario"]["seed"] = datetime.date(2024, 1, 2)
    with pytest.raises(
        ScenarioError, match=r"scenario\.seed: expected an integer >= 0, got the date/time 2024-01-02"
    ):
        load_scenario(write(tmp_path, mapping))


def test_a_breaker_cooldown_of_zero_is_refused_by_the_loader_as_at_run_time(tmp_path):
    """validate said ok and run failed without naming the file or key: the loader now asks what
    CircuitBreaker asks (a positive cool-down: 0 would never keep the breaker open)."""
    mapping = full_mapping()
    mapping["overload"] = {"circuit_breaker": True, "breaker_cooldown_s": 0}
    path = write(tmp_path, mapping, "breaker.toml")
    with pytest.raises(
        ScenarioError, match=r"breaker\.toml: overload\.breaker_cooldown_s: expected a number > 0"
    ):
        load_scenario(path)


def test_a_fleet_slot_poll_shorter_than_a_millisecond_is_refused(tmp_path):
    """1e-300 passed validate and the run then spun for ever, polling a full pool."""
    mapping = full_mapping()
    mapping["fleet"] = {"workers": 2, "quota": "shared", "slot_poll_s": 1e-300}
    path = write(tmp_path, mapping, "poll.toml")
    with pytest.raises(ScenarioError, match=r"poll\.toml: fleet\.slot_poll_s: expected a number >= 0\.001"):
        load_scenario(path)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("sigma", 1e200, "expected a number in [0, 20]"),  # overflowed sigma**2 / 2 at run time
        ("mean", 1e308, "expected a number in (0, 1e+12]"),  # overflowed the lognormal draw
    ],
)
def test_a_lognormal_size_that_cannot_be_drawn_is_refused_when_loaded(tmp_path, key, value, expected):
    """validate said ok and run then failed with an OverflowError traceback."""
    mapping = full_mapping()
    mapping["workloads"][0]["cost"][key] = value
    path = write(tmp_path, mapping, "size.toml")
    with pytest.raises(ScenarioError, match=re.escape(f"size.toml: workloads[0].cost.{key}: {expected}")):
        load_scenario(path)
