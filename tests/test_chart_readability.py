"""Every lab chart, rendered on a shipped scenario, reads at a glance: no text drawn over other text, a
unit on every axis, no "Glyph missing" warning, and the facts the title and reference lines claim."""

from __future__ import annotations

import itertools
import re
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text

from aiqsim.lab import charts
from aiqsim.lab.chart_style import printable, text_colour_for
from aiqsim.sim.simulate import simulate
from aiqsim.sim.sweep import sweep

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
UNIT = re.compile(r"\(.+\)")


@pytest.fixture(scope="module")
def storm():
    return simulate(SCENARIOS / "retry_storm_429.toml", seed=1)


@pytest.fixture(scope="module")
def crash():
    return simulate(SCENARIOS / "crash_recovery.toml")


@pytest.fixture(scope="module")
def grid() -> pd.DataFrame:
    return sweep(
        SCENARIOS / "timeout_duplicate_billing.toml",
        {"retry.attempt_timeout_s": [2, 8, 30], "retry.base_s": [0.5, 2.0]},
        seeds=[0, 1],
        engine="serial",
        progress=False,
    )


def _texts(fig: Figure) -> list[Text]:
    """Every visible, non-empty text the figure draws: titles, axis labels, tick labels, annotations,
    legend entries."""
    found: list[Text] = [t for t in fig.texts]
    if fig._suptitle is not None:
        found.append(fig._suptitle)
    for ax in fig.axes:
        found += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        found += [label for axis in (ax.xaxis, ax.yaxis) for label in _drawn_tick_labels(axis)]
        legend = ax.get_legend()
        if legend is not None:
            found += list(legend.get_texts())
    return [t for t in found if t.get_visible() and t.get_text().strip()]


def _drawn_tick_labels(axis) -> list[Text]:
    """Tick labels inside the view (matplotlib keeps, but does not draw, ticks beyond the limits)."""
    low, high = sorted(axis.get_view_interval())
    span = high - low
    return [
        tick.label1
        for tick in axis.get_major_ticks()
        if low - 1e-9 * span <= tick.get_loc() <= high + 1e-9 * span and tick.label1.get_visible()
    ]


def assert_readable(fig: Figure) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig.canvas.draw()
    glyphs = [str(w.message) for w in caught if "Glyph" in str(w.message)]
    assert glyphs == []
    renderer = fig.canvas.get_renderer()
    # two unescaped "$" in one text typeset everything between them as mathtext ("$3.73 to $0.68")
    mathtext = [t.get_text() for t in _texts(fig) if len(re.findall(r"(?<!\\)\$", t.get_text())) >= 2]
    assert mathtext == [], f"accidental mathtext: {mathtext}"
    boxes = [(t.get_text(), t.get_window_extent(renderer).shrunk(0.98, 0.9)) for t in _texts(fig)]
    width, height = fig.bbox.width, fig.bbox.height
    for text, box in boxes:
        assert box.x0 >= -1 and box.y0 >= -1 and box.x1 <= width + 1 and box.y1 <= height + 1, (
            f"{text!r} is drawn outside the figure"
        )
    overlaps = [
        (a, b) for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2) if box_a.overlaps(box_b)
    ]
    assert overlaps == [], f"text drawn over text: {overlaps[:3]}"
    for ax in fig.axes:
        for axis, label in ((ax.xaxis, ax.get_xlabel()), (ax.yaxis, ax.get_ylabel())):
            ticks = [t for t in _drawn_tick_labels(axis) if t.get_text()]
            if ticks and axis.get_visible():
                assert UNIT.search(label), f"axis label {label!r} has no unit"
    plt.close(fig)


def test_every_chart_type_is_readable_on_shipped_scenarios(storm, crash, grid) -> None:
    figures = {
        "storm timeline": charts.retry_storm_timeline(
            storm.timeline, title=storm.scenario.name, **charts.run_references(storm)
        ),
        "crash timeline": charts.retry_storm_timeline(
            crash.timeline, title=crash.scenario.name, marks=charts.crash_marks(crash)
        ),
        "timeline with bucket": charts.retry_storm_timeline(
            simulate(
                SCENARIOS / "retry_storm_429.toml", overrides={"quotas.llm.requests_per_min": 150}
            ).timeline,
            show_bucket=True,
        ),
        "latency cdf": charts.latency_cdf(storm.tasks, by="priority"),
        "cost breakdown": charts.cost_breakdown(storm.calls),
        "cost breakdown, duplicates": charts.cost_breakdown(
            simulate(SCENARIOS / "timeout_duplicate_billing.toml").calls
        ),
        "metric vs parameter": charts.metric_vs_parameter(
            grid, "retry.attempt_timeout_s", "success_latency_p99_s", hue="retry.base_s"
        ),
        "cost duplication": charts.cost_duplication(grid, "retry.attempt_timeout_s", hue="retry.base_s"),
        "heatmap": charts.heatmap(grid, "retry.attempt_timeout_s", "retry.base_s", "success_latency_p99_s"),
        "pareto": charts.pareto(grid, ["retry.attempt_timeout_s", "retry.base_s"]),
        "heatmap, quota keys": charts.heatmap(
            sweep(
                SCENARIOS / "retry_storm_429.toml",
                {"quotas.llm.requests_per_min": [100, 120, 150], "quotas.llm.request_burst": [1, 60]},
                seeds=[0],
                engine="serial",
                progress=False,
            ),
            "quotas.llm.requests_per_min",
            "quotas.llm.request_burst",
            "quota_utilization",
            fmt="{:.2f}",
        ),
    }
    for name, fig in figures.items():
        try:
            assert_readable(fig)
        except AssertionError as error:
            raise AssertionError(f"{name}: {error}") from None


