"""Sim vs real: run a scenario live, in (scaled) real time, against local provider servers over HTTP.

The live run uses the *same harness* as :func:`aiqsim.sim.simulate` (same arrivals, same
scheduler, same crash and restart logic); only the backend changes: an
:class:`~aiqsim.runtime.AsyncioRuntime` instead of SimPy, and :class:`HttpProvider` clients
talking to one :func:`~aiqsim.http.server.start_local_server` per provider config (which runs
the simulated provider's rules behind real sockets on 127.0.0.1). Comparing the two results
shows what the virtual clock leaves out: transport, event-loop latency, real concurrency.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from aiqsim.core.errors import ConfigurationError
from aiqsim.runtime.asyncio_runtime import AsyncioRuntime
from aiqsim.sim.config import Scenario
from aiqsim.sim.simulate import SimulationResult, resolve_scenario, run_scenario, simulate


def simulator_result(body: Any) -> Any:
    """The simulator's own result, which the local servers send whole under ``result`` beside the chat
    completion, so a live job builds its later stages from the same results as a simulated one
    (a from_stage size needs the earlier stage's ``output_units``); else the chat text."""
    from aiqsim.http.chat import chat_content

    if isinstance(body, Mapping) and isinstance(body.get("result"), Mapping):
        return body["result"]
    return chat_content(body)


DEFAULT_TIME_SCALE = 0.05
"""Wall seconds per scenario second for live runs (a 60 s scenario takes 3 s)."""
MIN_TIME_SCALE = 0.001
"""The smallest live time scale: below a millisecond per scenario second, loopback HTTP itself takes
longer than the scenario's timings (a 1e-300 scale 'ran' with every call timed out and tasks lost)."""


def check_live_time_scale(time_scale: Any, label: str) -> None:
    """A live run's time scale: a finite number of wall seconds per scenario second, at least
    :data:`MIN_TIME_SCALE`; else a ConfigurationError naming ``label``."""
    if (
        isinstance(time_scale, bool)
        or not isinstance(time_scale, int | float)
        or not (MIN_TIME_SCALE <= time_scale < math.inf)
    ):
        raise ConfigurationError(
            f"{label} {time_scale!r}: expected a finite number >= {MIN_TIME_SCALE:g} (wall seconds per "
            "scenario second; below that, loopback HTTP takes longer than the scenario's timings), e.g. 0.2"
        )


def run_live(
    scenario: Scenario | str | Path,
    seed: int | None = None,
    *,
    time_scale: float = DEFAULT_TIME_SCALE,
    overrides: Mapping[str, Any] | None = None,
    workdir: str | Path | None = None,
    header_corrections: bool = False,
) -> SimulationResult:
    """Run ``scenario`` live over HTTP on 127.0.0.1 and return the same kind of result as ``simulate``.

    Each server's simulated provider gets the same random stream as in :func:`simulate`, so with
    calls arriving in the same order the two runs draw the same latencies and failures.
    ``header_corrections`` lets the HTTP clients correct the scheduler's buckets from the servers'
    ``x-ratelimit-*`` headers, as in production; it is off by default because the simulated
    provider sends no such headers, and a like-for-like comparison needs the same scheduler input.
    """
    from aiqsim.http.httpx_provider import HttpProvider
    from aiqsim.http.server import start_local_server

    check_live_time_scale(time_scale, "time_scale")
    scenario = resolve_scenario(scenario, overrides)
    seed = scenario.seed if seed is None else int(seed)
    runtime = AsyncioRuntime(time_scale=time_scale)
    with contextlib.ExitStack() as stack:
        servers = {
            config.name: stack.enter_context(
                start_local_server(config, time_scale=time_scale, seed=f"{seed}:provider:{config.name}")
            )
            for config in scenario.providers
        }
        providers = [
            HttpProvider(
                name,
                server.url,
                time_scale=time_scale,
                timeout=_client_timeout(scenario, time_scale),
                lookup_path="/lookup/{key}" if scenario.provider(name).supports_lookup else None,
                send_task_headers=True,
                parse_result=simulator_result,
            )
            for name, server in servers.items()
        ]

        def executions() -> list[Any]:
            return [e for server in servers.values() for e in server.ledger().executions]

        def attach(scheduler: Any) -> None:
            if header_corrections:
                for provider in providers:
                    provider.attach_to(scheduler)

        async def close_clients() -> None:
            for provider in providers:  # before the run's event loop ends: their sockets live on it
                await provider.aclose()

        return run_scenario(
            scenario,
            seed,
            workdir=workdir,
            runtime=runtime,
            providers=providers,
            executions=executions,
            on_new_scheduler=attach,
            on_finish=close_clients,
        )


def _client_timeout(scenario: Scenario, time_scale: float) -> float:
    """The HTTP client's own timeout (wall s): above the scheduler's attempt timeout, so that fires first."""
    attempt = scenario.retry.attempt_timeout_s
    return 60.0 if attempt is None else max(1.0, 2 * attempt * time_scale)


COMPARED_KEYS = (
    "tasks_submitted",
    "tasks_succeeded",
    "tasks_failed",
    "tasks_deduped",
    "tasks_lost",
    "attempts",
    "retries",
    "rate_limited",
    "timeouts",
    "billed_calls",
    "duplicate_billed_calls",
    "cost_total",
    "success_latency_p50_s",
    "success_latency_p95_s",
    "success_latency_p99_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "goodput_per_s",
    "sim_time_s",
)

COMPARED_JOB_KEYS = (
    "jobs_submitted",
    "jobs_succeeded",
    "jobs_failed",
    "jobs_deduped",
    "jobs_lost",
    "job_latency_p50_s",
    "job_latency_p95_s",
    "cost_per_job",
)
"""Compared too when the scenario submits jobs."""


def compare_sim_and_live(
    scenario: Scenario | str | Path,
    seed: int | None = None,
    *,
    time_scale: float = DEFAULT_TIME_SCALE,
    overrides: Mapping[str, Any] | None = None,
    header_corrections: bool = False,
) -> pd.DataFrame:
    """Both summaries side by side (columns ``simulated``, ``live``, ``relative_difference``).

    Besides the summary keys, three rows come from :mod:`aiqsim.http.agreement`:
    ``call_latency_p50_s`` (the provider's own clock), ``server_lag_p50_s`` and
    ``transport_p50_s`` (the live run's measured timer lag per call and wire lag per attempt). The verdict, a
    :class:`~aiqsim.http.agreement.LatencyAgreement`, is in ``frame.attrs["latency_agreement"]``.
    """
    from aiqsim.http.agreement import call_latency_p50, latency_agreement, server_lag_p50, transport_p50

    scenario = resolve_scenario(scenario, overrides)
    sim_result = simulate(scenario, seed=seed)
    live_result = run_live(scenario, seed=seed, time_scale=time_scale, header_corrections=header_corrections)
    simulated, live = dict(sim_result.summary), dict(live_result.summary)
    for summary, result in ((simulated, sim_result), (live, live_result)):
        summary["call_latency_p50_s"] = call_latency_p50(result.executions)
        summary["server_lag_p50_s"] = server_lag_p50(result.executions)
        summary["transport_p50_s"] = transport_p50(result.events, result.executions)
    keys = [
        *COMPARED_KEYS,
        *(COMPARED_JOB_KEYS if "jobs_submitted" in simulated else ()),
        "call_latency_p50_s",
        "server_lag_p50_s",
        "transport_p50_s",
    ]
    frame = pd.DataFrame(
        {"simulated": [simulated[k] for k in keys], "live": [live[k] for k in keys]},
        index=keys,
    )
    base = frame["simulated"].astype(float).abs().replace(0.0, float("nan"))
    frame["relative_difference"] = (frame["live"].astype(float) - frame["simulated"].astype(float)) / base
    frame.attrs["latency_agreement"] = latency_agreement(sim_result, live_result)
    return frame
