"""Python API misuse is refused at the call, by a project error that names the argument.

Each case is one a user met: the wrong value used to be accepted and fail later —
after the provider was called and billed, inside a comparison, or naming a hidden temp file.
Every test checks the error's family, that the message names the argument and what is
accepted, and that nothing happened before it (no provider call, no task stored, no file).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

from aiqsim.core.errors import AiqsimError, ConfigurationError, StoreError
from aiqsim.core.numeric import LARGEST_WHOLE
from aiqsim.core.task import Priority
from aiqsim.core.token_bucket import QuotaConfigError, QuotaLimits
from aiqsim.runtime.simpy_runtime import SimPyRuntime
from aiqsim.scheduler.arguments import SchedulerArgumentError, SchedulerArgumentTypeError, UnknownNameError
from aiqsim.scheduler.dispatch import AgingShortestJobFirstPolicy, dispatch_policy_from_name
from aiqsim.scheduler.job_spec import JobSpec, Stage
from aiqsim.scheduler.retry import RetryPolicy
from aiqsim.scheduler.scheduler import Scheduler
from aiqsim.sim.scenario import ScenarioError, load_scenario
from aiqsim.sim.simulate import retry_policy, simulate
from aiqsim.sim.sweep import sweep
from aiqsim.stores import JsonFileStore, MemoryStore, SqliteStore, StoreOpenError, open_store
from tests.fakes import ScriptedProvider

SCENARIO = str(Path(__file__).resolve().parent.parent / "scenarios" / "double_click_storm.toml")


def _scheduler(**kwargs: Any) -> tuple[SimPyRuntime, ScriptedProvider, Scheduler, MemoryStore]:
    runtime = SimPyRuntime()
    provider = ScriptedProvider(runtime)
    store = MemoryStore()
    return runtime, provider, Scheduler(runtime, [provider], store=store, **kwargs), store


@pytest.mark.parametrize("cost", [-10, -0.5, math.nan, math.inf, -math.inf, "300", True, 10**400])
def test_a_cost_estimate_that_is_not_a_finite_count_is_refused_before_any_call(cost: Any) -> None:
    runtime, provider, scheduler, store = _scheduler()  # no token quota: nothing else would catch it

    async def main() -> None:
        with pytest.raises(ConfigurationError, match="cost_estimate") as caught:
            scheduler.submit("llm", {"input": "a"}, cost_estimate=cost)
        assert "finite number >= 0" in str(caught.value)
        await scheduler.join()

    runtime.run(main())
    assert provider.calls == [] and store.list_by_status() == []


def test_a_valid_cost_estimate_still_runs() -> None:
    runtime, provider, scheduler, _ = _scheduler()

    async def main() -> Any:
        return await scheduler.submit("llm", {"input": "a"}, cost_estimate=0).wait()

    assert runtime.run(main()).status == "succeeded"
    assert len(provider.calls) == 1


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("interactive", Priority.INTERACTIVE),
        ("Background", Priority.BACKGROUND),
        (" INTERACTIVE ", Priority.INTERACTIVE),
        (0, Priority.INTERACTIVE),
        (Priority.BACKGROUND, Priority.BACKGROUND),
    ],
)
def test_submit_accepts_the_documented_priority_names_in_any_case(given: Any, expected: Priority) -> None:
    runtime, _, scheduler, _ = _scheduler()

    async def main() -> Any:
        return await scheduler.submit("llm", {"input": "a"}, priority=given).wait()

    assert runtime.run(main()).priority is expected


@pytest.mark.parametrize("given", ["urgent", "", 7, None, 1.5])
def test_an_unknown_priority_names_the_accepted_ones(given: Any) -> None:
    _, provider, scheduler, store = _scheduler()
    with pytest.raises(ConfigurationError) as caught:
        scheduler.submit("llm", {"input": "a"}, priority=given)
    message = str(caught.value)
    assert message.startswith("priority:")
    assert "'interactive'" in message and "'background'" in message and repr(given) in message
    assert provider.calls == [] and store.list_by_status() == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("concurrency", "4"),
        ("concurrency", 0),
        ("concurrency", 2.5),
        ("concurrency", True),
        ("requests_per_min", "500"),
        ("requests_per_min", 0),
        ("requests_per_min", math.nan),
        ("tokens_per_min", -5),
        ("tokens_per_min", math.inf),
        ("request_burst", 0),
        ("token_burst", "10"),
    ],
)
def test_quota_limits_refuse_wrong_types_and_values_when_built(field: str, value: Any) -> None:
    with pytest.raises(QuotaConfigError) as caught:
        QuotaLimits(**{field: value})
    assert isinstance(caught.value, ConfigurationError) and isinstance(caught.value, ValueError)
    assert f"QuotaLimits({field}=...)" in str(caught.value) and repr(value) in str(caught.value)


def test_quota_limits_accept_what_the_docs_show() -> None:
    import numpy as np

    limits = QuotaLimits(
        requests_per_min=500, request_burst=10, tokens_per_min=200_000.0, concurrency=np.int64(16)
    )
    assert limits.concurrency == 16


def test_a_scheduler_without_providers_is_refused() -> None:
    for providers in ([], {}, ()):
        with pytest.raises(ConfigurationError, match="providers: expected at least one provider"):
            Scheduler(SimPyRuntime(), providers)


def test_providers_that_are_not_providers_or_share_a_name_are_refused() -> None:
    runtime = SimPyRuntime()
    with pytest.raises(ConfigurationError, match="providers: expected a list"):
        Scheduler(runtime, None)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"non-empty string \.name"):
        Scheduler(runtime, [object()])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match="two providers are named 'llm'"):
        Scheduler(runtime, [ScriptedProvider(runtime), ScriptedProvider(runtime)])


@pytest.mark.parametrize("store_class", [SqliteStore, JsonFileStore])
def test_a_store_in_a_missing_folder_names_the_users_path(tmp_path: Path, store_class: type) -> None:
    path = tmp_path / "nonexistent" / "dir" / "x.sqlite3"
    with pytest.raises(StoreOpenError) as caught:
        store_class(path)
    assert isinstance(caught.value, StoreError) and isinstance(caught.value, AiqsimError)
    assert isinstance(caught.value, OSError)  # callers catching OSError keep working
    message = str(caught.value)
    assert message.startswith(f"{path}:") and "does not exist" in message
    assert ".tmp-" not in message and ".lock" not in message
    assert list(tmp_path.iterdir()) == []  # nothing created


@pytest.mark.parametrize("scenario", [None, 3, "", b"scenarios/retry_storm_429.toml"])
def test_simulate_and_sweep_say_what_a_scenario_is(scenario: Any) -> None:
    with pytest.raises(ConfigurationError, match="scenario: expected a Scenario or the path"):
        simulate(scenario)
    with pytest.raises(ConfigurationError, match="scenario: expected a Scenario or the path"):
        sweep(scenario, {}, progress=False)


@pytest.mark.parametrize("argument", ["interactive_limit", "background_limit"])
@pytest.mark.parametrize("value", [-1, 2.5, "10", True])
def test_a_queue_limit_that_is_no_count_of_waiting_requests_is_refused(argument: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=f"{argument}: expected None") as caught:
        _scheduler(**{argument: value})
    assert "whole number >= 0" in str(caught.value) and repr(value) in str(caught.value)


def test_a_queue_limit_of_one_admits_a_task_on_an_idle_scheduler() -> None:
    runtime, provider, scheduler, _ = _scheduler(interactive_limit=1, background_limit=1)

    async def main() -> Any:
        return await scheduler.submit("llm", {"input": "a"}, cost_estimate=1).wait()

    assert runtime.run(main()).status == "succeeded"
    assert len(provider.calls) == 1


def _refused(caught: pytest.ExceptionInfo[BaseException], builtin: type[BaseException], argument: str) -> str:
    """The error is a project error, still the builtin class it used to be, and names the argument."""
    assert isinstance(caught.value, AiqsimError) and isinstance(caught.value, ConfigurationError)
    assert isinstance(caught.value, builtin)  # callers catching the old builtin class keep working
    message = str(caught.value)
    assert message.startswith(f"{argument}:") or message.startswith(f"{argument} "), message
    return message


@pytest.mark.parametrize("value", [0, -1.5, math.nan])
def test_a_duplicate_poll_that_is_not_a_positive_duration_is_refused(value: Any) -> None:
    runtime, store = SimPyRuntime(), MemoryStore()
    provider = ScriptedProvider(runtime)
    with pytest.raises(SchedulerArgumentError) as caught:
        Scheduler(runtime, [provider], store=store, duplicate_poll_s=value)
    message = _refused(caught, ValueError, "duplicate_poll_s")
    assert "seconds > 0" in message and repr(value) in message
    assert provider.calls == [] and store.list_by_status() == []


def test_a_duplicate_poll_that_is_no_number_is_refused_as_a_type_error() -> None:
    runtime = SimPyRuntime()
    with pytest.raises(SchedulerArgumentTypeError) as caught:
        Scheduler(runtime, [ScriptedProvider(runtime)], duplicate_poll_s="0.5")  # type: ignore[arg-type]
    assert "'0.5'" in _refused(caught, TypeError, "duplicate_poll_s")


def test_quotas_for_a_provider_the_scheduler_lacks_are_refused() -> None:
    runtime, store = SimPyRuntime(), MemoryStore()
    provider = ScriptedProvider(runtime)
    with pytest.raises(SchedulerArgumentError) as caught:
        Scheduler(runtime, [provider], store=store, quotas={"tts": QuotaLimits(concurrency=1)})
    message = _refused(caught, ValueError, "quotas")
    assert "['tts']" in message and "['llm']" in message and "no scheduler was created" in message
    assert provider.calls == [] and store.list_by_status() == []


def test_quotas_that_are_no_mapping_are_refused() -> None:
    runtime = SimPyRuntime()
    with pytest.raises(SchedulerArgumentTypeError) as caught:
        Scheduler(runtime, [ScriptedProvider(runtime)], quotas=[QuotaLimits()])  # type: ignore[arg-type]
    assert "mapping provider name -> QuotaLimits" in _refused(caught, TypeError, "quotas")


@pytest.mark.parametrize("worker_id", ["", 7])
def test_a_worker_id_that_is_no_name_is_refused(worker_id: Any) -> None:
    runtime = SimPyRuntime()
    with pytest.raises(SchedulerArgumentError) as caught:
        Scheduler(runtime, [ScriptedProvider(runtime)], worker_id=worker_id)
    message = _refused(caught, ValueError, "worker_id")
    assert "non-empty string or None" in message and "no scheduler was created" in message


@pytest.mark.parametrize(("options", "argument"), [({"provider": "tts"}, "provider"), ({}, "kind")])
def test_submit_to_a_provider_the_scheduler_lacks_is_refused(options: dict[str, Any], argument: str) -> None:
    runtime, provider, scheduler, store = _scheduler()
    with pytest.raises(SchedulerArgumentError) as caught:
        scheduler.submit("tts", {"input": "a"}, **options)
    message = _refused(caught, ValueError, argument)
    assert "no provider named 'tts'" in message and "['llm']" in message and "nothing was queued" in message
    runtime.run(scheduler.join())
    assert provider.calls == [] and store.list_by_status() == [] and scheduler.queued() == 0


def test_the_quota_of_a_provider_the_scheduler_lacks_is_refused() -> None:
    _, provider, scheduler, store = _scheduler()
    with pytest.raises(UnknownNameError) as caught:
        scheduler.quota("tts")
    message = _refused(caught, KeyError, "provider")
    assert "no provider named 'tts'" in message and "['llm']" in message
    assert provider.calls == [] and store.list_by_status() == []


def test_retry_failed_of_an_unknown_task_id_is_refused() -> None:
    runtime, provider, scheduler, store = _scheduler()
    with pytest.raises(UnknownNameError) as caught:
        scheduler.retry_failed("nope")
    message = _refused(caught, KeyError, "task_id")
    assert "'nope'" in message and "nothing was retried" in message
    runtime.run(scheduler.join())
    assert provider.calls == [] and store.list_by_status() == []


def test_retry_failed_of_another_providers_task_is_refused_and_the_task_stays_failed() -> None:
    # it used to move the task to queued in the store, then fail with KeyError('tts'): stranded
    runtime, store = SimPyRuntime(), MemoryStore()
    tts = ScriptedProvider(runtime, name="tts", script={"a": ["invalid"]})
    tts_scheduler = Scheduler(runtime, [tts], store=store)

    async def fail_one() -> None:
        await tts_scheduler.submit("tts", {"input": "a"}, task_id="t1").wait()
        await tts_scheduler.close()

    runtime.run(fail_one())
    before = store.list_by_status()
    runtime = SimPyRuntime()
    llm = ScriptedProvider(runtime)
    llm_scheduler = Scheduler(runtime, [llm], store=store)
    with pytest.raises(UnknownNameError) as caught:
        llm_scheduler.retry_failed("t1")
    message = _refused(caught, KeyError, "task_id")
    assert "provider 'tts'" in message and "['llm']" in message and "left failed" in message
    runtime.run(llm_scheduler.join())  # nothing live: returns at once
    assert llm.calls == [] and store.list_by_status() == before and llm_scheduler.in_flight == 0


def _store_left_by_a_crashed_tts_scheduler() -> MemoryStore:
    """One tts task running and one queued, as a killed process leaves them."""
    runtime, store = SimPyRuntime(), MemoryStore()
    tts = ScriptedProvider(runtime, name="tts", script={"a": ["hang"]})
    scheduler = Scheduler(runtime, [tts], store=store, quotas={"tts": QuotaLimits(concurrency=1)})

    async def main() -> None:
        scheduler.submit("tts", {"input": "a"}, task_id="t1")
        scheduler.submit("tts", {"input": "b"}, task_id="t2")
        await runtime.sleep(0.5)
        scheduler.crash()

    runtime.run(main())
    return store


@pytest.mark.parametrize(
    ("options", "error", "builtin", "argument", "expected"),
    [
        ({}, SchedulerArgumentError, ValueError, "providers", "2 unfinished task(s) for provider(s) ['tts']"),
        (
            {"unknown_providers": "fail"},
            SchedulerArgumentError,
            ValueError,
            "unknown_providers",
            "must be 'raise' or 'leave', got 'fail'",
        ),
        ({"workers": "w1"}, SchedulerArgumentTypeError, TypeError, "workers", "not one string: use ['w1']"),
        ({"workers": 7}, SchedulerArgumentTypeError, TypeError, "workers", "collection of worker ids"),
        ({"workers": [""]}, SchedulerArgumentError, ValueError, "each of workers", "non-empty string"),
    ],
)
def test_recover_refuses_what_it_cannot_do_before_writing_anything(
    options: dict[str, Any], error: type, builtin: type, argument: str, expected: str
) -> None:
    store = _store_left_by_a_crashed_tts_scheduler()
    before = store.list_by_status()
    assert {record.status.value for record in before} == {"running", "queued"}
    runtime = SimPyRuntime()
    llm = ScriptedProvider(runtime)
    scheduler = Scheduler(runtime, [llm], store=store)
    with pytest.raises(error) as caught:
        runtime.run(scheduler.recover(**options))
    message = _refused(caught, builtin, argument)
    assert expected in message and "nothing was recovered" in message
    assert llm.calls == [] and store.list_by_status() == before and scheduler.in_flight == 0


@pytest.mark.parametrize(
    ("field", "value", "builtin", "accepted"),
    [
        ("max_attempts", 0, ValueError, ">= 1"),
        ("max_attempts", "3", TypeError, ">= 1"),
        ("attempt_timeout_s", 0, ValueError, "> 0 or None"),
        ("attempt_timeout_s", math.nan, ValueError, "> 0 or None"),
        ("poison_after", 0, ValueError, ">= 1"),
        ("max_retry_after_s", -1.0, ValueError, "> 0 or None"),
        ("adaptive_rule", "lane", TypeError, "an AdaptiveScopeRule"),
        # each of these was accepted and failed a task only at its first retry (after a billed call)
        ("backoff", None, TypeError, "a backoff strategy"),
        ("backoff", "full_jitter", TypeError, "backoff_from_name('full_jitter')"),
        ("max_attempts", 2.5, ValueError, "a whole number >= 1"),
        ("max_attempts", math.inf, ValueError, "a whole number >= 1"),
        ("poison_after", 1.5, ValueError, "a whole number >= 1"),
        ("honour_retry_after", "no", TypeError, "True or False"),  # was accepted: "no" is truthy
        # whole floats only because a float that large has no fraction left: were accepted
        ("max_attempts", 1e308, ValueError, "a whole number >= 1 and <= 2**63"),
        ("max_attempts", 2.0**64, ValueError, "<= 2**63"),
        ("max_attempts", 2**63 + 1, ValueError, "<= 2**63"),  # past what a scenario file accepts
        ("poison_after", 1e308, ValueError, "<= 2**63"),
    ],
)
def test_a_retry_policy_that_cannot_be_used_is_refused_when_built(
    field: str, value: Any, builtin: type, accepted: str
) -> None:
    runtime, provider, scheduler, store = _scheduler()
    with pytest.raises(SchedulerArgumentError) as caught:
        scheduler.submit("llm", {"input": "a"}, retry=RetryPolicy(**{field: value}))
    message = _refused(caught, builtin, field)
    assert accepted in message and repr(value) in message and "no RetryPolicy was built" in message
    runtime.run(scheduler.join())
    assert provider.calls == [] and store.list_by_status() == []


def test_a_retry_policy_keeps_a_whole_count_as_the_int_it_stands_for() -> None:
    policy = RetryPolicy(max_attempts=3.0, poison_after=2.0)
    assert policy == RetryPolicy(max_attempts=3, poison_after=2)
    assert type(policy.max_attempts) is int and type(policy.poison_after) is int
    assert type(RetryPolicy(max_attempts=LARGEST_WHOLE).max_attempts) is int


@pytest.mark.parametrize("value", ["1e308", "3.0", str(LARGEST_WHOLE + 1)])
def test_a_max_attempts_a_scenario_file_refuses_names_the_file_and_key(tmp_path: Path, value: str) -> None:
    path = tmp_path / "attempts.toml"
    path.write_text(Path(SCENARIO).read_text().replace("max_attempts = 4", f"max_attempts = {value}"))
    assert f"max_attempts = {value}" in path.read_text()
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    message = str(caught.value)
    assert "attempts.toml" in message and "retry.max_attempts" in message and "an integer >= 1" in message


def test_every_max_attempts_a_scenario_file_accepts_builds_a_retry_policy(tmp_path: Path) -> None:
    """The file and the policy share one bound: a count the file accepts never fails later, in the run."""
    path = tmp_path / "attempts.toml"
    path.write_text(Path(SCENARIO).read_text().replace("max_attempts = 4", f"max_attempts = {LARGEST_WHOLE}"))
    assert retry_policy(load_scenario(path)).max_attempts == LARGEST_WHOLE


@pytest.mark.parametrize("retry", [5, "full_jitter", {"max_attempts": 3}])
def test_a_retry_that_is_no_retry_policy_is_refused_by_the_scheduler_and_by_submit(retry: Any) -> None:
    runtime, provider, scheduler, store = _scheduler()
    with pytest.raises(SchedulerArgumentError) as caught:
        Scheduler(runtime, [provider], retry=retry)
    assert "expected a RetryPolicy" in _refused(caught, TypeError, "retry")
    with pytest.raises(SchedulerArgumentError) as caught:
        scheduler.submit("llm", {"input": "a"}, retry=retry)
    assert "nothing was queued or stored" in _refused(caught, TypeError, "retry")
    runtime.run(scheduler.join())
    assert provider.calls == [] and store.list_by_status() == []


def test_the_stage_states_of_an_unknown_job_id_are_refused() -> None:
    runtime, provider, scheduler, store = _scheduler()
    with pytest.raises(UnknownNameError) as caught:
        scheduler.jobs.stage_states("nope")
    assert "no job 'nope'" in _refused(caught, KeyError, "job_id")
    runtime.run(scheduler.join())
    assert provider.calls == [] and store.list_by_status() == [] and store.list_jobs() == []


def test_a_job_spec_asked_for_a_stage_it_lacks_names_its_stages() -> None:
    spec = JobSpec("pipeline", "1", [Stage("draft", "llm"), Stage("polish", "llm", after=("draft",))])
    assert spec.stage("draft").name == "draft"
    with pytest.raises(UnknownNameError) as caught:
        spec.stage("review")
    message = _refused(caught, KeyError, "name")
    assert "no stage named 'review'" in message and "['draft', 'polish']" in message


@pytest.mark.parametrize(
    ("kind", "with_path", "argument", "expected"),
    [
        ("redis", True, "kind", "unknown store kind 'redis'; expected one of ('memory', 'json', 'sqlite')"),
        ("sqlite", False, "path", "the sqlite store needs a file path"),
        ("json", False, "path", "the json store needs a file path"),
        ("memory", True, "path", "do not pass a path"),
    ],
)
def test_open_store_refuses_a_kind_or_path_that_does_not_fit(
    tmp_path: Path, kind: str, with_path: bool, argument: str, expected: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        open_store(kind, tmp_path / "tasks.db" if with_path else None)
    message = _refused(caught, ValueError, argument)
    assert expected in message and "no store was opened" in message.lower()
    assert list(tmp_path.iterdir()) == []  # nothing created


@pytest.mark.parametrize("value", [0, -3, 2.5, "10", True])
def test_a_json_store_refuses_a_compaction_threshold_that_is_no_count(tmp_path: Path, value: Any) -> None:
    with pytest.raises(ConfigurationError) as caught:
        JsonFileStore(tmp_path / "tasks.json", compact_min_entries=value)
    message = _refused(caught, ValueError, "compact_min_entries")
    assert "whole number >= 1" in message and repr(value) in message and "not opened" in message
    assert list(tmp_path.iterdir()) == []  # no snapshot, journal or lock file


@pytest.mark.parametrize(("value", "builtin"), [(-1, ValueError), (math.nan, ValueError), ("30", TypeError)])
def test_an_aging_policy_with_a_wait_that_is_no_duration_is_refused(value: Any, builtin: type) -> None:
    runtime = SimPyRuntime()
    provider, store = ScriptedProvider(runtime), MemoryStore()
    with pytest.raises(SchedulerArgumentError) as caught:
        Scheduler(runtime, [provider], store=store, dispatch=AgingShortestJobFirstPolicy(max_wait_s=value))
    message = _refused(caught, builtin, "max_wait_s")
    assert "seconds >= 0" in message and repr(value) in message and "no policy was built" in message
    assert provider.calls == [] and store.list_by_status() == []


def test_an_unknown_dispatch_policy_name_lists_the_known_ones() -> None:
    with pytest.raises(SchedulerArgumentError) as caught:
        dispatch_policy_from_name("lifo")
    message = _refused(caught, ValueError, "name")
    assert "'lifo'" in message and "['fifo', 'sjf', 'sjf_aging']" in message


@pytest.mark.parametrize("estimate", [None, "many", -1.0, math.nan, 10**400])
def test_a_provider_estimate_that_is_no_cost_is_refused_naming_the_provider(estimate: Any) -> None:
    runtime, provider, scheduler, store = _scheduler()
    provider.estimate_cost = lambda kind, payload: estimate  # type: ignore[attr-defined]
    with pytest.raises(
        SchedulerArgumentError, match=r"provider 'llm': estimate_cost\('llm', \.\.\.\) returned"
    ):
        scheduler.submit("llm", {"input": "a"})  # was a bare TypeError from float(None)
    runtime.run(scheduler.join())
    assert provider.calls == [] and store.list_by_status() == []


def test_queued_takes_a_priority_as_submit_does_and_cancel_refuses_what_is_no_task_id() -> None:
    runtime, _, scheduler, _ = _scheduler(interactive_limit=None)
    scheduler.submit("llm", {"input": "a"}, priority="interactive")
    assert scheduler.queued("interactive") == scheduler.queued(Priority.INTERACTIVE) == 1  # a KeyError
    with pytest.raises(SchedulerArgumentError) as caught:
        scheduler.cancel(["id"])  # type: ignore[arg-type]  # was a bare "unhashable type" TypeError
    assert "nothing was cancelled" in _refused(caught, TypeError, "task_id")
    runtime.run(scheduler.join())


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"key": 123}, "key"),  # stored; a JSON file store then called its own journal corrupt
        ({"key": b"k"}, "key"),  # a bare TypeError from json.dumps in a durable store
        ({"task_id": 1.5}, "task_id"),
        ({"provider": []}, "provider"),  # before: a raw TypeError (unhashable type: 'list')
    ],
)
def test_names_that_are_no_text_are_refused_by_submit(arguments: dict, named: str) -> None:
    runtime, provider, scheduler, store = _scheduler()
    with pytest.raises(SchedulerArgumentError) as caught:
        scheduler.submit("llm", {"input": "a"}, **arguments)
    assert "nothing was queued or stored" in _refused(caught, TypeError, named)
    runtime.run(scheduler.join())
    assert provider.calls == [] and store.list_by_status() == []


def test_a_provider_estimate_that_raises_is_refused_naming_the_provider() -> None:
    """HttpProvider's estimate of a payload asking max_tokens=10**400 raised a bare OverflowError."""
    runtime, provider, scheduler, store = _scheduler()

    def estimate(kind: str, payload: Any) -> float:
        return float(payload["max_tokens"])

    provider.estimate_cost = estimate  # type: ignore[attr-defined]
    with pytest.raises(SchedulerArgumentError, match=r"estimate_cost\('llm', payload\) raised OverflowError"):
        scheduler.submit("llm", {"input": "a", "max_tokens": 10**400})
    runtime.run(scheduler.join())
    assert provider.calls == [] and store.list_by_status() == []


