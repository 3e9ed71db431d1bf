"""Every lab chart is legible at the width the documentation site shows it.

The site (Material for MkDocs with mkdocs-jupyter) shows a notebook's chart 658 CSS px wide on a desktop
window (:data:`~aiqsim.lab.chart_style.PAGE_WIDTH_PX`: the content column less the notebook's and the
cell's padding, checked against the installed stylesheets below); a wider PNG is scaled down to it.
What a reader sees is then the text's height in the PNG times that scale, whatever the dpi:
``points x dpi / 72 x min(1, 658 / PNG width)``. The floor is
:data:`~aiqsim.lab.chart_style.MIN_TEXT_PX`, 11 px: the smallest text the notebook pages set themselves
(cell tags, JupyterLab's small UI font), against 16 px body text. Before, the lab drew its charts 9 to
11 inches wide with 9 pt ticks and legends, beside a 64 px output prompt: 6.7 to 8.1 px on the page.
"""

from __future__ import annotations

import io
import re
import struct
from collections.abc import Callable
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
from aiqsim.lab.chart_style import (
    FIGURE_WIDTH_IN,
    MIN_TEXT_PX,
    PAGE_WIDTH_PX,
    displayed_text_px,
    max_figure_width_in,
)
from aiqsim.lab.decisions import best_setting
from aiqsim.sim.simulate import simulate
from aiqsim.sim.sweep import sweep

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
TIMEOUT, BASE = "retry.attempt_timeout_s", "retry.base_s"


@pytest.fixture(scope="module")
def runs() -> dict[str, object]:
    storm = simulate(SCENARIOS / "retry_storm_429.toml", seed=1)
    grid = sweep(
        SCENARIOS / "timeout_duplicate_billing.toml",
        {"retry.attempt_timeout_s": [2, 8, 30], "retry.base_s": [0.5, 2.0]},
        seeds=[0, 1],
        engine="serial",
        progress=False,
    )
    decision = best_setting(
        grid, [TIMEOUT, BASE], "cost_total", constraints={"success_latency_p99_s": 60}, scenario_file="x.toml"
    )
    return {"storm": storm, "grid": grid, "decision": decision}


CHARTS: dict[str, Callable[[dict[str, object]], Figure]] = {
    "storm timeline": lambda r: charts.retry_storm_timeline(
        r["storm"].timeline, title=r["storm"].scenario.name, **charts.run_references(r["storm"])
    ),
    "latency cdf": lambda r: charts.latency_cdf(r["storm"].tasks, by="priority"),
    "cost breakdown": lambda r: charts.cost_breakdown(r["storm"].calls),
    "metric vs parameter": lambda r: charts.metric_vs_parameter(
        r["grid"], TIMEOUT, "success_latency_p99_s", hue=BASE
    ),
    "cost duplication": lambda r: charts.cost_duplication(r["grid"], TIMEOUT, hue=BASE),
    "heatmap": lambda r: charts.heatmap(r["grid"], TIMEOUT, BASE, "success_latency_p99_s"),
    "pareto": lambda r: charts.pareto(r["grid"], [TIMEOUT, BASE]),
    "pareto with a decision": lambda r: charts.pareto(
        r["grid"], [TIMEOUT, BASE], reference={"p99 target 60 s": 60}, decision=r["decision"]
    ),
    "seed ranges, two metrics": lambda r: charts.seed_ranges(
        r["grid"], TIMEOUT, ["cost_total", "success_latency_p99_s"]
    ),
    "seed ranges, three metrics": lambda r: charts.seed_ranges(
        r["grid"],
        [TIMEOUT, BASE],
        ["cost_total", "success_latency_p99_s", "cost_duplicated"],
        chosen=(8, 0.5),
    ),
}


