"""Every notebook in notebooks/ runs top to bottom, headless, on a fresh kernel.

Each notebook has a cell tagged ``parameters``; the suite injects ``FAST = True`` after it so the
sweeps shrink to CI size while every code path still runs.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from executed_notebooks import executed, run_of

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
CI_PARAMETERS = "FAST = True"
EXECUTED_ELSEWHERE = {"backoff_jitter_study"}  # tests/test_validation.py runs it and checks its findings
REPRODUCED = {
    "01_quickstart", "02_retry_storms_and_backoff", "03_bucket_sizing", "04_dispatch_policies",
    "05_crash_recovery", "06_azure_trace_replay", "07_overload_protection", "08_pipeline_bottlenecks",
    "09_fleet_sizing", "10_tune_from_production", "11_streaming_deadlines", "12_routing_and_fairness",
    "backoff_jitter_study",
}  # fmt: skip
"""Notebooks whose every recommendation prints a ``check:`` line (Decision.check_line): the command on a
seed it was computed from and the figures that run must print. Every other notebook's command still runs."""


def run_notebook(path: Path, timeout: int = 600) -> nbformat.NotebookNode:
    """The notebook executed with ``FAST = True``, once per session (tests/executed_notebooks.py)."""
    return executed(path)


@pytest.mark.notebook
@pytest.mark.parametrize(
    "path",
    sorted(p for p in NOTEBOOKS.glob("*.ipynb") if p.stem not in EXECUTED_ELSEWHERE),
    ids=lambda p: p.stem,
)
def test_notebook_runs_headless(path: Path) -> None:
    book = run_notebook(path)
    errors = [
        output
        for cell in book.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]
    assert errors == []
    images = sum(
        1
        for cell in book.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if "image/png" in output.get("data", {})
    )
    assert images >= 1, f"{path.name} drew no chart"
    printed = "".join(
        output.get("text", "")
        for cell in book.cells[_decision_index(book) :]
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "stream"
    )
    assert "Recommended: " in printed and "aiqsim run " in printed, f"{path.name} computed no decision"
    # the recommended command can be run after the notebook (from the clone's root, as the README
    # says): its scenario file exists, it is not a working file the notebook removed
    command = shlex.split(printed.split("Recommended: ", 1)[1].split("aiqsim run ", 1)[1].splitlines()[0])
    scenario = NOTEBOOKS.parent / command[0]  # an absolute path stays as it is
    assert scenario.is_file(), f"{path.name} recommends running {command[0]}, which does not exist"


@pytest.mark.notebook
@pytest.mark.parametrize(
    "path",
    sorted(p for p in NOTEBOOKS.glob("*.ipynb") if p.stem not in EXECUTED_ELSEWHERE),
    ids=lambda p: p.stem,
)
def test_notebook_leaves_no_temporary_files(path: Path) -> None:
    """A notebook deletes what it writes to the temp dir: run on every docs build and CI run, a
    leftover folder piles up in /tmp. Each run's kernel has a TMPDIR of its own (executed_notebooks)."""
    assert run_of(path).leftovers == (), f"{path.name} left these in its TMPDIR"


def _decision_index(book: nbformat.NotebookNode) -> int:
    headings = [
        i
        for i, cell in enumerate(book.cells)
        if cell.cell_type == "markdown" and cell.source.lstrip().startswith("## Decision")
    ]
    assert headings, "no '## Decision' section"
    return headings[-1]


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.stem)
def test_every_notebook_ends_in_a_computed_decision(path: Path) -> None:
    """The last section is "## Decision"; its code builds the decision from the notebook's own results
    (a lab.decisions rule or Decision) and prints the recommendation with the --set line."""
    book = nbformat.read(path, as_version=4)
    start = _decision_index(book)
    assert all(cell.cell_type == "code" for cell in book.cells[start + 1 :]), "the Decision section is last"
    code = "\n".join(cell.source for cell in book.cells[start + 1 :])
    assert "from aiqsim.lab.decisions import" in code
    assert ".command" in code and "Recommended: " in code


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.stem)
def test_notebooks_are_stored_without_stale_outputs(path: Path) -> None:
    book = nbformat.read(path, as_version=4)
    for cell in book.cells:
        if cell.cell_type == "code":
            assert cell.get("outputs", []) == [] and cell.get("execution_count") is None, path.name


