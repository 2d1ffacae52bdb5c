"""The pure fold and the contract values: no database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from runstate.eventstore import (
    EventType,
    InvalidEvent,
    NewEvent,
    RunSnapshot,
    StoredEvent,
    fold,
    idempotency_key,
    validate_event,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def stored(seq: int, event_type: str, step_id: str | None = None, data=None) -> StoredEvent:
    return StoredEvent(
        run_id="r",
        run_seq=seq,
        event_type=event_type,
        emitted_at=T0 + timedelta(seconds=seq),
        persisted_at=T0,
        idempotency_key=f"k{seq}",
        event_id=f"00000000-0000-0000-0000-{seq:012d}",
        step_id=step_id,
        data=data,
    )


HISTORY = [
    stored(1, EventType.RUN_STARTED),
    stored(2, EventType.STEP_STARTED, "extract"),
    stored(3, EventType.STEP_FAILED, "extract", {"error": "timeout"}),
    stored(4, EventType.STEP_RETRYING, "extract"),
    stored(5, EventType.STEP_STARTED, "extract"),
    stored(6, EventType.STEP_COMPLETED, "extract"),
    stored(7, "SomethingNew", "extract", {"x": 1}),
    stored(8, EventType.ARTIFACT_EMITTED, "extract", {"uri": "s3://b/k"}),
    stored(9, EventType.SIGNAL_WAITING),
    stored(10, EventType.SIGNAL_RECEIVED),
    stored(11, EventType.RUN_COMPLETED),
]


def test_fold_builds_the_run_snapshot():
    snap = fold(RunSnapshot.empty("r"), HISTORY)

    assert snap.status == "COMPLETED"
    assert snap.started_at == T0 + timedelta(seconds=1)
    assert snap.completed_at == T0 + timedelta(seconds=11)
    assert snap.last_event_seq == 11
    step = snap.steps["extract"]
    assert (step.status, step.attempts, step.error) == ("SUCCESS", 2, None)
    assert snap.artifacts == ({"runSeq": 8, "stepId": "extract", "data": {"uri": "s3://b/k"}},)


def test_fold_in_pieces_equals_fold_at_once():
    whole = fold(RunSnapshot.empty("r"), HISTORY)
    pieces = RunSnapshot.empty("r")
    for cut in (0, 3, 7, 11):
        pieces = fold(pieces, HISTORY[:cut])

    assert pieces == whole


def test_fold_skips_events_at_or_below_the_watermark():
    once = fold(RunSnapshot.empty("r"), HISTORY)

    assert fold(once, HISTORY) == once


def test_unknown_types_only_move_the_watermark():
    snap = fold(RunSnapshot.empty("r"), [stored(1, "Custom"), stored(2, "AnotherOne")])

    assert (snap.status, snap.steps, snap.last_event_seq) == ("PENDING", {}, 2)


def test_signal_waiting_then_received():
    waiting = fold(RunSnapshot.empty("r"), HISTORY[:1] + [stored(2, EventType.SIGNAL_WAITING)])
    resumed = fold(waiting, [stored(3, EventType.SIGNAL_RECEIVED)])

    assert (waiting.status, resumed.status) == ("WAITING", "RUNNING")


def test_finished_run_stays_finished():
    snap = fold(
        RunSnapshot.empty("r"),
        [
            stored(1, EventType.RUN_CANCELLED),
            stored(2, EventType.RUN_STARTED),
            stored(3, EventType.RUN_COMPLETED),
        ],
    )

    assert snap.status == "CANCELLED"


def test_failed_step_keeps_its_error():
    snap = fold(
        RunSnapshot.empty("r"),
        [
            stored(1, EventType.STEP_STARTED, "s"),
            stored(2, EventType.STEP_FAILED, "s", {"error": {"code": 3}}),
        ],
    )

    assert snap.steps["s"].status == "FAILED"
    assert snap.steps["s"].error == {"code": 3}


def test_snapshot_round_trips_through_dict():
    snap = fold(RunSnapshot.empty("r"), HISTORY)

    assert RunSnapshot.from_dict(snap.to_dict()) == snap


def test_idempotency_key_is_sha256_of_parts():
    import hashlib

    expected = hashlib.sha256(b"run-1|step-a||StepCompleted|v2").hexdigest()

    assert idempotency_key("run-1", "step-a", None, "StepCompleted", "v2") == expected


def test_new_event_defaults_key_and_event_id():
    event = NewEvent("run-1", "StepStarted", T0, step_id="a", logical_attempt_id="1", plan_version="p")

    assert event.idempotency_key == idempotency_key("run-1", "a", "1", "StepStarted", "p")
    assert validate_event(event).event_id == event.event_id


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"run_id": ""}, "run_id"),
        ({"run_id": "r" * 257}, "run_id"),
        ({"event_type": ""}, "event_type"),
        ({"emitted_at": datetime(2026, 1, 1)}, "emitted_at"),
        ({"data": {"bad": {1, 2}}}, "data"),
        ({"data": float("nan")}, "data"),
        ({"event_id": "not-a-uuid"}, "event_id"),
        ({"caused_by_signal_id": "1234"}, "caused_by_signal_id"),
        ({"parent_event_id": 42}, "parent_event_id"),
        ({"step_id": 7}, "step_id"),
    ],
)
def test_validation_names_the_field(kwargs, field):
    base = {"run_id": "r", "event_type": "StepStarted", "emitted_at": T0}

    with pytest.raises(InvalidEvent) as caught:
        validate_event(NewEvent(**{**base, **kwargs}))

    assert caught.value.field == field
    assert repr(field) in str(caught.value)


def test_size_limit_is_configurable():
    event = NewEvent("r", "StepStarted", T0, data={"blob": "x" * 2000})

    validate_event(event, max_event_bytes=4096)
    with pytest.raises(InvalidEvent, match="limit is 1024"):
        validate_event(event, max_event_bytes=1024)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"run_id": "bad\ud800"}, "run_id"),
        ({"step_id": "x\x00y"}, "step_id"),
        ({"data": {"k": "bad\ud800"}}, "data"),
        ({"event_type": "T" * 257}, "event_type"),
    ],
)
def test_text_the_database_would_reject_is_invalid_input(kwargs, field):
    base = {"run_id": "r", "event_type": "StepStarted", "emitted_at": T0}

    with pytest.raises(InvalidEvent) as caught:
        validate_event(NewEvent(**{**base, **kwargs}))

    assert caught.value.field == field
