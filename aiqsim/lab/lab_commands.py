"""``aiqsim calibrate`` and ``aiqsim tune``: the command-line side of :mod:`aiqsim.lab.calibrate` and
:mod:`aiqsim.lab.tune` (registered by :mod:`aiqsim.cli`). Bad input is a
:class:`~aiqsim.core.errors.ConfigurationError`, which the CLI prints as one line with exit status 2,
before any long work starts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from aiqsim.core.errors import ConfigurationError

__all__ = ["LAB_COMMANDS", "add_lab_parsers", "cmd_calibrate", "cmd_tune"]


def add_lab_parsers(commands: Any) -> None:
    """Add the ``calibrate`` and ``tune`` subcommands to the CLI's subparsers."""
    calibrate = commands.add_parser(
        "calibrate", help="fit a scenario (providers and workload) to call logs recorded in production"
    )
    calibrate.add_argument("logs", nargs="+", type=Path, help="call-log folder(s) (tasks.csv + calls.csv)")
    calibrate.add_argument("--out", type=Path, required=True, help="the scenario TOML file to write")
    calibrate.add_argument(
        "--report", type=Path, default=None,
        help="also write a report of the fits: REPORT.html, or REPORT.ipynb for a notebook (only these)",
    )  # fmt: skip
    calibrate.add_argument(
        "--settings", type=Path, default=None,
        help="a scenario whose client settings (quotas, retry, dispatch) and prices to keep",
    )  # fmt: skip
    calibrate.add_argument("--name", default="calibrated", help="the scenario's name")
    calibrate.add_argument("--arrival-bins", type=int, default=1, help="piecewise-constant arrival rate bins")
    calibrate.add_argument(
        "--duration", type=float, default=None, help="arrivals span (s; default: the log's)"
    )
    calibrate.add_argument(
        "--arrivals", choices=("fitted", "replay"), default="fitted",
        help="fitted: Poisson workloads from the fits (default); replay: the log's own submit times, "
        "in OUT.arrivals.PROVIDER.PRIORITY.csv beside OUT",
    )  # fmt: skip

    tune = commands.add_parser("tune", help="search a scenario's settings with Optuna (TPE / NSGA-II)")
    tune.add_argument("scenario", help="scenario TOML file")
    tune.add_argument(
        "--param", action="append", default=[], metavar="KEY=LOW:HIGH[:log|int] | KEY=V1,V2",
        help="a searched key, e.g. retry.base_s=0.1:5:log or dispatch.policy=fifo,sjf (repeatable)",
    )  # fmt: skip
    tune.add_argument(
        "--objective", action="append", default=[], metavar="METRIC",
        help="summary key to minimise (default cost_total): any numeric key `aiqsim run` reports for this "
        "scenario, e.g. job_latency_p99_s, deployment_NAME_success_latency_p99_s; twice or more: a Pareto "
        "front (NSGA-II)",
    )  # fmt: skip
    tune.add_argument("--maximize", action="store_true", help="maximise the objective(s) instead")
    tune.add_argument(
        "--constraint", action="append", default=[], metavar="METRIC<=BOUND",
        help="e.g. success_latency_p99_s<=30, on the mean over seeds (repeatable)",
    )  # fmt: skip
    tune.add_argument("--trials", type=int, default=50, help="trials in all (a resumed run counts old ones)")
    tune.add_argument("--seeds", type=int, default=3, help="replication seeds 0..N-1 per trial (default 3)")
    tune.add_argument("--seed", type=int, default=0, help="the optimiser's seed (default 0)")
    tune.add_argument("--sampler", choices=("tpe", "nsga2", "random"), default=None)
    tune.add_argument("--engine", choices=("serial", "local", "dask"), default="serial")
    tune.add_argument("--workers", type=int, default=None, help="worker processes (local/dask)")
    tune.add_argument("--address", default=None, help="dask scheduler address")
    tune.add_argument(
        "--tie-break", default="success_latency_p99_s", metavar="METRIC[:min|max]",
        help="secondary objective that chooses among feasible trials equal on the objective (default "
        "success_latency_p99_s, lower is better; 'none': the earliest trial)",
    )  # fmt: skip
    tune.add_argument(
        "--confirm-seeds", type=int, default=0, metavar="N",
        help="re-run the pick on N fresh seeds (SEEDS..SEEDS+N-1, unused by the search) and print its "
        "constraint values and how many seeds met them beside the search's",
    )  # fmt: skip
    tune.add_argument(
        "--out", type=Path, required=True,
        help="trials CSV; beside it OUT.optuna.db (the study, for resuming) and OUT.best.toml: the whole "
        "scenario with the best settings applied (aiqsim run OUT.best.toml). When no trial meets the "
        "constraints, no best file is written and the exit status is 3",
    )  # fmt: skip
    tune.add_argument("--no-progress", action="store_true", help="no progress bar")


