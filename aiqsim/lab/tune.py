"""Find a scenario's best client settings with a real optimiser (Optuna), on the virtual clock.

``tune(scenario, params, objective=..., constraints=...)`` searches the given ranges of scenario keys
(the same dotted keys as ``--set``). Each trial is the mean of one simulation per replication seed,
and every trial uses the *same* seeds (common random numbers: two settings are compared on the same
arrivals and the same per-request fates, so the difference is the settings', not the noise's).

- one objective: Optuna's TPE sampler; several: NSGA-II, and the result is the Pareto front. TPE is
  multivariate (one joint density over the parameters, so interactions such as burst x retry base can
  be learnt) and starts with ``startup_trials`` random trials (Optuna's default, 10, unless given;
  see benchmarks/RESULTS.md for what the choice does on a known grid). ``group`` (for conditional
  spaces) and ``constant_liar`` (for trials sampled while others run) do not apply: the searched space
  is fixed and the trials run one after the other;
- objectives, constraints and the tie-break name any numeric summary key the scenario reports
  (:func:`metric_keys`: its job, fleet, per-deployment and per-tenant keys too); another key is
  refused before any trial, naming the keys this scenario offers;
- constraints (``success_latency_p99_s<=30``) are passed to the sampler (``constraints_func``), so it learns
  where the feasible region is; the best trial is the best *feasible* one;
- ties: feasible trials equal on the (first) objective are told apart by a stated secondary objective
  (``tie_break``, default the success-latency p99, lowest first). A count such as ``rate_limited``
  often sits at a floor (random 429s) that many settings reach; the first of them found was picked,
  however slow it made the tasks;
- the pick's constraints are reported with their spread over the seeds
  (:mod:`aiqsim.lab.tune_checks`: value, margin, 95% t-interval, seeds meeting it) and, with
  ``confirm_seeds``, re-checked on seeds the search never used;
- reproducible: the sampler is seeded (``seed``); the replication seeds are ``0..seeds-1``;
- a trial that repeats a point already simulated in the same call reuses its results (same seeds,
  same results) instead of simulating again; it still counts as a trial;
- resumable: with ``storage`` (an SQLite file), a tuning run that stops keeps its finished trials
  and the next call with the same arguments and the same scenario content continues to ``trials``
  in all; an edited scenario starts a new study (its old trials' results no longer hold);
- runs in this process (``engine="serial"``), in local worker processes (``"local"``: one trial's
  seeds in parallel) or on Dask (``"dask"``).

Optuna is an extra (``pip install 'aiqsim[optuna]'``), imported only when a tuning run starts.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from aiqsim.core.errors import AiqsimError, ConfigurationError
from aiqsim.lab.lab_errors import TuneError
from aiqsim.lab.toml_out import dumps_toml
from aiqsim.lab.tune_checks import PickCheck, check_pick
from aiqsim.sim.config import Scenario

__all__ = [
    "Constraint",
    "ParamSpec",
    "TuneError",
    "TuneResult",
    "metric_keys",
    "parse_constraint",
    "parse_param",
    "parse_tie_break",
    "scenario_digest",
    "tune",
]

ParamKind = Literal["float", "log", "int", "choice"]
SAMPLERS = ("tpe", "nsga2", "random")
ENGINES = ("serial", "local", "dask")


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One searched key: ``low..high`` (``float``, ``log``-uniform or ``int``) or a list of ``choices``."""

    key: str
    kind: ParamKind
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] = ()

    def describe(self) -> str:
        """The spec as ``--param`` takes it."""
        if self.kind == "choice":
            return f"{self.key}={','.join(map(str, self.choices))}"
        suffix = "" if self.kind == "float" else f":{self.kind}"
        return f"{self.key}={self.low:g}:{self.high:g}{suffix}"


@dataclass(frozen=True, slots=True)
class Constraint:
    """``metric <= bound`` or ``metric >= bound`` on the mean over the replication seeds."""

    metric: str
    op: Literal["<=", ">="]
    bound: float

    def violation(self, value: float) -> float:
        """How far ``value`` is on the wrong side (<= 0 means satisfied; NaN counts as violated)."""
        if math.isnan(value):
            return math.inf
        return value - self.bound if self.op == "<=" else self.bound - value

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"


