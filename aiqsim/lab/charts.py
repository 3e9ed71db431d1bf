"""Charts for the tuning lab: functions that take DataFrames and return matplotlib figures.

Each function draws one question: is there a retry storm, who waits how long, what do
duplicates cost, which settings are on the latency/cost frontier. Where a sweep has several
seeds, lines carry a 95% Student-t confidence band of the mean over the seeds.

One style throughout (:mod:`aiqsim.lab.chart_style`): a colour-blind-safe palette, a unit on every
axis, titles that state what the data shows (computed from it), reference lines for the limits the
story is about, legends outside the plotted area so they never cover a line, and text the installed
fonts can draw.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from aiqsim.lab.chart_style import (
    FIGURE_WIDTH_IN,
    OKABE_ITO,
    ROLE_COLOURS,
    SEQUENTIAL_CMAP,
    TEXT_PT,
    TITLE_PT,
    axis_label,
    format_number,
    printable,
    short_setting,
    style_axes,
    text_colour_for,
)
from aiqsim.validation import t_quantile_975

REJECTED_LABEL = "rejected by the decision (a seed breaks a constraint)"
"""Legend entry of the crossed-out points: settings a decision's constraints rule out."""

SUCCESS = ("succeeded", "deduped")
"""Task statuses in which the user got a result (the tasks a latency of succeeded tasks counts)."""


def _new_figure(width: float = FIGURE_WIDTH_IN, height: float = 4.5) -> tuple[Figure, Axes]:
    fig, ax = plt.subplots(figsize=(width, height), constrained_layout=True)
    _style(ax)
    return fig, ax


def _style(ax: Axes) -> None:
    style_axes(ax)


def _title(ax: Axes, prefix: str, finding: str) -> None:
    """``prefix: finding`` (or just the finding) in printable text, wrapped to the figure's width."""
    text = f"{prefix}: {finding}" if prefix else finding
    # ~ characters per line at 11 pt over the axes, which share the figure's width with an outside legend
    width = max(30, int(ax.figure.get_figwidth() * 6))
    if len(text) > width:
        text = "\n".join(textwrap.wrap(text, width))
    ax.set_title(_literal(printable(text)), fontsize=TITLE_PT)


def _legend_outside(
    ax: Axes, handles: Sequence[Any] | None = None, labels: Sequence[str] | None = None
) -> None:
    """A legend outside the axes, where it cannot cover a line (constrained layout makes room): to the
    right, or below the axis label when an entry is too long to leave the plot most of the width."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    texts = [printable(str(label)) for label in labels or []]
    longest = max(map(len, texts))
    if longest <= LONG_LEGEND_ENTRY:
        ax.legend(handles, texts, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=TEXT_PT,
                  frameon=False)  # fmt: skip
        return
    # anchored at the axes' bottom edge and pushed down by a pad in font sizes, so it clears the tick
    # labels and the axis label at any figure height; two columns while two entries fit the width
    columns = 2 if longest <= 44 else 1
    ax.legend(handles, texts, loc="upper center", bbox_to_anchor=(0.5, 0.0), borderaxespad=3.6,
              ncols=columns, fontsize=TEXT_PT, frameon=False)  # fmt: skip
    # the figure grows by the legend's height (entries ~1.45 font sizes apart, the pad above), so the
    # plot keeps its height
    rows = math.ceil(len(texts) / columns)
    fig = ax.get_figure()
    if fig is not None:
        fig.set_figheight(fig.get_figheight() + (rows * 1.45 + 3.6) * TEXT_PT / 72)


LONG_LEGEND_ENTRY = 32
"""Characters: a legend with a longer entry goes below the axes (beside them it would take more than a
third of a chart :data:`~aiqsim.lab.chart_style.FIGURE_WIDTH_IN` wide)."""


def _literal(text: str) -> str:
    """``text`` with ``$`` escaped, so "$3.73 to $0.68" is not typeset as mathtext between the two signs."""
    return text.replace("\\$", "$").replace("$", "\\$")


def run_references(result: Any, provider: str | None = None) -> dict[str, float | None]:
    """The two rates a retry-storm timeline is about, read from a simulation result.

    ``server_rate_per_s``: the provider's server request quota per second (None without one).
    ``offered_per_s``: submissions per second over the scenario's ``duration_s`` (the offered load).
    Pass them to :func:`retry_storm_timeline` (``**run_references(result)``).
    """
    scenario = result.scenario
    providers = [p for p in scenario.providers if provider is None or p.name == provider]
    rates = [p.server_requests_per_min for p in providers if p.server_requests_per_min is not None]
    tasks = result.tasks
    if provider is not None:
        tasks = tasks[tasks["provider"] == provider]
    duration = float(scenario.duration_s)
    arrived = int((tasks["arrived_at"] <= duration).sum()) if duration > 0 else 0
    return {
        "server_rate_per_s": sum(rates) / 60.0 if rates else None,
        "offered_per_s": arrived / duration if duration > 0 else None,
    }


def crash_marks(result: Any) -> dict[str, float]:
    """``{"crash": t, "restart": t + delay}`` for each timed crash of a result's scenario (for ``marks``)."""
    marks: dict[str, float] = {}
    for i, crash in enumerate(c for c in result.scenario.crashes if c.at_s is not None):
        suffix = "" if i == 0 else f" {i + 1}"
        marks[f"crash{suffix}"] = float(crash.at_s)
        marks[f"restart{suffix}"] = float(crash.at_s + crash.restart_after_s)
    return marks


