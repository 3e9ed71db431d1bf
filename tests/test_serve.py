"""``aiqsim serve`` as a user runs it: a real child process on a free loopback port, driven by the real
``openai`` SDK and by aiqsim's own HttpProvider; stopped by SIGINT/SIGTERM; bad input refused with rc 2.

Each served provider of the test scenario has one behaviour that is a rule, not a random draw
(a per-minute request quota, a failure probability of 1), so every assertion follows from the
scenario file written here.
"""

from __future__ import annotations

import asyncio
import math
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from aiqsim import AsyncioRuntime, ConstantBackoff, RetryPolicy, Scheduler, TaskStatus
from aiqsim.cli import main as aiqsim_main
from aiqsim.core.failures import (
    InvalidRequestError,
    ProviderTimeoutError,
    QuotaExhaustedError,
    RateLimitError,
    ServerError,
)
from aiqsim.core.task import Priority
from aiqsim.http import HttpProvider, map_openai_error
from aiqsim.scheduler.provider import ProviderRequest
from tests.helpers_serve import ROOT, ServedProvider

SCENARIO = """
[scenario]
name = "serve_test"
seed = 3
duration_s = 10

[[providers]]
name = "llm"
latency_base_s = 0.02
latency_per_unit_s = 0.0
honours_idempotency = true
supports_lookup = true

[[providers]]
name = "limited"
latency_base_s = 0.02
latency_per_unit_s = 0.0
server_requests_per_min = 2

[[providers]]
name = "failing"
latency_base_s = 0.02
server_error_prob = 1.0

[[providers]]
name = "exhausted"
quota_exhausted_prob = 1.0

[[providers]]
name = "lost"
latency_base_s = 0.02
latency_per_unit_s = 0.0
timeout_prob = 1.0

[[providers]]
name = "streaming"
ttft_s = 0.04
tokens_per_s = 500
latency_base_s = 0.0
stream_cut_prob = 0.0

[[workloads]]
type = "poisson"
provider = "llm"
rate_per_s = 1
"""
TIME_SCALE = 0.5
"""Wall seconds per scenario second on the served providers (the limited one's window lasts 30 s)."""


@pytest.fixture(scope="module")
def scenario_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("serve") / "serve_test.toml"
    path.write_text(SCENARIO, encoding="utf-8")
    return path


def _serve(scenario_file: Path, provider: str) -> Iterator[ServedProvider]:
    with ServedProvider(
        str(scenario_file), "--provider", provider, "--time-scale", str(TIME_SCALE)
    ) as served:
        yield served
        returncode, _, stderr = served.stop()
        assert returncode == 0, stderr


@pytest.fixture(scope="module")
def llm(scenario_file: Path) -> Iterator[ServedProvider]:
    yield from _serve(scenario_file, "llm")


@pytest.fixture
def limited(scenario_file: Path) -> Iterator[ServedProvider]:
    """A fresh server per test: each test fills the request window itself."""
    yield from _serve(scenario_file, "limited")


def sdk(served: ServedProvider, **options: object) -> openai.OpenAI:
    """The real SDK pointed at the served provider; aiqsim (not the SDK) would do the retrying."""
    return openai.OpenAI(base_url=served.base_url, api_key="test-key", max_retries=0, **options)


def chat(client: openai.OpenAI, text: str, max_tokens: int = 5) -> object:
    return client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": text}], max_tokens=max_tokens
    )


def sdk_error(call: object) -> openai.OpenAIError:
    """The SDK exception a call raises (fails the test if it raises none)."""
    with pytest.raises(openai.OpenAIError) as raised:
        call()  # type: ignore[operator]
    return raised.value


# ---------------------------------------------------------------------------- the openai SDK as client
def test_banner_says_where_and_what(llm: ServedProvider) -> None:
    text = "\n".join(llm.lines)
    assert llm.root.startswith("http://127.0.0.1:")
    assert f"POST {llm.root}/v1/chat/completions" in text
    assert f"GET  {llm.root}/ledger" in text
    assert "Idempotency-Key: honoured" in text and "server quota: none" in text


