"""A TuningPanel callback does all its work before it returns: nothing is left running after a cell.

A headless executor (nbclient) collects a cell's output until the kernel reports "idle" and drops
whatever comes later; a front end shows it against the wrong cell. So the panel's observers must not
hand work to a thread, a timer, an asyncio task or a debounce, and must leave no matplotlib figure
open (the inline backend would draw it at the end of a later cell). Driven here in-process; the
kernel-side twin is tests/test_notebooks.py::test_a_tuning_panel_leaves_nothing_running_in_a_headless_kernel.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import matplotlib.pyplot as plt
import pytest

from aiqsim.lab.widgets import TuningPanel

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "retry_storm_429.toml"


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[str, ...]]]:
    """Every message any widget sends towards the front end: (model id, the state keys updated)."""
    messages: list[tuple[str, tuple[str, ...]]] = []
    original = widgets.Widget._send

    def recording(self: widgets.Widget, msg: dict[str, Any], buffers: Any = None) -> None:
        messages.append((self.model_id, tuple(sorted(msg.get("state", {})))))
        original(self, msg, buffers)

    monkeypatch.setattr(widgets.Widget, "_send", recording)
    return messages


def _left_running(threads_before: set[threading.Thread]) -> dict[str, list[Any]]:
    current = asyncio.current_task()
    return {
        "threads": [t.name for t in threading.enumerate() if t not in threads_before and t.is_alive()],
        "tasks": [t for t in asyncio.all_tasks() if t is not current],
        "timers": list(getattr(asyncio.get_running_loop(), "_scheduled", [])),
        "figures": plt.get_fignums(),
    }


def test_every_panel_callback_finishes_its_work_before_it_returns(sent: list[Any]) -> None:
    async def drive() -> None:
        plt.close("all")
        threads_before = set(threading.enumerate())
        key = "quotas.llm.requests_per_min"  # unset in the file: the panel shows an "unset" box for it
        controls = {
            "retry.base_s": (0.1, 5.0),
            "retry.strategy": ["exponential", "full_jitter"],
            key: (60, 240, 10),
        }
        panel = TuningPanel(SCENARIO, controls)
        moves = [
            (panel.controls["retry.base_s"], 2.0),  # a float slider
            (panel.controls["retry.strategy"], "full_jitter"),  # a dropdown
            (panel.controls[key], 120),  # a slider over an unset key: unticks "unset" in the same run
            (panel.unset[key], True),  # the "unset" box ticked again
            (panel.seed_box, 7),  # the seed
        ]
        for control, value in moves:
            runs, chart, count = panel.runs, panel.plot.value, len(sent)
            control.value = value
            # the run, the table and the chart are done when the assignment returns
            ran, redrawn = panel.runs - runs, panel.plot.value != chart
            assert ran == 1, f"{control.description}: {ran} runs done when the change returned, not 1"
            assert redrawn, f"{control.description}: the chart was not redrawn when the change returned"
            assert panel.plot.model_id in {model for model, _ in sent[count:]}
            done = len(sent)
            await asyncio.sleep(0.2)  # a timer, task or thread would act now, after the "cell" returned
            assert len(sent) == done, f"{control.description}: {sent[done:]} sent after the change returned"
            assert _left_running(threads_before) == {"threads": [], "tasks": [], "timers": [], "figures": []}
        ran = panel.runs
        assert ran == 1 + len(moves)

    asyncio.run(drive())
