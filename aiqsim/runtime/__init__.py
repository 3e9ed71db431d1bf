"""Runtimes that drive the scheduler's coroutines: asyncio (real time) and SimPy (virtual time)."""

from aiqsim.runtime.asyncio_runtime import AsyncioRuntime
from aiqsim.runtime.protocol import Cancelled, DeadlineExceeded, Future, Runtime, TaskHandle
from aiqsim.runtime.simpy_runtime import (
    RuntimeAlreadyRunningError,
    SimFuture,
    SimPyRuntime,
    SimTask,
    SimulationDeadlock,
)
from aiqsim.runtime.sync import Lock, Queue, Signal

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
