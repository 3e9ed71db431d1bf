"""The call log: what production did, in the format the lab calibrates from.

A :class:`CallLog` is a scheduler event sink (``Scheduler(events=CallLog(...))``). It turns the
scheduler's flat events into two tables, one row per task and one row per provider attempt, as the
*client* saw them: submit time, priority, cost estimate against the usage the provider reported,
outcome class, Retry-After, and the provider's ``x-ratelimit-*`` view. :func:`aiqsim.sim.simulate`
results are turned into the same tables by the same class (``result.call_log``), so one analysis
(:func:`aiqsim.lab.calibrate`) reads a production log and a simulated one alike.

Two modes:

- ``CallLog()`` keeps everything in memory (``tasks_rows``/``calls_rows``); :meth:`CallLog.write`
  saves them as ``tasks.csv`` + ``calls.csv`` (or ``.parquet``) in a folder.
- ``CallLog(directory)`` streams: attempt rows are appended to ``calls.csv`` and a task's row to
  ``tasks.csv`` when it ends (to ``.parquet`` files with ``format="parquet"``), every ``flush_rows``
  events; only those events and the tasks not yet finished are held, so memory stays bounded in a
  long-running process. :meth:`CallLog.close` writes the rest.

Cost on the serving path: receiving an event only appends it to a list (the events are immutable
records, so holding them is safe). The rows are built from the held events in one tight loop when
they are needed: when a streaming log flushes (every ``flush_rows`` events, together with the CSV
formatting), or when an in-memory log's rows are read or written. The rows are the same as if each
event had been turned into rows on arrival, since the events are replayed in the order received.

No pandas here (the scheduler's side of the project stays light): rows are tuples, CSV goes through
the :mod:`csv` module, and Parquet through pyarrow, imported only when asked for.
"""

from __future__ import annotations

import csv
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.task import Priority
from aiqsim.scheduler.events import AttemptRecord, SchedulerEvent, TaskTransition

__all__ = [
    "CALL_LOG_COLUMNS",
    "CALL_LOG_FORMAT_VERSION",
    "OUTCOME_CLASSES",
    "TASK_LOG_COLUMNS",
    "CallLog",
    "CallLogError",
    "CallLogFormat",
    "outcome_class",
]

CALL_LOG_FORMAT_VERSION = 1
"""Bumped whenever a column changes meaning; written nowhere yet (the column list is the contract)."""

TASK_LOG_COLUMNS: tuple[str, ...] = (
    "task_id", "key", "provider", "priority", "status", "cost_estimate", "attempts",
    "submitted_at", "started_at", "finished_at", "latency_s",
)  # fmt: skip
"""One row per task: ``submitted_at`` is when the scheduler accepted it, ``latency_s`` submit to end."""

CALL_LOG_COLUMNS: tuple[str, ...] = (
    "task_id", "key", "provider", "priority", "attempt", "start", "end", "latency_s",
    "outcome", "outcome_class", "decision", "cost_estimate", "usage", "output_units",
    "retry_after_s", "delay_s", "first_token_s", "tokens_per_s",
    "limit_requests", "remaining_requests", "reset_requests_s",
    "limit_tokens", "remaining_tokens", "reset_tokens_s",
)  # fmt: skip
"""One row per attempt, as the client saw it (``outcome`` is the error type name or ``ok``).
``first_token_s`` (time to first token) and ``tokens_per_s`` are set for streamed attempts only."""

OUTCOME_CLASSES: dict[str, str] = {
    "ok": "ok",
    "RateLimitError": "rate_limited",
    "ServerError": "server_error",
    "ProviderTimeoutError": "timeout",
    "FirstTokenTimeoutError": "timeout",
    "StreamCutError": "stream_cut",
    "BilledStreamCutError": "stream_cut",
    "TimeoutError": "timeout",
    "QuotaExhaustedError": "quota_exhausted",
    "InvalidRequestError": "invalid_request",
    "SchemaViolationError": "schema_violation",
    "PoisonInputError": "schema_violation",
    "AttemptRejectedError": "rejected_locally",
}
"""Client outcome (error type name) -> the class calibration counts; anything else is ``other``."""

CallLogFormat = Literal["csv", "parquet"]

_TERMINAL = frozenset({"succeeded", "failed", "cancelled", "deduped"})


def outcome_class(outcome: str) -> str:
    """The calibration class of a client outcome name (``"RateLimitError"`` -> ``"rate_limited"``)."""
    return OUTCOME_CLASSES.get(outcome, "other")


