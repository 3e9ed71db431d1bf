"""Parsing of the HTTP ``Retry-After`` header (RFC 9110 §10.2.3)."""

from __future__ import annotations

import calendar
import math
import re
from email.utils import parsedate_tz

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

_FOUR_DIGIT_YEAR = re.compile(r"(?<![0-9:+-])([0-9]{4})(?![0-9:])")
"""The year of an IMF-fixdate or asctime date (``4DIGIT``): a four-digit number that is no part of
the time of day and no numeric zone (``-0000``)."""

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
    The obsolete RFC 850 and asctime forms are accepted (:func:`http_date_epoch`), as RFC 9110
    §5.6.7 asks of recipients. A wait above 2**31 s gives 2**31 (:data:`MAX_DELTA_SECONDS`), for
    delta-seconds and dates alike (``"Fri, 31 Dec 9999 23:59:59 GMT"`` is "far in the future", as
    ``"99999999999"`` is).
    """
    if value is None:
        return None
    try:
        return delta_seconds(value)
    except ValueError:
        pass
    epoch_s = http_date_epoch(value.strip(), now_epoch_s)  # type: ignore[union-attr]  # numbers were handled
    if epoch_s is None:
        return None
    return min(max(0.0, epoch_s - now_epoch_s), MAX_DELTA_SECONDS)


def parse_retry_after_ms(value: str | None) -> float | None:
    """Seconds to wait according to a ``retry-after-ms`` value (OpenAI's and Azure's milliseconds),
    or ``None`` if absent or unparseable.

    The same grammar as delta-seconds (:data:`DELTA_SECONDS`: ASCII digits with an optional decimal
    fraction; no sign, exponent or underscore) and the same ceiling of 2**31 s, applied to the
    seconds, so ``"9" * 400`` milliseconds is "far in the future" as ``"9" * 400`` seconds is.
    """
    if value is None:
        return None
    text = value.strip(_OWS)
    if DELTA_SECONDS.fullmatch(text) is None:
        return None
    return min(float(text) / 1000.0, MAX_DELTA_SECONDS)  # digits only: never negative or NaN


def http_date_epoch(text: str, now_epoch_s: float) -> float | None:
    """The Unix time of an HTTP date (RFC 9110 §5.6.7), or ``None`` if ``text`` is not one.

    IMF-fixdate (``Sun, 06 Nov 1994 08:49:37 GMT``) and the obsolete RFC 850
    (``Sunday, 06-Nov-94 08:49:37 GMT``) and asctime (``Sun Nov  6 08:49:37 1994``) forms, as far
    as :func:`email.utils.parsedate_tz` reads them; a date without a zone (asctime, or ``-0000``)
    is UTC, as every HTTP date is. A leap second (``23:59:60``, which RFC 9110 takes from RFC 5322
    §3.3) is the second after ``23:59:59``. An RFC 850 date's two-digit year is read relative to
    ``now_epoch_s`` (:func:`rfc850_year`); the other forms do not depend on it, and their four-digit
    year is the one written (``0030`` is the year 30, in the past).
    """
    parsed = parsedate_tz(text)
    if parsed is None:
        return None
    year, month, day, hour, minute, second = parsed[:6]
    offset_s = parsed[9] or 0  # seconds east of UTC; no zone is UTC
    leap = 1 if second == 60 else 0  # datetime has no second 60: count it from 59
    fields = (month, day, hour, minute, second - leap)
    try:
        if not -86400 < offset_s < 86400:  # the offsets datetime.timezone accepts
            return None
        two_digit_year = _RFC850_DATE.match(text)
        if two_digit_year is not None:
            year = rfc850_year(int(two_digit_year.group(1)), fields, offset_s, now_epoch_s)
        else:
            four_digits = _FOUR_DIGIT_YEAR.search(text)
            if four_digits is not None:  # as written: parsedate_tz reads 0030 as 2030 (CPython gh-126845)
                year = int(four_digits.group(1))
        if two_digit_year is None and not _is_date(
            year, fields
        ):  # refuses what is not a date: 31 Nov, hour 24, second 61
            return None
    except (TypeError, ValueError, OverflowError):
        return None
    return float(calendar.timegm((year, *fields)) + leap - offset_s)


def _is_date(year: int, fields: tuple[int, int, int, int, int]) -> bool:
    """Whether ``year`` and ``fields`` (month, day, hour, minute, second) name an instant of the
    proleptic Gregorian calendar (years 1-9999, as HTTP dates have four digits)."""
    month, day, hour, minute, second = fields
    return (
        1 <= year <= 9999
        and 1 <= month <= 12
        and 1 <= day <= calendar.monthrange(year, month)[1]
        and 0 <= hour <= 23
        and 0 <= minute <= 59
        and 0 <= second <= 59
    )


def rfc850_year(
    two_digits: int, fields: tuple[int, int, int, int, int], offset_s: int, now_epoch_s: float
) -> int:
    """The full year of an RFC 850 date's two-digit year (RFC 9110 §5.6.7), the rest of the date
    being ``fields`` (month, day, hour, minute, second) at ``offset_s`` east of UTC.

    "A timestamp that appears to be more than 50 years in the future" is "the most recent year in
    the past that had the same last two digits": the year is the latest with those last two digits
    whose timestamp is at most 50 calendar years after ``now_epoch_s`` (a date 50 years and a day
    ahead is a century ago). :mod:`email.utils` alone pivots at a fixed 69 (``-68`` is 2068 and
    ``-69`` is 1969, whatever the current year). Raises ``ValueError`` when no such year has that
    date (29 Feb) and ``OverflowError`` for an infinite ``now_epoch_s``.
    """
    this_year, month, day = _utc_date(now_epoch_s)
    # now moved 50 calendar years on (29 Feb to 1 Mar when that year has none)
    later_year = this_year + 50
    if month == 2 and day == 29 and not calendar.isleap(later_year):
        month, day = 3, 1
    into_day = now_epoch_s - math.floor(now_epoch_s / 86400) * 86400
    limit_s = calendar.timegm((later_year, month, day, 0, 0, 0)) + into_day
    base = this_year - this_year % 100 + two_digits
    for year in (base + 100, base, base - 100):
        if not _is_date(year, fields):  # 29 Feb of a year without one
            continue
        if calendar.timegm((year, *fields)) - offset_s <= limit_s:
            return year
    raise ValueError(f"no year ending in {two_digits:02d} has the date {fields}")


def _utc_date(epoch_s: float) -> tuple[int, int, int]:
    """The proleptic Gregorian UTC (year, month, day) of ``epoch_s`` (Unix seconds), by arithmetic
    only (this package reads no clock and no time zone).

    H. Hinnant's ``civil_from_days``: a 400-year era is 146097 days, and a year counted from
    March 1 puts the leap day last. Raises ``OverflowError`` for an infinite time.
    """
    days = math.floor(epoch_s / 86400) + 719468  # days since 0000-03-01
    era = days // 146097
    day_of_era = days - era * 146097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36524 - day_of_era // 146096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    month_index = (5 * day_of_year + 2) // 153  # 0 = March ... 11 = February
    day = day_of_year - (153 * month_index + 2) // 5 + 1
    month = month_index + 3 if month_index < 10 else month_index - 9
    return year_of_era + era * 400 + (1 if month_index >= 10 else 0), month, day
