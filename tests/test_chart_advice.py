"""Charts and the tuning panel never oversell: titles name no setting a rule did not choose and claim
no difference inside the seed bands, reference lines sit at the values they name, a log axis carries
no bars, and the panel writes numbers as people do (800,000, not 8e+05).

Small hand-made frames (their answers are known) and one short simulation: a second or two in all."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.patches import Rectangle

from aiqsim.lab import charts
from aiqsim.lab.decisions import best_setting

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"

SPLITS = pd.DataFrame(
    {
        "cheap_share": [0.5, 0.5, 0.6, 0.6, 0.7, 0.7],
        "seed": [0, 1] * 3,
        "cost_total": [3.0, 3.02, 2.88, 2.9, 2.75, 2.77],
        "success_latency_p99_s": [6.9, 7.0, 7.9, 7.97, 9.4, 9.6],
    }
)
"""Notebook 12's shape: the cheaper the split, the slower; the cheapest (70%) breaks an 8 s SLO."""


def _title(fig: plt.Figure) -> str:
    return fig.axes[0].get_title().replace("\n", " ").replace("\\$", "$")  # "$" is escaped from mathtext


def test_a_pareto_chart_without_a_decision_names_no_setting() -> None:
    """Notebook 12 drew its frontier before deciding: the title named the cheapest split, 70%, which
    its decision then rejected for breaking the SLO (it chose 60%)."""
    decision = best_setting(SPLITS, ["cheap_share"], "cost_total", constraints={"success_latency_p99_s": 8.0},
                            scenario_file="s.toml")  # fmt: skip
    assert decision.settings == {"cheap_share": 0.6}
    fig = charts.pareto(SPLITS, ["cheap_share"], title="p99 latency against billed cost")
    title = _title(fig)
    assert "cheapest" not in title and "0.7" not in title and "70" not in title
    assert "3 of 3 settings on the frontier" in title
    plt.close(fig)


def test_a_cost_duplication_title_claims_a_fall_only_when_the_seed_bands_are_apart() -> None:
    noisy = pd.DataFrame(
        {"retry.attempt_timeout_s": [2, 2, 2, 30, 30, 30], "seed": [0, 1, 2] * 2,
         "cost_duplicated": [1.0, 3.0, 2.0, 1.5, 2.5, 1.4]}
    )  # fmt: skip
    fig = charts.cost_duplication(noisy, "retry.attempt_timeout_s")
    title = _title(fig)
    assert "falls" not in title and "no clear change" in title and "within the 95% seed bands" in title
    plt.close(fig)
    clear = noisy.assign(cost_duplicated=[2.0, 2.1, 2.05, 0.2, 0.25, 0.22])
    fig = charts.cost_duplication(clear, "retry.attempt_timeout_s")
    assert "duplicated cost falls from $2.05 to $0.223" in _title(fig)
    plt.close(fig)


def test_metric_vs_parameter_draws_its_reference_and_marks_at_their_values() -> None:
    frame = pd.DataFrame({"quotas.llm.units_per_min": [2e5, 2e5, 8e5, 8e5], "seed": [0, 1] * 2,
                          "success_latency_p95_s": [40.0, 44.0, 12.0, 13.0]})  # fmt: skip
    fig = charts.metric_vs_parameter(
        frame, "quotas.llm.units_per_min", "success_latency_p95_s",
        reference={"target 30 s": 30.0}, marks={"server quota 1,000,000 tokens/min": 1e6},
    )  # fmt: skip
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert set(lines["target 30 s"].get_ydata()) == {30.0}
    assert set(lines["server quota 1,000,000 tokens/min"].get_xdata()) == {1e6}
    plt.close(fig)


def test_seed_ranges_draw_no_bars_on_a_log_axis_and_mark_the_bound_and_the_choice() -> None:
    runs = pd.DataFrame(
        {"workers": [1, 1, 2, 2, 4, 4], "seed": [0, 1] * 3,
         "success_latency_p95_s": [300.0, 420.0, 20.0, 25.0, 2.0, 2.5],
         "fleet_utilization": [0.5, 0.55, 0.9, 0.95, 1.1, 1.2]}
    )  # fmt: skip
    fig = charts.seed_ranges(runs, "workers", ["success_latency_p95_s", "fleet_utilization"],
                             limits={"fleet_utilization": (1.0, "the account's limit")}, chosen=2,
                             log=["success_latency_p95_s"])  # fmt: skip
    latency, utilisation = fig.axes
    assert latency.get_xscale() == "log"
    assert not [p for p in latency.patches if isinstance(p, Rectangle)] and not latency.containers
    ranges = latency.collections[0].get_segments()  # one min-max line per setting, nothing outside it
    assert sorted((s[0][0], s[1][0]) for s in ranges) == [(2.0, 2.5), (20.0, 25.0), (300.0, 420.0)]
    bound = next(line for line in utilisation.get_lines() if line.get_label() == "the account's limit")
    assert set(bound.get_xdata()) == {1.0}
    star = next(line for line in utilisation.get_lines() if line.get_label() == "chosen")
    assert list(star.get_xdata()) == [pytest.approx(0.925)]
    assert fig._suptitle.get_text() == "chosen: 2"
    plt.close(fig)


def test_the_tuning_panel_writes_numbers_as_people_do() -> None:
    from aiqsim.lab.widgets import TuningPanel, make_control

    key = "quotas.llm.units_per_min"
    panel = TuningPanel(SCENARIOS / "retry_storm_429.toml", {key: (200_000, 1_200_000)})
    panel.controls[key].value = 800_000
    assert panel.last_result.scenario.quotas["llm"].units_per_min == 800_000
    assert "<b>800,000</b>" in panel.table.value and "e+0" not in panel.table.value
    assert "800,000 tokens/min" in panel.chart_title.replace("\n", " ")
    # a float range's readout: fixed decimals with thousands separators, never exponent notation
    quota = make_control(key, (2e5, 1.2e6), 5e5)
    base = make_control("retry.base_s", (0.1, 5.0), 0.5)
    assert format(800_000.0, quota.readout_format) == "800,000"
    assert format(2.0, base.readout_format) in ("2.0", "2.00")


def test_a_setting_the_scenario_refuses_is_shown_in_the_panel_not_raised_from_its_callback() -> None:
    """The quickstart's panel offers request_burst over the storm, whose request quota is unset: moving
    the burst alone raised ScenarioError inside the widget callback, and the panel went on showing the
    last run beside a burst slider that no longer matched it."""
    from aiqsim.lab.widgets import TuningPanel

    rpm, burst = "quotas.llm.requests_per_min", "quotas.llm.request_burst"
    panel = TuningPanel(SCENARIOS / "retry_storm_429.toml", {rpm: (60, 240, 10), burst: (1, 120)})
    before = panel.last_result
    panel.controls[burst].value = 5
    assert panel.runs == 1 and panel.last_result is before
    assert panel.error is not None and "only applies together with requests_per_min" in panel.error
    assert "Not run:" in panel.table.value and "still the last run's" in panel.table.value
    assert "<b>unset</b>" in panel.table.value  # what did run is still said
    panel.controls[rpm].value = 120  # now the burst applies
    assert panel.error is None and panel.runs == 2 and "Not run" not in panel.table.value
    quota = panel.last_result.scenario.quotas["llm"]
    assert (quota.requests_per_min, quota.request_burst) == (120, 5)