_PRIORITY_NAMES: dict[int, str] = {int(p): p.name.lower() for p in Priority}


def _priority_name(priority: int) -> str:
    try:
        return Priority(priority).name.lower()
    except ValueError:
        return str(priority)


class CallLog:
    """A scheduler event sink that records the call log (see the module docstring).

    ``forward`` receives every event after the log has seen it, so a log can sit in front of another
    sink (``CallLog(forward=events.append)``). With ``directory`` the log streams to
    ``directory/tasks.<format>`` and ``directory/calls.<format>``: CSV, or with ``format="parquet"``
    Parquet files with one row group per flush (needs pyarrow; cheaper than CSV on the serving path,
    since no float is formatted as text; give it a larger ``flush_rows``, e.g. 10,000, for row groups
    of a useful size). Call :meth:`close` (or use ``with``) at the end: a Parquet file is readable
    only once closed. ``flush_rows`` is how many events a streaming log holds before it turns them
    into rows and appends those to its files (an in-memory log builds its rows when they are read or
    written).
    """

    wants_quota_samples = False
    """Tells the scheduler not to build a :class:`~aiqsim.scheduler.events.QuotaSample` per grant for
    this sink (the log does not record them; a ``forward`` sink behind it does not get them either)."""

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        forward: Callable[[SchedulerEvent], None] | None = None,
        flush_rows: int = 1000,
        format: CallLogFormat = "csv",
    ) -> None:
        if isinstance(flush_rows, bool) or not isinstance(flush_rows, int) or flush_rows < 1:
            raise ConfigurationError(f"flush_rows: expected an integer >= 1, got {flush_rows!r}")
        if format not in ("csv", "parquet"):
            raise ConfigurationError(f"format: expected 'csv' or 'parquet', got {format!r}")
        self.forward = forward
        self.flush_rows = flush_rows
        self._pending: list[SchedulerEvent] = []
        """Events received and not yet turned into rows, in the order received."""
        self._tasks_rows: list[tuple[Any, ...]] = []
        self._calls_rows: list[tuple[Any, ...]] = []
        self._open: dict[str, list[Any]] = {}
        """Task id -> its row so far, for tasks not finished yet."""
        self.directory = None if directory is None else Path(directory)
        self._writers: _CsvStreams | _ParquetStreams | None = None
        """Where a streaming log appends its rows (None when it keeps them in memory, or is closed)."""
        self._hold = sys.maxsize
        """Events held before a flush: ``flush_rows`` when streaming, unbounded in memory."""
        if self.directory is not None:
            streams = _ParquetStreams if format == "parquet" else _CsvStreams
            self._writers = streams(self.directory)
            self._hold = flush_rows

    # ------------------------------------------------------------------ the sink
    def __call__(self, event: SchedulerEvent) -> None:
        """Record ``event`` (a :data:`~aiqsim.scheduler.events.SchedulerEvent`; only task transitions
        and attempts make rows, the others are dropped when the held events are turned into rows)."""
        pending = self._pending
        pending.append(event)
        if self.forward is not None:
            self.forward(event)
        if len(pending) >= self._hold:
            self.flush()

    def _build_rows(self) -> None:
        """Turn the held events into task and call rows, in the order they were received."""
        pending = self._pending
        if not pending:
            return
        open_rows = self._open
        tasks_rows = self._tasks_rows
        calls_rows = self._calls_rows
        no_limits = (None, None, None, None, None, None)
        for event in pending:
            kind = type(event)
            if kind is TaskTransition:
                time, task_id, key, provider, priority, _old, new, attempts, cost_estimate, _tenant = event
                row = open_rows.get(task_id)
                if row is None:
                    row = [
                        task_id, key, provider, _PRIORITY_NAMES.get(priority) or _priority_name(priority),
                        new, cost_estimate, attempts, time, None, None, None,
                    ]  # fmt: skip
                    open_rows[task_id] = row
                else:
                    row[4] = new
                    row[6] = attempts
                if new == "running" and row[8] is None:
                    row[8] = time
                if new in _TERMINAL:
                    row[9] = time
                    row[10] = time - row[7]
                    del open_rows[task_id]
                    tasks_rows.append(tuple(row))
            elif kind is AttemptRecord:
                (
                    task_id, key, provider, attempt, start, end, outcome, decision, cost_estimate,
                    usage, retry_after_s, delay_s, output_units, snapshot, first_token_s, rate,
                ) = event  # fmt: skip
                task = open_rows.get(task_id)
                if snapshot is None:
                    limits: tuple[Any, ...] = no_limits
                else:
                    limits = (
                        snapshot.limit_requests,
                        snapshot.remaining_requests,
                        snapshot.reset_requests_s,
                        snapshot.limit_tokens,
                        snapshot.remaining_tokens,
                        snapshot.reset_tokens_s,
                    )
                calls_rows.append(
                    (
                        task_id, key, provider, task[3] if task is not None else None, attempt,
                        start, end, end - start, outcome, OUTCOME_CLASSES.get(outcome, "other"),
                        decision, cost_estimate, usage, output_units, retry_after_s, delay_s,
                        first_token_s, rate, *limits,
                    )
                )  # fmt: skip
        pending.clear()

    # ------------------------------------------------------------------ feeding and reading
    def extend(self, events: Iterable[SchedulerEvent]) -> CallLog:
        """Record every event of ``events`` in order (e.g. a finished simulation's); returns ``self``."""
        if self.forward is None and self._writers is None:
            self._pending.extend(events)
            return self
        for event in events:
            self(event)
        return self

    @property
    def tasks_rows(self) -> list[tuple[Any, ...]]:
        """Finished tasks' rows not yet written (all of them when the log does not stream)."""
        self._build_rows()
        return self._tasks_rows

    @property
    def calls_rows(self) -> list[tuple[Any, ...]]:
        """Attempt rows not yet written (all of them when the log does not stream)."""
        self._build_rows()
        return self._calls_rows

    def open_tasks(self) -> list[tuple[Any, ...]]:
        """Rows of tasks not finished yet (status as last seen, no ``finished_at``)."""
        self._build_rows()
        return [tuple(row) for row in self._open.values()]

    def as_dicts(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(task rows, call rows) held in memory as dicts, unfinished tasks included."""
        tasks = [dict(zip(TASK_LOG_COLUMNS, row, strict=True)) for row in self.tasks_rows + self.open_tasks()]
        calls = [dict(zip(CALL_LOG_COLUMNS, row, strict=True)) for row in self.calls_rows]
        return tasks, calls

    # ------------------------------------------------------------------ files
    def flush(self) -> None:
        """Turn the held events into rows and append those to the streamed files (when not streaming,
        only the rows are built)."""
        self._build_rows()
        if self._writers is None:
            return
        try:
            self._writers.append(self._tasks_rows, self._calls_rows)
        except OSError as error:
            raise CallLogError(f"cannot append to the call log in {self.directory}: {error}") from error
        self._tasks_rows.clear()
        self._calls_rows.clear()

    def close(self) -> None:
        """Flush and close the streamed files; tasks still open are written as they stand."""
        if self._writers is None:
            return
        self._tasks_rows.extend(self.open_tasks())
        self._open.clear()
        self.flush()
        try:
            self._writers.close()
        except OSError as error:
            raise CallLogError(f"cannot finish the call log in {self.directory}: {error}") from error
        finally:
            self._writers = None
            self._hold = sys.maxsize

    def __enter__(self) -> CallLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def write(self, directory: str | Path, format: CallLogFormat = "csv") -> tuple[Path, Path]:
        """Save the rows held in memory (unfinished tasks included) as ``tasks.<format>`` and
        ``calls.<format>`` in ``directory``; returns the two paths."""
        if format not in ("csv", "parquet"):
            raise ConfigurationError(f"format: expected 'csv' or 'parquet', got {format!r}")
        if self._writers is not None:
            raise ConfigurationError("this call log streams to its directory; close() it instead of write()")
        folder = Path(directory)
        tasks = self.tasks_rows + self.open_tasks()
        calls = self._calls_rows
        paths = folder / f"tasks.{format}", folder / f"calls.{format}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if format == "csv":
                for path, columns, rows in zip(
                    paths, (TASK_LOG_COLUMNS, CALL_LOG_COLUMNS), (tasks, calls), strict=True
                ):
                    with open(path, "w", newline="", encoding="utf-8") as file:
                        writer = csv.writer(file)
                        writer.writerow(columns)
                        writer.writerows(rows)  # None as an empty cell, floats in full precision
            else:
                _write_parquet(paths[0], TASK_LOG_COLUMNS, tasks)
                _write_parquet(paths[1], CALL_LOG_COLUMNS, calls)
        except OSError as error:
            raise CallLogError(f"cannot write the call log in {folder}: {error}") from error
        return paths


class CallLogError(ConfigurationError, OSError):
    """The call log could not be written where asked (a missing or read-only folder, a full disk);
    like ``OutputPathError``, a place to write that cannot be used."""


_TEXT_COLUMNS = frozenset(
    {"task_id", "key", "provider", "priority", "status", "outcome", "outcome_class", "decision"}
)
_INTEGER_COLUMNS = frozenset({"attempts", "attempt"})


def _pyarrow() -> tuple[Any, Any]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as error:
        raise ConfigurationError("a Parquet call log needs pyarrow: pip install 'aiqsim[parquet]'") from error
    return pa, pq


def _parquet_schema(pa: Any, columns: tuple[str, ...]) -> Any:
    """Text, integer or float per column, fixed: a batch whose column is all empty keeps its type."""

    def kind(name: str) -> Any:
        if name in _TEXT_COLUMNS:
            return pa.string()
        return pa.int64() if name in _INTEGER_COLUMNS else pa.float64()

    return pa.schema([(name, kind(name)) for name in columns])


def _parquet_table(pa: Any, schema: Any, rows: list[tuple[Any, ...]]) -> Any:
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
    return pa.Table.from_arrays(
        [pa.array(values, type=field.type) for values, field in zip(columns, schema, strict=True)],
        schema=schema,
    )


def _write_parquet(path: Path, columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    pa, pq = _pyarrow()
    schema = _parquet_schema(pa, columns)
    pq.write_table(_parquet_table(pa, schema, rows), path)


def _new_log_paths(directory: Path, format: str) -> tuple[Path, Path]:
    """``directory``'s ``tasks.<format>`` and ``calls.<format>`` for a new streamed log; the
    folder is made if needed. A folder that already holds a call log (of either format) is refused
    with :class:`CallLogError` and left as it was: a log is never overwritten by another."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        existing = sorted(
            path.name
            for path in (
                directory / f"{name}.{kind}" for name in ("tasks", "calls") for kind in ("csv", "parquet")
            )
            if os.path.lexists(path)
        )
    except OSError as error:
        raise CallLogError(f"cannot write the call log in {directory}: {error}") from error
    if existing:
        raise CallLogError(
            f"{directory} already holds a call log ({', '.join(existing)}); nothing in it was changed: "
            "give each log a folder of its own (or move the old one away)"
        )
    return directory / f"tasks.{format}", directory / f"calls.{format}"