def png_width(fig: Figure, dpi: float) -> int:
    """The pixel width of the PNG the notebook's inline backend would show (``bbox_inches="tight"``)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    data = buffer.getvalue()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">I", data[16:20])[0]


def assert_no_text_over_text(fig: Figure) -> None:
    """No drawn text overlaps another (the readability suite's check, with figure legends and a
    suptitle, which that suite's list of texts names twice)."""
    from test_chart_readability import _texts

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = _texts(fig) + [t for legend in fig.legends for t in legend.get_texts()]
    unique = list({id(t): t for t in texts}.values())
    boxes = [(t.get_text(), t.get_window_extent(renderer).shrunk(0.98, 0.9)) for t in unique]
    overlaps = [
        (a, b) for i, (a, box) in enumerate(boxes) for b, other in boxes[i + 1 :] if box.overlaps(other)
    ]
    assert overlaps == [], overlaps[:3]
    width = fig.bbox.width
    assert all(box.x0 >= -1 and box.x1 <= width + 1 for _, box in boxes), "text drawn outside the figure"


def drawn_texts(fig: Figure) -> list[Text]:
    """Every visible text with characters: titles, labels, ticks, legends, annotations, colour bars."""
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


@pytest.mark.parametrize("name", list(CHARTS))
@pytest.mark.parametrize("dpi", [100, 200], ids=["inline dpi 100", "dpi 200"])
def test_every_lab_chart_shows_its_smallest_text_at_the_floor_at_page_width(
    runs: dict[str, object], name: str, dpi: float
) -> None:
    fig = CHARTS[name](runs)
    try:
        width = png_width(fig, dpi)
        assert width / dpi <= max_figure_width_in() + 0.05, f"{name}: {width} px at {dpi} dpi is too wide"
        smallest = min(drawn_texts(fig), key=lambda t: t.get_fontsize())
        shown = displayed_text_px(smallest.get_fontsize(), dpi, width)
        assert shown >= MIN_TEXT_PX, (
            f"{name}: {smallest.get_text()!r} at {smallest.get_fontsize()} pt shows at {shown:.1f} px "
            f"in a {width} px PNG on a {PAGE_WIDTH_PX:g} px page"
        )
    finally:
        plt.close(fig)


def test_the_floor_arithmetic() -> None:
    """A figure twice the page's width halves its text; a narrower one is shown as drawn."""
    assert displayed_text_px(10, 100, 2 * PAGE_WIDTH_PX) == pytest.approx(10 * 100 / 72 / 2)
    assert displayed_text_px(10, 100, PAGE_WIDTH_PX / 2) == pytest.approx(10 * 100 / 72)
    assert max_figure_width_in(10) == pytest.approx(10 / 72 * PAGE_WIDTH_PX / MIN_TEXT_PX)
    assert max_figure_width_in() >= FIGURE_WIDTH_IN
    # the lab's former style: 9 pt ticks on a 10 inch figure, beside the output prompt, showed at 7.3 px
    assert displayed_text_px(9, 100, 1011, PAGE_WIDTH_PX - 64) < MIN_TEXT_PX


def test_the_page_width_is_materials_content_column_less_the_notebook_padding() -> None:
    """:data:`PAGE_WIDTH_PX` is what the installed stylesheets give: Material's grid less two sidebars and
    the content margins, in rem of the root font size (125 % of 16 px), less mkdocs-jupyter's notebook
    and cell padding on each side (the output prompt beside an image is hidden by the site's extra.css,
    tests/test_docs.py)."""
    material = pytest.importorskip("material")
    jupyter = pytest.importorskip("mkdocs_jupyter")
    assets = Path(material.__file__).parent / "templates" / "assets" / "stylesheets"
    sheets = list(assets.glob("main.*.min.css"))
    assert sheets, "no Material stylesheet installed"
    css = sheets[0].read_text(encoding="utf-8")
    notebook_css = (
        Path(jupyter.__file__).parent / "templates" / "mkdocs_html" / "assets" / "index.css"
    ).read_text(encoding="utf-8")

    def number(pattern: str, text: str = css) -> float:
        found = re.search(pattern, text)
        assert found is not None, pattern
        return float(found.group(1))

    grid = number(r"\.md-grid\{max-width:([\d.]+)rem")
    sidebar = number(r"\.md-sidebar\{[^}]*width:([\d.]+)rem")
    margin = number(r"\.md-content__inner\{margin-left:([\d.]+)rem")
    root = number(r"html\{[^}]*font-size:([\d.]+)%") / 100 * 16
    column = (grid - 2 * sidebar - 2 * margin) * root
    assert column == pytest.approx(688)
    notebook = number(r"--jp-notebook-padding: ([\d.]+)px", notebook_css)
    cell = number(r"--jp-cell-padding: ([\d.]+)px", notebook_css)
    assert column - 2 * notebook - 2 * cell == pytest.approx(PAGE_WIDTH_PX)


def test_seed_ranges_draws_one_panel_per_metric_two_a_row() -> None:
    frame = pd.DataFrame({"x": [1, 1, 2, 2], "a": [1.0, 2.0, 3.0, 4.0], "b": [1.0, 1.5, 2.0, 2.5]})
    frame["c"] = frame["a"] * 2
    fig = charts.seed_ranges(frame, "x", ["a", "b", "c"])
    try:
        shown = [ax for ax in fig.axes if ax.get_visible()]
        assert len(shown) == 3
        assert len({round(ax.get_position().y0, 2) for ax in shown}) == 2, "not two rows"
        assert fig.get_figwidth() <= FIGURE_WIDTH_IN
    finally:
        plt.close(fig)


def test_a_long_finding_is_wrapped_not_widening_the_chart() -> None:
    frame = pd.DataFrame({"x": [1, 1, 2, 2], "a": [1.0, 2.0, 3.0, 4.0], "b": [1.0, 1.5, 2.0, 2.5]})
    title = "4 workers, one account of 120 requests/min, uneven load: a split wastes 31% of it, " * 2
    fig = charts.seed_ranges(frame, "x", ["a", "b"], title=title)
    try:
        assert png_width(fig, 100) / 100 <= max_figure_width_in() + 0.05
        assert fig._suptitle is not None and "\n" in fig._suptitle.get_text()
    finally:
        plt.close(fig)


def test_a_legend_with_a_long_entry_goes_below_the_plot_and_the_figure_grows(runs: dict[str, object]) -> None:
    """Beside the plot, "rejected by the decision (a seed breaks a constraint)" took most of a chart the
    page's width; below the axis label it leaves the plot the whole width and its height."""
    plain = charts.pareto(runs["grid"], [TIMEOUT, BASE])
    fig = CHARTS["pareto with a decision"](runs)
    try:
        fig.canvas.draw()
        ax = fig.axes[0]
        legend = ax.get_legend()
        assert legend is not None and charts.REJECTED_LABEL in [t.get_text() for t in legend.get_texts()]
        renderer = fig.canvas.get_renderer()
        assert legend.get_window_extent(renderer).y1 < ax.xaxis.label.get_window_extent(renderer).y0
        assert fig.get_figheight() > plain.get_figheight()
        assert ax.get_position().width > 0.8, "the plot does not have the figure's width"
    finally:
        plt.close(fig)
        plt.close(plain)


def test_seed_ranges_with_long_labels_a_log_axis_and_four_panels_has_no_text_over_text() -> None:
    """The shapes the notebooks draw: four policies' criteria with bounds and a star; three fleet metrics,
    one on a log axis over less than a decade (whose default labels ran into each other)."""
    rng = np.random.default_rng(0)
    policies = ["no backoff", "backoff only", "retry token bucket", "retry ratio budget", "circuit breaker"]
    metrics = ["amplification (attempts/task, outage)", "goodput shortfall (tasks/s)", "recovery time (s)"]
    judged = pd.DataFrame(
        [{"policy": p, **{m: rng.random() * 5 for m in metrics}} for p in policies for _ in "abc"]
    )
    judged["failed after the outage (tasks)"] = rng.random(len(judged)) * 200
    fleet = pd.DataFrame(
        [
            {"quota": q, "routing": r, "fleet_utilization": 0.7 + 0.3 * rng.random(),
             "wasted_capacity": 0.3 * rng.random(), "success_latency_p95_s": 90 + 360 * rng.random()}
            for q in ("shared", "split") for r in ("weighted", "round_robin") for _ in range(5)
        ]
    )  # fmt: skip
    figures = [
        charts.seed_ranges(
            judged, "policy", [*metrics, "failed after the outage (tasks)"], chosen="retry ratio budget",
            limits={"goodput shortfall (tasks/s)": (0.3, "bound: 10% of backoff only's goodput"),
                    "failed after the outage (tasks)": (0, "bound: none failed")},
            title="chosen: retry ratio budget - fewest attempts per task during the outage, within bounds",
        ),
        charts.seed_ranges(
            fleet, ["quota", "routing"], ["fleet_utilization", "wasted_capacity", "success_latency_p95_s"],
            centre="median", limits={"fleet_utilization": (1.0, "the account's limit")},
            log=["success_latency_p95_s"],
        ),
    ]  # fmt: skip
    try:
        for fig in figures:
            assert_no_text_over_text(fig)
            assert png_width(fig, 100) / 100 <= max_figure_width_in() + 0.05
        ticks = [t.get_text() for t in figures[1].axes[2].get_xticklabels() if t.get_text()]
        assert ticks and all(re.fullmatch(r"[\d,.]+", t) for t in ticks), ticks
    finally:
        for fig in figures:
            plt.close(fig)
