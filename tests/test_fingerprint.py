"""Idempotency keys: canonical JSON + SHA-256, stable across dict order, processes and hash seeds."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from aiqsim.core.fingerprint import FingerprintError, canonical_json, fingerprint

# JSON-like values as callers pass them: no NaN/inf, str keys, floats and ints mixed.
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
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=6)

SAMPLE_PARAMS = {"temperature": 0.2, "max_tokens": 256, "model": "small-2024"}
SAMPLE_PAYLOAD = {
    "messages": [{"role": "user", "content": "Summarise: naïve café ☕"}],
    "tags": ["a", "b"],
    "weights": {"z": 1.5, "a": -3, "m": 2.0},
}


def reordered(value: Any, rng: random.Random) -> Any:
    """The same value with every dict's insertion order shuffled (recursively)."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: reordered(v, rng) for k, v in items}
    if isinstance(value, list):
        return [reordered(v, rng) for v in value]
    return value


# ---------------------------------------------------------------------------- the recipe


def test_golden_value_from_the_documented_recipe() -> None:
    """Built by hand: keys sorted at every level, no whitespace, UTF-8 text as is, integral
    floats written as integers, the four top-level fields input/kind/params/version."""
    canonical = (
        '{"input":{"n":2,"ratio":0.7,"text":"héllo ☕","xs":[3,1,null,true]},'
        '"kind":"summarise",'
        '"params":{"model":"m-1","temperature":0},'
        '"version":"2024-06"}'
    )
    expected = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    key = fingerprint(
        "summarise",
        {"xs": [3, 1.0, None, True], "text": "héllo ☕", "ratio": 0.7, "n": 2.0},
        params={"temperature": 0.0, "model": "m-1"},
        version="2024-06",
    )
    assert key == expected
    assert len(key) == 64 and set(key) <= set("0123456789abcdef")


def test_canonical_json_is_compact_sorted_utf8() -> None:
    assert (
        canonical_json({"b": [1.0, 2.5], "a": {"y": None, "x": "é"}})
        == '{"a":{"x":"é","y":null},"b":[1,2.5]}'
    )
    assert canonical_json((1, 2)) == canonical_json([1, 2]) == "[1,2]"
    assert canonical_json(b"\x00\xff") == '{"$bytes":"AP8="}'


# ---------------------------------------------------------------------------- stability


@given(payload=json_objects, params=json_objects, rng=st.randoms(use_true_random=False))
def test_dict_order_does_not_matter(
    payload: dict[str, Any], params: dict[str, Any], rng: random.Random
) -> None:
    key = fingerprint("embed", payload, params=params, version="v1")
    assert fingerprint("embed", reordered(payload, rng), params=reordered(params, rng), version="v1") == key


def test_stable_across_processes_and_hash_seeds() -> None:
    """A key computed in this process equals the key computed by fresh interpreters with
    different PYTHONHASHSEEDs (str hashes, and so set/dict internals, differ between them)."""
    script = (
        "import json, sys\n"
        "from aiqsim.core.fingerprint import fingerprint\n"
        "args = json.loads(sys.stdin.read())\n"
        "print(fingerprint(args['kind'], args['payload'], params=args['params'], version=args['version']))\n"
    )
    args = {"kind": "chat", "payload": SAMPLE_PAYLOAD, "params": SAMPLE_PARAMS, "version": "v3"}
    here = fingerprint("chat", SAMPLE_PAYLOAD, params=SAMPLE_PARAMS, version="v3")
    seeds = {os.environ.get("PYTHONHASHSEED", "random"), "0", "4242"}
    for seed in sorted(seeds | {"1"}):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", script],
            input=json.dumps(args),
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=True,
        )
        assert out.stdout.strip() == here, f"PYTHONHASHSEED={seed}: {out.stderr}"


# ---------------------------------------------------------------------------- what the key depends on


