"""The simulation lab: scenario files, simulated providers, workloads, metrics and sweeps.

>>> from aiqsim.sim import simulate, sweep
>>> result = simulate("scenarios/retry_storm_429.toml", seed=0)
>>> result.summary["rate_limited"], result.tasks.head()
"""

# ruff: noqa: E402 (the check runs before the imports it guards)
from aiqsim.core.extras import require_extra

require_extra("lab", "aiqsim.sim")  # the lab's packages missing: one line that says what to install

from aiqsim.sim.config import FleetConfig, Scenario
from aiqsim.sim.fleet_metrics import FLEET_SUMMARY_KEYS, summarize_fleet
from aiqsim.sim.job_metrics import JOB_SUMMARY_KEYS
from aiqsim.sim.job_workloads import JobArrival, generate_job_arrivals
from aiqsim.sim.metrics import SUMMARY_KEYS
from aiqsim.sim.providers import Execution, ProviderLedger, SimulatedProvider
from aiqsim.sim.scenario import ScenarioError, load_scenario, parse_scenario
from aiqsim.sim.simulate import SimulationResult, simulate
from aiqsim.sim.sweep import RunFailure, SweepError, sweep
from aiqsim.sim.workloads import Arrival, generate_arrivals

__all__ = [
    "FLEET_SUMMARY_KEYS",
    "JOB_SUMMARY_KEYS",
    "SUMMARY_KEYS",
    "Arrival",
    "Execution",
    "FleetConfig",
    "JobArrival",
    "ProviderLedger",
    "RunFailure",
    "Scenario",
    "ScenarioError",
    "SimulatedProvider",
    "SimulationResult",
    "SweepError",
    "generate_arrivals",
    "generate_job_arrivals",
    "load_scenario",
    "parse_scenario",
    "simulate",
    "summarize_fleet",
    "sweep",
]
