"""The ``aiqsim`` command line: run and validate scenarios, sweep parameters.

Bad input (a malformed scenario, an unknown override, a bad grid) prints one clear message
and exits with status 2, without a traceback. Output that cannot be written is not a traceback
either: a closed pipe (``aiqsim run x.toml | head -1``) ends the command quietly with status 141,
as a program killed by SIGPIPE would; any other error writing standard output (``> /dev/full``) is
one line on stderr and status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from aiqsim import __version__
from aiqsim.core.errors import AiqsimError, ConfigurationError

EXIT_BAD_INPUT = 2
EXIT_STDOUT_FAILED = 1
EXIT_FAILED = 1
"""A command that could not finish for a reason its project error states (a store that cannot be
written, a run that failed): no traceback, the message says what happened and what was kept."""
EXIT_BROKEN_PIPE = 128 + 13  # 128 + SIGPIPE: what a shell reports for a program a closed pipe ended


class UsageError(ConfigurationError):
    """A mistake in what the user asked for; printed without a traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiqsim",
        description="Schedule AI API calls safely; simulate scenarios on a virtual clock.",
    )
    parser.add_argument("--version", action="version", version=f"aiqsim {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = commands.add_parser("run", help="simulate a scenario, print its summary, write tables and charts")
    run.add_argument("scenario", help="scenario TOML file (see scenarios/)")
    run.add_argument("--seed", type=int, default=None, help="random seed (default: the scenario's)")
    run.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a scenario key, e.g. --set retry.base_s=0.5 (repeatable)",
    )  # fmt: skip
    run.add_argument("--out", type=Path, default=None, help="directory for CSV/Parquet tables and PNG charts")
    run.add_argument("--format", choices=("csv", "parquet"), default="csv", help="table format (default csv)")
    run.add_argument("--no-charts", action="store_true", help="skip the PNG charts")
    run.add_argument(
        "--stream", action="store_true",
        help="streaming mode for long runs: summary and timeline computed on the fly, no per-task records "
        "(memory flat in the number of tasks); shows a progress bar and the run's wall/CPU time and peak RSS",
    )  # fmt: skip
    run.add_argument(
        "--key-window", type=float, default=None, metavar="SECONDS",
        help="with --stream: how long finished tasks and idempotency keys are remembered (default 3600)",
    )  # fmt: skip

    validate = commands.add_parser("validate", help="check a scenario file and report the first problem")
    validate.add_argument("scenario", nargs="+", help="scenario TOML file(s)")

    sweep = commands.add_parser("sweep", help="run a scenario over a parameter grid and seeds")
    sweep.add_argument("scenario", help="scenario TOML file")
    sweep.add_argument(
        "--grid", action="append", default=[], metavar="KEY=V1,V2,...",
        help="a swept key and its values, e.g. --grid retry.base_s=0.1,0.5,2 (repeatable)",
    )  # fmt: skip
    sweep.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per grid point (default 3)")
    sweep.add_argument("--out", type=Path, required=True, help="output file (.csv or .parquet)")
    sweep.add_argument("--engine", choices=("local", "dask", "serial"), default="local")
    sweep.add_argument("--address", default=None, help="dask scheduler address (default: a new LocalCluster)")
    sweep.add_argument("--workers", type=int, default=None, help="worker processes (default: all cores)")
    compare = commands.add_parser(
        "compare", help="run a scenario simulated and live over HTTP on 127.0.0.1; print both summaries"
    )
    compare.add_argument("scenario", help="scenario TOML file")
    compare.add_argument("--seed", type=int, default=None, help="random seed (default: the scenario's)")
    compare.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a scenario key (repeatable)",
    )  # fmt: skip
    compare.add_argument(
        "--time-scale",
        type=float,
        default=0.2,
        help="wall seconds per scenario second for the live run (default 0.2; smaller is faster but adds "
        "relatively more transport latency)",
    )
    compare.add_argument(
        "--header-corrections",
        action="store_true",
        help="let live clients correct buckets from x-ratelimit-*",
    )
    _add_serve_parser(commands)
    from aiqsim.lab.lab_commands import add_lab_parsers

    add_lab_parsers(commands)  # calibrate, tune

    _add_schema_parser(commands)
    return parser


