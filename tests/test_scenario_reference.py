"""scenarios/README.md documents every key the loader accepts, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

from aiqsim.sim import config, job_config
from aiqsim.sim.scenario import SECTION_FIELDS

REFERENCE = Path(__file__).resolve().parent.parent / "scenarios" / "README.md"
HEADERS = {
    "[scenario]": config.Scenario,
    "[[providers]]": config.ProviderConfig,
    "[[providers.outages]]": config.OutageConfig,
    "[quotas.NAME]": config.ClientQuotaConfig,
    "[retry]": config.RetryConfig,
    "[dispatch]": config.DispatchConfig,
    "[store]": config.StoreConfig,
    "[[workloads]]": config.WorkloadConfig,
    "[workloads.cost]": config.CostConfig,
    "[[crashes]]": config.CrashConfig,
    "[overload]": config.OverloadConfig,
    "[[jobs]]": job_config.JobConfig,
    "[[jobs.stages]]": job_config.StageConfig,
    "[jobs.stages.size]": job_config.StageSizeConfig,
    "[jobs.stages.fanout]": job_config.FanoutConfig,
    "[fleet]": config.FleetConfig,
    "[[routes]]": config.RouteConfig,
    "[tenants.NAME]": config.TenantConfig,
    "[budget]": config.BudgetConfig,
}


def documented_keys() -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current = None
    for line in REFERENCE.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"## `(.+)`$", line)
        if heading:
            current = heading.group(1)
            sections[current] = []
        row = re.match(r"\| `(\w+)` \|", line)
        if row and current is not None:
            sections[current].append(row.group(1))
    return sections


def test_every_table_and_key_of_the_loader_is_documented() -> None:
    sections = documented_keys()
    assert set(sections) == set(HEADERS)
    for header, record in HEADERS.items():
        assert sections[header] == list(SECTION_FIELDS[record].fields), header
