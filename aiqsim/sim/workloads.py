"""Workload generation: a scenario's workloads turned into a time-ordered list of arrivals.

Each :class:`~aiqsim.sim.config.WorkloadConfig` becomes a stream of :class:`Arrival` records
(what to submit, when, to which provider, at which priority). Generation is pure and
deterministic: all randomness comes from the ``random.Random`` passed in, and each workload
draws from its own child generator, so changing one workload does not reshuffle the others.

Arrivals never start after ``scenario.duration_s`` (the scenario's arrival horizon); the
clicks of one double-click stay together even when the last click falls just past it.
"""

from __future__ import annotations

import bisect
import csv
import functools
import itertools
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from math import floor, log, sqrt  # names, not math.x: one lookup fewer per call in the hot path
from pathlib import Path

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.slot_init import compile_builder, fast_frozen_init
from aiqsim.sim.config import MAX_CALL_UNITS, CostConfig, ProviderKind, Scenario, WorkloadConfig
from aiqsim.sim.replay_arrivals import read_replay_arrivals

TRACE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
"""Columns a trace CSV must have (the Azure LLM inference trace layout)."""

BUILTIN_TRACES: dict[str, str] = {"azure_code": "azure_llm_code_2023.csv"}
"""Trace names usable as ``trace = "..."`` in scenario files, mapped to files in ``aiqsim/data``."""

MAX_ARRIVALS_PER_WORKLOAD = 2_000_000
"""Guard against a typo (``rate_per_s = 1e6``) turning into an endless generation loop."""

_TICKS_PER_SECOND = 10_000_000  # trace timestamps carry 7 fractional digits (100 ns ticks)
_TIMESTAMP = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,7}))?")
_DAYS_IN_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


@fast_frozen_init  # one per submission: see aiqsim.core.slot_init
@dataclass(frozen=True, slots=True)
class Arrival:
    """One submission: at ``time`` (virtual seconds) submit ``payload`` to ``provider``.

    ``payload`` is ``{"input": str, "prompt_units": int, "output_units": int, "poison": bool}``;
    ``cost_estimate`` is ``prompt_units + output_units``. ``action`` names the user action that
    caused it: the clicks of one double-click share it (and carry identical payloads).
    """

    time: float
    task_id: str
    provider: str
    priority: str
    payload: dict
    cost_estimate: float
    action: str
    tenant: str | None = None
    """The workload's ``tenant``, submitted with the task (``None``: the scenario has no tenants)."""


class WorkloadTooLargeError(ConfigurationError):
    """A workload whose arrivals would not fit in memory (more than :data:`MAX_ARRIVALS_PER_WORKLOAD`)."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(f"workload {index} {message}")
        self.index = index
        self.message = message


class TraceError(ConfigurationError):
    """A trace CSV that cannot be replayed (missing columns, unparsable row, no rows)."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request of a trace: seconds after the first row, prompt and output sizes."""

    offset_s: float
    context_tokens: int
    generated_tokens: int


def is_builtin_trace(trace: str) -> bool:
    """Whether ``trace`` names a packaged trace rather than a file path."""
    return trace in BUILTIN_TRACES


def _open_trace_text(trace: str):
    """Open a trace (packaged name or path) as text; packaged traces come via importlib.resources."""
    if is_builtin_trace(trace):
        resource = resources.files("aiqsim").joinpath("data", BUILTIN_TRACES[trace])
        return resource.open("r", encoding="utf-8", newline="")
    return Path(trace).open("r", encoding="utf-8", newline="")


