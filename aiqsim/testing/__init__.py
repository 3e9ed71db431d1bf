"""aiqsim.testing: crash-recovery regression tests for your own code (and a pytest plugin).

Test *your* provider adapters, ``lookup`` functions, job definitions and store settings the way
aiqsim tests its own recovery: crash the process right before and right after every store write
and right after every side effect your code records (``--aiqsim-replay SEED:bK``, ``SEED:K``,
``SEED:eN``), for several seeds, restart it with ``recover()``, and check that nothing was lost,
nothing succeeded without a result and no key was executed (billed) twice.

- :class:`CrashDriver` runs your async scenario once per crash point and seed on a virtual clock
  (:mod:`aiqsim.testing.crash_driver`); a failure names the key, the seed and the crash point, and
  ``--aiqsim-replay SEED:POINT`` re-runs exactly that case.
- The invariants are plain functions (:mod:`aiqsim.testing.invariants`) raising
  :class:`InvariantViolation`, usable on any store you read yourself.
- :func:`kill_and_restart` SIGKILLs a real worker process at seeded moments and restarts it
  (:mod:`aiqsim.testing.sigkill`).
- :func:`simulated_provider` and :class:`StoreFactory` build the simulated providers (configured
  like a scenario's ``[[providers]]``) and the stores (memory, JSON, SQLite, PostgreSQL).
- The pytest plugin (:mod:`aiqsim.testing.plugin`, loaded automatically once aiqsim is installed)
  provides the fixtures ``aiqsim_runtime``, ``aiqsim_provider``, ``aiqsim_store``, ``aiqsim_crash``
  and ``aiqsim_sigkill`` and the options ``--aiqsim-seeds``, ``--aiqsim-crash-points``,
  ``--aiqsim-replay``.

Names are imported on first use, so ``import aiqsim.testing`` (which pytest does in every run
through the plugin) stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "CrashDriver": "aiqsim.testing.crash_driver",
    "CrashOutcome": "aiqsim.testing.crash_driver",
    "CrashReport": "aiqsim.testing.crash_driver",
    "CrashWorld": "aiqsim.testing.crash_driver",
    "Effect": "aiqsim.testing.crash_driver",
    "EffectLog": "aiqsim.testing.crash_driver",
    "Life": "aiqsim.testing.crash_driver",
    "ScenarioFailedError": "aiqsim.testing.crash_driver",
    "InvariantViolation": "aiqsim.testing.invariants",
    "check_all_terminal": "aiqsim.testing.invariants",
    "check_at_most_once": "aiqsim.testing.invariants",
    "check_finished_work_not_rerun": "aiqsim.testing.invariants",
    "check_job_stages_billed_once": "aiqsim.testing.invariants",
    "check_jobs_not_rebilled": "aiqsim.testing.invariants",
    "check_none_lost": "aiqsim.testing.invariants",
    "check_success_has_result": "aiqsim.testing.invariants",
    "CrashCase": "aiqsim.testing.options",
    "CrashOptions": "aiqsim.testing.options",
    "KitOptionError": "aiqsim.testing.options",
    "select_crash_points": "aiqsim.testing.options",
    "select_second_crashes": "aiqsim.testing.options",
    "provider_config": "aiqsim.testing.providers",
    "simulated_provider": "aiqsim.testing.providers",
    "KillReport": "aiqsim.testing.sigkill",
    "WorkerFailedError": "aiqsim.testing.sigkill",
    "WorkerRun": "aiqsim.testing.sigkill",
    "kill_and_restart": "aiqsim.testing.sigkill",
    "StoreFactory": "aiqsim.testing.stores",
    "store_kinds": "aiqsim.testing.stores",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'aiqsim.testing' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ImportError:  # the crash driver and simulated providers run the lab: say what to install
        from aiqsim.core.extras import require_extra

        require_extra("lab", f"aiqsim.testing.{name}")
        raise
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
