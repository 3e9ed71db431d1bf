"""The production scheduler, written once against the runtime protocol."""

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
    QueueRejected,
    QuotaSample,
    SchedulerEvent,
    TaskTransition,
)
from aiqsim.scheduler.provider import Provider, ProviderRequest, ProviderResponse, SupportsLookup
from aiqsim.scheduler.rate_limit_scope import DEFAULT_RATE_LIMIT_SCOPE, AdaptiveScopeRule, RateLimitScope
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
    "DEFAULT_INTERACTIVE_LIMIT",
    "DEFAULT_RATE_LIMIT_SCOPE",
    "AdaptiveScopeRule",
    "AgingShortestJobFirstPolicy",
    "AttemptGate",
    "AttemptRecord",
    "DispatchPolicy",
    "FifoPolicy",
    "LanePaused",
    "Provider",
    "ProviderRequest",
    "ProviderResponse",
    "QueueFullError",
    "QueueRejected",
    "QuotaSample",
    "RateLimitScope",
    "RecoveryReport",
    "RetryPolicy",
    "Scheduler",
    "SchedulerClosedError",
    "SchedulerEvent",
    "ShortestJobFirstPolicy",
    "Submission",
    "SupportsLookup",
    "TaskCancelledError",
    "TaskFailedError",
    "TaskTransition",
    "dispatch_policy_from_name",
]
