"""The calibration report: every fit drawn against the data it came from, poor fits flagged.

One self-contained HTML file (charts embedded as PNG), or a Jupyter notebook when the report's
name ends in ``.ipynb``: per provider, the latency scatter with the
fitted line, a QQ plot of the log residuals against a normal (the lognormal noise assumption),
residuals against the regressor (attempts the client cut off drawn at the time it waited, as the
censored observations they are in the fit), and a table of the fitted rates with the counts behind them; per
workload, arrivals per interval against the fitted piecewise rate, and a QQ plot of inter-arrival
gaps against the exponential (the Poisson assumption).

The notebook holds the same flags, tables and charts, already drawn (it opens like the HTML
report), and its code cells re-run the calibration from the logs and redraw every chart with
:func:`provider_figure` and :func:`workload_figure`, so "Run all" works wherever the logs are.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from aiqsim.core.extras import is_installed
from aiqsim.lab.calibrate import (
    Calibration,
    CalibrationError,
    CensoredLatencyFit,
    fit_censored_latency,
    kaplan_meier,
    latency_sample,
)

__all__ = [
    "REPORT_FORMATS",
    "calibration_report_html",
    "calibration_report_notebook",
    "check_report_path",
    "provider_figure",
    "workload_figure",
    "write_calibration_report",
]


def _png_base64(figure: Any) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode()


def _png(figure: Any) -> str:
    return "<img src='data:image/png;base64," + _png_base64(figure) + "'/>"


def _quantiles(n: int) -> np.ndarray:
    return (np.arange(1, n + 1) - 0.5) / n


def _latency_fit(calibration: Calibration, name: str) -> CensoredLatencyFit:
    """Provider ``name``'s latency fit in full: the calibration's own, or refitted from its calls (a
    :class:`Calibration` made without them)."""
    fitted = calibration.latency_fits.get(name)
    if fitted is not None:
        return fitted
    calls = calibration.calls
    sample = latency_sample(
        calls[(calls["provider"] == name) & (calls["outcome_class"] != "rejected_locally")]
    )
    return fit_censored_latency(sample.x, sample.latency_s, sample.cut_x, sample.waited_s)


def provider_figure(calibration: Calibration, name: str) -> Any:
    """Provider ``name``'s latency fit: scatter with the fitted mean, QQ of log residuals, residuals.

    Attempts the client cut off are drawn at the time it waited (triangles: their latency was at
    least that, unless the response was lost), and the QQ plot places the completed calls' residuals
    by their Kaplan-Meier distribution with those attempts censored (each counted by its chance of
    having been slow rather than lost): the completed calls alone are the fast part of the sample,
    not a sample of the model.
    """
    import matplotlib.pyplot as plt

    fit = calibration.providers[name]
    detail = _latency_fit(calibration, name)
    x, y = detail.x, detail.latency_s
    residuals = np.log(y / detail.mean_s(x))
    bounds = np.log(detail.waited_s / detail.mean_s(detail.cut_x))
    figure, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].scatter(x, y, s=4, alpha=0.4, label="completed")
    if detail.cut_off:
        axes[0].scatter(detail.cut_x, detail.waited_s, s=10, marker="^", color="C1", alpha=0.5,
                        label="cut off: slower than this, or lost")  # fmt: skip
    top = max(x.max(initial=0), detail.cut_x.max(initial=0)) or 1
    grid = np.linspace(0, top, 50)
    axes[0].plot(grid, fit.latency.base_s + fit.latency.per_unit_s * grid, color="C3", label="fitted mean")
    axes[0].set(xlabel=fit.latency.regressor, ylabel="latency (s)", title=f"{name}: latency")
    axes[0].legend()
    sample, before, after = kaplan_meier(residuals, bounds, detail.slow_weights)
    positions = np.clip((before + after) / 2, 1e-12, 1 - 1e-12)  # (i - 0.5) / n when nothing is censored
    theory = np.array([NormalDist(-fit.latency.sigma**2 / 2, fit.latency.sigma or 1e-9).inv_cdf(q) for q in
                       positions])  # fmt: skip
    axes[1].scatter(theory, sample, s=4)
    lims = [
        min(theory.min(initial=0), sample.min(initial=0)),
        max(theory.max(initial=0), sample.max(initial=0)),
    ]
    axes[1].plot(lims, lims, color="C3")
    title = "QQ: log residuals" + (" (cut-offs censored)" if detail.cut_off else "")
    axes[1].set(xlabel="lognormal model quantile", ylabel="log residual", title=title)
    axes[2].scatter(x, residuals, s=4, alpha=0.4)
    if detail.cut_off:
        axes[2].scatter(detail.cut_x, bounds, s=10, marker="^", color="C1", alpha=0.5)
    axes[2].axhline(-(fit.latency.sigma**2) / 2, color="C3")
    axes[2].set(xlabel=fit.latency.regressor, ylabel="log residual", title="residuals")
    return figure


def _provider_rows(calibration: Calibration, name: str) -> list[tuple[str, str]]:
    fit = calibration.providers[name]
    lat = fit.latency
    mean = (
        f"({lat.base_s:.4g} s + {lat.per_unit_s:.4g} s x {lat.regressor})"
        if lat.identifiable
        else f"({lat.base_s:.4g} s at the one {lat.regressor} seen: base/per-unit split not identifiable)"
    )
    rows = [
        (
            "latency",
            f"{mean} x lognormal(sigma "
            f"{lat.sigma:.3g}); fitted on {lat.n} completed calls and {lat.cut_off} attempts cut off by "
            "the client, as censored (latency at least the time waited); KS "
            f"{lat.ks_distance:.3f}",
        ),
        (
            "server limits",
            f"{fit.server_requests_per_min} requests/min, {fit.server_units_per_min} units/min "
            f"(from {fit.limits_from})",
        ),
        (
            "429s",
            f"{fit.limit_429s} at the limit, {fit.random_429s} random: rate_limit_prob "
            f"{fit.rate_limit_prob:.4g}, Retry-After {fit.rate_limit_retry_after_s}",
        ),
        ("5xx", f"{fit.server_error_prob:.4g}"),
        (
            "lost responses (timeouts)",
            f"{fit.timeout_prob:.4g}: of the {lat.cut_off} cut-off attempts, {lat.slow_cut_offs:.1f} "
            f"were slow (the fitted latency's tail), {lat.cut_off - lat.slow_cut_offs:.1f} lost",
        ),
        ("quota exhausted / invalid", f"{fit.quota_exhausted_prob:.4g} / {fit.invalid_request_prob:.4g}"),
        ("attempts by class", ", ".join(f"{k}: {v}" for k, v in sorted(fit.counts.items()))),
        *(
            (f"95% interval: {key}", f"{interval} ({interval.method}; n = {interval.n})")
            for key, interval in fit.intervals.items()
        ),
    ]
    return rows


def _provider_section(calibration: Calibration, name: str) -> str:
    rows = _provider_rows(calibration, name)
    table = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    figure = provider_figure(calibration, name)
    return f"<h2>Provider {html.escape(name)}</h2><table>{table}</table>{_png(figure)}"


def workload_figure(calibration: Calibration, index: int) -> Any:
    """Workload ``index``'s arrivals against the fitted rate, and the QQ plot of inter-arrival gaps."""
    import matplotlib.pyplot as plt

    w = calibration.workloads[index]
    tasks = calibration.tasks
    mine = tasks[(tasks["provider"] == w.provider) & (tasks["priority"] == w.priority)]
    times = np.sort(mine["submitted_at"].to_numpy(float))
    figure, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    width = max((w.end_s - w.start_s) / max(20, len(w.rates_per_s)), 1e-9)
    edges = np.arange(w.start_s, w.end_s + width, width)
    counts = np.histogram(times, bins=edges)[0]
    axes[0].bar(edges[:-1], counts / width, width=width, align="edge", alpha=0.5, label="observed")
    bins = np.linspace(w.start_s, w.end_s, len(w.rates_per_s) + 1)
    axes[0].step(bins, [*w.rates_per_s, w.rates_per_s[-1]], where="post", color="C3", label="fitted rate")
    axes[0].set(xlabel="time (s)", ylabel="arrivals/s", title=f"{w.provider}/{w.priority}: arrivals")
    axes[0].legend()
    gaps = np.sort(np.diff(times))
    if len(gaps):
        theory = -np.log(1 - _quantiles(len(gaps))) * gaps.mean()
        axes[1].scatter(theory, gaps, s=4)
        axes[1].plot([0, theory.max()], [0, theory.max()], color="C3")
    axes[1].set(xlabel="exponential quantile (s)", ylabel="gap (s)", title="QQ: inter-arrival gaps")
    return figure


