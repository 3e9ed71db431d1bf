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
        help="summary key to minimise (default cost_total); twice or more: a Pareto front (NSGA-II)",
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
        "--out", type=Path, required=True, help="trials CSV; OUT.optuna.db and OUT.best.toml beside"
    )
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
        print(
            f"  {name}: latency ({lat.base_s:.4g} + {lat.per_unit_s:.4g} x {lat.regressor}) s, sigma "
            f"{lat.sigma:.3g} ({lat.n} completed + {lat.cut_off} cut off, censored); "
            f"limit {fit.server_requests_per_min} req/min ({fit.limits_from}); 429 "
            f"{fit.rate_limit_prob:.3g}, 5xx {fit.server_error_prob:.3g}, lost {fit.timeout_prob:.3g}"
        )
    for flag in result.flags:
        print(f"  flag: {flag}", file=sys.stderr)
    if args.report is not None:
        from aiqsim.lab.calibration_report import write_calibration_report

        write_calibration_report(result, args.report)  # .ipynb: a notebook, else HTML
        print(f"wrote {args.report}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from aiqsim.lab.output_files import check_targets, replaced_atomically
    from aiqsim.lab.tune import parse_constraint, parse_param, tune
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
    constraints = [parse_constraint(text) for text in args.constraint]
    _writable(args.out, "--out")
    patch = args.out.with_name(args.out.name + ".best.toml")
    storage = args.out.with_name(args.out.name + ".optuna.db")
    check_targets(args.out.parent, [args.out.name, patch.name, storage.name])  # before any trial runs
    objectives = args.objective or ["cost_total"]
    result = tune(
        args.scenario,
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
    )
    for target, write in (
        (args.out, lambda temp: result.trials.to_csv(temp, index=False)),
        (patch, lambda temp: temp.write_text(result.toml_patch(), encoding="utf-8")),
    ):
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
        print("warning: no trial met the constraints; the least violating one is shown", file=sys.stderr)
    print(f"best of {len(result.trials)} trials: {values}")
    print(f"  {result.set_line()}")
    if len(objectives) > 1:
        print(f"Pareto front ({len(result.pareto)} trials):")
        print(result.pareto[[*(s.key for s in specs), *objectives]].to_string(index=False))
    print(f"wrote {args.out} and {patch}")
    return 0


LAB_COMMANDS = {"calibrate": cmd_calibrate, "tune": cmd_tune}
