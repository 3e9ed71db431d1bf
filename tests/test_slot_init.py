"""fast_frozen_init: the generated __init__ must behave exactly like the dataclass's own."""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass, field
from typing import Any

import pytest

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.job import JobRecord, job_transition
from aiqsim.core.slot_init import (
    FieldCopiers,
    UnsupportedDataclassError,
    compile_builder,
    compile_copier,
    fast_frozen_init,
)
from aiqsim.core.task import Priority, TaskRecord, TaskStatus, copy_record, new_task_record
from aiqsim.core.usage import UsageVerdict, sane_usage
from aiqsim.runtime import SimPyRuntime
from aiqsim.scheduler.dispatch import QueueItem, new_queue_item
from aiqsim.scheduler.live import LiveTask, new_live_task
from aiqsim.scheduler.provider import ProviderRequest, ProviderResponse, new_request, new_response
from aiqsim.scheduler.scheduler import Submission, _new_submission


@dataclass(frozen=True, slots=True)
class _Plain:
    a: int
    b: str = "b"
    c: list[int] = field(default_factory=list)


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class _Fast:
    a: int
    b: str = "b"
    c: list[int] = field(default_factory=list)


def _as_tuple(obj: Any) -> tuple[Any, ...]:
    return tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((1,), {}), ((1, "x"), {}), ((1,), {"c": [3]}), ((), {"a": 2, "b": "y", "c": [4, 5]})],
)
def test_same_values_as_the_dataclass_init(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    assert _as_tuple(_Fast(*args, **kwargs)) == _as_tuple(_Plain(*args, **kwargs))


def test_default_factory_gives_each_instance_its_own_value() -> None:
    first, second = _Fast(1), _Fast(2)
    assert first.c == [] and first.c is not second.c


def test_same_argument_errors_as_the_dataclass_init() -> None:
    with pytest.raises(TypeError):
        _Fast()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _Fast(1, d=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _Fast(1, "x", [], 4)  # type: ignore[call-arg]


def test_still_frozen_equal_hashable_and_picklable() -> None:
    record = _Fast(1, "x", [2])
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.a = 2  # type: ignore[misc]
    assert record == _Fast(1, "x", [2])
    assert pickle.loads(pickle.dumps(record)) == record
    assert dataclasses.replace(record, a=5).a == 5


def test_task_record_defaults_unchanged() -> None:
    record = TaskRecord(id="t", key="k", kind="chat", provider="p")
    assert record.priority is Priority.BACKGROUND and record.status is TaskStatus.QUEUED
    assert (record.attempts, record.started_at, record.worker, record.meta) == (0, None, None, {})
    assert record.meta is not TaskRecord(id="u", key="k", kind="chat", provider="p").meta
    full = ProviderResponse(result="r", usage=None, output_units=None, ratelimit=None)
    assert ProviderResponse("r") == full
    request = ProviderRequest("t", "k", "chat", None, 1.0, 1, Priority.INTERACTIVE)
    assert request.attempt == 1 and request.priority is Priority.INTERACTIVE


def test_refuses_shapes_it_cannot_reproduce() -> None:
    @dataclass(frozen=True, slots=True)
    class WithPostInit:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclass(frozen=True, slots=True)
    class KeywordOnly:
        a: int = field(kw_only=True)

    @dataclass(slots=True)
    class NotFrozen:
        a: int

    @dataclass(frozen=True)
    class NoSlots:
        a: int

    for cls in (WithPostInit, KeywordOnly, NotFrozen, NoSlots):
        with pytest.raises(UnsupportedDataclassError) as caught:
            fast_frozen_init(cls)
        assert isinstance(caught.value, ConfigurationError) and isinstance(caught.value, TypeError)


def test_built_and_copied_objects_are_the_frozen_class() -> None:
    record = TaskRecord(id="t", key="k", kind="chat", provider="p", payload={"a": 1})
    moved = copy_record(record, {"status": TaskStatus.RUNNING, "attempts": 2})
    for obj, name in ((record, "id"), (moved, "status"), (_Fast(1), "a")):
        assert type(obj) in (TaskRecord, _Fast)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, "other")
    assert moved == dataclasses.replace(record, status=TaskStatus.RUNNING, attempts=2)
    assert moved.payload is record.payload and record.status is TaskStatus.QUEUED


def test_compile_copier_copies_every_field_and_applies_changes() -> None:
    copy = compile_copier(_Fast)
    original = _Fast(1, "x", [2])
    assert copy(original, {}) == original and copy(original, {}) is not original
    assert _as_tuple(copy(original, {"b": "y"})) == (1, "y", [2])


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"attempts": 3},
        {"status": TaskStatus.RUNNING, "updated_at": 2.0, "started_at": 2.0},
        {"error": "x", "meta": {}},
    ],
)
def test_copy_record_equals_dataclasses_replace_for_every_set_of_changed_names(
    changes: dict[str, Any],
) -> None:
    record = TaskRecord(id="t", key="k", kind="chat", provider="p", payload={"a": 1}, meta={"m": 1})
    assert copy_record(record, dict(changes)) == dataclasses.replace(record, **changes)
    # the same names in the other order take a copier of their own and give the same record
    reordered = dict(reversed(list(changes.items())))
    assert _as_tuple(copy_record(record, reordered)) == _as_tuple(dataclasses.replace(record, **changes))