@pytest.mark.parametrize("kind", ["sqlite", "json"])
@pytest.mark.parametrize("argument", ["key", "task_id"])
def test_text_a_durable_store_cannot_encode_is_refused_and_nothing_is_written(
    tmp_path: Path, kind: str, argument: str
) -> None:
    """Before: a lone surrogate (a str Python allows and UTF-8 does not) in a key or a task id
    raised a raw UnicodeEncodeError from sqlite3 or from the JSON store's encoding (review)."""
    from aiqsim.stores import UnstorableValueError

    runtime = SimPyRuntime()
    store = SqliteStore(tmp_path / "s.db") if kind == "sqlite" else JsonFileStore(tmp_path / "s.json")
    scheduler = Scheduler(runtime, [ScriptedProvider(runtime)], store=store)
    with pytest.raises(
        UnstorableValueError, match=r"'\\ud800' is not valid Unicode text .*nothing was written"
    ):
        scheduler.submit("llm", {"input": "x"}, **{argument: "\ud800"})
    assert store.list_by_status() == []
    assert scheduler.submit("llm", {"input": "x"}, task_id="fine").id == "fine"  # the store goes on
    assert [record.id for record in store.list_by_status()] == ["fine"]
    store.close()


@pytest.mark.parametrize(
    ("argument", "value", "lacks"),
    [
        ("dispatch", "fifo", "new_queue"),  # a name where the policy object goes
        ("store", "tasks.db", "insert_and_claim"),  # a path where the store goes
        ("runtime", None, "now"),
        ("gates", 5, "iterable"),
        ("events", 5, "callable"),
    ],
)
def test_scheduler_parts_that_are_not_what_they_should_be_are_refused_when_built(
    argument: str, value: Any, lacks: str
) -> None:
    """Before: an AttributeError or TypeError from inside the scheduler, at construction or at the
    first submit (the store given as a path was accepted), naming nothing the user passed (review)."""
    runtime = SimPyRuntime()
    options: dict[str, Any] = {argument: value}
    if argument == "runtime":
        options, given_runtime = {}, value
    else:
        given_runtime = runtime
    with pytest.raises(SchedulerArgumentError) as caught:
        Scheduler(given_runtime, [ScriptedProvider(runtime)], **options)
    message = _refused(caught, TypeError, argument)
    assert lacks in message and "no scheduler was created" in message


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda: simulate(SCENARIO, overrides=5), "overrides: expected a mapping"),  # type: ignore[arg-type]
        (lambda: sweep(SCENARIO, {}, seeds=5, progress=False), "seeds: expected an iterable"),  # type: ignore[arg-type]
        (lambda: sweep(SCENARIO, {}, seeds=["a"], progress=False), "seeds: expected integers >= 0, got 'a'"),
        (lambda: sweep(SCENARIO, [1], progress=False), "grid: expected a mapping"),  # type: ignore[arg-type]
    ],
    ids=["overrides", "seeds-int", "seeds-text", "grid-list"],
)
def test_simulate_and_sweep_refuse_arguments_of_the_wrong_shape(call: Any, fragment: str) -> None:
    """Before: AttributeError, TypeError or ValueError from inside simulate/sweep (review)."""
    with pytest.raises(ConfigurationError, match=re.escape(fragment)):
        call()


