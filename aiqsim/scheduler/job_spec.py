"""What a job is: a named, versioned pipeline (:class:`JobSpec`) of :class:`Stage` s, checked when
it is defined.

A spec is pure data plus the plain functions that build each stage's payload; its canonical
identity (every stage's definition, functions by qualified name) is part of every job key. Running
a job is :mod:`aiqsim.scheduler.jobs`' business.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.fingerprint import fingerprint
from aiqsim.scheduler.arguments import UnknownNameError
from aiqsim.scheduler.retry import RetryPolicy

BuildFn = Callable[[Mapping[str, Any], Mapping[str, Any]], Any]
"""``build(inputs, results) -> payload`` (a list of payloads for a fan-out stage)."""

CostFn = Callable[[Any], float]
"""``cost(payload) -> units`` for the quota (e.g. tokens, characters)."""


class JobSpecError(ConfigurationError):
    """A job spec that cannot run (unknown stage in ``after``, a cycle, an unknown provider...)."""


DEFAULT_MAX_FAN_OUT = 10_000
"""How many tasks one fan-out stage may run unless its :attr:`Stage.max_fan_out` says otherwise.

A build that returned ten million elements made ``submit_job`` build ten million tasks (a projected
twenty minutes and 14 GiB) before it returned: a fan-out above its stage's cap is refused instead."""


class FanOutLimitError(JobSpecError):
    """A fan-out stage's build gave more elements than its :attr:`Stage.max_fan_out`: no task of
    the stage was submitted, and the job fails at that stage saying so."""

    def __init__(self, stage: str, size: int | None, limit: int) -> None:
        told = (
            f"{size:,} elements"
            if size is not None
            else f"more than {limit:,} elements (an iterator, read no further)"
        )
        super().__init__(
            f"stage {stage!r}: a fan-out of {told} is above its max_fan_out of {limit:,}; split the "
            "work into several jobs, or give the stage a larger Stage(max_fan_out=...)"
        )
        self.stage = stage
        self.size = size
        self.limit = limit

    def __reduce__(self) -> tuple[type[FanOutLimitError], tuple[str, int | None, int]]:
        return type(self), (self.stage, self.size, self.limit)  # picklable across processes


def _callable_identity(fn: Callable[..., Any] | None) -> str | None:
    """``module.qualname`` of a function: what a job key knows of code it cannot hash."""
    if fn is None:
        return None
    module = getattr(fn, "__module__", None) or "?"
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}.{name}"


def _checked_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise JobSpecError(f"{what} must be a non-empty string, got {value!r}")
    return value


@dataclass(frozen=True)
class Stage:
    """One step of a job: a call to ``provider`` whose payload ``build`` makes from earlier results.

    Parameters:
        name: unique within the job; the key of its result.
        provider: the scheduler provider (lane) that serves it.
        after: names of the stages whose results it needs; it starts when they all succeeded.
        build: ``build(inputs, results) -> payload``, where ``results`` maps each finished
            stage's name to its result. Default: the job's inputs. A plain, deterministic function
            of its arguments (it runs again when a job is re-driven after a crash).
        fan_out: ``build`` returns a list (or an iterator); one task per element, result is the
            list of results.
        max_fan_out: the most elements a fan-out build may give (:data:`DEFAULT_MAX_FAN_OUT` by
            default): more fails the job at this stage with :class:`FanOutLimitError`, before any
            of its tasks is submitted (an iterator is read no further than one element past it).
        cost: the quota cost of one call (a number, or ``cost(payload)``); default: the
            provider's own estimate, else 0.
        kind: the task kind (part of the stage task's key); default: ``provider``.
        version: model/engine version, part of the stage task's key.
        fallback: what to run for a failed call (fatal, poison or out of retries): the name of
            another provider (same payload), or a :class:`Stage` (its ``provider``, ``kind``,
            ``cost``, ``version``; its ``build``, if given, replaces the payload -- for a fan-out
            stage it must return a list as long as the primary's). ``after``/``fan_out`` of a
            fallback stage are ignored.
        retry: this stage's retry policy (e.g. fewer attempts before the fallback); default: the
            scheduler's. Held in this process only: a stage task that ``recover()`` resumes from
            the store runs under the scheduler's policy.
    """

    name: str
    provider: str
    after: tuple[str, ...] = ()
    build: BuildFn | None = None
    fan_out: bool = False
    cost: float | CostFn | None = None
    kind: str | None = None
    version: str = ""
    fallback: Stage | str | None = None
    retry: RetryPolicy | None = None
    max_fan_out: int = DEFAULT_MAX_FAN_OUT

    def __post_init__(self) -> None:
        _checked_name(self.name, "Stage name")
        _checked_name(self.provider, f"stage {self.name!r}: provider")
        after = (self.after,) if isinstance(self.after, str) else self.after
        if not isinstance(after, list | tuple) or not all(isinstance(name, str) for name in after):
            raise JobSpecError(
                f"stage {self.name!r}: after must be a stage name or a list of names, got {self.after!r}"
            )
        object.__setattr__(self, "after", tuple(after))
        if not isinstance(self.fan_out, bool):
            raise JobSpecError(f"stage {self.name!r}: fan_out must be True or False, got {self.fan_out!r}")
        if (
            isinstance(self.max_fan_out, bool)
            or not isinstance(self.max_fan_out, int)
            or self.max_fan_out < 1
        ):
            raise JobSpecError(
                f"stage {self.name!r}: max_fan_out must be a whole number >= 1, got {self.max_fan_out!r}"
            )
        if self.kind is not None:
            _checked_name(self.kind, f"stage {self.name!r}: kind")
        if self.build is not None and not callable(self.build):
            raise JobSpecError(f"stage {self.name!r}: build must be callable, got {self.build!r}")
        cost = self.cost
        if (cost is not None and not callable(cost)) and (
            isinstance(cost, bool) or not isinstance(cost, int | float) or not 0 <= cost < math.inf
        ):
            raise JobSpecError(
                f"stage {self.name!r}: cost must be a finite number >= 0 or a callable, got {cost!r}"
            )
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            # refused here, not when the stage's tasks are submitted (after the earlier stages' calls)
            raise JobSpecError(
                f"stage {self.name!r}: retry must be a RetryPolicy or None, got {self.retry!r}"
            )
        fallback = self.fallback
        if fallback is not None and not isinstance(fallback, Stage | str):
            raise JobSpecError(f"stage {self.name!r}: fallback must be a provider name or a Stage")
        if isinstance(fallback, str):
            _checked_name(fallback, f"stage {self.name!r}: fallback")
        if isinstance(fallback, Stage) and fallback.fallback is not None:
            raise JobSpecError(f"stage {self.name!r}: a fallback stage has no fallback of its own")

    @property
    def task_kind(self) -> str:
        """The kind its tasks are submitted with."""
        return self.kind if self.kind is not None else self.provider

    def fallback_stage(self) -> Stage | None:
        """The fallback as a :class:`Stage` (a provider name becomes a stage on that provider)."""
        if self.fallback is None:
            return None
        if isinstance(self.fallback, str):
            return Stage(name=f"{self.name}.fallback", provider=self.fallback)
        return self.fallback

    def identity(self) -> dict[str, Any]:
        """The stage's definition as canonical data: what the job key depends on.

        Functions count by their qualified name (``module.qualname``); change what a build
        does and bump the job's version. ``cost`` is left out: it does not change the output.
        """
        fallback = self.fallback_stage()
        return {
            "name": self.name,
            "provider": self.provider,
            "kind": self.task_kind,
            "version": self.version,
            "after": list(self.after),
            "fan_out": self.fan_out,
            "build": _callable_identity(self.build),
            "fallback": None
            if fallback is None
            else {
                "provider": fallback.provider,
                "kind": fallback.task_kind,
                "version": fallback.version,
                "build": _callable_identity(fallback.build),
            },
        }