def test_run_notebook_shuts_its_kernel_down(tmp_path: Path) -> None:
    """Each run starts a kernel and must stop it: nbclient keeps alive a kernel it did not create, and
    every executed notebook used to leave one (~200 MB) idle until the test session ended."""
    import os
    import uuid

    from aiqsim.lab.notebook_runs import run_notebook

    book = nbformat.v4.new_notebook()
    book.cells = [nbformat.v4.new_code_cell("FAST = False"), nbformat.v4.new_code_cell("print('fast', FAST)")]
    book.cells[0].metadata["tags"] = ["parameters"]
    path = tmp_path / "tiny.ipynb"
    nbformat.write(book, path)
    tag = str(uuid.uuid4())  # in the kernel's environment: tells our kernel from other tests' kernels

    executed = run_notebook(path, env={**os.environ, "AIQSIM_TEST_KERNEL": tag})

    assert executed.cells[2].outputs[0]["text"] == "fast True\n"
    ours = _processes_tagged(tag)
    assert ours == [], f"kernel process(es) {ours} still running after run_notebook returned"


def _processes_tagged(tag: str) -> list[str]:
    """The ids of the running processes whose environment has ``AIQSIM_TEST_KERNEL=tag``."""
    mark = f"AIQSIM_TEST_KERNEL={tag}".encode()
    ours = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and mark in (entry / "environ").read_bytes().split(b"\0"):
                ours.append(entry.name)
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return ours


def test_a_stuck_cell_fails_naming_the_notebook_and_the_cell(tmp_path: Path) -> None:
    """A cell that never finishes fails the run after the per-cell limit, with nbclient's error and a
    note saying which notebook and which cell, and the kernel is stopped: a run never stalls."""
    import os
    import time
    import uuid

    from nbclient.exceptions import CellTimeoutError

    from aiqsim.lab.notebook_runs import run_notebook

    book = nbformat.v4.new_notebook()
    book.cells = [
        nbformat.v4.new_code_cell("FAST = False"),
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_markdown_cell("stuck below"),
        nbformat.v4.new_code_cell("import time\ntime.sleep(900)"),
        nbformat.v4.new_code_cell("print('never')"),
    ]
    book.cells[0].metadata["tags"] = ["parameters"]
    path = tmp_path / "stuck.ipynb"
    nbformat.write(book, path)

    tag = str(uuid.uuid4())

    started = time.monotonic()
    with pytest.raises(CellTimeoutError) as caught:
        run_notebook(path, timeout_s=3, env={**os.environ, "AIQSIM_TEST_KERNEL": tag})

    assert time.monotonic() - started < 300, "the run waited for the cell, not for its limit"
    assert caught.value.__notes__ == ["in stuck.ipynb, code cell 3 of 4 (`import time`)"]
    assert _processes_tagged(tag) == [], "the stuck kernel was left running"


def test_a_kernel_that_dies_fails_the_run_naming_the_cell(tmp_path: Path) -> None:
    """A kernel killed in the middle of a cell (as the OOM killer would) fails the run within seconds
    with nbclient's DeadKernelError, not a wait for output that will never come."""
    import time

    from nbclient.exceptions import DeadKernelError

    from aiqsim.lab.notebook_runs import run_notebook

    book = nbformat.v4.new_notebook()
    book.cells = [
        nbformat.v4.new_code_cell("FAST = False"),
        nbformat.v4.new_code_cell("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"),
    ]
    book.cells[0].metadata["tags"] = ["parameters"]
    path = tmp_path / "killed.ipynb"
    nbformat.write(book, path)

    started = time.monotonic()
    with pytest.raises(DeadKernelError) as caught:
        run_notebook(path)  # the cell's limit (CELL_TIMEOUT_S) is not what ends it

    waited = time.monotonic() - started
    assert waited < 120, f"{waited:.0f} s: noticed by the cell's limit, not by the liveness check"
    assert caught.value.__notes__ == ["in killed.ipynb, code cell 2 of 2 (`import os, signal`)"]


