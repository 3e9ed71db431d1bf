"""Idempotency keys: a stable fingerprint of what a call would compute.

Two submissions that would produce the same output (same kind, engine/model version,
parameters and input) get the same key, whatever the dict order, process or Python
version. Canonical JSON (sorted keys, no whitespace, UTF-8) hashed with SHA-256.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

from aiqsim.core.errors import ConfigurationError


class FingerprintError(ConfigurationError, TypeError):
    """The input holds a value with no canonical JSON form."""


def _check_text(text: str, path: str) -> str:
    # A lone surrogate ("\ud800") is a valid str but has no UTF-8 form to hash.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise FingerprintError(f"{path}: string {text!r} is not valid Unicode text ({err.reason})") from None
    return text


def _canonical(value: Any, path: str) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _check_text(value, path)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise FingerprintError(f"{path}: non-finite float {value!r} has no canonical form")
        if value.is_integer():
            # 1.0 and 1 (and 1e16 and 10**16) are equal numbers, so they fingerprint alike.
            return int(value)
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise FingerprintError(f"{path}: dict keys must be str, got {type(k).__name__} {k!r}")
            out[_check_text(k, f"{path} key")] = _canonical(v, f"{path}.{k}")
        return out
    if isinstance(value, list | tuple):
        return [_canonical(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, bytes | bytearray):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    raise FingerprintError(
        f"{path}: {type(value).__name__} is not JSON-like; pass str/number/list/dict/bytes"
    )


def canonical_json(value: Any) -> str:
    """The canonical JSON text of ``value`` (sorted keys, compact, UTF-8, integral floats as ints)."""
    return json.dumps(
        _canonical(value, "$"), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def fingerprint(
    kind: str, payload: Any, *, params: Mapping[str, Any] | None = None, version: str = ""
) -> str:
    """The idempotency key for calling ``kind`` (at engine/model ``version``) on ``payload``."""
    document = {"kind": kind, "version": version, "params": dict(params or {}), "input": payload}
    return hashlib.sha256(canonical_json(document).encode("utf-8")).hexdigest()