def test_a_chat_completion_succeeds_with_the_openai_sdk(llm: ServedProvider) -> None:
    before = len(llm.ledger()["bills"])
    text = "Summarise: the export button does nothing."
    completion = chat(sdk(llm), text, max_tokens=7)
    assert completion.choices[0].message.content == f"echo: {text}"
    assert completion.usage.prompt_tokens == math.ceil(len(text) / 4)
    assert completion.usage.completion_tokens == 7
    ledger = llm.ledger()
    assert len(ledger["bills"]) == before + 1
    assert ledger["bills"][-1]["units"] == completion.usage.total_tokens
    assert ledger["requests"][-1]["status"] == 200 and ledger["in_flight"] == 0


def test_the_openai_sdk_streams_from_aiqsim_serve(scenario_file: Path) -> None:
    for served in _serve(scenario_file, "streaming"):
        stream = sdk(served).chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "stream me"}],
            max_tokens=30,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        assert "".join(texts) == "echo: stream me" and len(texts) > 1
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 30
        assert [model.id for model in sdk(served).models.list().data] == ["aiqsim-local"]
        ledger = served.ledger()
        assert len(ledger["bills"]) == 1 and ledger["in_flight"] == 0


def test_a_429_is_the_sdks_rate_limit_error_with_its_retry_after(limited: ServedProvider) -> None:
    client = sdk(limited)
    for n in range(2):  # the quota: 2 requests per window
        chat(client, f"fits in the window {n}")
    error = sdk_error(lambda: chat(client, "one too many"))
    assert isinstance(error, openai.RateLimitError)
    retry_after = int(error.response.headers["retry-after-ms"]) / 1000  # the exact wait (wall s)
    assert 0 < retry_after <= 60 * TIME_SCALE  # wall seconds, at most the scaled 60 s window
    # Retry-After itself is RFC 9110 delay-seconds: the whole number of seconds, rounded up
    assert error.response.headers["retry-after"] == str(math.ceil(retry_after))
    ledger = limited.ledger()
    assert ledger["requests"][-1]["status"] == 429
    assert ledger["requests"][-1]["retry_after_wall"] == pytest.approx(retry_after)
    assert len(ledger["bills"]) == 2  # a 429 is not billed

    mapped = map_openai_error(error, time_scale=TIME_SCALE)
    assert isinstance(mapped, RateLimitError)
    assert mapped.retry_after_s == pytest.approx(retry_after / TIME_SCALE)


def test_http_provider_sees_the_same_429(limited: ServedProvider) -> None:
    """aiqsim's HttpProvider reads the 429 the SDK saw: same error family, same Retry-After rule."""
    client = sdk(limited)
    for n in range(2):  # fill the window
        chat(client, f"fits in the window {n}")
    provider = HttpProvider("limited", limited.base_url, path="/chat/completions", time_scale=TIME_SCALE)

    async def one_call() -> None:
        request = ProviderRequest(
            task_id="t-1",
            idempotency_key="key-limited",
            kind="llm",
            payload="over the quota",
            cost_estimate=5.0,
            attempt=1,
            priority=Priority.BACKGROUND,
        )
        async with provider:
            await provider.call(request)

    with pytest.raises(RateLimitError) as raised:
        asyncio.run(one_call())
    answered = limited.ledger()["requests"][-1]
    assert answered["status"] == 429 and answered["key"] == "key-limited"
    assert raised.value.retry_after_s == pytest.approx(answered["retry_after_wall"] / TIME_SCALE)


def test_http_provider_drives_the_same_server(llm: ServedProvider) -> None:
    """The scheduler on asyncio with HttpProvider: every task succeeds, each key is billed once,
    and lookup (used by crash recovery) finds the work under the OpenAI-style base URL."""
    texts = [f"ticket {n}: {'x' * n}" for n in range(6)]

    async def drive() -> tuple[list[object], object]:
        provider = HttpProvider(
            "llm", llm.base_url, path="/chat/completions", lookup_path="/lookup/{key}", model="gpt-4o-mini"
        )
        async with (
            provider,
            Scheduler(
                AsyncioRuntime(),
                [provider],
                retry=RetryPolicy(backoff=ConstantBackoff(0.05), max_attempts=3, attempt_timeout_s=30),
                rng=random.Random(7),
            ) as scheduler,
        ):
            provider.attach_to(scheduler)
            submissions = [
                scheduler.submit("llm", {"messages": [{"role": "user", "content": t}]}) for t in texts
            ]
            records = [await submission.wait() for submission in submissions]
            found = await provider.lookup(records[0].key)
        return records, found

    records, found = asyncio.run(drive())
    assert [record.status for record in records] == [TaskStatus.SUCCEEDED] * len(texts)
    assert [record.result for record in records] == [f"echo: {text}" for text in texts]
    bills = [bill["key"] for bill in llm.ledger()["bills"]]
    assert all(bills.count(record.key) == 1 for record in records)
    assert found is not None and found.result == f"echo: {texts[0]}"