KERNEL_RECORDER = """\
import asyncio, threading
import matplotlib.pyplot as plt
kernel = get_ipython().kernel
received = []  # comm messages the front end sent the kernel
original = kernel.shell_handlers['comm_msg']
def counting(*args, **kwargs):
    received.append(args[-1]['content']['data'].get('method'))
    return original(*args, **kwargs)
kernel.shell_handlers['comm_msg'] = counting
sent = []  # every message the kernel sends: (its request's id, type, busy/idle)
session_send = kernel.session.send
def recording(stream, msg_or_type, content=None, parent=None, *args, **kwargs):
    if isinstance(msg_or_type, dict):
        kind = msg_or_type['header']['msg_type']
        head, body = msg_or_type.get('parent_header'), msg_or_type.get('content')
    else:
        kind, head, body = msg_or_type, parent, content
    head = (head or {}).get('header', head or {})
    state = body.get('execution_state') if isinstance(body, dict) else None
    sent.append((head.get('msg_id'), kind, state))
    return session_send(stream, msg_or_type, content, parent, *args, **kwargs)
kernel.session.send = recording
started = []  # every thread started from now on: (name, the module of its class)
thread_start = threading.Thread.start
def start_recording(self, *args, **kwargs):
    started.append(f'{self.name} ({type(self).__module__})')
    return thread_start(self, *args, **kwargs)
threading.Thread.start = start_recording
"""

KERNEL_CHECK = """\
await asyncio.sleep(1.5)  # a thread, timer or task the panel left would act by now
idle = sent.index((driving, 'status', 'idle'))
bookkeeping = ('status', 'execute_input', 'execute_reply')  # the check cell's own
late = [kind for parent, kind, state in sent[idle + 1:] if kind not in bookkeeping]
ours = [t.get_coro().__qualname__ for t in asyncio.all_tasks() if t is not asyncio.current_task()
        and 'ipykernel' not in t.get_coro().cr_code.co_filename]
threads = [name for name in started if 'zmq.utils.garbage' not in name]  # pyzmq's, for its zero-copy sends
print(f'comm messages from the front end: {received}; sent after idle: {late}; '
      f'threads started: {threads}; tasks: {ours}; open figures: {plt.get_fignums()}')
"""


@pytest.mark.notebook
def test_a_tuning_panel_leaves_nothing_running_in_a_headless_kernel(tmp_path: Path) -> None:
    """A cell that builds a panel and moves every kind of control finishes all of its output before the
    kernel reports "idle" (a headless executor drops what comes later), leaves no thread, asyncio task
    or open figure behind, and makes the front end send nothing back: a panel drawn into an ipywidgets
    Output made nbclient, which mimics the front end, send a ``comm_msg`` to the kernel for every output
    while still collecting the cell's messages, the round trip the quickstart's headless hangs after its
    panel cell were first suspected of. The in-process twin is tests/test_panel_callbacks.py."""
    from aiqsim.lab.notebook_runs import run_notebook

    book = nbformat.v4.new_notebook()
    book.cells = [
        nbformat.v4.new_code_cell("FAST = False"),
        nbformat.v4.new_code_cell(KERNEL_RECORDER),
        nbformat.v4.new_code_cell(
            "from aiqsim.lab.widgets import TuningPanel\n"
            "driving = get_ipython().parent_header['header']['msg_id']\n"
            f"panel = TuningPanel({str(NOTEBOOKS.parent / 'scenarios' / 'retry_storm_429.toml')!r},\n"
            "                    {'retry.base_s': (0.1, 5.0), 'retry.strategy': ['exponential', 'none'],\n"
            "                     'quotas.llm.requests_per_min': (60, 240, 10)})\n"
            "panel.controls['retry.base_s'].value = 2.0\n"
            "panel.controls['retry.strategy'].value = 'none'\n"
            "panel.controls['quotas.llm.requests_per_min'].value = 120\n"
            "panel.unset['quotas.llm.requests_per_min'].value = True\n"
            "panel.seed_box.value = 3\n"
            "panel"
        ),
        nbformat.v4.new_code_cell(KERNEL_CHECK),
    ]
    book.cells[0].metadata["tags"] = ["parameters"]
    path = tmp_path / "panel.ipynb"
    nbformat.write(book, path)

    executed = run_notebook(path, timeout_s=120)

    assert executed.cells[-1].outputs[0]["text"] == (
        "comm messages from the front end: []; sent after idle: []; threads started: []; tasks: []; "
        "open figures: []\n"
    )
    assert executed.cells[3].outputs, "the panel cell showed nothing"