def _scalar(text: str) -> Any:
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def parse_param(text: str) -> ParamSpec:
    """``KEY=LOW:HIGH[:log|int|float]`` or ``KEY=V1,V2,...`` as a :class:`ParamSpec`.

    Raises :class:`ConfigurationError` (naming the text) for a bad range: low >= high, a log range
    that is not > 0, non-integer ``int`` bounds, fewer than two choices.
    """
    if "=" not in text:
        raise ConfigurationError(f"--param {text!r}: expected KEY=LOW:HIGH[:log|int] or KEY=V1,V2,...")
    key, _, spec = text.partition("=")
    key, spec = key.strip(), spec.strip()
    if not key or not spec:
        raise ConfigurationError(f"--param {text!r}: expected KEY=LOW:HIGH[:log|int] or KEY=V1,V2,...")
    if ":" in spec:
        parts = spec.split(":")
        kind = parts[2].strip().lower() if len(parts) == 3 else "float"
        if len(parts) not in (2, 3) or kind not in ("float", "log", "int"):
            raise ConfigurationError(f"--param {text!r}: a range is LOW:HIGH or LOW:HIGH:log|int|float")
        try:
            low, high = float(parts[0]), float(parts[1])
        except ValueError:
            raise ConfigurationError(f"--param {text!r}: LOW and HIGH must be numbers") from None
        if not (math.isfinite(low) and math.isfinite(high)) or not low < high:
            raise ConfigurationError(f"--param {text!r}: expected finite LOW < HIGH")
        if kind == "log" and low <= 0:
            raise ConfigurationError(f"--param {text!r}: a log range needs LOW > 0")
        if kind == "int" and not (low.is_integer() and high.is_integer()):
            raise ConfigurationError(f"--param {text!r}: an int range needs whole-number bounds")
        return ParamSpec(key, kind, low, high)  # type: ignore[arg-type]
    choices = tuple(_scalar(part.strip()) for part in spec.split(",") if part.strip())
    if len(choices) < 2 or len(set(map(repr, choices))) != len(choices):
        raise ConfigurationError(f"--param {text!r}: give at least two distinct choices")
    return ParamSpec(key, "choice", choices=choices)


_CONSTRAINT = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=)\s*(\S+)\s*$")


def metric_keys(scenario: Scenario | None = None) -> tuple[str, ...]:
    """The summary keys a tuning run of ``scenario`` can optimise, bound or break ties on: every numeric
    key its summary has (job, fleet, per-deployment and per-tenant keys included when it has them,
    :func:`~aiqsim.sim.streaming_run.scenario_metric_keys`); without a scenario, the task keys."""
    if scenario is None:
        from aiqsim.sim.metrics import SUMMARY_KEYS

        return tuple(SUMMARY_KEYS)
    from aiqsim.sim.streaming_run import scenario_metric_keys

    return scenario_metric_keys(scenario)


def _offered(metrics: Sequence[str], scenario: Scenario | None, metric: str) -> str:
    """What the message refusing ``metric`` says the scenario offers instead."""
    from aiqsim.sim.job_metrics import JOB_SUMMARY_KEYS

    whose = "the task summary" if scenario is None else f"scenario {scenario.name!r}"
    hint = " (job keys need a job workload)" if metric in JOB_SUMMARY_KEYS else ""
    return f"{whose} has no such key{hint}; it offers: {', '.join(metrics)}"


def parse_constraint(text: str, scenario: Scenario | None = None) -> Constraint:
    """``METRIC<=BOUND`` or ``METRIC>=BOUND`` as a :class:`Constraint`; ``METRIC`` one of
    :func:`metric_keys` of ``scenario`` (the task keys when no scenario is given)."""
    match = _CONSTRAINT.match(text)
    if match is None:
        raise ConfigurationError(f"--constraint {text!r}: expected METRIC<=BOUND or METRIC>=BOUND")
    metric, op, bound_text = match.groups()
    metrics = metric_keys(scenario)
    if metric not in metrics:
        raise ConfigurationError(
            f"--constraint {text!r}: unknown metric {metric!r}: {_offered(metrics, scenario, metric)}"
        )
    try:
        bound = float(bound_text)
    except ValueError:
        raise ConfigurationError(f"--constraint {text!r}: the bound must be a number") from None
    if not math.isfinite(bound):
        raise ConfigurationError(f"--constraint {text!r}: the bound must be finite")
    return Constraint(metric, op, bound)  # type: ignore[arg-type]


DEFAULT_TIE_BREAK = "success_latency_p99_s"
"""The secondary objective by default: among settings equally good on the objective (a count of 429s
often sits at a floor many settings reach), the one whose successful tasks finish soonest."""


def parse_tie_break(text: str | None, scenario: Scenario | None = None) -> tuple[str, str] | None:
    """``METRIC``, ``METRIC:min`` or ``METRIC:max`` (one of :func:`metric_keys` of ``scenario``) as
    ``(metric, direction)``; ``None`` or ``"none"``: ties go to the earliest trial. Raises
    :class:`ConfigurationError`."""
    if text is None or text.strip().lower() == "none":
        return None
    metric, _, way = text.strip().partition(":")
    way = way.strip().lower() or "min"
    metrics = metric_keys(scenario)
    if metric not in metrics or way not in ("min", "max"):
        raise ConfigurationError(
            f"tie-break {text!r}: expected a summary key, optionally :min or :max (e.g. "
            f"{DEFAULT_TIE_BREAK}), or none; {_offered(metrics, scenario, metric)}"
        )
    return metric, way


