"""The scheduler's event records and the call log's deferred row building (issue #17, call-log overhead).

The records became named tuples (cheaper to build on the serving path than frozen dataclasses): they
must keep their field names (the simulator, the call log and other consumers read them by name),
stay immutable, and compare by type as well as values. The call log now holds the raw events and
builds its rows later: the rows must be the same whenever they are built, and a streaming log must
still bound what it holds.
"""

from __future__ import annotations

import csv
import pickle
from pathlib import Path

import numpy as np
import pytest

from aiqsim.core.ratelimit import RateLimitSnapshot
from aiqsim.scheduler.call_log import CALL_LOG_COLUMNS, TASK_LOG_COLUMNS, CallLog
from aiqsim.scheduler.events import (
    AttemptRecord,
    LanePaused,
    OwnerUnreadable,
    QueueRejected,
    QuotaSample,
    QuotaUnavailable,
    StoreWriteFailed,
    TaskTransition,
    UsageAnomaly,
)
from aiqsim.sim import simulate

FIELDS = {
    TaskTransition: (
        "time", "task_id", "key", "provider", "priority", "old", "new", "attempts", "cost_estimate", "tenant",
    ),
    AttemptRecord: (
        "task_id", "key", "provider", "attempt", "start", "end", "outcome", "decision", "cost_estimate",
        "usage", "retry_after_s", "delay_s", "output_units", "ratelimit", "first_token_s",
        "tokens_per_s",
    ),
    QuotaSample: (
        "time", "provider", "requests_level", "tokens_level", "in_flight", "queued_interactive",
        "queued_background",
    ),
    StoreWriteFailed: ("time", "task_id", "key", "provider", "lost", "error"),
    UsageAnomaly: ("time", "task_id", "key", "provider", "attempt", "reported", "charged", "reason"),
    LanePaused: ("time", "provider", "until", "task_id", "reason"),
    QueueRejected: ("time", "provider", "priority", "queued", "limit", "queued_in_lane"),
    OwnerUnreadable: ("time", "kind", "waiter_id", "key", "owner_id", "error"),
    QuotaUnavailable: ("time", "provider", "error"),
}  # fmt: skip
"""The public field names, in order, as they were when the records were frozen dataclasses."""

SCENARIO = """
[scenario]
name = "small"
seed = 1
duration_s = 30

[[providers]]
name = "llm"
latency_base_s = 0.2
server_requests_per_min = 60
rate_limit_prob = 0.1
server_error_prob = 0.1

[retry]
max_attempts = 4

[[workloads]]
type = "poisson"
provider = "llm"
rate_per_s = 3
distinct_inputs = 40
"""


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> list:
    path = tmp_path_factory.mktemp("small") / "small.toml"
    path.write_text(SCENARIO)
    return list(simulate(path, seed=4).events)


@pytest.mark.parametrize("record", list(FIELDS))
def test_records_keep_their_field_names_and_are_immutable(record: type) -> None:
    assert record._fields == FIELDS[record]
    values = [f"v{i}" for i in range(len(FIELDS[record]))]
    event = record(*values)
    assert [getattr(event, name) for name in FIELDS[record]] == values
    with pytest.raises(AttributeError):
        setattr(event, FIELDS[record][0], "changed")
    assert pickle.loads(pickle.dumps(event)) == event
    assert hash(record(*values)) == hash(event)


def test_records_equal_only_records_of_the_same_type() -> None:
    transition = TaskTransition(1.0, "t", "k", "llm", 1, None, "queued", 0, 5.0)
    assert transition == TaskTransition(1.0, "t", "k", "llm", 1, None, "queued", 0, 5.0)
    assert transition != TaskTransition(1.0, "t", "k", "llm", 1, None, "queued", 0, 6.0)
    assert transition != tuple(transition)  # a plain tuple with the same values is not the record
    assert tuple(transition) != transition
    assert LanePaused(1.0, "llm", 2.0, "t", "x") != ("1.0", "llm", 2.0, "t", "x")
    assert len({transition, TaskTransition(*transition)}) == 1
    assert AttemptRecord("t", "k", "llm", 1, 0.0, 1.0, "ok", "done", 1.0, None, None, None).ratelimit is None


def test_rows_are_the_same_whenever_they_are_built(events: list) -> None:
    """Reading an in-memory log's rows mid-stream (which builds them from the events held so far)
    and carrying on gives the rows of a log that built them all at the end."""
    once = CallLog().extend(events)
    piecewise = CallLog()
    for index, event in enumerate(events):
        piecewise(event)
        if index % 97 == 0:
            assert len(piecewise.calls_rows) <= len(once.calls_rows)
    assert piecewise.as_dicts() == once.as_dicts()
    tasks, calls = once.as_dicts()
    assert len(calls) == sum(isinstance(e, AttemptRecord) for e in events)
    assert len(tasks) == len({e.task_id for e in events if isinstance(e, TaskTransition)})
    first = next(e for e in events if isinstance(e, AttemptRecord))
    row = next(c for c in calls if (c["task_id"], c["attempt"]) == (first.task_id, first.attempt))
    assert row["latency_s"] == first.end - first.start and row["priority"] == "background"