def _workload_text(calibration: Calibration, index: int) -> str:
    w = calibration.workloads[index]
    return (
        f"{w.submissions} submissions, rates {', '.join(f'{r:.4g}' for r in w.rates_per_s)} /s; cost "
        f"{w.cost_dist} mean {w.cost_mean:.4g} sigma {w.cost_sigma:.3g}, output fraction "
        f"{w.output_fraction:.3g}; duplicates {w.duplicate_fraction:.2%} (distinct_inputs "
        f"{w.distinct_inputs}); dispersion {w.dispersion:.2f}. 95% intervals: "
        + "; ".join(f"{key} {interval} ({interval.method})" for key, interval in w.intervals.items())
    )


def _workload_section(calibration: Calibration, index: int) -> str:
    w = calibration.workloads[index]
    text = _workload_text(calibration, index)
    figure = workload_figure(calibration, index)
    return (
        f"<h2>Workload {html.escape(w.provider)}/{html.escape(w.priority)}</h2><p>{html.escape(text)}</p>"
        + _png(figure)
    )


def calibration_report_html(calibration: Calibration) -> str:
    """The report as one HTML document."""
    flags = _flags(calibration)
    parts = [
        "<!doctype html><meta charset='utf-8'><title>aiqsim calibration</title>",
        "<style>body{font-family:sans-serif;max-width:1400px} th{text-align:left;padding-right:1em}</style>",
        f"<h1>Calibration: {html.escape(calibration.scenario.name)}</h1>",
        "<h2>Flags</h2><ul>" + "".join(f"<li>{html.escape(f)}</li>" for f in flags) + "</ul>",
    ]
    parts += [_provider_section(calibration, name) for name in calibration.providers]
    parts += [_workload_section(calibration, i) for i in range(len(calibration.workloads))]
    return "\n".join(parts)


