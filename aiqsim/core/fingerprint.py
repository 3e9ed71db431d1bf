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


_ENCODE = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
"""``json.dumps`` with the canonical options, built once (``json.dumps`` builds an encoder per call
whenever an option differs from its defaults)."""


def canonical_json(value: Any) -> str:
    """The canonical JSON text of ``value`` (sorted keys, compact, UTF-8, integral floats as ints)."""
    return _ENCODE(_canonical(value, "$"))


def _valid_text(text: str) -> bool:
    """Whether ``text`` has a UTF-8 form (no lone surrogate); ASCII is answered without encoding."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _already_canonical(value: Any) -> bool:
    """Whether ``value`` is its own canonical form, so that the canonical encoder can take it as is.

    True only for exact builtin types whose JSON text :func:`_canonical` would not change: ``None``,
    ``bool``, ``int``, valid text, finite non-integral ``float``, and ``dict`` (str keys) / ``list``
    of such. Anything else (a tuple, bytes, an integral or non-finite float, a subclass, a lone
    surrogate) answers False and takes the slow path, which converts it or raises
    :class:`FingerprintError` with the path of the offending value. Either way the key is the same.
    """
    kind = type(value)
    if kind is str:
        return _valid_text(value)
    if kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return math.isfinite(value) and not value.is_integer()
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or not _valid_text(key) or not _already_canonical(item):
                return False
        return True
    if kind is list:
        return all(_already_canonical(item) for item in value)
    return False


def fingerprint(
    kind: str, payload: Any, *, params: Mapping[str, Any] | None = None, version: str = ""
) -> str:
    """The idempotency key for calling ``kind`` (at engine/model ``version``) on ``payload``.

    Fast path: a document that is already canonical (the usual flat JSON-like payload) is
    encoded directly, skipping the copy :func:`canonical_json` makes; the text, hence the key, is
    byte-identical (``tests/test_fingerprint.py`` checks it against the slow path with hypothesis).
    """
    document = {"kind": kind, "version": version, "params": dict(params or {}), "input": payload}
    text = _ENCODE(document) if _already_canonical(document) else canonical_json(document)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
