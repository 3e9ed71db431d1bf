"""Validation: evidence that the simulator tells the truth.

- :mod:`aiqsim.validation.mmc`: the production scheduler on the SimPy runtime against queueing
  theory (M/M/c, Erlang C).
- :mod:`aiqsim.validation.loss`: the depth limit against queueing theory (M/M/c/K blocking, Erlang B
  for a limit of 0).
- :mod:`aiqsim.validation.priority`: interactive before background against the M/M/c non-preemptive
  priority formula (Cobham).
- :mod:`aiqsim.validation.aws_jitter`: the backoff objects against the findings of Marc Brooker's
  "Exponential Backoff And Jitter" (AWS Architecture Blog, 2015).
- :mod:`aiqsim.validation.rate_limit_scope_study`: both sides of a 429 pause's scope (random 429s vs a
  spent server quota), the evidence for the default ``rate_limit_scope`` (imported on its own: it runs
  :func:`aiqsim.sim.simulate`).
"""

# ruff: noqa: E402 (the check runs before the imports it guards)
from aiqsim.core.extras import require_extra

require_extra("lab", "aiqsim.validation")  # the lab's packages missing: one line that says what to install

from aiqsim.validation.aws_jitter import (
    ALL_STRATEGIES,
    HOPS_PER_CALL,
    OccRun,
    OccServer,
    aws_jitter_study,
    run_occ_contention,
)
from aiqsim.validation.loss import BlockingResult, blocking_check, erlang_b, mmck_blocking, simulate_blocking
from aiqsim.validation.mmc import (
    AntitheticRandom,
    ExponentialServiceProvider,
    MMcResult,
    Replication,
    RunMeans,
    erlang_c,
    expected_wait_in_queue,
    mmc_check,
    run_means,
    simulate_records,
    simulate_replication,
    simulate_waits,
    t_quantile_975,
    wait_sensitivity,
)
from aiqsim.validation.priority import ClassWait, PriorityResult, priority_check, priority_waits

__all__ = [
    "ALL_STRATEGIES",
    "HOPS_PER_CALL",
    "AntitheticRandom",
    "BlockingResult",
    "ClassWait",
    "ExponentialServiceProvider",
    "MMcResult",
    "OccRun",
    "OccServer",
    "PriorityResult",
    "Replication",
    "RunMeans",
    "aws_jitter_study",
    "blocking_check",
    "erlang_b",
    "erlang_c",
    "expected_wait_in_queue",
    "mmc_check",
    "mmck_blocking",
    "priority_check",
    "priority_waits",
    "run_means",
    "run_occ_contention",
    "simulate_blocking",
    "simulate_records",
    "simulate_replication",
    "simulate_waits",
    "t_quantile_975",
    "wait_sensitivity",
]