def _decision_output(book: nbformat.NotebookNode) -> str:
    return "".join(
        output.get("text", "")
        for cell in book.cells[_decision_index(book) :]
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "stream"
    )


def _run_args(text: str) -> list[str]:
    """The arguments after ``aiqsim run`` on a printed line, without a trailing "(note)"."""
    command = text.split("aiqsim run ", 1)[1]
    return shlex.split(re.sub(r"\s+\(.*\)\s*$", "", command))


def _aiqsim_run(args: list[str], out: Path) -> dict[str, object]:
    """``aiqsim run ARGS`` from the clone's root, as the README says; its summary.json."""
    env = {**os.environ, "TMPDIR": str(out.parent)}
    done = subprocess.run(
        [sys.executable, "-m", "aiqsim", "run", *args, "--no-charts", "--out", str(out)],
        cwd=NOTEBOOKS.parent, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, (
        f"aiqsim run {shlex.join(args)} exited {done.returncode}: {done.stderr[-2000:]}"
    )
    return json.loads((out / "summary.json").read_text())


@pytest.mark.notebook
@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.stem)
def test_the_recommended_commands_run_and_reproduce_the_decisions_figures(path: Path, tmp_path: Path) -> None:
    """Every ``Recommended: aiqsim run ...`` line a notebook prints is run as a user would run it; where
    the notebook prints its ``check:`` line (the same command on a seed the decision was computed from,
    and the figures that run gave), the command must print exactly those figures."""
    printed = _decision_output(executed(path))
    recommended = [_run_args(line) for line in printed.splitlines() if "Recommended: " in line]
    checks = []
    for line in printed.splitlines():
        if line.startswith("check: aiqsim run "):
            command, _, figures = line.partition(" -> ")
            expected = {
                key: float(value) for key, value in (pair.split("=", 1) for pair in figures.split(", "))
            }
            checks.append((_run_args(command), expected))
    assert recommended, f"{path.name} recommends no command"
    if path.stem in REPRODUCED:
        assert len(checks) == len(recommended), f"{path.name}: a recommendation without its check line"
    checked = {tuple(args[: args.index("--seed")]) for args, _ in checks}
    for i, args in enumerate(recommended):
        if tuple(args) not in checked:  # a checked command runs below, on its seed
            _aiqsim_run(args, tmp_path / f"recommended{i}")
    for i, (args, expected) in enumerate(checks):
        summary = _aiqsim_run(args, tmp_path / f"check{i}")
        for key, value in expected.items():
            got = summary[key]
            assert isinstance(got, int | float) and math.isclose(got, value, rel_tol=1e-5, abs_tol=1e-9), (
                f"{path.name}: aiqsim run {shlex.join(args)} gives {key}={got}, the decision {value:.6g}"
            )


@pytest.mark.parametrize(
    "path", sorted(p for p in NOTEBOOKS.glob("*.ipynb") if p.stem in REPRODUCED), ids=lambda p: p.stem
)
def test_a_reproduced_notebook_prints_the_check_of_its_decision(path: Path) -> None:
    book = nbformat.read(path, as_version=4)
    code = "\n".join(cell.source for cell in book.cells[_decision_index(book) + 1 :])
    assert ".checked(" in code and ".check_line" in code


TRADE = re.compile(
    r"\((?P<verdict>ship the tuned settings|keep the current settings)[^;]*; "
    r"429s (?P<current_429>[\d.]+) -> (?P<tuned_429>[\d.]+) per run \([\d.]+ (?:fewer|more)\) "
    r"for p50 [\d.]+ -> [\d.]+ s, p99 [\d.]+ -> [\d.]+ s; "
    r"p99 <= (?P<slo>[\d.]+) s on (?P<tuned_meet>\d+) of (?P<seeds>\d+) fresh seeds tuned, "
    r"(?P<current_meet>\d+) of (?P=seeds) current\)$"
)


