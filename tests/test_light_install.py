"""A production worker installs and runs aiqsim without the lab; the lab without its extra says so.

``pip install aiqsim`` installs no simulation, plotting or notebook package (``pyproject.toml``'s core
``dependencies``), and the production API (Scheduler, AsyncioRuntime, stores, RetryPolicy,
QuotaLimits, HttpProvider, the fleet) must then import and run. The suite's own venv has every extra,
so these tests take packages away: each program runs in a fresh interpreter behind an import hook
(a ``sys.meta_path`` finder) that refuses the named packages, exactly as a venv without them would.

The command line runs the lab: without the ``lab`` extra (or a command's own extra: http, dask,
optuna) it refuses up front with the ``pip install`` line, never a traceback after work ran.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from aiqsim.core.extras import (
    EXTRAS,
    ExtraMissingError,
    install_line,
    missing_packages,
    require_extra,
    require_extras,
)

ROOT = Path(__file__).resolve().parent.parent

LAB_PACKAGES = ("simpy", "numpy", "pandas", "matplotlib", "ipywidgets", "tqdm")
HEAVY = (*LAB_PACKAGES, "scipy", "pyarrow", "IPython", "jupyterlab", "notebook")
"""What a production worker must not need: the lab's packages and anything of the notebook stack."""

# Modules of the production rooms that belong to the lab (they drive the simulated provider model or
# build pandas tables) and so may need its packages; every other module there must not.
LAB_ONLY_MODULES = {
    "aiqsim.runtime.simpy_runtime",  # the SimPy runtime itself
    "aiqsim.http.live",  # `aiqsim compare`: simulated vs live, as a pandas table
    "aiqsim.http.serve",  # `aiqsim serve`: the simulated provider over HTTP
    "aiqsim.http.server",  # the local provider server runs the simulated provider model
    "aiqsim.testing.crash_driver",  # crash scenarios run on the SimPy clock
    "aiqsim.testing.providers",  # simulated providers for the kit's tests
}
PRODUCTION_ROOMS = ("core", "runtime", "stores", "scheduler", "fleet", "overload", "http", "testing")


def _blocker(blocked: tuple[str, ...]) -> str:
    """Source of an import hook refusing ``blocked`` (top-level names), as if not installed."""
    return textwrap.dedent(
        f"""
        import sys

        class _NotInstalled:
            BLOCKED = frozenset({sorted(blocked)!r})

            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] in self.BLOCKED:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, _NotInstalled())
        """
    )


