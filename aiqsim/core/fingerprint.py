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


class FingerprintError(TypeError):
    """The input holds a value with no canonical JSON form."""


def _canonical(value: Any, path: str) -> Any:
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise FingerprintError(f"{path}: non-finite float {value!r} has no canonical form")
        if value.is_integer() and abs(value) < 2**53:
            return int(value)  # 1.0 and 1 fingerprint alike, as they do in JSON
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise FingerprintError(f"{path}: dict keys must be str, got {type(k).__name__} {k!r}")
            out[k] = _canonical(v, f"{path}.{k}")
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