def _writable(path: Path, flag: str) -> None:
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ConfigurationError(f"{flag} {path}: the folder {folder} does not exist")
    if path.is_dir():
        raise ConfigurationError(f"{flag} {path}: is a folder")


def cmd_calibrate(args: argparse.Namespace) -> int:
    from aiqsim.lab.calibrate import CalibrationError, calibrate, check_arrival_bins

    check_arrival_bins(args.arrival_bins, label="--arrival-bins")
    _writable(args.out, "--out")
    if args.report is not None:
        from aiqsim.lab.calibration_report import check_report_path

        check_report_path(args.report, "--report")  # a format it can write, before any fitting
        _writable(args.report, "--report")
    try:
        result = calibrate(
            args.logs,
            settings=args.settings,
            name=args.name,
            arrival_bins=args.arrival_bins,
            duration_s=args.duration,
            arrivals=args.arrivals,
            replay_dir=args.out.parent,
            replay_stem=f"{args.out.stem}.arrivals",
        )
    except CalibrationError as error:
        raise ConfigurationError(str(error)) from None
    result.write(args.out)
    print(f"wrote {args.out}")
    for name, fit in result.providers.items():
        lat = fit.latency
        line = (
            f"({lat.base_s:.4g} + {lat.per_unit_s:.4g} x {lat.regressor}) s"
            if lat.identifiable
            else f"{lat.base_s:.4g} s at the one size seen (base/per-unit split not identifiable)"
        )
        print(
            f"  {name}: latency {line}, sigma "
            f"{lat.sigma:.3g} ({lat.n} completed + {lat.cut_off} cut off, censored); "
            f"limit {fit.server_requests_per_min} req/min ({fit.limits_from}); 429 "
            f"{fit.rate_limit_prob:.3g}, 5xx {fit.server_error_prob:.3g}, lost {fit.timeout_prob:.3g}"
        )
    for line in result.interval_lines():
        if line == "Flags:":
            break
        print(f"  {line}")
    for flag in result.flags:
        print(f"  flag: {flag}", file=sys.stderr)
    if args.report is not None:
        from aiqsim.lab.calibration_report import write_calibration_report

        write_calibration_report(result, args.report)  # .ipynb: a notebook, else HTML
        print(f"wrote {args.report}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from aiqsim.lab.output_files import check_targets, replaced_atomically
    from aiqsim.lab.tune import parse_constraint, parse_param, parse_tie_break, tune
    from aiqsim.lab.tune_checks import format_checks
    from aiqsim.sim.scenario import load_scenario
    from aiqsim.sim.simulate import checked_scenario_path
    from aiqsim.sim.sweep import check_dask_address

    if not args.param:
        raise ConfigurationError("give at least one --param KEY=LOW:HIGH[:log|int] or KEY=V1,V2")
    if args.workers is not None and args.workers < 1:  # the engine options, checked as sweep checks them
        raise ConfigurationError(f"--workers {args.workers}: expected an integer >= 1")
    if args.address is not None and args.engine != "dask":
        raise ConfigurationError("--address only applies with --engine dask")
    if args.address is not None:
        check_dask_address(args.address, label="--address")
    specs = [parse_param(text) for text in args.param]
    scenario = load_scenario(checked_scenario_path(args.scenario))  # its summary keys name the metrics
    constraints = [parse_constraint(text, scenario) for text in args.constraint]
    parse_tie_break(args.tie_break, scenario)
    if args.confirm_seeds < 0:
        raise ConfigurationError(f"--confirm-seeds {args.confirm_seeds}: expected an integer >= 0")
    _writable(args.out, "--out")
    patch = args.out.with_name(args.out.name + ".best.toml")
    storage = args.out.with_name(args.out.name + ".optuna.db")
    check_targets(args.out.parent, [args.out.name, patch.name, storage.name])  # before any trial runs
    objectives = args.objective or ["cost_total"]
    result = tune(
        scenario,
        specs,
        objective=objectives,
        directions="maximize" if args.maximize else "minimize",
        constraints=constraints,
        trials=args.trials,
        seeds=args.seeds,
        seed=args.seed,
        sampler=args.sampler,
        engine=args.engine,
        workers=args.workers,
        address=args.address,
        storage=storage,
        progress=not args.no_progress,
        tie_break=args.tie_break,
        confirm_seeds=args.confirm_seeds,
    )
    folder = args.out.parent.resolve()
    writes = [(args.out, lambda temp: result.trials.to_csv(temp, index=False))]
    if result.feasible:
        best_text = result.best_scenario_toml(relative_to=folder)
        writes.append((patch, lambda temp: temp.write_text(best_text, encoding="utf-8")))
    for target, write in writes:
        try:  # an earlier file stays whole if this fails; the trials stay in the Optuna storage
            with replaced_atomically(target) as temp:
                write(temp)
        except OSError as error:
            raise ConfigurationError(
                f"{target}: cannot write ({error.strerror or error}); the trials are kept in {storage}, "
                "and running the same command again writes the results without new trials"
            ) from None
    values = ", ".join(f"{k} = {v:.6g}" for k, v in result.best_values.items())
    if not result.feasible:
        return _nothing_feasible(result, constraints, args.out, patch, format_checks)
    print(f"best of {len(result.trials)} trials (trial {result.best_trial}): {values}")
    print(f"  {result.set_line()}")
    print(f"  {_tie_words(result)}")
    for line in format_checks(result.pick, result.confirmation) if result.pick else []:
        print(
            line,
            file=sys.stderr if line.startswith("warning:") else sys.stdout,
        )
    if len(objectives) > 1:
        print(f"Pareto front ({len(result.pareto)} trials):")
        print(result.pareto[[*(s.key for s in specs), *objectives]].to_string(index=False))
    print(f"wrote {args.out} and {patch} (run it: aiqsim run {patch})")
    return 0


EXIT_NOTHING_FEASIBLE = 3
"""``aiqsim tune``'s exit status when no trial met the constraints (no best file is written)."""


def _tie_words(result: Any) -> str:
    """How the pick was chosen among trials equal on the first objective, in words."""
    first = result.objectives[0]
    if result.tie_break is None:
        if result.tied > 1:
            return f"{result.tied} settings tie on {first}; no tie-break: the earliest trial is shown"
        return f"no tie on {first} (no tie-break set)"
    metric, way = result.tie_break.split(":")
    value = float(result.trials.loc[result.trials["trial"] == result.best_trial, metric].iloc[0])
    words = "lowest" if way == "min" else "highest"
    if result.tied > 1:
        return (
            f"tie-break: {result.tied} feasible settings tie on {first}; chose the {words} {metric} "
            f"({value:.4g}) among them"
        )
    return f"no tie on {first} (tie-break {metric}, {words} first, not needed; its value {value:.4g})"


def _nothing_feasible(result: Any, constraints: Any, out: Path, patch: Path, format_checks: Any) -> int:
    """No trial met the constraints: say so and how far the closest was, leave no best file, exit 3."""
    print(
        f"aiqsim tune: no trial of {len(result.trials)} met the constraints "
        f"({', '.join(map(str, constraints))}); no best file was written. Relax the constraints, "
        "widen the --param ranges or run more --trials. The least violating trial "
        f"({result.best_trial}): {result.set_line()}",
        file=sys.stderr,
    )
    for line in format_checks(result.pick) if result.pick else []:
        print(f"  {line}", file=sys.stderr)
    stale = patch.is_file() and not patch.is_symlink()
    if stale:  # a best file from an earlier run would read as this run's answer
        patch.unlink()
        print(f"  removed the earlier {patch}: it is not this run's result", file=sys.stderr)
    print(f"wrote {out}")
    return EXIT_NOTHING_FEASIBLE


LAB_COMMANDS = {"calibrate": cmd_calibrate, "tune": cmd_tune}
