"""Probes that watch the scheduler's internals from a test (each says which seam it patches)."""

from __future__ import annotations

from typing import Any

import pytest

from aiqsim import Scheduler


def count_dispatch_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The lane name of every dispatch run from now on, in order.

    Patches ``Scheduler._dispatch`` on the class: a lane's pump binds it when the scheduler is
    built, so build the scheduler after calling this.
    """
    runs: list[str] = []
    original = Scheduler._dispatch

    def counted(self: Scheduler, lane: Any) -> float | None:
        runs.append(lane.name)
        return original(self, lane)

    monkeypatch.setattr(Scheduler, "_dispatch", counted)
    return runs
