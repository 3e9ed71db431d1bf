"""How deep a crash test goes: seeds, crash points, and the one case to replay.

The pytest options ``--aiqsim-seeds N``, ``--aiqsim-crash-points all|sample:K`` and
``--aiqsim-replay SEED:POINT`` (and their ini twins) are parsed here into a
:class:`CrashOptions`, so that the same values can be given without pytest too.

A crash test has two crash points per store write ``K``:

- ``K``: the simulated process dies right *after* its K-th write (the write is in the store,
  nothing after it happened);
- ``bK``: it dies right *before* its K-th write: everything since write K-1 happened (a provider
  call that charged the customer, a side effect the user's code did between the task's
  ``running`` and ``succeeded`` writes) but write K never lands. A crash after write K-1 cannot
  show this: it stops the process before that work is done.

and one per side effect the user's code records (``world.effects.record``):

- ``eN``: it dies right *after* its N-th recorded side effect, before its next statement -- the
  moment between "the customer was charged" and "the result was kept" that no store write may
  fall in (one call at a time, the charge and the caching in one provider call).

Point ``0`` is the run without a crash. Cases run in the order the points occur (e.g. b1, 1, b2,
2, e1, b3, 3).

A process can also die again while it recovers (``--aiqsim-second-crashes N|all``): after a first
crash at ``POINT``, ``POINT+M`` dies again right after the M-th store write of the restarted life,
``POINT+bM`` right before it (the writes ``recover()`` makes to reconcile the orphans come first,
then the scenario's own); the third life then recovers from both. Off by default: each first crash
point gets ``N`` (seeded) or all of the restarted life's points, which multiplies the cases.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from aiqsim.core.errors import ConfigurationError

__all__ = [
    "BEFORE_PREFIX",
    "DEFAULT_SEEDS",
    "EFFECT_PREFIX",
    "CrashCase",
    "CrashOptions",
    "KitOptionError",
    "parse_crash_points",
    "parse_replay",
    "parse_second_crashes",
    "parse_seeds",
    "select_crash_points",
    "select_second_crashes",
]

DEFAULT_SEEDS = 3
"""Seeds a crash test runs by default (``--aiqsim-seeds``)."""

BEFORE_PREFIX = "b"
"""Marks a crash point *before* a store write in ``SEED:POINT`` (``0:b10``; ``0:10`` is after it)."""

EFFECT_PREFIX = "e"
"""Marks a crash point right after a recorded side effect in ``SEED:POINT`` (``0:e2``)."""

SECOND_SEPARATOR = "+"
"""Joins a second crash (in the restarted life) to the first in ``SEED:POINT`` (``0:b4+2``)."""

ALL = "all"
"""``CrashOptions(second_crashes=ALL)``: every crash point of the restarted life."""


class KitOptionError(ConfigurationError):
    """An ``--aiqsim-*`` option (or its ini value) that cannot be used; says what was expected."""


@dataclass(frozen=True, slots=True)
class CrashCase:
    """One run of a crash test: the ``seed`` and the store write at which the process dies
    (``crash_point``; 0 for the run without a crash): right after it, or right before it when
    ``before`` (the write never lands); with ``effect``, ``crash_point`` counts the recorded side
    effects instead, and the process dies right after that one. ``then`` (>= 1) makes the restarted
    process die again, right after its ``then``-th store write (right before it when
    ``then_before``): a crash during recovery; 0, the default, lets it live."""

    seed: int
    crash_point: int
    before: bool = False
    effect: bool = False
    then: int = 0
    then_before: bool = False

    @property
    def point(self) -> str:
        """The crash point as ``--aiqsim-replay`` spells it: ``K`` (after write K), ``bK`` (before
        write K) or ``eN`` (after side effect N), then ``+M`` / ``+bM`` for a second crash."""
        prefix = EFFECT_PREFIX if self.effect else BEFORE_PREFIX if self.before else ""
        if not self.then:
            return f"{prefix}{self.crash_point}"
        second = f"{BEFORE_PREFIX if self.then_before else ''}{self.then}"
        return f"{prefix}{self.crash_point}{SECOND_SEPARATOR}{second}"

    @property
    def replay_option(self) -> str:
        """The command-line option that re-runs exactly this case."""
        return f"--aiqsim-replay {self.seed}:{self.point}"

    @property
    def where(self) -> str:
        """The crash point in words: ``no crash``, ``crash before/after store write #K``."""
        if self.crash_point == 0:
            return "no crash"
        if self.effect:
            first = f"crash right after side effect #{self.crash_point}"
        else:
            first = f"crash {'before' if self.before else 'after'} store write #{self.crash_point}"
        if not self.then:
            return first
        second = "before" if self.then_before else "after"
        return f"{first}, then {second} write #{self.then} of the restarted life"

    def __str__(self) -> str:
        return f"seed {self.seed}, {self.where}"


@dataclass(frozen=True, slots=True)
class CrashOptions:
    """Which cases a crash test runs: ``seeds``; every crash point (``sample is None``) or ``sample``
    of them per seed; or only ``replay``. ``second_crashes``: after each first crash, also that
    many (seeded) crash points of the restarted life, or ``"all"`` of them; 0 (the default): none."""

    seeds: tuple[int, ...] = tuple(range(DEFAULT_SEEDS))
    sample: int | None = None
    replay: CrashCase | None = None
    second_crashes: int | Literal["all"] = 0

    def __post_init__(self) -> None:
        if not self.seeds:
            raise KitOptionError("a crash test needs at least one seed")
        if self.sample is not None and self.sample < 1:
            raise KitOptionError(f"sample must be >= 1 crash point, got {self.sample}")
        second = self.second_crashes
        if second != ALL and (type(second) is not int or second < 0):
            raise KitOptionError(f"second_crashes must be a whole number >= 0 or 'all', got {second!r}")