def _check_header(header: list[str] | None, trace: str) -> dict[str, int]:
    if header is None:
        raise TraceError(
            f"trace {trace!r} is empty; expected a header with columns {', '.join(TRACE_COLUMNS)}"
        )
    names = [name.strip() for name in header]
    missing = [column for column in TRACE_COLUMNS if column not in names]
    if missing:
        raise TraceError(
            f"trace {trace!r} lacks column(s) {', '.join(missing)}; expected {', '.join(TRACE_COLUMNS)}, "
            f"found {', '.join(names) or 'none'}"
        )
    return {column: names.index(column) for column in TRACE_COLUMNS}


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).

    Plain arithmetic instead of :mod:`datetime`, which the simulation packages do not import
    (they must never be tempted to read a real clock).
    """
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


def _is_leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def parse_trace_timestamp(text: str) -> int:
    """A trace TIMESTAMP (``2023-11-16 18:17:03.9799600``, UTC) as an integer count of 100 ns ticks.

    Integer ticks keep all 7 fractional digits exact (a float or a datetime would not);
    differences of ticks then give exact offsets between rows.
    """
    match = _TIMESTAMP_MATCH(text) or _TIMESTAMP_MATCH(text.strip())
    if match is None:
        raise ConfigurationError(f"expected a timestamp like 2023-11-16 18:17:03.9799600, got {text!r}")
    year, month, day, hour, minute, second, fraction = match.groups()
    day_start = _day_start_ticks(year, month, day)
    if type(day_start) is str:
        raise ConfigurationError(f"{day_start} out of range in timestamp {text!r}")
    hours, minutes_seconds = divmod(int(hour + minute + second), 10_000)  # one int() for HHMMSS
    minutes, seconds = divmod(minutes_seconds, 100)
    if hours > 23 or minutes > 59 or seconds > 59:
        raise ConfigurationError(f"day or time out of range in timestamp {text!r}")
    ticks = day_start + ((hours * 60 + minutes) * 60 + seconds) * _TICKS_PER_SECOND
    return ticks + int((fraction + "0000000")[:7]) if fraction else ticks


_TIMESTAMP_MATCH = _TIMESTAMP.fullmatch


@functools.lru_cache(maxsize=4096)
def _day_start_ticks(year: str, month: str, day: str) -> int | str:
    """The tick count at 00:00 of a trace date given as its digits, or what is out of range
    (``"month"``, ``"day or time"``). Cached: a trace's rows share a few dates, and working each
    row's date out again was much of the cost of reading a trace."""
    year_number, month_number, day_number = int(year), int(month), int(day)
    if not 1 <= month_number <= 12:
        return "month"
    last = 29 if month_number == 2 and _is_leap(year_number) else _DAYS_IN_MONTH[month_number - 1]
    if not 1 <= day_number <= last:
        return "day or time"
    return _days_from_civil(year_number, month_number, day_number) * 86_400 * _TICKS_PER_SECOND


_new_trace_row: Callable[[float, int, int], TraceRow] = compile_builder(TraceRow)
"""``TraceRow(offset_s, context_tokens, generated_tokens)`` without a class call (one per trace row)."""


