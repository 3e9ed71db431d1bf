"""Parsing of the HTTP ``Retry-After`` header (RFC 9110 §10.2.3)."""

from __future__ import annotations

import math
from email.utils import parsedate_to_datetime


def parse_retry_after(value: str | float | int | None, now_epoch_s: float) -> float | None:
    """Seconds to wait according to a Retry-After value, or ``None`` if absent or unparseable.

    Accepts delta-seconds (``"120"``, also a non-negative decimal such as ``"1.5"``, which
    several AI providers send) and an HTTP date (``"Wed, 21 Oct 2015 07:28:00 GMT"``), the
    latter measured against ``now_epoch_s`` (Unix seconds, passed in so this stays pure).
    Dates in the past give 0.
    """
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) and value >= 0 else None
    text = value.strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now_epoch_s)
