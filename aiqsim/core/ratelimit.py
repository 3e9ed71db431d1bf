"""What a provider said about its own rate limits on one answer (pure data, no I/O).

OpenAI-style APIs send ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` on every response;
:mod:`aiqsim.http.headers` parses them into a :class:`RateLimitSnapshot`, and a simulated provider
builds the same record from its own windows. The record lives here, below the scheduler, so a
response (:class:`~aiqsim.scheduler.provider.ProviderResponse`) or a provider error can carry it to the
scheduler's event stream and from there into the call log, whichever provider produced it.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiqsim.core.slot_init import fast_frozen_init


@fast_frozen_init  # one per simulated answer: see aiqsim.core.slot_init
@dataclass(frozen=True, slots=True)
class RateLimitSnapshot:
    """What one response's ``x-ratelimit-*`` headers said (``None`` where a header was absent)."""

    limit_requests: float | None = None
    remaining_requests: float | None = None
    reset_requests_s: float | None = None
    limit_tokens: float | None = None
    remaining_tokens: float | None = None
    reset_tokens_s: float | None = None

    @property
    def is_empty(self) -> bool:
        """True when the response carried none of the headers."""
        return all(
            value is None
            for value in (
                self.limit_requests,
                self.remaining_requests,
                self.reset_requests_s,
                self.limit_tokens,
                self.remaining_tokens,
                self.reset_tokens_s,
            )
        )
