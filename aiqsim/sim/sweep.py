"""Parameter sweeps: every grid point times every seed, on local processes or a Dask cluster.

Each run is ``simulate(scenario with the point's overrides, seed)``, deterministic from
(point, seed), so the same sweep gives the same rows on any engine and in any order of
completion. Rows come back ordered by grid point, then seed.
"""

from __future__ import annotations

import contextlib
import itertools
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence, Sized
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from aiqsim.core.errors import AiqsimError, ConfigurationError
from aiqsim.sim.config import Scenario

ENGINES = ("local", "dask", "serial")
DASK_CONNECT_TIMEOUT_S = 10.0
"""How long ``engine="dask"`` tries to reach a scheduler at ``address`` before it gives up (Dask's own
default is 30 s, which left a mistyped address looking like a hang)."""


class _RunBar(tqdm):  # tqdm.auto's class is picked at import (a widget in Jupyter)
    """``tqdm.auto``'s bar without tqdm's monitor thread, for our bars only (tqdm's own class is untouched).

    tqdm starts a ``tqdm_monitor`` thread with a bar and stops it only when the last registered bar
    closes; a disabled bar unregisters at once and never stops it, so a sweep run with
    ``progress=False`` left it polling for the rest of the process (in Jupyter, outliving the cell).
    Our bars are advanced by the batch itself and need no monitor to refresh them, provided every
    advance draws them (``miniters=1, mininterval=0`` in :class:`RunProgress`): tqdm's automatic
    ``miniters`` grows in a burst of quick runs and, with no monitor to reset it, then held the bar
    still through as many slow runs.
    """

    monitor_interval = 0


class RunProgress:
    """Progress of a batch of runs (a sweep, a tuning study): ``tqdm.auto`` (a widget in Jupyter, a
    bar on stderr elsewhere) that also shows how many runs failed so far; silent when not ``enabled``."""

    def __init__(self, total: int, *, label: str, enabled: bool) -> None:
        self.failed = 0
        self._bar = _RunBar(
            total=total,
            desc=label,
            unit="run",
            disable=not enabled or total == 0,
            miniters=1,  # draw at every finished run: no monitor thread redraws a bar left behind
            mininterval=0,
        )

    def advance(self, *, failed: bool = False) -> None:
        """Record one finished run (``failed`` ones are counted and shown as ``failed=N``)."""
        if failed:
            self.failed += 1
            self._bar.set_postfix(failed=self.failed, refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()


@dataclass(frozen=True, slots=True)
class RunFailure:
    """One sweep run that raised: where in the grid, which seed, what went wrong."""

    point: dict[str, Any]
    seed: int
    error: str


MAX_SWEEP_RUNS = 100_000
"""Most runs one sweep accepts: every row is held in memory until the frame is built (about 3 KB
a row with its summary), and at tens of milliseconds a run this is already hours of work.
Larger studies are several sweeps (split the seeds or the grid) whose files are concatenated."""


class SweepTooLargeError(ConfigurationError):
    """A sweep of more runs than :data:`MAX_SWEEP_RUNS`, refused before any run starts."""


def check_sweep_size(points: int, seeds: int) -> None:
    """Raise :class:`SweepTooLargeError` if ``points x seeds`` runs exceed :data:`MAX_SWEEP_RUNS`."""
    runs = points * seeds
    if runs > MAX_SWEEP_RUNS:
        most_seeds = MAX_SWEEP_RUNS // max(points, 1)
        raise SweepTooLargeError(
            f"{points:,} grid point(s) x {seeds:,} seed(s) = {runs:,} runs; a sweep holds at most "
            f"{MAX_SWEEP_RUNS:,} runs in memory (with {points:,} point(s): at most {most_seeds:,} seeds). "
            "Split it into several sweeps."
        )


class SweepError(AiqsimError, RuntimeError):
    """Some runs failed. ``failures`` says which; ``results`` holds the rows of the runs that worked."""

    def __init__(self, failures: list[RunFailure], results: pd.DataFrame) -> None:
        lines = [f"  {f.point} seed={f.seed}: {f.error}" for f in failures[:10]]
        more = f"\n  ... and {len(failures) - 10} more" if len(failures) > 10 else ""
        super().__init__(f"{len(failures)} sweep run(s) failed:\n" + "\n".join(lines) + more)
        self.failures = failures
        self.results = results


Outcomes = dict[tuple[int, int], tuple[dict[str, Any] | None, str | None]]
"""(grid point index, seed) -> (row, None) for a run that worked, (None, error) for one that failed."""


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) stopped a sweep: ``results`` holds the rows of the runs that finished and
    worked before it, ``finished`` how many runs had finished (failed ones too), ``total`` how many
    were asked for. A ``KeyboardInterrupt``, outside the :class:`AiqsimError` tree (see
    :mod:`aiqsim.errors`), so code that stops on Ctrl-C still stops and no ``except Exception``
    carries on past it; ``aiqsim sweep`` writes ``results`` to ``OUT.partial.csv``."""

    def __init__(self, results: pd.DataFrame, finished: int, total: int) -> None:
        super().__init__(f"interrupted after {finished} of {total} sweep run(s)")
        self.results = results
        self.finished = finished
        self.total = total


def grid_size(grid: Mapping[str, Sequence[Any]]) -> int:
    """How many points the grid has (the product of its value counts), without building them."""
    size = 1
    for values in grid.values():
        size *= len(values) if isinstance(values, Sized) and not isinstance(values, str | bytes) else 1
    return size


def grid_points(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """The cartesian product of the grid, in the order the keys and values were given."""
    for key, values in grid.items():
        if isinstance(values, str | bytes) or not isinstance(values, Iterable):
            raise ConfigurationError(f"grid[{key!r}] must be a list of values, got {values!r}")
        if len(list(values)) == 0:
            raise ConfigurationError(f"grid[{key!r}] is empty")
    keys = list(grid)
    return [
        dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(list(grid[k]) for k in keys))
    ]


def run_point(scenario: Scenario, point: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """One sweep row: the point's values, the seed, and every summary key of the run."""
    from aiqsim.sim.simulate import simulate

    result = simulate(scenario, seed=seed, overrides=dict(point) or None)
    return {**point, "seed": seed, **result.summary}