# ---------------------------------------------------------------------------- the mapper on real SDK errors
def test_the_mapper_on_the_sdks_client_errors(llm: ServedProvider) -> None:
    client = sdk(llm)
    not_a_list: object = "not a list"
    bad_body = sdk_error(lambda: client.chat.completions.create(model="m", messages=not_a_list))
    assert isinstance(bad_body, openai.BadRequestError)
    assert isinstance(map_openai_error(bad_body), InvalidRequestError)
    no_route = sdk_error(lambda: client.embeddings.create(model="m", input="no such route here"))
    assert isinstance(no_route, openai.NotFoundError)
    assert isinstance(map_openai_error(no_route), InvalidRequestError)


@pytest.mark.parametrize(
    ("provider", "sdk_class", "aiqsim_class"),
    [
        ("failing", openai.InternalServerError, ServerError),
        ("exhausted", openai.RateLimitError, QuotaExhaustedError),
        ("lost", openai.APITimeoutError, ProviderTimeoutError),
    ],
)
def test_the_mapper_on_the_sdks_server_errors(
    scenario_file: Path, provider: str, sdk_class: type[Exception], aiqsim_class: type[Exception]
) -> None:
    for served in _serve(scenario_file, provider):
        error = sdk_error(lambda: chat(sdk(served, timeout=1.0), "hello"))  # noqa: B023
        assert isinstance(error, sdk_class)
        mapped = map_openai_error(error)
        assert type(mapped) is aiqsim_class
        if provider == "failing":
            assert isinstance(mapped, ServerError) and mapped.status == 500
        if provider == "lost":  # done and billed, and the client heard nothing
            assert len(served.ledger()["bills"]) == 1


def test_the_mapper_on_a_refused_connection() -> None:
    with socket.socket() as probe:  # a port nobody listens on once the probe is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0, timeout=5.0)
    error = sdk_error(lambda: chat(client, "anyone there?"))
    assert type(error) is openai.APIConnectionError
    mapped = map_openai_error(error)
    assert isinstance(mapped, ServerError) and mapped.status == 0


# ---------------------------------------------------------------------------- stopping
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_it_cleanly_with_a_summary(scenario_file: Path, signum: signal.Signals) -> None:
    with ServedProvider(str(scenario_file), "--provider", "lost", "--time-scale", str(TIME_SCALE)) as served:
        # A lost response holds its connection open: stopping must not wait for the client.
        held = socket.create_connection(("127.0.0.1", int(served.root.rsplit(":", 1)[1])))
        body = b'{"messages":[{"role":"user","content":"hold me"}]}'
        held.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        deadline = time.monotonic() + 60
        while not served.ledger()["requests"]:  # billed, response lost, connection held
            assert time.monotonic() < deadline, "the held request was never answered"
            time.sleep(0.02)
        returncode, lines, stderr = served.stop(signum)
        held.close()
    assert returncode == 0, stderr
    assert stderr == ""
    assert lines[-1].startswith("aiqsim serve: stopped after ")
    assert (
        "1 request(s)" in lines[-1] and "1 response(s) lost" in lines[-1] and "1 billed call(s)" in lines[-1]
    )