def _flags(calibration: Calibration) -> list[str]:
    return calibration.flags or ["none: every fit is within its checks"]


def _tagged(cell: Any, tag: str) -> Any:
    cell.metadata["tags"] = [tag]
    return cell


def calibration_report_notebook(calibration: Calibration) -> Any:
    """The report as an ``nbformat`` v4 notebook: the HTML report's flags, tables and charts as
    already-drawn outputs, under code cells that redo them from the logs when run. The cell naming
    the logs is tagged ``parameters`` (papermill, :func:`aiqsim.lab.notebook_runs.run_notebook`).

    Needs ``nbformat`` (the ``notebooks``, ``test`` and ``docs`` extras, or ``pip install nbformat``).
    """
    try:
        import nbformat
    except ImportError as error:
        raise CalibrationError("a notebook report needs nbformat: pip install nbformat") from error
    v4 = nbformat.v4

    def drawn(source: str, figure: Any) -> Any:
        cell = v4.new_code_cell(source)
        cell.outputs = [
            v4.new_output(
                "display_data", data={"image/png": _png_base64(figure), "text/plain": "<Figure>"}, metadata={}
            )
        ]
        return cell

    inputs = dict(calibration.inputs)
    call = ", ".join(f"{key}={value!r}" for key, value in inputs.items() if key != "logs")
    cells = [
        v4.new_markdown_cell(
            f"# Calibration: {calibration.scenario.name}\n\n"
            "Every fit drawn against the data it came from. The charts below were drawn when the report "
            "was written; *Run all* re-runs the calibration from the logs and redraws them."
        ),
        v4.new_markdown_cell("## Flags\n\n" + "\n".join(f"- {flag}" for flag in _flags(calibration))),
        _tagged(v4.new_code_cell(f"LOGS = {json.dumps(inputs.get('logs', []))}"), "parameters"),
        v4.new_code_cell(
            "from aiqsim.lab.calibrate import calibrate\n"
            "from aiqsim.lab.calibration_report import provider_figure, workload_figure\n\n"
            f"calibration = calibrate(LOGS{', ' + call if call else ''})\n"
            "calibration.flags"
        ),
    ]
    for name in calibration.providers:
        table = "\n".join(f"| {k} | {v.replace('|', '/')} |" for k, v in _provider_rows(calibration, name))
        cells.append(v4.new_markdown_cell(f"## Provider {name}\n\n| fit | value |\n|---|---|\n{table}"))
        cells.append(drawn(f"provider_figure(calibration, {name!r});", provider_figure(calibration, name)))
    for index, w in enumerate(calibration.workloads):
        text = _workload_text(calibration, index)
        cells.append(v4.new_markdown_cell(f"## Workload {w.provider}/{w.priority}\n\n{text}"))
        cells.append(drawn(f"workload_figure(calibration, {index});", workload_figure(calibration, index)))
    book = v4.new_notebook(cells=cells)
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.validate(book)
    return book


