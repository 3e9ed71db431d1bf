"""Shared pytest configuration: the hypothesis profile every property test runs under.

The "ci" profile (the default) has no per-example deadline, because the machine is shared
and a slow example is not a bug, and a moderate example count to keep the suite fast.
``print_blob=True`` prints a reproduction blob with every failure so it can be replayed
with ``@reproduce_failure``; examples stay randomised (``derandomize=False``) so new runs
keep exploring, and the failure database replays earlier failures first.
Select another profile with ``HYPOTHESIS_PROFILE=dev pytest ...``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=60,
    derandomize=False,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", parent=settings.get_profile("ci"), max_examples=300)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
