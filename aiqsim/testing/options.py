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

Point ``0`` is the run without a crash. Cases run in the order the points occur: b1, 1, b2, 2, ...
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from aiqsim.core.errors import ConfigurationError

__all__ = [
    "BEFORE_PREFIX",
    "DEFAULT_SEEDS",
    "CrashCase",
    "CrashOptions",
    "KitOptionError",
    "parse_crash_points",
    "parse_replay",
    "parse_seeds",
    "select_crash_points",
]

DEFAULT_SEEDS = 3
"""Seeds a crash test runs by default (``--aiqsim-seeds``)."""

BEFORE_PREFIX = "b"
"""Marks a crash point *before* a store write in ``SEED:POINT`` (``0:b10``; ``0:10`` is after it)."""


class KitOptionError(ConfigurationError):
    """An ``--aiqsim-*`` option (or its ini value) that cannot be used; says what was expected."""


@dataclass(frozen=True, slots=True)
class CrashCase:
    """One run of a crash test: the ``seed`` and the store write at which the process dies
    (``crash_point``; 0 for the run without a crash): right after it, or right before it when
    ``before`` (the write never lands)."""

    seed: int
    crash_point: int
    before: bool = False

    @property
    def point(self) -> str:
        """The crash point as ``--aiqsim-replay`` spells it: ``K`` (after write K) or ``bK`` (before)."""
        return f"{BEFORE_PREFIX if self.before else ''}{self.crash_point}"

    @property
    def replay_option(self) -> str:
        """The command-line option that re-runs exactly this case."""
        return f"--aiqsim-replay {self.seed}:{self.point}"

    @property
    def where(self) -> str:
        """The crash point in words: ``no crash``, ``crash before/after store write #K``."""
        if self.crash_point == 0:
            return "no crash"
        return f"crash {'before' if self.before else 'after'} store write #{self.crash_point}"

    def __str__(self) -> str:
        return f"seed {self.seed}, {self.where}"


@dataclass(frozen=True, slots=True)
class CrashOptions:
    """Which cases a crash test runs: ``seeds``; every crash point (``sample is None``) or ``sample``
    of them per seed; or only ``replay``."""

    seeds: tuple[int, ...] = tuple(range(DEFAULT_SEEDS))
    sample: int | None = None
    replay: CrashCase | None = None

    def __post_init__(self) -> None:
        if not self.seeds:
            raise KitOptionError("a crash test needs at least one seed")
        if self.sample is not None and self.sample < 1:
            raise KitOptionError(f"sample must be >= 1 crash point, got {self.sample}")


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


def parse_replay(text: str | None) -> CrashCase | None:
    """``--aiqsim-replay SEED:POINT``, or None when not given. SEED is a whole number >= 0; POINT is
    ``K`` (crash after store write K; 0: no crash) or ``bK`` (crash before write K, K >= 1)."""
    if text is None or str(text).strip() == "":
        return None
    seed, sep, point = str(text).strip().partition(":")
    before = point.startswith(BEFORE_PREFIX)
    write = point[len(BEFORE_PREFIX) :] if before else point
    if not sep or not _is_number(seed) or not _is_number(write) or (before and int(write) < 1):
        raise KitOptionError(
            "--aiqsim-replay expects SEED:POINT as a failure prints it (POINT: K, crash after store "
            f"write K, or bK, crash before it), got {text!r}"
        )
    return CrashCase(int(seed), int(write), before)


def select_crash_points(total_writes: int, seed: int, sample: int | None) -> list[CrashCase]:
    """The crash cases to run for a seed whose crash-free run makes ``total_writes`` writes.

    Every point without ``sample``: before and after each write 1..total, in the order they occur
    (b1, 1, b2, 2, ...); otherwise ``sample`` of them drawn from a stream seeded by ``seed`` alone,
    so the same options always pick the same points.
    """
    points = [CrashCase(seed, k, before) for k in range(1, total_writes + 1) for before in (True, False)]
    if sample is None or sample >= len(points):
        return points
    chosen = random.Random(f"aiqsim-crash-points:{seed}").sample(range(len(points)), sample)
    return [points[i] for i in sorted(chosen)]
