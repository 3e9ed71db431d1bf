"""Crash at every store write: run a user's async scenario once per crash point and seed.

A *scenario* is the user's own code for one process life::

    async def scenario(life: Life) -> None:
        for n in range(5):
            life.submit("llm", {"input": f"doc-{n}"}, task_id=f"t{n}")
        await life.join()

:meth:`CrashDriver.run` first runs it without a crash to count the store writes it makes, then
once per crash point ``k`` (every one, or a seeded sample) and seed: the real
:class:`~aiqsim.scheduler.Scheduler` runs on a :class:`~aiqsim.runtime.SimPyRuntime` (virtual
clock, so each case takes milliseconds) against the user's providers, with the store wrapped in
:class:`~aiqsim.sim.crash.CrashingStore` -- the one crash injector the simulation lab uses too.
Each write ``k`` gives two crash points: right after it (``k``), and right before it (``bk``:
everything since write ``k-1`` happened -- the provider charged, the user's code did its side
effect -- but write ``k`` never lands); and each side effect ``n`` the user's code records gives
one more (``en``: right after it, before its next statement). There the process dies (every
coroutine of the scheduler and of the scenario stops; a durable store is closed), and after
``restart_after_s`` a new life starts: a new
scheduler on the same store calls ``recover()`` and then the scenario again, as a restarted
worker would run its ``main``. With ``CrashOptions(second_crashes=...)`` that life dies too, at a
store write of its own (``k+m`` / ``k+bm``: inside ``recover()`` or after it), and a third life
recovers from both. When the scenario's last life has finished, the invariants of
:mod:`aiqsim.testing.invariants` are checked. A broken one raises
:class:`~aiqsim.testing.invariants.InvariantViolation` naming the key, the seed and the crash
point, and the option that re-runs exactly that case (``--aiqsim-replay SEED:POINT``, POINT
``k``, ``bk`` or ``en``, then ``+m`` or ``+bm`` for a second crash).

The providers are built once per case and live through the crash: they are the servers, which
do not die with the client. What they *did* (the ground truth for "executed at most once") comes
from two places: every ``ok`` execution of the :class:`~aiqsim.sim.providers.SimulatedProvider`
s made with :meth:`CrashWorld.simulated_provider`, and every side effect the user's own code
records with :meth:`CrashWorld.effects` ``.record(key)``.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiqsim.core.errors import ConfigurationError, SchedulingError
from aiqsim.core.failures import describe_error
from aiqsim.core.job import JobRecord
from aiqsim.core.task import TaskRecord, TaskStatus
from aiqsim.runtime.protocol import Cancelled
from aiqsim.runtime.simpy_runtime import SimPyRuntime
from aiqsim.scheduler.events import TaskTransition
from aiqsim.scheduler.job_events import JobTransition, StageEvent
from aiqsim.scheduler.provider import Provider
from aiqsim.scheduler.scheduler import RecoveryReport, Scheduler, Submission
from aiqsim.sim.crash import CrashingStore, SimulatedCrash
from aiqsim.sim.providers import ProviderLedger, SimulatedProvider
from aiqsim.stores.base import TaskStore
from aiqsim.testing import invariants
from aiqsim.testing.invariants import InvariantViolation
from aiqsim.testing.options import CrashCase, CrashOptions, select_crash_points, select_second_crashes
from aiqsim.testing.stores import StoreFactory

if TYPE_CHECKING:
    from aiqsim.scheduler.jobs import JobHandle, JobSpec

__all__ = [
    "CrashDriver",
    "CrashOutcome",
    "CrashReport",
    "CrashWorld",
    "Effect",
    "EffectLog",
    "Life",
    "ScenarioFailedError",
]

Scenario = Callable[["Life"], Awaitable[None]]
"""The user's code for one process life."""

ProvidersFactory = Callable[["CrashWorld"], Iterable[Provider]]
"""Builds the providers (the servers) of one case; called once per case, they survive its crash."""


class ScenarioFailedError(SchedulingError, RuntimeError):
    """The user's scenario (or ``recover()`` in a restarted life) raised: the case could not run to
    its end. The message names the seed, the crash point, the life and the replay option; the
    user's own exception is chained (``__cause__``), with its traceback."""