@functools.lru_cache(maxsize=8)
def read_trace(trace: str) -> tuple[TraceRow, ...]:
    """All rows of a trace, in file order, with offsets relative to its earliest row (cached): the
    first row of a trace in time order, and no row of an unsorted one gets a negative offset (an
    arrival before the workload's start).

    Raises :class:`TraceError` naming the file (and line) for anything unreadable: missing
    columns, a row that does not parse, a negative token count, no rows at all, not UTF-8.
    """
    parsed: list[tuple[int, int, int]] = []
    append = parsed.append
    try:
        with _open_trace_text(trace) as handle:
            reader = csv.reader(handle)
            index = _check_header(next(reader, None), trace)
            at_timestamp = index["TIMESTAMP"]
            at_context = index["ContextTokens"]
            at_generated = index["GeneratedTokens"]
            for row in reader:
                if not row or not "".join(row).strip():  # a blank line, or only blank cells
                    continue
                try:
                    ticks = parse_trace_timestamp(row[at_timestamp])
                    context = int(row[at_context])
                    generated = int(row[at_generated])
                except (ValueError, IndexError) as exc:
                    raise TraceError(
                        f"trace {trace!r}, line {reader.line_num}: cannot parse {row!r}: {exc}"
                    ) from None
                if context < 0 or generated < 0:
                    raise TraceError(
                        f"trace {trace!r}, line {reader.line_num}: negative token count in {row!r}"
                    )
                if context > MAX_CALL_UNITS or generated > MAX_CALL_UNITS:
                    raise TraceError(
                        f"trace {trace!r}, line {reader.line_num}: a token count above {MAX_CALL_UNITS:.0e} "
                        "is no call"
                    )
                append((ticks, context, generated))
    except OSError as exc:
        raise TraceError(f"cannot read trace {trace!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TraceError(f"trace {trace!r} is not UTF-8 text") from None
    except csv.Error as exc:  # e.g. a field over the csv module's size limit, a NUL byte
        raise TraceError(f"trace {trace!r} is not a readable CSV file: {exc}") from None
    if not parsed:
        raise TraceError(f"trace {trace!r} has a header but no rows")
    earliest = min(ticks for ticks, _, _ in parsed)
    return tuple(
        _new_trace_row((ticks - earliest) / _TICKS_PER_SECOND, context, generated)
        for ticks, context, generated in parsed
    )


def draw_units(cost: CostConfig, rng: random.Random) -> int:
    """One task's size in provider units drawn from ``cost`` (whole units, at least 1)."""
    if cost.dist == "fixed":
        value = cost.mean
    elif cost.dist == "lognormal":
        # mean of a lognormal is exp(mu + sigma^2 / 2): choose mu so the mean is cost.mean
        value = rng.lognormvariate(log(cost.mean) - cost.sigma**2 / 2.0, cost.sigma)
    elif cost.dist == "uniform":
        value = rng.uniform(cost.low, cost.high)
    else:
        raise ConfigurationError(f"unknown cost distribution {cost.dist!r}")
    return max(1, round(value))


def split_units(units: int, kind: ProviderKind, output_fraction: float) -> tuple[int, int]:
    """(prompt_units, output_units) of a task of ``units``: a TTS call is all output (characters)."""
    if kind == "tts":
        return 0, units
    output = round(units * output_fraction)
    return units - output, output


ARRIVAL_BOUND_SIGMAS = 6.0
"""How many standard deviations above its mean a Poisson count is allowed to reach in the up-front check."""


def arrival_overflow(workload: WorkloadConfig, duration_s: float) -> str | None:
    """Why ``workload`` would generate more than :data:`MAX_ARRIVALS_PER_WORKLOAD` arrivals, or None.

    Pure arithmetic on the configuration, so scenario validation (``aiqsim validate``) refuses
    what generation would refuse only after drawing two million arrivals: a burst's ``count``,
    or a Poisson mean ``rate_per_s x window`` whose upper tail (mean + 6 sd) passes the limit.
    Below that bound the generator's own check is practically never reached. A double click
    submits each user action ``clicks`` times, so its bound is the actions' bound times ``clicks``
    (otherwise a modest rate with a huge ``clicks`` passes here and exhausts memory in the run).
    """
    limit = MAX_ARRIVALS_PER_WORKLOAD
    if workload.type == "burst":
        count = workload.count or 0
        return None if count <= limit else f"count is {count:,}; at most {limit:,} arrivals fit"
    if workload.type in ("trace", "replay"):
        return None  # bounded by the trace (or arrivals) file, which validation reads in full
    clicks = workload.clicks if workload.type == "double_click" else 1
    if workload.count is not None and workload.count * clicks <= limit:
        return None
    end = duration_s if workload.end_s is None else min(workload.end_s, duration_s)
    mean = workload.rate_per_s * max(0.0, end - workload.start_s)
    tail = mean + ARRIVAL_BOUND_SIGMAS * sqrt(mean)
    if clicks == 1:
        if tail <= limit:
            return None
        fits = limit / max(end - workload.start_s, 1e-300)
        return (
            f"rate_per_s {workload.rate_per_s:g} over {end - workload.start_s:g} s means about {mean:,.0f} "
            f"arrivals; at most {limit:,} fit (rate_per_s up to about {fits * 0.99:,.4g} over this window, "
            "or set count)"
        )
    if workload.count is not None and workload.count < tail:
        actions = f"count {workload.count:,}"
        most = float(workload.count)
    else:
        window = f"{end - workload.start_s:g} s"
        actions = f"rate_per_s {workload.rate_per_s:g} over {window} (up to about {tail:,.0f} actions)"
        most = tail
    if most * clicks <= limit:
        return None
    return (
        f"clicks {clicks:,} times {actions} means up to about {most * clicks:,.0f} arrivals; "
        f"at most {limit:,} fit (lower clicks, rate_per_s or count)"
    )


def _poisson_times(
    rng: random.Random, rate: float, start: float, end: float, count: int | None
) -> list[float]:
    """Arrival times of a Poisson process on (start, end], at most ``count`` of them."""
    times: list[float] = []
    limit = MAX_ARRIVALS_PER_WORKLOAD + 1 if count is None else min(count, MAX_ARRIVALS_PER_WORKLOAD + 1)
    now = start
    while len(times) < limit:
        now += rng.expovariate(rate)
        if now > end:
            break
        times.append(now)
    return times


@fast_frozen_init  # one per user action: see aiqsim.core.slot_init
@dataclass(frozen=True, slots=True)
class _Action:
    """One user action before it is expanded into clicks: its time and what it asks for."""

    time: float
    input_index: int
    prompt_units: int
    output_units: int
    poison: bool


def _action_times(workload: WorkloadConfig, horizon: float, rng: random.Random) -> list[float]:
    if workload.type == "burst":
        count = workload.count or 0
        if count > MAX_ARRIVALS_PER_WORKLOAD:
            raise ConfigurationError(
                f"a burst of {count:,} arrivals is more than {MAX_ARRIVALS_PER_WORKLOAD:,}; lower its count"
            )
        times = [workload.start_s + workload.burst_s * step / count for step in range(count)]
        return [t for t in times if t <= horizon]
    end = horizon if workload.end_s is None else min(workload.end_s, horizon)
    return _poisson_times(rng, workload.rate_per_s, workload.start_s, end, workload.count)


def _exact_share(fraction: float, total: int) -> int:
    """``fraction`` of ``total`` rounded half up (so 0.5 of 3 is 2, not banker's 2-or-1)."""
    return min(total, floor(fraction * total + 0.5))


def _generated_actions(
    workload: WorkloadConfig, kind: ProviderKind, horizon: float, rng: random.Random
) -> list[_Action]:
    times = _action_times(workload, horizon, rng)
    if workload.distinct_inputs is None:
        # every action has its own input; exactly poison_fraction of them are poisoned
        poisoned = set(rng.sample(range(len(times)), _exact_share(workload.poison_fraction, len(times))))
        actions = []
        for number, time in enumerate(times):
            prompt, output = split_units(draw_units(workload.cost, rng), kind, workload.cost.output_fraction)
            actions.append(_Action(time, number, prompt, output, number in poisoned))
        return actions
    # inputs recur: input k's size is drawn once (identical inputs carry identical payloads);
    # input labels are arbitrary and drawn uniformly, so poisoning the first m of them is a
    # uniformly random choice of exactly m poisoned inputs
    distinct = workload.distinct_inputs
    poisoned_below = _exact_share(workload.poison_fraction, distinct)
    sizes: dict[int, tuple[int, int]] = {}
    actions = []
    for time in times:
        k = rng.randrange(distinct)
        if k not in sizes:
            sizes[k] = split_units(draw_units(workload.cost, rng), kind, workload.cost.output_fraction)
        prompt, output = sizes[k]
        actions.append(_Action(time, k, prompt, output, k < poisoned_below))
    return actions


_ASCENDING: dict[str, tuple[tuple[TraceRow, ...], bool]] = {}
"""Trace name -> (the rows :func:`read_trace` returned, whether their offsets ascend): the answer is
kept with the very tuple it is about, so a trace read again (a new tuple) is checked again."""


def _offsets_ascend(trace: str, rows: tuple[TraceRow, ...]) -> bool:
    """Whether the offsets of ``rows`` (all of trace ``trace``) never decrease."""
    known = _ASCENDING.get(trace)
    if known is not None and known[0] is rows:
        return known[1]
    ascending = all(earlier.offset_s <= later.offset_s for earlier, later in itertools.pairwise(rows))
    if len(_ASCENDING) >= 8:  # as many as read_trace caches
        _ASCENDING.clear()
    _ASCENDING[trace] = (rows, ascending)
    return ascending


def _trace_actions(
    workload: WorkloadConfig, kind: ProviderKind, horizon: float, rng: random.Random
) -> list[_Action]:
    trace = workload.trace or ""
    rows = read_trace(trace)
    ascending = _offsets_ascend(trace, rows)  # of the whole trace (cached with it), so of any prefix
    if workload.count is not None:
        rows = rows[: workload.count]
    end = horizon if workload.end_s is None else min(workload.end_s, horizon)
    start, speedup = workload.start_s, workload.speedup
    if ascending and speedup > 0:
        # Fast path: a scenario usually replays the first minutes of a long trace. With offsets in
        # ascending order (and speedup > 0), a row's time start + offset / speedup never decreases
        # along the file, so the rows that start by ``end`` are a prefix; bisection finds it with
        # the same expression and test as the general path below, which a shuffled trace takes.
        rows = rows[: bisect.bisect_right(rows, end, key=lambda row: start + row.offset_s / speedup)]
        timed = [(start + row.offset_s / speedup, row) for row in rows]
    else:
        timed = [(start + row.offset_s / speedup, row) for row in rows]
        timed = [(time, row) for time, row in timed if time <= end]
    poisoned = set(rng.sample(range(len(timed)), _exact_share(workload.poison_fraction, len(timed))))
    actions = []
    for number, (time, row) in enumerate(timed):
        if kind == "tts":
            prompt, output = 0, row.context_tokens + row.generated_tokens
        else:
            prompt, output = row.context_tokens, row.generated_tokens
        actions.append(_Action(time, number, prompt, output, number in poisoned))
    return actions


def _replay_actions(workload: WorkloadConfig, horizon: float, rng: random.Random) -> list[_Action]:
    """A replay workload's rows as actions: the file's times, sizes and inputs, nothing drawn
    (except which inputs are poisoned, as for a trace)."""
    rows = read_replay_arrivals(workload.arrivals or "")
    if workload.count is not None:
        rows = rows[: workload.count]
    end = horizon if workload.end_s is None else min(workload.end_s, horizon)
    timed = [(workload.start_s + row.offset_s, row) for row in rows]
    timed = [(time, row) for time, row in timed if time <= end]
    inputs: dict[str, int] = {}
    for _time, row in timed:
        inputs.setdefault(row.input, len(inputs))
    poisoned = set(rng.sample(range(len(inputs)), _exact_share(workload.poison_fraction, len(inputs))))
    actions = []
    for time, row in timed:
        k = inputs[row.input]
        actions.append(_Action(time, k, row.prompt_units, row.output_units, k in poisoned))
    return actions


def _expand_clicks(actions: list[_Action], clicks: int, gap: float) -> list[tuple[float, int, int, _Action]]:
    """``(time, action number, click, action)`` for every click of every action (``actions`` sorted by
    time), sorted by time, then action number, then click: the order the arrivals are numbered in."""
    if clicks == 1:
        # Fast path (every workload but double clicks): one click per action, and the actions are
        # sorted by time, so (time, number, click) already ascends and the sort is skipped.
        return [(action.time + 0 * gap, number, 0, action) for number, action in enumerate(actions)]
    expanded = []
    for number, action in enumerate(actions):
        for click in range(clicks):
            expanded.append((action.time + click * gap, number, click, action))
    expanded.sort(key=lambda item: (item[0], item[1], item[2]))
    return expanded


def workload_arrivals(
    index: int, workload: WorkloadConfig, scenario: Scenario, rng: random.Random
) -> list[Arrival]:
    """The arrivals of workload number ``index`` alone, sorted by time.

    Task ids read ``w{index}-{n:06d}`` (n counts this workload's arrivals in time order) and
    actions ``w{index}-a{n:06d}``; inputs are labelled ``w{index}-input-{k:06d}``.
    """
    deployment = (
        scenario.route(workload.route).providers[0] if workload.route is not None else workload.provider
    )
    kind = scenario.provider(deployment).kind  # a route's deployments share one kind
    horizon = scenario.duration_s
    if workload.type == "trace":
        actions = _trace_actions(workload, kind, horizon, rng)
    elif workload.type == "replay":
        actions = _replay_actions(workload, horizon, rng)
    else:
        actions = _generated_actions(workload, kind, horizon, rng)
    actions.sort(key=lambda action: action.time)
    clicks = workload.clicks if workload.type == "double_click" else 1
    if len(actions) * clicks > MAX_ARRIVALS_PER_WORKLOAD:  # each click is an arrival
        raise WorkloadTooLargeError(
            index,
            f"would generate more than {MAX_ARRIVALS_PER_WORKLOAD:,} arrivals; "
            "lower its rate_per_s, count or clicks, or shorten the scenario",
        )
    expanded = _expand_clicks(actions, clicks, workload.click_gap_s)
    arrivals = []
    provider, priority, tenant = (
        workload.target,
        workload.priority,
        workload.tenant,
    )  # a route: the scheduler picks
    for serial, (time, number, _click, action) in enumerate(expanded):
        payload = {
            "input": f"w{index}-input-{action.input_index:06d}",
            "prompt_units": action.prompt_units,
            "output_units": action.output_units,
            "poison": action.poison,
        }
        arrivals.append(  # positional (the field order): a third of the cost of keywords here
            Arrival(
                time,
                f"w{index}-{serial:06d}",
                provider,
                priority,
                payload,
                float(action.prompt_units + action.output_units),
                f"w{index}-a{number:06d}",
                tenant,
            )
        )
    return arrivals


def generate_arrivals(scenario: Scenario, rng: random.Random) -> list[Arrival]:
    """Every workload's arrivals merged into one list sorted by time (ties: workload order).

    Deterministic for a given ``rng`` state: each workload gets a child generator seeded from
    ``rng`` in declaration order.
    """
    seeds = [rng.getrandbits(64) for _ in scenario.workloads]
    merged: list[Arrival] = []
    for index, (workload, seed) in enumerate(zip(scenario.workloads, seeds, strict=True)):
        if workload.job is not None:
            continue  # job workloads submit jobs: aiqsim.sim.job_workloads.generate_job_arrivals
        merged.extend(workload_arrivals(index, workload, scenario, random.Random(seed)))
    merged.sort(key=lambda arrival: arrival.time)
    return merged