class _CsvStreams:
    """``tasks.csv`` and ``calls.csv`` in a folder, appended to (and flushed) at each flush."""

    def __init__(self, directory: Path) -> None:
        paths = _new_log_paths(directory, "csv")
        opened: list[Any] = []
        try:
            for path in paths:  # "x": a file that appeared meanwhile is refused, never truncated
                opened.append(open(path, "x", newline="", encoding="utf-8"))  # noqa: SIM115
        except OSError as error:
            for file, path in zip(opened, paths, strict=False):  # only the files made here, still empty
                file.close()
                path.unlink(missing_ok=True)
            raise CallLogError(f"cannot write the call log in {directory}: {error}") from error
        tasks, calls = opened
        self.files = (tasks, calls)
        self.writers = csv.writer(tasks), csv.writer(calls)
        self.writers[0].writerow(TASK_LOG_COLUMNS)
        self.writers[1].writerow(CALL_LOG_COLUMNS)

    def append(self, tasks: list[tuple[Any, ...]], calls: list[tuple[Any, ...]]) -> None:
        self.writers[0].writerows(tasks)  # csv writes None as "" and floats by repr
        self.writers[1].writerows(calls)
        for file in self.files:
            file.flush()

    def close(self) -> None:
        for file in self.files:
            file.close()


class _ParquetStreams:
    """``tasks.parquet`` and ``calls.parquet`` in a folder, one row group appended per flush."""

    def __init__(self, directory: Path) -> None:
        self.pa, pq = _pyarrow()
        self.schemas = _parquet_schema(self.pa, TASK_LOG_COLUMNS), _parquet_schema(self.pa, CALL_LOG_COLUMNS)
        paths = _new_log_paths(directory, "parquet")
        try:
            self.writers = tuple(
                pq.ParquetWriter(path, schema) for path, schema in zip(paths, self.schemas, strict=True)
            )
        except OSError as error:
            raise CallLogError(f"cannot write the call log in {directory}: {error}") from error

    def append(self, tasks: list[tuple[Any, ...]], calls: list[tuple[Any, ...]]) -> None:
        for writer, schema, rows in zip(self.writers, self.schemas, (tasks, calls), strict=True):
            if rows:
                writer.write_table(_parquet_table(self.pa, schema, rows))

    def close(self) -> None:
        for writer in self.writers:
            writer.close()