def _run_without(
    blocked: tuple[str, ...], program: str, cwd: Path = ROOT, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    source = _blocker(blocked) + textwrap.dedent(program)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(
        [sys.executable, "-c", source], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


# ------------------------------------------------------------------------------ pyproject.toml
def test_the_core_dependencies_hold_no_lab_or_notebook_package() -> None:
    core = {_requirement_name(r) for r in _pyproject()["dependencies"]}
    assert not core & {name.lower() for name in (*HEAVY, "ipykernel", "nbformat")}, core


def test_the_lab_extra_installs_what_the_extras_table_names() -> None:
    """``aiqsim.core.extras.EXTRAS`` (what refusals check) and pyproject's extras agree."""
    extras = _pyproject()["optional-dependencies"]
    lab = {_requirement_name(r) for r in extras["lab"]}
    assert lab == set(EXTRAS["lab"]) == set(LAB_PACKAGES)
    for extra in ("http", "dask", "optuna", "parquet", "postgres", "redis"):
        assert extra in extras, extra
    assert "jupyterlab" in {_requirement_name(r) for r in extras["notebooks"]}


def test_the_notebooks_extra_brings_what_every_notebook_imports() -> None:
    """`pip install -e ".[notebooks]"` then `jupyter lab notebooks/`: each notebook's imports of an
    extra's package or room (aiqsim.http.live runs httpx, aiqsim.lab.tune Optuna) are installed."""
    import json

    extras = _pyproject()["optional-dependencies"]["notebooks"]
    (self_reference,) = [r for r in extras if _requirement_name(r) == "aiqsim"]
    brought = set(self_reference.partition("[")[2].rstrip("]").split(","))
    needs = {
        "aiqsim.http.live": "http",
        "HttpProvider": "http",
        "aiqsim.lab.tune": "optuna",
        "optuna": "optuna",
        "dask": "dask",
        "parquet": "parquet",
    }
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        book = json.loads(path.read_text(encoding="utf-8"))
        code = "\n".join("".join(c["source"]) for c in book["cells"] if c["cell_type"] == "code")
        wanted = {"lab"} | {extra for marker, extra in needs.items() if marker in code}
        assert wanted <= brought, f"{path.name} needs {sorted(wanted - brought)}"


def test_the_test_extra_brings_every_extra_the_suite_imports() -> None:
    """`pip install -e ".[test]"` (the README's test command) installs the lab and the other extras."""
    test = _pyproject()["optional-dependencies"]["test"]
    (self_reference,) = [r for r in test if _requirement_name(r) == "aiqsim"]
    named = set(self_reference.partition("[")[2].rstrip("]").split(","))
    assert {"lab", "http", "openai", "dask", "postgres", "redis", "parquet", "optuna"} <= named
    assert "cython" not in {_requirement_name(r) for extra in _pyproject()["optional-dependencies"].values()
                            for r in extra}  # fmt: skip


# ------------------------------------------------------------------------------ the production worker
WORKER = """
import asyncio, random, sys
from pathlib import Path

import aiqsim
from aiqsim import (
    AsyncioRuntime, FullJitter, JobSpec, QuotaLimits, RateLimitError, RetryPolicy, Scheduler,
    SqliteStore, Stage, TaskStatus,
)
import aiqsim.errors, aiqsim.fleet, aiqsim.http, aiqsim.overload, aiqsim.stores
from aiqsim.http import CallableProvider, HttpProvider

calls = []

async def summarise(request):
    calls.append(request.idempotency_key)
    if len(calls) == 1:
        raise RateLimitError("slow down", retry_after_s=0.01)  # retried by the RetryPolicy
    return f"summary of {request.payload['text']}"

async def outline(request):
    return {"points": [request.payload["topic"], "details"]}

async def main(path):
    store = SqliteStore(path)
    providers = [CallableProvider("llm", summarise), CallableProvider("planner", outline)]
    async with Scheduler(
        AsyncioRuntime(), providers,
        quotas={"llm": QuotaLimits(requests_per_min=6000, concurrency=2)},
        retry=RetryPolicy(backoff=FullJitter(base_s=0.01, cap_s=0.05), max_attempts=3),
        store=store, rng=random.Random(7), worker_id="light-worker",
    ) as scheduler:
        answers = [await scheduler.submit("llm", {"text": t}, key=f"k-{t}") for t in ("a", "b", "c")]
        spec = JobSpec("brief", "1", [
            Stage("plan", "planner", build=lambda inputs, results: {"topic": inputs["topic"]}),
            Stage("write", "llm", after=("plan",),
                  build=lambda inputs, results: {"text": ",".join(results["plan"]["points"])}),
        ])
        job = await scheduler.submit_job(spec, {"topic": "quotas"})
    store.close()
    reopened = SqliteStore(path)
    statuses = [reopened.owner_of(f"k-{t}").status for t in ("a", "b", "c")]
    reopened.close()
    return answers, job, statuses

answers, job, statuses = asyncio.run(main(Path(sys.argv[1]) / "tasks.sqlite3"))
assert answers == ["summary of a", "summary of b", "summary of c"], answers
assert len(calls) == 5, calls  # one 429 retried, then a, b, c, and the job's write stage
assert job["write"] == "summary of quotas,details", job
assert statuses == [TaskStatus.SUCCEEDED] * 3, statuses
HttpProvider("llm", "http://127.0.0.1:9/v1")  # constructible without the lab (httpx: the http extra)
loaded = sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED_NAMES)
assert not loaded, loaded
print("worker ok")
"""


def test_a_production_worker_runs_without_any_lab_or_notebook_package(tmp_path: Path) -> None:
    program = f"BLOCKED_NAMES = {HEAVY!r}\nimport sys; sys.argv[1:] = [{str(tmp_path)!r}]\n" + WORKER
    done = _run_without(HEAVY, program)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "worker ok" in done.stdout


def test_every_production_module_imports_without_the_lab() -> None:
    """Each module of the production rooms (but the lab's own, listed above) imports without the
    lab's packages; one interpreter per room, so a module cannot hide behind another's import."""
    import importlib
    import pkgutil

    modules = []
    for room in PRODUCTION_ROOMS:
        package = importlib.import_module(f"aiqsim.{room}")
        modules += [m.name for m in pkgutil.walk_packages(package.__path__, f"aiqsim.{room}.")]
    wanted = [m for m in modules if m not in LAB_ONLY_MODULES]
    assert len(wanted) > 60 and set(LAB_ONLY_MODULES) <= set(modules)
    program = f"""
    import importlib, sys, traceback
    failed = []
    for name in {wanted!r}:
        try:
            importlib.import_module(name)
        except ImportError:
            failed.append(name + ": " + traceback.format_exc().strip().splitlines()[-1])
    print("\\n".join(failed))
    import aiqsim, aiqsim.errors, aiqsim.cli
    """
    done = _run_without(HEAVY, program)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "", f"modules that need a lab package:\n{done.stdout}"


def test_lab_names_of_the_production_packages_say_which_extra_to_install() -> None:
    done = _run_without(
        LAB_PACKAGES,
        """
        import importlib

        import aiqsim
        for get in (
            lambda: aiqsim.SimPyRuntime,
            lambda: importlib.import_module("aiqsim.errors").ScenarioError,
            lambda: importlib.import_module("aiqsim.sim"),
            lambda: importlib.import_module("aiqsim.sim.simulate"),
            lambda: importlib.import_module("aiqsim.validation"),
            lambda: importlib.import_module("aiqsim.testing").CrashDriver,
        ):
            try:
                get()
            except ImportError as error:
                print(type(error).__name__, error)
        """,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 6 and all(line.startswith("ExtraMissingError") for line in lines), lines
    assert all('pip install "aiqsim[lab]"' in line for line in lines)


# ------------------------------------------------------------------------------ aiqsim.core.extras
def test_require_extra_names_the_missing_packages_and_the_install_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert missing_packages("lab") == ()
    require_extra("lab", "the lab")  # installed here: no error
    real = __import__("importlib.util").util.find_spec
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None if name == "simpy" else real(name))
    with pytest.raises(ExtraMissingError) as caught:
        require_extra("lab", "aiqsim run")
    assert str(caught.value) == (
        "aiqsim run needs the 'lab' extra (simpy not installed): " + install_line("lab")
    )
    assert install_line("lab") == 'pip install "aiqsim[lab]"'
    monkeypatch.setattr(
        "importlib.util.find_spec", lambda name: None if name in ("simpy", "httpx") else real(name)
    )
    with pytest.raises(ExtraMissingError) as caught:
        require_extras(["lab", "http", "parquet"], "aiqsim compare")
    assert str(caught.value) == (
        "aiqsim compare needs the 'lab' and 'http' extras (simpy, httpx not installed): "
        'pip install "aiqsim[lab,http]"'
    )
    with pytest.raises(ValueError, match="unknown extra 'labs'"):
        missing_packages("labs")


# ------------------------------------------------------------------------------ the command line
def _cli_without(blocked: tuple[str, ...], *argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return _run_without(
        blocked, f"import sys\nfrom aiqsim.cli import main\nsys.exit(main({list(argv)!r}))", cwd
    )


def _assert_refused(done: subprocess.CompletedProcess[str], extra: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr
    assert f'pip install "aiqsim[{extra}]"' in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize(
    ("argv", "blocked", "extra"),
    [
        (["run", "scenarios/retry_storm_429.toml", "--out", "{tmp}/out"], LAB_PACKAGES, "lab"),
        (["validate", "scenarios/retry_storm_429.toml"], ("simpy",), "lab"),
        (["sweep", "scenarios/retry_storm_429.toml", "--out", "{tmp}/out/s.csv"], ("matplotlib",), "lab"),
        (["sweep", "scenarios/retry_storm_429.toml", "--engine", "dask", "--out", "{tmp}/out/s.csv"],
         ("dask", "distributed"), "dask"),
        (["compare", "scenarios/retry_storm_429.toml"], ("httpx",), "http"),
        (["compare", "scenarios/retry_storm_429.toml"], ("httpx", "simpy"), "lab,http"),
        (["tune", "scenarios/retry_storm_429.toml", "--param", "retry.base_s=0.1:2",
          "--out", "{tmp}/out/t.csv"], ("optuna",), "optuna"),
        (["serve", "scenarios/retry_storm_429.toml"], LAB_PACKAGES, "lab"),
        (["calibrate", "{tmp}", "--out", "{tmp}/out/c.toml"], ("pandas",), "lab"),
    ],
    ids=["run", "validate", "sweep", "sweep-dask", "compare", "compare-bare", "tune", "serve", "calibrate"],
)  # fmt: skip
def test_a_command_without_its_extra_refuses_up_front(
    argv: list[str], blocked: tuple[str, ...], extra: str, tmp_path: Path
) -> None:
    done = _cli_without(blocked, *(a.replace("{tmp}", str(tmp_path)) for a in argv))
    _assert_refused(done, extra)
    assert not (tmp_path / "out").exists()  # refused before any output folder was made


MAIN_JOB = 'pip install -e ".[lab]" && aiqsim run scenarios/retry_storm_429.toml --out out/retry_storm'
"""The main job's one command (README, docs/index.md): the lab extra is all `aiqsim run` needs."""


def test_the_main_job_command_installs_what_its_run_needs() -> None:
    from aiqsim.cli import build_parser, required_extras

    install, run = MAIN_JOB.split(" && ")
    extras = install.removeprefix('pip install -e ".[').removesuffix(']"').split(",")
    assert required_extras(build_parser().parse_args(run.split()[1:])) == ("aiqsim run", extras)
    assert (ROOT / run.split()[2]).is_file()
    assert MAIN_JOB in (ROOT / "docs" / "index.md").read_text(encoding="utf-8")


def test_help_and_version_need_no_lab() -> None:
    for argv in (["--version"], ["--help"]):
        done = _cli_without(LAB_PACKAGES, *argv)
        assert done.returncode == 0 and done.stdout.startswith(("aiqsim ", "usage: aiqsim")), done.stderr


@pytest.mark.parametrize("report", ["r.pdf", "r.png", "r"])
def test_calibrate_refuses_a_report_format_it_cannot_write_before_any_fitting(
    report: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from aiqsim.cli import main

    # no call logs exist: had the report been checked after fitting, the error would be about them
    status = main(["calibrate", str(tmp_path / "logs"), "--out", str(tmp_path / "c.toml"),
                   "--report", str(tmp_path / report)])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2, err
    assert f"cannot write a report as {Path(report).suffix or 'a file without a suffix'}" in err
    assert ".html (HTML)" in err and ".ipynb (a Jupyter notebook)" in err
    assert list(tmp_path.iterdir()) == []


def test_calibrate_refuses_a_notebook_report_without_nbformat(tmp_path: Path) -> None:
    done = _cli_without(
        ("nbformat",), "calibrate", str(tmp_path / "logs"), "--out", str(tmp_path / "c.toml"),
        "--report", str(tmp_path / "r.ipynb"),
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert 'needs nbformat: pip install "aiqsim[notebooks]"' in done.stderr
    assert list(tmp_path.iterdir()) == []
