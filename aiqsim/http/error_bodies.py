"""What vendors' error bodies say beyond ``error.message`` (pure readers, no I/O, never raising).

- Google (Gemini API, Vertex AI) follows ``google.rpc.Status``: ``error.status`` is a canonical code
  (``RESOURCE_EXHAUSTED``) and ``error.details`` a list of typed messages, among them
  ``google.rpc.RetryInfo`` (``retryDelay: "19s"``, a ``google.protobuf.Duration`` in its JSON form)
  and ``google.rpc.QuotaFailure`` (``violations[].quotaId`` / ``quotaMetric``: which quota).
- Anthropic puts a machine-readable reason in ``error.details.error_code``
  (``enforced_spend_limit_reached``).
- OpenRouter reports a failure met after the answer began inside a 200 body:
  ``{"error": {"code": 502, "message": ...}}``.

A body of another shape, or with fields of the wrong type, reads as "nothing said".
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from aiqsim.core.retry_after import MAX_DELTA_SECONDS

_GOOGLE_RPC = "type.googleapis.com/google.rpc."
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]{1,9})?)s")
"""``google.protobuf.Duration`` in JSON: seconds with up to nine fraction digits and an ``s``
(a negative duration is no wait, so a sign is refused)."""
_PER_DAY = re.compile(r"per[-_ ]?day|perday|daily", re.IGNORECASE)


def _error(body: Any) -> Mapping[str, Any] | None:
    if isinstance(body, list) and len(body) == 1:  # some Google front ends wrap the Status in a list
        body = body[0]
    if not isinstance(body, Mapping):
        return None
    inner = body.get("error")
    return inner if isinstance(inner, Mapping) else None


def _details(body: Any) -> list[Mapping[str, Any]]:
    error = _error(body)
    details = None if error is None else error.get("details")
    if not isinstance(details, list):
        return []
    return [detail for detail in details if isinstance(detail, Mapping)]


def _detail_type(detail: Mapping[str, Any]) -> str:
    value = detail.get("@type")
    return value if isinstance(value, str) else ""


def is_google_status(body: Any) -> bool:
    """Whether ``body`` is a ``google.rpc.Status`` error: ``error.status`` is ``RESOURCE_EXHAUSTED``
    or a detail is a ``google.rpc`` message."""
    error = _error(body)
    if error is None:
        return False
    if error.get("status") == "RESOURCE_EXHAUSTED":
        return True
    return any(_detail_type(detail).startswith(_GOOGLE_RPC) for detail in _details(body))


def protobuf_duration_s(value: Any) -> float | None:
    """Seconds in a ``google.protobuf.Duration``: the JSON text ``"19s"`` / ``"0.5s"`` or an object
    ``{"seconds": 19, "nanos": 0}``; ``None`` for anything else or a negative or non-finite one;
    at most :data:`~aiqsim.core.retry_after.MAX_DELTA_SECONDS`."""
    if isinstance(value, str):
        match = _DURATION.fullmatch(value.strip())
        return None if match is None else min(float(match.group(1)), MAX_DELTA_SECONDS)
    if isinstance(value, Mapping):
        seconds, nanos = value.get("seconds", 0), value.get("nanos", 0)
        if isinstance(seconds, str) and seconds.isascii() and seconds.isdigit():
            seconds = int(seconds)  # proto3 JSON writes int64 as a string
        if any(isinstance(part, bool) or not isinstance(part, int | float) for part in (seconds, nanos)):
            return None
        try:
            total = float(seconds) + float(nanos) / 1e9
        except OverflowError:
            return MAX_DELTA_SECONDS
        if not math.isfinite(total) or total < 0:
            return None
        return min(total, MAX_DELTA_SECONDS)
    return None


def google_retry_delay_s(body: Any) -> float | None:
    """The ``retryDelay`` of the body's ``google.rpc.RetryInfo`` (seconds), the longest if several."""
    delays = [
        delay
        for detail in _details(body)
        if _detail_type(detail).endswith("google.rpc.RetryInfo")
        and (delay := protobuf_duration_s(detail.get("retryDelay"))) is not None
    ]
    return max(delays) if delays else None


def google_daily_quota(body: Any) -> str | None:
    """The ``quotaId`` (or ``quotaMetric``) of a ``google.rpc.QuotaFailure`` violation naming a
    per-day quota (``GenerateRequestsPerDayPerProjectPerModel-FreeTier``), or ``None``."""
    for detail in _details(body):
        if not _detail_type(detail).endswith("google.rpc.QuotaFailure"):
            continue
        violations = detail.get("violations")
        for violation in violations if isinstance(violations, list) else []:
            if not isinstance(violation, Mapping):
                continue
            for field in ("quotaId", "quotaMetric", "description"):
                value = violation.get(field)
                if isinstance(value, str) and _PER_DAY.search(value):
                    return str(violation.get("quotaId") or value)
    return None


def error_codes(body: Any) -> list[str]:
    """The machine-readable codes of an error body, lower-cased: ``error.code``, ``error.type``,
    ``error.details.error_code`` (Anthropic), and the same fields of a bare error object."""
    if not isinstance(body, Mapping):
        return []
    error = _error(body)
    objects = [error] if error is not None else [body]
    codes = []
    for obj in objects:
        for field in ("code", "type"):
            value = obj.get(field)
            if isinstance(value, str):
                codes.append(value.lower())
        details = obj.get("details")
        if isinstance(details, Mapping):
            value = details.get("error_code")
            if isinstance(value, str):
                codes.append(value.lower())
    return codes


def error_in_success(body: Any) -> int | None:
    """For a 2xx body carrying an ``error`` object (OpenRouter's upstream failure): the status it
    stands for, its ``error.code`` when that is an HTTP error status (400-599), else 502 (the
    upstream failed). ``None`` when the body carries no error object."""
    error = _error(body)
    if error is None:
        return None
    code = error.get("code")
    if isinstance(code, str) and code.isascii() and code.isdigit():
        code = int(code)
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599:
        return code
    return 502
