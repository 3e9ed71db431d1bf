"""Workload generation's fast paths give what the general code gives.

Two shortcuts: a trace whose timestamps ascend is cut at the horizon by bisection instead of
filtering every row, and single-click workloads skip the sort of (time, action, click). Each test
runs the fast and the general path (or the documented rule written out) on the same input.
"""

from __future__ import annotations

import csv
import random
from dataclasses import astuple
from pathlib import Path

import pytest

from aiqsim.sim import workloads as workloads_module
from aiqsim.sim.scenario import parse_scenario
from aiqsim.sim.workloads import Arrival, _Action, _expand_clicks, generate_arrivals, read_trace


def _write_trace(path: Path, offsets_ms: list[int]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        for number, offset in enumerate(offsets_ms):
            seconds, millis = divmod(offset, 1000)
            minutes, seconds = divmod(seconds, 60)
            writer.writerow(
                [f"2024-01-01 10:{minutes:02d}:{seconds:02d}.{millis:03d}", 10 + number, 1 + number]
            )
    return path


def _arrivals(trace: Path, *, speedup: float = 1.0, start_s: float = 0.0, duration_s: float = 30.0, **extra):
    workload = {
        "type": "trace",
        "provider": "llm",
        "trace": str(trace),
        "speedup": speedup,
        "start_s": start_s,
    }
    scenario = parse_scenario(
        {
            "scenario": {"name": "t", "duration_s": duration_s},
            "providers": [{"name": "llm"}],
            "workloads": [{**workload, **extra}],
        },
        source="<test>",
    )
    return [astuple(a) for a in generate_arrivals(scenario, random.Random(3))]


@pytest.mark.parametrize(
    ("speedup", "start_s", "duration_s", "extra"),
    [
        (1.0, 0.0, 30.0, {}),
        (3.0, 2.5, 17.25, {}),
        (0.7, 0.0, 41.0, {"end_s": 20.0}),
        (2.0, 1.0, 60.0, {"count": 9}),
    ],
)
def test_a_sorted_trace_gives_the_general_paths_arrivals(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    speedup: float,
    start_s: float,
    duration_s: float,
    extra: dict,
) -> None:
    rng = random.Random(11)
    offsets = sorted(rng.randrange(0, 90_000) for _ in range(60))
    offsets[10:13] = [offsets[10]] * 3  # equal timestamps, some possibly right at the horizon
    trace = _write_trace(tmp_path / "sorted.csv", offsets)
    fast = _arrivals(trace, speedup=speedup, start_s=start_s, duration_s=duration_s, **extra)
    monkeypatch.setattr(workloads_module, "_offsets_ascend", lambda trace, rows: False)
    general = _arrivals(trace, speedup=speedup, start_s=start_s, duration_s=duration_s, **extra)
    assert fast == general
    assert 0 < len(fast) < 60  # the horizon cut some rows off


def test_a_row_exactly_at_the_horizon_is_kept(tmp_path: Path) -> None:
    trace = _write_trace(tmp_path / "edge.csv", [0, 1000, 5000, 5000, 5001, 9000])
    times = [row[0] for row in _arrivals(trace, duration_s=5.0)]
    assert times == [0.0, 1.0, 5.0, 5.0]


def test_an_unsorted_trace_keeps_every_row_inside_the_horizon(tmp_path: Path) -> None:
    # A later row may start before an earlier one: no prefix cut may drop it.
    trace = _write_trace(tmp_path / "unsorted.csv", [0, 40_000, 2000, 50_000, 3000, 1000])
    assert not workloads_module._offsets_ascend(str(trace), read_trace(str(trace)))
    assert sorted(row[0] for row in _arrivals(trace, duration_s=10.0)) == [0.0, 1.0, 2.0, 3.0]


def test_the_ascending_answer_is_kept_with_the_rows_it_is_about(tmp_path: Path) -> None:
    path = _write_trace(tmp_path / "t.csv", [0, 1000, 2000])
    rows = read_trace(str(path))
    assert workloads_module._offsets_ascend(str(path), rows)
    _write_trace(path, [0, 3000, 1000])  # the file changes; a fresh read gives a new tuple
    read_trace.cache_clear()
    assert not workloads_module._offsets_ascend(str(path), read_trace(str(path)))


def _documented_order(
    actions: list[_Action], clicks: int, gap: float
) -> list[tuple[float, int, int, _Action]]:
    """Every click of every action, sorted by (time, action number, click): the rule written out."""
    items = [(a.time + c * gap, n, c, a) for n, a in enumerate(actions) for c in range(clicks)]
    return sorted(items, key=lambda item: item[:3])


@pytest.mark.parametrize("clicks", [1, 2, 3])
def test_clicks_are_expanded_in_time_action_click_order(clicks: int) -> None:
    rng = random.Random(clicks)
    times = sorted(round(rng.uniform(0, 5), 1) for _ in range(200))  # many equal times
    actions = [_Action(t, i, 1, 1, False) for i, t in enumerate(times)]
    assert _expand_clicks(actions, clicks, 0.05) == _documented_order(actions, clicks, 0.05)


def test_arrival_built_positionally_equals_one_built_by_keyword() -> None:
    by_keyword = Arrival(
        time=1.5,
        task_id="w0-000001",
        provider="llm",
        priority="background",
        payload={"a": 1},
        cost_estimate=3.0,
        action="w0-a000001",
    )
    assert Arrival(1.5, "w0-000001", "llm", "background", {"a": 1}, 3.0, "w0-a000001") == by_keyword


def test_rows_earlier_than_the_first_are_not_given_negative_offsets(tmp_path: Path) -> None:
    """Before: offsets were taken from the file's first row, so a row 5 s before it arrived 5 s
    before the workload's start (review); they are now taken from the earliest row."""
    trace = _write_trace(tmp_path / "late_first.csv", [5000, 0, 1000])
    assert [row.offset_s for row in read_trace(str(trace))] == [5.0, 0.0, 1.0]
    assert sorted(row[0] for row in _arrivals(trace, duration_s=10.0)) == [0.0, 1.0, 5.0]