# ---------------------------------------------------------------------- formatting
def _format_value(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if value.is_integer() and abs(value) < 1e12:
            return f"{int(value):,}"
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_summary(summary: dict[str, Any], title: str = "") -> str:
    """The summary as an aligned two-column table with each key's meaning."""
    from aiqsim.sim.fleet_metrics import fleet_key_meaning
    from aiqsim.sim.job_metrics import JOB_SUMMARY_KEYS
    from aiqsim.sim.metrics import SUMMARY_KEYS
    from aiqsim.sim.route_metrics import deployment_key_meaning
    from aiqsim.sim.tenant_metrics import tenant_key_meaning

    width = max(len(k) for k in summary)
    lines = [title, "=" * max(len(title), 20)] if title else []
    for key in [*SUMMARY_KEYS, *(k for k in summary if k not in SUMMARY_KEYS)]:
        if key in summary:
            meaning = (
                SUMMARY_KEYS.get(key)
                or JOB_SUMMARY_KEYS.get(key)
                or fleet_key_meaning(key)
                or deployment_key_meaning(key)
                or tenant_key_meaning(key)
            )
            lines.append(f"{key:<{width}}  {_format_value(summary[key]):>12}  {meaning}")
    return "\n".join(lines)


# ---------------------------------------------------------------------- commands
def _overrides(pairs: Sequence[str]) -> dict[str, Any]:
    from aiqsim.sim.scenario import parse_override

    result = {}
    for text in pairs:
        if "=" not in text:
            raise UsageError(f"--set {text!r}: expected KEY=VALUE, e.g. retry.base_s=0.5")
        key, value = parse_override(text)
        result[key] = value
    return result


@contextlib.contextmanager
def _output_folder(out: Path | None, *, flag: str = "--out") -> Iterator[None]:
    """Create the output folder ``out`` (and its missing parents) before any work, so a bad path fails
    in a second, not after the run; if the command then fails, remove the folders it created that are
    still empty, so a failed command leaves no trace (an empty ``OUT/`` used to stay behind)."""
    if out is None:
        yield
        return
    created = [folder for folder in (out, *out.parents) if not os.path.lexists(folder)]  # deepest first
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"{flag} {out}: exists and is not a directory") from None
    except OSError as error:
        _remove_empty(created)
        raise UsageError(f"{flag} {out}: cannot create the directory ({error.strerror or error})") from None
    try:  # a folder that cannot take a file (read-only file system, no permission) fails now, too
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as error:
        _remove_empty(created)
        raise UsageError(
            f"{flag} {out}: cannot write in the directory ({error.strerror or error}); nothing was run"
        ) from None
    try:
        yield
    except BaseException:
        _remove_empty(created)
        raise


def _remove_empty(folders: Sequence[Path]) -> None:
    """Remove each of ``folders`` (deepest first) that exists and is empty; stop at the first that is not."""
    for folder in folders:
        try:
            folder.rmdir()
        except FileNotFoundError:
            continue
        except OSError:  # not empty (or not ours to remove): neither are its parents
            return


def _check_seed(seed: int | None) -> None:
    if seed is not None and seed < 0:
        raise UsageError(f"--seed {seed}: expected an integer >= 0")


def _check_key_window(args: argparse.Namespace) -> None:
    """``--key-window`` before any work: only with ``--stream`` (a full run remembers every task, so the
    flag would be silently ignored), and a finite number of seconds > 0 (the rule of ``simulate``)."""
    from aiqsim.sim.streaming import check_window

    if args.key_window is None:
        return
    if not getattr(args, "stream", False):
        raise UsageError(
            "--key-window only applies with --stream (a full run remembers every task and key); add --stream"
        )
    check_window(args.key_window, label="--key-window")


def cmd_run(args: argparse.Namespace) -> int:
    from aiqsim.lab.output_files import check_targets, require_table_format
    from aiqsim.sim.preflight import check_runnable
    from aiqsim.sim.scenario import load_scenario

    _check_seed(args.seed)
    _check_key_window(args)
    require_table_format(args.format)
    scenario = load_scenario(args.scenario, overrides=_overrides(args.overrides))
    check_runnable(scenario)
    if getattr(args, "stream", False) and args.out is not None:
        raise UsageError("--out with --stream: a streaming run keeps no per-task tables to write")
    with _output_folder(args.out):
        if args.out is not None:
            names = output_names(args.format, charts=not args.no_charts, jobs=submits_jobs(scenario))
            check_targets(args.out, names)
        return _simulate_and_report(scenario, args)


