"""The task state machine: the transition table is the whole rule set, checked pair by pair."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.states import TRANSITIONS, IllegalTransitionError, is_legal, transition, transition_with
from aiqsim.core.task import TaskRecord, TaskStatus

S = TaskStatus
ALL_PAIRS = list(itertools.product(TaskStatus, TaskStatus))
LEGAL_PAIRS = [(a, b) for a, b in ALL_PAIRS if b in TRANSITIONS[a]]
ILLEGAL_PAIRS = [(a, b) for a, b in ALL_PAIRS if b not in TRANSITIONS[a]]
EXPECTED_LEGAL = {
    (S.QUEUED, S.RUNNING),
    (S.QUEUED, S.CANCELLED),
    (S.QUEUED, S.DEDUPED),
    (S.RUNNING, S.SUCCEEDED),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.CANCELLED),
    (S.FAILED, S.QUEUED),
}


def record_in(status: TaskStatus, **fields: object) -> TaskRecord:
    """A record already sitting in ``status`` (built directly, as a store would load it)."""
    base = TaskRecord(
        id="task-7", key="k" * 64, kind="summarise", provider="llm", created_at=1.0, updated_at=1.0
    )
    return replace(base, status=status, **fields)


def test_exactly_six_statuses_with_their_wire_names() -> None:
    assert [s.value for s in TaskStatus] == [
        "queued",
        "running",
        "succeeded",
        "failed",
        "cancelled",
        "deduped",
    ]
    assert set(TRANSITIONS) == set(TaskStatus)


def test_the_table_is_exactly_the_documented_one() -> None:
    assert set(LEGAL_PAIRS) == EXPECTED_LEGAL
    assert len(ILLEGAL_PAIRS) == 36 - len(EXPECTED_LEGAL)


def test_terminal_states_are_those_the_scheduler_never_leaves() -> None:
    assert {s for s in TaskStatus if s.is_terminal} == {S.SUCCEEDED, S.FAILED, S.CANCELLED, S.DEDUPED}
    for status in (S.SUCCEEDED, S.CANCELLED, S.DEDUPED):
        assert TRANSITIONS[status] == frozenset()


@pytest.mark.parametrize(("current", "requested"), ILLEGAL_PAIRS, ids=lambda s: s.value)
def test_every_illegal_pair_raises_naming_both_states_and_the_task(
    current: TaskStatus, requested: TaskStatus
) -> None:
    task = record_in(current, attempts=2, error="Boom: x" if current is S.FAILED else None)
    snapshot = task.to_dict()
    assert not is_legal(current, requested)
    with pytest.raises(IllegalTransitionError) as info:
        transition(task, requested, now=50.0, attempts=99)
    err = info.value
    message = str(err)
    assert "task-7" in message
    assert f"{current.value} -> {requested.value}" in message
    assert (err.task_id, err.current, err.requested) == ("task-7", current, requested)
    # Nothing changed: the same record, field for field.
    assert task.to_dict() == snapshot
    assert task.status is current


@pytest.mark.parametrize(("current", "requested"), LEGAL_PAIRS, ids=lambda s: s.value)
def test_every_legal_pair_moves_the_status_and_stamps_updated_at(
    current: TaskStatus, requested: TaskStatus
) -> None:
    task = record_in(current, started_at=2.0 if current is not S.QUEUED else None)
    moved = transition(task, requested, now=9.0)
    assert moved.status is requested
    assert moved.updated_at == 9.0
    assert (moved.id, moved.key, moved.kind, moved.provider) == (task.id, task.key, task.kind, task.provider)
    assert task.status is current  # the input record is a value and stays as it was


def test_status_may_be_given_by_its_string_value() -> None:
    assert transition(record_in(S.QUEUED), "running", now=3.0).status is S.RUNNING  # type: ignore[arg-type]


@pytest.mark.parametrize("bogus", ["bogus", "RUNNING", 3, None])
def test_an_unknown_status_is_a_configuration_error_listing_the_statuses(bogus: object) -> None:
    task = record_in(S.QUEUED)
    with pytest.raises(ConfigurationError, match="unknown task status") as info:
        transition(task, bogus, now=1.0)  # type: ignore[arg-type]
    assert all(status.value in str(info.value) for status in S)
    assert task.status is S.QUEUED


def test_changes_are_applied_with_the_transition() -> None:
    running = transition(record_in(S.QUEUED), S.RUNNING, now=2.0)
    done = transition(running, S.SUCCEEDED, now=5.0, result={"text": "hi"}, attempts=1)
    assert (done.result, done.attempts) == ({"text": "hi"}, 1)


def test_status_cannot_be_smuggled_through_changes() -> None:
    with pytest.raises(ValueError, match="next_status"):
        transition(record_in(S.QUEUED), S.RUNNING, now=1.0, status=S.SUCCEEDED)
    with pytest.raises(ValueError, match="transition"):
        record_in(S.QUEUED).evolve(status=S.RUNNING)


def test_started_at_is_set_on_first_run_only() -> None:
    queued = record_in(S.QUEUED)
    assert queued.started_at is None
    running = transition(queued, S.RUNNING, now=10.0)
    assert running.started_at == 10.0
    failed = transition(running, S.FAILED, now=12.0, error="ServerError: 503")
    requeued = transition(failed, S.QUEUED, now=20.0)
    rerun = transition(requeued, S.RUNNING, now=25.0)
    assert rerun.started_at == 10.0
    assert rerun.updated_at == 25.0


@pytest.mark.parametrize(("current", "terminal"), [p for p in LEGAL_PAIRS if p[1].is_terminal])
def test_finished_at_is_set_on_every_terminal_entry(current: TaskStatus, terminal: TaskStatus) -> None:
    task = record_in(current, started_at=1.5 if current is S.RUNNING else None)
    assert transition(task, terminal, now=7.5).finished_at == 7.5


def test_non_terminal_moves_do_not_set_finished_at() -> None:
    running = transition(record_in(S.QUEUED), S.RUNNING, now=1.0)
    assert running.finished_at is None


def test_manual_retry_clears_finished_at_and_error_but_keeps_history() -> None:
    running = transition(record_in(S.QUEUED), S.RUNNING, now=1.0)
    failed = transition(running, S.FAILED, now=4.0, attempts=3, error="ServerError: 503")
    assert (failed.finished_at, failed.error) == (4.0, "ServerError: 503")
    requeued = transition(failed, S.QUEUED, now=60.0)
    assert requeued.status is S.QUEUED
    assert requeued.finished_at is None
    assert requeued.error is None
    assert requeued.attempts == 3
    assert requeued.started_at == 1.0
    assert requeued.updated_at == 60.0
    # And it can finish again, with a fresh finished_at.
    again = transition(transition(requeued, S.RUNNING, now=61.0), S.SUCCEEDED, now=62.0)
    assert again.finished_at == 62.0


def test_a_full_lifecycle_through_every_state_that_can_chain() -> None:
    task = record_in(S.QUEUED)
    path = [S.RUNNING, S.FAILED, S.QUEUED, S.RUNNING, S.CANCELLED]
    for step, status in enumerate(path, start=2):
        task = transition(task, status, now=float(step))
    assert task.status is S.CANCELLED
    assert (task.started_at, task.finished_at, task.updated_at) == (2.0, 6.0, 6.0)
    for status in TaskStatus:
        with pytest.raises(IllegalTransitionError, match="none \\(terminal\\)"):
            transition(task, status, now=7.0)


def test_record_round_trips_through_its_dict_form() -> None:
    task = transition(record_in(S.QUEUED, payload={"q": [1, 2]}), S.RUNNING, now=3.0)
    assert TaskRecord.from_dict(task.to_dict()) == task


@pytest.mark.parametrize(("current", "target"), LEGAL_PAIRS)
def test_transition_with_a_dict_of_changes_is_transition(current: TaskStatus, target: TaskStatus) -> None:
    """The dict form the scheduler uses gives the very record ``transition`` gives (same fields,
    same stamps), for every legal pair and with changes of the caller's own."""
    record = record_in(current, started_at=2.0 if current is not S.QUEUED else None)
    assert transition_with(record, target, 9.0, {"attempts": 3}) == transition(
        record, target, 9.0, attempts=3
    )
    assert transition_with(record, target, 9.0, {}) == transition(record, target, 9.0)


@pytest.mark.parametrize(("current", "target"), ILLEGAL_PAIRS)
def test_transition_with_an_illegal_pair_raises_and_leaves_the_changes_alone(
    current: TaskStatus, target: TaskStatus
) -> None:
    changes = {"attempts": 3}
    with pytest.raises(IllegalTransitionError):
        transition_with(record_in(current), target, 9.0, changes)
    assert changes == {"attempts": 3}


def test_transition_with_refuses_a_status_among_the_changes() -> None:
    with pytest.raises(ValueError, match="next_status"):
        transition_with(record_in(S.QUEUED), S.RUNNING, 9.0, {"status": S.FAILED})