@pytest.mark.notebook
def test_tuning_ships_only_settings_whose_every_fresh_seed_meets_the_slo() -> None:
    """Notebook 10 ships the tuned settings only if every fresh seed keeps p99 within the SLO (a mean
    under it hid seeds that missed it) and they cut the 429s; the Recommended line states the trade
    (429s saved against the p50 and p99 change, seeds meeting the SLO) whichever way it goes, and the
    evidence table carries the worst seed and the seeds meeting the SLO."""
    path = NOTEBOOKS / "10_tune_from_production.ipynb"
    book = executed(path)
    printed = _decision_output(book)
    line = next(line for line in printed.splitlines() if line.startswith("Recommended: "))
    trade = TRADE.search(line)
    assert trade, f"the Recommended line does not state the trade: {line}"
    seeds, tuned_meet = int(trade["seeds"]), int(trade["tuned_meet"])
    every_seed_and_fewer = tuned_meet == seeds and float(trade["tuned_429"]) < float(trade["current_429"])
    shipped = trade["verdict"] == "ship the tuned settings"
    assert shipped == every_seed_and_fewer, line
    assert shipped == _run_args(line)[0].endswith("tuned.toml"), line
    assert f"seeds with p99 <= {trade['slo']} s (of {seeds})" in printed and "worst seed" in printed
    rule = book.cells[_decision_index(book)].source
    assert "**every** fresh seed" in rule and "cut" in rule


def test_a_long_temporary_folder_does_not_stop_the_kernel_from_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel's Unix sockets have a path of at most ~104 bytes (the OS's ``sun_path``): under a
    temporary folder of a long path (a CI's or a sandbox's ``TMPDIR``) the run failed at once with
    pyzmq's ``ZMQError: File name too long``. The sockets go to a shorter folder then."""
    import tempfile

    from aiqsim.lab.notebook_runs import run_notebook

    deep = tmp_path / ("t" * max(1, 90 - len(str(tmp_path))))
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    book = nbformat.v4.new_notebook()
    book.cells = [nbformat.v4.new_code_cell("FAST = False"), nbformat.v4.new_code_cell("print('fast', FAST)")]
    book.cells[0].metadata["tags"] = ["parameters"]
    path = tmp_path / "tiny.ipynb"
    nbformat.write(book, path)

    executed = run_notebook(path)

    assert executed.cells[2].outputs[0]["text"] == "fast True\n"
    assert list(deep.iterdir()) == []


INTERRUPTED_RUN = """\
import sys
from aiqsim.lab.notebook_runs import run_notebook
try:
    run_notebook(sys.argv[1])
except KeyboardInterrupt:
    print("KeyboardInterrupt")
    sys.exit(130)
except BaseException as error:
    print(type(error).__name__)
    sys.exit(1)
"""


def test_ctrl_c_stops_a_notebook_run_as_an_interrupt_and_stops_its_kernel(tmp_path: Path) -> None:
    """Ctrl-C at a terminal (SIGINT to the process group) during a cell ends the run with
    ``KeyboardInterrupt``, so pytest or ``mkdocs build`` stops, and no kernel is left running.

    nbclient catches SIGINT itself to shut its kernel down; the cell then saw a dead kernel and its
    second clean-up failed on an ``assert``: the run ended in a bare ``AssertionError`` (exit 1), and a
    test session went on to the next notebook instead of stopping."""
    import signal
    import time
    import uuid

    marker = tmp_path / "cell-started"
    book = nbformat.v4.new_notebook()
    book.cells = [
        nbformat.v4.new_code_cell("FAST = False"),
        nbformat.v4.new_code_cell(
            f"import pathlib, time\npathlib.Path({str(marker)!r}).touch()\ntime.sleep(900)"
        ),
    ]
    book.cells[0].metadata["tags"] = ["parameters"]
    path = tmp_path / "interrupted.ipynb"
    nbformat.write(book, path)
    tag = str(uuid.uuid4())
    run = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED_RUN, str(path)],
        env={**os.environ, "AIQSIM_TEST_KERNEL": tag},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # a process group of its own, as a terminal's foreground job
    )
    try:
        deadline = time.monotonic() + 240
        while not marker.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), "the cell never started"
        os.killpg(run.pid, signal.SIGINT)
        out, _ = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert (out.strip(), run.returncode) == ("KeyboardInterrupt", 130)
    assert _processes_tagged(tag) == [], "the interrupted run left its kernel running"