def _simulate_and_report(scenario: Any, args: argparse.Namespace) -> int:
    """``aiqsim run`` once its input is checked and ``--out`` exists: simulate, print, write the files."""
    from aiqsim.lab.output_files import staged_directory
    from aiqsim.sim.simulate import simulate

    horizon = scenario.duration_s
    print(
        f"simulating {scenario.name!r}: {horizon:,.0f} s of arrivals on the virtual clock...", file=sys.stderr
    )
    started = time.perf_counter()
    if getattr(args, "stream", False):
        result = _run_streaming(scenario, args)
    else:
        result = simulate(scenario, seed=args.seed)
    wall = time.perf_counter() - started
    print(format_summary(result.summary, f"{scenario.name} (seed {result.seed})"))
    if "jobs_submitted" in result.summary:
        print(format_stage_breakdown(result))
    if scenario.description:
        print(f"\n{scenario.description.strip()}")
    print(f"\nsimulated {result.sim_time_s:,.1f} s in {wall:.2f} s of wall time")
    _warn_about(result)
    if args.out is not None:
        try:  # all files are written to a staging folder, then moved into place together
            with staged_directory(args.out) as staging:
                staged = write_outputs(result, staging, table_format=args.format, charts=not args.no_charts)
        except OSError as error:
            reason = error.strerror or error
            message = f"--out {args.out}: cannot write ({reason}); nothing in it was replaced"
            raise UsageError(message) from None
        written = [args.out / path.name for path in staged]
        print(f"wrote {len(written)} files to {args.out}/: {', '.join(p.name for p in written)}")
    return 0


def _run_streaming(scenario: Any, args: argparse.Namespace) -> Any:
    """``aiqsim run --stream``: simulate with ``records="summary"`` under a progress bar, then say on
    stderr what the run cost (wall time, CPU time, peak RSS)."""
    from aiqsim.lab.run_progress import ProgressBar, ResourceClock
    from aiqsim.sim.simulate import simulate
    from aiqsim.sim.streaming import DEFAULT_KEY_WINDOW_S

    window = DEFAULT_KEY_WINDOW_S if args.key_window is None else args.key_window
    clock = ResourceClock()
    bar = ProgressBar()
    try:
        result = simulate(scenario, seed=args.seed, records="summary", key_window_s=window, progress=bar)
    finally:
        bar.close()
    print(f"streaming run: {clock.read().describe()}", file=sys.stderr)
    return result


def format_stage_breakdown(result: Any) -> str:
    """Where succeeded jobs' time went, per stage (critical-path seconds, share, mean of each part)."""
    lines = ["\nper job stage, over succeeded jobs (critical path; mean seconds when on it):"]
    lines.append(f"{'stage':<24} {'share':>6} {'queue':>8} {'quota':>8} {'retries':>8} {'service':>8}")
    streamed = getattr(getattr(result, "streaming", None), "jobs", None)  # --stream: no rows, same totals
    if streamed is not None:
        rows = streamed.totals.stage_breakdown()
    else:
        rows = result.stage_breakdown().to_dict("records")
    for row in rows:
        cells = [row[f"{part}_mean_s"] for part in ("queue_wait", "quota_wait", "retries", "service")]
        lines.append(
            f"{row['job'] + '.' + row['stage']:<24} {_format_value(float(row['share'])):>6} "
            + " ".join(f"{_format_value(float(cell)):>8}" for cell in cells)
        )
    return "\n".join(lines)


def _warn_about(result: Any) -> None:
    """Say on stderr what a user could miss in the table."""
    s = result.summary
    if s["tasks_submitted"] + s["tasks_rejected"] == 0:
        print(
            "warning: the workloads produced no arrivals (check rates, counts and duration_s)",
            file=sys.stderr,
        )
    if s["tasks_lost"]:
        print(
            f"warning: {s['tasks_lost']} task(s) were still running when the run ended; latency percentiles "
            "leave them out (raise scenario.drain_s)",
            file=sys.stderr,
        )
    if s.get("jobs_lost"):
        print(
            f"warning: {s['jobs_lost']} job(s) were not terminal when the run ended; job latency percentiles "
            "leave them out (raise scenario.drain_s)",
            file=sys.stderr,
        )
    if result.task_errors:
        print(
            f"warning: {len(result.task_errors)} internal task error(s): {result.task_errors[:3]}",
            file=sys.stderr,
        )


