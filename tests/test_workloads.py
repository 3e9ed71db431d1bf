"""Workload generation: counts, ordering, determinism, double-clicks, poison, trace replay."""

from __future__ import annotations

import csv
import datetime
import itertools
import math
import random
import statistics
from collections import Counter, defaultdict
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiqsim.sim import workloads as workloads_module
from aiqsim.sim.replay_arrivals import ReplayArrivalsError, read_replay_arrivals
from aiqsim.sim.scenario import parse_scenario
from aiqsim.sim.workloads import (
    Arrival,
    TraceError,
    generate_arrivals,
    parse_trace_timestamp,
    read_trace,
)

PACKAGED_TRACE = resources.files("aiqsim").joinpath("data", "azure_llm_code_2023.csv")


def make_scenario(*workloads: dict, duration_s: float = 600.0, providers: list[dict] | None = None, **extra):
    mapping = {
        "scenario": {"name": "test", "duration_s": duration_s},
        "providers": providers or [{"name": "llm"}, {"name": "tts", "kind": "tts"}],
        "workloads": list(workloads),
        **extra,
    }
    return parse_scenario(mapping, source="<test>")


def arrivals_of(*workloads: dict, seed: int = 0, **kwargs) -> list[Arrival]:
    return generate_arrivals(make_scenario(*workloads, **kwargs), random.Random(seed))


def test_poisson_count_stops_after_exactly_count_arrivals():
    arrivals = arrivals_of({"type": "poisson", "provider": "llm", "rate_per_s": 5, "count": 37})
    assert len(arrivals) == 37
    assert all(0 < a.time <= 600 for a in arrivals)


def test_poisson_end_bounds_times_and_rate_matches_on_average():
    counts = []
    for seed in range(20):
        arrivals = arrivals_of(
            {"type": "poisson", "provider": "llm", "rate_per_s": 4, "start_s": 10, "end_s": 60}, seed=seed
        )
        assert all(10 < a.time <= 60 for a in arrivals)
        counts.append(len(arrivals))
    # 20 runs of a Poisson(200) count: the mean is within 5 standard errors of 200
    assert abs(statistics.mean(counts) - 200) < 5 * math.sqrt(200 / 20)


def test_poisson_without_end_runs_until_the_scenario_duration():
    arrivals = arrivals_of({"type": "poisson", "provider": "llm", "rate_per_s": 10}, duration_s=30)
    assert arrivals and max(a.time for a in arrivals) <= 30
    assert 300 - 5 * math.sqrt(300) < len(arrivals) < 300 + 5 * math.sqrt(300)


def test_count_is_truncated_at_the_scenario_duration():
    arrivals = arrivals_of(
        {"type": "poisson", "provider": "llm", "rate_per_s": 1, "count": 10_000}, duration_s=20
    )
    assert 0 < len(arrivals) < 100
    assert max(a.time for a in arrivals) <= 20


def test_burst_spreads_count_arrivals_evenly_over_burst_s():
    arrivals = arrivals_of({"type": "burst", "provider": "llm", "count": 8, "start_s": 5, "burst_s": 2})
    assert [a.time for a in arrivals] == [5 + 2 * i / 8 for i in range(8)]
    instant = arrivals_of({"type": "burst", "provider": "llm", "count": 5, "start_s": 1})
    assert [a.time for a in instant] == [1.0] * 5


