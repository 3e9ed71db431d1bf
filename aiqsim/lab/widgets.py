"""Live tuning: ipywidgets bound to scenario keys that re-run the simulation and redraw on change.

>>> panel = TuningPanel("scenarios/retry_storm_429.toml",
...                     {"retry.base_s": (0.05, 5.0), "dispatch.policy": ["fifo", "sjf"]})
>>> panel  # in Jupyter: sliders, the summary table and the retry-storm chart

The chart is a PNG in an :class:`ipywidgets.Image`, not drawn inside an :class:`ipywidgets.Output`:
output captured by an Output widget makes a headless executor (nbclient mimics the front end) send a
``comm_msg`` back to the kernel for every output while it is still collecting the cell's messages,
traffic that widget notebooks executed headless have been seen to hang on intermittently. An Image
widget's new value only flows from the kernel to the front end: nothing comes back.

Every callback finishes its work before it returns: the run, the table and the chart are done, and
no thread, timer, asyncio task or open figure is left to send output after the cell (a headless
executor drops what comes after the kernel's "idle"). tests/test_panel_callbacks.py holds it to that.
"""

from __future__ import annotations

import html
import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import matplotlib.pyplot as plt

from aiqsim.core.errors import ConfigurationError
from aiqsim.lab import charts
from aiqsim.lab.chart_style import format_number, short_setting
from aiqsim.sim.config import Scenario

DEFAULT_SHOWN = (
    "tasks_succeeded",
    "tasks_failed",
    "tasks_deduped",
    "attempts",
    "retries",
    "rate_limited",
    "duplicate_billed_calls",
    "cost_total",
    "cost_duplicated",
    "success_latency_p50_s",
    "success_latency_p99_s",
    "failure_time_p50_s",
    "goodput_per_s",
    "quota_utilization",
)

UNSET = "unset"
"""How the panel shows a key the simulated scenario leaves unset (e.g. no client quota at all)."""

Control = tuple[float, float] | tuple[float, float, float] | Sequence[Any]


def _lookup(scenario: Scenario, key: str) -> Any:
    """The scenario's value at a dotted override key (``retry.base_s``, ``providers.llm.timeout_prob``).

    An unknown key raises :class:`~aiqsim.sim.scenario.ScenarioError` with the loader's own message.
    """
    from aiqsim.sim.scenario import ScenarioError, apply_overrides, scenario_to_dict, split_key_path

    source = scenario.source or scenario.name
    raw = scenario_to_dict(scenario)
    apply_overrides(raw, {key: None}, source=source)  # validates the path and names any problem
    node: Any = raw
    for part in split_key_path(key, source=source):
        if isinstance(node, list) and isinstance(part, str):
            node = next(item for item in node if item.get("name") == part)
        elif isinstance(node, dict) and part not in node:
            return None  # e.g. a quota table the file does not have yet
        else:
            node = node[part]
    if isinstance(node, dict | list):
        raise ScenarioError(source, key, "is a table, not a single value a control can set")
    return node


def make_control(key: str, spec: Control, value: Any) -> widgets.Widget:
    """A slider for a numeric ``(low, high[, step])`` range, a dropdown for a list of choices.

    The control starts at the scenario's ``value``: a slider's range is widened to include a file value
    outside it and a dropdown gains a file value it does not list, so the control never shows a number
    that is not the one simulated. With ``value`` None (the key is unset) it starts at the range's low end
    or the first choice, and the panel's "unset" checkbox says that this is not what runs.
    """
    description = key.split(".")[-1]
    style = {"description_width": "initial"}
    if isinstance(spec, tuple) and len(spec) in (2, 3) and all(isinstance(v, int | float) for v in spec):
        low, high = spec[0], spec[1]
        integer = all(isinstance(v, int) for v in spec) and isinstance(value, int | None)
        if value is not None:
            low, high = min(low, value), max(high, value)
        step = spec[2] if len(spec) == 3 else round_step(low, high, value, integer=integer)
        start = low if value is None else value
        if integer:
            return widgets.IntSlider(value=start, min=low, max=high, step=int(step), description=description,
                                     style=style, continuous_update=False, readout_format=",d")  # fmt: skip
        decimals = _decimals(step)
        return widgets.FloatSlider(value=start, min=low, max=high, step=step, description=description,
                                   style=style, continuous_update=False,
                                   readout_format=f",.{decimals}f")  # fmt: skip
    options = list(spec)
    if value is not None and value not in options:
        options.append(value)
    return widgets.Dropdown(
        options=options, value=options[0] if value is None else value, description=description, style=style
    )


