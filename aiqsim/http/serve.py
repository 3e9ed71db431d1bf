"""``aiqsim serve``: one scenario provider as an OpenAI-compatible HTTP server, until a signal stops it.

The server is :class:`~aiqsim.http.server.LocalProviderServer` (the simulated provider's rules
behind the loopback HTTP/1.1 server); this module only chooses the provider, says what it will
do, waits for SIGINT/SIGTERM and sums up what happened. Point the ``openai`` SDK
(``base_url=".../v1"``), :class:`~aiqsim.http.HttpProvider` or any OpenAI-style client at it to
meet realistic 429s, lost responses and outages on your own machine.

The provider's random stream is seeded as in :func:`aiqsim.sim.simulate` and ``aiqsim compare``
(``"{seed}:provider:{name}"``), so a served provider meets the same per-request fates as the
simulated one for the same seed and idempotency keys.
"""

from __future__ import annotations

import ipaddress
import math
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TextIO

from aiqsim.core.errors import ConfigurationError
from aiqsim.http.server import Ledger, LocalProviderServer, start_local_server
from aiqsim.sim.config import ProviderConfig
from aiqsim.sim.scenario import Scenario

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)
"""Signals that stop a served provider cleanly (Ctrl-C, and what service managers send)."""


@dataclass(frozen=True, slots=True)
class ServeSettings:
    """What ``aiqsim serve`` was asked for, checked (see :func:`check_serve_settings`)."""

    provider: ProviderConfig
    seed: int
    time_scale: float
    port: int
    host: str


def check_serve_settings(
    scenario: Scenario,
    *,
    provider: str | None,
    seed: int | None,
    time_scale: float,
    port: int,
    host: str,
) -> ServeSettings:
    """Refuse what cannot be served, before anything listens; raises :class:`ConfigurationError`.

    ``provider`` may be omitted only when the scenario has exactly one. ``time_scale`` (wall
    seconds per scenario second) must be finite and > 0; ``port`` 0 (any free port) to 65535;
    ``seed`` >= 0 (``None``: the scenario's). ``localhost`` is served as ``127.0.0.1``.
    """
    names = [config.name for config in scenario.providers]
    if provider is None:
        if len(names) != 1:
            raise ConfigurationError(
                f"the scenario has {len(names)} providers ({', '.join(names)}); "
                "choose one with --provider NAME"
            )
        chosen = scenario.providers[0]
    else:
        try:
            chosen = scenario.provider(provider)
        except KeyError:
            raise ConfigurationError(
                f"--provider {provider!r}: the scenario has no such provider (it has: {', '.join(names)})"
            ) from None
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise ConfigurationError(
            f"--time-scale {time_scale!r}: expected a finite number > 0 (wall seconds per scenario second)"
        )
    if isinstance(port, bool) or not 0 <= port <= 65535:
        raise ConfigurationError(f"--port {port}: expected 0 (any free port) to 65535")
    if seed is not None and seed < 0:
        raise ConfigurationError(f"--seed {seed}: expected an integer >= 0")
    if not host:
        raise ConfigurationError("--host: expected an address, e.g. 127.0.0.1")
    if host.lower() == "localhost":
        # one address: "localhost" may resolve to 127.0.0.1 and ::1, and with --port 0 each would get
        # a port of its own, while the printed URL can name only one
        host = "127.0.0.1"
    return ServeSettings(chosen, scenario.seed if seed is None else seed, float(time_scale), port, host)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _pct(probability: float) -> str:
    return f"{probability * 100:.3g}%"


def _secs(scenario_s: float, time_scale: float) -> str:
    return f"{scenario_s * time_scale:.3g} s"


