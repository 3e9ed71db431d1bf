"""aiqsim: schedule AI API calls safely, and prove the settings in simulation first.

The pure rules (task states, token buckets, backoff, failure classes, idempotency keys)
live in :mod:`aiqsim.core`; the one scheduler in :mod:`aiqsim.scheduler`; the two
runtimes that drive it in :mod:`aiqsim.runtime`; task stores in :mod:`aiqsim.stores`;
the simulation lab in :mod:`aiqsim.sim`.

The production scheduler needs nothing beyond the standard library (``pip install aiqsim``); the lab
(SimPy, numpy, pandas, matplotlib, ipywidgets) is the ``lab`` extra (``pip install "aiqsim[lab]"``),
and its names here (:class:`SimPyRuntime`) are imported on first use.
"""

from aiqsim.core.backoff import (
    BackoffStrategy,
    ConstantBackoff,
    DecorrelatedJitter,
    EqualJitter,
    ExponentialBackoff,
    FullJitter,
    NoBackoff,
    backoff_from_name,
    retry_delay,
)
from aiqsim.core.errors import AiqsimError, ConfigurationError, SchedulingError, StoreError
from aiqsim.core.failures import (
    FailureClass,
    InvalidRequestError,
    PoisonInputError,
    ProviderError,
    ProviderTimeoutError,
    QuotaExhaustedError,
    RateLimitError,
    SchemaViolationError,
    ServerError,
    StreamCutError,
    TaskInterruptedError,
    classify_failure,
)
from aiqsim.core.fingerprint import canonical_json, fingerprint
from aiqsim.core.retry_after import parse_retry_after
from aiqsim.core.states import TRANSITIONS, IllegalTransitionError, transition
from aiqsim.core.task import Priority, TaskRecord, TaskStatus
from aiqsim.core.token_bucket import MultiQuota, QuotaConfigError, QuotaLimits, Reservation, TokenBucket
from aiqsim.runtime import AsyncioRuntime, Cancelled
from aiqsim.scheduler import (
    AgingShortestJobFirstPolicy,
    FifoPolicy,
    ProviderRequest,
    ProviderResponse,
    QueueFullError,
    RetryPolicy,
    Scheduler,
    ShortestJobFirstPolicy,
    Submission,
    TaskCancelledError,
    TaskFailedError,
)
from aiqsim.stores import (
    JsonFileStore,
    MemoryStore,
    SqliteStore,
    StoreCorruptError,
    TaskStore,
    open_store,
)

__version__ = "0.2.0"


def __getattr__(name: str) -> object:
    """Names that need optional extras are imported on first use: the fleet's (redis, psycopg) and
    the SimPy runtime (the ``lab`` extra), so ``import aiqsim`` needs none of them."""
    if name == "SimPyRuntime":
        from aiqsim import runtime

        return runtime.SimPyRuntime
    if name == "RedisQuota":
        from aiqsim.fleet.redis_quota import RedisQuota

        return RedisQuota
    if name == "PostgresStore":
        from aiqsim.stores.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module 'aiqsim' has no attribute {name!r}")


__all__ = [
    "TRANSITIONS",
    "AgingShortestJobFirstPolicy",
    "AiqsimError",
    "AsyncioRuntime",
    "BackoffStrategy",
    "Cancelled",
    "ConfigurationError",
    "ConstantBackoff",
    "DecorrelatedJitter",
    "EqualJitter",
    "ExponentialBackoff",
    "FailureClass",
    "FifoPolicy",
    "FullJitter",
    "IllegalTransitionError",
    "InvalidRequestError",
    "JsonFileStore",
    "MemoryStore",
    "MultiQuota",
    "NoBackoff",
    "PoisonInputError",
    "PostgresStore",  # noqa: F405 (imported on first use, by __getattr__)
    "Priority",
    "ProviderError",
    "ProviderRequest",
    "ProviderResponse",
    "ProviderTimeoutError",
    "QueueFullError",
    "QuotaConfigError",
    "QuotaExhaustedError",
    "QuotaLimits",
    "RateLimitError",
    "RedisQuota",  # noqa: F405 (imported on first use, by __getattr__)
    "Reservation",
    "RetryPolicy",
    "Scheduler",
    "SchedulingError",
    "SchemaViolationError",
    "ServerError",
    "ShortestJobFirstPolicy",
    "SimPyRuntime",  # noqa: F405 (imported on first use, by __getattr__)
    "SqliteStore",
    "StoreCorruptError",
    "StoreError",
    "StreamCutError",
    "Submission",
    "TaskCancelledError",
    "TaskFailedError",
    "TaskInterruptedError",
    "TaskRecord",
    "TaskStatus",
    "TaskStore",
    "TokenBucket",
    "__version__",
    "backoff_from_name",
    "canonical_json",
    "classify_failure",
    "fingerprint",
    "open_store",
    "parse_retry_after",
    "retry_delay",
    "transition",
]

# Jobs: pipelines of calls. Appended as one block so parallel edits above merge cleanly.
# ruff: noqa: E402
from aiqsim.core.job import JobRecord, JobStatus, derive_job_status
from aiqsim.scheduler import jobs as _jobs
from aiqsim.scheduler.jobs import *  # noqa: F403

__all__ += _jobs.__all__
__all__ += ["JobRecord", "JobStatus", "derive_job_status"]

# Routes: one model across several deployments. Appended as one block, as jobs above.
from aiqsim.core.routing import ROUTE_POLICIES, Route, RouteConfigError

__all__ += ["ROUTE_POLICIES", "Route", "RouteConfigError"]

# Tenants: weighted fair sharing of each lane (aiqsim.scheduler.tenants), appended as one block too.
from aiqsim.scheduler.tenants import Tenant

__all__ += ["Tenant"]
