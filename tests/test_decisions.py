"""aiqsim.lab.decisions: the rules that turn a sweep into a recommended setting and its --set line."""

from __future__ import annotations

import pandas as pd
import pytest

from aiqsim.core.errors import ConfigurationError
from aiqsim.lab.decisions import (
    Decision,
    NoSettingMeetsError,
    best_setting,
    seed_bands,
    set_line,
    smallest_meeting,
)

# quota -> p95 latency per seed; 400 meets 30 s on average but not on its worst seed
SWEEP = pd.DataFrame(
    {
        "quotas.llm.units_per_min": [200, 200, 400, 400, 600, 600, 800, 800],
        "seed": [0, 1] * 4,
        "success_latency_p95_s": [90.0, 95.0, 25.0, 33.0, 28.0, 29.5, 10.0, 11.0],
        "rate_limited": [0, 0, 0, 0, 0, 0, 5, 9],
    }
)


def test_seed_bands_report_mean_worst_best_and_seed_count() -> None:
    bands = seed_bands(SWEEP, ["quotas.llm.units_per_min"], ["success_latency_p95_s"]).set_index(
        "quotas.llm.units_per_min"
    )
    assert bands.loc[400, "success_latency_p95_s mean"] == pytest.approx(29.0)
    assert bands.loc[400, "success_latency_p95_s max"] == 33.0
    assert bands.loc[400, "success_latency_p95_s min"] == 25.0
    assert (bands["seeds"] == 2).all()


def test_smallest_meeting_needs_every_seed_to_meet_the_target() -> None:
    decision = smallest_meeting(
        SWEEP, "quotas.llm.units_per_min", "success_latency_p95_s", 30.0, scenario_file="s.toml"
    )
    # 400 meets the target on average but not on its worst seed
    assert decision.settings == {"quotas.llm.units_per_min": 600}
    assert decision.command == "aiqsim run s.toml --set quotas.llm.units_per_min=600"
    assert decision.evidence.iloc[0]["quotas.llm.units_per_min"] == 600
    assert len(decision.evidence) == 4  # every candidate is shown as evidence


def test_no_setting_meeting_the_target_is_a_configuration_error_naming_the_closest() -> None:
    with pytest.raises(
        NoSettingMeetsError, match=r"closest, quotas.llm.units_per_min=800, reaches 11"
    ) as caught:
        smallest_meeting(
            SWEEP, "quotas.llm.units_per_min", "success_latency_p95_s", 5.0, scenario_file="s.toml"
        )
    assert isinstance(caught.value, ConfigurationError) and isinstance(caught.value, ValueError)


def test_best_setting_applies_constraints_to_the_worst_seed_then_takes_the_best_mean() -> None:
    decision = best_setting(
        SWEEP,
        ["quotas.llm.units_per_min"],
        "success_latency_p95_s",
        constraints={"rate_limited": 0},
        scenario_file="s.toml",
    )
    assert decision.settings == {"quotas.llm.units_per_min": 600}  # 800 is faster but meets 429s
    assert "rate_limited <= 0" in decision.rule
    # the evidence lists the chosen setting first, then every candidate from best to worst mean
    assert list(decision.evidence["quotas.llm.units_per_min"]) == [600, 800, 400, 200]
    unconstrained = best_setting(
        SWEEP,
        ["quotas.llm.units_per_min"],
        "rate_limited",
        scenario_file="s.toml",
        tie_break="success_latency_p95_s",
    )
    assert unconstrained.settings == {"quotas.llm.units_per_min": 600}  # three tie at 0 429s; 600 is fastest
    assert type(unconstrained.settings["quotas.llm.units_per_min"]) is int
    most = best_setting(
        SWEEP, ["quotas.llm.units_per_min"], "rate_limited", maximize=True, scenario_file="s.toml"
    )
    assert most.settings == {"quotas.llm.units_per_min": 800}
    with pytest.raises(NoSettingMeetsError):
        best_setting(
            SWEEP,
            ["quotas.llm.units_per_min"],
            "rate_limited",
            constraints={"success_latency_p95_s": 1},
            scenario_file="s.toml",
        )


def test_set_line_writes_values_as_the_override_parser_reads_them() -> None:
    from aiqsim.sim.scenario import parse_override

    settings = {"store.reconcile_on_restart": True, "retry.base_s": 0.5, "quotas.llm.units_per_min": 900000.0,
                "retry.strategy": "full_jitter"}  # fmt: skip
    line = set_line("scenarios/x.toml", settings)
    assert line == (
        "aiqsim run scenarios/x.toml --set store.reconcile_on_restart=true --set retry.base_s=0.5 "
        "--set quotas.llm.units_per_min=900000 --set retry.strategy=full_jitter"
    )
    parsed = dict(parse_override(flag.strip()) for flag in line.split("--set")[1:])
    assert parsed == settings
    decision = Decision("scenarios/x.toml", settings, "a rule", pd.DataFrame())
    assert line in decision._repr_markdown_() and "a rule" in decision._repr_markdown_()


def test_a_checked_decision_says_what_its_command_prints_on_a_seed_it_was_computed_from() -> None:
    decision = smallest_meeting(
        SWEEP, "quotas.llm.units_per_min", "success_latency_p95_s", 30.0, scenario_file="s.toml"
    ).checked(SWEEP, ["success_latency_p95_s", "rate_limited"])
    assert decision.check_seed == 0 and decision.check == {"success_latency_p95_s": 28.0, "rate_limited": 0.0}
    assert decision.check_line == (
        "check: aiqsim run s.toml --set quotas.llm.units_per_min=600 --seed 0 "
        "-> success_latency_p95_s=28, rate_limited=0"
    )
    assert decision.constraints == {"success_latency_p95_s": 30.0}
    assert "--seed 0" in decision._repr_markdown_()
    with pytest.raises(ConfigurationError, match="no column"):
        decision.checked(SWEEP, ["goodput_per_s"])
    doubled = pd.concat([SWEEP, SWEEP.assign(other=1)])
    with pytest.raises(ConfigurationError, match="2 runs of"):
        decision.checked(doubled, ["rate_limited"])


def test_set_line_quotes_what_a_shell_would_expand() -> None:
    line = set_line("scenarios/x.toml", {"workloads[0].rate_per_s": 1.8, "retry.base_s": 2.0})
    assert line == "aiqsim run scenarios/x.toml --set 'workloads[0].rate_per_s=1.8' --set retry.base_s=2"
