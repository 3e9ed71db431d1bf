"""Run the same async test body on both runtimes."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from aiqsim.runtime import AsyncioRuntime, SimPyRuntime

RUNTIMES = ["simpy", "asyncio"]
ASYNCIO_SCALE = 0.01
"""Under asyncio, one scheduler second lasts 10 ms of wall time in these tests."""

ASYNCIO_LATENESS_S = 50.0
"""How much later than asked (scheduler seconds) an asyncio timer may fire before a test calls it
a bug: 0.5 s of wall time at ``ASYNCIO_SCALE``, room for a loaded CI machine's scheduling jitter.
Timers never fire early, so lower bounds stay exact; tests keep the wrong outcome they rule out
(a timeout that never fires, a notify that is lost) further away than this."""


def make_runtime(name: str) -> Any:
    return SimPyRuntime() if name == "simpy" else AsyncioRuntime(time_scale=ASYNCIO_SCALE)


BODY_TIMEOUT_S = 600.0
"""A test body that has not finished after this many scheduler seconds fails instead of hanging
(6 s of wall time under asyncio, instant under SimPy)."""


def run_on(name: str, body: Callable[[Any], Coroutine[Any, Any, Any]]) -> Any:
    runtime = make_runtime(name)
    return runtime.run(runtime.wait_for(body(runtime), BODY_TIMEOUT_S))
