"""The Dask ``LocalCluster`` that ``sweep(engine="dask")`` and ``tune(engine="dask")`` start when no
``address`` is given: worker processes that leave Ctrl-C to the process that started them, and
close quietly when it stops them.

Interrupted, a sweep keeps its finished rows and ``aiqsim sweep`` says so in one line and exits 130
(:class:`~aiqsim.sim.sweep.SweepInterrupted`). A Ctrl-C at a terminal reaches the whole process
group, so each Dask worker process also raised a ``KeyboardInterrupt`` of its own and printed its
traceback, and each run cut short by the cluster's close logged a warning. Now the workers ignore
SIGINT (:func:`sigint_ignored_by_new_processes`) and drop that one warning (:class:`CloseQuietly`);
their other logs are as Dask's defaults make them. A cluster at a given ``address`` is not ours:
nothing here touches it.

Imported only when the ``dask`` extra is used (it imports ``distributed``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Iterator
from typing import Any

from distributed import LocalCluster, WorkerPlugin

__all__ = [
    "CloseQuietly",
    "local_dask_cluster",
    "mark_cluster_closing",
    "not_a_heartbeat_cut_by_closing",
    "not_a_run_cut_short",
    "sigint_ignored_by_new_processes",
]


def local_dask_cluster(workers: int | None) -> LocalCluster:
    """A new ``LocalCluster`` of ``workers`` worker processes (default: one per CPU) of one thread
    each, without a dashboard, whose workers ignore SIGINT and close quietly (see the module docs)."""
    with sigint_ignored_by_new_processes():
        return LocalCluster(
            n_workers=workers or os.cpu_count() or 1,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            plugins=(CloseQuietly(),),  # passed on to each worker process
        )


@contextlib.contextmanager
def sigint_ignored_by_new_processes() -> Iterator[None]:
    """Ignore SIGINT in this process while the block starts worker processes, so that they ignore it
    for their whole life and only this process handles Ctrl-C.

    A signal ignored at ``exec`` stays ignored in the new program, and Python then installs no
    handler of its own (nor does ``asyncio.run``), so the workers never raise ``KeyboardInterrupt``;
    the process that started them stops them as it closes the cluster. A Ctrl-C during the block
    itself (the cluster's start, a second or two) is lost. Outside the main thread, where a handler
    cannot be changed, the block runs as it is.
    """
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        if previous is not None:  # None: a handler not set from Python, which cannot be put back
            signal.signal(signal.SIGINT, previous)


def not_a_run_cut_short(record: logging.LogRecord) -> bool:
    """A logging filter: False for the warning a Dask worker logs for each task it was running when
    it closes (``Async instruction for <Task ...> ended with CancelledError``, which Dask says happens
    only in ``Worker.close()``): after a Ctrl-C that is every run in progress, and the interrupted
    sweep already says how many runs did not finish."""
    return not record.getMessage().endswith("ended with CancelledError")


def not_a_heartbeat_cut_by_closing(record: logging.LogRecord) -> bool:
    """A logging filter: False for the error a Dask worker logs, with a traceback, when its heartbeat
    to the scheduler is cut short by its own connection pool closing (``Failed to communicate with
    scheduler during heartbeat``, raised as ``CommClosedError: ConnectionPool closing``): the worker
    is shutting down with the cluster. Seen under load, when a heartbeat's connect was still waiting
    at the Ctrl-C. A heartbeat that fails for any other reason (a scheduler that stopped answering)
    is still logged."""
    if not record.getMessage().startswith("Failed to communicate with scheduler during heartbeat"):
        return True
    if _cluster_closing:  # the sweep closes the cluster: the scheduler may go first and cut the stream
        return False
    error = record.exc_info[1] if record.exc_info else None
    return not (type(error).__name__ == "CommClosedError" and "closing" in str(error))


_cluster_closing = False
"""Set in a worker process by :func:`mark_cluster_closing`: the sweep that owns the cluster is closing it."""


def mark_cluster_closing() -> None:
    """Run on every worker (``client.run``) just before the sweep closes its own local cluster: from
    then on a heartbeat that fails is the cluster closing, whichever side's connection closed first
    (the scheduler may close before a worker's heartbeat is answered: ``Stream is closed``)."""
    global _cluster_closing
    _cluster_closing = True


class CloseQuietly(WorkerPlugin):
    """A worker plugin that filters :func:`not_a_run_cut_short` out of the worker's state machine
    log and :func:`not_a_heartbeat_cut_by_closing` out of the worker's own (set up in each worker
    process as it starts)."""

    name = "aiqsim-close-quietly"

    def setup(self, worker: Any) -> None:
        logging.getLogger("distributed.worker.state_machine").addFilter(not_a_run_cut_short)
        logging.getLogger("distributed.worker").addFilter(not_a_heartbeat_cut_by_closing)
