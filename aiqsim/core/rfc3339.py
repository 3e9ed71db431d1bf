"""RFC 3339 timestamps (``2024-06-01T12:00:30Z``) as Unix seconds, by arithmetic only (pure).

Anthropic states its rate-limit resets as absolute RFC 3339 instants
(``anthropic-ratelimit-requests-reset: 2025-10-25T12:00:00Z``), where OpenAI sends durations.
This module reads no clock and imports no ``datetime`` (the pure rooms may not): the caller
subtracts its own ``now``.

Malformed input is "no information", never an exception: a header a provider garbles must not
fail an answer that is otherwise usable, nor stall a lane.
"""

from __future__ import annotations

import calendar
import re

from aiqsim.core.retry_after import MAX_DELTA_SECONDS

_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?"
    r"(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))"
)
"""RFC 3339 §5.6 ``date-time`` (ASCII digits only; a space for ``T`` as §5.6 NOTE allows)."""


def rfc3339_epoch(text: str | None) -> float | None:
    """The Unix time of an RFC 3339 ``date-time``, or ``None`` when ``text`` is not one.

    Fractional seconds are kept (any number of digits, as the grammar's ``1*DIGIT`` allows); a leap
    second (``:60``) counts as the second after ``:59``; the offset is applied (``+02:00`` is two
    hours ahead of UTC). Refused (``None``): a missing offset, impossible dates (31 Nov, hour 24),
    a ``:60`` that is not the last second of a month in UTC (§5.7: only there may a leap second
    occur; ``23:59:60Z`` on 31 Dec, or ``15:59:60-08:00`` that day), offsets of a day or more,
    non-ASCII digits, and anything else that is not exactly the grammar.
    """
    if not isinstance(text, str):
        return None
    match = _RFC3339.fullmatch(text.strip(" \t"))
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
    fraction = float(match.group(7)) if match.group(7) else 0.0
    if not (1 <= month <= 12 and year >= 1 and 1 <= day <= calendar.monthrange(year, month)[1]):
        return None
    if hour > 23 or minute > 59 or second > 60:
        return None
    offset_s = 0
    if match.group(9) is not None:
        offset_hours, offset_minutes = int(match.group(10)), int(match.group(11))
        if offset_hours > 23 or offset_minutes > 59:
            return None
        offset_s = (offset_hours * 3600 + offset_minutes * 60) * (1 if match.group(9) == "+" else -1)
    if second == 60 and not _last_minute_of_a_utc_month(
        year, month, day, hour * 60 + minute - offset_s // 60
    ):
        return None
    return float(calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))) + fraction - offset_s


def _last_minute_of_a_utc_month(year: int, month: int, day: int, utc_minute_of_day: int) -> bool:
    """Whether local ``year-month-day`` at ``utc_minute_of_day`` (the local minute less the offset:
    from -1440 to 2879) is 23:59 UTC on the last day of a month: where a leap second may occur."""
    day_shift, utc_minute_of_day = divmod(utc_minute_of_day, 1440)
    if utc_minute_of_day != 23 * 60 + 59:
        return False
    utc_day = day + day_shift
    if utc_day == 0:  # the day before the 1st: the previous month's last day
        return True
    return utc_day == calendar.monthrange(year, month)[1]  # (the day after the last is a 1st: False)


def seconds_until(text: str | None, now_epoch_s: float) -> float | None:
    """Seconds from ``now_epoch_s`` until the RFC 3339 instant ``text``: 0 for an instant already
    past, at most :data:`~aiqsim.core.retry_after.MAX_DELTA_SECONDS` (year 9999 is "far in the
    future", as an over-long Retry-After is), ``None`` when ``text`` is no timestamp or ``now`` is
    not a finite number."""
    epoch_s = rfc3339_epoch(text)
    if epoch_s is None or not isinstance(now_epoch_s, int | float) or now_epoch_s != now_epoch_s:
        return None
    if now_epoch_s in (float("inf"), float("-inf")):
        return None
    return min(max(0.0, epoch_s - now_epoch_s), MAX_DELTA_SECONDS)