def retry_storm_timeline(
    timeline: pd.DataFrame,
    provider: str | None = None,
    *,
    title: str = "",
    server_rate_per_s: float | None = None,
    offered_per_s: float | None = None,
    marks: Mapping[str, float] | None = None,
    show_bucket: bool = False,
) -> Figure:
    """Attempts, 429s, errors and successes per second over time, against the configured limits.

    ``server_rate_per_s`` and ``offered_per_s`` draw horizontal reference lines (see
    :func:`run_references`); ``marks`` draws labelled vertical lines (e.g. :func:`crash_marks`). A
    series that is zero throughout (429s in a 503 outage) is left out and named in the legend's place.
    ``show_bucket`` adds the client bucket level on a second axis (tokens if the provider has a token
    quota, else requests); it is off by default because a token level (hundreds of thousands) would
    dominate the chart.
    """
    frame = timeline if provider is None else timeline[timeline["provider"] == provider]
    grouped = frame.groupby("t", as_index=True)
    series = [c for c in ("attempts", "rate_limited", "errors", "successes") if c in frame]
    counts = grouped[series].sum()
    step = float(np.diff(counts.index.to_numpy()[:2])[0]) if len(counts) > 1 else 1.0
    fig, ax = _new_figure(FIGURE_WIDTH_IN, 4.5)
    names = {
        "attempts": "attempts/s",
        "rate_limited": "429s/s",
        "errors": "errors/s",
        "successes": "successes/s",
    }
    absent = []
    for column in series:
        if column in ("rate_limited", "errors") and not counts[column].any():
            absent.append(names[column].removesuffix("/s"))
            continue
        ax.plot(counts.index, counts[column] / step, label=names[column], color=ROLE_COLOURS[column], lw=1.4)
    if server_rate_per_s is not None:
        ax.axhline(server_rate_per_s, color=ROLE_COLOURS["reference"], ls="--", lw=1.2,
                   label=f"server quota {server_rate_per_s:.3g}/s")  # fmt: skip
    if offered_per_s is not None:
        ax.axhline(
            offered_per_s, color=OKABE_ITO[3], ls=":", lw=1.6, label=f"offered load {offered_per_s:.3g}/s"
        )
    for i, (name, at) in enumerate((marks or {}).items()):
        ax.axvline(at, color=OKABE_ITO[7], ls="-." if i % 2 == 0 else ":",
                   lw=1.3, label=f"{name} at {at:g} s")  # fmt: skip
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("calls per second (calls/s)")
    ax.set_ylim(bottom=0)
    handles, labels = ax.get_legend_handles_labels()
    if show_bucket:
        for column, label, unit in (
            ("tokens_level", "client token bucket", "tokens"),
            ("requests_level", "client request bucket", "requests"),
        ):
            if column in frame and frame[column].notna().any():
                level = grouped[column].mean()
                twin = ax.twinx()
                twin.plot(level.index, level, color=OKABE_ITO[5], linestyle="--", label=label)
                twin.set_ylabel(f"bucket level ({unit})")
                twin.set_ylim(bottom=0)
                h2, l2 = twin.get_legend_handles_labels()
                handles, labels = handles + h2, labels + l2
                break
    if absent:
        handles = [*handles, plt.Line2D([], [], color="none")]
        labels = [*labels, f"no {' or '.join(absent)} in this run"]
    _legend_outside(ax, handles, labels)
    total = counts.sum()
    attempts, successes = format_number(int(total["attempts"])), format_number(int(total["successes"]))
    finding = f"{attempts} attempts for {successes} successes"
    if total.get("rate_limited"):
        finding += f", {format_number(int(total['rate_limited']))} answered 429"
    if total.get("errors"):
        finding += f", {format_number(int(total['errors']))} errors"
    prefix = title or ("Retry storm timeline" + (f" ({provider})" if provider else ""))
    _title(ax, prefix, finding)
    return fig


