"""The lab charts' shared style: a colour-blind-safe palette, axis labels with units, printable text.

Every chart in :mod:`aiqsim.lab.charts` draws through these helpers so the figures read the same way:
Okabe-Ito colours (distinguishable with the common colour-vision deficiencies), a unit on every axis,
text the installed fonts can draw (no "Glyph missing" warnings and empty boxes for a scenario name in
a script the font lacks), and heatmap annotations whose colour follows the cell's luminance.
A notebook that draws a chart of its own takes the same style through :func:`subplots` and
:func:`set_title` (tests/test_notebook_charts.py refuses a notebook figure made any other way).
"""

from __future__ import annotations

import functools
import math
import textwrap
import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from matplotlib import font_manager
from matplotlib.colors import to_rgb

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

OKABE_ITO: tuple[str, ...] = (
    "#0072B2",  # blue
    "#D55E00",  # vermillion
    "#009E73",  # bluish green
    "#E69F00",  # orange
    "#CC79A7",  # reddish purple
    "#56B4E9",  # sky blue
    "#F0E442",  # yellow (fills only: too light for thin lines on white)
    "#000000",  # black
)
"""Okabe & Ito's colour-blind-safe palette, in the order lines take it."""

ROLE_COLOURS: dict[str, str] = {
    "attempts": OKABE_ITO[0],
    "rate_limited": OKABE_ITO[1],
    "successes": OKABE_ITO[2],
    "errors": OKABE_ITO[4],
    "reference": "#555555",
    "failed": OKABE_ITO[1],
}
"""One colour per meaning, the same in every chart (429s are always vermillion, successes green)."""

PAGE_WIDTH_PX = 658.0
"""Width (CSS px) at which the documentation site shows a notebook's chart on a desktop window: Material
for MkDocs' content column, its grid (61rem) less the two sidebars (12.1rem each) and the content
margins (1.2rem each), 34.4rem = 688 px at the theme's 20 px rem; less the notebook's and the cell's
padding (2 x 10 and 2 x 5 px, mkdocs-jupyter's stylesheet). docs/stylesheets/extra.css hides the output
prompt column beside an image, which would take another 64 px. A wider PNG is scaled down to this width
(``max-width: 100%``)."""

MIN_TEXT_PX = 11.0
"""The smallest text a chart may show at :data:`PAGE_WIDTH_PX` (CSS px). Material's body text is 16 px
and the smallest text the notebook pages set themselves (cell tags, JupyterLab's small UI font) is
11 px; chart text below that, ticks and legends included, has to be zoomed to be read."""

TEXT_PT = 10.0
"""Tick labels, legends, annotations and axis labels (points)."""

TITLE_PT = 11.0
"""Titles (points)."""

FIGURE_WIDTH_IN = 7.8
"""The width of every lab chart (inches): under the widest at which :data:`TEXT_PT` text still shows at
:data:`MIN_TEXT_PX` once the PNG is scaled to the page (:func:`max_figure_width_in`: 8.3 in), with room
for what ``bbox_inches="tight"`` adds around a legend or a title."""


def displayed_text_px(
    size_pt: float, dpi: float, png_width_px: float, page_px: float = PAGE_WIDTH_PX
) -> float:
    """The height (CSS px) of ``size_pt`` text in a PNG drawn at ``dpi`` and ``png_width_px`` wide, shown
    at most ``page_px`` wide (a wider image is scaled down to the page, a narrower one shown as it is)."""
    return size_pt * dpi / 72.0 * min(1.0, page_px / png_width_px)


def max_figure_width_in(size_pt: float = TEXT_PT) -> float:
    """The widest figure (inches) whose ``size_pt`` text shows at :data:`MIN_TEXT_PX` on the page, at
    any dpi (a figure wider than the page is scaled to it, so only the ratio of text to width counts)."""
    return size_pt / 72.0 * PAGE_WIDTH_PX / MIN_TEXT_PX


def style_axes(ax: Axes) -> None:
    """Give an axis the lab's look: the Okabe-Ito colour cycle, a light grid, :data:`TEXT_PT` ticks and
    axis labels, a :data:`TITLE_PT` title (what :mod:`aiqsim.lab.charts` does to every axis it draws)."""
    ax.set_prop_cycle(color=list(OKABE_ITO))
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=TEXT_PT)
    ax.xaxis.label.set_size(TEXT_PT)
    ax.yaxis.label.set_size(TEXT_PT)
    ax.title.set_size(TITLE_PT)  # a title set later by ax.set_title takes matplotlib's 12 pt: use set_title