def test_every_component_changes_the_key() -> None:
    base = fingerprint("chat", SAMPLE_PAYLOAD, params=SAMPLE_PARAMS, version="v1")
    variants = {
        "kind": fingerprint("embed", SAMPLE_PAYLOAD, params=SAMPLE_PARAMS, version="v1"),
        "version": fingerprint("chat", SAMPLE_PAYLOAD, params=SAMPLE_PARAMS, version="v2"),
        "params": fingerprint(
            "chat", SAMPLE_PAYLOAD, params={**SAMPLE_PARAMS, "temperature": 0.3}, version="v1"
        ),
        "no params": fingerprint("chat", SAMPLE_PAYLOAD, version="v1"),
        "input": fingerprint(
            "chat", {**SAMPLE_PAYLOAD, "tags": ["b", "a"]}, params=SAMPLE_PARAMS, version="v1"
        ),
    }
    assert base not in variants.values()
    assert len(set(variants.values())) == len(variants)


def test_components_do_not_bleed_into_each_other() -> None:
    """Moving text between kind, version, params and input never yields the same key."""
    keys = {
        fingerprint("ab", None),
        fingerprint("a", None, version="b"),
        fingerprint("", "ab"),
        fingerprint("", None, version="ab"),
        fingerprint("", None, params={"ab": None}),
        fingerprint("", {"ab": None}),
        fingerprint("", {}),
        fingerprint("", []),
        fingerprint("", ""),
        fingerprint("", 0),
        fingerprint("", False),
    }
    assert len(keys) == 11


def test_missing_and_empty_params_are_the_same_request() -> None:
    assert fingerprint("k", [1], params=None) == fingerprint("k", [1], params={}) == fingerprint("k", [1])


@given(a=json_values, b=json_values)
def test_different_inputs_give_different_keys(a: Any, b: Any) -> None:
    assume(canonical_json(a) != canonical_json(b))
    assert fingerprint("k", a) != fingerprint("k", b)


@given(payload=json_values, kind_a=st.text(max_size=10), kind_b=st.text(max_size=10))
def test_different_kinds_give_different_keys(payload: Any, kind_a: str, kind_b: str) -> None:
    assume(kind_a != kind_b)
    assert fingerprint(kind_a, payload) != fingerprint(kind_b, payload)


@given(payload=json_values, version_a=st.text(max_size=10), version_b=st.text(max_size=10))
def test_different_versions_give_different_keys(payload: Any, version_a: str, version_b: str) -> None:
    assume(version_a != version_b)
    assert fingerprint("k", payload, version=version_a) != fingerprint("k", payload, version=version_b)


@given(payload=json_values, params_a=json_objects, params_b=json_objects)
def test_different_params_give_different_keys(payload: Any, params_a: dict, params_b: dict) -> None:
    assume(canonical_json(params_a) != canonical_json(params_b))
    assert fingerprint("k", payload, params=params_a) != fingerprint("k", payload, params=params_b)


# ---------------------------------------------------------------------------- numbers


@given(st.integers(min_value=-(2**80), max_value=2**80))
def test_an_integer_and_the_equal_float_agree(number: int) -> None:
    as_float = float(number)
    if as_float == number:  # every int below 2**53, and the representable ones above
        assert fingerprint("k", {"n": number}) == fingerprint("k", {"n": as_float})
    else:
        assert fingerprint("k", {"n": number}) != fingerprint("k", {"n": as_float})


@pytest.mark.parametrize(
    ("a", "b"),
    [(1, 1.0), (0, -0.0), (-7, -7.0), (10**16, 1e16), (2**60, 2.0**60), (int(1e300), 1e300)],
    ids=["1", "-0", "-7", "1e16", "2^60", "1e300"],
)
def test_equal_numbers_agree(a: int, b: float) -> None:
    assert a == b
    assert fingerprint("k", [a]) == fingerprint("k", [b])


