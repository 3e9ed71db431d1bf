"""Live tuning: ipywidgets bound to scenario keys that re-run the simulation and redraw on change.

>>> panel = TuningPanel("scenarios/retry_storm_429.toml",
...                     {"retry.base_s": (0.05, 5.0), "dispatch.policy": ["fifo", "sjf"]})
>>> panel  # in Jupyter: sliders, the summary table and the retry-storm chart
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display

from aiqsim.lab import charts
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
        step = spec[2] if len(spec) == 3 else (1 if integer else (high - low) / 100)
        cls = widgets.IntSlider if integer else widgets.FloatSlider
        if value is not None:
            low, high = min(low, value), max(high, value)
        start = low if value is None else value
        return cls(value=start, min=low, max=high, step=step, description=description, style=style,
                   continuous_update=False)  # fmt: skip
    options = list(spec)
    if value is not None and value not in options:
        options.append(value)
    return widgets.Dropdown(
        options=options, value=options[0] if value is None else value, description=description, style=style
    )


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
        self.plot = widgets.Output()
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
        """Simulate with the current settings, refresh the table and the chart; returns the result."""
        from aiqsim.sim.simulate import simulate

        result = simulate(self.scenario, seed=self.seed_box.value, overrides=self.overrides())
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
        self.table.value = f"<table>{settings}{rows}</table>"
        self.plot.clear_output(wait=True)
        with self.plot:
            if self.chart == "latency_cdf":
                figure = charts.latency_cdf(result.tasks[result.tasks["status"] != "rejected"])
            else:
                figure = charts.retry_storm_timeline(
                    result.timeline, title=self.scenario.name, **charts.run_references(result)
                )
            display(figure)
            plt.close(figure)
        return result


def _display(value: Any) -> str:
    return UNSET if value is None else _fmt(value)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}"
    return f"{value:,}" if isinstance(value, int) else str(value)
