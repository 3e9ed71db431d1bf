"""Replayed arrivals: a CSV of submit times (and sizes) that a ``replay`` workload submits as is.

A ``type = "replay"`` workload (see :class:`~aiqsim.sim.config.WorkloadConfig`) reads its
``arrivals`` file, a path relative to the scenario file, and submits one task per row at
``start_s + offset_s`` to the workload's provider at the workload's priority. Nothing is drawn:
the times, sizes and repeated inputs are the file's, so a scenario calibrated with
``aiqsim calibrate LOG --arrivals replay`` submits exactly what the log's client submitted.

Columns (a header row, then one row per arrival, in any order of rows):

- ``offset_s``: seconds after the workload's ``start_s`` (>= 0, finite);
- ``prompt_units``, ``output_units``: the task's size (whole units >= 0; their sum is the cost
  estimate the simulated client submits with);
- ``input``: a label of the input; rows with the same label carry identical payloads, so they
  deduplicate like the log's repeated submissions of one key.

Offsets are written with :func:`repr`, so a float survives the round trip through the file exactly.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from aiqsim.core.errors import ConfigurationError
from aiqsim.files import replaced_atomically
from aiqsim.sim.config import MAX_CALL_UNITS

__all__ = [
    "REPLAY_COLUMNS",
    "ReplayArrivalsError",
    "ReplayRow",
    "read_replay_arrivals",
    "write_replay_arrivals",
]

REPLAY_COLUMNS: tuple[str, ...] = ("offset_s", "prompt_units", "output_units", "input")
"""The columns a replay arrivals CSV must have (others are ignored)."""


class ReplayArrivalsError(ConfigurationError):
    """A replay arrivals CSV that cannot be used (missing file or column, a row that does not parse)."""


@dataclass(frozen=True, slots=True)
class ReplayRow:
    """One arrival to replay: ``offset_s`` after the workload's start, its size and input label."""

    offset_s: float
    prompt_units: int
    output_units: int
    input: str


_CACHE: dict[tuple[str, int, int], tuple[ReplayRow, ...]] = {}
"""(resolved path, mtime_ns, size) -> rows: a scenario validated then run reads its file once."""


def read_replay_arrivals(path: str | Path) -> tuple[ReplayRow, ...]:
    """Every row of the arrivals file at ``path``, sorted by offset (stable: ties keep file order).

    Raises :class:`ReplayArrivalsError` naming the file (and line) for anything unusable.
    """
    target = Path(path)
    try:
        status = os.stat(target)
    except OSError as error:
        raise ReplayArrivalsError(f"cannot read replay arrivals {str(target)!r}: {error.strerror}") from None
    cache_key = (str(target.resolve()), status.st_mtime_ns, status.st_size)
    cached = _CACHE.get(cache_key)
    if cached is not None:
        return cached
    rows = _parse(target)
    if len(_CACHE) >= 8:
        _CACHE.clear()
    _CACHE[cache_key] = rows
    return rows


def _parse(target: Path) -> tuple[ReplayRow, ...]:
    name = str(target)
    rows: list[ReplayRow] = []
    try:
        with target.open("r", encoding="utf-8", newline="") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if header is None:
                raise ReplayArrivalsError(f"replay arrivals {name!r} is empty; expected a header row")
            index = {column.strip(): i for i, column in enumerate(header)}
            missing = [c for c in REPLAY_COLUMNS if c not in index]
            if missing:
                raise ReplayArrivalsError(
                    f"replay arrivals {name!r} lacks column(s) {', '.join(missing)}; "
                    f"expected {', '.join(REPLAY_COLUMNS)}"
                )
            for row in reader:
                if not row or all(not cell.strip() for cell in row):
                    continue
                try:
                    offset = float(row[index["offset_s"]])
                    prompt = int(row[index["prompt_units"]])
                    output = int(row[index["output_units"]])
                    label = row[index["input"]]
                except (ValueError, IndexError) as error:
                    raise ReplayArrivalsError(
                        f"replay arrivals {name!r}, line {reader.line_num}: cannot parse {row!r}: {error}"
                    ) from None
                if not (math.isfinite(offset) and offset >= 0) or not (
                    0 <= prompt <= MAX_CALL_UNITS and 0 <= output <= MAX_CALL_UNITS
                ):
                    raise ReplayArrivalsError(
                        f"replay arrivals {name!r}, line {reader.line_num}: expected offset_s >= 0 and "
                        f"sizes from 0 to {MAX_CALL_UNITS:.0e} units, got {row!r}"
                    )
                rows.append(ReplayRow(offset, prompt, output, label))
    except OSError as error:
        raise ReplayArrivalsError(f"cannot read replay arrivals {name!r}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise ReplayArrivalsError(f"replay arrivals {name!r} is not UTF-8 text") from None
    except csv.Error as error:
        raise ReplayArrivalsError(f"replay arrivals {name!r} is not a readable CSV file: {error}") from None
    if not rows:
        raise ReplayArrivalsError(f"replay arrivals {name!r} has a header but no rows")
    rows.sort(key=lambda r: r.offset_s)
    return tuple(rows)


def write_replay_arrivals(path: str | Path, rows: Iterable[ReplayRow]) -> Path:
    """Write ``rows`` as a replay arrivals CSV at ``path`` (offsets by ``repr``: exact); returns it."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with replaced_atomically(target) as temp, temp.open("w", encoding="utf-8", newline="") as handle:
            writer = csv.writer(handle)  # an earlier file at ``path`` stays whole if this fails
            writer.writerow(REPLAY_COLUMNS)
            for row in rows:
                writer.writerow((repr(float(row.offset_s)), row.prompt_units, row.output_units, row.input))
    except OSError as error:
        raise ReplayArrivalsError(f"cannot write replay arrivals {str(target)!r}: {error.strerror}") from None
    return target