def test_booleans_are_not_numbers_and_fractions_are_kept() -> None:
    assert fingerprint("k", [True]) != fingerprint("k", [1])
    assert fingerprint("k", [0.1]) != fingerprint("k", [0])
    assert fingerprint("k", [0.1 + 0.2]) != fingerprint("k", [0.3])  # shortest repr is exact


# ---------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_raise_naming_the_path(bad: float) -> None:
    with pytest.raises(FingerprintError, match=r"\$\.input\.rows\[1\]\.score: non-finite float"):
        fingerprint("k", {"rows": [{"score": 1.0}, {"score": bad}]})


@pytest.mark.parametrize(
    ("payload", "path", "what"),
    [
        ({"tags": {"a", "b"}}, r"\$\.input\.tags", "set"),
        ({"obj": [object()]}, r"\$\.input\.obj\[0\]", "object"),
        ({"n": 1j}, r"\$\.input\.n", "complex"),
        ({"when": [None, print]}, r"\$\.input\.when\[1\]", "builtin_function_or_method"),
    ],
)
def test_non_json_objects_raise_naming_the_path(payload: Any, path: str, what: str) -> None:
    with pytest.raises(FingerprintError, match=rf"{path}: {what} is not JSON-like"):
        fingerprint("k", payload)


def test_non_string_keys_raise_naming_the_path() -> None:
    with pytest.raises(FingerprintError, match=r"\$\.input\.m: dict keys must be str, got int 1"):
        fingerprint("k", {"m": {1: "one"}})


def test_params_are_checked_like_the_input() -> None:
    with pytest.raises(FingerprintError, match=r"\$\.params\.temperature: non-finite"):
        fingerprint("k", "x", params={"temperature": math.nan})


@pytest.mark.parametrize("payload", [{"text": "bad \ud800 surrogate"}, {"bad \udfff key": 1}])
def test_strings_with_no_utf8_form_raise_fingerprint_error(payload: dict[str, Any]) -> None:
    with pytest.raises(FingerprintError, match=r"\$\.input.*not valid Unicode"):
        fingerprint("k", payload)


def test_fingerprint_error_is_a_type_error() -> None:
    assert issubclass(FingerprintError, TypeError)


# Everything the slow path accepts or refuses: tuples, bytes, integral and non-finite floats, lone
# surrogates, int/str/dict subclasses, non-str keys; the fast path must agree byte for byte.
class _Str(str):
    pass


class _Dict(dict):  # type: ignore[type-arg]
    pass


awkward_scalars = (
    scalars
    | st.floats()  # nan, inf, -0.0, integral floats
    | st.binary(max_size=8)
    | st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=2)
    | st.text(max_size=4).map(_Str)
    | st.integers().map(lambda n: n == 0)  # bools made from ints
)
awkward_values = st.recursive(
    awkward_scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=8) | st.integers(), children, max_size=4)
        | st.dictionaries(st.text(max_size=4), children, max_size=3).map(_Dict)
    ),
    max_leaves=20,
)


def _slow_key(kind: str, payload: Any, params: Any, version: str) -> str:
    document = {"kind": kind, "version": version, "params": dict(params or {}), "input": payload}
    return hashlib.sha256(canonical_json(document).encode("utf-8")).hexdigest()


@given(
    kind=st.text(max_size=6),
    payload=awkward_values,
    params=st.none() | st.dictionaries(st.text(max_size=6), awkward_values, max_size=3),
    version=st.text(max_size=4),
)
def test_fast_path_gives_the_slow_paths_key_or_error(
    kind: str, payload: Any, params: Any, version: str
) -> None:
    try:
        expected: Any = _slow_key(kind, payload, params, version)
    except FingerprintError as error:
        expected = (FingerprintError, str(error))
    try:
        got: Any = fingerprint(kind, payload, params=params, version=version)
    except FingerprintError as error:
        got = (FingerprintError, str(error))
    assert got == expected


