"""Parsing of the HTTP ``Retry-After`` header (RFC 9110 §10.2.3)."""

from __future__ import annotations

import calendar
import math
import re
from email.utils import parsedate_to_datetime

DELTA_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?")
"""RFC 9110 §10.2.3 delta-seconds (``1*DIGIT``, ASCII digits only), plus the decimal fraction
(``"1.5"``) that several AI providers send. Deliberately not ``float()``'s grammar: a sign
(``"+1"``, ``"-0"``), an exponent (``"1e3"``), underscores (``"1_000"``), ``"nan"``/``"inf"`` and
non-ASCII digits (``"١"``) are not delta-seconds, and a client that honours them waits for a
number the server never sent."""

_OWS = " \t"
"""HTTP optional whitespace (RFC 9110 §5.6.3): only SP and HTAB are trimmed, not Unicode spaces."""


def delta_seconds(value: str | float | int) -> float | None:
    """A number of seconds given as a number or as delta-seconds text (``"120"``, ``"1.5"``).

    ``None`` for a negative or non-finite number and for a boolean (``True`` is not one
    second). Raises ``ValueError`` for text that is not delta-seconds (see
    :data:`DELTA_SECONDS`), so callers can try other forms (an HTTP date).
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = value.strip(_OWS)
        if DELTA_SECONDS.fullmatch(text) is None:
            raise ValueError(f"not delta-seconds: {value!r}")
        seconds = float(text)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def parse_retry_after(value: str | float | int | None, now_epoch_s: float) -> float | None:
    """Seconds to wait according to a Retry-After value, or ``None`` if absent or unparseable.

    Accepts delta-seconds (``"120"``, also a non-negative decimal such as ``"1.5"``, which
    several AI providers send; ASCII digits only, no sign, exponent or underscore) and an
    HTTP date (``"Wed, 21 Oct 2015 07:28:00 GMT"``), the latter measured against
    ``now_epoch_s`` (Unix seconds, passed in so this stays pure). Dates in the past give 0.
    The obsolete RFC 850 and asctime date forms are accepted as far as :mod:`email.utils`
    parses them; a date without a zone (asctime, or ``-0000``) is UTC, as every HTTP date is.
    """
    if value is None:
        return None
    try:
        return delta_seconds(value)
    except ValueError:
        pass
    text = value.strip()  # type: ignore[union-attr]  # numbers were handled above
    try:
        when = parsedate_to_datetime(text)
        # utctimetuple() converts an aware date to UTC and leaves a naive one as is (= UTC).
        epoch_s = calendar.timegm(when.utctimetuple()) + when.microsecond / 1e6
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return max(0.0, epoch_s - now_epoch_s)