def _is_number(text: str) -> bool:
    """Whether ``text`` is a whole number in ASCII digits (``str.isdigit`` also accepts "²" and
    other Unicode digits that ``int()`` rejects)."""
    return text.isascii() and text.isdigit()


def parse_seeds(text: str | int) -> tuple[int, ...]:
    """``--aiqsim-seeds N``: seeds 0 .. N-1 (N >= 1)."""
    try:
        count = int(text)
    except (TypeError, ValueError):
        raise KitOptionError(f"--aiqsim-seeds expects a whole number >= 1, got {text!r}") from None
    if count < 1:
        raise KitOptionError(f"--aiqsim-seeds expects a whole number >= 1, got {text!r}")
    return tuple(range(count))


def parse_crash_points(text: str) -> int | None:
    """``--aiqsim-crash-points``: ``all`` (None) or ``sample:K`` (K >= 1 points per seed)."""
    value = str(text).strip().lower()
    if value == "all":
        return None
    prefix, _, count = value.partition(":")
    if prefix == "sample" and _is_number(count) and int(count) >= 1:
        return int(count)
    raise KitOptionError(f"--aiqsim-crash-points expects 'all' or 'sample:K' with K >= 1, got {text!r}")


def parse_second_crashes(text: str | int) -> int | Literal["all"]:
    """``--aiqsim-second-crashes``: ``all`` or a whole number N >= 0 of second crash points per
    first crash (0: none)."""
    value = str(text).strip().lower()
    if value == ALL:
        return ALL
    if _is_number(value):
        return int(value)
    raise KitOptionError(f"--aiqsim-second-crashes expects 'all' or a whole number >= 0, got {text!r}")


def parse_replay(text: str | None) -> CrashCase | None:
    """``--aiqsim-replay SEED:POINT``, or None when not given. SEED is a whole number >= 0; POINT is
    ``K`` (crash after store write K; 0: no crash), ``bK`` (crash before write K, K >= 1) or ``eN``
    (crash right after side effect N, N >= 1), optionally followed by ``+M`` or ``+bM`` (M >= 1): a
    second crash after (before) the restarted life's M-th store write."""
    if text is None or str(text).strip() == "":
        return None
    seed, sep, point = str(text).strip().partition(":")
    first, plus, second = point.partition(SECOND_SEPARATOR)
    prefix = first[:1] if first[:1] in (BEFORE_PREFIX, EFFECT_PREFIX) else ""
    number = first[len(prefix) :]
    then_before = second[:1] == BEFORE_PREFIX
    then = second[1:] if then_before else second
    if (
        not sep
        or not _is_number(seed)
        or not _is_number(number)
        or (prefix and int(number) < 1)
        or (plus and (not _is_number(then) or int(then) < 1 or int(number) < 1))
    ):
        raise KitOptionError(
            "--aiqsim-replay expects SEED:POINT as a failure prints it (POINT: K, crash after store "
            "write K; bK, crash before it; eN, crash right after side effect N; then +M or +bM for a "
            f"second crash after or before the restarted life's write M), got {text!r}"
        )
    return CrashCase(
        int(seed),
        int(number),
        prefix == BEFORE_PREFIX,
        prefix == EFFECT_PREFIX,
        int(then) if plus else 0,
        then_before,
    )


def select_crash_points(
    total_writes: int, seed: int, sample: int | None, effects_after: Sequence[int] = ()
) -> list[CrashCase]:
    """The crash cases to run for a seed whose crash-free run makes ``total_writes`` writes and
    whose side effect ``n`` (1-based) came after ``effects_after[n-1]`` writes.

    Every point without ``sample``: before and after each write 1..total and right after each
    side effect, in the order they occur (an effect after write K comes before ``b(K+1)``);
    otherwise ``sample`` of them drawn from a stream seeded by ``seed`` alone, so the same options
    always pick the same points.
    """
    effects: dict[int, list[int]] = {}
    for number, writes in enumerate(effects_after, start=1):
        effects.setdefault(writes, []).append(number)
    points = [CrashCase(seed, n, effect=True) for n in effects.get(0, [])]
    for k in range(1, total_writes + 1):
        points += [CrashCase(seed, k, before=True), CrashCase(seed, k)]
        points += [CrashCase(seed, n, effect=True) for n in effects.get(k, [])]
    return _seeded_sample(points, sample, f"aiqsim-crash-points:{seed}")


def _seeded_sample(points: list[CrashCase], count: int | None, stream: str) -> list[CrashCase]:
    """``count`` of ``points`` (all of them for ``None`` or a count that covers them), in their
    order, drawn from a random stream seeded by ``stream`` alone: the same options pick the same points."""
    if count is None or count >= len(points):
        return points
    chosen = random.Random(stream).sample(range(len(points)), count)
    return [points[i] for i in sorted(chosen)]


def select_second_crashes(
    first: CrashCase, restart_writes: int, count: int | Literal["all"]
) -> list[CrashCase]:
    """The second-crash cases of ``first``, whose restarted life made ``restart_writes`` store
    writes when it lived: before and after each of them (``+b1``, ``+1``, ...), in order; ``count``
    of them drawn from a stream seeded by the first case alone, or ``"all"``."""
    points = [
        replace(first, then=m, then_before=before)
        for m in range(1, restart_writes + 1)
        for before in (True, False)
    ]
    stream = f"aiqsim-second-crashes:{first.seed}:{first.point}"
    return _seeded_sample(points, None if count == ALL else count, stream)