def latency_cdf(tasks: pd.DataFrame, by: str = "priority", *, title: str = "") -> Figure:
    """Share of *all submitted tasks* answered within a time, one solid line per value of ``by``;
    failed tasks are drawn apart, dashed, as the share that had failed by a time (a fast failure is
    not a fast answer).

    Every line of a group is divided by the group's submitted tasks (every row of ``tasks``, whatever
    its status), so a run that failed 23% of its tasks tops out at 0.77: it cannot look better than
    a run that answered them all more slowly. The legend gives each group's share answered and its
    p50 and p99 latency of succeeded tasks.
    """
    fig, ax = _new_figure()
    groups = list(tasks.groupby(by, sort=True)) if not tasks.empty else []
    single = len(groups) <= 1
    failed_total = 0
    for i, (name, group) in enumerate(groups):
        colour = OKABE_ITO[i % len(OKABE_ITO)]
        prefix = "" if single else f"{by}={name}: "
        submitted = len(group)
        latency = group["latency_s"].astype(float)
        for outcome, mask, style in (
            ("succeeded", group["status"].isin(SUCCESS), "-"),
            ("failed", group["status"] == "failed", "--"),
        ):
            values = np.sort(latency[mask & latency.notna()].to_numpy(dtype=float))
            if len(values) == 0:
                continue
            if outcome == "succeeded":
                label = (
                    f"{prefix}succeeded {len(values):,} of {submitted:,} ({len(values) / submitted:.0%}): "
                    f"p50 {format_number(float(np.quantile(values, 0.5)), 3)} s, "
                    f"p99 {format_number(float(np.quantile(values, 0.99)), 3)} s"
                )
            else:
                failed_total += len(values)
                label = (
                    f"{prefix}failed {len(values):,} of {submitted:,} ({len(values) / submitted:.0%}), "
                    f"time to failure p50 {format_number(float(np.quantile(values, 0.5)), 3)} s"
                )
            if single:  # one group: colour by outcome (green results, vermillion failures)
                colour = ROLE_COLOURS["successes" if outcome == "succeeded" else "failed"]
            ax.step(values, np.arange(1, len(values) + 1) / submitted, where="post", color=colour, ls=style,
                    label=label)  # fmt: skip
    ax.axhline(1.0, color=ROLE_COLOURS["reference"], ls=":", lw=1.0, label="all submitted tasks")
    ax.set_xlabel("time from arrival to result or failure (s)")
    ax.set_ylabel("share of submitted tasks (0-1)")
    ax.set_ylim(0, 1.05)
    ax.set_xlim(left=0)
    _legend_outside(ax)
    submitted_total = len(tasks)
    succeeded = tasks.loc[tasks["status"].isin(SUCCESS), "latency_s"].dropna().astype(float)
    if single:
        finding = (
            f"{len(succeeded) / submitted_total:.0%} of {submitted_total:,} tasks succeeded, "
            f"p50 {format_number(float(succeeded.quantile(0.5)), 3)} s, "
            f"p99 {format_number(float(succeeded.quantile(0.99)), 3)} s"
            if len(succeeded)
            else "no task succeeded"
        )
        if failed_total:
            finding += f"; {failed_total:,} failed"
    else:
        shares = {name: float(group["status"].isin(SUCCESS).mean()) for name, group in groups}
        most = max(shares, key=lambda k: shares[k])
        finding = "share answered: " + ", ".join(f"{name} {share:.0%}" for name, share in shares.items())
        if len(set(round(v, 3) for v in shares.values())) > 1:
            finding += f" (most: {most})"
    default = "Latency CDF" + ("" if single else f" by {by}")
    _title(ax, title or default, finding)
    return fig


