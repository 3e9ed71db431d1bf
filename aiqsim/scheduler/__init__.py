"""The production scheduler, written once against the runtime protocol."""

from aiqsim.scheduler.dispatch import (
    AgingShortestJobFirstPolicy,
    DispatchPolicy,
    FifoPolicy,
    ShortestJobFirstPolicy,
    dispatch_policy_from_name,
)
from aiqsim.scheduler.events import AttemptRecord, QuotaSample, SchedulerEvent, TaskTransition
from aiqsim.scheduler.provider import Provider, ProviderRequest, ProviderResponse, SupportsLookup
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
    "AgingShortestJobFirstPolicy",
    "AttemptGate",
    "AttemptRecord",
    "DispatchPolicy",
    "FifoPolicy",
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
    "Submission",
    "SupportsLookup",
    "TaskCancelledError",
    "TaskFailedError",
    "TaskTransition",
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