def test_a_scenario_record_changed_by_hand_is_checked_as_a_file_is() -> None:
    """Before: a record from dataclasses.replace skipped the reader's checks when no overrides were
    given: a rate of 0 ended in a ZeroDivisionError deep in the run, no providers in a KeyError."""
    import dataclasses

    from aiqsim.sim.scenario import ScenarioError, load_scenario

    scenario = load_scenario(SCENARIO)
    zero_rate = dataclasses.replace(
        scenario, workloads=(dataclasses.replace(scenario.workloads[0], rate_per_s=0),)
    )
    with pytest.raises(ScenarioError, match=r"workloads\[0\]\.rate_per_s: expected a number > 0"):
        simulate(zero_rate)
    with pytest.raises(ScenarioError, match="providers: expected at least one"):
        simulate(dataclasses.replace(scenario, providers=()))
    assert (
        simulate(scenario, seed=2).summary == simulate(SCENARIO, seed=2).summary
    )  # a valid one runs as before


@pytest.mark.parametrize("store_class", [SqliteStore, JsonFileStore])
@pytest.mark.parametrize("path", ["", None, "tasks\x00.db"], ids=["empty", "none", "nul"])
def test_a_store_path_that_is_no_path_is_refused_naming_the_argument(
    store_class: type, path: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: pathlib's ValueError, a TypeError or sqlite3's 'embedded null byte' (review)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ConfigurationError, match=f"{store_class.__name__}: path: expected the path of a file"
    ):
        store_class(path)
    assert list(tmp_path.iterdir()) == []  # nothing created