def test_fast_path_is_taken_for_flat_payloads_and_not_for_ones_needing_conversion() -> None:
    from aiqsim.core.fingerprint import _already_canonical

    assert _already_canonical({"input": "naïve ☕", "prompt_units": 12, "output_units": 3, "p": 0.5})
    for needs_work in ({"a": 1.0}, {"a": (1,)}, {"a": b"x"}, {"a": "\ud800"}, {1: "x"}, {"a": math.nan}):
        assert not _already_canonical(needs_work)


@pytest.mark.parametrize(
    ("kind", "payload", "params", "version"),
    [
        (
            "llm",
            {"input": "w0-input-000001", "prompt_units": 812, "output_units": 230, "poison": False},
            None,
            "",
        ),
        (
            "vision",
            {"input": 'a "quoted"\n\\ naïve ☕', "z": [1, 0.5, None, True], "a": {}},
            {},
            "v2.1",
        ),
        ("tts", "just text", None, ""),
        ("llm", {"input": "x"}, {"temperature": 0.2}, ""),  # with params
        ("llmé", {"input": "x"}, None, ""),  # a non-ASCII kind
        ("llm", {"input": "x"}, None, "vé"),  # a non-ASCII version
        ("llm", {"input": "x", "n": 2.0}, None, ""),  # an integral float needs conversion
        ("llm", ("a", 1), None, ""),  # a tuple needs conversion
    ],
)
def test_the_assembled_text_gives_the_whole_documents_key(
    monkeypatch: pytest.MonkeyPatch, kind: str, payload: Any, params: Any, version: str
) -> None:
    # fingerprint() assembles the document's text from its members' texts, kind and version quoted
    # as text; the key must be that of the canonical JSON of the whole document.
    import aiqsim.core.fingerprint as fp

    texts: list[str] = []
    encode_text = fp._encode_text

    def spy(text: str) -> str:
        texts.append(text)
        return encode_text(text)

    monkeypatch.setattr(fp, "_encode_text", spy)
    assert fingerprint(kind, payload, params=params, version=version) == _slow_key(
        kind, payload, params, version
    )
    assert texts[:2] == [kind, version]


def _holding_itself() -> list:
    cycle: list = []
    cycle.append(cycle)
    return cycle


@pytest.mark.parametrize(
    ("payload", "params", "said"),
    [
        (_holding_itself(), None, "holds itself"),  # was a bare RecursionError
        ({"n": 10**5000}, None, "4300 digits"),  # was a bare ValueError from int-to-text
        ({"a": 1}, [1], "$.params: expected a mapping"),  # was a bare TypeError from dict()
    ],
)
def test_what_has_no_canonical_form_is_a_fingerprint_error(payload: Any, params: Any, said: str) -> None:
    with pytest.raises(FingerprintError, match=re.escape(said)):
        fingerprint("llm", payload, params=params)  # type: ignore[arg-type]
    if params is None:
        with pytest.raises(FingerprintError, match=re.escape(said)):
            canonical_json(payload)


def test_nesting_is_bounded_by_depth_not_by_the_recursion_limit() -> None:
    """A value holding itself, or nested beyond MAX_NESTING, is refused by depth with a clear
    error, not by Python's RecursionError."""
    from aiqsim.core.fingerprint import MAX_NESTING

    def nested(depth: int) -> Any:
        value: Any = 1
        for level in range(depth):
            value = [value] if level % 2 else {"x": value}
        return value

    assert fingerprint("llm", nested(MAX_NESTING - 1)) == fingerprint("llm", nested(MAX_NESTING - 1))
    with pytest.raises(FingerprintError, match=f"nested deeper than {MAX_NESTING} levels"):
        fingerprint("llm", nested(MAX_NESTING + 1))
    with pytest.raises(FingerprintError, match=f"nested deeper than {MAX_NESTING} levels"):
        canonical_json(nested(MAX_NESTING + 1))
