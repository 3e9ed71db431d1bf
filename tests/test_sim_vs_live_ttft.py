"""Sim vs live for streams: the lab's time to first token agrees with a live run against the local
provider server (``aiqsim compare``), where the answers stream over HTTP as the OpenAI API streams
them and the scheduler reads them through ``HttpProvider.stream``.

The same requests meet the same fates and draw the same times to first token in both runs (the
provider's draws are keyed by request); what the live run adds is wall-clock lag: the server's
timers firing late and the wire. Both are measured in the run itself (``server_lag_p50_s``,
``transport_p50_s``) and taken off before the 10% check, as tests/test_sim_vs_live.py does for
call latency; timers never fire early, so the live figure is never below the simulated one by more
than the tolerance.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from aiqsim.http.live import compare_sim_and_live
from aiqsim.sim.simulate import simulate

SCENARIO = """
[scenario]
name = "sim_vs_live_ttft"
seed = 4
duration_s = 30
drain_s = 300

[[providers]]
name = "llm"
kind = "llm"
latency_base_s = 0.2
ttft_s = 1.5
ttft_per_prompt_unit_s = 0.002
ttft_sigma = 0.4
tokens_per_s = 60
stream_cut_prob = 0.05
supports_lookup = true

[quotas.llm]
concurrency = 32

[retry]
max_attempts = 4
attempt_timeout_s = 30

[[workloads]]
type = "poisson"
provider = "llm"
rate_per_s = 2.0
[workloads.cost]
dist = "lognormal"
mean = 600
sigma = 0.4
output_fraction = 0.25
"""

TIME_SCALE = 0.4
"""One scenario second lasts 0.4 s of wall time: the live run takes ~15 s."""

TTFT_TOLERANCE = 0.10
"""The lab's median time to first token agrees with the live one within 10%."""


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    path = tmp_path_factory.mktemp("sim_vs_live_ttft") / "sim_vs_live_ttft.toml"
    path.write_text(textwrap.dedent(SCENARIO), encoding="utf-8")
    return path, compare_sim_and_live(path, time_scale=TIME_SCALE)


def test_the_median_time_to_first_token_agrees_with_a_live_streamed_run(compared) -> None:
    _, frame = compared
    sim, live = frame["simulated"], frame["live"]
    print(frame.loc[["ttft_p50_s", "ttft_p99_s", "server_lag_p50_s", "transport_p50_s"]].to_string())
    assert live["tasks_submitted"] == sim["tasks_submitted"] > 40 and live["tasks_lost"] == 0
    assert math.isfinite(live["ttft_p50_s"]) and sim["ttft_p50_s"] > 1.0  # the live answers streamed
    lag = live["server_lag_p50_s"] + live["transport_p50_s"]  # measured in this run (scenario s)
    assert live["ttft_p50_s"] >= sim["ttft_p50_s"] * (1 - TTFT_TOLERANCE)
    assert abs(live["ttft_p50_s"] - lag - sim["ttft_p50_s"]) <= TTFT_TOLERANCE * sim["ttft_p50_s"]


@pytest.mark.parametrize("factor", [1.2, 1 / 1.2])
def test_a_first_token_model_changed_by_20_percent_is_outside_the_tolerance(compared, factor: float) -> None:
    """The check has teeth: the same live run against a simulation whose time to first token is 20%
    longer (or shorter) fails it."""
    path, frame = compared
    changed = simulate(
        path,
        overrides={
            "providers.llm.ttft_s": 1.5 * factor,
            "providers.llm.ttft_per_prompt_unit_s": 0.002 * factor,
        },
    ).summary["ttft_p50_s"]
    live = frame["live"]
    lag = live["server_lag_p50_s"] + live["transport_p50_s"]
    assert abs(live["ttft_p50_s"] - lag - changed) > TTFT_TOLERANCE * changed