# ---------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--provider", "nope"],
            "--provider 'nope': the scenario has no such provider (it has: llm, limited",
        ),
        ([], "the scenario has 6 providers"),
        (["--provider", "llm", "--time-scale", "0"], "--time-scale 0.0: expected a finite number > 0"),
        (["--provider", "llm", "--time-scale", "-1"], "--time-scale -1.0: expected a finite number > 0"),
        (["--provider", "llm", "--time-scale", "inf"], "--time-scale inf: expected a finite number > 0"),
        (["--provider", "llm", "--time-scale", "nan"], "--time-scale nan: expected a finite number > 0"),
        (["--provider", "llm", "--port", "70000"], "--port 70000: expected 0 (any free port) to 65535"),
        (["--provider", "llm", "--port", "-1"], "--port -1: expected 0 (any free port) to 65535"),
        (["--provider", "llm", "--seed", "-2"], "--seed -2: expected an integer >= 0"),
        (["--provider", "llm", "--set", "providers.llm.timeout_prob=2"], "timeout_prob"),
    ],
)
def test_bad_input_is_one_message_and_status_2(
    scenario_file: Path, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert aiqsim_main(["serve", str(scenario_file), *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("aiqsim serve: error: ") and message in captured.err
    assert len(captured.err.strip().splitlines()) == 1


def test_a_port_in_use_is_refused(scenario_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert aiqsim_main(["serve", str(scenario_file), "--provider", "llm", "--port", str(port)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == (
        f"aiqsim serve: error: cannot listen on 127.0.0.1:{port}: the port is already in use "
        "(pick another with --port, or 0 for any free port)"
    )


def test_bad_input_from_a_real_process_has_no_traceback(scenario_file: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "aiqsim", "serve", str(scenario_file), "--provider", "nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert (
        result.stderr.startswith("aiqsim serve: error: --provider 'nope'")
        and "Traceback" not in result.stderr
    )


def test_the_server_names_an_address_it_cannot_use() -> None:
    """start_local_server refuses a taken port with a project error (also the RuntimeError it always was)."""
    from aiqsim.core.errors import ConfigurationError
    from aiqsim.http import start_local_server
    from aiqsim.http.loopback import ServerStartError
    from aiqsim.sim.config import ProviderConfig

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(
            ServerStartError, match=f"cannot listen on 127.0.0.1:{port}: the port is already"
        ) as e:
            start_local_server(ProviderConfig("llm"), port=port)
    assert isinstance(e.value, ConfigurationError) and isinstance(e.value, RuntimeError)
    with pytest.raises(ConfigurationError, match="port must be an integer from 0"):
        start_local_server(ProviderConfig("llm"), port=65536)


def test_the_banner_states_every_behaviour_in_wall_time() -> None:
    from aiqsim.http.serve import describe_provider
    from aiqsim.sim.config import OutageConfig, ProviderConfig

    config = ProviderConfig(
        "busy",
        latency_base_s=2.0,
        latency_per_unit_s=0.01,
        server_requests_per_min=100,
        server_units_per_min=5000,
        rate_limit_prob=0.05,
        rate_limit_retry_after_s=4.0,
        server_error_prob=0.02,
        timeout_prob=0.01,
        quota_exhausted_prob=0.001,
        invalid_request_prob=0.003,
        outages=(OutageConfig(10.0, 20.0), OutageConfig(30.0, 40.0, mode="slow", slow_factor=3.0)),
    )
    lines = describe_provider(config, time_scale=0.5)  # every duration halves on the wall clock
    assert "latency: 1 s + 0.005 s per output token" in lines
    assert "server quota: 100 requests and 5000 tokens per sliding 30 s window" in lines[2]
    assert lines[3] == (
        "random failures: 429 5% (Retry-After 2 s), 429 insufficient_quota 0.1%, 400 0.3%, "
        "500 2% (midway, not billed), lost response 1% (done and billed, then no answer until the client "
        "gives up)"
    )
    assert "outage: 503 to every call from 5 s to 10 s after start" in lines
    assert "outage: 3x slower from 15 s to 20 s after start" in lines
    assert any(line.startswith("Idempotency-Key: ignored") for line in lines)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("localhost", True), ("0.0.0.0", False)],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    from aiqsim.http.serve import is_loopback

    assert is_loopback(host) is loopback


def test_localhost_is_served_on_one_address(scenario_file: Path) -> None:
    with ServedProvider(str(scenario_file), "--provider", "llm", "--host", "localhost") as served:
        assert served.root.startswith("http://127.0.0.1:")
        assert chat(sdk(served), "hi").choices[0].message.content == "echo: hi"
        returncode, _, stderr = served.stop()
    assert returncode == 0 and stderr == ""