def test_a_streaming_log_holds_at_most_flush_rows_events_and_writes_as_it_goes(
    events: list, tmp_path: Path
) -> None:
    flush_rows = 25
    log = CallLog(tmp_path / "log", flush_rows=flush_rows)
    half = len(events) // 2
    for event in events[:half]:
        log(event)
        assert len(log._pending) < flush_rows  # the raw events held between flushes
    with open(tmp_path / "log" / "calls.csv", newline="") as file:
        written = list(csv.reader(file))
    assert written[0] == list(CALL_LOG_COLUMNS)
    attempts_so_far = sum(isinstance(e, AttemptRecord) for e in events[:half])
    assert attempts_so_far - flush_rows <= len(written) - 1 <= attempts_so_far
    log.extend(events[half:])
    log.close()
    memory = CallLog().extend(events)
    memory.write(tmp_path / "memory")
    for name in ("tasks.csv", "calls.csv"):
        assert (tmp_path / "log" / name).read_text() == (tmp_path / "memory" / name).read_text()
    header = (tmp_path / "log" / "tasks.csv").read_text().splitlines()[0]
    assert header.split(",") == list(TASK_LOG_COLUMNS)


def test_the_provider_rate_limit_view_lands_in_its_columns() -> None:
    snapshot = RateLimitSnapshot(
        limit_requests=150, remaining_requests=3, reset_requests_s=1.5,
        limit_tokens=9000, remaining_tokens=100, reset_tokens_s=2.5,
    )  # fmt: skip
    log = CallLog()
    log(TaskTransition(0.0, "t", "k", "llm", 0, None, "queued", 0, 10.0))
    log(
        AttemptRecord(
            "t", "k", "llm", 1, 1.0, 1.25, "RateLimitError", "retry", 10.0, None, 2.0, 2.0, None, snapshot
        )
    )
    (call,) = log.as_dicts()[1]
    assert call["priority"] == "interactive" and call["outcome_class"] == "rate_limited"
    assert [call[c] for c in CALL_LOG_COLUMNS[-6:]] == [150, 3, 1.5, 9000, 100, 2.5]


def test_a_streamed_parquet_log_holds_the_rows_of_a_log_written_whole(events: list, tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    from aiqsim.lab.calibrate import read_call_log

    with CallLog(tmp_path / "streamed", flush_rows=25, format="parquet") as log:
        log.extend(events)
    CallLog().extend(events).write(tmp_path / "whole", format="parquet")
    CallLog().extend(events).write(tmp_path / "csv")
    streamed, whole, text = (read_call_log(tmp_path / name) for name in ("streamed", "whole", "csv"))
    for got, want, as_csv in zip(streamed, whole, text, strict=True):
        assert len(got) > 25  # several row groups
        pd.testing.assert_frame_equal(got, want)
        # the same values as the CSV log (types aside: a column empty in CSV reads as float there)
        for column in got.columns:
            assert got[column].astype(str).tolist() == as_csv[column].astype(str).tolist() or np.allclose(
                got[column].astype(float), as_csv[column].astype(float), equal_nan=True
            ), column


def test_a_bad_format_is_refused(tmp_path: Path) -> None:
    from aiqsim.core.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="format"):
        CallLog(tmp_path, format="json")  # type: ignore[arg-type]


@pytest.mark.parametrize("format", ["csv", "parquet"])
def test_a_streamed_log_never_overwrites_a_log_already_in_its_folder(
    events: list, tmp_path: Path, format: str
) -> None:
    """Before: CallLog(folder) opened tasks.csv and calls.csv for writing, so a worker restarted with
    the folder of its last run emptied the production log calibrate needs (review); and when the
    second file could not be opened, the first had already been emptied."""
    from aiqsim.scheduler.call_log import CallLog, CallLogError

    if format == "parquet":
        pytest.importorskip("pyarrow")
    folder = tmp_path / "log"
    with CallLog(folder, format=format) as log:  # type: ignore[arg-type]
        log.extend(events)
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    for again in ("csv", "parquet"):
        with pytest.raises(CallLogError, match=r"already holds a call log .*nothing in it was changed"):
            CallLog(folder, format=again)  # type: ignore[arg-type]
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before

    half = tmp_path / "half"
    (half / "calls.csv").mkdir(parents=True)  # one of the two names taken by something else
    with pytest.raises(CallLogError, match=r"calls\.csv"):
        CallLog(half)
    assert sorted(path.name for path in half.iterdir()) == ["calls.csv"]  # tasks.csv not left behind
