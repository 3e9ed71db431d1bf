"""RunProgress (the bar of sweeps and tuning studies) leaves no thread running after its batch.

tqdm starts a ``tqdm_monitor`` thread with its first bar and stops it only when the last bar that
registered closes; a bar made with ``disable=True`` unregisters itself at once without stopping it,
so every sweep with ``progress=False`` left the thread polling every 10 s for the rest of the process
(in Jupyter: outliving the cell that ran the sweep). Our bars are updated by the sweep itself and
need no monitor.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from tqdm.auto import tqdm

from aiqsim.sim.sweep import RunProgress, SweepError, sweep

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "retry_storm_429.toml"


def _new_threads(before: set[int | None]) -> list[str]:
    return [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()]


@pytest.mark.parametrize("progress", [True, False], ids=["shown", "switched off"])
def test_a_sweep_leaves_no_thread_alive_after_it_returns(progress: bool) -> None:
    before = {t.ident for t in threading.enumerate()}
    rows = sweep(SCENARIO, {"retry.base_s": [0.5]}, seeds=[0, 1], engine="serial", progress=progress)
    assert len(rows) == 2
    assert _new_threads(before) == []


def test_a_failed_sweep_leaves_no_thread_alive_either() -> None:
    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(SweepError):
        sweep(SCENARIO, {"retry.base_s": [-1.0]}, seeds=[0], engine="serial", progress=True)
    assert _new_threads(before) == []


def test_the_users_own_bars_keep_their_monitor() -> None:
    """The monitor is off for our bars only: tqdm's class, as the user's bars get it, is untouched."""
    bar = RunProgress(3, label="ours", enabled=False)
    bar.close()
    assert tqdm.monitor_interval == 10
    assert isinstance(bar._bar, tqdm) and type(bar._bar).monitor_interval == 0


@pytest.mark.notebook
def test_a_sweep_in_a_jupyter_kernel_leaves_no_thread_after_its_cell(tmp_path: Path) -> None:
    """In Jupyter ``tqdm.auto`` gives the widget bar; the cell that runs a sweep leaves no thread behind."""
    import nbformat

    from aiqsim.lab.notebook_runs import run_notebook

    book = nbformat.v4.new_notebook()
    book.cells = [
        nbformat.v4.new_code_cell("FAST = False"),
        nbformat.v4.new_code_cell(
            "import threading\n"
            "from aiqsim.sim.sweep import RunProgress, sweep\n"
            "before = {t.ident for t in threading.enumerate()}\n"
            f"scenario = {str(SCENARIO)!r}\n"
            "rows = sweep(scenario, {'retry.base_s': [0.5]}, seeds=[0, 1], engine='serial', progress=True)\n"
            "bar = RunProgress(1, label='kind', enabled=True)\n"
            "widget = any(c.__module__ == 'tqdm.notebook' for c in type(bar._bar).__mro__)\n"
            "bar.close()"
        ),
        nbformat.v4.new_code_cell(
            "left = [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()]\n"
            "print(f'{len(rows)} rows; widget bar: {widget}; threads left: {left}')"
        ),
    ]
    book.cells[0].metadata["tags"] = ["parameters"]
    path = tmp_path / "sweep.ipynb"
    nbformat.write(book, path)

    executed = run_notebook(path, timeout_s=120)

    text = executed.cells[-1].outputs[0]["text"]
    assert text == "2 rows; widget bar: True; threads left: []\n"  # tqdm.auto picked the widget bar


def _shown(text: str, total: int) -> int:
    """The count the bar drew last (``N/total`` in its latest line)."""
    counts = re.findall(rf"(\d+)/{total}\b", text)
    assert counts, text
    return int(counts[-1])


def test_the_bar_shows_each_finished_run_even_after_a_burst_of_quick_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With no monitor thread nothing else redraws the bar: each advance must draw it.

    tqdm's automatic ``miniters`` grows in a burst of quick runs (failures, a pool's workers finishing
    together) to ~10; without the monitor, which reset it after 10 s, slow runs that followed left the
    bar frozen for ten of them (minutes to hours of a real sweep). Driven by a clock of our own.
    """
    bar = RunProgress(40, label="burst", enabled=True)
    now = [bar._bar.last_print_t]
    bar._bar._time = lambda: now[0]  # tqdm reads its clock through this attribute
    for _ in range(30):  # a burst: a run every 10 ms
        now[0] += 0.01
        bar.advance()
    for done in range(31, 40):  # then a run every 90 s
        now[0] += 90.0
        bar.advance()
        assert _shown(capsys.readouterr().err, 40) == done
    bar.close()