def test_arrivals_are_sorted_with_unique_readable_ids_across_workloads():
    arrivals = arrivals_of(
        {"type": "poisson", "provider": "llm", "rate_per_s": 3, "end_s": 50},
        {
            "type": "burst",
            "provider": "tts",
            "count": 40,
            "start_s": 10,
            "burst_s": 20,
            "priority": "interactive",
        },
        {"type": "double_click", "provider": "llm", "rate_per_s": 1, "end_s": 50},
    )
    times = [a.time for a in arrivals]
    assert times == sorted(times)
    ids = [a.task_id for a in arrivals]
    assert len(set(ids)) == len(ids)
    for arrival in arrivals:
        workload, serial = arrival.task_id.split("-")
        assert workload in {"w0", "w1", "w2"} and len(serial) == 6 and serial.isdigit()
    by_workload = Counter(a.task_id.split("-")[0] for a in arrivals)
    assert by_workload["w1"] == 40
    assert {a.provider for a in arrivals if a.task_id.startswith("w1-")} == {"tts"}
    assert {a.priority for a in arrivals if a.task_id.startswith("w1-")} == {"interactive"}
    assert {a.priority for a in arrivals if a.task_id.startswith("w0-")} == {"background"}
    # within one workload, serial numbers follow time order
    for prefix in ("w0", "w1", "w2"):
        own = [a for a in arrivals if a.task_id.startswith(prefix + "-")]
        assert [a.task_id for a in own] == sorted(a.task_id for a in own)


def test_same_seed_same_arrivals_and_other_seed_differs():
    workloads = (
        {"type": "poisson", "provider": "llm", "rate_per_s": 2, "cost": {"dist": "lognormal", "mean": 300}},
        {"type": "double_click", "provider": "llm", "rate_per_s": 1, "poison_fraction": 0.3},
    )
    scenario = make_scenario(*workloads, duration_s=60)
    first = generate_arrivals(scenario, random.Random(42))
    again = generate_arrivals(scenario, random.Random(42))
    other = generate_arrivals(scenario, random.Random(43))
    assert first == again
    assert first != other


def test_changing_one_workload_leaves_the_others_unchanged():
    base = {"type": "poisson", "provider": "llm", "rate_per_s": 2, "cost": {"dist": "lognormal", "mean": 300}}
    a = arrivals_of(base, {"type": "poisson", "provider": "llm", "rate_per_s": 1}, seed=5, duration_s=60)
    b = arrivals_of(base, {"type": "poisson", "provider": "llm", "rate_per_s": 9}, seed=5, duration_s=60)
    assert [x for x in a if x.task_id.startswith("w0-")] == [x for x in b if x.task_id.startswith("w0-")]


def test_double_click_clicks_share_action_and_identical_payload_with_fixed_gaps():
    arrivals = arrivals_of(
        {
            "type": "double_click",
            "provider": "llm",
            "rate_per_s": 2,
            "count": 50,
            "clicks": 3,
            "click_gap_s": 0.07,
            "cost": {"dist": "lognormal", "mean": 400, "sigma": 0.8},
        },
        seed=3,
    )
    assert len(arrivals) == 150
    by_action = defaultdict(list)
    for arrival in arrivals:
        by_action[arrival.action].append(arrival)
    assert len(by_action) == 50
    payload_inputs = set()
    for clicks in by_action.values():
        assert len(clicks) == 3
        clicks.sort(key=lambda a: a.time)
        assert all(c.payload == clicks[0].payload for c in clicks)
        assert all(c.payload is not clicks[0].payload for c in clicks[1:])  # no shared mutable dicts
        assert len({c.task_id for c in clicks}) == 3
        assert {c.cost_estimate for c in clicks} == {clicks[0].cost_estimate}
        gaps = [b.time - a.time for a, b in itertools.pairwise(clicks)]
        assert gaps == pytest.approx([0.07, 0.07])
        payload_inputs.add(clicks[0].payload["input"])
    assert len(payload_inputs) == 50  # without distinct_inputs, every action has its own input


def test_payload_shape_and_cost_estimate():
    arrivals = arrivals_of(
        {
            "type": "burst",
            "provider": "llm",
            "count": 20,
            "cost": {"dist": "fixed", "mean": 1000, "output_fraction": 0.3},
        },
        {"type": "burst", "provider": "tts", "count": 20, "cost": {"dist": "uniform", "low": 50, "high": 80}},
    )
    for arrival in arrivals:
        payload = arrival.payload
        assert set(payload) == {"input", "prompt_units", "output_units", "poison"}
        assert isinstance(payload["input"], str)
        assert arrival.cost_estimate == payload["prompt_units"] + payload["output_units"]
        if arrival.provider == "llm":
            assert (payload["prompt_units"], payload["output_units"]) == (700, 300)
        else:
            assert payload["prompt_units"] == 0
            assert 50 <= payload["output_units"] <= 80


