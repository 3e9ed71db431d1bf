"""The canonical encoder built once (``aiqsim.core.fingerprint._ENCODE``) and its fallback.

``fingerprint`` encodes with a C encoder built once instead of ``json.JSONEncoder.encode`` (which
builds one per call). Keys are a published contract, so: the two encoders must write the same text
for every JSON-like document, the keys must equal ones published before the change, and the
fallback (a Python without the C encoder) must give the same keys as the fast encoder.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiqsim.core import fingerprint as fp

scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)

# Keys written by aiqsim at commit 24410be (before the encoder was built once), for simulated-task
# payloads, a non-ASCII one with params, a nested one needing conversion, a job key: (kind, payload,
# params, version) -> key. A change of any of them breaks every stored idempotency key.
PUBLISHED_KEYS: list[tuple[str, Any, Any, str, str]] = [
    (
        "llm",
        {"input": "task-000001", "prompt_units": 120, "output_units": 300, "poison": False},
        None,
        "",
        "8c548428c80ff4837bfd598e4d0f2d135a467a385db8082776b88726ca7a243f",
    ),
    (
        "tts",
        {"input": "naïve café ☕", "prompt_units": 0, "output_units": 7},
        {"voice": "a", "speed": 1.5},
        "v2",
        "93b0b889490f7a2a5a7a8d3528c64173e930b2a04c71e91aca1be847759c847a",
    ),
    (
        "caption",
        {"frames": [1, 2.5, None, True, {"x": -0.25}], "lang": "fr"},
        {"max": 3.0},
        "2024-06",
        "eb2f5a3adb5db5a6a266f82e21c5dec1f4e276f95e5f36aba3078d4d05d704ce",
    ),
    (
        "job:edit",
        {"doc": "d-9", "paragraphs": 4},
        {"stages": "ab" * 32},
        "1",
        "e912268b135ae8d4b67bcab13f36cc14e4435fffb684098fb86f0248973c9f9c",
    ),
]


def _reference_key(kind: str, payload: Any, params: Any, version: str) -> str:
    """The documented recipe with ``json.dumps`` itself (no encoder of the module's own)."""
    document = fp._canonical(
        {"kind": kind, "version": version, "params": dict(params or {}), "input": payload}, "$"
    )
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_this_python_uses_the_encoder_built_once() -> None:
    # CPython ships the C encoder: the fast encoder must be in use, or the speed-up silently vanishes.
    assert fp._reused_c_encoder() is not None
    assert fp._ENCODE is not fp._encode_with_checks


@pytest.mark.parametrize(("kind", "payload", "params", "version", "key"), PUBLISHED_KEYS)
def test_keys_equal_the_published_ones(kind: str, payload: Any, params: Any, version: str, key: str) -> None:
    assert fp.fingerprint(kind, payload, params=params, version=version) == key
    assert _reference_key(kind, payload, params, version) == key


@pytest.mark.parametrize(("kind", "payload", "params", "version", "key"), PUBLISHED_KEYS)
def test_the_fallback_encoder_gives_the_same_keys(
    monkeypatch: pytest.MonkeyPatch, kind: str, payload: Any, params: Any, version: str, key: str
) -> None:
    monkeypatch.setattr(fp, "_ENCODE", fp._encode_with_checks)
    assert fp.fingerprint(kind, payload, params=params, version=version) == key


@given(document=json_values)
def test_the_encoder_built_once_writes_json_encoders_text(document: Any) -> None:
    canonical = fp._canonical(document, "$")
    assert fp._ENCODE(canonical) == fp._encode_with_checks(canonical)


@given(
    kind=st.text(max_size=6),
    payload=json_values,
    params=st.none() | st.dictionaries(st.text(max_size=6), json_values, max_size=3),
    version=st.text(max_size=4),
)
def test_keys_follow_the_recipe_with_json_dumps(kind: str, payload: Any, params: Any, version: str) -> None:
    assert fp.fingerprint(kind, payload, params=params, version=version) == _reference_key(
        kind, payload, params, version
    )


def test_without_the_c_encoder_the_module_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json.encoder, "c_make_encoder", None)
    assert fp._reused_c_encoder() is None


def test_an_encoder_that_disagrees_on_the_probe_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    # The probe compares the C encoder with JSONEncoder.encode; make the latter differ (e.g. a future
    # json module with other defaults) and the module must not use the C encoder.
    monkeypatch.setattr(fp, "_encode_with_checks", lambda value: json.dumps(value, sort_keys=True))
    assert fp._reused_c_encoder() is None
