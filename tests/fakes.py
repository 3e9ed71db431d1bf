"""Fake providers as scenario tables (trio style): what each input does on each attempt."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiqsim.core.failures import (
    InvalidRequestError,
    ProviderTimeoutError,
    RateLimitError,
    SchemaViolationError,
    ServerError,
)
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse


@dataclass
class ScriptedProvider:
    """Each call sleeps ``latency_s`` then follows ``script[input][attempt_index]``.

    Script steps: ``"ok"``, ``"429:<retry_after>"``, ``"500"``, ``"timeout"``, ``"invalid"``,
    ``"schema"``, ``"hang"`` (never answers). Inputs not in the script always succeed; the last
    step repeats once the script runs out.
    """

    runtime: Any
    name: str = "llm"
    latency_s: float = 1.0
    script: Mapping[str, Sequence[str]] = field(default_factory=dict)
    calls: list[tuple[float, str, int]] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)

    def calls_for(self, input_name: str) -> int:
        return sum(1 for _, name, _ in self.calls if name == input_name)

    async def call(self, request: ProviderRequest) -> ProviderResponse:
        name = request.payload["input"]
        index = self.calls_for(name)
        self.calls.append((self.runtime.now(), name, request.attempt))
        steps = self.script.get(name, ("ok",))
        step = steps[min(index, len(steps) - 1)]
        try:
            await self.runtime.sleep(self.latency_s if step != "hang" else 10**9)
        except BaseException:
            self.cancelled.append(name)
            raise
        if step == "ok":
            return ProviderResponse(result={"output": f"done:{name}"}, usage=request.cost_estimate)
        if step.startswith("429"):
            _, _, after = step.partition(":")
            raise RateLimitError("slow down", retry_after_s=float(after) if after else None)
        if step == "500":
            raise ServerError("boom", status=500)
        if step == "timeout":
            raise ProviderTimeoutError("no answer")
        if step == "invalid":
            raise InvalidRequestError("bad request")
        if step == "schema":
            raise SchemaViolationError("unexpected shape")
        raise AssertionError(f"unknown script step {step!r}")