def round_step(low: float, high: float, value: float | None = None, *, integer: bool = False) -> float:
    """A slider step people would choose: 1, 2 or 5 times a power of ten, about a fiftieth of the range.

    The slider's positions are ``low + k * step``, so the step is the largest such round number that
    puts ``low``, ``high`` and the file's ``value`` on the grid (base 2.0 is reachable from 0.1 in steps
    of 0.05, not stranded between 1.96 and 2.009 as with a step of a hundredth of the range).
    """
    span = high - low
    if span <= 0:
        return 1 if integer else 0.1
    points = [v for v in (low, high, value) if v is not None]
    exponent = math.floor(math.log10(span / 20))
    for power in range(exponent, exponent - 12, -1):
        for mantissa in (5, 2, 1):
            step = mantissa * 10.0**power
            if step > span / 20 or (integer and step < 1):
                continue
            if all(abs(v / step - round(v / step)) < 1e-9 for v in points):
                return int(step) if integer else float(f"{step:.12g}")
    return 1


def _decimals(step: float) -> int:
    """How many decimals a readout needs to show every multiple of ``step`` (0.05 -> 2, 1 -> 0)."""
    text = f"{step:.12g}"
    if "." in text and "e" not in text:
        return len(text.split(".")[1])
    return max(0, -math.floor(math.log10(step)))


