"""Every exception aiqsim raises, from one place.

Catch :class:`AiqsimError` for anything aiqsim raises on purpose, or one family::

    AiqsimError
    ├── ConfigurationError (ValueError)    a setting, argument or file that cannot be used
    │   ├── ScenarioError                  a scenario file or override (file, key path, expectation)
    │   │                                  (TraceError, WorkloadTooLargeError are raised inside a run)
    │   ├── TraceError, WorkloadTooLargeError, ReplayArrivalsError (a replay workload's arrivals CSV)
    │   ├── RecordsNotKeptError (+AttributeError)  a per-task table asked of a records="summary" run
    │   ├── QuotaConfigError               a quota that could never grant a request
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
    │   ├── OutputPathError                an --out that cannot be written; nothing was overwritten
    │   ├── JobSpecError                   a job spec that cannot run (cycle, unknown stage or provider)
    │   ├── NoSettingMeetsError            no swept setting meets a decision's target on every seed
    │   ├── ServerStartError (RuntimeError)   a local provider server that cannot listen
    │   ├── KitOptionError                 a bad --aiqsim-* pytest option (aiqsim.testing)
    │   ├── CallLogError (OSError)         a call log that cannot be written where asked
    │   ├── MetricsRegistryError           a Prometheus registry that cannot take aiqsim's metrics
    │   ├── TracingError                   OpenTelemetry missing, or not a TracerProvider
    │   ├── CalibrationError               a call log that cannot be calibrated from
    │   ├── TuneError (RuntimeError)       a tuning run in which no trial could run
    │   ├── StaleCompiledModulesError (ImportError)  a compiled build whose sources were edited since
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
    │   ├── QuotaExhaustedError, InvalidRequestError, SchemaViolationError, PoisonInputError
    │   ├── TaskInterruptedError, AttemptRejectedError
    │   ├── ProviderContractError          an adapter's call() returned no ProviderResponse (fatal)
    │   ├── ProviderCancelledError         an adapter's call() raised a cancellation nobody asked for (fatal)
    │   ├── HttpStatusError                an HTTP status with no better class
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

from aiqsim.core.errors import (
    AiqsimError,
    ConfigurationError,
    SchedulingError,
    StaleCompiledModulesError,
    StoreError,
)
from aiqsim.core.failures import (
    AttemptRejectedError,
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
from aiqsim.core.slot_init import UnsupportedDataclassError
from aiqsim.core.states import IllegalTransitionError
from aiqsim.core.task import PriorityError
from aiqsim.core.token_bucket import QuotaConfigError
from aiqsim.fleet.leases import LeaseLostError
from aiqsim.http.adapter import CallableProviderArgumentError
from aiqsim.http.loopback import ServerStartError
from aiqsim.http.protocol_errors import HttpExchangeError, ResponseDecodingError, ResponseMismatchError
from aiqsim.http.status import HttpStatusError
from aiqsim.lab.decisions import NoSettingMeetsError
from aiqsim.lab.lab_errors import CalibrationError, TuneError
from aiqsim.lab.output_files import OutputPathError, TableFormatUnavailableError
from aiqsim.observability.prometheus import MetricsRegistryError
from aiqsim.observability.tracing import TracingError
from aiqsim.runtime.protocol import DeadlineExceeded
from aiqsim.runtime.simpy_runtime import InvalidStateError, RuntimeAlreadyRunningError, SimulationDeadlock
from aiqsim.scheduler.arguments import SchedulerArgumentError, SchedulerArgumentTypeError, UnknownNameError
from aiqsim.scheduler.call_log import CallLogError
from aiqsim.scheduler.handles import OutcomeAlreadySetError
from aiqsim.scheduler.jobs import JobCancelledError, JobFailedError, JobSpecError
from aiqsim.scheduler.scheduler import (
    QueueFullError,
    SchedulerClosedError,
    TaskCancelledError,
    TaskFailedError,
)
from aiqsim.sim.replay_arrivals import ReplayArrivalsError
from aiqsim.sim.scenario import ScenarioError
from aiqsim.sim.streaming import RecordsNotKeptError
from aiqsim.sim.sweep import SweepError, SweepTooLargeError
from aiqsim.sim.workloads import TraceError, WorkloadTooLargeError
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
from aiqsim.testing.crash_driver import ScenarioFailedError
from aiqsim.testing.invariants import InvariantViolation
from aiqsim.testing.options import KitOptionError
from aiqsim.testing.sigkill import WorkerFailedError

__all__ = [
    "AiqsimError",
    "AttemptRejectedError",
    "CalibrationError",
    "CallLogError",
    "CallableProviderArgumentError",
    "ConfigurationError",
    "DeadlineExceeded",
    "DuplicateTaskIdError",
    "FingerprintError",
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
    "StaleCompiledModulesError",
    "StoreAccessError",
    "StoreClosedError",
    "StoreCorruptError",
    "StoreError",
    "StoreLockedError",
    "StoreOpenError",
    "StoreWriteError",
    "StoreWriteOutcomeUnknownError",
    "StreamCutError",
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
