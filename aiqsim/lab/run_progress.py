"""A progress bar for long ``aiqsim run`` simulations, and the resources a run used.

:func:`progress_bar` returns a ``progress(now, horizon)`` callback for
:func:`aiqsim.sim.simulate.simulate`: a tqdm bar over the virtual clock when tqdm is installed
(part of the ``lab`` extra), else one plain line on stderr rewritten in place. Either way it
shows simulated seconds done, the wall time so far and the simulated-to-wall speed.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any


@dataclass(frozen=True)
class RunResources:
    """Wall time, CPU time and peak resident set size of this process for one run."""

    wall_s: float
    cpu_s: float
    peak_rss_mb: float

    def describe(self) -> str:
        """One line: ``wall 12.3 s, CPU 11.9 s, peak RSS 210.4 MB``."""
        return f"wall {self.wall_s:,.1f} s, CPU {self.cpu_s:,.1f} s, peak RSS {self.peak_rss_mb:,.1f} MB"


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MB (``ru_maxrss`` is KB on Linux)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 / 1024 if sys.platform == "darwin" else peak / 1024


class ResourceClock:
    """Started at construction; :meth:`read` gives the :class:`RunResources` since then."""

    def __init__(self) -> None:
        self._wall = time.perf_counter()
        self._cpu = time.process_time()

    def read(self) -> RunResources:
        """Wall and CPU time since construction, and the process's peak RSS."""
        return RunResources(time.perf_counter() - self._wall, time.process_time() - self._cpu, peak_rss_mb())


class ProgressBar:
    """``progress(now, horizon)`` callback drawing a bar over the virtual clock; :meth:`close` ends it."""

    def __init__(self, stream: IO[str] | None = None, *, use_tqdm: bool = True) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self._started = time.perf_counter()
        self._last_drawn = -1.0
        self._bar: Any = None
        self._tqdm: Callable[..., Any] | None = None
        if use_tqdm:
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                self._tqdm = tqdm

    def __call__(self, now: float, horizon: float) -> None:
        """Show that ``now`` of ``horizon`` simulated seconds are done."""
        done = min(now, horizon)
        if self._tqdm is not None:
            if self._bar is None:
                self._bar = self._tqdm(
                    total=round(horizon), unit="sim s", file=self.stream, dynamic_ncols=True, smoothing=0.1
                )
            self._bar.update(round(done) - self._bar.n)
            return
        wall = time.perf_counter() - self._started
        if wall - self._last_drawn < 1.0 and done < horizon:
            return  # at most one line a second
        self._last_drawn = wall
        share = done / horizon if horizon > 0 else 1.0
        speed = done / wall if wall > 0 else 0.0
        self.stream.write(
            f"\rsimulated {done:,.0f} / {horizon:,.0f} s ({share:6.1%}), wall {wall:,.0f} s, "
            f"{speed:,.0f} sim s per wall s"
        )
        self.stream.flush()

    def close(self) -> None:
        """End the bar (a newline after the plain line)."""
        if self._bar is not None:
            self._bar.close()
        elif self._last_drawn >= 0:
            self.stream.write("\n")
            self.stream.flush()