class TuningPanel(widgets.VBox):
    """Sliders and dropdowns bound to scenario keys; every change re-runs ``simulate`` and redraws.

    ``controls`` maps dotted scenario keys to a numeric range ``(low, high[, step])`` or a list of
    choices. ``last_result`` holds the latest :class:`~aiqsim.sim.simulate.SimulationResult`.
    """

    def __init__(
        self,
        scenario: Scenario | str | Path,
        controls: Mapping[str, Control],
        *,
        seed: int | None = None,
        shown: Sequence[str] = DEFAULT_SHOWN,
        chart: str = "retry_storm_timeline",
    ) -> None:
        from aiqsim.sim.scenario import load_scenario

        self.scenario = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        self.seed = seed
        self.shown = tuple(shown)
        self.chart = chart
        self.file_values = {key: _lookup(self.scenario, key) for key in controls}
        self.controls = {
            key: make_control(key, spec, self.file_values[key]) for key, spec in controls.items()
        }
        # one "unset" checkbox per key the scenario leaves unset: ticked, the key is not set at all
        self.unset = {
            key: widgets.Checkbox(value=True, description=UNSET, indent=False, layout={"width": "auto"})
            for key, value in self.file_values.items()
            if value is None
        }
        self._quiet = False
        self.seed_box = widgets.IntText(
            value=self.scenario.seed if seed is None else seed, description="seed"
        )
        self.table = widgets.HTML()
        self.plot = widgets.Image(format="png", layout={"max_width": "100%"})
        self.chart_title = ""
        self._last_table = ""
        self.error: str | None = None
        """Why the last change could not run (the scenario refused the settings), else None."""
        self.runs = 0
        self.last_result: Any = None
        for key, control in self.controls.items():
            control.observe(lambda change, key=key: self._on_value(key), names="value")
        for box in [*self.unset.values(), self.seed_box]:
            box.observe(self._on_change, names="value")
        boxes = [widgets.HBox([control, self.unset[key]]) if key in self.unset else control
                 for key, control in self.controls.items()]  # fmt: skip
        super().__init__([widgets.HBox([*boxes, self.seed_box]), self.table, self.plot])
        self.rerun()

    def overrides(self) -> dict[str, Any]:
        """The scenario keys whose shown setting differs from the file: what the next run changes.

        A key whose "unset" box is ticked is left as the file has it (unset); every other control's
        value is compared with the file's, not with where the control started, so moving a slider away
        and back to a value the file does not set (60 over an unset quota) still runs 60.
        """
        chosen = {}
        for key, control in self.controls.items():
            if key in self.unset and self.unset[key].value:
                continue
            if control.value != self.file_values[key]:
                chosen[key] = control.value
        return chosen

    def simulated_settings(self) -> dict[str, Any]:
        """Each controlled key as the last run simulated it (:data:`UNSET` for a key left unset)."""
        scenario = self.last_result.scenario
        return {key: _display(_lookup(scenario, key)) for key in self.controls}

    def _on_value(self, key: str) -> None:
        if self._quiet:
            return
        if key in self.unset and self.unset[key].value:
            self._quiet = True  # moving a control means "set this": untick "unset" without a second run
            try:
                self.unset[key].value = False
            finally:
                self._quiet = False
        self.rerun()

    def _on_change(self, _change: Any) -> None:
        if not self._quiet:
            self.rerun()

    def rerun(self) -> Any:
        """Simulate with the current settings, refresh the table and the chart; returns the result.

        Settings the scenario refuses are not run: :attr:`error` says why, the table shows it above the
        last run's figures, and None is returned (the first run, of the file as written, raises).
        """
        from aiqsim.sim.simulate import simulate

        try:
            result = simulate(self.scenario, seed=self.seed_box.value, overrides=self.overrides())
        except ConfigurationError as error:
            # a combination the scenario refuses (the quickstart's burst slider moved while the request
            # quota is unset): raised from a widget callback it only reached the kernel's log, and the
            # panel kept showing the last run beside controls that no longer matched it
            if self.last_result is None:
                raise
            self.error = str(error)
            self.table.value = (
                f"<p style='color:#D55E00'><b>Not run:</b> {html.escape(self.error)}. "
                "The table and chart below are still the last run's.</p>" + self._last_table
            )
            return None
        self.error = None
        self.runs += 1
        self.last_result = result
        settings = "".join(
            f"<tr><td><b>{key}</b></td><td style='text-align:right'><b>{value}</b></td></tr>"
            for key, value in self.simulated_settings().items()
        )
        rows = "".join(
            f"<tr><td>{key}</td><td style='text-align:right'>{_fmt(result.summary.get(key))}</td></tr>"
            for key in self.shown
        )
        self._last_table = f"<table>{settings}{rows}</table>"
        self.table.value = self._last_table
        title = self.title(result)
        if self.chart == "latency_cdf":
            figure = charts.latency_cdf(result.tasks, title=title)
        else:
            references = charts.run_references(result)
            figure = charts.retry_storm_timeline(result.timeline, title=title, **references)
        self.chart_title = figure.axes[0].get_title()
        png = io.BytesIO()
        figure.savefig(png, format="png", dpi=90)
        plt.close(figure)
        self.plot.value = png.getvalue()
        return result

    def title(self, result: Any) -> str:
        """The chart's title: the scenario, each controlled setting as simulated, and the failed tasks."""
        settings = ", ".join(
            short_setting(key, value) if value is not None else f"{key.split('.')[-1]} {UNSET}"
            for key, value in ((key, _lookup(result.scenario, key)) for key in self.controls)
        )
        failed = int(result.summary.get("tasks_failed", 0) or 0)
        return f"{self.scenario.name} ({settings}; {format_number(failed)} failed tasks)"


def _display(value: Any) -> str:
    return UNSET if value is None else _fmt(value)


def _fmt(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format_number(value)
    return str(value)