def test_a_name_that_is_not_a_field_is_refused_by_every_copier() -> None:
    record = TaskRecord(id="t", key="k", kind="chat", provider="p")
    with pytest.raises(TypeError, match="no field"):
        copy_record(record, {"attempts": 1, "colour": "red"})
    with pytest.raises(TypeError, match="no field"):
        compile_copier(_Fast)(_Fast(1), {"d": 2})
    job = JobRecord(id="j", key="k", name="n", version="1")
    with pytest.raises(TypeError, match="no field"):
        job.evolve(colour="red")


def test_copiers_beyond_the_cap_are_built_and_used_but_not_kept() -> None:
    copiers = FieldCopiers(_Plain)
    copiers.MAX_SHAPES = 2  # type: ignore[misc]
    original = _Plain(1, "x", [2])
    for changed in (("a",), ("b",), ("c",), ("a", "b")):
        copy = copiers.copier(changed)
        made = copy(original, {name: getattr(_Plain(9, "y", [8]), name) for name in changed})
        assert [getattr(made, name) for name in changed] == [getattr(_Plain(9, "y", [8]), n) for n in changed]
        assert type(made) is _Plain
    assert set(copiers.cache) == {("a",), ("b",)}


def test_job_records_are_copied_as_dataclasses_replace_copies_them() -> None:
    job = JobRecord(id="j", key="k", name="n", version="1", results={"a": 1}, stage_tasks={"a": ["t"]})
    evolved = job.evolve(error="e", updated_at=3.0)
    assert evolved == dataclasses.replace(job, error="e", updated_at=3.0) and type(evolved) is JobRecord
    assert evolved.results is job.results  # a copy shares the values it did not change, as replace does
    moved = job_transition(evolved, TaskStatus.RUNNING, 4.0)
    assert moved == dataclasses.replace(evolved, status=TaskStatus.RUNNING, updated_at=4.0, started_at=4.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        moved.error = "other"  # type: ignore[misc]


@dataclass(slots=True)
class _Mutable:
    a: int
    b: str = "b"
    c: list[int] = field(default_factory=list)


@pytest.mark.parametrize("cls", [_Plain, _Fast, _Mutable])
@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((1,), {}), ((1, "x"), {}), ((1,), {"c": [3]}), ((), {"a": 2, "b": "y", "c": [4, 5]})],
)
def test_a_builder_builds_what_the_class_call_builds(
    cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    built = compile_builder(cls)(*args, **kwargs)
    assert type(built) is cls and built == cls(*args, **kwargs)
    assert _as_tuple(built) == _as_tuple(cls(*args, **kwargs))
    assert pickle.loads(pickle.dumps(built)) == built


def test_a_built_frozen_object_stays_frozen_and_a_mutable_one_mutable() -> None:
    frozen = compile_builder(_Plain)(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        frozen.a = 2  # type: ignore[misc]
    assert frozen == _Plain(1) and type(frozen) is _Plain
    mutable = compile_builder(_Mutable)(1)
    mutable.a = 2
    assert mutable == _Mutable(2)


def test_a_builder_refuses_the_arguments_the_class_refuses() -> None:
    build = compile_builder(_Plain)
    for args, kwargs in (((), {}), ((1,), {"d": 2}), ((1, "x", [], 4), {}), ((1,), {"a": 1})):
        with pytest.raises(TypeError):
            build(*args, **kwargs)
    first, second = build(1), build(2)
    assert first.c == [] and first.c is not second.c  # each gets its own default-factory value


def test_a_builder_refuses_shapes_it_cannot_reproduce() -> None:
    @dataclass(slots=True)
    class WithPostInit:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclass
    class NoSlots:
        a: int

    class NotADataclass:
        __slots__ = ("a",)

    for cls in (WithPostInit, NoSlots, NotADataclass):
        with pytest.raises(UnsupportedDataclassError):
            compile_builder(cls)


def test_the_field_orders_that_positional_hot_path_calls_rely_on() -> None:
    # Scheduler.submit builds TaskRecord and LiveTask positionally (keyword calls cost more): a new
    # or moved field must be reflected there, or records get the wrong values without an error.
    assert [f.name for f in dataclasses.fields(TaskRecord)] == [
        "id", "key", "kind", "provider", "priority", "status", "cost_estimate", "attempts",
        "created_at", "updated_at", "started_at", "finished_at", "payload", "result", "error",
        "deduped_from", "worker", "tenant", "route", "meta",
    ]  # fmt: skip
    assert [f.name for f in dataclasses.fields(LiveTask)] == [
        "record", "future", "queue_item", "runner", "started", "cancel_requested", "waiting_on",
        "finishing", "lost", "retry", "outcome", "outcome_error", "in_call", "last_attempt", "stream",
        "route",
    ]  # fmt: skip


def test_the_hot_path_builders_build_what_their_classes_build() -> None:
    record = new_task_record(id="t", key="k", kind="chat", provider="p", cost_estimate=2.0, payload=[1])
    assert record == TaskRecord(id="t", key="k", kind="chat", provider="p", cost_estimate=2.0, payload=[1])
    assert (
        record.meta == {} and record.meta is not new_task_record(id="u", key="k", kind="c", provider="p").meta
    )
    request = ("t", "k", "chat", None, 1.0, 1, Priority.INTERACTIVE)
    assert new_request(*request) == ProviderRequest(*request)
    assert new_response(result="r", usage=3.0) == ProviderResponse(result="r", usage=3.0)
    live = new_live_task(record=record, future=None, retry=None)
    assert _as_tuple(live) == _as_tuple(LiveTask(record=record, future=None))  # type: ignore[arg-type]
    assert _as_tuple(new_queue_item("t", 1.0, 0.5, 3)) == _as_tuple(QueueItem("t", 1.0, 0.5, 3))
    assert sane_usage(None, 4.0, None) == UsageVerdict(4.0) and sane_usage(5, 4.0, None) == UsageVerdict(5.0)


def test_named_tuple_builders_build_what_their_classes_build() -> None:
    from aiqsim.scheduler.events import (
        AttemptRecord,
        QuotaSample,
        TaskTransition,
        new_attempt_record,
        new_quota_sample,
        new_task_transition,
    )

    transition_args = (1.0, "t", "k", "p", 1, None, "queued", 0)
    assert new_task_transition(*transition_args) == TaskTransition(*transition_args)
    assert type(new_task_transition(*transition_args)) is TaskTransition
    assert new_task_transition(*transition_args).cost_estimate is None  # the default
    attempt = ("t", "k", "p", 1, 0.0, 1.0, "ok", "done", 2.0, 2.0, None, None)
    assert new_attempt_record(*attempt, output_units=3.0) == AttemptRecord(*attempt, output_units=3.0)
    sample = (1.0, "p", 0.5, 0.5, 2, 0, 1)
    assert new_quota_sample(*sample) == QuotaSample(*sample)
    with pytest.raises(TypeError):
        new_quota_sample(*sample[:-1])
    with pytest.raises(TypeError):
        new_task_transition(*transition_args, cost_estimate=1.0, colour="red")


def test_new_submission_sets_every_slot_the_constructor_sets() -> None:
    """``_new_submission`` fills the handle's slots itself: a slot added to ``Submission`` or its base
    that the builder misses (or a value put in the wrong one) fails here."""
    runtime = SimPyRuntime()
    live = LiveTask(record=new_task_record(id="t1", key="k1", kind="chat", provider="p"))
    arguments = ("t1", "k1", live, runtime.create_future, runtime.create_future())
    built = _new_submission(*arguments)
    made = Submission(*arguments)  # type: ignore[arg-type]
    slots = [name for cls in type(made).__mro__ for name in getattr(cls, "__slots__", ())]
    assert set(slots) >= {"id", "key", "_holder", "_new_future", "_accepted"}
    for name in slots:
        assert getattr(built, name) is getattr(made, name), name
    assert isinstance(built, Submission) and repr(built) == "<Submission t1 pending>"
    without = _new_submission("t2", "k2", live, runtime.create_future, None)
    assert without._accepted is None and without._holder is live


def test_a_scheduler_keeps_its_attributes_in_slots_and_its_instance_dict_empty() -> None:
    """Scheduler and each of its parts declare ``__slots__`` (with an instance dict of 34
    attributes every attribute read was a dict lookup, and a method-cache miss walked the MRO): a
    part added without ``__slots__ = ()``, or an attribute set outside them, would bring the dict
    back silently. Users keep what an instance dict gave them (review of b3a9087)."""
    import gc
    import random
    import weakref
    from unittest import mock

    from aiqsim.runtime import SimPyRuntime
    from aiqsim.scheduler import Scheduler
    from aiqsim.validation.mmc import ExponentialServiceProvider

    runtime = SimPyRuntime()
    scheduler = Scheduler(runtime, [ExponentialServiceProvider(runtime, 1.0, random.Random(0))])
    assert [part.__name__ for part in Scheduler.__mro__ if "__slots__" not in vars(part)] == ["object"]

    async def run(scheduler: Scheduler) -> None:
        await scheduler.submit("mmc", 1).wait()
        await scheduler.close()

    runtime.run(run(scheduler))
    assert vars(scheduler) == {}  # every attribute it set, at construction or since, is a slot
    unset = [
        name for name in Scheduler.__slots__ if not name.startswith("__") and not hasattr(scheduler, name)
    ]
    assert unset == []  # every slot is set by __init__: no attribute read can find an empty slot

    scheduler.note = "mine"  # an attribute of the user's own
    assert vars(scheduler) == {"note": "mine"}
    with mock.patch.object(scheduler, "submit", return_value="patched"):
        assert scheduler.submit("mmc", 2) == "patched"
    reference = weakref.ref(scheduler)
    del scheduler
    gc.collect()
    assert reference() is None