def _safe_run(
    scenario: Scenario, point: dict[str, Any], seed: int
) -> tuple[dict[str, Any] | None, str | None]:
    try:
        return run_point(scenario, point, seed), None
    except Exception as error:  # reported with its point and seed, never swallowed
        return None, f"{type(error).__name__}: {error}"


def safe_run(
    scenario: Scenario, point: dict[str, Any], seed: int
) -> tuple[dict[str, Any] | None, str | None]:
    """:func:`run_point`, its error caught: ``(row, None)`` or ``(None, "Type: message")`` — what a
    sweep's workers send back (and a tuning run's, :mod:`aiqsim.lab.tune`), so that one failing run
    never ends the others."""
    return _safe_run(scenario, point, seed)


def _check_stores(scenario: Scenario, points: list[dict[str, Any]], seeds: int) -> None:
    """Refuse a sweep whose runs would share a ``store.path``
    (:func:`~aiqsim.sim.preflight.check_store_unshared`), before the first run starts.

    Each point is resolved only when a store path is in play (set in the scenario, or a swept ``store``
    key), so the common sweep of an in-memory or temporary store parses nothing more.
    """
    from aiqsim.sim.preflight import check_store_unshared
    from aiqsim.sim.scenario import split_key_path
    from aiqsim.sim.simulate import resolve_scenario

    swept_store = any(split_key_path(key)[0] == "store" for point in points[:1] for key in point)
    if scenario.store.path is None and not swept_store:
        return
    if not swept_store:
        check_store_unshared([(scenario, len(points) * seeds)], what="sweep runs")
        return
    check_store_unshared(((resolve_scenario(scenario, point), seeds) for point in points), what="sweep runs")


def check_dask_address(address: str, *, label: str = "address") -> None:
    """Raise :class:`ConfigurationError` (naming ``label``) if ``address`` cannot name a Dask scheduler.

    Checked before any work: ``dask.distributed`` would otherwise refuse an unknown scheme
    (``bogus://x``) with a raw ``ValueError`` only when the runs start. Whether a scheduler
    answers there is not checked (that needs a connection attempt; the engine reports it).
    """
    try:
        from distributed.comm.addressing import parse_address, parse_host_port
        from distributed.comm.registry import get_backend
    except ImportError:  # the dask engine itself says that dask is not installed
        return
    try:
        scheme, location = parse_address(address)
        get_backend(scheme)
        # a network address needs a host and a port (tcp://HOST:PORT)
        port = parse_host_port(location)[1] if location and scheme != "inproc" else None
    except ValueError as error:
        raise ConfigurationError(f"{label} {address}: {error} (expected e.g. tcp://HOST:PORT)") from None
    if port is not None and not 0 < port < 65536:
        raise ConfigurationError(f"{label} {address}: port {port} is not a TCP port (1-65535)")
    if not location:
        raise ConfigurationError(f"{label} {address}: expected e.g. tcp://HOST:PORT, got no host")


