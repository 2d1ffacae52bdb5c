"""rows.py builds StoredEvents without their dataclass __init__: the object must be the one __init__ makes."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from runstate.eventstore.contract import StoredEvent
from runstate.eventstore.rows import row_to_event

AT = datetime(2026, 1, 1, tzinfo=UTC)
ROW = (
    "run-1",  # run_id
    7,  # run_seq
    "5ce003b8-04ce-486a-9d64-2fc239b7c0a4",  # event_id
    "step",
    "attempt-1",
    "logical-1",
    "v2",  # plan_version
    "StepFailed",
    {"error": "boom"},  # event_data
    "key-1",
    None,  # caused_by_signal_id
    None,  # parent_event_id
    AT,  # emitted_at
    AT,  # persisted_at
    "adapter-3",
    {"engine": "spark"},
    42,  # position
)


def test_a_row_makes_the_event_that_init_makes():
    built = row_to_event(ROW)
    made = StoredEvent(
        run_id="run-1",
        run_seq=7,
        event_type="StepFailed",
        emitted_at=AT,
        persisted_at=AT,
        idempotency_key="key-1",
        event_id="5ce003b8-04ce-486a-9d64-2fc239b7c0a4",
        data={"error": "boom"},
        step_id="step",
        engine_attempt_id="attempt-1",
        logical_attempt_id="logical-1",
        plan_version="v2",
        adapter_version="adapter-3",
        engine_run_ref={"engine": "spark"},
        position=42,
    )
    assert built == made and repr(built) == repr(made)
    assert vars(built) == vars(made)  # every field set, none more
    assert dataclasses.replace(built, run_seq=8) == dataclasses.replace(made, run_seq=8)


def test_an_event_built_from_a_row_stays_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        row_to_event(ROW).run_seq = 8  # type: ignore[misc]


def test_stored_event_keeps_what_building_without_init_relies_on():
    """No __post_init__ to skip and no slots (the fields live in __dict__): if either changes, rows.py's
    stored_from_fields must go back to calling StoredEvent(...)."""
    assert not hasattr(StoredEvent, "__post_init__")
    assert not hasattr(StoredEvent, "__slots__")
    assert dataclasses.is_dataclass(StoredEvent) and StoredEvent.__dataclass_params__.frozen
