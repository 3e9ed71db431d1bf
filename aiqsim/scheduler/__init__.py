"""The production scheduler, written once against the runtime protocol."""

from aiqsim.scheduler.commit import DEFAULT_COMMIT_WINDOW_S
from aiqsim.scheduler.dispatch import (
    AgingShortestJobFirstPolicy,
    DispatchPolicy,
    FifoPolicy,
    ShortestJobFirstPolicy,
    dispatch_policy_from_name,
)
from aiqsim.scheduler.events import (
    AttemptRecord,
    LanePaused,
    OwnerUnreadable,
    QueueRejected,
    QuotaSample,
    QuotaUnavailable,
    SchedulerEvent,
    StoreWriteFailed,
    TaskTransition,
    UsageAnomaly,
)
from aiqsim.scheduler.provider import (
    Provider,
    ProviderRequest,
    ProviderResponse,
    StreamChunk,
    SupportsLookup,
    SupportsStreaming,
)
from aiqsim.scheduler.rate_limit_scope import DEFAULT_RATE_LIMIT_SCOPE, AdaptiveScopeRule, RateLimitScope
from aiqsim.scheduler.recovery_lookup import LookupRetry
from aiqsim.scheduler.retry import AttemptGate, RetryPolicy
from aiqsim.scheduler.scheduler import (
    DEFAULT_BACKGROUND_LIMIT,
    DEFAULT_INTERACTIVE_LIMIT,
    QueueFullError,
    RecoveryReport,
    Scheduler,
    SchedulerClosedError,
    Submission,
    TaskCancelledError,
    TaskFailedError,
)

__all__ = [
    "DEFAULT_BACKGROUND_LIMIT",
    "DEFAULT_COMMIT_WINDOW_S",
    "DEFAULT_INTERACTIVE_LIMIT",
    "DEFAULT_RATE_LIMIT_SCOPE",
    "AdaptiveScopeRule",
    "AgingShortestJobFirstPolicy",
    "AttemptGate",
    "AttemptRecord",
    "DispatchPolicy",
    "FifoPolicy",
    "LanePaused",
    "LookupRetry",
    "OwnerUnreadable",
    "Provider",
    "ProviderRequest",
    "ProviderResponse",
    "QueueFullError",
    "QueueRejected",
    "QuotaSample",
    "QuotaUnavailable",
    "RateLimitScope",
    "RecoveryReport",
    "RetryPolicy",
    "Scheduler",
    "SchedulerClosedError",
    "SchedulerEvent",
    "ShortestJobFirstPolicy",
    "StoreWriteFailed",
    "StreamChunk",
    "Submission",
    "SupportsLookup",
    "SupportsStreaming",
    "TaskCancelledError",
    "TaskFailedError",
    "TaskTransition",
    "UsageAnomaly",
    "dispatch_policy_from_name",
]

# Jobs, appended as one block: the public names of aiqsim.scheduler.jobs (its __all__).
from aiqsim.scheduler import jobs as _jobs
from aiqsim.scheduler.job_events import JobTransition, StageEvent
from aiqsim.scheduler.jobs import *  # noqa: F403

__all__ += _jobs.__all__
__all__ += ["JobTransition", "StageEvent"]

# Routes across deployments, appended as one block.
from aiqsim.core.routing import ROUTE_POLICIES, Route, RouteConfigError  # noqa: E402

__all__ += ["ROUTE_POLICIES", "Route", "RouteConfigError"]

# Tenants: weighted fair sharing of each lane (aiqsim.scheduler.tenants).
from aiqsim.scheduler.tenants import DEFAULT_TENANT, Tenant, TenantQueue  # noqa: E402

__all__ += ["DEFAULT_TENANT", "Tenant", "TenantQueue"]
