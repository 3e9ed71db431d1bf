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
    QuotaSample,
    SchedulerEvent,
    StoreWriteFailed,
    TaskTransition,
    UsageAnomaly,
)
from aiqsim.scheduler.provider import Provider, ProviderRequest, ProviderResponse, SupportsLookup
from aiqsim.scheduler.recovery_lookup import LookupRetry
from aiqsim.scheduler.retry import AttemptGate, RetryPolicy
from aiqsim.scheduler.scheduler import (
    QueueFullError,
    RecoveryReport,
    Scheduler,
    SchedulerClosedError,
    Submission,
    TaskCancelledError,
    TaskFailedError,
)

__all__ = [
    "DEFAULT_COMMIT_WINDOW_S",
    "AgingShortestJobFirstPolicy",
    "AttemptGate",
    "AttemptRecord",
    "DispatchPolicy",
    "FifoPolicy",
    "LookupRetry",
    "Provider",
    "ProviderRequest",
    "ProviderResponse",
    "QueueFullError",
    "QuotaSample",
    "RecoveryReport",
    "RetryPolicy",
    "Scheduler",
    "SchedulerClosedError",
    "SchedulerEvent",
    "ShortestJobFirstPolicy",
    "StoreWriteFailed",
    "Submission",
    "SupportsLookup",
    "TaskCancelledError",
    "TaskFailedError",
    "TaskTransition",
    "UsageAnomaly",
    "dispatch_policy_from_name",
]

# Jobs (issue #15), appended as one block.
from aiqsim.scheduler.job_events import JobTransition, StageEvent
from aiqsim.scheduler.jobs import (
    JobCancelledError,
    JobFailedError,
    JobHandle,
    JobRecoveryReport,
    Jobs,
    JobSpec,
    JobSpecError,
    Stage,
)

__all__ += [
    "JobCancelledError",
    "JobFailedError",
    "JobHandle",
    "JobRecoveryReport",
    "JobSpec",
    "JobSpecError",
    "JobTransition",
    "Jobs",
    "Stage",
    "StageEvent",
]
