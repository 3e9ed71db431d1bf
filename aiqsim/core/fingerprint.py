"""Idempotency keys: a stable fingerprint of what a call would compute.

Two submissions that would produce the same output (same kind, engine/model version,
parameters and input) get the same key, whatever the dict order, process or Python
version. Canonical JSON (sorted keys, no whitespace, UTF-8) hashed with SHA-256.

What counts as "the same input" is JSON's view of it, so these are one input each:
``1`` and ``1.0`` (and ``-0.0`` and ``0``); a tuple and the list of its items; bytes ``b`` and
the dict ``{"$bytes": base64(b)}``, the form bytes take in the document. This is not RFC 8785
(JCS): keys sort by code point and integral floats are written as integers.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Callable, Mapping
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


MAX_NESTING = 100
"""The deepest nesting of lists and dicts a fingerprinted value may have. Deeper (or a value that
holds itself) is refused by depth with a clear error, not left to Python's recursion limit."""


def _canonical(value: Any, path: str, depth: int = 0) -> Any:
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
    if depth >= MAX_NESTING and isinstance(value, Mapping | list | tuple):
        raise FingerprintError(f"{path}: nested deeper than {MAX_NESTING} levels, or holds itself (a cycle)")
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise FingerprintError(f"{path}: dict keys must be str, got {type(k).__name__} {k!r}")
            out[_check_text(k, f"{path} key")] = _canonical(v, f"{path}.{k}", depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [_canonical(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, bytes | bytearray):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    raise FingerprintError(
        f"{path}: {type(value).__name__} is not JSON-like; pass str/number/list/dict/bytes"
    )


_CANONICAL_OPTIONS: dict[str, Any] = {
    "sort_keys": True,
    "separators": (",", ":"),
    "ensure_ascii": False,
    "allow_nan": False,
}
_encode_with_checks = json.JSONEncoder(**_CANONICAL_OPTIONS).encode
"""``json.dumps`` with the canonical options, built once (``json.dumps`` builds an encoder per call
whenever an option differs from its defaults)."""


def _refuse(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _reused_c_encoder() -> Callable[[Any], str] | None:
    """The C encoder ``JSONEncoder.encode`` builds on every call, built once, or ``None``.

    Why: ``JSONEncoder.encode`` makes a new C encoder (and a circular-reference ``markers`` dict) per
    call, about a third of the encoding time of a task's small document. The one built here has the
    same options and no ``markers``: it only ever sees documents that :func:`_canonical` built or
    that :func:`_already_canonical` walked, and either walk ends in ``RecursionError`` on a cycle
    before the encoder is reached. ``None`` (use ``JSONEncoder.encode``) where ``_json`` is missing
    or its constructor differs, or if it does not reproduce ``JSONEncoder.encode`` on a probe.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None or json.encoder.encode_basestring is not getattr(json.encoder, "c_encode_basestring", 0):
        return None
    try:
        iterencode = make(None, _refuse, json.encoder.encode_basestring, None, ":", ",", True, False, False)
    except TypeError:  # a Python whose C encoder takes other arguments
        return None
    join = "".join

    def encode(value: Any) -> str:
        return join(iterencode(value, 0))

    probe = {"b": [1, 2.5, None, True, 'é\u2603\n"'], "a": {"y": -3, "x": {}}, "c": []}
    if encode(probe) != _encode_with_checks(probe):
        return None
    return encode


_ENCODE: Callable[[Any], str] = _reused_c_encoder() or _encode_with_checks
"""Canonical JSON text of an already-canonical document (see :func:`_reused_c_encoder`)."""


_encode_text: Callable[[str], str] = json.encoder.encode_basestring
"""A str's JSON text as the canonical encoder writes it (``ensure_ascii=False``: quoted and escaped)."""


def canonical_json(value: Any) -> str:
    """The canonical JSON text of ``value`` (sorted keys, compact, UTF-8, integral floats as ints)."""
    try:
        return _ENCODE(_canonical(value, "$"))
    except FingerprintError:
        raise
    except (RecursionError, ValueError) as error:
        raise _unencodable("$", error) from None


def _unencodable(path: str, error: BaseException) -> FingerprintError:
    """What a walk or an encoding that failed for want of depth or digits says: a value that holds
    itself (or is nested deeper than Python recurses), or an integer too long to write as text."""
    if isinstance(error, RecursionError):
        return FingerprintError(f"{path}: nested too deeply, or holds itself (a cycle): no canonical form")
    return FingerprintError(f"{path}: {error}")


def is_unicode_text(text: str) -> bool:
    """Whether ``text`` has a UTF-8 form (no lone surrogate, which a str may hold); ASCII is
    answered without encoding. Also what durable stores ask of the text fields they read."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _already_canonical(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is its own canonical form, so that the canonical encoder can take it as is.

    True only for exact builtin types whose JSON text :func:`_canonical` would not change: ``None``,
    ``bool``, ``int``, valid text, finite non-integral ``float``, and ``dict`` (str keys) / ``list``
    of such. Anything else (a tuple, bytes, an integral or non-finite float, a subclass, a lone
    surrogate) answers False and takes the slow path, which converts it or raises
    :class:`FingerprintError` with the path of the offending value. Either way the key is the same.
    """
    kind = type(value)
    if depth >= MAX_NESTING:
        return False  # the slow path says why (:func:`_canonical`)
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or not (key.isascii() or is_unicode_text(key)):
                return False
            # The usual payload is a flat dict of text and integers: its values are checked here,
            # inline, rather than by one recursive call each (the same rules as below).
            item_kind = type(item)
            if item_kind is str:
                if not (item.isascii() or is_unicode_text(item)):
                    return False
            elif not (
                item_kind is int or item_kind is bool or item is None or _already_canonical(item, depth + 1)
            ):
                return False
        return True
    if kind is str:
        return is_unicode_text(value)
    if kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return math.isfinite(value) and not value.is_integer()
    if kind is list:
        return all(_already_canonical(item, depth + 1) for item in value)
    return False


def _member_text(value: Any, path: str) -> str:
    """The canonical JSON text of one member of a fingerprint's document (``path`` names it in errors).

    Valid text is quoted as the canonical encoder quotes it; a value that is already canonical is
    encoded as is; anything else is converted by :func:`_canonical` first (or refused, naming the path).
    """
    if type(value) is str and (value.isascii() or is_unicode_text(value)):
        return _encode_text(value)
    return _ENCODE(value) if _already_canonical(value) else _ENCODE(_canonical(value, path))


def fingerprint(
    kind: str, payload: Any, *, params: Mapping[str, Any] | None = None, version: str = ""
) -> str:
    """The idempotency key for calling ``kind`` (at engine/model ``version``) on ``payload``.

    The key is the SHA-256 of the canonical JSON of ``{"input", "kind", "params", "version"}``. That
    text is assembled from the canonical text of each member, in sorted key order: the canonical
    form of a dict is exactly that, so no document is built, walked or copied, and a payload that is
    already canonical (the usual flat one) is encoded as is (``tests/test_fingerprint.py`` checks the
    keys against :func:`canonical_json` of the whole document).
    """
    # members converted in the order canonical_json({"kind", "version", "params", "input"}) walks
    # them, so that of several bad members the same one is named
    if params is not None and not isinstance(params, Mapping):
        raise FingerprintError(f"$.params: expected a mapping of names to values, got {params!r}")
    try:
        kind_text = _member_text(kind, "$.kind")
        version_text = _member_text(version, "$.version")
        params_text = _member_text(dict(params), "$.params") if params else "{}"  # none: an empty mapping
        input_text = _member_text(payload, "$.input")
    except FingerprintError:
        raise  # it names the bad value's path already
    except (RecursionError, ValueError) as error:
        raise _unencodable("$", error) from None
    text = f'{{"input":{input_text},"kind":{kind_text},"params":{params_text},"version":{version_text}}}'
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
