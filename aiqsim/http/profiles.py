"""Provider profiles: how each AI vendor states its rate limits, waits, spent credit and overload (data).

One frozen :class:`ProviderProfile` per vendor, in one table (:data:`PROFILES`). A profile holds no
code: the pure classifier (:func:`aiqsim.http.status.error_for_status`) and the header reader
(:func:`aiqsim.http.vendor_headers.profile_snapshot`) read it. Adding a vendor is a row here and a
row of test vectors (``tests/data/provider_vectors.json``).

========================  ====================================================================
field                     meaning
========================  ====================================================================
``ratelimit_dialect``     which rate-limit headers it sends: ``"openai"`` (``x-ratelimit-*``,
                          Go durations ``"6m0s"``), ``"anthropic"`` (``anthropic-ratelimit-*``,
                          RFC 3339 reset instants), ``"none"``, or ``"auto"`` (either, by name)
``retry_after_statuses``  statuses whose ``retry-after-ms`` / ``Retry-After`` are honoured
``body_retry_delay``      reads ``google.rpc.RetryInfo.retryDelay`` (``"19s"``) from the body
``quota_statuses``        statuses that always mean spent credit (402): ``QuotaExhaustedError``
``quota_codes``           ``error.code`` / ``error.type`` / ``error.details.error_code`` values that
                          mean spent credit or a spend cap (fatal: it lifts in weeks, not seconds)
``quota_phrases``         message fragments with that meaning, for answers that say it in prose
``overload_statuses``     non-5xx statuses that are retryable overload (Groq's 498)
``google_quota``          reads ``google.rpc.QuotaFailure``: a per-day quota is fatal, a per-minute
                          one a ``RateLimitError`` waiting the body's ``retryDelay``
``errors_in_200``         an ``error`` object in a 200 body is a failure, classified by its code
                          (OpenRouter reports upstream failures so)
``error_type_header``     the header naming the error's type (AWS: ``x-amzn-ErrorType:
                          ThrottlingException:http://...``)
``rate_limited_types``    error types (lower-case) that are a ``RateLimitError`` whatever the
                          status: Bedrock's ``ServiceQuotaExceededException`` is a 400 that says
                          "You can resubmit your request later"
========================  ====================================================================

A spent *daily* Gemini quota (a ``QuotaFailure`` violation naming a per-day metric) is a
:class:`~aiqsim.core.failures.QuotaExhaustedError`: it lifts at midnight Pacific time, hours away,
while the body still offers a ``retryDelay`` of seconds; retrying on it would hold the lane and
spend attempts all day. A per-minute one is a :class:`~aiqsim.core.failures.RateLimitError` with
that ``retryDelay``.

``HttpProvider(profile="auto")`` (the default) uses :data:`AUTO`: every vendor's rules at once
(their codes and statuses do not collide) and either header dialect, chosen by the header names
a response carries (``anthropic-ratelimit-*`` -> Anthropic's, ``x-ratelimit-*`` -> OpenAI's), and
Google's body rules for a body that is Google-shaped (``error.status`` ``RESOURCE_EXHAUSTED`` or
``google.rpc`` details). A named profile reads only its vendor's dialect.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiqsim.core.errors import ConfigurationError

RATELIMIT_DIALECTS = frozenset({"openai", "anthropic", "none", "auto"})

OPENAI_QUOTA_CODES = frozenset(
    {
        "insufficient_quota",
        "billing_hard_limit_reached",
        "billing_not_active",
        "credit_balance_exhausted",
        "organization_spend_limit_exceeded",
        "project_spend_limit_exceeded",
        "organization_usage_limit_exceeded",
        "project_usage_limit_exceeded",
        "quota_exceeded",
    }
)
"""OpenAI's (and Azure's) codes for an account whose credit, budget or usage limit is spent."""

ANTHROPIC_QUOTA_CODES = frozenset({"enforced_spend_limit_reached", "billing_error"})
"""Anthropic: the tier's monthly spend cap (a 429 whose ``error.details.error_code`` says so) and
a billing problem (402 ``billing_error``)."""

OPENROUTER_QUOTA_CODES = frozenset({"insufficient_credits", "credit_limit_reached"})

GENERIC_QUOTA_PHRASES = (
    "credit balance is too low",  # Anthropic 400 "Your credit balance is too low to access the Anthropic API"
    "insufficient credit",
    "insufficient balance",  # DeepSeek 402
    "insufficient_quota",
    "reached your specified api usage limits",  # Anthropic 400 (own spend limit)
    "reached your specified workspace api usage limits",
)
OPENAI_QUOTA_PHRASES = ("exceeded your current quota",)
"""OpenAI's prose for ``insufficient_quota``. Google uses the same words for a per-minute quota,
so a Google-shaped body is read by its ``QuotaFailure`` instead (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class ProviderProfile:
    """What one vendor's answers mean (see the module docstring for each field)."""

    name: str
    title: str
    ratelimit_dialect: str = "openai"
    retry_after_statuses: frozenset[int] = frozenset({429, 503})
    body_retry_delay: bool = False
    quota_statuses: frozenset[int] = frozenset()
    quota_codes: frozenset[str] = frozenset()
    quota_phrases: tuple[str, ...] = GENERIC_QUOTA_PHRASES
    overload_statuses: frozenset[int] = frozenset()
    google_quota: bool = False
    errors_in_200: bool = False
    error_type_header: str | None = None
    rate_limited_types: frozenset[str] = frozenset()
    sources: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.ratelimit_dialect not in RATELIMIT_DIALECTS:
            raise ConfigurationError(
                f"profile {self.name!r}: ratelimit_dialect {self.ratelimit_dialect!r} is not one of "
                f"{sorted(RATELIMIT_DIALECTS)}"
            )


_GOOGLE = {
    "ratelimit_dialect": "none",
    "body_retry_delay": True,
    "google_quota": True,
    "quota_phrases": GENERIC_QUOTA_PHRASES,
}

OPENAI = ProviderProfile(
    "openai",
    "OpenAI",
    quota_codes=OPENAI_QUOTA_CODES,
    quota_phrases=GENERIC_QUOTA_PHRASES + OPENAI_QUOTA_PHRASES,
    sources=(
        "https://platform.openai.com/docs/guides/rate-limits",
        "https://platform.openai.com/docs/guides/error-codes",
    ),
)
AZURE_OPENAI = ProviderProfile(
    "azure",
    "Azure OpenAI",
    quota_codes=OPENAI_QUOTA_CODES,
    quota_phrases=GENERIC_QUOTA_PHRASES + OPENAI_QUOTA_PHRASES,
    sources=("https://learn.microsoft.com/en-us/azure/ai-services/openai/quotas-limits",),
)
ANTHROPIC = ProviderProfile(
    "anthropic",
    "Anthropic",
    ratelimit_dialect="anthropic",
    retry_after_statuses=frozenset({429, 503, 529}),
    quota_statuses=frozenset({402}),
    quota_codes=ANTHROPIC_QUOTA_CODES,
    sources=(
        "https://platform.claude.com/docs/en/api/rate-limits",
        "https://platform.claude.com/docs/en/api/errors",
    ),
)
GEMINI = ProviderProfile(
    "gemini",
    "Gemini API (Google AI Studio)",
    sources=(
        "https://ai.google.dev/gemini-api/docs/rate-limits",
        "https://ai.google.dev/gemini-api/docs/troubleshooting",
    ),
    **_GOOGLE,  # type: ignore[arg-type]
)
VERTEX = ProviderProfile(
    "vertex",
    "Vertex AI",
    sources=(
        "https://cloud.google.com/vertex-ai/generative-ai/docs/model-reference/api-errors",
        "https://cloud.google.com/vertex-ai/generative-ai/docs/provisioned-throughput/error-code-429",
    ),
    **_GOOGLE,  # type: ignore[arg-type]
)
BEDROCK_RATE_LIMITED_TYPES = frozenset(
    {"throttlingexception", "servicequotaexceededexception", "modelnotreadyexception"}
)
BEDROCK = ProviderProfile(
    "bedrock",
    "AWS Bedrock",
    ratelimit_dialect="none",
    error_type_header="x-amzn-errortype",
    rate_limited_types=BEDROCK_RATE_LIMITED_TYPES,
    sources=(
        "https://docs.aws.amazon.com/bedrock/latest/userguide/troubleshooting-api-error-codes.html",
        "https://docs.aws.amazon.com/botocore/latest/reference/services/bedrock-runtime/client/exceptions/ServiceQuotaExceededException.html",
    ),
)
MISTRAL = ProviderProfile(
    "mistral",
    "Mistral",
    sources=("https://docs.mistral.ai/deployment/laplateforme/tier/",),
)
GROQ = ProviderProfile(
    "groq",
    "Groq",
    retry_after_statuses=frozenset({429, 498, 503}),
    overload_statuses=frozenset({498}),
    sources=("https://console.groq.com/docs/rate-limits", "https://console.groq.com/docs/flex-processing"),
)
DEEPSEEK = ProviderProfile(
    "deepseek",
    "DeepSeek",
    quota_statuses=frozenset({402}),
    sources=("https://api-docs.deepseek.com/quick_start/error_codes",),
)
OPENROUTER = ProviderProfile(
    "openrouter",
    "OpenRouter",
    quota_statuses=frozenset({402}),
    quota_codes=OPENROUTER_QUOTA_CODES,
    errors_in_200=True,
    sources=("https://openrouter.ai/docs/api-reference/errors",),
)

_VENDORS = (OPENAI, AZURE_OPENAI, ANTHROPIC, GEMINI, VERTEX, BEDROCK, MISTRAL, GROQ, DEEPSEEK, OPENROUTER)

AUTO = ProviderProfile(
    "auto",
    "any (detected per response)",
    ratelimit_dialect="auto",
    retry_after_statuses=frozenset().union(*(p.retry_after_statuses for p in _VENDORS)),
    body_retry_delay=True,
    quota_statuses=frozenset({402}),
    quota_codes=frozenset().union(*(p.quota_codes for p in _VENDORS)),
    quota_phrases=GENERIC_QUOTA_PHRASES + OPENAI_QUOTA_PHRASES,
    overload_statuses=frozenset().union(*(p.overload_statuses for p in _VENDORS)),
    google_quota=True,
    errors_in_200=True,
    error_type_header="x-amzn-errortype",
    rate_limited_types=BEDROCK_RATE_LIMITED_TYPES,
    sources=tuple(source for p in _VENDORS for source in p.sources),
)
"""Every vendor's rules at once; the default of :class:`~aiqsim.http.HttpProvider`."""

PROFILES: dict[str, ProviderProfile] = {profile.name: profile for profile in (AUTO, *_VENDORS)}
"""Each profile by name."""


def get_profile(profile: str | ProviderProfile | None) -> ProviderProfile:
    """The profile named ``profile`` (a :class:`ProviderProfile` is returned as it is; ``None`` is
    ``"auto"``); a ConfigurationError listing the valid names otherwise."""
    if profile is None:
        return AUTO
    if isinstance(profile, ProviderProfile):
        return profile
    if isinstance(profile, str) and profile.strip().lower() in PROFILES:
        return PROFILES[profile.strip().lower()]
    raise ConfigurationError(
        f"unknown provider profile {profile!r}: expected one of {', '.join(sorted(PROFILES))} "
        "(or a ProviderProfile)"
    )
