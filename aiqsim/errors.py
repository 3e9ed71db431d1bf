"""Every exception aiqsim raises, from one place.

Catch :class:`AiqsimError` for anything aiqsim raises on purpose, or one family::

    AiqsimError
    ├── ConfigurationError (ValueError)    a setting, argument or file that cannot be used
    │   ├── ScenarioError                  a scenario file or override (file, key path, expectation)
    │   │                                  (TraceError, WorkloadTooLargeError are raised inside a run)
    │   ├── TraceError, WorkloadTooLargeError, ReplayArrivalsError (a replay workload's arrivals CSV)
    │   ├── RecordsNotKeptError (+AttributeError)  a per-task table asked of a records="summary" run
    │   ├── QuotaConfigError               a quota that could never grant a request
│   ├── RouteConfigError               a route that cannot be used (unknown provider, weight <= 0...)
    │   ├── FingerprintError (TypeError)   a payload that has no canonical form
    │   ├── PriorityError                  a priority that is not "interactive"/"background" (or the enum)
    │   ├── UnsupportedDataclassError (TypeError)  a record class fast_frozen_init cannot build
    │   ├── CallableProviderArgumentError (TypeError)  a CallableProvider name or function that cannot work
    │   ├── SchedulerArgumentError         a bad argument to Scheduler(), its methods or RetryPolicy, named
    │   │   ├── SchedulerArgumentTypeError (TypeError)   one of the wrong type (workers="w1")
    │   │   └── UnknownNameError (KeyError)   a provider, task id, job id or stage that is not known
    │   ├── DuplicateTaskIdError           a task (or job) id already in the store; nothing was stored
    │   ├── UnstorableValueError (TypeError)  a payload or result a durable store cannot keep as JSON
    │   ├── SweepTooLargeError             a sweep bigger than what can be run and kept
    │   ├── TableFormatUnavailableError (ImportError)   parquet asked for without pyarrow
    │   ├── ExtraMissingError (ImportError)   a feature whose extra is not installed (the pip line)
    │   ├── OutputPathError                an --out that cannot be written; nothing was overwritten
    │   ├── JobSpecError                   a job spec that cannot run (cycle, unknown stage or provider)
    │   │   └── FanOutLimitError           a fan-out stage's build gave more than its max_fan_out
    │   ├── NoSettingMeetsError            no swept setting meets a decision's target on every seed
    │   ├── ServerStartError (RuntimeError)   a local provider server that cannot listen
    │   ├── KitOptionError                 a bad --aiqsim-* pytest option (aiqsim.testing)
    │   ├── CallLogError (OSError)         a call log that cannot be written where asked
    │   ├── MetricsRegistryError           a Prometheus registry that cannot take aiqsim's metrics
    │   ├── TracingError                   OpenTelemetry missing, or not a TracerProvider
    │   ├── CalibrationError               a call log that cannot be calibrated from
    │   ├── TuneError (RuntimeError)       a tuning run in which no trial could run
    │   └── UsageError                     a command-line mistake (exit status 2; in aiqsim.cli)
    ├── StoreError                         a task store could not be opened, read or written
    │   ├── StoreCorruptError (RuntimeError)   a file that cannot be trusted; left untouched
    │   ├── StoreLockedError (RuntimeError)    another process holds a single-process store
    │   ├── StoreClosedError (RuntimeError)    used after close()
    │   ├── StoreOpenError (OSError)           a store that cannot be created at the path given
    │   │   └── StoreAccessError (PermissionError) files this process may not read or write
    │   └── StoreWriteError (OSError)          a change that was not persisted
    │       └── StoreWriteOutcomeUnknownError  a COMMIT whose answer was lost and whose outcome stayed unknown
    ├── SchedulingError                    the scheduler refused work or a task gave no result
    │   ├── QueueFullError (RuntimeError)      a queue at its depth limit; nothing was enqueued
    │   ├── SchedulerClosedError (RuntimeError)
    │   ├── TaskFailedError, TaskCancelledError   raised by ``await submission``
    │   ├── StreamInterruptedError, StreamAlreadyReadError   submission.stream(): a cut; a 2nd reader
    │   ├── IllegalTransitionError         a status change the transition table forbids
    │   ├── IllegalJobTransitionError      the same, for a job
    │   ├── OutcomeAlreadySetError (RuntimeError)  a task's or job's outcome resolved twice (a bug)
    │   ├── JobFailedError, JobCancelledError   raised by ``await job_handle`` (stage and reason)
    │   ├── LeaseLostError                 this worker was presumed dead; it stopped (fencing)
    │   ├── InvariantViolation (AssertionError)   a crash test found a broken recovery guarantee
    │   ├── WorkerFailedError (RuntimeError)      a SIGKILL test's worker failed on its own
    │   ├── ScenarioFailedError (RuntimeError)    a crash test's scenario (or its recovery) raised
    │   ├── DeadlineExceeded (TimeoutError)   Runtime.wait_for's own deadline passed
    │   └── InvalidStateError, SimulationDeadlock, RuntimeAlreadyRunningError (RuntimeError)   SimPy runtime
    ├── ProviderError                      a provider call failed (classified by classify_failure)
    │   ├── RateLimitError, ServerError, ProviderTimeoutError (TimeoutError), StreamCutError (a timeout)
    │   ├── FirstTokenTimeoutError (a timeout)   no first chunk within first_token_timeout_s
    │   ├── BilledStreamCutError           a cut stream (billed) the scheduler would not re-send (fatal)
    │   ├── QuotaExhaustedError, InvalidRequestError, SchemaViolationError, PoisonInputError
    │   ├── TaskInterruptedError, AttemptRejectedError
    │   │   └── BudgetExceeded             a spend budget has no room for the attempt (fatal)
    │   ├── ProviderContractError          an adapter's call() returned no ProviderResponse (fatal)
    │   ├── ProviderCancelledError         an adapter's call() raised a cancellation nobody asked for (fatal)
    │   ├── HttpStatusError                an HTTP status with no better class
    │   ├── MalformedStreamEventError, StreamTooLargeError (SchemaViolationError)   a broken SSE stream
    │   ├── CutStream                      raised by a loopback server's stream body: cut it mid-body
    │   └── HttpExchangeError (a ServerError)   the HTTP exchange itself broke: retryable
    │       ├── ResponseDecodingError          a body that cannot be decoded (broken gzip)
    │       └── ResponseMismatchError          an answer that echoes another request's key
    └── SweepError (RuntimeError)          sweep runs that failed, with the rows that worked

Two deliberate exceptions stand outside the tree: ``aiqsim.sim.crash.SimulatedCrash`` is a
``BaseException`` so that no ``except Exception`` in scheduler code can mistake a simulated
process death for a failure and carry on; ``aiqsim.sim.sweep.SweepInterrupted`` is the
``KeyboardInterrupt`` of a sweep stopped by Ctrl-C (it carries the finished runs' rows), so that
code which stops on Ctrl-C still stops. ``tests/test_errors.py`` walks every module and
checks each public exception class descends from :class:`AiqsimError`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from aiqsim.core.errors import (
    AiqsimError,
    ConfigurationError,
    SchedulingError,
    StoreError,
)
from aiqsim.core.extras import ExtraMissingError
from aiqsim.core.failures import (
    AttemptRejectedError,
    BilledStreamCutError,
    BudgetExceeded,
    FirstTokenTimeoutError,
    InvalidRequestError,
    PoisonInputError,
    ProviderCancelledError,
    ProviderContractError,
    ProviderError,
    ProviderTimeoutError,
    QuotaExhaustedError,
    RateLimitError,
    SchemaViolationError,
    ServerError,
    StreamCutError,
    TaskInterruptedError,
)
from aiqsim.core.fingerprint import FingerprintError
from aiqsim.core.job import IllegalJobTransitionError
from aiqsim.core.routing import RouteConfigError
from aiqsim.core.slot_init import UnsupportedDataclassError
from aiqsim.core.states import IllegalTransitionError
from aiqsim.core.task import PriorityError
from aiqsim.core.token_bucket import QuotaConfigError
from aiqsim.fleet.leases import LeaseLostError
from aiqsim.http.adapter import CallableProviderArgumentError
from aiqsim.http.loopback import CutStream, ServerStartError
from aiqsim.http.protocol_errors import HttpExchangeError, ResponseDecodingError, ResponseMismatchError
from aiqsim.http.sse_stream import StreamTooLargeError
from aiqsim.http.status import HttpStatusError
from aiqsim.http.stream_events import MalformedStreamEventError
from aiqsim.lab.lab_errors import CalibrationError, TuneError
from aiqsim.lab.output_files import OutputPathError, TableFormatUnavailableError
from aiqsim.observability.prometheus import MetricsRegistryError
from aiqsim.observability.tracing import TracingError
from aiqsim.runtime.protocol import DeadlineExceeded
from aiqsim.scheduler.arguments import SchedulerArgumentError, SchedulerArgumentTypeError, UnknownNameError
from aiqsim.scheduler.call_log import CallLogError
from aiqsim.scheduler.handles import OutcomeAlreadySetError
from aiqsim.scheduler.jobs import FanOutLimitError, JobCancelledError, JobFailedError, JobSpecError
from aiqsim.scheduler.scheduler import (
    QueueFullError,
    SchedulerClosedError,
    TaskCancelledError,
    TaskFailedError,
)
from aiqsim.scheduler.streams import StreamAlreadyReadError, StreamInterruptedError
from aiqsim.stores.base import (
    DuplicateTaskIdError,
    StoreAccessError,
    StoreClosedError,
    StoreCorruptError,
    StoreLockedError,
    StoreOpenError,
    StoreWriteError,
    StoreWriteOutcomeUnknownError,
    UnstorableValueError,
)
from aiqsim.testing.invariants import InvariantViolation
from aiqsim.testing.options import KitOptionError
from aiqsim.testing.sigkill import WorkerFailedError

if TYPE_CHECKING:
    from aiqsim.lab.decisions import NoSettingMeetsError
    from aiqsim.runtime.simpy_runtime import InvalidStateError, RuntimeAlreadyRunningError, SimulationDeadlock
    from aiqsim.sim.replay_arrivals import ReplayArrivalsError
    from aiqsim.sim.scenario import ScenarioError
    from aiqsim.sim.streaming import RecordsNotKeptError
    from aiqsim.sim.sweep import SweepError, SweepTooLargeError
    from aiqsim.sim.workloads import TraceError, WorkloadTooLargeError
    from aiqsim.testing.crash_driver import ScenarioFailedError

_LAB_ERRORS = {
    "NoSettingMeetsError": "aiqsim.lab.decisions",
    "InvalidStateError": "aiqsim.runtime.simpy_runtime",
    "RuntimeAlreadyRunningError": "aiqsim.runtime.simpy_runtime",
    "SimulationDeadlock": "aiqsim.runtime.simpy_runtime",
    "ReplayArrivalsError": "aiqsim.sim.replay_arrivals",
    "ScenarioError": "aiqsim.sim.scenario",
    "RecordsNotKeptError": "aiqsim.sim.streaming",
    "SweepError": "aiqsim.sim.sweep",
    "SweepTooLargeError": "aiqsim.sim.sweep",
    "TraceError": "aiqsim.sim.workloads",
    "WorkloadTooLargeError": "aiqsim.sim.workloads",
    "ScenarioFailedError": "aiqsim.testing.crash_driver",
}
"""Errors of the simulation lab, imported on first use: ``import aiqsim.errors`` needs no lab package."""


def __getattr__(name: str) -> type[BaseException]:
    """A lab error, loaded from its module when first asked for (needs the ``lab`` extra)."""
    module = _LAB_ERRORS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ImportError:
        from aiqsim.core.extras import require_extra

        require_extra("lab", f"aiqsim.errors.{name}")  # a lab package missing: say which extra brings it
        raise
    globals()[name] = value
    return value


__all__ = [
    "AiqsimError",
    "AttemptRejectedError",
    "BilledStreamCutError",
    "BudgetExceeded",
    "CalibrationError",
    "CallLogError",
    "CallableProviderArgumentError",
    "ConfigurationError",
    "CutStream",
    "DeadlineExceeded",
    "DuplicateTaskIdError",
    "ExtraMissingError",
    "FanOutLimitError",
    "FingerprintError",
    "FirstTokenTimeoutError",
    "HttpExchangeError",
    "HttpStatusError",
    "IllegalJobTransitionError",
    "IllegalTransitionError",
    "InvalidRequestError",
    "InvalidStateError",
    "InvariantViolation",
    "JobCancelledError",
    "JobFailedError",
    "JobSpecError",
    "KitOptionError",
    "LeaseLostError",
    "MalformedStreamEventError",
    "MetricsRegistryError",
    "NoSettingMeetsError",
    "OutcomeAlreadySetError",
    "OutputPathError",
    "PoisonInputError",
    "PriorityError",
    "ProviderCancelledError",
    "ProviderContractError",
    "ProviderError",
    "ProviderTimeoutError",
    "QueueFullError",
    "QuotaConfigError",
    "QuotaExhaustedError",
    "RateLimitError",
    "RecordsNotKeptError",
    "ReplayArrivalsError",
    "ResponseDecodingError",
    "ResponseMismatchError",
    "RouteConfigError",
    "RuntimeAlreadyRunningError",
    "ScenarioError",
    "ScenarioFailedError",
    "SchedulerArgumentError",
    "SchedulerArgumentTypeError",
    "SchedulerClosedError",
    "SchedulingError",
    "SchemaViolationError",
    "ServerError",
    "ServerStartError",
    "SimulationDeadlock",
    "StoreAccessError",
    "StoreClosedError",
    "StoreCorruptError",
    "StoreError",
    "StoreLockedError",
    "StoreOpenError",
    "StoreWriteError",
    "StoreWriteOutcomeUnknownError",
    "StreamAlreadyReadError",
    "StreamCutError",
    "StreamInterruptedError",
    "StreamTooLargeError",
    "SweepError",
    "SweepTooLargeError",
    "TableFormatUnavailableError",
    "TaskCancelledError",
    "TaskFailedError",
    "TaskInterruptedError",
    "TraceError",
    "TracingError",
    "TuneError",
    "UnknownNameError",
    "UnstorableValueError",
    "UnsupportedDataclassError",
    "WorkerFailedError",
    "WorkloadTooLargeError",
]