def cost_breakdown(calls: pd.DataFrame, *, title: str = "") -> Figure:
    """Where the calls and the money went, per provider.

    Left: provider attempts by outcome (accepted, lost after billing, 429, other errors). Right: billed cost
    split into first executions and duplicate executions of the same idempotency key, labelled inside the
    axes (the y range leaves room for the label, so it never reaches the title).
    """
    fig, (calls_ax, cost_ax) = plt.subplots(1, 2, figsize=(FIGURE_WIDTH_IN, 4.2), constrained_layout=True)
    for ax in (calls_ax, cost_ax):
        _style(ax)
        ax.grid(axis="x", visible=False)
    providers = sorted(calls["provider"].unique()) if not calls.empty else []
    x = np.arange(len(providers))
    lost = calls["response_lost"].astype(bool)
    categories = {
        "answered": (calls["outcome"].isin(["ok", "replay"])) & ~lost,
        "lost after billing": lost,
        "429": calls["outcome"] == "rate_limited",
        "other errors": ~calls["outcome"].isin(["ok", "replay", "rate_limited"]) & ~lost,
    }
    colors = {
        "answered": ROLE_COLOURS["successes"],
        "lost after billing": OKABE_ITO[3],
        "429": ROLE_COLOURS["rate_limited"],
        "other errors": ROLE_COLOURS["errors"],
    }
    bottom = np.zeros(len(providers))
    for name, mask in categories.items():
        counts = np.array([int((mask & (calls["provider"] == p)).sum()) for p in providers])
        calls_ax.bar(x, counts, 0.5, bottom=bottom, label=name, color=colors[name])
        bottom += counts
    for ax in (calls_ax, cost_ax):
        ax.set_xlim(-1.0, max(1, len(providers)))  # keep bars slim when there is a single provider
        ax.set_xlabel("provider (name)")
    calls_ax.set_xticks(x, [printable(p) for p in providers])
    calls_ax.set_ylabel("provider attempts (calls)")
    total_calls = int(bottom.sum())
    answered = int(categories["answered"].sum())
    calls_ax.set_title(printable(f"{answered} of {total_calls} attempts answered"), fontsize=TITLE_PT)
    _legend_outside(calls_ax)

    billed = calls[calls["billed"].astype(bool)].sort_values("start", kind="stable")
    duplicate = billed.duplicated("key", keep="first")
    first_cost = np.array([billed[(billed["provider"] == p) & ~duplicate]["cost"].sum() for p in providers])
    dup_cost = np.array([billed[(billed["provider"] == p) & duplicate]["cost"].sum() for p in providers])
    cost_ax.bar(x, first_cost, 0.5, label="first execution", color=OKABE_ITO[0])
    cost_ax.bar(x, dup_cost, 0.5, bottom=first_cost, label="duplicate execution", color=OKABE_ITO[1])
    top = float((first_cost + dup_cost).max()) if len(providers) else 0.0
    cost_ax.set_ylim(0, top * 1.45 if top > 0 else 1.0)  # headroom for the two-line label inside the axes
    for xi, first, dup in zip(x, first_cost, dup_cost, strict=True):
        share = dup / (first + dup) if first + dup > 0 else 0.0
        label = _literal(f"${first + dup:.3g} billed\n{share:.1%} duplicated")
        cost_ax.annotate(label, (xi, first + dup), ha="center", va="bottom", fontsize=TEXT_PT, xytext=(0, 3),
                         textcoords="offset points")  # fmt: skip
    cost_ax.set_xticks(x, [printable(p) for p in providers])
    cost_ax.set_ylabel("billed cost ($)")
    total = float(first_cost.sum() + dup_cost.sum())
    share = float(dup_cost.sum()) / total if total > 0 else 0.0
    cost_ax.set_title(_literal(f"{share:.1%} of ${total:.3g} billed twice"), fontsize=TITLE_PT)
    _legend_outside(cost_ax)
    if title:
        fig.suptitle(printable(title))
    return fig


def t_band_half_width(sd: float, n: int) -> float:
    """Half-width of the 95% Student-t interval of a mean over ``n`` seeds: ``t(n-1, 0.975) * sd / sqrt(n)``.

    Over 4-5 seeds the normal 1.96 would draw the band 30-38% too narrow. One seed has no interval (0).
    """
    if n < 2 or not math.isfinite(sd):
        return 0.0
    return t_quantile_975(int(n) - 1) * sd / math.sqrt(n)


def _mean_and_band(frame: pd.DataFrame, x: str | list[str], y: str) -> pd.DataFrame:
    stats = frame.groupby(x)[y].agg(["mean", "std", "count"]).reset_index()
    half = [
        t_band_half_width(float(sd), int(n))
        for sd, n in zip(stats["std"].fillna(0.0), stats["count"], strict=True)
    ]
    stats["low"] = stats["mean"] - half
    stats["high"] = stats["mean"] + half
    return stats


def _setting_text(settings: Mapping[str, Any]) -> str:
    return ", ".join(short_setting(key, value) for key, value in settings.items()) or "the file as is"


def _rejected(sweep: pd.DataFrame, keys: list[str], constraints: Mapping[str, float]) -> set[tuple[Any, ...]]:
    """The settings of ``keys`` whose worst seed breaks one of ``constraints`` (as a decision judged them)."""
    known = {name: bound for name, bound in constraints.items() if name in sweep}
    if not known or not keys:
        return set()
    worst = sweep.groupby(keys)[list(known)].max()
    broken = np.zeros(len(worst), dtype=bool)
    for name, bound in known.items():
        broken |= worst[name].to_numpy(dtype=float) > bound
    return {index if isinstance(index, tuple) else (index,) for index in worst.index[broken]}