@dataclass(frozen=True, slots=True)
class Effect:
    """One side effect the user's code did for ``key`` at virtual time ``at``, in process life ``life``."""

    key: str
    at: float
    life: int
    what: str = "call"


class EffectLog:
    """The side effects that must happen at most once per key (a charge, an e-mail, a billed call).

    The user's provider function calls :meth:`record` at the moment the effect becomes real; the
    driver counts them per key after the case.
    """

    def __init__(self, world: CrashWorld) -> None:
        self._world = world
        self.entries: list[Effect] = []

    def record(self, key: str, what: str = "call") -> None:
        """Note that the effect for ``key`` happened now. In the crash case of this effect the
        process dies right here (:class:`~aiqsim.sim.crash.SimulatedCrash` is raised)."""
        self.entries.append(Effect(str(key), self._world.runtime.now(), self._world.life, what))
        if self._world.on_effect is not None:
            self._world.on_effect(len(self.entries))

    def count(self, key: str) -> int:
        """How many times the effect for ``key`` happened."""
        return sum(1 for entry in self.entries if entry.key == key)

    def __len__(self) -> int:
        return len(self.entries)


class CrashWorld:
    """What one crash case shares across its process lives: the runtime (one virtual clock), the
    seed, the providers' ledgers and the side-effect log."""

    def __init__(self, case: CrashCase, runtime: SimPyRuntime) -> None:
        self.case = case
        self.seed = case.seed
        self.runtime = runtime
        self.life = 0
        """The process life now running (0 before the first crash)."""
        self.effects = EffectLog(self)
        self.provider_ledger = ProviderLedger()
        """Shared by every provider made with :meth:`simulated_provider`."""
        self.simulated: list[SimulatedProvider] = []
        self.on_effect: Callable[[int], None] | None = None
        """Called by :meth:`EffectLog.record` with the effect's number (the driver's crash hook)."""

    def rng(self, name: str) -> random.Random:
        """A random stream for ``name`` derived from the case's seed (the same in every life)."""
        return random.Random(f"{self.seed}:{name}")

    def simulated_provider(self, name: str = "llm", **fields: Any) -> SimulatedProvider:
        """A :class:`SimulatedProvider` configured by ``[[providers]]`` keys, recorded in this world's
        ledger (its ``ok`` executions count for "executed at most once")."""
        from aiqsim.testing.providers import simulated_provider

        provider = simulated_provider(
            self.runtime, self.rng(f"provider:{name}"), ledger=self.provider_ledger, name=name, **fields
        )
        self.simulated.append(provider)
        return provider


class Life:
    """One process life of the scenario: its ``scheduler`` (on the crash-wrapped ``store``), its
    ``number`` (0 for the first) and what ``recover()`` found (``recovery``, after a restart)."""

    def __init__(
        self, world: CrashWorld, number: int, scheduler: Scheduler, store: TaskStore, uses_jobs: bool
    ) -> None:
        self.world = world
        self.number = number
        self.scheduler = scheduler
        self.store = store
        self.recovery: RecoveryReport | None = None
        self._uses_jobs = uses_jobs

    @property
    def runtime(self) -> SimPyRuntime:
        """The virtual clock (``await life.runtime.sleep(1.0)`` waits one simulated second)."""
        return self.world.runtime

    @property
    def restarted(self) -> bool:
        """Whether a crash came before this life."""
        return self.number > 0

    def submit(self, kind: str, payload: Any, *, task_id: str, **options: Any) -> Submission | None:
        """``scheduler.submit`` unless the store already has ``task_id`` (from an earlier life).

        Returns the new handle; for a known task, the handle of its resumed run, or ``None`` when it
        already ended. This is how a restartable worker submits: by a stable id, once.
        """
        if self.store.get(task_id) is not None:
            return self.scheduler.submission(task_id)
        return self.scheduler.submit(kind, payload, task_id=task_id, **options)

    def submit_job(self, spec: JobSpec, inputs: Any, *, job_id: str, **options: Any) -> JobHandle | None:
        """``scheduler.submit_job`` unless the store already has ``job_id``; like :meth:`submit`."""
        self._uses_jobs = True
        if self.store.get_job(job_id) is not None:  # type: ignore[attr-defined]
            return self.scheduler.jobs.handle(job_id)
        return self.scheduler.submit_job(spec, inputs, job_id=job_id, **options)

    async def join(self) -> None:
        """Wait until every task (and job) of this life is terminal."""
        await self.scheduler.join()
        if self._uses_jobs:
            await self.scheduler.jobs.join()
            await self.scheduler.join()


