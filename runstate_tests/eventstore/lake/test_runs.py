"""The runs table: the store's projection of each run, merged so a row only ever moves forward."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta

import pytest

from runstate.eventstore import NewEvent, StoredEvent, fold
from runstate.eventstore.contract import RunSnapshot
from runstate.eventstore.lake.runs import RunRow, by_run, merge_rows, plan_rows
from runstate_tests.eventstore.test_projection import T0
from runstate_tests.eventstore.test_projection import stored as projected

from .conftest import append_randomly, assert_lake_equals_feed, exported_to_the_end, lake_runs


def stored(run_id: str, seq: int, event_type: str, position: int, step_id: str | None = None) -> StoredEvent:
    return replace(projected(seq, event_type, step_id), run_id=run_id, position=position)


def test_a_run_folds_onto_its_row_as_the_projection_folds_all_its_events():
    events = [
        stored("r", 1, "RunStarted", 10),
        stored("r", 2, "StepStarted", 11, "a"),
        stored("r", 3, "StepFailed", 12, "a"),
        stored("r", 4, "RunFailed", 13),
    ]

    row = RunRow.fold_onto(RunRow.of("r", events[:2]), "r", events[2:])

    assert row == RunRow.of("r", events)
    assert row.snapshot == fold(RunSnapshot.empty("r"), events)
    assert row.columns() | {"snapshot": None} == {
        "run_id": "r",
        "status": "FAILED",
        "started_at": T0 + timedelta(seconds=1),
        "completed_at": T0 + timedelta(seconds=4),
        "first_event_at": T0 + timedelta(seconds=1),
        "last_event_at": T0 + timedelta(seconds=4),
        "duration_s": 3.0,
        "event_count": 4,
        "failed_steps": ["a"],
        "last_seq": 4,
        "last_position": 13,
        "snapshot": None,
    }


def test_a_run_whose_new_events_are_not_all_after_its_row_is_folded_again():
    row = RunRow.of("r", [stored("r", 1, "RunStarted", 10), stored("r", 3, "StepStarted", 11, "a")])
    late = [stored("r", 2, "SignalWaiting", 12)]  # committed after seq 3, below it

    rows, again = plan_rows({"r": row}, {"r": late, "s": [stored("s", 1, "RunStarted", 13)]})

    assert again == ["r"] and [r.run_id for r in rows] == ["s"]


@pytest.mark.spark
def test_an_event_committed_below_its_runs_last_seq_refolds_the_run(spark, own_store, history):
    def imported(seq: int, event_type: str) -> StoredEvent:
        event = NewEvent(run_id="gappy", event_type=event_type, emitted_at=T0 + timedelta(seconds=seq))
        return StoredEvent(**{**event.__dict__, "run_seq": seq, "persisted_at": T0})

    own_store.import_events([imported(1, "RunStarted"), imported(3, "RunCompleted")])
    exported_to_the_end(spark, own_store, history)
    own_store.import_events([imported(2, "SignalWaiting")])  # seq 2, at a position after seq 3's

    steps = exported_to_the_end(spark, own_store, history)

    assert [step.folded_again for step in steps if hasattr(step, "folded_again")] == [1]
    assert lake_runs(spark, history)["gappy"]["event_count"] == 3
    assert_lake_equals_feed(spark, own_store, history)


@pytest.mark.spark
def test_rows_of_an_older_merge_landing_late_change_nothing(spark, own_store, history):
    append_randomly(own_store, random.Random(3), runs=4, appends=10)
    early = by_run(own_store.fetch_all(0, 12))
    exported_to_the_end(spark, own_store, history)
    before = lake_runs(spark, history)

    merge_rows(spark, history, [RunRow.of(run_id, events) for run_id, events in early.items()])

    assert lake_runs(spark, history) == before
    assert_lake_equals_feed(spark, own_store, history)