def metric_vs_parameter(
    sweep: pd.DataFrame,
    x: str,
    y: str,
    *,
    hue: str | None = None,
    title: str = "",
    logx: bool = False,
    reference: Mapping[str, float] | None = None,
    decision: Any = None,
    maximize: bool = False,
    marks: Mapping[str, float] | None = None,
) -> Figure:
    """Mean of ``y`` against ``x`` over seeds with a 95% Student-t band, one line per ``hue`` value.

    E.g. duplicate cost against backoff base, or p99 latency against bucket size. A line identical to
    one already drawn (it would hide underneath) is drawn dashed with hollow markers and labelled
    "same as ...". ``reference`` draws labelled horizontal lines (a latency target, a limit), ``marks``
    labelled vertical ones (the server's quota on a quota axis).

    The title never promotes a setting the data does not single out. With a ``decision``
    (:class:`aiqsim.lab.decisions.Decision`) it names the chosen setting and the decision's rule, marks
    the chosen setting and crosses out the points the decision's constraints reject. Without one it
    names the best mean (lowest, or highest with ``maximize``) only when its band is clear of every other
    setting's, and otherwise says how many settings are within the seed bands.
    """
    fig, ax = _new_figure()
    groups = [(None, sweep)] if hue is None else list(sweep.groupby(hue, sort=True))
    every = sweep.groupby([x] if hue is None else [hue, x])[y].mean().to_numpy(dtype=float)
    finite = every[np.isfinite(every)]
    # two lines closer than 1% of the plotted range everywhere would be drawn one on top of the other
    tolerance = 0.01 * float(np.ptp(finite)) if len(finite) else 0.0
    seeds = int(sweep.groupby([x] if hue is None else [hue, x]).size().min()) if len(sweep) else 0
    keys = [x] if hue is None else [hue, x]
    rejected = _rejected(sweep, keys, getattr(decision, "constraints", {}) or {})
    drawn: list[tuple[str, np.ndarray]] = []
    crossed = False
    for i, (name, group) in enumerate(groups):
        stats = _mean_and_band(group, x, y)
        label = axis_label(y).split(" (")[0] if name is None else short_setting(hue or "", name)
        colour = OKABE_ITO[i % len(OKABE_ITO)]
        means = stats["mean"].to_numpy(dtype=float)
        twin = next((other for other, values in drawn if _same_line(values, means, tolerance)), None)
        if twin is not None:
            ax.plot(stats[x], means, marker="o", mfc="none", ms=9, ls="--", color=colour,
                    label=f"{label} (same as {twin}, within 1% of the range)")  # fmt: skip
        else:
            ax.plot(stats[x], means, marker="o", color=colour, label=label)
            ax.fill_between(stats[x], stats["low"], stats["high"], alpha=0.2, color=colour)
        out = [((name, v) if hue is not None else (v,)) in rejected for v in stats[x]]
        if any(out):
            crossed = True
            ax.plot(stats[x][out], means[out], ls="none", marker="x", ms=10, mew=2.0,
                    color=ROLE_COLOURS["failed"])  # fmt: skip
        drawn.append((label, means))
    if crossed:
        ax.plot([], [], ls="none", marker="x", ms=10, mew=2.0, color=ROLE_COLOURS["failed"],
                label=REJECTED_LABEL)  # fmt: skip
    for i, (name, value) in enumerate((reference or {}).items()):
        ax.axhline(value, color=ROLE_COLOURS["reference"], ls="--" if i == 0 else ":", lw=1.2, label=name)
    for i, (name, value) in enumerate((marks or {}).items()):
        ax.axvline(value, color=OKABE_ITO[7], ls="-." if i == 0 else ":", lw=1.2, label=name)
    chosen = dict(getattr(decision, "settings", {}) or {})
    if decision is not None and x in chosen:
        line = sweep
        if hue is not None and hue in chosen:
            line = sweep[sweep[hue] == chosen[hue]]
        at = line[line[x] == chosen[x]][y].mean()
        ax.axvline(chosen[x], color=OKABE_ITO[2], ls=":", lw=1.5)
        ax.plot([chosen[x]], [at], ls="none", marker="*", ms=16, color=OKABE_ITO[2], mec="black",
                label=f"chosen: {_setting_text(chosen)}")  # fmt: skip
    if seeds >= 2:
        ax.plot([], [], ls="none", marker="s", ms=10, alpha=0.3, color=OKABE_ITO[0],
                label=f"band: 95% t-interval of the mean over {seeds} seeds")  # fmt: skip
    ax.set_xlabel(axis_label(x))
    ax.set_ylabel(axis_label(y))
    if logx:
        ax.set_xscale("log")
    _legend_outside(ax)
    if decision is not None:
        finding = f"chosen {_setting_text(chosen)}: {decision.rule}"
        _title(ax, title, finding)
    else:
        _title(ax, "", title or band_finding(sweep, keys, y, maximize=maximize))
    return fig