@dataclass(frozen=True, slots=True)
class _CrashSnapshot:
    """The store as the dead process left it, and when the next life began."""

    restart_at: float
    finished: dict[str, str]
    tasks: tuple[TaskRecord, ...]
    jobs: tuple[JobRecord, ...]


@dataclass(frozen=True, slots=True)
class CrashOutcome:
    """What one case left behind: the final records, what was submitted, what the providers did."""

    case: CrashCase
    crashed: bool
    writes: int
    tasks: tuple[TaskRecord, ...]
    jobs: tuple[JobRecord, ...]
    submitted: tuple[str, ...]
    submitted_jobs: tuple[str, ...]
    executions: tuple[tuple[str, float], ...]
    """``(key, time)`` of every execution that must happen at most once (checked keys only)."""
    all_executions: tuple[tuple[str, float], ...]
    """``(key, time)`` of every execution the driver saw (effects and simulated ``ok`` calls)."""
    recoveries: tuple[RecoveryReport, ...]
    task_errors: tuple[str, ...]
    snapshot: _CrashSnapshot | None = None
    """The store as the first crash left it (``snapshots`` has one per crash)."""
    details: dict[str, str] = field(default_factory=dict)
    """Key -> what its executions were and in which process lives (for messages)."""
    rebuilt: tuple[StageEvent, ...] = ()
    """Stages whose ``build`` gave other payloads after the restart than before it."""
    effects_after: tuple[int, ...] = ()
    """How many store writes had been made when each recorded side effect happened."""
    snapshots: tuple[_CrashSnapshot, ...] = ()
    """The store as each crash left it, in order (two for a case with a second crash)."""
    writes_at_crashes: tuple[int, ...] = ()
    """How many store writes had been made at each crash."""

    @property
    def restart_writes(self) -> int:
        """Store writes the life after the first crash made (it and any later life), 0 without a crash."""
        return self.writes - self.writes_at_crashes[0] if self.writes_at_crashes else 0

    def executions_per_key(self, *, checked_only: bool = True) -> dict[str, int]:
        """Executions per key (only the keys held to "at most once" by default)."""
        counts: dict[str, int] = {}
        for key, _ in self.executions if checked_only else self.all_executions:
            counts[key] = counts.get(key, 0) + 1
        return counts


@dataclass(frozen=True, slots=True)
class CrashReport:
    """What a :meth:`CrashDriver.run` covered: cases per seed and the writes of each crash-free run."""

    seeds: tuple[int, ...]
    writes_per_seed: dict[int, int]
    cases: int
    crash_points: dict[int, tuple[str, ...]] = field(default_factory=dict)
    """Seed -> the crash points run, as ``--aiqsim-replay`` spells them (``b1``, ``1``, ``e1``, ...)."""
    duplicate_executions: int = 0
    """Executions beyond a key's first, over every case (unchecked keys included)."""
    outcomes: tuple[CrashOutcome, ...] = ()
    """Every case's outcome when the driver was asked to ``keep_outcomes``."""

    def __str__(self) -> str:
        return (
            f"{self.cases} crash cases over seeds {list(self.seeds)} "
            f"(writes per crash-free run: {self.writes_per_seed}); "
            f"{self.duplicate_executions} duplicate executions"
        )