CHART_NAMES = ("retry_storm_timeline.png", "latency_cdf.png", "cost_duplication.png")


def _table_names(*, jobs: bool) -> tuple[str, ...]:
    """The tables a run writes: a ``jobs`` table too when its scenario submits jobs."""
    return ("tasks", "calls", "timeline", *(("jobs",) if jobs else ()))


def submits_jobs(scenario: Any) -> bool:
    """Whether a run of ``scenario`` has jobs (its summary has the job keys and it writes jobs.csv)."""
    return any(workload.job is not None for workload in scenario.workloads)


def output_names(table_format: str, *, charts: bool = True, jobs: bool = False) -> list[str]:
    """The file names :func:`write_outputs` writes (so ``--out`` can be checked before the run);
    ``jobs``: the scenario submits jobs (:func:`submits_jobs`), so ``jobs.{format}`` is written too."""
    tables = [f"{name}.{table_format}" for name in _table_names(jobs=jobs)]
    return [*tables, "summary.json", *(CHART_NAMES if charts else ())]


def write_outputs(result: Any, out: Path, *, table_format: str = "csv", charts: bool = True) -> list[Path]:
    """Write the run's tables, summary and charts into ``out``; returns the paths written.

    summary.json is strict JSON: a summary value that is not a finite number (NaN for a percentile of
    no tasks, or an infinite cost) is written as ``null``, which every JSON reader accepts."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in _table_names(jobs=submits_jobs(result.scenario)):
        frame = getattr(result, name)
        path = out / f"{name}.{table_format}"
        if table_format == "parquet":
            frame.to_parquet(path, index=False)
        else:
            frame.to_csv(path, index=False)
        written.append(path)
    summary_path = out / "summary.json"
    summary = {
        key: None if isinstance(value, float) and not math.isfinite(value) else value
        for key, value in result.summary.items()
    }
    document = {"scenario": result.scenario.name, "seed": result.seed, **summary}
    summary_path.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    written.append(summary_path)
    if charts:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from aiqsim.lab import charts as ch

        figures = {
            "retry_storm_timeline.png": ch.retry_storm_timeline(
                result.timeline,
                title=f"{result.scenario.name}",
                marks=ch.crash_marks(result),
                **ch.run_references(result),
            ),
            # every submitted task, refused ones included: the chart plots shares of all of them
            "latency_cdf.png": ch.latency_cdf(result.tasks, by="priority"),
            "cost_duplication.png": ch.cost_breakdown(result.calls),
        }
        for name, figure in figures.items():
            figure.savefig(out / name, dpi=110)
            plt.close(figure)
            written.append(out / name)
    return written


def cmd_validate(args: argparse.Namespace) -> int:
    from aiqsim.sim.preflight import check_runnable
    from aiqsim.sim.scenario import ScenarioError, load_scenario

    failures = 0
    for path in args.scenario:
        try:
            scenario = load_scenario(path)
            check_runnable(scenario)  # what `run` would find before simulating (e.g. store.path)
        except ScenarioError as error:
            print(f"aiqsim validate: error: {error}", file=sys.stderr)
            failures += 1
            continue
        print(
            f"{path}: ok — {scenario.name!r}: {len(scenario.providers)} provider(s), "
            f"{len(scenario.workloads)} workload(s), {len(scenario.crashes)} crash(es)"
        )
    return EXIT_BAD_INPUT if failures else 0


def _grid(pairs: Sequence[str]) -> dict[str, list[Any]]:
    from aiqsim.sim.scenario import parse_override

    grid: dict[str, list[Any]] = {}
    for text in pairs:
        key, sep, values = text.partition("=")
        if not sep or not key or not values:
            raise UsageError(f"--grid {text!r}: expected KEY=V1,V2,..., e.g. retry.base_s=0.1,0.5,2")
        key = key.strip()
        if key in grid:
            raise UsageError(
                f"--grid {key} is given twice; list all its values in one --grid {key}=v1,v2,..."
            )
        grid[key] = [parse_override(f"{key}={v.strip()}")[1] for v in values.split(",")]
    return grid


def cmd_sweep(args: argparse.Namespace) -> int:
    from aiqsim.lab.output_files import require_table_format
    from aiqsim.sim.scenario import load_scenario
    from aiqsim.sim.sweep import (
        SweepError,
        SweepInterrupted,
        check_dask_address,
        check_sweep_size,
        grid_points,
        grid_size,
        sweep,
    )

    if args.seeds < 1:
        raise UsageError("--seeds must be >= 1")
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers {args.workers}: expected an integer >= 1")
    if args.address is not None and args.engine != "dask":
        raise UsageError("--address only applies with --engine dask")
    if args.address is not None:
        check_dask_address(args.address, label="--address")
    if args.out.is_dir():
        raise UsageError(f"--out {args.out}: is a directory; give a file name")
    if args.out.suffix not in (".csv", ".parquet"):
        raise UsageError(f"--out {args.out}: expected a .csv or .parquet file name")
    require_table_format(args.out.suffix[1:])
    with _output_folder(args.out.parent):  # removed again if the sweep fails and leaves it empty
        scenario = load_scenario(args.scenario)
        grid = _grid(args.grid)
        check_sweep_size(grid_size(grid) if grid else 1, args.seeds)  # before building any list of runs
        for point in grid_points(grid) if grid else []:  # every combination, before spending time
            load_scenario(args.scenario, overrides=point)
        try:
            frame = sweep(
                scenario,
                grid,
                seeds=range(args.seeds),
                engine=args.engine,
                workers=args.workers,
                address=args.address,
            )
        except SweepError as error:
            if error.results.empty:  # no run worked: nothing to keep (an empty file said nothing)
                raise UsageError(f"{error}\nno run worked; nothing was written") from None
            partial = _partial_path(args.out)
            _write_frame(error.results, partial)
            message = f"{error}\nthe {len(error.results)} run(s) that worked are in {partial}"
            raise UsageError(message) from None
        except SweepInterrupted as interrupt:  # main() says it in one line and exits 130
            raise KeyboardInterrupt(_keep_interrupted(interrupt, args.out)) from None
        except OSError as error:  # e.g. a Dask scheduler address nobody answers at
            raise UsageError(f"the {args.engine} engine failed: {error}") from None
        _write_frame(frame, args.out)
    print(f"wrote {len(frame)} rows ({len(frame.columns)} columns) to {args.out}")
    return 0


def _partial_path(out: Path) -> Path:
    """Where a sweep that did not finish keeps the rows of the runs that worked: ``OUT.partial.csv``."""
    return out.with_name(out.stem + ".partial" + out.suffix)


def _keep_interrupted(interrupt: Any, out: Path) -> str:
    """Write the rows of a :class:`~aiqsim.sim.sweep.SweepInterrupted` sweep's finished runs to the
    partial file (none: nothing is written); what happened, in one line."""
    done = f"{interrupt.finished} of {interrupt.total} run(s) finished"
    if interrupt.results.empty:
        return f"{done}; none worked, nothing was written"
    partial = _partial_path(out)
    _write_frame(interrupt.results, partial)
    return f"{done}; the {len(interrupt.results)} that worked are in {partial}"


def _write_frame(frame: Any, path: Path) -> None:
    """Write ``frame`` to a temp file next to ``path``, then rename it (an earlier file stays whole)."""
    from aiqsim.lab.output_files import replaced_atomically

    try:
        with replaced_atomically(path) as temp:
            if path.suffix == ".parquet":
                frame.to_parquet(temp, index=False)
            else:
                frame.to_csv(temp, index=False)
    except OSError as error:
        raise UsageError(f"--out {path}: cannot write ({error.strerror or error})") from None


def cmd_compare(args: argparse.Namespace) -> int:
    from aiqsim.http.live import check_live_time_scale, compare_sim_and_live
    from aiqsim.sim.scenario import load_scenario

    _check_seed(args.seed)
    check_live_time_scale(args.time_scale, "--time-scale")
    scenario = load_scenario(args.scenario, overrides=_overrides(args.overrides))
    estimate = (scenario.duration_s + 30) * args.time_scale
    print(
        f"live run: about {estimate:.0f} s of wall time or more (time scale {args.time_scale})",
        file=sys.stderr,
    )
    frame = compare_sim_and_live(
        scenario, seed=args.seed, time_scale=args.time_scale, header_corrections=args.header_corrections
    )
    width = max(len(k) for k in frame.index)
    print(f"{'':<{width}}  {'simulated':>12}  {'live':>12}  {'difference':>10}")
    for key, row in frame.iterrows():
        diff = row["relative_difference"]
        diff_text = "-" if diff != diff else f"{diff:+.1%}"
        simulated, live = _format_value(row["simulated"]), _format_value(row["live"])
        print(f"{key:<{width}}  {simulated:>12}  {live:>12}  {diff_text:>10}")
    agreement = frame.attrs.get("latency_agreement")
    if agreement is not None:
        print(f"\n{agreement.describe()}")
    return 0


COMMANDS = {"run": cmd_run, "validate": cmd_validate, "sweep": cmd_sweep, "compare": cmd_compare}


def _add_serve_parser(commands: Any) -> None:
    serve = commands.add_parser(
        "serve",
        help="serve one of a scenario's simulated providers as an OpenAI-compatible HTTP server",
        description="Serve one simulated provider of SCENARIO over HTTP (OpenAI chat completions, /ledger, "
        "/lookup/{key}) until Ctrl-C or SIGTERM. Prints the base URL and what the provider will do.",
    )
    serve.add_argument("scenario", help="scenario TOML file (see scenarios/)")
    serve.add_argument("--provider", default=None, help="which provider (default: the scenario's only one)")
    serve.add_argument("--port", type=int, default=0, help="port to listen on (default 0: any free port)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument(
        "--time-scale", type=float, default=1.0,
        help="wall seconds per scenario second (default 1; 0.1 runs the provider's clock 10x faster)",
    )  # fmt: skip
    serve.add_argument("--seed", type=int, default=None, help="random seed (default: the scenario's)")
    serve.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a scenario key, e.g. --set providers.llm.supports_lookup=false (repeatable)",
    )  # fmt: skip


def cmd_serve(args: argparse.Namespace) -> int:
    """``aiqsim serve``: bad input (provider, port, time scale, seed) is refused before anything listens."""
    from aiqsim.http.serve import check_serve_settings, serve
    from aiqsim.sim.scenario import load_scenario

    scenario = load_scenario(args.scenario, overrides=_overrides(args.overrides))
    try:
        settings = check_serve_settings(
            scenario,
            provider=args.provider,
            seed=args.seed,
            time_scale=args.time_scale,
            port=args.port,
            host=args.host,
        )
        return serve(scenario, settings, out=sys.stdout, err=sys.stderr)
    except ConfigurationError as error:  # a bad setting, or an address that cannot be listened on
        raise UsageError(str(error)) from None


COMMANDS["serve"] = cmd_serve


def _lab_command(name: str) -> Any:
    def command(args: argparse.Namespace) -> int:
        from aiqsim.lab.lab_commands import LAB_COMMANDS

        return LAB_COMMANDS[name](args)

    return command


COMMANDS.update({name: _lab_command(name) for name in ("calibrate", "tune")})


def _add_schema_parser(commands: Any) -> None:
    commands.add_parser(
        "schema",
        help="print the JSON Schema of scenario files (for editors: aiqsim schema > scenario.schema.json)",
        description="Print the JSON Schema of scenario files, generated from the loader's own rules. Name it "
        "in a scenario's first line (#:schema ./scenario.schema.json) and taplo / Even Better TOML, "
        "VS Code or PyCharm complete keys and flag mistakes while you type.",
    )


def cmd_schema(args: argparse.Namespace) -> int:
    """``aiqsim schema``: the schema on stdout (what ``scenarios/scenario.schema.json`` holds)."""
    from aiqsim.sim.scenario_schema import scenario_schema_text

    sys.stdout.write(scenario_schema_text())
    return 0


COMMANDS["schema"] = cmd_schema


class _StdoutError(Exception):
    """An ``OSError`` writing standard output, told apart from the commands' other I/O errors."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class _GuardedStdout:
    """``sys.stdout`` for the length of a command: its write errors become :class:`_StdoutError`."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            buffer = getattr(self._stream, "buffer", None)
            if buffer is None or os.linesep != "\n":
                return self._stream.write(text)
            # Through the byte buffer, counting: for a write larger than its buffer, BufferedWriter
            # returns a short count when the file takes only part (a file size limit, a full disk),
            # and TextIOWrapper ignores it, so `aiqsim schema > file` ended with exit 0 and a
            # truncated file. Writing the rest raises the error the short count hid.
            self._stream.flush()
            data = memoryview(text.encode(self._stream.encoding, self._stream.errors or "strict"))
            while data:
                written = buffer.write(data)
                if not written:
                    raise OSError(errno.EIO, "standard output took none of the data")
                data = data[written:]
            if self._stream.line_buffering and "\n" in text:
                buffer.flush()
            return len(text)
        except OSError as error:
            raise _StdoutError(error) from error

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as error:
            raise _StdoutError(error) from error

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _discard_stdout(stream: Any) -> None:
    """Point ``stream``'s file descriptor at the null device, so the output still buffered in it does
    not fail again (with an 'Exception ignored' message) when the interpreter flushes it at exit.
    This is what the Python docs advise for SIGPIPE (library/signal.html, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        os.dup2(devnull, stream.fileno())
    except (OSError, ValueError):  # not a real file (e.g. captured by a test): nothing to redirect
        pass
    finally:
        os.close(devnull)


_BAD_PATH_ERRNOS = frozenset(
    {errno.ENAMETOOLONG, errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EROFS, errno.ELOOP}
)
"""OS errors that say a path given on the command line cannot be used: bad input, exit status 2."""


def required_extras(args: argparse.Namespace) -> tuple[str, list[str]]:
    """What ``args`` asks for (``aiqsim sweep --engine dask``) and the extras it needs: every command
    runs the lab (scenarios, SimPy, pandas), and some need one more (``compare`` talks HTTP through
    httpx, ``--engine dask`` needs Dask, ``tune`` needs Optuna). Parquet is checked by the commands
    that write it (:func:`aiqsim.lab.output_files.require_table_format`)."""
    feature, needed = f"aiqsim {args.command}", ["lab"]
    if args.command == "compare":
        needed.append("http")
    if args.command == "tune":
        needed.append("optuna")
    if getattr(args, "engine", None) == "dask":
        feature, needed = f"{feature} --engine dask", [*needed, "dask"]
    return feature, needed


def check_extras(args: argparse.Namespace) -> None:
    """Refuse now, with the one ``pip install`` line, a command whose extras are not installed:
    before any work, not with a traceback after a simulation ran (:mod:`aiqsim.core.extras`)."""
    from aiqsim.core.extras import require_extras

    feature, needed = required_extras(args)
    require_extras(needed, feature)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    try:
        check_extras(args)
    except ConfigurationError as error:
        print(f"aiqsim {args.command}: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    stdout, sys.stdout = sys.stdout, _GuardedStdout(sys.stdout)
    try:
        status = COMMANDS[args.command](args)
        sys.stdout.flush()  # piped or redirected output is buffered: a write failure shows up here
        return status
    except _StdoutError as failure:
        _discard_stdout(stdout)
        if isinstance(failure.error, BrokenPipeError):  # the reader left (| head): not an error to report
            return EXIT_BROKEN_PIPE
        reason = failure.error.strerror or failure.error
        print(f"aiqsim {args.command}: error: cannot write to standard output ({reason})", file=sys.stderr)
        return EXIT_STDOUT_FAILED
    except ConfigurationError as error:  # ScenarioError and UsageError among them
        print(f"aiqsim {args.command}: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except AiqsimError as error:  # e.g. StoreWriteError: a store path where no file can be made
        print(f"aiqsim {args.command}: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as error:  # a path the OS refuses (a name too long, a missing folder) no check named
        print(f"aiqsim {args.command}: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT if error.errno in _BAD_PATH_ERRNOS else EXIT_FAILED
    except KeyboardInterrupt as interrupt:  # Ctrl-C: no traceback; a command may say what it kept
        # a simulation stopped half-way leaves coroutines it never started: not the user's concern
        warnings.filterwarnings("ignore", r"coroutine .* was never awaited", RuntimeWarning)
        print(f"interrupted: {interrupt}" if str(interrupt) else "interrupted", file=sys.stderr)
        return 130
    finally:
        sys.stdout = stdout