def subplots(nrows: int = 1, ncols: int = 1, *, height_in: float = 4.5, **kwargs: Any) -> tuple[Figure, Any]:
    """``plt.subplots`` for a chart drawn in a notebook: :data:`FIGURE_WIDTH_IN` wide, constrained
    layout, every axis through :func:`style_axes`, so its text shows at :data:`MIN_TEXT_PX` on the
    documentation site. Two panels side by side leave each ~3.5 inches: put panels with long titles
    or tick labels in rows instead (``nrows=2``) and give the figure the height they need."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        nrows, ncols, figsize=(FIGURE_WIDTH_IN, height_in), constrained_layout=True, **kwargs
    )
    for ax in fig.axes:
        style_axes(ax)
    return fig, axes


def set_title(ax: Axes, text: str, width_in: float | None = None) -> None:
    """``text`` as ``ax``'s title at :data:`TITLE_PT`, wrapped to ``width_in`` inches (default: the
    figure's width). ``ax.set_title`` alone would reset the size to matplotlib's 12 pt and let a long
    title run past the figure."""
    width = ax.figure.get_figwidth() if width_in is None else width_in
    ax.set_title(wrap(printable(text), width), fontsize=TITLE_PT)


def wrap(text: str, width_in: float = FIGURE_WIDTH_IN, size_pt: float = TITLE_PT) -> str:
    """``text`` broken into lines that fit ``width_in`` inches at ``size_pt`` (~110 / size_pt characters
    an inch, the width of an average DejaVu Sans character with some room): a title longer than its
    axes would otherwise widen the PNG (``bbox_inches="tight"``) and shrink all its text on the page."""
    return "\n".join(textwrap.wrap(text, max(20, int(width_in * 110 / size_pt))))


SEQUENTIAL_CMAP = "cividis"
"""Heatmap colour map: perceptually uniform and readable with colour-vision deficiencies."""

AXIS_LABELS: dict[str, str] = {
    "retry.base_s": "backoff base (s)",
    "retry.cap_s": "backoff cap (s)",
    "retry.max_attempts": "max attempts (attempts)",
    "retry.attempt_timeout_s": "attempt timeout (s)",
    "retry.first_token_timeout_s": "first-token timeout (s)",
    "retry.strategy": "backoff strategy (name)",
    "dispatch.max_wait_s": "aging bound max_wait_s (s)",
    "dispatch.policy": "dispatch policy (name)",
    "tasks_failed": "failed tasks (tasks)",
    "tasks_succeeded": "succeeded tasks (tasks)",
    "attempts": "provider attempts (calls)",
    "retries": "retries (calls)",
    "rate_limited": "429 answers (calls)",
    "attempts_per_task": "attempts per task (calls/task)",
    "cost_total": "billed cost ($)",
    "cost_duplicated": "duplicated cost ($)",
    "duplicate_billed_calls": "duplicate billed calls (calls)",
    "success_latency_p50_s": "p50 latency of succeeded tasks (s)",
    "success_latency_p95_s": "p95 latency of succeeded tasks (s)",
    "success_latency_p99_s": "p99 latency of succeeded tasks (s)",
    "failure_time_p50_s": "p50 time to failure of failed tasks (s)",
    "failure_time_p99_s": "p99 time to failure of failed tasks (s)",
    "failed_share": "failed tasks (fraction of submitted)",
    "duplicate_share": "duplicated cost (fraction of billed cost)",
    "ttft_p50_s": "p50 time to first token of succeeded tasks (s)",
    "ttft_p99_s": "p99 time to first token of succeeded tasks (s)",
    "interactive_success_latency_p99_s": "interactive p99 latency of succeeded tasks (s)",
    "background_success_latency_p99_s": "background p99 latency of succeeded tasks (s)",
    "goodput_per_s": "goodput (successes/s)",
    "quota_utilization": "quota utilisation (fraction of server rate)",
    "sim_time_s": "run length (s)",
    "factor": "quota multiplier (x the file's quota)",
    "stage": "stage (name)",
    "fallback": "fallback (provider)",
    "job_latency_p50_s": "median job latency (s)",
    "job_latency_p95_s": "p95 job latency (s)",
    "jobs_failed": "failed jobs (jobs)",
    "cost_per_succeeded_job": "cost per delivered job ($)",
    "fleet_utilization": "admitted / account limit (fraction)",
    "wasted_capacity": "wasted capacity (fraction of the limit)",
}
"""Readable axis labels, each with its unit, for the keys the lab sweeps and reports."""

_QUOTA_LABELS = {
    "requests_per_min": "client request quota (requests/min)",
    "units_per_min": "client token quota (tokens/min)",
    "request_burst": "client request burst (requests)",
    "unit_burst": "client token burst (tokens)",
    "concurrency": "client concurrency (calls in flight)",
}
"""Labels for ``quotas.<provider>.<name>`` keys (the label leaves the provider name out)."""

_SUFFIX_UNITS = (
    ("units_per_min", "tokens/min"),
    ("requests_per_min", "requests/min"),
    ("request_burst", "requests"),
    ("unit_burst", "tokens"),
    ("_per_min", "per min"),
    ("_per_s", "per s"),
    ("_prob", "probability"),
    ("_s", "s"),
    ("concurrency", "calls in flight"),
)


def axis_label(key: str) -> str:
    """A human label with a unit for a summary key or a dotted scenario key.

    Known keys come from :data:`AXIS_LABELS`; others get their unit from the name's suffix (the
    scenario format puts units in names: ``_s``, ``_per_min``, ``_prob``); a key with neither is
    returned as it is, which the chart tests catch for every chart the lab ships.
    """
    if key in AXIS_LABELS:
        return AXIS_LABELS[key]
    route = _route_label(key)
    if route is not None:
        return route
    name = key.split(".")[-1]
    if key.startswith("quotas.") and name in _QUOTA_LABELS:
        return _QUOTA_LABELS[name]
    for suffix, unit in _SUFFIX_UNITS:
        if name.endswith(suffix):
            return f"{key} ({unit})"
    return key


_DEPLOYMENT_LABELS = {
    "call_share": "share of calls to {0} (fraction)",
    "success_latency_p99_s": "p99 latency of tasks {0} answered (s)",
    "cost": "cost billed by {0} ($)",
}
"""Labels for the per-deployment summary keys ``deployment_<provider>_<name>``."""


def _route_label(key: str) -> str | None:
    """Labels for a route's keys (``routes.NAME.policy``, ``routes.NAME.weights.PROVIDER``) and the
    per-deployment summary keys; ``None`` for any other key."""
    parts = key.split(".")
    if parts[0] == "routes" and len(parts) == 3 and parts[2] == "policy":
        return "routing policy (name)"
    if parts[0] == "routes" and len(parts) == 4 and parts[2] == "weights":
        return f"weight of {parts[3]} (relative)"
    if key.startswith("deployment_"):
        for suffix, label in _DEPLOYMENT_LABELS.items():
            if key.endswith(f"_{suffix}"):
                return label.format(key[len("deployment_") : -len(suffix) - 1])
    return None


def short_setting(key: str, value: object) -> str:
    """``retry.attempt_timeout_s``, 2 -> ``"timeout 2 s"``: a setting short enough for a point label."""
    label = axis_label(key)
    name, _, unit = label.partition(" (")
    unit = unit.rstrip(")")
    words = name.replace("attempt ", "").replace("backoff ", "").replace("client ", "")
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = format_number(value)
    if unit in ("", "name"):
        return f"{words} {value}"
    return f"{words} {value} {unit}"


def format_number(value: float, significant: int = 4) -> str:
    """A number as people write it: ``800,000`` (not ``8e+05``), ``0.25``, ``12.35``, ``1,234``.

    Whole numbers keep every digit with thousands separators; others keep ``significant`` digits,
    in fixed notation, trailing zeros dropped.
    """
    if isinstance(value, int) or (math.isfinite(value) and float(value).is_integer() and abs(value) < 1e15):
        return f"{int(value):,}"
    if not math.isfinite(value):
        return str(value)
    decimals = max(0, significant - 1 - math.floor(math.log10(abs(value))))
    text = f"{value:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


@functools.lru_cache(maxsize=4096)
def _has_glyph(char: str) -> bool:
    from matplotlib import rcParams
    from matplotlib.ft2font import FT2Font

    path = font_manager.findfont(font_manager.FontProperties(family=rcParams["font.family"]))
    return FT2Font(path).get_char_index(ord(char)) != 0


def printable(text: str) -> str:
    """``text`` with every character the default font cannot draw folded to ASCII, or to ``?``.

    Accented Latin letters the font has stay as they are; a letter the font lacks is decomposed
    (NFKD) and its ASCII base kept; anything else becomes ``?``. Matplotlib would otherwise warn
    "Glyph ... missing from font(s)" and draw an empty box.
    """
    out = []
    for char in text:
        if char.isascii() or char in "\n\t" or _has_glyph(char):
            out.append(char)
            continue
        folded = "".join(c for c in unicodedata.normalize("NFKD", char) if c.isascii())
        out.append(folded or "?")
    return "".join(out)


def text_colour_for(rgb: Sequence[float] | str) -> str:
    """Black or white, whichever reads better on a cell of colour ``rgb`` (WCAG relative luminance)."""

    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in to_rgb(rgb))  # type: ignore[arg-type]
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    # contrast with black (L + 0.05) / 0.05 against white 1.05 / (L + 0.05): equal at L ~ 0.179
    return "black" if luminance > 0.179 else "white"