def describe_provider(config: ProviderConfig, time_scale: float) -> list[str]:
    """What the served provider will do, one fact a line, in wall time (scenario time x ``time_scale``)."""
    unit = "token" if config.kind == "llm" else "character"
    lines = []
    if config.kind == "llm":
        lines.append("usage: prompt tokens = message characters / 4 (rounded up), output tokens = max_tokens")
    else:
        lines.append("usage: every message character is an output character (tts)")
    if config.latency_dist == "exponential":
        noise = ", times an exponential factor of mean 1"
    else:
        noise = f", lognormal noise sigma {config.latency_sigma:g}" if config.latency_sigma else ""
    if config.streams and config.ttft_s is not None and config.tokens_per_s is not None:
        cut = f"; {_pct(config.stream_cut_prob)} of streams cut (billed)" if config.stream_cut_prob else ""
        lines.append(
            f"streams: first token after {_secs(config.ttft_s, time_scale)}, then "
            f"{config.tokens_per_s / time_scale:g} {unit}s per wall s{cut}"
        )
    else:
        lines.append(
            f"latency: {_secs(config.latency_base_s, time_scale)} + "
            f"{_secs(config.latency_per_unit_s, time_scale)} per output {unit}{noise}"
        )
    window = f"{60 * time_scale:g} s" if time_scale != 1 else "60 s"
    limits = []
    if config.server_requests_per_min is not None:
        limits.append(f"{config.server_requests_per_min:g} requests")
    if config.server_units_per_min is not None:
        limits.append(f"{config.server_units_per_min:g} {unit}s")
    if limits:
        lines.append(
            f"server quota: {' and '.join(limits)} per sliding {window} window; over it: 429 with "
            "Retry-After (nothing billed)"
        )
    else:
        lines.append("server quota: none")
    failures = []
    if config.rate_limit_prob:
        after = config.rate_limit_retry_after_s
        header = f"Retry-After {_secs(after, time_scale)}" if after is not None else "no Retry-After"
        failures.append(f"429 {_pct(config.rate_limit_prob)} ({header})")
    if config.quota_exhausted_prob:
        failures.append(f"429 insufficient_quota {_pct(config.quota_exhausted_prob)}")
    if config.invalid_request_prob:
        failures.append(f"400 {_pct(config.invalid_request_prob)}")
    if config.server_error_prob:
        failures.append(f"500 {_pct(config.server_error_prob)} (midway, not billed)")
    if config.timeout_prob:
        failures.append(
            f"lost response {_pct(config.timeout_prob)} (done and billed, then no answer until the client "
            "gives up)"
        )
    lines.append("random failures: " + (", ".join(failures) if failures else "none"))
    for outage in config.outages:
        what = "503 to every call" if outage.mode == "error" else f"{outage.slow_factor:g}x slower"
        lines.append(
            f"outage: {what} from {_secs(outage.start_s, time_scale)} to {_secs(outage.end_s, time_scale)} "
            "after start"
        )
    if config.honours_idempotency:
        lines.append(
            "Idempotency-Key: honoured (a repeated key is answered from the first result, not billed)"
        )
    else:
        lines.append("Idempotency-Key: ignored, as OpenAI does (every repeat is executed and billed again)")
    lines.append(f"price: {config.price_per_1k_units:g} per 1k {unit}s")
    return lines


def banner(server: LocalProviderServer, scenario: Scenario, settings: ServeSettings) -> list[str]:
    """The lines ``aiqsim serve`` prints once it listens: where, what, and how to stop it."""
    config, base = settings.provider, server.url
    lookup = (
        f"GET  {base}/lookup/{{key}}  work already done for an Idempotency-Key (crash recovery)"
        if config.supports_lookup
        else f"GET  {base}/lookup/{{key}}  always 404: this provider has no lookup (like OpenAI)"
    )
    return [
        f"aiqsim serve: provider {config.name!r} ({config.kind}) of scenario {scenario.name!r}, "
        f"seed {settings.seed}, time scale {settings.time_scale:g} (wall s per scenario s)",
        f"base URL: {base}/v1",
        f"  POST {base}/v1/chat/completions  OpenAI chat completions (stream=true: server-sent events)",
        f"  GET  {base}/v1/models  the model it answers as",
        f"  GET  {base}/ledger  every request, execution and bill so far (JSON)",
        f"  GET  {base}/metrics  requests, 429s and bills for Prometheus (text format)",
        f"  {lookup}",
        *(f"  {line}" for line in describe_provider(config, settings.time_scale)),
        "Ctrl-C (SIGINT) or SIGTERM stops it.",
    ]


def summary_line(ledger: Ledger, elapsed_s: float) -> str:
    """One line on what the server did: requests by outcome, bills, duplicate bills and cost."""
    outcomes = ledger.outcomes()
    by_outcome = ", ".join(f"{count} {name}" for name, count in sorted(outcomes.items()))
    lost = sum(1 for entry in ledger.requests if entry.response_lost)
    return (
        f"aiqsim serve: stopped after {elapsed_s:.1f} s: {len(ledger.requests)} request(s)"
        + (f" ({by_outcome})" if by_outcome else "")
        + f", {lost} response(s) lost, {len(ledger.bills)} billed call(s), "
        f"{ledger.duplicate_bills} duplicate bill(s), cost {ledger.total_cost:.6g}"
    )


class _StopFlag:
    """Set by the stop signals; restores the previous handlers on :meth:`restore`."""

    def __init__(self, signals: Iterable[signal.Signals]) -> None:
        self.event = threading.Event()
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, Callable[..., object] | int | None] = {}
        for signum in signals:
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.received = signal.Signals(signum)
        self.event.set()

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def serve(scenario: Scenario, settings: ServeSettings, *, out: TextIO, err: TextIO) -> int:
    """Serve ``settings.provider`` until SIGINT or SIGTERM; print the banner and a summary; return 0.

    Must run in the main thread (signal handlers). An address that cannot be listened on raises
    :class:`~aiqsim.http.loopback.ServerStartError` before anything is printed.
    """
    server = start_local_server(
        settings.provider,
        time_scale=settings.time_scale,
        seed=f"{settings.seed}:provider:{settings.provider.name}",
        port=settings.port,
        host=settings.host,
    )
    started = time.monotonic()
    try:
        stop = _StopFlag(STOP_SIGNALS)
        try:
            if not is_loopback(settings.host):
                print(
                    f"aiqsim serve: warning: listening on {settings.host}, not loopback: anyone who can "
                    "reach this machine can call it (it has no authentication)",
                    file=err,
                    flush=True,
                )
            print("\n".join(banner(server, scenario, settings)), file=out, flush=True)
            while not stop.event.wait(0.5):
                pass
        finally:
            stop.restore()
    finally:
        server.stop()
    print(summary_line(server.ledger(), time.monotonic() - started), file=out, flush=True)
    return 0
