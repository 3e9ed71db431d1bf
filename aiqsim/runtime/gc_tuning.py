"""Garbage-collector settings for the length of a simulation run.

A simulation allocates millions of short-lived, acyclic objects (events, records, coroutine frames)
and keeps many long-lived ones (the task records it reports). With CPython's default thresholds a
generation-0 collection runs every 700 net allocations and the full collections that follow rescan
everything alive, including every module imported before the run: at 50-100k tasks the collector
took ~14% of the CPU (a profile). :func:`relaxed_gc` freezes what already exists
(``gc.freeze``: the imports and the caller's objects are never scanned during the run) and raises
the generation-0 threshold, then restores both. Reference counting still frees acyclic garbage at
once; only the cycle detector runs less often, so the memory held by reference cycles (a few per
cancelled coroutine) may grow by at most one threshold's worth of objects between collections.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

RUN_GEN0_THRESHOLD = 50_000
"""Generation-0 threshold during a run (CPython's default is 700)."""

_depth = 0  # nested runs (a sweep's simulate inside a notebook's) change the settings once


@contextmanager
def relaxed_gc(gen0_threshold: int = RUN_GEN0_THRESHOLD) -> Iterator[None]:
    """Freeze the objects alive now and raise the generation-0 threshold until the block exits.

    Restores the previous thresholds and unfreezes on exit, also when the block raises. Re-entrant:
    an inner use changes nothing. When the caller has frozen objects itself (``gc.freeze``), this
    only raises the threshold: it neither freezes more nor unfreezes the caller's.
    """
    global _depth
    if _depth:
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
        return
    previous = gc.get_threshold()
    already_frozen = gc.get_freeze_count()
    _depth = 1
    if not already_frozen:
        gc.freeze()
    gc.set_threshold(gen0_threshold, *previous[1:])
    try:
        yield
    finally:
        _depth = 0
        gc.set_threshold(*previous)
        if not already_frozen:
            gc.unfreeze()