@dataclass(frozen=True)
class TuneResult:
    """Every trial (``trials``: one row each, with parameters, metric means, feasibility and ``repeat``,
    true when the trial repeated a point already simulated in the same call and reused its results),
    the best feasible trial's settings, and for several objectives the Pareto front."""

    trials: pd.DataFrame
    best_params: dict[str, Any]
    best_values: dict[str, float]
    objectives: tuple[str, ...]
    directions: tuple[str, ...]
    pareto: pd.DataFrame = field(repr=False)
    feasible: bool = True
    """False when no trial met the constraints (``best_params`` is then the least violating)."""
    best_trial: int = -1
    """The number of the trial whose settings are :attr:`best_params`."""
    tie_break: str | None = None
    """The secondary objective that broke ties on the (first) objective, as ``METRIC:min|max``."""
    tied: int = 1
    """How many distinct settings among the feasible (front) trials shared the best value of the first
    objective; above 1, the tie-break chose among them."""
    pick: PickCheck | None = field(default=None, repr=False)
    """The pick's constraints over the search's seeds (value, margin, spread, t-interval)."""
    confirmation: PickCheck | None = field(default=None, repr=False)
    """The same on fresh seeds (``confirm_seeds``), when asked for and a feasible pick exists."""
    scenario: Scenario | None = field(default=None, repr=False)
    """The scenario that was tuned (for :meth:`best_scenario_toml`)."""

    def set_line(self) -> str:
        """The best settings as ``--set`` arguments for ``aiqsim run``, quoted for a shell where needed
        (``'workloads[0].rate_per_s=1.5'``: zsh would glob the brackets and refuse the command)."""
        return " ".join(
            f"--set {shlex.quote(f'{key}={_format(value)}')}" for key, value in self.best_params.items()
        )

    def toml_patch(self) -> str:
        """The best settings as a TOML document in the scenario file's layout (only the tuned keys)."""
        return dumps_toml(_nest(self.best_params))

    def best_scenario_toml(self, relative_to: str | Path | None = None) -> str:
        """The tuned scenario with the best settings applied, as a whole scenario file that
        ``aiqsim run`` accepts; a comment block at the top names the tuned keys and their values.

        ``relative_to``: the folder the file will be in; trace and replay files are then named
        relative to it (as the loader resolves them), else by absolute path.
        """
        from aiqsim.sim.scenario import scenario_to_dict
        from aiqsim.sim.simulate import resolve_scenario

        if self.scenario is None:
            raise TuneError("this result holds no scenario to apply the best settings to")
        document = scenario_to_dict(resolve_scenario(self.scenario, self.best_params))
        document = {key: value for key, value in document.items() if value != []}  # absent: none
        if relative_to is not None:
            for workload in document["workloads"]:
                for key in ("trace", "arrivals"):
                    name = workload.get(key)
                    if isinstance(name, str) and Path(name).is_absolute() and Path(name).is_file():
                        workload[key] = Path(os.path.relpath(name, relative_to)).as_posix()
        header = [
            f"# {self.scenario.name} with the settings `aiqsim tune` chose "
            f"({'best feasible trial' if self.feasible else 'NO trial met the constraints'}):",
            *(f"#   {key} = {_format(value)}" for key, value in self.best_params.items()),
            "# Run it as it is: aiqsim run THIS_FILE",
        ]
        return "\n".join(header) + "\n\n" + dumps_toml(document)


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        parts = key.split(".")
        if parts[0] == "scenario":
            parts = ["scenario", *parts[1:]]
        if any("[" in part for part in parts):  # a list element: keep the dotted key, quoted
            nested[key] = value
            continue
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return nested


SQLITE_HEADER = b"SQLite format 3\x00"
OPTUNA_TABLES = frozenset(
    {
        "alembic_version", "studies", "study_directions", "study_system_attributes",
        "study_user_attributes", "trial_heartbeats", "trial_intermediate_values", "trial_params",
        "trial_system_attributes", "trial_user_attributes", "trial_values", "trials", "version_info",
    }
)  # fmt: skip
"""Tables every Optuna RDB storage has (Optuna 3 and later); a database with tables but not all of
these is someone else's, or damaged: Optuna would add the missing ones to it (it did, to a file
holding only ``studies`` and ``version_info``, then failed)."""


