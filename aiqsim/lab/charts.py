"""Charts for the tuning lab: functions that take DataFrames and return matplotlib figures.

Each function draws one question: is there a retry storm, who waits how long, what do
duplicates cost, which settings are on the latency/cost frontier. Where a sweep has several
seeds, lines carry a 95% confidence band over the seeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure


def _new_figure(width: float = 9.0, height: float = 4.5) -> tuple[Figure, plt.Axes]:
    fig, ax = plt.subplots(figsize=(width, height), constrained_layout=True)
    return fig, ax


def retry_storm_timeline(timeline: pd.DataFrame, provider: str | None = None, *, title: str = "") -> Figure:
    """Attempts, 429s and successes per interval, with the client bucket level (tokens if the provider
    has a token quota, else requests) on a second axis."""
    frame = timeline if provider is None else timeline[timeline["provider"] == provider]
    grouped = frame.groupby("t", as_index=True)
    counts = grouped[["attempts", "rate_limited", "successes"]].sum()
    step = float(np.diff(counts.index.to_numpy()[:2])[0]) if len(counts) > 1 else 1.0
    fig, ax = _new_figure()
    ax.plot(counts.index, counts["attempts"] / step, label="attempts/s", color="tab:blue")
    ax.plot(counts.index, counts["rate_limited"] / step, label="429s/s", color="tab:red")
    ax.plot(counts.index, counts["successes"] / step, label="successes/s", color="tab:green")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("calls per second")
    ax.set_title(title or "Retry storm timeline" + (f" ({provider})" if provider else ""))
    handles, labels = ax.get_legend_handles_labels()
    for column, label, unit in (
        ("tokens_level", "client token bucket", "units"),
        ("requests_level", "client request bucket", "requests"),
    ):
        if column in frame and frame[column].notna().any():
            level = grouped[column].mean()
            twin = ax.twinx()
            twin.plot(level.index, level, color="tab:gray", linestyle="--", label=label)
            twin.set_ylabel(f"bucket level ({unit})")
            h2, l2 = twin.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
            break
    ax.legend(handles, labels, loc="upper right")
    return fig


def latency_cdf(tasks: pd.DataFrame, by: str = "priority", *, title: str = "") -> Figure:
    """Empirical CDF of submit-to-terminal latency, one line per value of ``by``."""
    fig, ax = _new_figure()
    done = tasks.dropna(subset=["latency_s"])
    for name, group in done.groupby(by, sort=True):
        values = np.sort(group["latency_s"].to_numpy(dtype=float))
        if len(values) == 0:
            continue
        ax.step(values, np.arange(1, len(values) + 1) / len(values), where="post", label=f"{by}={name}")
    ax.set_xlabel("latency, arrival to terminal (s)")
    ax.set_ylabel("fraction of tasks")
    ax.set_ylim(0, 1.02)
    ax.set_title(title or f"Latency CDF by {by}")
    if ax.get_lines():
        ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    return fig


def cost_breakdown(calls: pd.DataFrame, *, title: str = "") -> Figure:
    """Where the calls and the money went, per provider.

    Left: provider attempts by outcome (accepted, lost after billing, 429, other errors). Right: billed cost
    split into first executions and duplicate executions of the same idempotency key, labelled.
    """
    fig, (calls_ax, cost_ax) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
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
        "answered": "tab:green",
        "lost after billing": "tab:orange",
        "429": "tab:red",
        "other errors": "tab:gray",
    }
    bottom = np.zeros(len(providers))
    for name, mask in categories.items():
        counts = np.array([int((mask & (calls["provider"] == p)).sum()) for p in providers])
        calls_ax.bar(x, counts, 0.5, bottom=bottom, label=name, color=colors[name])
        bottom += counts
    for ax in (calls_ax, cost_ax):
        ax.set_xlim(-1.0, max(1, len(providers)))  # keep bars slim when there is a single provider
    calls_ax.set_xticks(x, providers)
    calls_ax.set_ylabel("provider attempts")
    calls_ax.set_title("attempts by outcome")
    calls_ax.legend()

    billed = calls[calls["billed"].astype(bool)].sort_values("start", kind="stable")
    duplicate = billed.duplicated("key", keep="first")
    first_cost = np.array([billed[(billed["provider"] == p) & ~duplicate]["cost"].sum() for p in providers])
    dup_cost = np.array([billed[(billed["provider"] == p) & duplicate]["cost"].sum() for p in providers])
    cost_ax.bar(x, first_cost, 0.5, label="first execution", color="tab:blue")
    cost_ax.bar(x, dup_cost, 0.5, bottom=first_cost, label="duplicate execution", color="tab:red")
    for xi, first, dup in zip(x, first_cost, dup_cost, strict=True):
        share = dup / (first + dup) if first + dup > 0 else 0.0
        cost_ax.annotate(f"{first + dup:.3g} billed\n{share:.1%} duplicated", (xi, first + dup), ha="center",
                         va="bottom", fontsize=8)  # fmt: skip
    cost_ax.set_xticks(x, providers)
    cost_ax.set_ylabel("billed cost")
    cost_ax.set_title("cost and duplication")
    cost_ax.margins(y=0.2)
    cost_ax.legend(loc="lower right")
    if title:
        fig.suptitle(title)
    return fig


def _mean_and_band(frame: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    stats = frame.groupby(x)[y].agg(["mean", "std", "count"]).reset_index()
    half = 1.96 * stats["std"].fillna(0.0) / np.sqrt(stats["count"].clip(lower=1))
    stats["low"] = stats["mean"] - half
    stats["high"] = stats["mean"] + half
    return stats


def metric_vs_parameter(
    sweep: pd.DataFrame, x: str, y: str, *, hue: str | None = None, title: str = "", logx: bool = False
) -> Figure:
    """Mean of ``y`` against ``x`` over seeds with a 95% band, one line per ``hue`` value.

    E.g. duplicate cost against backoff base, or p99 latency against bucket size.
    """
    fig, ax = _new_figure()
    groups = [(None, sweep)] if hue is None else list(sweep.groupby(hue, sort=True))
    for name, group in groups:
        stats = _mean_and_band(group, x, y)
        label = y if name is None else f"{hue}={name}"
        ax.plot(stats[x], stats["mean"], marker="o", label=label)
        ax.fill_between(stats[x], stats["low"], stats["high"], alpha=0.2)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if logx:
        ax.set_xscale("log")
    ax.set_title(title or f"{y} vs {x}")
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def cost_duplication(sweep: pd.DataFrame, x: str, *, hue: str | None = None) -> Figure:
    """Duplicated cost against a parameter (backoff base, attempt timeout...), with seed bands."""
    return metric_vs_parameter(sweep, x, "cost_duplicated", hue=hue, title=f"Duplicated cost vs {x}")


def heatmap(
    sweep: pd.DataFrame, x: str, y: str, value: str, *, title: str = "", fmt: str = "{:.3g}"
) -> Figure:
    """Mean ``value`` over seeds on the ``x`` by ``y`` grid, annotated cell by cell."""
    table = sweep.pivot_table(index=y, columns=x, values=value, aggfunc="mean").sort_index()
    fig, ax = _new_figure(1.2 + 1.1 * max(3, table.shape[1]), 1.2 + 0.7 * max(3, table.shape[0]))
    image = ax.imshow(table.to_numpy(dtype=float), origin="lower", aspect="auto", cmap="viridis")
    ax.set_xticks(range(table.shape[1]), [str(c) for c in table.columns])
    ax.set_yticks(range(table.shape[0]), [str(i) for i in table.index])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    for (row, col), v in np.ndenumerate(table.to_numpy(dtype=float)):
        if not math.isnan(v):
            ax.text(col, row, fmt.format(v), ha="center", va="center", color="white", fontsize=8)
    fig.colorbar(image, ax=ax, label=value)
    ax.set_title(title or f"{value} over {x} × {y}")
    return fig


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
    latency: str = "latency_p99_s",
    cost: str = "cost_total",
    title: str = "",
) -> Figure:
    """Latency against cost for every grid point (mean over seeds, with seed error bars); the
    non-dominated points are joined as the frontier."""
    stats = sweep.groupby(list(params))[[latency, cost]].agg(["mean", "std"]).reset_index()
    flat = pd.DataFrame({p: stats[p] for p in params})
    flat["cost"] = stats[(cost, "mean")]
    flat["latency"] = stats[(latency, "mean")]
    flat["cost_std"] = stats[(cost, "std")].fillna(0.0)
    flat["latency_std"] = stats[(latency, "std")].fillna(0.0)
    fig, ax = _new_figure()
    ax.errorbar(
        flat["cost"], flat["latency"], xerr=flat["cost_std"], yerr=flat["latency_std"], fmt="o", alpha=0.6
    )
    front = pareto_front(flat, "cost", "latency")
    ax.plot(front["cost"], front["latency"], color="tab:red", marker="o", label="Pareto frontier")
    for _, row in front.iterrows():
        ax.annotate(", ".join(f"{p}={row[p]}" for p in params), (row["cost"], row["latency"]), fontsize=7)
    ax.set_xlabel(cost)
    ax.set_ylabel(latency)
    ax.set_title(title or "Latency vs cost across the sweep")
    ax.legend()
    ax.grid(alpha=0.3)
    return fig
