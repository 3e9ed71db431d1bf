"""SIGKILL a real worker process at seeded moments, restart it, and collect what each run said.

The simulated crashes of :mod:`aiqsim.testing.crash_driver` stop a process at an exact store
write; this helper does the real thing to the user's own asyncio worker script: start it, wait
until it prints its ready line (e.g. after opening its store), let it run for a seeded random
moment in ``[0, kill_window_s)``, ``SIGKILL`` it, and start it again -- until it has been killed
``kills`` times and then exits 0 on its own. The worker is expected to ``recover()`` at start
and finish the workload; the test then checks the store (and its own ledger of executions)
with the functions of :mod:`aiqsim.testing.invariants`.

The kill moments come from ``random.Random(seed)``: the same seed gives the same schedule of
delays (where in the work they land still depends on the machine's speed, as with any real kill).

Each run starts in a session (and process group) of its own, and a kill -- or a timeout -- sends
``SIGKILL`` to that whole group: a worker started through a wrapper (``bash -c "python
worker.py"``, a launcher script) dies with the wrapper instead of being orphaned and working on.
POSIX only (``SIGKILL``, ``killpg``).
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiqsim.core.errors import ConfigurationError, SchedulingError

__all__ = ["KillReport", "WorkerFailedError", "WorkerRun", "kill_and_restart"]

Command = Sequence[str] | Callable[[int, random.Random], Sequence[str]]
"""The worker's command line, or ``command(run_number, rng)`` returning it (run numbers from 0)."""


class WorkerFailedError(SchedulingError, RuntimeError):
    """The worker did not print its ready line, failed on its own, or never finished the work.
    The message has the run number, the exit status and the end of its stderr."""


@dataclass(frozen=True, slots=True)
class WorkerRun:
    """One start of the worker: its pid, whether (and after how long) it was killed, its output."""

    number: int
    pid: int
    killed: bool
    kill_after_s: float | None
    returncode: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        """Its stdout, one line each (the ready line included)."""
        return self.stdout.splitlines()


@dataclass(frozen=True, slots=True)
class KillReport:
    """Every run of a :func:`kill_and_restart` loop, in order; the last one finished the work."""

    seed: int
    runs: tuple[WorkerRun, ...]

    @property
    def kills(self) -> int:
        """How many runs were SIGKILLed."""
        return sum(run.killed for run in self.runs)

    @property
    def killed_pids(self) -> frozenset[int]:
        """The pids of the killed runs (to tell an execution by a killed process from a live one)."""
        return frozenset(run.pid for run in self.runs if run.killed)

    @property
    def final(self) -> WorkerRun:
        """The run that exited on its own."""
        return self.runs[-1]


def _readline(proc: subprocess.Popen[bytes], timeout_s: float) -> bytes:
    """One line of the worker's stdout, waiting at most ``timeout_s`` (b"" at EOF or timeout)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout_s
    line = bytearray()
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 1)
        if not chunk:
            break
        line += chunk
    return bytes(line)


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the run's whole process group (the worker and whatever it started), then reap it.

    Sent before the group leader is reaped, so its pid (the group id) cannot have been reused."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the whole group is gone already
    proc.wait()


def _finish(
    proc: subprocess.Popen[bytes], number: int, argv: Sequence[str], timeout_s: float
) -> tuple[bytes, bytes]:
    """The run's stdout and stderr once it has ended; a run still going after ``timeout_s`` is
    killed (its group) and reported as :class:`WorkerFailedError`."""
    try:
        return proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        raise WorkerFailedError(
            f"run {number} of {list(argv[:3])}...: still running (or its output still open) after "
            f"timeout_s={timeout_s:g}s; its process group was killed. stdout:\n"
            f"{_tail(out.decode(errors='replace'), 5)}\nstderr:\n{_tail(err.decode(errors='replace'))}"
        ) from None


def kill_and_restart(
    command: Command,
    *,
    kills: int,
    seed: int,
    kill_window_s: float = 0.2,
    ready_line: str | None = "ready",
    max_runs: int = 40,
    timeout_s: float = 60.0,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    after_kill: Callable[[WorkerRun], None] | None = None,
) -> KillReport:
    """Run the worker, SIGKILL it up to ``kills`` times at seeded moments, restart it until it exits 0.

    The loop ends with the first run that exits on its own; if the work was done before every
    wanted kill landed, ``report.kills`` is smaller than ``kills`` (a test should assert it is not,
    and make the workload long enough).

    ``ready_line``: the line the worker prints when it is up (the kill window starts then; ``None``
    starts it at once). ``after_kill(run)`` is called after each kill, with the process gone: the
    place to check that the store still loads. A run that was not killed must exit 0, else
    :class:`WorkerFailedError`; so must a loop that needs more than ``max_runs`` starts, and a run
    still going (or whose output is still open) ``timeout_s`` after its ready line or its kill.
    """
    if kills < 0 or max_runs < kills + 1:
        raise ConfigurationError(f"need 0 <= kills < max_runs, got kills={kills}, max_runs={max_runs}")
    if not kill_window_s > 0:
        raise ConfigurationError(f"kill_window_s must be > 0, got {kill_window_s!r}")
    rng = random.Random(seed)
    runs: list[WorkerRun] = []
    environment = None if env is None else dict(env)
    for number in range(max_runs):
        argv = list(command(number, rng) if callable(command) else command)
        wanted = sum(run.killed for run in runs) < kills
        delay = rng.uniform(0.0, kill_window_s) if wanted else None
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=environment,
            bufsize=0,
            start_new_session=True,  # its own process group: a kill reaches what it started too
        )
        killed = False
        first = b""
        try:
            if ready_line is not None:
                first = _readline(proc, timeout_s)
                if first.decode(errors="replace").strip() != ready_line:
                    _kill_group(proc)
                    _, err = proc.communicate()
                    raise WorkerFailedError(
                        f"run {number} of {argv[:3]}...: expected the ready line {ready_line!r} first, got "
                        f"{first.decode(errors='replace')!r}; stderr:\n{_tail(err.decode(errors='replace'))}"
                    )
            if delay is not None:
                try:
                    proc.wait(timeout=delay)
                except subprocess.TimeoutExpired:
                    _kill_group(proc)
                    killed = True
            out, err = _finish(proc, number, argv, timeout_s)
        finally:
            if proc.poll() is None:
                _kill_group(proc)
        run = WorkerRun(
            number=number,
            pid=proc.pid,
            killed=killed,
            kill_after_s=delay if killed else None,
            returncode=proc.returncode,
            stdout=(first + out).decode(errors="replace"),
            stderr=err.decode(errors="replace"),
        )
        runs.append(run)
        if killed:
            if after_kill is not None:
                after_kill(run)
            continue
        if run.returncode != 0:
            raise WorkerFailedError(
                f"run {number} exited with status {run.returncode} without being killed; stderr:\n"
                f"{_tail(run.stderr)}"
            )
        return KillReport(seed, tuple(runs))  # finished on its own (before its kill moment, if any)
    raise WorkerFailedError(f"the worker was started {max_runs} times and never finished with {kills} kills")
