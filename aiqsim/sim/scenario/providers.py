"""The ``[[providers]]`` tables and their ``[[providers.outages]]``: unique names, the latency model and
the stream model's keys, outage windows."""

from __future__ import annotations

from typing import Any

from aiqsim.sim.config import OutageConfig, ProviderConfig
from aiqsim.sim.scenario.errors import _fmt, describe
from aiqsim.sim.scenario.reader import _Reader
from aiqsim.sim.scenario.spec import _PROVIDER


def _outage(values: dict[str, Any], path: str, reader: _Reader) -> OutageConfig:
    if not values["end_s"] > values["start_s"]:
        raise reader.error(
            f"{path}.end_s",
            f"expected a number > start_s ({_fmt(values['start_s'])}), got {describe(values['end_s'])}",
        )
    return OutageConfig(**values)


def _providers(raw: tuple[dict[str, Any], ...], reader: _Reader) -> tuple[ProviderConfig, ...]:
    if not raw:
        raise reader.error("providers", "expected at least one [[providers]] table, got none")
    seen: dict[str, int] = {}
    providers = []
    for i, values in enumerate(raw):
        path = f"providers[{i}]"
        reader.unique_name(seen, "providers", i, "provider", values["name"])
        if values.get("latency_dist") == "exponential" and values.get("latency_sigma", 0.0) != 0:
            raise reader.error(
                f"{path}.latency_sigma",
                f'expected 0 (unset) with latency_dist = "exponential", whose spread is fixed, got '
                f"{describe(values['latency_sigma'])}",
            )
        _check_stream_model(values, path, reader)
        outages = tuple(
            _outage(outage, f"{path}.outages[{j}]", reader)
            for j, outage in enumerate(values.get("outages", ()))
        )
        providers.append(ProviderConfig(**{**values, "outages": outages}))
    return tuple(providers)


_STREAM_ONLY_KEYS = ("ttft_per_prompt_unit_s", "ttft_sigma", "stream_cut_prob")
_UNUSED_PER_UNIT = ProviderConfig.__dataclass_fields__["latency_per_unit_s"].default
"""``latency_per_unit_s`` as left unset: the stream model does not use it."""


def _check_stream_model(values: dict[str, Any], path: str, reader: _Reader) -> None:
    """A provider's stream model keys: ``ttft_s`` and ``tokens_per_s`` both or neither; the other stream
    keys only with them; ``latency_per_unit_s`` not with them (the token rate times generation)."""
    ttft, rate = values.get("ttft_s"), values.get("tokens_per_s")
    if (ttft is None) != (rate is None):
        missing, given = ("tokens_per_s", "ttft_s") if rate is None else ("ttft_s", "tokens_per_s")
        expected = "a number > 0 (output units per second)" if missing == "tokens_per_s" else "a number >= 0"
        raise reader.error(
            f"{path}.{missing}",
            f"expected {expected} with {given} set (the stream model takes both: the time to first token "
            "and the generation rate), got none",
        )
    if rate is None:
        for key in _STREAM_ONLY_KEYS:
            if values.get(key, 0.0) != 0:
                raise reader.error(
                    f"{path}.{key}",
                    f"expected 0 (unset) without the stream model (ttft_s and tokens_per_s), got "
                    f"{describe(values[key])}",
                )
    elif (
        values.get("latency_per_unit_s", _UNUSED_PER_UNIT) != _UNUSED_PER_UNIT
    ):  # a record's round trip has it
        raise reader.error(
            f"{path}.latency_per_unit_s",
            "expected unset with the stream model (tokens_per_s times the generation: output_units / "
            f"tokens_per_s; latency_per_unit_s is not used), got {describe(values['latency_per_unit_s'])}",
        )


def provider_from_table(raw: dict[str, Any], source: str) -> ProviderConfig:
    """One ``[[providers]]`` table (as a dict) read and checked exactly as a scenario file's first
    provider is: :class:`~aiqsim.sim.scenario.ScenarioError` naming ``source`` and the key
    (``providers[0].timeout_prob``) for an unknown key or a value out of range. The one definition of
    what a provider accepts, for other rooms (:func:`aiqsim.testing.provider_config`)."""
    reader = _Reader(source)
    return _providers((reader.read(raw, "providers[0]", _PROVIDER),), reader)[0]