def band_finding(sweep: pd.DataFrame, keys: Sequence[str], y: str, *, maximize: bool = False) -> str:
    """What the seed bands allow one to say about the best mean ``y`` over the settings of ``keys``.

    "<metric> lowest at <setting>" only when the best setting's 95% t-band is clear of every other
    setting's band; otherwise the best mean is named with the number of settings it cannot be told from.
    """
    stats = _mean_and_band(sweep, list(keys), y).dropna(subset=["mean"])
    if stats.empty:
        return "no data"
    best_index = stats["mean"].idxmax() if maximize else stats["mean"].idxmin()
    best = stats.loc[best_index]
    overlap = stats[
        (stats.index != best_index) & (stats["low"] <= best["high"]) & (stats["high"] >= best["low"])
    ]
    metric = axis_label(y).split(" (")[0]
    words = "highest" if maximize else "lowest"
    where = _setting_text({key: best[key] for key in keys})
    if overlap.empty:
        return f"{metric} {words} at {where} (its 95% seed band clear of every other setting)"
    return (
        f"{metric}: no clear {words}; best mean at {where}, but {len(overlap)} other setting"
        f"{'s' if len(overlap) != 1 else ''} within the 95% seed bands"
    )


def _same_line(a: np.ndarray, b: np.ndarray, tolerance: float) -> bool:
    return len(a) == len(b) and bool(np.allclose(a, b, rtol=0.0, atol=tolerance, equal_nan=True))


def cost_duplication(sweep: pd.DataFrame, x: str, *, hue: str | None = None) -> Figure:
    """Duplicated cost against a parameter (backoff base, attempt timeout...), with seed bands.

    The title says the cost falls (or rises) from the first ``x`` to the last only when their 95% seed
    bands (of the mean over ``hue``, per seed) are apart; otherwise that no clear change shows.
    """
    y = "cost_duplicated"
    per_seed = sweep.groupby([x, "seed"], as_index=False)[y].mean() if "seed" in sweep else sweep
    stats = _mean_and_band(per_seed, x, y)
    name = axis_label(x).split(" (")[0]
    if len(stats) > 1:
        first, last = stats.iloc[0], stats.iloc[-1]
        span = f"${first['mean']:.3g} to ${last['mean']:.3g} as {name} goes {first[x]:g} to {last[x]:g}"
        if first["low"] <= last["high"] and last["low"] <= first["high"]:
            finding = f"duplicated cost: no clear change ({span}, within the 95% seed bands)"
        else:
            finding = f"duplicated cost {'rises' if last['mean'] > first['mean'] else 'falls'} from {span}"
    else:
        finding = f"duplicated cost vs {axis_label(x)}"
    return metric_vs_parameter(sweep, x, y, hue=hue, title=finding)


def heatmap(
    sweep: pd.DataFrame, x: str, y: str, value: str, *, title: str = "", fmt: str = "{:.3g}"
) -> Figure:
    """Mean ``value`` over seeds on the ``x`` by ``y`` grid, annotated cell by cell.

    Each annotation is black or white by the luminance of its cell (readable on bright and dark cells).
    """
    table = sweep.pivot_table(index=y, columns=x, values=value, aggfunc="mean").sort_index()
    width = min(FIGURE_WIDTH_IN, 2.4 + 1.1 * max(3, table.shape[1]))
    fig, ax = _new_figure(width, 1.4 + 0.7 * max(3, table.shape[0]))
    ax.grid(False)
    data = table.to_numpy(dtype=float)
    image = ax.imshow(data, origin="lower", aspect="auto", cmap=SEQUENTIAL_CMAP)
    ax.set_xticks(
        range(table.shape[1]),
        [printable(f"{c:g}" if isinstance(c, float) else str(c)) for c in table.columns],
    )
    ax.set_yticks(
        range(table.shape[0]), [printable(f"{i:g}" if isinstance(i, float) else str(i)) for i in table.index]
    )
    ax.set_xlabel(axis_label(x))
    ax.set_ylabel(axis_label(y))
    for (row, col), v in np.ndenumerate(data):
        if not math.isnan(v):
            colour = text_colour_for(image.cmap(image.norm(v)))
            ax.text(col, row, fmt.format(v), ha="center", va="center", color=colour, fontsize=TEXT_PT)
    fig.colorbar(image, ax=ax, label=axis_label(value))
    if np.isfinite(data).any():
        low = np.unravel_index(np.nanargmin(data), data.shape)
        high = np.unravel_index(np.nanargmax(data), data.shape)

        def where(cell: tuple[int, ...]) -> str:
            return f"{short_setting(y, table.index[cell[0]])}, {short_setting(x, table.columns[cell[1]])}"

        finding = f"from {fmt.format(data[low])} ({where(low)}) to {fmt.format(data[high])} ({where(high)})"
    else:
        finding = "no data"
    _title(ax, title or axis_label(value).split(" (")[0], finding)
    return fig


