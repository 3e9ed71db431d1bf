"""Charts return figures with the expected axes and series; the tuning panel re-runs on change."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from aiqsim.lab import charts
from aiqsim.lab.widgets import TuningPanel
from aiqsim.sim.scenario import ScenarioError
from aiqsim.sim.simulate import simulate
from aiqsim.sim.sweep import sweep

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


@pytest.fixture(scope="module")
def storm():
    return simulate(SCENARIOS / "retry_storm_429.toml")


@pytest.fixture(scope="module")
def grid() -> pd.DataFrame:
    return sweep(
        SCENARIOS / "timeout_duplicate_billing.toml",
        {"retry.attempt_timeout_s": [2, 8], "retry.base_s": [0.5, 2.0]},
        seeds=[0, 1],
        engine="serial",
        progress=False,
    )


def labels(ax) -> list[str]:
    return [line.get_label() for line in ax.get_lines()]


def test_retry_storm_timeline_has_attempts_429s_successes_and_the_bucket(storm) -> None:
    storm_with_bucket = simulate(
        SCENARIOS / "retry_storm_429.toml", overrides={"quotas.llm.requests_per_min": 150}
    )
    fig = charts.retry_storm_timeline(storm_with_bucket.timeline, title="t", show_bucket=True)
    main, twin = fig.axes
    assert labels(main)[:3] == ["attempts/s", "429s/s", "successes/s"]
    assert main.get_xlabel() == "simulated time (s)" and main.get_ylabel() == "calls per second (calls/s)"
    assert labels(twin) == ["client request bucket"] and twin.get_ylabel() == "bucket level (requests)"
    attempts = main.get_lines()[0].get_ydata()
    step = storm.scenario.timeline_step_s
    assert attempts.sum() * step == pytest.approx(storm_with_bucket.summary["attempts"])
    plt.close(fig)
    no_bucket = charts.retry_storm_timeline(storm.timeline)  # no client quota: nothing to draw twice
    assert len(no_bucket.axes) == 1
    plt.close(no_bucket)


def test_latency_cdf_has_one_monotone_line_per_group(storm) -> None:
    tasks = pd.concat([storm.tasks.assign(run="a"), storm.tasks.assign(run="b")])
    fig = charts.latency_cdf(tasks, by="run")
    ax = fig.axes[0]
    lines = [line for line in ax.get_lines() if line.get_label() != "all submitted tasks"]
    assert [line.get_label().split(" ")[0] for line in lines] == ["run=a:", "run=a:", "run=b:", "run=b:"]
    for line in lines:
        y = line.get_ydata()
        assert (y[1:] >= y[:-1]).all() and y[-1] < 1.0  # shares of all submitted tasks
    plt.close(fig)


def test_latency_cdf_plots_shares_of_all_submitted_tasks_with_each_groups_p50_and_p99(storm) -> None:
    """A storm that failed 23% of its tasks tops out at 0.77, not 1.0: it cannot look better than a
    paced run that answered every task later."""
    paced = simulate(
        SCENARIOS / "retry_storm_429.toml",
        overrides={"quotas.llm.requests_per_min": 120, "quotas.llm.request_burst": 1},
    )
    both = pd.concat([storm.tasks.assign(run="storm"), paced.tasks.assign(run="paced")])
    fig = charts.latency_cdf(both, by="run")
    ax = fig.axes[0]
    for name, result in (("storm", storm), ("paced", paced)):
        tasks = result.tasks
        ok = tasks[tasks["status"].isin(charts.SUCCESS)]["latency_s"].to_numpy(dtype=float)
        line = next(ln for ln in ax.get_lines() if ln.get_label().startswith(f"run={name}: succeeded"))
        assert line.get_ydata()[-1] == pytest.approx(len(ok) / len(tasks))
        assert list(line.get_xdata()) == sorted(ok)
        p50, p99 = np.quantile(ok, 0.5), np.quantile(ok, 0.99)
        assert (
            f"p50 {charts.format_number(p50, 3)} s, p99 {charts.format_number(p99, 3)} s" in line.get_label()
        )
    storm_top = next(ln for ln in ax.get_lines() if ln.get_label().startswith("run=storm: succeeded"))
    assert storm_top.get_ydata()[-1] < 0.8 and storm.summary["tasks_failed"] > 0
    assert "share answered: paced 100%, storm 77% (most: paced)" in ax.get_title().replace("\n", " ")
    plt.close(fig)


def test_cost_breakdown_splits_attempts_by_outcome_and_cost_into_first_and_duplicate() -> None:
    result = simulate(SCENARIOS / "timeout_duplicate_billing.toml")
    fig = charts.cost_breakdown(result.calls)
    calls_ax, cost_ax = fig.axes
    answered, lost, rate_limited, _other = calls_ax.containers
    assert sum(c[0].get_height() for c in calls_ax.containers) == result.summary["attempts"]
    assert lost[0].get_height() == int(result.calls["response_lost"].sum()) > 0
    assert rate_limited[0].get_height() == result.summary["rate_limited"]
    assert answered[0].get_height() == result.summary["tasks_succeeded"]  # one answer per success here
    first, duplicate = cost_ax.containers
    assert duplicate[0].get_height() == pytest.approx(result.summary["cost_duplicated"])
    assert first[0].get_height() + duplicate[0].get_height() == pytest.approx(result.summary["cost_total"])
    plt.close(fig)


def test_metric_vs_parameter_draws_means_with_seed_bands(grid) -> None:
    fig = charts.cost_duplication(grid, "retry.attempt_timeout_s", hue="retry.base_s")
    ax = fig.axes[0]
    per_base = grid.groupby(["retry.base_s", "retry.attempt_timeout_s"])["cost_duplicated"].mean()
    # on this grid the backoff base does not change what is duplicated: the second line would hide
    # under the first, so it is named as identical (dashed, hollow markers, no second band)
    assert list(per_base.loc[0.5]) == pytest.approx(list(per_base.loc[2.0]))
    assert labels(ax)[:2] == ["base 0.5 s", "base 2 s (same as base 0.5 s, within 1% of the range)"]
    assert len(ax.collections) == 1  # one confidence band per distinct line
    assert list(ax.get_lines()[0].get_ydata()) == pytest.approx(list(per_base.loc[0.5]))
    plt.close(fig)


def test_heatmap_cells_are_means_over_seeds(grid) -> None:
    fig = charts.heatmap(grid, "retry.attempt_timeout_s", "retry.base_s", "success_latency_p99_s")
    ax = fig.axes[0]
    image = ax.get_images()[0].get_array()
    expected = grid.pivot_table(
        index="retry.base_s",
        columns="retry.attempt_timeout_s",
        values="success_latency_p99_s",
        aggfunc="mean",
    )
    assert image.shape == expected.shape
    assert image[0][0] == pytest.approx(expected.iloc[0, 0])
    plt.close(fig)


def test_pareto_front_keeps_only_non_dominated_points() -> None:
    points = pd.DataFrame({"cost": [1, 2, 3, 2.5, 4], "latency": [9, 5, 1, 6, 0.5]})
    front = charts.pareto_front(points, "cost", "latency")
    assert list(front["cost"]) == [1, 2, 3, 4]


def test_pareto_chart_marks_the_frontier(grid) -> None:
    fig = charts.pareto(grid, ["retry.attempt_timeout_s", "retry.base_s"])
    ax = fig.axes[0]
    assert "Pareto frontier" in labels(ax)
    assert ax.get_xlabel() == "billed cost ($)" and ax.get_ylabel() == "p99 latency of succeeded tasks (s)"
    plt.close(fig)


def test_tuning_panel_reruns_and_redraws_when_a_control_changes() -> None:
    panel = TuningPanel(
        SCENARIOS / "retry_storm_429.toml",
        {"quotas.llm.requests_per_min": (60, 240, 10), "retry.strategy": ["exponential", "full_jitter"]},
    )
    assert panel.runs == 1
    before = panel.last_result.summary["rate_limited"]
    panel.controls["quotas.llm.requests_per_min"].value = 120
    assert panel.runs == 2
    assert panel.last_result.scenario.quotas["llm"].requests_per_min == 120
    assert panel.last_result.summary["rate_limited"] != before
    assert "rate_limited" in panel.table.value
    panel.controls["retry.strategy"].value = "full_jitter"
    assert panel.runs == 3 and panel.last_result.scenario.retry.strategy == "full_jitter"


def test_tuning_panel_starts_from_the_file_and_names_bad_keys() -> None:
    path = SCENARIOS / "retry_storm_429.toml"
    # the file has no client request quota and base_s 0.5, outside both slider ranges
    panel = TuningPanel(path, {"quotas.llm.requests_per_min": (10, 200), "retry.base_s": (1.0, 5.0)})
    assert panel.overrides() == {}
    assert panel.last_result.summary == simulate(path).summary
    # the slider shows the file's 0.5 (its range widened), not the nearest end of (1.0, 5.0)
    assert panel.controls["retry.base_s"].value == 0.5 and panel.controls["retry.base_s"].min == 0.5
    assert panel.simulated_settings() == {"quotas.llm.requests_per_min": "unset", "retry.base_s": "0.5"}
    for bad, fragment in (
        ({"retry.nosuch": (0, 1)}, "retry has no key 'nosuch'"),
        ({"providers.gpt.timeout_prob": (0.0, 1.0)}, "no providers entry named 'gpt'"),
    ):
        with pytest.raises(ScenarioError, match=fragment):
            TuningPanel(path, bad)


def test_tuning_panel_shows_unset_and_can_run_the_value_its_slider_started_on() -> None:
    """Regression: over an unset quota the slider showed 60 but ran no quota, and 70 -> 60 ran no quota."""
    path = SCENARIOS / "retry_storm_429.toml"
    key = "quotas.llm.requests_per_min"
    panel = TuningPanel(path, {key: (60, 240, 10)})
    slider, unset = panel.controls[key], panel.unset[key]
    # first run: the file as written, and the panel says the quota is unset, not "60"
    assert unset.value is True and panel.last_result.scenario.quotas["llm"].requests_per_min is None
    assert panel.simulated_settings()[key] == "unset"
    assert "<b>unset</b>" in panel.table.value
    storm_429s = panel.last_result.summary["rate_limited"]
    assert storm_429s > 100
    slider.value = 70  # moving the slider sets the key and unticks "unset", in one run
    assert unset.value is False and panel.runs == 2
    assert panel.last_result.scenario.quotas["llm"].requests_per_min == 70
    slider.value = 60  # back to the start value: 60/min must run, not the file's unset quota
    assert panel.runs == 3
    assert panel.last_result.scenario.quotas["llm"].requests_per_min == 60
    assert panel.simulated_settings()[key] == "60" and "<b>60</b>" in panel.table.value
    expected = simulate(path, overrides={key: 60}).summary["rate_limited"]
    assert panel.last_result.summary["rate_limited"] == expected < storm_429s
    unset.value = True  # and back to no quota at all, shown as such
    assert panel.runs == 4 and panel.last_result.scenario.quotas["llm"].requests_per_min is None
    assert panel.last_result.summary["rate_limited"] == storm_429s
    assert panel.simulated_settings()[key] == "unset"


def test_tuning_panel_dropdown_shows_a_file_value_it_was_not_given() -> None:
    panel = TuningPanel(SCENARIOS / "retry_storm_429.toml", {"retry.strategy": ["full_jitter", "none"]})
    assert panel.controls["retry.strategy"].value == "exponential"  # the file's, added to the choices
    assert panel.overrides() == {} and panel.simulated_settings() == {"retry.strategy": "exponential"}
    panel.controls["retry.strategy"].value = "none"
    assert panel.last_result.scenario.retry.strategy == "none"


def test_tuning_panel_sliders_step_on_round_values_and_read_out_as_people_write_numbers() -> None:
    from aiqsim.lab.chart_style import format_number
    from aiqsim.lab.widgets import make_control, round_step

    slider = make_control("retry.base_s", (0.1, 5.0), 0.5)
    assert slider.step in (0.05, 0.1, 0.2)  # 1, 2 or 5 times a power of ten
    for value in (0.5, 1.0, 2.0, 5.0):  # round values sit on the slider's grid (2.0 was unreachable)
        positions = (value - slider.min) / slider.step
        assert abs(positions - round(positions)) < 1e-9, value
    quota = make_control("quotas.llm.units_per_min", (200_000, 1_200_000), 500_000)
    assert quota.step == 50_000 and quota.readout_format == ",d"
    assert round_step(60, 240, None, integer=True) == 5
    assert [format_number(v) for v in (800_000.0, 800_000, 0.25, 12.3456, 0.000123)] == [
        "800,000", "800,000", "0.25", "12.35", "0.000123"
    ]  # fmt: skip


def test_tuning_panel_has_a_burst_control_and_titles_its_chart_with_the_settings_and_failed_tasks() -> None:
    import nbformat

    book = nbformat.read(Path(__file__).resolve().parent.parent / "notebooks" / "01_quickstart.ipynb", 4)
    panel_cell = next(cell.source for cell in book.cells if "TuningPanel(" in cell.source)
    assert '"quotas.llm.request_burst"' in panel_cell  # the quickstart's panel can set the burst
    panel = TuningPanel(
        SCENARIOS / "retry_storm_429.toml",
        {"quotas.llm.requests_per_min": (60, 240, 10), "quotas.llm.request_burst": (1, 120)},
    )
    panel.controls["quotas.llm.requests_per_min"].value = 120
    panel.controls["quotas.llm.request_burst"].value = 5
    failed = panel.last_result.summary["tasks_failed"]
    title = panel.chart_title.replace("\n", " ")
    assert "request quota 120 requests/min" in title and "request burst 5 requests" in title
    assert f"{failed} failed tasks" in title
    assert panel.plot.value[:8] == b"\x89PNG\r\n\x1a\n"  # the chart, drawn into an Image widget


def test_seed_bands_are_student_t_intervals_of_the_mean() -> None:
    from aiqsim.validation import t_quantile_975

    frame = pd.DataFrame({"x": [1] * 4 + [2] * 4, "y": [1.0, 2.0, 3.0, 6.0, 2.0, 2.0, 3.0, 3.0]})
    fig = charts.metric_vs_parameter(frame, "x", "y")
    band = fig.axes[0].collections[0].get_paths()[0].vertices
    at_one = frame[frame["x"] == 1]["y"]
    half = t_quantile_975(3) * at_one.std() / 2  # 3.18 sd / sqrt(4), not 1.96
    assert band[:, 1].max() == pytest.approx(
        max(at_one.mean() + half, 2.5 + t_quantile_975(3) * 0.57735 / 2), rel=1e-3
    )
    assert charts.t_band_half_width(at_one.std(), 4) == pytest.approx(half)
    assert charts.t_band_half_width(1.0, 1) == 0.0
    assert "band: 95% t-interval of the mean over 4 seeds" in labels(fig.axes[0])
    plt.close(fig)


def test_titles_name_a_best_setting_only_when_the_seed_bands_single_it_out() -> None:
    overlapping = pd.DataFrame({"base": [1, 1, 1, 2, 2, 2], "y": [5.0, 9.0, 7.0, 6.0, 8.0, 7.5]})
    fig = charts.metric_vs_parameter(overlapping, "base", "y")
    title = fig.axes[0].get_title().replace("\n", " ")
    assert "lowest at" not in title and "no clear lowest" in title and "1 other setting within" in title
    plt.close(fig)
    clear = pd.DataFrame({"base": [1, 1, 1, 2, 2, 2], "y": [5.0, 5.1, 5.2, 9.0, 9.1, 9.2]})
    fig = charts.metric_vs_parameter(clear, "base", "y")
    assert (
        fig.axes[0].get_title().replace("\n", " ").startswith("y lowest at base 1 (its 95% seed band clear")
    )
    plt.close(fig)


def test_a_chart_given_a_decision_states_its_rule_marks_the_choice_and_crosses_out_what_it_rejects() -> None:
    from aiqsim.lab.decisions import best_setting

    # the fastest rate (180/min) fails tasks: a title must not promote it
    sweep_rows = pd.DataFrame(
        {
            "quotas.llm.requests_per_min": [120, 120, 150, 150, 180, 180],
            "seed": [0, 1] * 3,
            "success_latency_p99_s": [60.0, 62.0, 50.0, 51.0, 40.0, 41.0],
            "tasks_failed": [0, 0, 0, 2, 9, 8],
        }
    )
    decision = best_setting(sweep_rows, ["quotas.llm.requests_per_min"], "success_latency_p99_s",
                            constraints={"tasks_failed": 0}, scenario_file="s.toml")  # fmt: skip
    assert decision.settings == {"quotas.llm.requests_per_min": 120}
    fig = charts.metric_vs_parameter(sweep_rows, "quotas.llm.requests_per_min", "success_latency_p99_s",
                                     decision=decision)  # fmt: skip
    ax = fig.axes[0]
    title = ax.get_title().replace("\n", " ")
    assert title.startswith("chosen request quota 120 requests/min: ") and decision.rule in title
    assert "180" not in title
    chosen = next(ln for ln in ax.get_lines() if ln.get_label().startswith("chosen: "))
    assert list(chosen.get_xdata()) == [120] and list(chosen.get_ydata()) == [61.0]
    crossed = next(ln for ln in ax.get_lines() if ln.get_marker() == "x" and len(ln.get_xdata()))
    assert sorted(crossed.get_xdata()) == [150, 180]  # a seed of each failed a task
    plt.close(fig)


def test_a_pareto_chart_given_a_decision_draws_the_target_and_does_not_name_the_cheapest(grid) -> None:
    from aiqsim.lab.decisions import best_setting

    params = ["retry.attempt_timeout_s", "retry.base_s"]
    target = float(grid["success_latency_p99_s"].median())  # some settings miss it on a seed
    decision = best_setting(grid, params, "cost_total", constraints={"success_latency_p99_s": target},
                            scenario_file="s.toml")  # fmt: skip
    fig = charts.pareto(grid, params, reference={f"p99 target {target:g} s": target}, decision=decision)
    ax = fig.axes[0]
    title = ax.get_title().replace("\n", " ")
    assert decision.rule in title and "cheapest" not in title
    chosen = next(ln for ln in ax.get_lines() if ln.get_label().startswith("chosen: "))
    means = grid.groupby(params)[["cost_total"]].mean()
    assert chosen.get_xdata()[0] == pytest.approx(
        means.loc[tuple(decision.settings[p] for p in params)].iloc[0]
    )
    missing = grid.groupby(params)["success_latency_p99_s"].max() > target
    crossed = next(ln for ln in ax.get_lines() if ln.get_label() == charts.REJECTED_LABEL)
    assert len(crossed.get_xdata()) == int(missing.sum()) > 0
    assert any(ln.get_label() == f"p99 target {target:g} s" for ln in ax.get_lines())
    plt.close(fig)
