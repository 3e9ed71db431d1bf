"""The public names of ``aiqsim`` and ``aiqsim.scheduler``: a snapshot taken before their export lists
were made to derive one from the other (the jobs block), so no name a user imports today goes missing.

A name added on purpose is added here too; a name that disappears fails here first.
"""

from __future__ import annotations

import importlib

import pytest

AIQSIM_NAMES = frozenset(
    {
        "AgingShortestJobFirstPolicy",
        "AiqsimError",
        "Tenant",
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
        "DEFAULT_MAX_FAN_OUT",
        "FanOutLimitError",
        "JobCancelledError",
        "JobFailedError",
        "JobHandle",
        "JobRecord",
        "JobRecoveryReport",
        "JobSpec",
        "JobSpecError",
        "JobStatus",
        "Jobs",
        "JsonFileStore",
        "MemoryStore",
        "MultiQuota",
        "NoBackoff",
        "PoisonInputError",
        "PostgresStore",
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
        "RedisQuota",
        "Reservation",
        "RetryPolicy",
        "Scheduler",
        "SchedulingError",
        "SchemaViolationError",
        "ServerError",
        "ShortestJobFirstPolicy",
        "SimPyRuntime",
        "SqliteStore",
        "Stage",
        "StoreCorruptError",
        "StoreError",
        "Submission",
        "TRANSITIONS",
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
        "derive_job_status",
        "fingerprint",
        "open_store",
        "parse_retry_after",
        "retry_delay",
        "transition",
    }
)
"""``aiqsim.__all__`` as it was (PostgresStore and RedisQuota are imported on first use)."""

SCHEDULER_NAMES = frozenset(
    {
        "DEFAULT_TENANT",
        "Tenant",
        "TenantQueue",
        "AdaptiveScopeRule",
        "AgingShortestJobFirstPolicy",
        "AttemptGate",
        "AttemptRecord",
        "DEFAULT_BACKGROUND_LIMIT",
        "DEFAULT_COMMIT_WINDOW_S",
        "DEFAULT_INTERACTIVE_LIMIT",
        "DEFAULT_RATE_LIMIT_SCOPE",
        "DispatchPolicy",
        "FifoPolicy",
        "DEFAULT_MAX_FAN_OUT",
        "FanOutLimitError",
        "JobCancelledError",
        "JobFailedError",
        "JobHandle",
        "JobRecoveryReport",
        "JobSpec",
        "JobSpecError",
        "JobTransition",
        "Jobs",
        "LanePaused",
        "LookupRetry",
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
        "Stage",
        "StageEvent",
        "StoreWriteFailed",
        "Submission",
        "SupportsLookup",
        "TaskCancelledError",
        "TaskFailedError",
        "TaskTransition",
        "UsageAnomaly",
        "dispatch_policy_from_name",
    }
)
"""``aiqsim.scheduler.__all__`` as it was."""


@pytest.mark.parametrize(
    ("module", "names"), [("aiqsim", AIQSIM_NAMES), ("aiqsim.scheduler", SCHEDULER_NAMES)]
)
def test_every_public_name_of_today_is_still_exported_once(module: str, names: frozenset[str]) -> None:
    exported = importlib.import_module(module).__all__
    assert len(exported) == len(set(exported)), "a name is listed twice"
    assert names <= set(exported), f"no longer exported: {sorted(names - set(exported))}"


@pytest.mark.parametrize(
    ("module", "names"), [("aiqsim", AIQSIM_NAMES), ("aiqsim.scheduler", SCHEDULER_NAMES)]
)
def test_every_exported_name_can_be_imported(module: str, names: frozenset[str]) -> None:
    namespace: dict[str, object] = {}
    exec(f"from {module} import *", namespace)  # what ``from module import *`` really binds
    for name in sorted(names):
        exec(f"from {module} import {name}", namespace)  # the lazy names too
        assert namespace[name] is getattr(importlib.import_module(module), name)


def test_the_job_names_are_the_same_objects_in_both_modules() -> None:
    import aiqsim
    import aiqsim.scheduler

    for name in sorted(AIQSIM_NAMES & SCHEDULER_NAMES):
        assert getattr(aiqsim, name) is getattr(aiqsim.scheduler, name), name