def check_optuna_storage(path: Path) -> None:
    """Raise :class:`ConfigurationError` naming ``path`` unless it is absent, empty, or a readable
    SQLite database that is empty or Optuna's; the file is opened read-only and left untouched.

    Handed to Optuna as is, a file that is not SQLite (or a truncated one) failed with a raw
    sqlalchemy ``DatabaseError`` traceback, and an unrelated SQLite database silently got Optuna's
    tables added to it.
    """
    import sqlite3

    def refuse(problem: str) -> ConfigurationError:
        return ConfigurationError(
            f"tuning storage {path}: {problem}; move it away or choose another path (it was left as it was)"
        )

    try:
        if not path.exists():
            return
        if path.is_dir():
            raise refuse("is a directory, where the Optuna database goes")
        with path.open("rb") as handle:
            header = handle.read(len(SQLITE_HEADER))
    except OSError as error:
        raise refuse(f"cannot read it ({error.strerror or error})") from None
    if not header:
        return  # an empty file is an empty SQLite database
    if header != SQLITE_HEADER:
        raise refuse("is not an SQLite database")
    try:
        connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            if connection.execute("PRAGMA quick_check").fetchone() != ("ok",):
                raise sqlite3.DatabaseError("database disk image is malformed")
            rows = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        finally:
            connection.close()
    except sqlite3.Error as error:
        raise refuse(f"is not a readable SQLite database ({error})") from None
    tables = {name for (name,) in rows}
    if tables and not tables >= OPTUNA_TABLES:
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        lacking = ", ".join(sorted(OPTUNA_TABLES - tables)[:3])
        raise refuse(f"is an SQLite database that is not Optuna's (its tables: {shown}; it lacks {lacking})")


def _storage_error(storage: str | Path, doing: str, error: BaseException) -> TuneError:
    """What Optuna (or the SQLite under it) raised about ``storage``, as a project error naming it."""
    return TuneError(
        f"tuning storage {storage}: {doing} ({type(error).__name__}: {error}); move it away or choose "
        "another path"
    )


def _storage_errors(optuna: Any) -> tuple[type[BaseException], ...]:
    """The errors a failing Optuna storage raises: sqlite's, sqlalchemy's, Optuna's own, the OS's."""
    import sqlite3

    kinds: list[type[BaseException]] = [OSError, sqlite3.Error, optuna.exceptions.StorageInternalError]
    try:
        import sqlalchemy.exc
    except ImportError:  # an Optuna without an RDB storage has no sqlalchemy
        pass
    else:
        kinds.append(sqlalchemy.exc.SQLAlchemyError)
    return tuple(kinds)


def _check_trial_params(storage: str | Path, study: Any, specs: Sequence[ParamSpec], complete: Any) -> None:
    """Refuse a stored trial whose parameter lies outside what is searched now: the study was changed
    by hand (its best setting would be one the search never asked for)."""
    for trial in study.trials:
        if trial.state != complete:
            continue
        for spec in specs:
            value = trial.params.get(spec.key)
            if spec.kind == "choice":
                inside = value in spec.choices
            else:
                inside = isinstance(value, int | float) and spec.low <= value <= spec.high  # type: ignore[operator]
            if not inside:
                raise TuneError(
                    f"tuning storage {storage}: trial {trial.number} holds {spec.key} = {value!r}, outside "
                    f"the searched {spec.describe()}; the study was changed by hand. Move it away or "
                    "choose another path (it was left as it was)"
                )


def _require_optuna() -> Any:
    try:
        import optuna
    except ImportError as error:
        raise ConfigurationError("tuning needs Optuna: pip install 'aiqsim[optuna]'") from error
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _values(spec: ParamSpec) -> list[Any]:
    if spec.kind == "choice":
        return list(spec.choices)
    if spec.kind == "int":
        return [int(spec.low), int(spec.high)]  # type: ignore[arg-type]
    return [spec.low, spec.high]


def _check_settings(scenario: Scenario, params: Sequence[ParamSpec], simulations: int) -> None:
    """Every value a parameter can take, with the others at their first value, must give a valid
    scenario (keys that only apply together, such as a burst and its rate, are set together):
    refuse it now, not at trial 57. ``simulations`` (trials x seeds) may not share a fixed
    ``store.path``: each store path any of those scenarios has is counted as used by all of them."""
    from aiqsim.sim.preflight import check_store_unshared
    from aiqsim.sim.simulate import resolve_scenario

    keys = [p.key for p in params]
    if len(set(keys)) != len(keys):
        raise ConfigurationError(f"--param: a key is given twice ({', '.join(keys)})")
    base = {spec.key: _values(spec)[0] for spec in params}
    by_store: dict[str | None, Scenario] = {}
    for spec in params:
        for value in _values(spec):
            resolved = resolve_scenario(scenario, {**base, spec.key: value})
            by_store.setdefault(resolved.store.path, resolved)
    runs = [(each, simulations) for each in by_store.values()]
    check_store_unshared(runs, what="tuning simulations (trials x seeds)")


