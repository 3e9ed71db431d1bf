"""Value checks: each returns the normalised value or raises ``_Invalid`` and says what it expected.

The spec tables (:mod:`aiqsim.sim.scenario.spec`) are built from these; the reader turns an
``_Invalid`` into a :class:`~aiqsim.sim.scenario.ScenarioError` naming the key, and
:mod:`aiqsim.sim.scenario_schema` writes each check as JSON Schema.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiqsim.core.numeric import LARGEST_WHOLE
from aiqsim.sim.config import MAX_CALL_UNITS
from aiqsim.sim.scenario.errors import _fmt


class _Invalid(Exception):
    """A value that does not meet a check; the reader turns it into a ScenarioError."""


@dataclass(frozen=True, slots=True)
class _Number:
    low: float | None = None
    high: float | None = None
    low_open: bool = False

    @property
    def expected(self) -> str:
        if self.low is not None and self.high is not None:
            return f"a number in {'(' if self.low_open else '['}{_fmt(self.low)}, {_fmt(self.high)}]"
        if self.low is not None:
            return f"a number {'>' if self.low_open else '>='} {_fmt(self.low)}"
        return "a number"

    def __call__(self, value: Any) -> float:
        if not _is_number(value):
            raise _Invalid
        if isinstance(value, numbers.Integral) and abs(int(value)) > LARGEST_WHOLE:
            raise _Invalid
        value = float(value)
        if not math.isfinite(value):
            raise _Invalid
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            raise _Invalid
        if self.high is not None and value > self.high:
            raise _Invalid
        return value


def _is_number(value: Any) -> bool:
    """Real numbers (numpy ones too, for sweeps), but not booleans."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and type(value).__name__ != "bool_"


@dataclass(frozen=True, slots=True)
class _Integer:
    low: int | None = None

    @property
    def expected(self) -> str:
        return "an integer" if self.low is None else f"an integer >= {self.low}"

    def __call__(self, value: Any) -> int:
        if not _is_number(value) or not isinstance(value, numbers.Integral):
            raise _Invalid
        value = int(value)
        if self.low is not None and value < self.low:
            raise _Invalid
        if abs(value) > LARGEST_WHOLE:  # RetryPolicy's counts take the same bound
            raise _Invalid
        return value


@dataclass(frozen=True, slots=True)
class _Boolean:
    expected: str = "true or false"

    def __call__(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise _Invalid
        return value


@dataclass(frozen=True, slots=True)
class _Choice:
    options: tuple[str, ...]

    @property
    def expected(self) -> str:
        return "one of " + ", ".join(json.dumps(option) for option in self.options)

    def __call__(self, value: Any) -> str:
        if not isinstance(value, str) or value not in self.options:
            raise _Invalid
        return value


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


@dataclass(frozen=True, slots=True)
class _Text:
    name_like: bool = False
    non_empty: bool = False

    @property
    def expected(self) -> str:
        if self.name_like:
            return "a name (letters, digits, _ and -, not starting with a digit or -)"
        return "a non-empty string" if self.non_empty else "a string"

    def __call__(self, value: Any) -> str:
        if not isinstance(value, str):
            raise _Invalid
        if self.name_like and not _NAME.fullmatch(value):
            raise _Invalid
        if self.non_empty and not value.strip():
            raise _Invalid
        return value


@dataclass(frozen=True, slots=True)
class _Optional:
    """``None`` (from Python) or the string ``"none"`` (TOML has no null) mean 'not set'."""

    inner: Any

    @property
    def expected(self) -> str:
        return f'{self.inner.expected} or "none"'

    def __call__(self, value: Any) -> Any:
        if value is None or (isinstance(value, str) and value == "none"):
            return None
        return self.inner(value)


@dataclass(frozen=True, slots=True)
class _Names:
    """An array of names (``after = ["script", "tts"]``), each at most once; a tuple."""

    expected: str = "an array of names (letters, digits, _ and -), each at most once"

    def __call__(self, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list | tuple):
            raise _Invalid
        names = tuple(value)
        if not all(isinstance(name, str) and _NAME.fullmatch(name) for name in names):
            raise _Invalid
        if len(set(names)) != len(names):
            raise _Invalid
        return names


@dataclass(frozen=True, slots=True)
class _Weights:
    """An array of numbers > 0 (``weights = [4, 2, 1, 1]``); a tuple of floats."""

    expected: str = "an array of numbers > 0"

    def __call__(self, value: Any) -> tuple[float, ...]:
        if not isinstance(value, list | tuple):
            raise _Invalid
        return tuple(_Number(0.0, low_open=True)(item) for item in value)


@dataclass(frozen=True, slots=True)
class _Prices:
    """A table of provider name = price per unit (``prices = { llm = 0.000002 }``); a dict. Each
    price is checked by the ``[budget]`` builder, which names the provider's key in its error."""

    expected: str = "a table of provider name = price per unit (a number >= 0)"

    def __call__(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
            raise _Invalid
        return dict(value)


_PROBABILITY = _Number(0.0, 1.0)
_NON_NEGATIVE = _Number(0.0)
_POSITIVE = _Number(0.0, low_open=True)
_SIZE_MEAN = _Number(0.0, float(MAX_CALL_UNITS), low_open=True)
"""A call's mean size in provider units (tokens, characters): a trillion is no call, and a mean near
the float range overflowed the lognormal draw at run time."""
_SIZE_SIGMA = _Number(0.0, 20.0)
"""A lognormal size's sigma: e^20 (~5e8) between typical and large calls is already no workload;
sigma 1.4e154 overflowed sigma^2 at run time after validate said ok."""
_SPREAD_SIGMA = _Number(0.0, 20.0)
"""A time's lognormal sigma (``ttft_sigma``): bounded as a size's, for the same overflow."""