def seed_ranges(
    runs: pd.DataFrame,
    by: str | Sequence[str],
    metrics: Sequence[str],
    *,
    centre: str = "mean",
    limits: Mapping[str, tuple[float, str]] | None = None,
    chosen: Any = None,
    log: Sequence[str] = (),
    title: str = "",
) -> Figure:
    """One panel per metric: each setting of ``by`` as a dot at its ``centre`` (mean or median) over the
    seeds and a line over the seeds' range (min to max), so nothing is drawn outside the values the runs
    produced, and a log axis (``log``) carries no bars whose length would mean nothing.

    ``limits`` maps a metric to ``(value, label)``: a decision's bound, drawn as a dashed line.
    ``chosen`` (a value of ``by``, a tuple for several columns) is drawn as a large star and named in
    the title.
    """
    keys = [by] if isinstance(by, str) else list(by)
    stats = runs.groupby(keys, sort=False)[list(metrics)].agg([centre, "min", "max"])
    names = [", ".join(str(v) for v in (i if isinstance(i, tuple) else (i,))) for i in stats.index]
    # two panels a row at most: more side by side would not fit the page width with readable text
    columns = min(2, len(metrics))
    rows = math.ceil(len(metrics) / columns)
    width = min(FIGURE_WIDTH_IN, 3.6 * columns + 1.6)
    fig, grid = plt.subplots(rows, columns, figsize=(width, rows * (0.45 * len(names) + 1.6) + 0.4),
                             constrained_layout=True, squeeze=False)  # fmt: skip
    for unused in grid.flat[len(metrics) :]:
        unused.set_visible(False)
    first_column = {id(row[0]) for row in grid}
    # ~12 characters an inch at TEXT_PT, over a panel's share of the width left of the names
    label_chars = max(20, int((width - 1.8) / columns * 11))
    y = np.arange(len(names))
    chosen_at = None
    if chosen is not None:
        wanted = chosen if isinstance(chosen, tuple) else (chosen,)
        matches = [
            i
            for i, index in enumerate(stats.index)
            if (index if isinstance(index, tuple) else (index,)) == wanted
        ]
        chosen_at = matches[0] if matches else None
    panels = list(grid.flat[: len(metrics)])
    for ax, metric in zip(panels, metrics, strict=True):
        _style(ax)
        mid, low, high = (stats[(metric, k)].to_numpy(dtype=float) for k in (centre, "min", "max"))
        ax.hlines(y, low, high, color=OKABE_ITO[0], lw=2.0, label="seed range (min-max)")
        ax.plot(mid, y, "o", color=OKABE_ITO[0], label=f"{centre} over seeds")
        if chosen_at is not None:
            ax.plot(
                [mid[chosen_at]], [y[chosen_at]], "*", ms=16, color=OKABE_ITO[2], mec="black", label="chosen"
            )
        if metric in (limits or {}):
            value, label = (limits or {})[metric]
            ax.axvline(value, color=ROLE_COLOURS["failed"], ls="--", lw=1.3, label=label)
        if metric in log:
            ax.set_xscale("log")
            # plain numbers at 1, 2 and 5 of each decade: the default labels every minor tick of a short
            # range in scientific notation, side by side ("2x10^2 3x10^2 4x10^2")
            ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_number(v)))
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(_wrapped_label(printable(axis_label(metric)), label_chars))
        ax.set_yticks(y, [printable(n) for n in names] if id(ax) in first_column else [""] * len(names))
        ax.invert_yaxis()
        ax.set_title(printable(axis_label(metric).split(" (")[0]), fontsize=TEXT_PT)
    for row in grid:
        row[0].set_ylabel(printable(f"{', '.join(keys)} (setting)"))
    handles: dict[str, Any] = {}
    for ax in panels:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    # one legend for all panels, below them: beside the top row it would squeeze the panels' width
    longest = max(map(len, handles))
    across = min(len(handles), 3 if longest <= 26 else 2 if longest <= 44 else 1)
    fig.legend(list(handles.values()), [printable(label) for label in handles], loc="outside lower center",
               ncols=across, fontsize=TEXT_PT, frameon=False)  # fmt: skip
    fig.set_figheight(fig.get_figheight() + math.ceil(len(handles) / across) * 1.45 * TEXT_PT / 72)
    finding = title or (f"chosen: {names[chosen_at]}" if chosen_at is not None else f"{len(names)} settings")
    # wrapped to the figure's width (~10 characters an inch at TITLE_PT): a long finding would widen the PNG
    wrapped = "\n".join(textwrap.wrap(finding, max(30, int(fig.get_figwidth() * 10))))
    fig.suptitle(_literal(printable(wrapped)), fontsize=TITLE_PT)
    return fig