class _Runner:
    """Runs one trial's replications on the chosen engine (the pool lives for the whole tuning run)."""

    def __init__(self, scenario: Scenario, engine: str, workers: int | None, address: str | None) -> None:
        self.scenario = scenario
        self.engine = engine
        self.pool: Any = None
        self.client: Any = None
        self.cluster: Any = None
        if engine == "local":
            from concurrent.futures import ProcessPoolExecutor

            self.pool = ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 1)
        elif engine == "dask":
            try:
                from dask.distributed import Client

                from aiqsim.sim.dask_cluster import local_dask_cluster
            except ImportError as error:
                raise ConfigurationError(
                    "engine='dask' needs dask[distributed]: pip install 'aiqsim[dask]'"
                ) from error
            if address is None:
                self.cluster = local_dask_cluster(workers)  # its workers leave Ctrl-C to this process
                self.client = Client(self.cluster)
            else:
                from aiqsim.sim.sweep import DASK_CONNECT_TIMEOUT_S

                self.client = Client(address, timeout=DASK_CONNECT_TIMEOUT_S)

    def run(
        self, point: dict[str, Any], seeds: Sequence[int]
    ) -> list[tuple[dict[str, Any] | None, str | None]]:
        from aiqsim.sim.sweep import safe_run

        if self.engine == "serial":
            return [safe_run(self.scenario, point, seed) for seed in seeds]
        if self.engine == "local":
            return list(self.pool.map(safe_run, [self.scenario] * len(seeds), [point] * len(seeds), seeds))
        futures = [self.client.submit(safe_run, self.scenario, point, seed, pure=False) for seed in seeds]
        return self.client.gather(futures)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
        if self.client is not None:
            self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def scenario_digest(scenario: Scenario) -> str:
    """A digest (hex SHA-256) of what in ``scenario`` shapes a run's results: a resumed tuning study
    is identified by it, so trials of an edited scenario never mix with the current one's.

    The canonical form (:func:`~aiqsim.sim.scenario.scenario_to_dict`, keys sorted) without the name
    and description, which change no result; a trace or replay arrivals file is stood for by a
    digest of its contents, not its path (an edited file is another scenario, a moved folder is not).
    """
    from aiqsim.sim.scenario import scenario_to_dict

    document = scenario_to_dict(scenario)
    document["scenario"] = {k: v for k, v in document["scenario"].items() if k not in ("name", "description")}
    for workload in document["workloads"]:
        for key in ("trace", "arrivals"):
            if isinstance(workload.get(key), str):
                workload[key] = _file_digest(workload[key])
    canonical = json.dumps(document, sort_keys=True, default=repr)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _file_digest(name: str) -> str:
    """``sha256:<hex>`` of the file at ``name``; ``name`` itself when it is none (a built-in trace)."""
    path = Path(name)
    if not path.is_file():
        return name
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return name  # read when the scenario was loaded; a run will say why it cannot be now
    return f"sha256:{digest.hexdigest()}"