@dataclass(frozen=True)
class JobSpec:
    """A named, versioned pipeline: stages forming a DAG through their ``after`` lists.

    ``name`` and ``version`` identify the spec in the store (recovery looks it up by them): bump
    the version whenever a stage's behaviour changes.
    """

    name: str
    version: str
    stages: tuple[Stage, ...]
    _digest: str = field(init=False, repr=False, compare=False, default="")
    """SHA-256 of the stages' canonical identity, computed once: every job key includes it."""

    def __post_init__(self) -> None:
        _checked_name(self.name, "JobSpec name")
        if not isinstance(self.version, str):
            raise JobSpecError(f"job {self.name!r}: version must be a string, got {self.version!r}")
        if not isinstance(self.stages, list | tuple):
            raise JobSpecError(
                f"job {self.name!r}: stages must be a list of Stage objects, got {self.stages!r}"
            )
        stages = tuple(self.stages)
        object.__setattr__(self, "stages", stages)
        if not stages:
            raise JobSpecError(f"job {self.name!r}: a job needs at least one stage")
        names: dict[str, Stage] = {}
        for stage in stages:
            if not isinstance(stage, Stage):
                raise JobSpecError(f"job {self.name!r}: stages must be Stage objects, got {stage!r}")
            if stage.name in names:
                raise JobSpecError(f"job {self.name!r}: two stages are named {stage.name!r}")
            names[stage.name] = stage
        for stage in stages:
            for dep in stage.after:
                if dep not in names:
                    raise JobSpecError(
                        f"job {self.name!r}: stage {stage.name!r} comes after unknown stage {dep!r}"
                    )
        self.order()  # raises on a cycle
        object.__setattr__(self, "_digest", fingerprint("job-stages", self.identity(), version=self.version))

    def stage(self, name: str) -> Stage:
        """The stage called ``name`` (:class:`~aiqsim.scheduler.arguments.UnknownNameError`, a
        ``KeyError``, if none)."""
        for stage in self.stages:
            if stage.name == name:
                return stage
        names = [stage.name for stage in self.stages]
        raise UnknownNameError(f"name: job {self.name!r} has no stage named {name!r}; its stages: {names}")

    def order(self) -> list[str]:
        """Stage names in a dependency order (Kahn's algorithm, ties in declaration order)."""
        remaining = {stage.name: set(stage.after) for stage in self.stages}
        ordered: list[str] = []
        while remaining:
            ready = [name for name, deps in remaining.items() if not deps]
            if not ready:
                raise JobSpecError(f"job {self.name!r}: stages {sorted(remaining)} form a cycle")
            for name in ready:
                ordered.append(name)
                del remaining[name]
            for deps in remaining.values():
                deps.difference_update(ready)
        return ordered

    def identity(self) -> list[dict[str, Any]]:
        """Every stage's :meth:`Stage.identity`, in declaration order."""
        return [stage.identity() for stage in self.stages]

    def key(self, inputs: Any) -> str:
        """The job's idempotency key for ``inputs`` (a fingerprint; ``FingerprintError`` if not JSON-like)."""
        return fingerprint(f"job:{self.name}", inputs, params={"stages": self._digest}, version=self.version)

    def providers(self) -> set[str]:
        """Every provider a run of this job may call (fallbacks included)."""
        names = {stage.provider for stage in self.stages}
        names.update(fb.provider for stage in self.stages if (fb := stage.fallback_stage()) is not None)
        return names