def _wrapped_label(label: str, chars: int) -> str:
    """``label`` on lines of at most ``chars``, its unit ``(...)`` kept whole on a line of its own."""
    if len(label) <= chars:
        return label
    name, paren, unit = label.partition(" (")
    lines = textwrap.wrap(name, chars)
    return "\n".join(lines + ([paren.strip() + unit] if paren else []))


def pareto_front(points: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """Rows not dominated by any other (lower ``x`` and lower ``y`` are better)."""
    ordered = points.sort_values([x, y], kind="stable")
    best = math.inf
    keep = []
    for index, value in zip(ordered.index, ordered[y], strict=True):
        if value < best:
            keep.append(index)
            best = value
    return ordered.loc[keep]


def pareto(
    sweep: pd.DataFrame,
    params: Sequence[str],
    *,
    latency: str = "success_latency_p99_s",
    cost: str = "cost_total",
    title: str = "",
    reference: Mapping[str, float] | None = None,
    decision: Any = None,
) -> Figure:
    """Latency against cost for every grid point (mean over seeds, with seed error bars); the
    non-dominated points are joined as the frontier, numbered, and named in the legend in words
    ("timeout 2 s, base 0.5 s") so labels never sit on the points or on each other.

    ``reference`` draws labelled horizontal lines (a latency target). With a ``decision`` the chosen
    setting is starred, the settings its constraints reject are crossed out and the title states its
    rule instead of naming the cheapest point (which may break the target); without one it names no
    setting (notebook 12's title named a cheapest split its decision rejected for breaking the SLO)."""
    stats = sweep.groupby(list(params))[[latency, cost]].agg(["mean", "std"]).reset_index()
    flat = pd.DataFrame({p: stats[p] for p in params})
    flat["cost"] = stats[(cost, "mean")]
    flat["latency"] = stats[(latency, "mean")]
    flat["cost_std"] = stats[(cost, "std")].fillna(0.0)
    flat["latency_std"] = stats[(latency, "std")].fillna(0.0)
    fig, ax = _new_figure(FIGURE_WIDTH_IN, 4.8)
    ax.errorbar(flat["cost"], flat["latency"], xerr=flat["cost_std"], yerr=flat["latency_std"], fmt="o",
                color=OKABE_ITO[5], alpha=0.7, label="setting (mean, bars: seed s.d.)")  # fmt: skip
    front = pareto_front(flat, "cost", "latency")
    ax.plot(front["cost"], front["latency"], color=OKABE_ITO[1], lw=1.5, label="Pareto frontier")
    for number, (_, row) in enumerate(front.iterrows(), start=1):
        setting = ", ".join(short_setting(p, row[p]) for p in params)
        ax.annotate(
            str(number),
            (row["cost"], row["latency"]),
            xytext=(6, 6),
            textcoords="offset points",
            fontsize=TEXT_PT,
            fontweight="bold",
            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none"},
        )
        ax.plot([], [], ls="none", label=f"{number}: {printable(setting)}")  # fmt: skip
    for i, (name, value) in enumerate((reference or {}).items()):
        ax.axhline(value, color=ROLE_COLOURS["reference"], ls="--" if i == 0 else ":", lw=1.2, label=name)
    rejected = _rejected(sweep, list(params), getattr(decision, "constraints", {}) or {})
    out = [tuple(row[p] for p in params) in rejected for _, row in flat.iterrows()]
    if any(out):
        ax.plot(flat["cost"][out], flat["latency"][out], ls="none", marker="x", ms=10, mew=2.0,
                color=ROLE_COLOURS["failed"], label=REJECTED_LABEL)  # fmt: skip
    chosen = dict(getattr(decision, "settings", {}) or {})
    if decision is not None and all(p in chosen for p in params):
        at = flat[np.logical_and.reduce([flat[p] == chosen[p] for p in params])]
        ax.plot(at["cost"], at["latency"], ls="none", marker="*", ms=16, color=OKABE_ITO[2], mec="black",
                label=f"chosen: {_setting_text(chosen)}")  # fmt: skip
    ax.set_xlabel(axis_label(cost))
    ax.set_ylabel(axis_label(latency))
    _legend_outside(ax)
    if decision is not None:
        finding = f"chosen {_setting_text(chosen)}: {decision.rule}"
    else:  # no rule to judge by: name no setting (the cheapest may break the very target a decision sets)
        finding = f"{len(front)} of {len(flat)} settings on the frontier, numbered by cost in the legend"
    _title(ax, title, finding)
    return fig