def tune(
    scenario: Scenario | str | Path,
    params: Sequence[ParamSpec | str],
    *,
    objective: str | Sequence[str] = "cost_total",
    directions: str | Sequence[str] = "minimize",
    constraints: Sequence[Constraint | str] = (),
    trials: int = 50,
    seeds: int = 3,
    seed: int = 0,
    sampler: str | None = None,
    engine: str = "serial",
    workers: int | None = None,
    address: str | None = None,
    storage: str | Path | None = None,
    progress: bool = True,
    startup_trials: int | None = None,
    tie_break: str | None = DEFAULT_TIE_BREAK,
    confirm_seeds: int = 0,
) -> TuneResult:
    """Search ``params`` for the settings that optimise ``objective`` (see the module docstring).

    ``params`` are :class:`ParamSpec` or their ``--param`` text; ``objective`` one summary key (TPE)
    or several (NSGA-II, Pareto front), each minimised unless ``directions`` says ``maximize``;
    ``constraints`` are :class:`Constraint` or ``"success_latency_p99_s<=30"``; ``sampler`` overrides the
    choice (``"random"`` is the baseline search). ``storage`` is an SQLite file that makes the run
    resumable: a call continues the stored study of the same scenario *content* (see
    :func:`scenario_digest`) and the same search arguments; an edited scenario (or another one with
    the same name) starts a study of its own in the same file, since the stored trials' results
    would not hold for it. ``startup_trials``: TPE's random start-up trials (default: Optuna's, 10).

    ``tie_break``: the secondary objective (``METRIC[:min|max]``, default the success-latency p99,
    lower is better; ``None``: the earliest trial) that chooses among feasible trials equal on the
    (first) objective. ``confirm_seeds``: re-run the pick on that many fresh seeds (``seeds`` ..
    ``seeds + confirm_seeds - 1``, none of which the search used) and report its constraints there
    (:attr:`TuneResult.confirmation`). Bad input raises :class:`ConfigurationError` before any simulation.
    """
    from aiqsim.sim.simulate import checked_scenario_path
    from aiqsim.sim.sweep import RunProgress

    if not isinstance(scenario, Scenario):
        from aiqsim.sim.scenario import load_scenario

        scenario = load_scenario(checked_scenario_path(scenario))
    specs = [p if isinstance(p, ParamSpec) else parse_param(p) for p in params]
    if not specs:
        raise ConfigurationError("params: give at least one parameter to tune")
    objectives = (objective,) if isinstance(objective, str) else tuple(objective)
    if not objectives:
        raise ConfigurationError("objective: give at least one summary key")
    metrics = metric_keys(scenario)
    for name in objectives:
        if name not in metrics:
            raise ConfigurationError(
                f"objective {name!r}: unknown summary key: {_offered(metrics, scenario, name)}"
            )
    dirs = (directions,) * len(objectives) if isinstance(directions, str) else tuple(directions)
    if len(dirs) != len(objectives) or any(d not in ("minimize", "maximize") for d in dirs):
        raise ConfigurationError(
            f"directions: expected 'minimize' or 'maximize' per objective, got {directions!r}"
        )
    limits = [c if isinstance(c, Constraint) else parse_constraint(c, scenario) for c in constraints]
    for limit in limits:  # a Constraint built by hand is checked as the text is
        if limit.metric not in metrics:
            raise ConfigurationError(
                f"constraint {limit}: unknown metric {limit.metric!r}: "
                f"{_offered(metrics, scenario, limit.metric)}"
            )
    tie = parse_tie_break(tie_break, scenario)
    for name, value, least in (
        ("trials", trials, 1), ("seeds", seeds, 1), ("seed", seed, 0), ("confirm_seeds", confirm_seeds, 0)
    ):  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigurationError(f"{name}: expected an integer >= {least}, got {value!r}")
    if startup_trials is not None and (
        isinstance(startup_trials, bool) or not isinstance(startup_trials, int) or startup_trials < 1
    ):
        raise ConfigurationError(f"startup_trials: expected an integer >= 1, got {startup_trials!r}")
    if engine not in ENGINES:
        raise ConfigurationError(f"engine: expected one of {', '.join(ENGINES)}, got {engine!r}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigurationError(f"workers: expected an integer >= 1, got {workers!r}")
    if address is not None:  # checked as sweep checks them, before any trial
        if engine != "dask":
            raise ConfigurationError(f"address: only applies with engine 'dask', not {engine!r}")
        from aiqsim.sim.sweep import check_dask_address

        check_dask_address(address)
    sampler_name = sampler or ("tpe" if len(objectives) == 1 else "nsga2")
    if sampler_name not in SAMPLERS:
        raise ConfigurationError(f"sampler: expected one of {', '.join(SAMPLERS)}, got {sampler!r}")
    _check_settings(scenario, specs, trials * seeds)
    optuna = _require_optuna()

    # Optuna >= 5 takes constraints from the trial (set_constraint); older ones from constraints_func.
    on_trial = hasattr(optuna.trial.Trial, "set_constraint")
    constraints_func = None
    if limits and not on_trial:

        def constraints_func(trial: Any) -> list[float]:
            return list(trial.user_attrs.get("violations", [math.inf] * len(limits)))

    if sampler_name == "tpe":
        startup = {} if startup_trials is None else {"n_startup_trials": startup_trials}
        chosen = optuna.samplers.TPESampler(
            seed=seed, constraints_func=constraints_func, multivariate=True, **startup
        )
    elif sampler_name == "nsga2":
        chosen = optuna.samplers.NSGAIISampler(seed=seed, constraints_func=constraints_func)
    else:
        chosen = optuna.samplers.RandomSampler(seed=seed)
    identity = json.dumps(
        [scenario_digest(scenario), [s.describe() for s in specs], objectives, dirs, [str(c) for c in limits],
         seeds, seed, sampler_name, *([] if startup_trials is None else [startup_trials])],
        sort_keys=True,
    )  # fmt: skip
    study_name = "aiqsim-" + hashlib.sha256(identity.encode()).hexdigest()[:16]
    url = None
    if storage is not None:
        check_optuna_storage(Path(storage))
        url = f"sqlite:///{Path(storage).resolve()}"
    complete = optuna.trial.TrialState.COMPLETE
    try:
        study = optuna.create_study(
            study_name=study_name,
            storage=url,
            sampler=chosen,
            directions=list(dirs),
            load_if_exists=True,
        )
        done = len([t for t in study.trials if t.state == complete])
    except Exception as error:  # a damaged or unwritable study: Optuna's, sqlalchemy's or sqlite's error
        if storage is None or isinstance(error, AiqsimError):
            raise
        raise _storage_error(storage, "Optuna cannot open the study in it", error) from error
    if storage is not None:
        _check_trial_params(storage, study, specs, complete)
    remaining = max(0, trials - done)
    replications = list(range(seeds))
    runner = _Runner(scenario, engine, workers, address) if remaining else None
    bar = RunProgress(remaining, label=f"tune {scenario.name}", enabled=progress)
    failures: list[str] = []
    evaluated: dict[str, tuple[dict[str, float], list[float], dict[str, list[float]]]] = {}
    """Point -> (means, violations, per-seed values) of the points simulated in this call: the seeds
    are the same in every trial, so a trial that repeats a point (TPE does, on a small grid of
    choices) gets the same results without running the simulations again."""
    tracked = list(dict.fromkeys([*(c.metric for c in limits), *objectives, *([tie[0]] if tie else [])]))
    """The metrics whose per-seed values each trial keeps (for the pick's spread and margins)."""

    def _constrain(trial: Any, violations: list[float]) -> None:
        trial.set_user_attr("violations", violations)
        if limits and on_trial:
            for limit, violation in zip(limits, violations, strict=True):
                trial.set_constraint(str(limit), min(violation, 1e300))

    def evaluate(trial: Any) -> Any:
        point: dict[str, Any] = {}
        for spec in specs:
            if spec.kind == "choice":
                point[spec.key] = trial.suggest_categorical(spec.key, list(spec.choices))
            elif spec.kind == "int":
                point[spec.key] = trial.suggest_int(spec.key, int(spec.low), int(spec.high))  # type: ignore[arg-type]
            else:
                point[spec.key] = trial.suggest_float(spec.key, spec.low, spec.high, log=spec.kind == "log")
        assert runner is not None
        seen = json.dumps(point, sort_keys=True, default=str)
        if seen in evaluated:
            means, violations, per_seed = evaluated[seen]
            trial.set_user_attr("repeat", True)
        else:
            rows = runner.run(point, replications)
            errors = [error for _, error in rows if error is not None]
            if errors:
                failures.append(f"{point}: {errors[0]}")
                _constrain(trial, [math.inf] * len(limits))
                raise _TrialFailed(errors[0])
            frame = pd.DataFrame([row for row, _ in rows])
            means = {key: float(frame[key].mean()) for key in metrics if key in frame}
            violations = [c.violation(means.get(c.metric, math.nan)) for c in limits]
            per_seed = {key: [float(v) for v in frame[key]] for key in tracked if key in frame}
            evaluated[seen] = means, violations, per_seed
        trial.set_user_attr("means", means)
        trial.set_user_attr("per_seed", per_seed)
        _constrain(trial, violations)
        values = [means.get(name, math.nan) for name in objectives]
        if any(math.isnan(v) for v in values):
            raise _TrialFailed(f"objective is NaN at {point}")
        return values[0] if len(values) == 1 else values

    try:
        if remaining:
            study.optimize(
                evaluate, n_trials=remaining, catch=(_TrialFailed,), callbacks=[lambda *_: bar.advance()]
            )
    except _storage_errors(optuna) as error:  # a storage that fails mid-run (a full disk)
        if storage is None:
            raise
        raise _storage_error(
            storage, "a trial could not be written to it; the trials before it are kept", error
        ) from error
    finally:
        if runner is not None:
            runner.close()
    result = _result(study, specs, objectives, dirs, limits, failures, optuna, tie)
    shown = list(dict.fromkeys([*objectives, *([tie[0]] if tie else [])]))
    checks = [(c.metric, c.op, c.bound) for c in limits]
    per_seed = _pick_per_seed(study, result, [c.metric for c in limits])
    if per_seed is None:  # a study stored before per-seed values were kept: the same seeds again
        per_seed = _per_seed_runs(scenario, result.best_params, replications, "serial", None, None)
    pick = check_pick(per_seed, checks, replications)
    row = result.trials.loc[result.trials["trial"] == result.best_trial].iloc[0]
    pick = replace(pick, means={name: float(row[name]) for name in shown if name in row})
    confirmation = None
    if confirm_seeds and result.feasible:
        fresh = list(range(seeds, seeds + confirm_seeds))
        runs = _per_seed_runs(scenario, result.best_params, fresh, engine, workers, address)
        confirmation = check_pick(runs, checks, fresh, shown)
    return replace(result, pick=pick, confirmation=confirmation, scenario=scenario)


def _pick_per_seed(study: Any, result: TuneResult, tracked: Sequence[str]) -> dict[str, list[float]] | None:
    """The per-seed values the search kept for the pick's trial, or None if it kept none (an old study)."""
    for trial in study.trials:
        if trial.number == result.best_trial:
            stored = trial.user_attrs.get("per_seed") or {}
            return stored if all(key in stored for key in tracked) else None
    return None


def _per_seed_runs(
    scenario: Scenario,
    point: dict[str, Any],
    seeds: Sequence[int],
    engine: str,
    workers: int | None,
    address: str | None,
) -> dict[str, list[float]]:
    """Every summary key's value per seed for ``point`` run on ``seeds``."""
    runner = _Runner(scenario, engine, workers, address)
    try:
        rows = runner.run(point, list(seeds))
    finally:
        runner.close()
    errors = [error for _, error in rows if error is not None]
    if errors:
        raise TuneError(f"re-running the pick {point} failed: {errors[0]}")
    frames = [row for row, _ in rows if row is not None]
    return {key: [float(row[key]) for row in frames] for key in metric_keys(scenario) if key in frames[0]}


class _TrialFailed(Exception):
    """A trial whose simulations raised or whose objective is NaN (Optuna records it as failed)."""


def _result(
    study: Any,
    specs: Sequence[ParamSpec],
    objectives: tuple[str, ...],
    dirs: tuple[str, ...],
    limits: Sequence[Constraint],
    failures: list[str],
    optuna: Any,
    tie: tuple[str, str] | None = None,
) -> TuneResult:
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        detail = f": {failures[0]}" if failures else ""
        raise TuneError(f"no trial completed{detail}")
    rows = []
    for t in complete:
        violations = t.user_attrs.get("violations", [])
        rows.append(
            {
                "trial": t.number,
                **{s.key: t.params[s.key] for s in specs},
                **t.user_attrs.get("means", {}),
                "violation": max([0.0, *violations]),
                "feasible": all(v <= 0 for v in violations),
                "repeat": bool(t.user_attrs.get("repeat", False)),
            }
        )
    frame = pd.DataFrame(rows)
    sign = [1.0 if d == "minimize" else -1.0 for d in dirs]
    feasible = frame[frame["feasible"]]
    any_feasible = not feasible.empty
    pool = feasible if any_feasible else frame.sort_values("violation").head(1)
    pareto_mask = _pareto(pool, objectives, sign)
    # one objective: the best value; several: the Pareto trial best on the first (the primary) one
    front = pool[pareto_mask]
    primary = sign[0] * front[objectives[0]]
    top = primary.min()
    tied = front[[math.isclose(v, top, rel_tol=1e-9, abs_tol=1e-12) for v in primary]]
    if tie is not None and len(tied) > 1 and tie[0] in tied.columns:
        key = tied[tie[0]] * (1.0 if tie[1] == "min" else -1.0)  # NaN (no such tasks) sorts last
        order = pd.DataFrame({"key": key, "trial": tied["trial"]}).sort_values(
            ["key", "trial"], na_position="last"
        )
        best = tied.loc[order.index[0]]
    else:
        best = tied.sort_values("trial").iloc[0]
    frame["pareto"] = frame["trial"].isin(pool.loc[pareto_mask, "trial"])
    best_params = {s.key: _plain(best[s.key]) for s in specs}
    best_values = {name: float(best[name]) for name in objectives}
    return TuneResult(
        trials=frame,
        best_params=best_params,
        best_values=best_values,
        objectives=objectives,
        directions=dirs,
        pareto=frame[frame["pareto"]].sort_values(list(objectives)).reset_index(drop=True),
        feasible=any_feasible,
        tie_break=None if tie is None else f"{tie[0]}:{tie[1]}",
        tied=len(tied.drop_duplicates(subset=[s.key for s in specs])),
        best_trial=int(best["trial"]),
    )


def _plain(value: Any) -> Any:
    """numpy scalars as Python ones (for TOML and ``--set``)."""
    return value.item() if hasattr(value, "item") else value


def _pareto(frame: pd.DataFrame, objectives: Sequence[str], sign: Sequence[float]) -> pd.Series:
    values = frame[list(objectives)].to_numpy(float) * sign
    keep = []
    for i, row in enumerate(values):
        dominated = any(
            (other <= row).all() and (other < row).any() for j, other in enumerate(values) if j != i
        )
        keep.append(not dominated)
    return pd.Series(keep, index=frame.index)