class CrashDriver:
    """Runs a scenario at every crash point of every seed and checks the invariants (module docs).

    Parameters:
        options: seeds, crash-point sample and replay (the pytest fixture takes them from the
            ``--aiqsim-*`` options).
        store: where the store lives (a memory store by default); each case gets a fresh one.
        restart_after_s: virtual seconds between the crash and the restart (> 0).
        horizon_s: a case still running at this virtual time fails (its unfinished tasks are lost).
        label: how a failure message names the test (the pytest node id).
        max_failures: stop after this many failing cases (all are listed; the first in full).
    """

    def __init__(
        self,
        options: CrashOptions | None = None,
        *,
        store: StoreFactory | None = None,
        restart_after_s: float = 1.0,
        horizon_s: float = 86_400.0,
        label: str = "",
        max_failures: int = 5,
    ) -> None:
        if not restart_after_s > 0:
            raise ConfigurationError(f"restart_after_s must be > 0, got {restart_after_s!r}")
        if not horizon_s > 0:
            raise ConfigurationError(f"horizon_s must be > 0, got {horizon_s!r}")
        self.options = options if options is not None else CrashOptions()
        self.store = store
        self.restart_after_s = float(restart_after_s)
        self.horizon_s = float(horizon_s)
        self.label = label
        self.max_failures = max(1, max_failures)
        self._fan_out: dict[tuple[str, str, str], bool] = {}

    # ------------------------------------------------------------------ public API
    def on(self, store: StoreFactory) -> CrashDriver:
        """The same driver on ``store`` (e.g. the ``aiqsim_store`` fixture) instead of a memory store."""
        return CrashDriver(
            self.options,
            store=store,
            restart_after_s=self.restart_after_s,
            horizon_s=self.horizon_s,
            label=self.label,
            max_failures=self.max_failures,
        )

    def run(
        self,
        scenario: Scenario,
        *,
        providers: ProvidersFactory,
        jobs: Iterable[JobSpec] = (),
        scheduler_options: Mapping[str, Any] | None = None,
        recover_options: Mapping[str, Any] | None = None,
        at_most_once: bool | None = None,
        keep_outcomes: bool = False,
    ) -> CrashReport:
        """Run ``scenario`` for every selected case; raise :class:`InvariantViolation` on the first
        broken invariant(s), else return a :class:`CrashReport`.

        ``providers(world)`` builds the providers of a case; ``jobs`` are registered in every life
        before ``recover()``; ``scheduler_options`` are passed to :class:`Scheduler` (quotas, retry,
        ...); ``recover_options`` to ``recover()`` (``requeue_interrupted``, ``use_lookup``).
        ``at_most_once``: ``None`` holds the recorded side effects to "at most once", and a simulated
        provider's calls: all of them when it honours keys; when recovery looks orphans up, no key
        executed both before the crash and after the restart (a retry after a lost response may
        execute a key twice within one life); none without lookup (duplicates are counted in the
        report). ``True``/``False`` hold every execution, or none.
        """
        __tracebackhide__ = True  # pytest shows the user's test line, not the driver's internals
        jobs = tuple(jobs)
        self._fan_out = {
            (spec.name, spec.version, stage.name): stage.fan_out for spec in jobs for stage in spec.stages
        }
        plan = _Plan(
            scenario,
            providers,
            tuple(jobs),
            dict(scheduler_options or {}),
            dict(recover_options or {}),
            at_most_once,
        )
        replay = self.options.replay
        if replay is not None:
            outcome = self._case(plan, replay)
            self._judge([(replay, outcome)], total=None)
            return CrashReport(
                (replay.seed,),
                {replay.seed: outcome.writes},
                1,
                {replay.seed: (replay.point,)},
                _duplicates(outcome),
                (outcome,) if keep_outcomes else (),
            )
        failures: list[tuple[CrashCase, InvariantViolation]] = []
        writes: dict[int, int] = {}
        points: dict[int, tuple[str, ...]] = {}
        kept: list[CrashOutcome] = []
        cases = duplicates = 0
        for seed in self.options.seeds:
            baseline_case = CrashCase(seed, 0)
            baseline = self._case(plan, baseline_case)
            writes[seed] = baseline.writes
            chosen = select_crash_points(baseline.writes, seed, self.options.sample, baseline.effects_after)
            pending = [baseline_case, *chosen]
            taken: list[str] = []
            while pending:
                case = pending.pop(0)
                outcome = baseline if case.crash_point == 0 else self._case(plan, case)
                if case.crash_point:
                    taken.append(case.point)
                cases += 1
                duplicates += _duplicates(outcome)
                if keep_outcomes:
                    kept.append(outcome)
                if case.crash_point and len(outcome.snapshots) < (2 if case.then else 1):
                    failures.append((case, _nondeterministic(case, baseline.writes, outcome.writes)))
                else:
                    try:
                        self._check(outcome)
                    except InvariantViolation as violation:
                        failures.append((case, violation))
                    if case.crash_point and not case.then and self.options.second_crashes:
                        # this case's restarted life, crashed in its turn: right after this case
                        second = select_second_crashes(
                            case, outcome.restart_writes, self.options.second_crashes
                        )
                        pending[:0] = second
                if len(failures) >= self.max_failures:
                    break
            points[seed] = tuple(taken)
            if len(failures) >= self.max_failures:
                break
        if failures:
            raise self._failure(failures, total=cases)
        return CrashReport(tuple(self.options.seeds), writes, cases, points, duplicates, tuple(kept))

    # ------------------------------------------------------------------ one case
    def _case(self, plan: _Plan, case: CrashCase) -> CrashOutcome:
        __tracebackhide__ = True
        runner = _Case(self, plan, case)
        try:
            outcome = runner.execute()
        except (InvariantViolation, ConfigurationError):
            raise
        except Exception as error:
            error.add_note(f"aiqsim crash test: raised in {case}; {self._replay_hint(case)}")
            raise
        if runner.error is not None:
            raise self._scenario_failed(case, runner.error, runner.error_life) from runner.error
        return outcome

    def _scenario_failed(self, case: CrashCase, error: Exception, life: int) -> ScenarioFailedError:
        """The error for a scenario that raised ``error`` in process life ``life`` of ``case``."""
        store = self.store.kind if self.store is not None else "memory"
        where = "after the restart, in recover() or the scenario" if life else "before any crash"
        return ScenarioFailedError(
            f"aiqsim crash test failed at {case} [store: {store}]: the scenario raised in process life "
            f"{life} ({where})\n  {describe_error(error)}\n  {self._replay_hint(case)}"
        )

    def _check(self, outcome: CrashOutcome) -> None:
        invariants.check_all_terminal(outcome.tasks, outcome.jobs)
        invariants.check_none_lost(
            outcome.submitted, outcome.tasks, submitted_jobs=outcome.submitted_jobs, jobs=outcome.jobs
        )
        invariants.check_success_has_result(outcome.tasks, outcome.jobs)
        invariants.check_at_most_once([key for key, _ in outcome.executions], details=outcome.details)
        fan_out = self._fan_out
        invariants.check_job_stages_billed_once(
            outcome.jobs,
            outcome.tasks,
            [key for key, _ in outcome.all_executions],
            fan_out=(lambda job, stage: fan_out.get((job.name, job.version, stage), False))
            if fan_out
            else None,
        )
        for snapshot in outcome.snapshots:
            after = [key for key, at in outcome.all_executions if at >= snapshot.restart_at]
            invariants.check_finished_work_not_rerun(snapshot.finished, after)
            invariants.check_jobs_not_rebilled(snapshot.jobs, snapshot.tasks, after)
        if outcome.rebuilt:
            first = outcome.rebuilt[0]
            raise InvariantViolation(
                "deterministic job builds",
                f"job {first.job_id!r} stage {first.stage!r}: {first.error}",
                [event.job_id for event in outcome.rebuilt],
            )
        if outcome.task_errors:
            raise InvariantViolation(
                "no coroutine error",
                f"a scheduler coroutine raised: {'; '.join(outcome.task_errors[:5])}",
            )

    def _judge(self, results: Sequence[tuple[CrashCase, CrashOutcome]], total: int | None) -> None:
        __tracebackhide__ = True
        failures: list[tuple[CrashCase, InvariantViolation]] = []
        for case, outcome in results:
            if case.crash_point and not outcome.crashed:
                raise ConfigurationError(
                    f"--aiqsim-replay {case.seed}:{case.point}: the run of seed {case.seed} makes only "
                    f"{outcome.writes} store writes and {len(outcome.effects_after)} side effects, so it "
                    f"never reaches crash point {case.point}"
                )
            if case.then and len(outcome.snapshots) < 2:
                raise ConfigurationError(
                    f"--aiqsim-replay {case.seed}:{case.point}: after its first crash the restarted life "
                    f"makes only {outcome.restart_writes} store writes, so it never reaches its second "
                    f"crash (write #{case.then} of that life)"
                )
            try:
                self._check(outcome)
            except InvariantViolation as violation:
                failures.append((case, violation))
        if failures:
            raise self._failure(failures, total=total)

    def _replay_hint(self, case: CrashCase) -> str:
        target = f"pytest '{self.label}' " if self.label else "pytest ... "
        return f"re-run exactly this case: {target}{case.replay_option}"

    def _failure(
        self, failures: Sequence[tuple[CrashCase, InvariantViolation]], total: int | None
    ) -> InvariantViolation:
        case, first = failures[0]
        store = self.store.kind if self.store is not None else "memory"
        lines = [
            f"aiqsim crash test failed at {case} [store: {store}]",
            f"  {first.rule}: {first}",
            f"  {self._replay_hint(case)}",
        ]
        if len(failures) > 1:
            others = ", ".join(f"{c.seed}:{c.point}" for c, _ in failures[1:])
            lines.append(
                f"  also failing (SEED:POINT; bK: before write K, eN: after side effect N): {others}"
            )
        if total is not None:
            lines.append(f"  ({len(failures)} failing of {total} cases run)")
        violation = InvariantViolation(first.rule, "\n".join(lines), first.offenders)
        violation.case = case  # type: ignore[attr-defined]
        return violation


