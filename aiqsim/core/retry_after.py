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

MAX_DELTA_SECONDS = 2147483648.0
"""The longest wait a delta-seconds value gives: 2**31 s (68 years), the value RFC 9111 §1.2.2 tells
a recipient to use for delta-seconds larger than it can represent. Longer values (and text too long
for a float) mean "far in the future", not "unparseable", so they are clamped here, not dropped."""

_RFC850_DATE = re.compile(r"[A-Za-z]+,[ \t]*[0-9]{1,2}-[A-Za-z]{3}-([0-9]{2})[ \t]")
"""The start of an obsolete RFC 850 date (``Sunday, 06-Nov-94 08:49:37 GMT``): its two-digit year."""

_OWS = " \t"
"""HTTP optional whitespace (RFC 9110 §5.6.3): only SP and HTAB are trimmed, not Unicode spaces."""


def delta_seconds(value: str | float | int) -> float | None:
    """A number of seconds given as a number or as delta-seconds text (``"120"``, ``"1.5"``).

    ``None`` for a negative or non-finite number and for a boolean (``True`` is not one
    second). More than :data:`MAX_DELTA_SECONDS` (2**31) gives 2**31 (RFC 9111 §1.2.2).
    Raises ``ValueError`` for text that is not delta-seconds (see :data:`DELTA_SECONDS`), so
    callers can try other forms (an HTTP date).
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if value < 0 else float(min(value, MAX_DELTA_SECONDS))  # float(10**400) would raise
    if isinstance(value, float):
        seconds = value
    else:
        text = value.strip(_OWS)
        if DELTA_SECONDS.fullmatch(text) is None:
            raise ValueError(f"not delta-seconds: {value!r}")
        return min(float(text), MAX_DELTA_SECONDS)  # digits only: never negative or NaN; inf is clamped
    return min(seconds, MAX_DELTA_SECONDS) if math.isfinite(seconds) and seconds >= 0 else None


def parse_retry_after(value: str | float | int | None, now_epoch_s: float) -> float | None:
    """Seconds to wait according to a Retry-After value, or ``None`` if absent or unparseable.

    Accepts delta-seconds (``"120"``, also a non-negative decimal such as ``"1.5"``, which
    several AI providers send; ASCII digits only, no sign, exponent or underscore) and an
    HTTP date (``"Wed, 21 Oct 2015 07:28:00 GMT"``), the latter measured against
    ``now_epoch_s`` (Unix seconds, passed in so this stays pure). Dates in the past give 0.
    The obsolete RFC 850 and asctime date forms are accepted as far as :mod:`email.utils`
    parses them; a date without a zone (asctime, or ``-0000``) is UTC, as every HTTP date is.
    An RFC 850 date's two-digit year is read as RFC 9110 §5.6.7 says: the year with those last
    two digits that is at most 50 years after ``now_epoch_s``'s year (``-68`` is 1968 in 2015).
    A wait above 2**31 s gives 2**31 (:data:`MAX_DELTA_SECONDS`), for delta-seconds and dates alike
    (``"Fri, 31 Dec 9999 23:59:59 GMT"`` is "far in the future", as ``"99999999999"`` is).
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
        two_digit_year = _RFC850_DATE.match(text)
        if two_digit_year is not None:
            when = when.replace(year=rfc850_year(int(two_digit_year.group(1)), now_epoch_s))
        # utctimetuple() converts an aware date to UTC and leaves a naive one as is (= UTC).
        epoch_s = calendar.timegm(when.utctimetuple()) + when.microsecond / 1e6
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return min(max(0.0, epoch_s - now_epoch_s), MAX_DELTA_SECONDS)


def rfc850_year(two_digits: int, now_epoch_s: float) -> int:
    """The full year of an RFC 850 date's two-digit year, relative to ``now_epoch_s`` (RFC 9110 §5.6.7).

    A year that would be more than 50 years in the future is the most recent past year with the
    same last two digits. (:mod:`email.utils` pivots at a fixed 69 instead: ``-68`` is 2068 and
    ``-69`` is 1969, whatever the current year.)
    """
    this_year = _utc_year(now_epoch_s)
    year = this_year - this_year % 100 + two_digits
    if year > this_year + 50:
        year -= 100
    elif year <= this_year - 50:
        year += 100
    return year


def _utc_year(epoch_s: float) -> int:
    """The proleptic Gregorian UTC year of ``epoch_s`` (Unix seconds), by arithmetic only.

    H. Hinnant's ``civil_from_days``: a 400-year era is 146097 days, and a year counted from
    March 1 puts the leap day last. Raises ``OverflowError`` for an infinite time.
    """
    days = math.floor(epoch_s / 86400) + 719468  # days since 0000-03-01
    era = days // 146097
    day_of_era = days - era * 146097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36524 - day_of_era // 146096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    month_index = (5 * day_of_year + 2) // 153  # 0 = March ... 11 = February
    return year_of_era + era * 400 + (1 if month_index >= 10 else 0)