def sweep(
    scenario: Scenario | str | Path,
    grid: Mapping[str, Sequence[Any]],
    seeds: Iterable[int] = range(1),
    *,
    engine: str = "local",
    workers: int | None = None,
    address: str | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Run ``scenario`` at every grid point for every seed; one DataFrame row per run.

    ``grid`` maps dotted scenario keys to the values to try, e.g.
    ``{"retry.base_s": [0.1, 0.5, 2.0], "dispatch.policy": ["fifo", "sjf"]}``.
    ``engine="local"`` uses ``workers`` processes (all cores by default), ``"serial"`` runs in
    this process, ``"dask"`` submits to the ``dask.distributed`` scheduler at ``address`` (or a
    new LocalCluster). Raises :class:`SweepError` listing the failed (point, seed) pairs, and
    :class:`SweepInterrupted` (a ``KeyboardInterrupt``) with the finished rows on Ctrl-C.
    """
    from aiqsim.sim.scenario import load_scenario

    if engine not in ENGINES:
        raise ConfigurationError(f"unknown engine {engine!r}; expected one of {ENGINES}")
    if not isinstance(scenario, Scenario):
        from aiqsim.sim.simulate import checked_scenario_path

        scenario = load_scenario(checked_scenario_path(scenario))
    if grid is not None and not isinstance(grid, Mapping):
        raise ConfigurationError(
            "grid: expected a mapping of dotted keys to lists of values "
            f"(e.g. {{'retry.max_attempts': [1, 3]}}), got {grid!r}"
        )
    if isinstance(seeds, str | bytes) or not isinstance(seeds, Iterable):
        raise ConfigurationError(
            f"seeds: expected an iterable of integer seeds (e.g. range(5)), got {seeds!r}"
        )
    size = grid_size(grid) if grid else 1
    if isinstance(seeds, Sized):
        check_sweep_size(size, len(seeds))
    seeds = list(itertools.islice(seeds, MAX_SWEEP_RUNS // max(size, 1) + 1))  # never an endless list
    check_sweep_size(size, len(seeds))
    bad = [
        seed for seed in seeds if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0
    ]
    if bad:
        raise ConfigurationError(f"seeds: expected integers >= 0, got {bad[0]!r}")
    points = grid_points(grid) if grid else [{}]
    _check_stores(scenario, points, len(seeds))
    jobs = [(index, point, int(seed)) for index, point in enumerate(points) for seed in seeds]
    if not jobs:
        raise ConfigurationError("nothing to run: no seeds given")
    bar = RunProgress(len(jobs), label=f"sweep {scenario.name}", enabled=progress)
    outcomes: Outcomes = {}
    try:
        if engine == "serial":
            for index, point, seed in jobs:
                outcomes[(index, seed)] = _safe_run(scenario, point, seed)
                bar.advance(failed=outcomes[(index, seed)][1] is not None)
        elif engine == "local":
            _run_locally(scenario, jobs, outcomes, workers=workers, bar=bar)
        else:
            _run_on_dask(scenario, jobs, outcomes, address=address, workers=workers, bar=bar)
    except KeyboardInterrupt:  # keep what finished: hours of runs are not thrown away by one Ctrl-C
        bar.close()
        raise SweepInterrupted(_rows(jobs, outcomes)[0], len(outcomes), len(jobs)) from None
    bar.close()
    frame, failures = _rows(jobs, outcomes)
    if failures:
        raise SweepError(failures, frame)
    return frame


def _rows(
    jobs: list[tuple[int, dict[str, Any], int]], outcomes: Outcomes
) -> tuple[pd.DataFrame, list[RunFailure]]:
    """The rows of the runs in ``outcomes`` that worked, in ``jobs`` order, and the failures; a run
    not (yet) in ``outcomes`` is in neither."""
    rows, failures = [], []
    for index, point, seed in jobs:
        if (index, seed) not in outcomes:
            continue
        row, error = outcomes[(index, seed)]
        if error is not None:
            failures.append(RunFailure(point=point, seed=seed, error=error))
        else:
            rows.append(row)
    return pd.DataFrame(rows), failures


def _run_locally(
    scenario: Scenario,
    jobs: list[tuple[int, dict[str, Any], int]],
    outcomes: Outcomes,
    *,
    workers: int | None,
    bar: RunProgress,
) -> None:
    """Run ``jobs`` in worker processes, filling ``outcomes`` as each finishes.

    The workers ignore SIGINT: a Ctrl-C at a terminal (sent to the whole process group) reaches
    this process only, which then cancels the queued runs and stops the workers at once (leaving
    the pool to finish them would run the whole rest of the sweep before the interrupt was seen).
    """
    count = workers or os.cpu_count() or 1
    with ProcessPoolExecutor(max_workers=min(count, len(jobs)), initializer=_ignore_interrupts) as pool:
        futures = {
            pool.submit(_safe_run, scenario, point, seed): (index, seed) for index, point, seed in jobs
        }
        try:
            for future in as_completed(futures):
                outcomes[futures[future]] = future.result()
                bar.advance(failed=outcomes[futures[future]][1] is not None)
        except KeyboardInterrupt:
            _stop_pool(pool)
            raise


def _ignore_interrupts() -> None:
    """A sweep worker's initializer: leave SIGINT to the parent process (see :func:`_run_locally`)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked worker may inherit a handler that would keep it


def _stop_pool(pool: ProcessPoolExecutor) -> None:
    """Cancel ``pool``'s queued runs and end the runs in progress (their rows would be lost anyway).

    The worker processes are taken before ``shutdown``, which forgets them (``_processes`` is set
    to None): read after it, nothing was terminated and Ctrl-C waited for every run in progress
    to end (14.5 s in the review's case; hours for long runs). No public way to stop them before
    Python 3.14."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)  # shutdown forgets it too
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(timeout=TERMINATE_GRACE_S)
        if process.is_alive():  # SIGTERM can be caught (a forked worker inherits its parent's handlers)
            process.kill()
            process.join(timeout=STOP_TIMEOUT_S)
    if manager is not None:
        # Its end is waited for here: left running, it closed its wake-up pipe while the interpreter's
        # exit hook wrote to it (CPython 3.11 does not lock the two), and a Ctrl-C printed
        # "OSError: [Errno 9] Bad file descriptor" from concurrent.futures at exit under load.
        manager.join(timeout=STOP_TIMEOUT_S)


TERMINATE_GRACE_S = 5.0
"""How long a terminated (SIGTERM) sweep worker is given to end before it is killed (SIGKILL)."""
STOP_TIMEOUT_S = 30.0
"""How long a Ctrl-C waits for each terminated worker and for the pool's manager thread to end."""


def _run_on_dask(
    scenario: Scenario,
    jobs: list[tuple[int, dict[str, Any], int]],
    outcomes: Outcomes,
    *,
    address: str | None,
    workers: int | None,
    bar: RunProgress,
) -> None:
    try:
        from dask.distributed import Client
        from dask.distributed import as_completed as dask_completed

        from aiqsim.sim.dask_cluster import local_dask_cluster, mark_cluster_closing
    except ImportError as error:  # pragma: no cover - depends on the install
        raise RuntimeError("engine='dask' needs dask[distributed]: pip install 'aiqsim[dask]'") from error
    cluster = None
    if address is None:
        cluster = local_dask_cluster(workers)
        client = Client(cluster)
    else:
        client = Client(address, timeout=DASK_CONNECT_TIMEOUT_S)
    try:
        scattered = client.scatter(scenario, broadcast=True)
        futures = {
            client.submit(_safe_run, scattered, point, seed, pure=False): (index, seed)
            for index, point, seed in jobs
        }
        for future in dask_completed(futures):
            outcomes[futures[future]] = future.result()
            bar.advance(failed=outcomes[futures[future]][1] is not None)
    finally:
        if cluster is not None:  # our own cluster: its workers are told it is closing (quiet heartbeats)
            with contextlib.suppress(Exception):
                client.run(mark_cluster_closing, on_error="ignore")
        client.close()
        if cluster is not None:
            cluster.close()
