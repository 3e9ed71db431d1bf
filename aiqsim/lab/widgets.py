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
    "latency_p50_s",
    "latency_p99_s",
    "interactive_latency_p99_s",
    "quota_utilization",
)

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
    """A slider for a numeric ``(low, high[, step])`` range, a dropdown for a list of choices."""
    description = key.split(".")[-1]
    style = {"description_width": "initial"}
    if isinstance(spec, tuple) and len(spec) in (2, 3) and all(isinstance(v, int | float) for v in spec):
        low, high = spec[0], spec[1]
        integer = all(isinstance(v, int) for v in spec) and isinstance(value, int)
        step = spec[2] if len(spec) == 3 else (1 if integer else (high - low) / 100)
        cls = widgets.IntSlider if integer else widgets.FloatSlider
        start = value if value is not None and low <= value <= high else low
        return cls(value=start, min=low, max=high, step=step, description=description, style=style,
                   continuous_update=False)  # fmt: skip
    options = list(spec)
    return widgets.Dropdown(
        options=options, value=value if value in options else options[0], description=description, style=style
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
        self.controls = {
            key: make_control(key, spec, _lookup(self.scenario, key)) for key, spec in controls.items()
        }
        self._initial = {key: control.value for key, control in self.controls.items()}
        self.seed_box = widgets.IntText(
            value=self.scenario.seed if seed is None else seed, description="seed"
        )
        self.table = widgets.HTML()
        self.plot = widgets.Output()
        self.runs = 0
        self.last_result: Any = None
        for control in [*self.controls.values(), self.seed_box]:
            control.observe(self._on_change, names="value")
        super().__init__([widgets.HBox([*self.controls.values(), self.seed_box]), self.table, self.plot])
        self.rerun()

    def overrides(self) -> dict[str, Any]:
        """The scenario keys the user has moved away from where they started.

        Untouched controls change nothing, so the first run is the scenario file as written even when
        a file value lies outside a slider's range (the slider then shows its nearest end).
        """
        return {
            key: control.value
            for key, control in self.controls.items()
            if control.value != self._initial[key]
        }

    def _on_change(self, _change: Any) -> None:
        self.rerun()

    def rerun(self) -> Any:
        """Simulate with the current settings, refresh the table and the chart; returns the result."""
        from aiqsim.sim.simulate import simulate

        result = simulate(self.scenario, seed=self.seed_box.value, overrides=self.overrides())
        self.runs += 1
        self.last_result = result
        rows = "".join(
            f"<tr><td>{key}</td><td style='text-align:right'>{_fmt(result.summary.get(key))}</td></tr>"
            for key in self.shown
        )
        self.table.value = f"<table>{rows}</table>"
        self.plot.clear_output(wait=True)
        with self.plot:
            if self.chart == "latency_cdf":
                figure = charts.latency_cdf(result.tasks[result.tasks["status"] != "rejected"])
            else:
                figure = charts.retry_storm_timeline(result.timeline, title=self.scenario.name)
            display(figure)
            plt.close(figure)
        return result


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}"
    return f"{value:,}" if isinstance(value, int) else str(value)
