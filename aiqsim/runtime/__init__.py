"""Runtimes that drive the scheduler's coroutines: asyncio (real time) and SimPy (virtual time).

The SimPy runtime's names are imported on first use (PEP 562): a production worker, which runs on
asyncio, imports this package without SimPy installed (SimPy comes with the ``lab`` extra).
"""

from typing import TYPE_CHECKING, Any

from aiqsim.runtime.asyncio_runtime import AsyncioRuntime
from aiqsim.runtime.protocol import Cancelled, DeadlineExceeded, Future, Runtime, TaskHandle
from aiqsim.runtime.sync import Lock, Queue, Signal

if TYPE_CHECKING:
    from aiqsim.runtime.simpy_runtime import (
        RuntimeAlreadyRunningError,
        SimFuture,
        SimPyRuntime,
        SimTask,
        SimulationDeadlock,
    )

_SIMPY_NAMES = frozenset(
    {"RuntimeAlreadyRunningError", "SimFuture", "SimPyRuntime", "SimTask", "SimulationDeadlock"}
)


def __getattr__(name: str) -> Any:
    """The SimPy runtime's names, loaded when first asked for (they need SimPy: the lab extra)."""
    if name in _SIMPY_NAMES:
        try:
            from aiqsim.runtime import simpy_runtime
        except ImportError:
            from aiqsim.core.extras import require_extra

            require_extra("lab", name)  # SimPy missing: say which extra brings it
            raise
        value = getattr(simpy_runtime, name)
        globals()[name] = value  # found directly from now on
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AsyncioRuntime",
    "Cancelled",
    "DeadlineExceeded",
    "Future",
    "Lock",
    "Queue",
    "Runtime",
    "RuntimeAlreadyRunningError",
    "Signal",
    "SimFuture",
    "SimPyRuntime",
    "SimTask",
    "SimulationDeadlock",
    "TaskHandle",
]