def test_lognormal_cost_has_the_configured_mean():
    arrivals = arrivals_of(
        {
            "type": "burst",
            "provider": "tts",
            "count": 4000,
            "cost": {"dist": "lognormal", "mean": 500, "sigma": 0.5},
        },
        seed=9,
    )
    sizes = [a.cost_estimate for a in arrivals]
    # standard deviation of a lognormal with mean 500 and sigma 0.5 is about 267
    assert abs(statistics.mean(sizes) - 500) < 5 * 267 / math.sqrt(len(sizes))
    assert min(sizes) >= 1


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.25, 1.0])
def test_poison_fraction_of_unique_inputs_is_exact(fraction):
    arrivals = arrivals_of({"type": "burst", "provider": "llm", "count": 200, "poison_fraction": fraction})
    assert sum(a.payload["poison"] for a in arrivals) == round(fraction * 200)


def test_poison_marks_whole_double_click_actions():
    arrivals = arrivals_of(
        {"type": "double_click", "provider": "llm", "count": 40, "rate_per_s": 4, "poison_fraction": 0.25}
    )
    poisoned_actions = {a.action for a in arrivals if a.payload["poison"]}
    assert len(poisoned_actions) == 10
    assert sum(a.payload["poison"] for a in arrivals) == 20


def test_distinct_inputs_recur_with_identical_payloads_and_exact_poison_share():
    arrivals = arrivals_of(
        {
            "type": "poisson",
            "provider": "llm",
            "rate_per_s": 50,
            "count": 3000,
            "distinct_inputs": 40,
            "poison_fraction": 0.2,
            "cost": {"dist": "lognormal", "mean": 300},
        },
        seed=1,
    )
    payloads: dict[str, dict] = {}
    for arrival in arrivals:
        payloads.setdefault(arrival.payload["input"], arrival.payload)
        assert arrival.payload == payloads[arrival.payload["input"]]
    assert len(payloads) == 40  # 3000 draws from 40 inputs see all of them
    assert sum(p["poison"] for p in payloads.values()) == 8
    assert len({a.action for a in arrivals}) == 3000  # recurring input, but separate user actions


def test_no_arrival_starts_after_the_duration_but_clicks_stay_together():
    arrivals = arrivals_of(
        {"type": "double_click", "provider": "llm", "rate_per_s": 5, "clicks": 2, "click_gap_s": 0.5},
        duration_s=10,
    )
    firsts = {}
    for arrival in arrivals:
        firsts[arrival.action] = min(firsts.get(arrival.action, math.inf), arrival.time)
    assert max(firsts.values()) <= 10
    assert all(n == 2 for n in Counter(a.action for a in arrivals).values())


def test_runaway_generation_is_refused(monkeypatch):
    monkeypatch.setattr(workloads_module, "MAX_ARRIVALS_PER_WORKLOAD", 500)
    # refused when the scenario is read, from its arithmetic, before any arrival is drawn
    with pytest.raises(ValueError, match="about 6,000 arrivals; at most 500 fit"):
        arrivals_of({"type": "poisson", "provider": "llm", "rate_per_s": 100}, duration_s=60)
    with pytest.raises(ValueError, match="count is 501; at most 500 arrivals fit"):
        arrivals_of({"type": "burst", "provider": "llm", "count": 501}, duration_s=60)


# --- trace replay -------------------------------------------------------------------------------


