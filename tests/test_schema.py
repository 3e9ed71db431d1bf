"""The JSON Schema of scenario files agrees with the loader, and the shipped copy is up to date.

The schema is generated from the loader's spec tables (aiqsim/sim/scenario_schema.py); these tests
check that the two say the same thing where a JSON Schema can say it: every shipped scenario passes
both, and every file of the bad catalogue is refused by both. The rules only the loader can check
(cross-references, relations between keys) have a catalogue of their own, which pins down that the
schema lets them through, so the list in RULES_NOT_IN_SCHEMA stays honest.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from aiqsim.sim.scenario import ScenarioError, load_scenario, parse_scenario
from aiqsim.sim.scenario_schema import (
    RULES_NOT_IN_SCHEMA,
    SCHEMA_DIRECTIVE,
    scenario_json_schema,
    scenario_schema_text,
)

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_SCHEMA = ROOT / "scenarios" / "scenario.schema.json"
SHIPPED = sorted((ROOT / "scenarios").glob("*.toml"))
VALIDATOR = jsonschema.Draft7Validator(scenario_json_schema())

BASE: dict[str, Any] = {
    "scenario": {"name": "t", "duration_s": 10},
    "providers": [{"name": "llm"}],
    "workloads": [{"type": "poisson", "provider": "llm", "rate_per_s": 1}],
}
JOB_BASE: dict[str, Any] = {
    **BASE,
    "providers": [{"name": "llm"}, {"name": "tts", "kind": "tts"}],
    "jobs": [
        {
            "name": "edit",
            "stages": [
                {"name": "script", "provider": "llm"},
                {"name": "speech", "provider": "tts", "after": ["script"]},
            ],
        }
    ],
    "workloads": [{"type": "poisson", "job": "edit", "rate_per_s": 1}],
}

ROUTED_BASE: dict[str, Any] = {  # JOB_BASE with its script stage on a route over two llm deployments
    **JOB_BASE,
    "providers": [{"name": "east"}, {"name": "west"}, {"name": "tts", "kind": "tts"}],
    "routes": [{"name": "gpt", "providers": ["east", "west"]}],
    "jobs": [
        {
            "name": "edit",
            "stages": [
                {"name": "script", "route": "gpt"},
                {"name": "speech", "provider": "tts", "after": ["script"]},
            ],
        }
    ],
}


def variant(path: str, value: Any, base: dict[str, Any] = BASE) -> dict[str, Any]:
    """``base`` with the value at a dotted path (``providers.0.timeout_prob``) set, or removed for DROP."""
    document = copy.deepcopy(base)
    *parents, last = path.split(".")
    node: Any = document
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    key: Any = int(last) if isinstance(node, list) else last
    if value is DROP:
        del node[key]
    else:
        node[key] = value
    return document


DROP = object()

# Files the loader refuses for a reason a JSON Schema can express: both must refuse them.
BAD: dict[str, dict[str, Any]] = {
    "unknown top-level key": variant("retries", {"base_s": 1}),
    "unknown key in retry": variant("retry.base", 1),
    "unknown key in a provider": variant("providers.0.timeout_probability", 0.1),
    "unknown key in a quota": variant("quotas.llm.rpm", 10),
    "unknown key in the scenario section": variant("scenario.horizon_s", 10),
    "string for a number": variant("retry.base_s", "fast"),
    "negative where >= 0": variant("retry.base_s", -1),
    "probability above 1": variant("providers.0.timeout_prob", 1.5),
    "bool as a number": variant("providers.0.timeout_prob", True),
    "bool as an integer": variant("retry.max_attempts", True),
    "integer below its minimum": variant("retry.max_attempts", 0),
    "fraction for an integer": variant("retry.max_attempts", 2.5),
    "integer beyond 2**63": variant("scenario.seed", 2**64),
    "negative seed": variant("scenario.seed", -1),
    "zero where > 0": variant("scenario.duration_s", 0),
    "bad backoff strategy": variant("retry.strategy", "exponentialish"),
    "bad dispatch policy": variant("dispatch.policy", "random"),
    "bad store kind": variant("store.kind", "postgres"),
    "bad provider kind": variant("providers.0.kind", "image"),
    "bad retry budget": variant("overload.retry_budget", "sometimes"),
    "string for a boolean": variant("providers.0.honours_idempotency", "yes"),
    "number for a boolean": variant("store.group_commit", 1),
    "empty scenario name": variant("scenario.name", "   "),
    "provider name starting with a digit": variant("providers.0.name", "1llm"),
    "missing scenario name": variant("scenario.name", DROP),
    "missing providers": variant("providers", DROP),
    "missing workloads": variant("workloads", DROP),
    "table for an array of tables": variant("providers", {"name": "llm"}),
    "string for a table": variant("scenario", "x"),
    "a quota that is not a table": variant("quotas.llm", 5),
    "quota concurrency 0": variant("quotas.llm.concurrency", 0),
    "optional value neither a number nor none": variant("retry.attempt_timeout_s", "never"),
    "optional value out of range": variant("retry.attempt_timeout_s", 0),
    "workload without a type": variant("workloads.0.type", DROP),
    "bad workload type": variant("workloads.0.type", "steady"),
    "burst workload without count": variant("workloads.0", {"type": "burst", "provider": "llm"}),
    "key of another workload type": variant("workloads.0.burst_s", 1),
    "cost key of another distribution": variant("workloads.0.cost", {"dist": "lognormal", "low": 1}),
    "cost key of the default distribution": variant("workloads.0.cost", {"sigma": 0.5}),
    "bad cost distribution": variant("workloads.0.cost", {"dist": "pareto"}),
    "outage without end_s": variant("providers.0.outages", [{"start_s": 1}]),
    "bad outage mode": variant("providers.0.outages", [{"start_s": 1, "end_s": 2, "mode": "down"}]),
    "outage slow_factor below 1": variant(
        "providers.0.outages", [{"start_s": 1, "end_s": 2, "slow_factor": 0.5}]
    ),
    "crash at_s not a number": variant("crashes", [{"at_s": "soon"}]),
    "job template without stages": variant("jobs.0.stages", DROP, JOB_BASE),
    "stage after naming a stage twice": variant("jobs.0.stages.1.after", ["script", "script"], JOB_BASE),
    "stage after not an array": variant("jobs.0.stages.1.after", "script", JOB_BASE),
    "from_stage size without stage": variant("jobs.0.stages.1.size", {"dist": "from_stage"}, JOB_BASE),
    "fanout mean below 1": variant("jobs.0.stages.1.fanout", {"mean": 0.5}, JOB_BASE),
    "stage with both provider and route": variant("jobs.0.stages.0.provider", "east", ROUTED_BASE),
    "stage with neither provider nor route": variant("jobs.0.stages.0.route", DROP, ROUTED_BASE),
    "stage route not a name": variant("jobs.0.stages.0.route", "1gpt", ROUTED_BASE),
    "token rate 0": variant("providers.0.tokens_per_s", 0),
    "ttft_sigma above 20": variant("providers.0.ttft_sigma", 25.0),
    "stream cut probability above 1": variant("providers.0.stream_cut_prob", 1.5),
}

# Files only the loader refuses (RULES_NOT_IN_SCHEMA): the schema lets them through.
LOADER_ONLY: dict[str, dict[str, Any]] = {
    "quota for an unknown provider": variant("quotas.nope.concurrency", 2),
    "workload naming an unknown provider": variant("workloads.0.provider", "nope"),
    "two providers with one name": variant("providers", [{"name": "llm"}, {"name": "llm"}]),
    "no providers": variant("providers", []),
    "no workloads": variant("workloads", []),
    "retry cap below base": variant("retry", {"base_s": 2, "cap_s": 1}),
    "outage ending before it starts": variant("providers.0.outages", [{"start_s": 5, "end_s": 2}]),
    "group commit on the json store": variant("store", {"kind": "json", "group_commit": True}),
    "a path for the memory store": variant("store.path", "x.db"),
    "crash with neither at_s nor after_writes": variant("crashes", [{}]),
    "nan for a number": variant("retry.base_s", math.nan),
    "workload naming an unknown job": variant("workloads.0.job", "nope", JOB_BASE),
    "stage after a later stage": variant("jobs.0.stages.0.after", ["speech"], JOB_BASE),
    "stage naming an unknown route": variant("jobs.0.stages.0.route", "nope", ROUTED_BASE),
    "ttft_s without tokens_per_s": variant("providers.0.ttft_s", 0.5),
    "stream cuts without the stream model": variant("providers.0.stream_cut_prob", 0.1),
}


def loader_refuses(document: dict[str, Any]) -> bool:
    try:
        parse_scenario(copy.deepcopy(document), "catalogue.toml")
    except ScenarioError:
        return True
    return False


def schema_errors(document: dict[str, Any]) -> list[str]:
    return [error.message for error in VALIDATOR.iter_errors(document)]


def test_the_schema_is_a_valid_draft_7_schema() -> None:
    jsonschema.Draft7Validator.check_schema(scenario_json_schema())


def test_the_shipped_schema_is_up_to_date() -> None:
    assert SHIPPED_SCHEMA.read_text(encoding="utf-8") == scenario_schema_text(), (
        "regenerate it: aiqsim schema > scenarios/scenario.schema.json"
    )


def test_aiqsim_schema_prints_the_shipped_schema() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "aiqsim", "schema"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert json.loads(done.stdout) == json.loads(SHIPPED_SCHEMA.read_text(encoding="utf-8"))


def test_the_base_documents_pass_both() -> None:
    for document in (BASE, JOB_BASE, ROUTED_BASE):
        assert not loader_refuses(document)
        assert schema_errors(document) == []


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_scenario_names_the_schema_and_passes_both(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.splitlines()[0] == SCHEMA_DIRECTIVE
    assert (path.parent / SCHEMA_DIRECTIVE.split()[-1]).resolve() == SHIPPED_SCHEMA
    load_scenario(path)  # raises ScenarioError if the loader refuses it
    assert schema_errors(tomllib.loads(text)) == []


def test_the_schema_directive_is_only_a_comment_to_the_loader(tmp_path: Path) -> None:
    body = (ROOT / "scenarios" / "retry_storm_429.toml").read_text(encoding="utf-8").split("\n", 1)[1]
    assert not body.startswith("#:schema")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with_line, without = tmp_path / "a" / "x.toml", tmp_path / "b" / "x.toml"
    with_line.write_text(f"{SCHEMA_DIRECTIVE}\n{body}", encoding="utf-8")
    without.write_text(body, encoding="utf-8")
    loaded, plain = load_scenario(with_line), load_scenario(without)
    assert dataclasses.replace(loaded, source=plain.source) == plain


def test_the_catalogue_is_large_enough() -> None:
    assert len(BAD) >= 25 and len(LOADER_ONLY) >= 10


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_file_is_refused_by_both(name: str) -> None:
    document = BAD[name]
    assert loader_refuses(document), f"the loader accepts: {name}"
    assert schema_errors(document), f"the schema accepts: {name}"


@pytest.mark.parametrize("name", list(LOADER_ONLY))
def test_rules_beyond_json_schema_are_the_loaders_alone(name: str) -> None:
    document = LOADER_ONLY[name]
    assert loader_refuses(document), f"the loader accepts: {name}"
    assert schema_errors(document) == [], f"the schema now refuses {name}: move it to BAD"


def test_the_schema_description_lists_the_rules_it_cannot_express() -> None:
    description = scenario_json_schema()["description"]
    assert all(rule in description for rule in RULES_NOT_IN_SCHEMA)


def test_every_key_the_loader_accepts_is_in_the_schema() -> None:
    from aiqsim.sim.scenario import SECTION_FIELDS

    def keys_of(node: dict[str, Any]) -> set[str]:
        found = set()
        for key, child in node.get("properties", {}).items():
            found.add(key)
            for sub in (child, child.get("items", {}), child.get("additionalProperties") or {}):
                if isinstance(sub, dict) and sub.get("type") == "object":
                    found |= keys_of(sub)
        return found

    in_schema = keys_of(scenario_json_schema())
    assert all(set(table.fields) <= in_schema for table in SECTION_FIELDS.values())


def test_the_job_workload_rule_names_exactly_the_keys_the_loader_refuses_there() -> None:
    """The listed rule on job workloads is the loader's: it named distinct_inputs (which a job workload
    takes) and left out poison_fraction and route (which it refuses)."""
    rule = next(rule for rule in RULES_NOT_IN_SCHEMA if "job workload" in rule)
    values = {
        "provider": "llm",
        "cost": {"mean": 10},
        "poison_fraction": 0.1,
        "route": "gpt",
        "distinct_inputs": 3,
    }
    for key, value in values.items():
        refused = loader_refuses(variant(f"workloads.0.{key}", value, ROUTED_BASE))
        assert refused == (key in rule), (key, refused, rule)
