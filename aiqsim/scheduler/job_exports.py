"""The public names of jobs (pipelines of calls, issue #15): the one list both packages export.

:mod:`aiqsim.scheduler` and :mod:`aiqsim` re-export these with ``from ... import *`` and add this
``__all__`` to their own, so a job name made public here is public in both, and neither list can
fall behind the other.
"""

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

__all__ = [
    "JobCancelledError",
    "JobFailedError",
    "JobHandle",
    "JobRecoveryReport",
    "JobSpec",
    "JobSpecError",
    "Jobs",
    "Stage",
]