def write_trace(path: Path, rows: list[tuple[str, int, int]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\r\n")
        writer.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        writer.writerows(rows)
    return path


def test_trace_timestamps_keep_seven_fractional_digits():
    later = parse_trace_timestamp("2023-11-16 18:17:04.0319601")
    earlier = parse_trace_timestamp("2023-11-16 18:17:03.9799600")
    assert later - earlier == 520_001  # 0.0520001 s in 100 ns ticks
    across_midnight = parse_trace_timestamp("2023-11-17 00:00:00.0000000") - parse_trace_timestamp(
        "2023-11-16 23:59:59.9999999"
    )
    assert across_midnight == 1


@settings(max_examples=200, deadline=None)
@given(
    moment=st.datetimes(min_value=datetime.datetime(1900, 1, 1), max_value=datetime.datetime(2200, 12, 31)),
    ticks=st.integers(min_value=0, max_value=9_999_999),
)
def test_trace_timestamps_agree_with_the_calendar(moment, ticks):
    moment = moment.replace(microsecond=0)
    text = f"{moment:%Y-%m-%d %H:%M:%S}.{ticks:07d}"
    seconds = (moment - datetime.datetime(1970, 1, 1)) // datetime.timedelta(seconds=1)
    assert parse_trace_timestamp(text) == seconds * 10_000_000 + ticks


@pytest.mark.parametrize(
    ("text", "ticks_after_midnight"),
    [
        ("2024-02-29 00:00:00", 0),
        ("2024-02-29T23:59:59.9999999", 863_999_999_999),
        ("  2024-02-29 12:00:00.5  ", 432_005_000_000),
        ("2024-02-29 00:01:02.1234567", 621_234_567),
    ],
)
def test_trace_timestamp_forms_share_the_day_they_name(text, ticks_after_midnight):
    # the day's start is worked out once per date and reused: every form of the same date agrees
    midnight = parse_trace_timestamp("2024-02-29 00:00:00.0000000")
    assert parse_trace_timestamp(text) - midnight == ticks_after_midnight


def test_an_impossible_date_is_refused_after_a_valid_one_of_its_month():
    parse_trace_timestamp("2023-02-28 00:00:00")
    for _ in range(2):  # refused every time, not only before the valid date was worked out
        with pytest.raises(ValueError, match="day or time out of range"):
            parse_trace_timestamp("2023-02-29 00:00:00")
    with pytest.raises(ValueError, match="month out of range"):
        parse_trace_timestamp("2023-00-10 00:00:00")
    with pytest.raises(ValueError, match="day or time out of range"):
        parse_trace_timestamp("2023-02-28 23:60:00")


@pytest.mark.parametrize(
    "text", ["2023-02-29 00:00:00.0", "2023-13-01 00:00:00", "2023-11-16 24:00:00", "16/11/2023 18:17", ""]
)
def test_impossible_trace_timestamps_are_refused(text):
    with pytest.raises(ValueError):
        parse_trace_timestamp(text)


def test_trace_replay_times_speedup_start_and_sizes(tmp_path):
    trace = write_trace(
        tmp_path / "t.csv",
        [
            ("2024-01-01 10:00:00.5000000", 100, 10),
            ("2024-01-01 10:00:02.5000000", 200, 20),
            ("2024-01-01 10:00:02.5000000", 300, 30),
            ("2024-01-01 10:00:10.0000000", 400, 40),
        ],
    )
    arrivals = arrivals_of(
        {"type": "trace", "provider": "llm", "trace": str(trace), "speedup": 2, "start_s": 1}, duration_s=100
    )
    assert [a.time for a in arrivals] == [1.0, 2.0, 2.0, 5.75]
    assert [(a.payload["prompt_units"], a.payload["output_units"]) for a in arrivals] == [
        (100, 10),
        (200, 20),
        (300, 30),
        (400, 40),
    ]
    first_two = arrivals_of(
        {"type": "trace", "provider": "llm", "trace": str(trace), "count": 2}, duration_s=100
    )
    assert [a.payload["prompt_units"] for a in first_two] == [100, 200]
    as_tts = arrivals_of({"type": "trace", "provider": "tts", "trace": str(trace)}, duration_s=100)
    assert [(a.payload["prompt_units"], a.payload["output_units"]) for a in as_tts[:2]] == [
        (0, 110),
        (0, 220),
    ]


def test_trace_rows_with_bad_values_name_the_line(tmp_path):
    trace = write_trace(tmp_path / "bad.csv", [("2024-01-01 10:00:00.5", 1, 1), ("yesterday", 2, 2)])
    with pytest.raises(TraceError, match="line 3"):
        read_trace(str(trace))


def test_sizes_no_call_has_are_refused_naming_the_line(tmp_path):
    """A 401-digit token count loaded, then overflowed a float at run time (OverflowError traceback)."""
    huge = 10**400
    trace = write_trace(
        tmp_path / "huge.csv", [("2024-01-01 10:00:00", 5, 1), ("2024-01-01 10:00:01", huge, 1)]
    )
    with pytest.raises(TraceError, match="line 3: a token count above 1e\\+12 is no call"):
        read_trace(str(trace))
    replay = tmp_path / "replay.csv"
    replay.write_text(f"offset_s,prompt_units,output_units,input\n0.5,{huge},10,a\n", encoding="utf-8")
    with pytest.raises(
        ReplayArrivalsError, match="line 2: expected offset_s >= 0 and sizes from 0 to 1e\\+12"
    ):
        read_replay_arrivals(str(replay))


def count_packaged_rows() -> tuple[int, int, int]:
    """Rows and token totals of the packaged trace, read straight from its bytes."""
    lines = PACKAGED_TRACE.read_bytes().decode("utf-8").splitlines()
    assert lines[0].split(",") == ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
    data = [line.split(",") for line in lines[1:] if line.strip()]
    return len(data), sum(int(row[1]) for row in data), sum(int(row[2]) for row in data)


def test_packaged_azure_code_trace_replays_every_request_and_token():
    rows, context_total, generated_total = count_packaged_rows()
    # the Azure LLM inference trace 2023 "code" file documents 8,819 requests
    assert rows == 8819
    arrivals = arrivals_of({"type": "trace", "provider": "llm", "trace": "azure_code"}, duration_s=4000)
    assert len(arrivals) == rows
    assert sum(a.payload["prompt_units"] for a in arrivals) == context_total
    assert sum(a.payload["output_units"] for a in arrivals) == generated_total
    assert arrivals[0].time == 0.0
    # 2023-11-16 18:17:03.9799600 to 19:14:19.9280160
    assert arrivals[-1].time == pytest.approx(57 * 60 + 15.948056)
    assert len({a.payload["input"] for a in arrivals}) == rows


def test_trace_speedup_compresses_time_and_duration_cuts_the_replay():
    full = arrivals_of(
        {"type": "trace", "provider": "llm", "trace": "azure_code", "speedup": 10}, duration_s=400
    )
    assert len(full) == count_packaged_rows()[0]
    assert max(a.time for a in full) <= 3436 / 10
    cut = arrivals_of({"type": "trace", "provider": "llm", "trace": "azure_code"}, duration_s=300)
    offsets = [row.offset_s for row in read_trace("azure_code")]
    assert len(cut) == sum(1 for offset in offsets if offset <= 300)


def test_trace_poison_fraction_is_exact():
    arrivals = arrivals_of(
        {"type": "trace", "provider": "llm", "trace": "azure_code", "count": 1000, "poison_fraction": 0.05},
        duration_s=4000,
    )
    assert len(arrivals) == 1000
    assert sum(a.payload["poison"] for a in arrivals) == 50


def test_packaged_data_carries_its_attribution():
    readme = resources.files("aiqsim").joinpath("data", "README.md").read_text(encoding="utf-8")
    for phrase in (
        "Azure LLM inference trace 2023",
        "Azure/AzurePublicDataset",
        "CC-BY 4.0",
        "Splitwise: Efficient generative LLM inference using phase splitting",
        "ISCA 2024",
        "Patel",
    ):
        assert phrase in readme


def test_trace_rows_built_without_a_class_call_are_ordinary_frozen_rows():
    import dataclasses

    from aiqsim.sim.workloads import TraceRow, _new_trace_row

    row = _new_trace_row(1.5, 2, 3)
    assert type(row) is TraceRow and row == TraceRow(1.5, 2, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.offset_s = 0.0  # type: ignore[misc]