@dataclass(frozen=True, slots=True)
class _Plan:
    """What the user gave :meth:`CrashDriver.run`, the same for every case."""

    scenario: Scenario
    providers: ProvidersFactory
    jobs: tuple[JobSpec, ...]
    scheduler_options: dict[str, Any]
    recover_options: dict[str, Any]
    at_most_once: bool | None


def _jobs_of(store: TaskStore) -> tuple[JobRecord, ...]:
    """Every job record in ``store`` (none when it keeps no job table)."""
    from aiqsim.scheduler.jobs import keeps_jobs

    return tuple(store.list_jobs()) if keeps_jobs(store) else ()  # type: ignore[attr-defined]


def _duplicates(outcome: CrashOutcome) -> int:
    return sum(n - 1 for n in outcome.executions_per_key(checked_only=False).values() if n > 1)


def _nondeterministic(case: CrashCase, baseline: int, writes: int) -> InvariantViolation:
    return InvariantViolation(
        "deterministic",
        f"the crash-free run of seed {case.seed} made {baseline} store writes, but this run stopped after "
        f"{writes} without reaching crash point {case.point}: the scenario is not deterministic (a global "
        "random, a wall clock, iteration over a set?) so its crash cases cannot be enumerated or replayed",
    )


class _Case:
    """One case: the process lives, the crash, the restart, and what was left in the store."""

    def __init__(self, driver: CrashDriver, plan: _Plan, case: CrashCase) -> None:
        self.driver = driver
        self.plan = plan
        self.case = case
        self.runtime = SimPyRuntime()
        self.world = CrashWorld(case, self.runtime)
        self.providers = list(plan.providers(self.world))
        base = driver.store if driver.store is not None else StoreFactory("memory", Path("."))
        self.factory = base.fresh(f"s{case.seed}_k{case.point}")
        self.counter = [0]
        at_write = case.crash_point and not (case.before or case.effect)
        self.crash_points = {case.crash_point} if at_write else set()
        self.crash_before = {case.crash_point} if case.before else set()
        self.crash_effect = case.crash_point if case.effect else 0
        self.effects_after: list[int] = []
        self.world.on_effect = self._effect_recorded
        self.store: CrashingStore | None = None
        self.submitted: list[str] = []
        self.submitted_jobs: list[str] = []
        self.rebuilt: list[StageEvent] = []
        self.recoveries: list[RecoveryReport] = []
        self.crashed = False
        self.snapshots: list[_CrashSnapshot] = []
        self.writes_at_crashes: list[int] = []
        self.raw: TaskStore | None = None
        self.raw_open = False
        self.scheduler: Scheduler | None = None
        self.ended: Any = None
        self.error: Exception | None = None
        """What the scenario (or recover()) raised, which ended the case."""
        self.error_life = 0
        user_events = plan.scheduler_options.get("events")
        self.user_events: Callable[[Any], None] | None = user_events

    def _event(self, event: Any) -> None:
        if isinstance(event, TaskTransition) and event.old is None:
            self.submitted.append(event.task_id)
        elif isinstance(event, JobTransition) and event.old is None:
            self.submitted_jobs.append(event.job_id)
        elif isinstance(event, StageEvent) and event.event == "rebuilt_differently":
            self.rebuilt.append(event)
        if self.user_events is not None:
            self.user_events(event)

    def _effect_recorded(self, number: int) -> None:
        """Note after how many writes side effect ``number`` came; die right here if it is this
        case's crash point (the store is dead from now on, as after a crash at a write)."""
        self.effects_after.append(self.counter[0])
        if number != self.crash_effect or self.store is None or self.store.dead:
            return
        self.store.dead = True
        self._on_crash()
        raise SimulatedCrash(f"crash right after side effect #{number}")

    def _on_crash(self) -> None:
        self.crashed = True
        self.writes_at_crashes.append(self.counter[0])
        assert self.scheduler is not None
        self.scheduler.crash()
        if not self.ended.done():
            self.ended.set_result("crash")

    def _new_life(self, number: int) -> tuple[Scheduler, CrashingStore]:
        self.raw = self.factory.open()
        self.raw_open = True
        store = CrashingStore(
            self.raw,
            counter=self.counter,
            crash_points=self.crash_points,
            crash_before=self.crash_before,
            on_crash=self._on_crash,
        )
        options = {k: v for k, v in self.plan.scheduler_options.items() if k != "events"}
        scheduler = Scheduler(
            self.runtime,
            self.providers,
            store=store,  # type: ignore[arg-type]
            rng=random.Random(f"{self.case.seed}:scheduler:{number}"),
            events=self._event,
            **options,
        )
        if self.plan.jobs:  # registered before recover(), so it can re-drive the stored jobs
            from aiqsim.scheduler.jobs import Jobs

            Jobs(scheduler, specs=self.plan.jobs)
        self.scheduler = scheduler
        self.store = store
        return scheduler, store

    async def _life(self, life: Life) -> None:
        try:
            if life.restarted:
                life.recovery = await life.scheduler.recover(**self.plan.recover_options)
                self.recoveries.append(life.recovery)
            await self.plan.scenario(life)
            await life.join()
            if not self.ended.done():
                self.ended.set_result("done")
        except SimulatedCrash:
            pass  # the process died inside this life's own call; _on_crash has said so
        except Exception as error:  # the user's code raised: the case ends, the driver reports it
            self.error, self.error_life = error, life.number
            if not self.ended.done():
                self.ended.set_result("raised")

    async def _main(self) -> None:
        runtime = self.runtime
        number = 0
        while True:
            self.world.life = number
            scheduler, store = self._new_life(number)
            self.ended = runtime.create_future()
            life = Life(self.world, number, scheduler, store, bool(self.plan.jobs))
            task = runtime.spawn(self._life(life), name=f"life-{number}")
            how = await self.ended
            if how == "raised":
                scheduler.crash()  # stop this life's coroutines; the driver raises the error
                return
            if how == "done" and not self.crashed:
                await scheduler.close(cancel_pending=False)
                return
            task.cancel()
            self._take_snapshot(runtime.now())
            if self.factory.durable and self.raw is not None:
                self.raw.close()
                self.raw_open = False
            await runtime.sleep(self.driver.restart_after_s)
            self.crashed = False
            number += 1
            if number == 1 and self.case.then:  # the restarted life dies too: at its then-th write
                target = self.counter[0] + self.case.then
                (self.crash_before if self.case.then_before else self.crash_points).add(target)

    def _take_snapshot(self, now: float) -> None:
        raw = self.raw
        assert raw is not None
        tasks = tuple(raw.list_by_status())
        jobs = _jobs_of(raw)
        finished = {t.key: t.id for t in tasks if t.status is TaskStatus.SUCCEEDED}
        self.snapshots.append(_CrashSnapshot(now + self.driver.restart_after_s, finished, tasks, jobs))

    def _rule(self, provider: str) -> str:
        """How the ``ok`` calls of simulated provider ``provider`` are held to "at most once".

        ``"all"``: every execution (the provider honours keys: a repeat is answered from its
        record, never executed again). ``"across_crash"``: recovery looks the orphans up, so no key
        may be executed in two process lives (before a crash and after the restart that followed
        it); a retry within one life after a lost response may still execute a key twice, as with
        any provider that ignores keys.
        ``"none"``: without lookup an orphan is failed (and a later submission of its key pays
        again, as documented) or re-sent blindly: duplicates are only counted.
        """
        if self.plan.at_most_once is not None:
            return "all" if self.plan.at_most_once else "none"
        config = next(p.config for p in self.world.simulated if p.name == provider)
        if config.honours_idempotency:
            return "all"
        use_lookup = bool(self.plan.recover_options.get("use_lookup", True))
        return "across_crash" if config.supports_lookup and use_lookup else "none"

    def _checked_calls(self, calls: Sequence[tuple[str, str, float]]) -> list[tuple[str, float]]:
        """The ``(key, start)`` of the simulated calls held to "at most once" (see :meth:`_rule`);
        for ``across_crash``, the first call of each process life, per key called in two or more."""
        checked: list[tuple[str, float]] = []
        restarts = [snapshot.restart_at for snapshot in self.snapshots]
        lives: dict[str, dict[int, float]] = {}
        for provider, key, at in calls:
            rule = self._rule(provider)
            if rule == "all":
                checked.append((key, at))
            elif rule == "across_crash" and restarts:
                life = sum(1 for restart_at in restarts if at >= restart_at)
                lives.setdefault(key, {}).setdefault(life, at)
        for key, first_calls in lives.items():
            if len(first_calls) > 1:
                checked += [(key, at) for at in first_calls.values()]
        return checked

    def execute(self) -> CrashOutcome:
        try:
            self.runtime.run(self._main(), until=self.driver.horizon_s)
        except Cancelled:
            pass  # cut at the horizon: whatever is not terminal is reported
        if not self.raw_open:
            self.raw = self.factory.open()
        raw = self.raw
        assert raw is not None
        try:
            tasks = tuple(raw.list_by_status())
            jobs = _jobs_of(raw)
        finally:
            if self.factory.durable:
                raw.close()
            self.factory.cleanup()
        effects = [(e.key, e.at) for e in self.world.effects.entries]
        calls = [
            (e.provider, e.key, e.start) for e in self.world.provider_ledger.executions if e.outcome == "ok"
        ]
        checked = [] if self.plan.at_most_once is False else list(effects)
        checked += self._checked_calls(calls)
        errors = tuple(
            f"{name}: {describe_error(error)}"
            for name, error in self.runtime.task_errors
            if not isinstance(error, SimulatedCrash | Cancelled)
        )
        details: dict[str, list[str]] = {}
        for effect in self.world.effects.entries:
            details.setdefault(effect.key, []).append(
                f"{effect.what} at t={effect.at:g}s in life {effect.life}"
            )
        for provider, key, at in calls:
            details.setdefault(key, []).append(f"{provider} call started at t={at:g}s")
        return CrashOutcome(
            details={key: "; ".join(texts) for key, texts in details.items()},
            case=self.case,
            crashed=bool(self.snapshots),
            writes=self.counter[0],
            tasks=tasks,
            jobs=jobs,
            submitted=tuple(self.submitted),
            submitted_jobs=tuple(self.submitted_jobs),
            executions=tuple(checked),
            all_executions=tuple(effects + [(key, at) for _, key, at in calls]),
            recoveries=tuple(self.recoveries),
            task_errors=errors,
            snapshot=self.snapshots[0] if self.snapshots else None,
            snapshots=tuple(self.snapshots),
            writes_at_crashes=tuple(self.writes_at_crashes),
            rebuilt=tuple(self.rebuilt),
            effects_after=tuple(self.effects_after),
        )
