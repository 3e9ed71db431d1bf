"""How deep a crash test goes: seeds, crash points, and the one case to replay.

The pytest options ``--aiqsim-seeds N``, ``--aiqsim-crash-points all|sample:K`` and
``--aiqsim-replay SEED:POINT`` (and their ini twins) are parsed here into a
:class:`CrashOptions`, so that the same values can be given without pytest too.
Crash point ``K`` means "the simulated process dies right after its K-th store write";
point 0 is the run without a crash.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from aiqsim.core.errors import ConfigurationError

__all__ = [
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


class KitOptionError(ConfigurationError):
    """An ``--aiqsim-*`` option (or its ini value) that cannot be used; says what was expected."""


@dataclass(frozen=True, slots=True)
class CrashCase:
    """One run of a crash test: the ``seed`` and the store write after which the process dies
    (``crash_point``; 0 for the run without a crash)."""

    seed: int
    crash_point: int

    @property
    def replay_option(self) -> str:
        """The command-line option that re-runs exactly this case."""
        return f"--aiqsim-replay {self.seed}:{self.crash_point}"

    def __str__(self) -> str:
        where = "no crash" if self.crash_point == 0 else f"crash after store write #{self.crash_point}"
        return f"seed {self.seed}, {where}"


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
    if prefix == "sample" and count.isdigit() and int(count) >= 1:
        return int(count)
    raise KitOptionError(f"--aiqsim-crash-points expects 'all' or 'sample:K' with K >= 1, got {text!r}")


def parse_replay(text: str | None) -> CrashCase | None:
    """``--aiqsim-replay SEED:POINT`` (both whole numbers >= 0), or None when not given."""
    if text is None or str(text).strip() == "":
        return None
    seed, sep, point = str(text).strip().partition(":")
    if not sep or not seed.isdigit() or not point.isdigit():
        raise KitOptionError(
            f"--aiqsim-replay expects SEED:POINT (whole numbers, as a failure prints them), got {text!r}"
        )
    return CrashCase(int(seed), int(point))


def select_crash_points(total_writes: int, seed: int, sample: int | None) -> list[int]:
    """The crash points to run for a seed whose crash-free run makes ``total_writes`` writes.

    Every point 1..total without ``sample``; otherwise ``sample`` of them drawn from a stream seeded
    by ``seed`` alone, so the same options always pick the same points.
    """
    points = list(range(1, total_writes + 1))
    if sample is None or sample >= len(points):
        return points
    return sorted(random.Random(f"aiqsim-crash-points:{seed}").sample(points, sample))