REPORT_FORMATS: dict[str, str] = {".html": "HTML", ".htm": "HTML", ".ipynb": "a Jupyter notebook"}
"""The report formats by file suffix (case ignored): anything else is refused, not written as HTML
under a name that promises another format (``r.pdf``)."""


def check_report_path(path: str | Path, flag: str = "report") -> None:
    """Refuse a report ``path`` whose format cannot be written, before any calibration work: an
    unknown suffix (the message lists the known ones), or ``.ipynb`` without nbformat."""
    suffix = Path(path).suffix.lower()
    if suffix not in REPORT_FORMATS:
        known = ", ".join(f"{s} ({kind})" for s, kind in REPORT_FORMATS.items())
        raise CalibrationError(
            f"{flag} {path}: cannot write a report as {suffix or 'a file without a suffix'}; "
            f"the formats are {known}"
        )
    if suffix == ".ipynb" and not is_installed("nbformat"):
        raise CalibrationError(
            f'{flag} {path}: a notebook report needs nbformat: pip install "aiqsim[notebooks]" '
            "(or pip install nbformat)"
        )


def write_calibration_report(calibration: Calibration, path: str | Path) -> Path:
    """Write the report to ``path``: a notebook for ``.ipynb``, HTML for ``.html``/``.htm``
    (:data:`REPORT_FORMATS`; any other suffix is refused by :func:`check_report_path`); returns it."""
    from aiqsim.lab.output_files import replaced_atomically, write_text_atomically

    check_report_path(path)
    target = Path(path)
    try:  # through a temporary file: an earlier report at ``path`` stays whole if this fails
        if target.suffix.lower() == ".ipynb":
            import nbformat

            book = calibration_report_notebook(calibration)
            with replaced_atomically(target) as temp:
                nbformat.write(book, str(temp))
        else:
            write_text_atomically(target, calibration_report_html(calibration))
    except OSError as error:
        raise CalibrationError(f"cannot write the report {target}: {error.strerror or error}") from None
    return target