def test_storm_timeline_draws_the_server_quota_and_the_offered_load(storm) -> None:
    references = charts.run_references(storm)
    assert references["server_rate_per_s"] == pytest.approx(120 / 60)
    arrived = (storm.tasks["arrived_at"] <= storm.scenario.duration_s).sum()
    assert references["offered_per_s"] == pytest.approx(arrived / storm.scenario.duration_s)
    assert 2.5 < references["offered_per_s"] < 3.5  # 3/s Poisson for 120 s
    fig = charts.retry_storm_timeline(storm.timeline, **references)
    ax = fig.axes[0]
    levels = {
        line.get_label(): line.get_ydata()[0] for line in ax.get_lines() if len(set(line.get_ydata())) == 1
    }
    assert levels["server quota 2/s"] == pytest.approx(2.0)
    offered = next(k for k in levels if k.startswith("offered load"))
    assert levels[offered] == pytest.approx(references["offered_per_s"])
    assert f"{int(storm.summary['rate_limited'])} answered 429" in ax.get_title().replace("\n", " ")
    plt.close(fig)


def test_timeline_leaves_out_a_series_that_is_zero_throughout_and_says_so() -> None:
    frame = pd.DataFrame(
        {"t": np.arange(5.0), "provider": "llm", "attempts": [3, 3, 4, 3, 3], "rate_limited": 0,
         "successes": [2, 3, 0, 0, 3], "errors": [1, 0, 4, 3, 0]}
    )  # fmt: skip
    fig = charts.retry_storm_timeline(frame)
    ax = fig.axes[0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert "429s/s" not in labels and "errors/s" in labels
    assert "no 429s in this run" in [t.get_text() for t in ax.get_legend().get_texts()]
    plt.close(fig)


def test_crash_moment_is_marked(crash) -> None:
    marks = charts.crash_marks(crash)
    assert marks == {"crash": 30.0, "restart": 35.0}
    fig = charts.retry_storm_timeline(crash.timeline, marks=marks)
    vertical = [line for line in fig.axes[0].get_lines() if len(set(line.get_xdata())) == 1]
    assert sorted(line.get_xdata()[0] for line in vertical) == [30.0, 35.0]
    assert len(fig.axes) == 1, "no secondary axis unless asked for"
    plt.close(fig)


def test_latency_cdf_separates_failed_tasks_and_names_groups_only_when_there_are_several(storm) -> None:
    fig = charts.latency_cdf(storm.tasks, by="priority")
    ax = fig.axes[0]
    assert "by priority" not in ax.get_title()  # the storm has a single priority
    lines = {line.get_label().split(" ")[0]: line for line in ax.get_lines()}
    failed = storm.summary["tasks_failed"]
    assert set(lines) == {"succeeded", "failed", "all"}
    assert lines["failed"].get_label().startswith(f"failed {failed} of ")
    assert lines["failed"].get_linestyle() == "--"
    plt.close(fig)
    both = pd.concat([storm.tasks.assign(run="a"), storm.tasks.assign(run="b")])
    fig = charts.latency_cdf(both, by="run")
    assert "by run" in fig.axes[0].get_title()
    plt.close(fig)


def test_an_identical_line_is_named_not_hidden() -> None:
    frame = pd.DataFrame(
        {
            "x": [1, 2, 1, 2, 1, 2],
            "y": [5.0, 3.0, 5.0, 3.0, 4.0, 1.0],
            "retry.base_s": [0.5, 0.5, 2.0, 2.0, 4.0, 4.0],
        }
    )
    fig = charts.metric_vs_parameter(frame, "x", "y", hue="retry.base_s")
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert labels == ["base 0.5 s", "base 2 s (same as base 0.5 s, within 1% of the range)", "base 4 s"]
    plt.close(fig)


def test_heatmap_text_colour_follows_cell_luminance(grid) -> None:
    assert text_colour_for("#ffe945") == "black" and text_colour_for("#00204c") == "white"
    fig = charts.heatmap(grid, "retry.attempt_timeout_s", "retry.base_s", "success_latency_p99_s")
    ax = fig.axes[0]
    image = ax.get_images()[0]
    for text in ax.texts:
        x, y = text.get_position()
        value = image.get_array()[int(y), int(x)]
        assert text.get_color() == text_colour_for(image.cmap(image.norm(value)))
    assert {t.get_color() for t in ax.texts} == {"black", "white"}  # both occur on this grid
    plt.close(fig)


def test_non_ascii_scenario_names_draw_without_missing_glyphs(storm) -> None:
    name = "Überlast 過負荷 storm"
    assert printable(name) == "Überlast ??? storm"  # DejaVu has Ü, not the CJK ideographs
    fig = charts.retry_storm_timeline(storm.timeline, title=name)
    assert fig.axes[0].get_title().replace("\n", " ").startswith("Überlast ??? storm")
    assert_readable(fig)
