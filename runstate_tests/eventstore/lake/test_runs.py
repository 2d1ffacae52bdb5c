"""The runs table: the store's projection of each run, merged so a row only ever moves forward."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from runstate.eventstore import NewEvent, StoredEvent, fold
from runstate.eventstore.contract import RunSnapshot
from runstate.eventstore.lake.arrow import RUNS_COLUMNS, collect_arrow, rows_from_arrow
from runstate.eventstore.lake.runs import RunRow, by_run, merge_rows, plan_rows
from runstate.eventstore.lake.tables import POSITION_PROPERTY, created_days
from runstate_tests.eventstore.test_projection import T0
from runstate_tests.eventstore.test_projection import stored as projected

from .conftest import (
    append_randomly,
    assert_lake_equals_feed,
    expected_runs,
    exported_to_the_end,
    feed_from_start,
    lake_runs,
    random_batch,
)


def stored(run_id: str, seq: int, event_type: str, position: int, step_id: str | None = None) -> StoredEvent:
    return replace(projected(seq, event_type, step_id), run_id=run_id, position=position)


def test_a_run_folds_onto_its_row_as_the_projection_folds_all_its_events():
    events = [
        stored("r", 1, "RunStarted", 10),
        stored("r", 2, "StepStarted", 11, "a"),
        stored("r", 3, "StepFailed", 12, "a"),
        stored("r", 4, "RunFailed", 13),
    ]

    row = RunRow.fold_onto(RunRow.of("r", T0, events[:2]), "r", T0, events[2:])

    assert row == RunRow.of("r", T0, events)
    assert row.snapshot == fold(RunSnapshot.empty("r"), events)
    assert row.columns() | {"snapshot": None} == {
        "run_id": "r",
        "created_at": T0,
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
    row = RunRow.of("r", T0, [stored("r", 1, "RunStarted", 10), stored("r", 3, "StepStarted", 11, "a")])
    late = [stored("r", 2, "SignalWaiting", 12)]  # committed after seq 3, below it

    rows, again = plan_rows({"r": row}, {"r": late, "s": [stored("s", 1, "RunStarted", 13)]}, {"s": T0})

    assert again == ["r"] and [r.run_id for r in rows] == ["s"]


def test_created_days_names_each_utc_day_once_and_joins_consecutive_ones():
    plus = timezone(timedelta(hours=5))
    times = [
        datetime(2026, 11, 28, 23, 0, tzinfo=UTC),
        datetime(2026, 11, 29, 3, 0, tzinfo=plus),  # 2026-11-28 22:00 UTC
        datetime(2026, 11, 29, 1, 0, tzinfo=UTC),
        datetime(2025, 1, 1, tzinfo=UTC),
    ]

    condition, params = created_days(times, "t.created_at")

    assert condition == (
        "((t.created_at >= :day_from_0 AND t.created_at < :day_to_0) OR "
        "(t.created_at >= :day_from_1 AND t.created_at < :day_to_1))"
    )
    assert params == {
        "day_from_0": datetime(2025, 1, 1, tzinfo=UTC),
        "day_to_0": datetime(2025, 1, 2, tzinfo=UTC),
        "day_from_1": datetime(2026, 11, 28, tzinfo=UTC),
        "day_to_1": datetime(2026, 11, 30, tzinfo=UTC),
    }
    assert created_days([]) == ("(false)", {})


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
def test_a_run_folded_again_reads_only_the_days_its_events_were_emitted(spark, own_store, history):
    """Another run's events of two years ago are in partitions of their own; with their data files gone
    from disk, a run folded again still merges, so its read never opened them."""

    def imported(run_id: str, seq: int, event_type: str, at: datetime) -> StoredEvent:
        event = NewEvent(run_id=run_id, event_type=event_type, emitted_at=at + timedelta(seconds=seq))
        return StoredEvent(**{**event.__dict__, "run_seq": seq, "persisted_at": at})

    long_ago = T0 - timedelta(days=730)
    own_store.import_events([imported("ancient", 1, "RunStarted", long_ago)])
    own_store.import_events(
        [imported("gappy", 1, "RunStarted", T0), imported("gappy", 3, "RunCompleted", T0)]
    )
    exported_to_the_end(spark, own_store, history)
    files = spark.sql(f"SELECT DISTINCT _file FROM {history.events_table} WHERE run_id = 'ancient'").collect()
    assert files and all("emitted_at_day=" in row._file for row in files)
    for row in files:
        Path(urlsplit(row._file).path).unlink()
    own_store.import_events([imported("gappy", 2, "SignalWaiting", T0)])  # below seq 3, at a later position

    steps = exported_to_the_end(spark, own_store, history)

    assert [step.folded_again for step in steps if hasattr(step, "folded_again")] == [1]
    gappy = expected_runs(own_store, [e for e in feed_from_start(own_store) if e.run_id == "gappy"])["gappy"]
    assert lake_runs(spark, history)["gappy"] == gappy


@pytest.mark.spark
def test_rows_of_an_older_merge_landing_late_change_nothing(spark, own_store, history):
    append_randomly(own_store, random.Random(3), runs=4, appends=10)
    early = by_run(own_store.fetch_all(0, 12))
    exported_to_the_end(spark, own_store, history)
    before = lake_runs(spark, history)

    created = own_store.runs_created_at(list(early))
    merge_rows(
        spark, history, [RunRow.of(run_id, created[run_id], events) for run_id, events in early.items()]
    )

    assert lake_runs(spark, history) == before
    assert_lake_equals_feed(spark, own_store, history)


@pytest.mark.spark
def test_a_merge_opens_only_the_partitions_of_the_runs_it_touches(spark, own_store, fresh_database, history):
    """The runs of two years ago are in partitions of their own; with their data files gone from disk, an
    export that touches only today's runs still merges, so it never opened those files."""
    append_randomly(own_store, random.Random(5), runs=6, appends=20)
    old = ("run-00", "run-01")
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        conn.execute(
            "UPDATE runstate.run_streams SET created_at = created_at - interval '730 days' WHERE run_id = ANY(%s)",
            (list(old),),
        )
    exported_to_the_end(spark, own_store, history)
    assert_lake_equals_feed(spark, own_store, history)
    old_files = [
        row._file
        for row in spark.sql(
            f"SELECT DISTINCT _file FROM {history.runs_table} WHERE run_id IN {old}"
        ).collect()
    ]
    today = spark.sql(f"SELECT count(*) AS n FROM {history.runs_table} WHERE run_id NOT IN {old}").first().n
    assert old_files and today == 4
    for path in old_files:
        Path(urlsplit(path).path).unlink()

    for n, run_id in enumerate(("run-02", "run-03", "run-05")):
        own_store.append_batch(run_id, random_batch(random.Random(n), run_id, 100 + n))
    exported_to_the_end(spark, own_store, history)

    feed = feed_from_start(own_store)
    recent = {run_id: row for run_id, row in expected_runs(own_store, feed).items() if run_id not in old}
    rows = rows_from_arrow(
        collect_arrow(
            spark.sql(
                f"SELECT * FROM {history.runs_table} WHERE created_at >= current_timestamp() - INTERVAL 1 DAY"
            )
        )
    )
    assert {row["run_id"]: row | {"snapshot": json.loads(row["snapshot"])} for row in rows} == recent


@pytest.mark.spark
def test_a_runs_table_of_the_older_layout_is_replaced_and_filled_again(spark, own_store, history):
    """Before runs was partitioned by created_at it had no such column: the next export replaces it with an
    empty table of today's layout and merges every exported event into it again."""
    append_randomly(own_store, random.Random(8), runs=5, appends=15)
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS lake.{history.namespace}")
    older = ", ".join(f"{name} {kind}" for name, kind in RUNS_COLUMNS if name != "created_at")
    spark.sql(
        f"CREATE TABLE {history.runs_table} ({older}) USING iceberg "
        f"TBLPROPERTIES ('{POSITION_PROPERTY}'='999999999999999')"
    )
    spark.sql(
        f"INSERT INTO {history.runs_table} SELECT 'ghost', 'RUNNING', NULL, NULL, current_timestamp(), "
        "current_timestamp(), 0.0D, 1L, array(), 1L, 1L, '{}'"
    )

    exported_to_the_end(spark, own_store, history)

    assert_lake_equals_feed(spark, own_store, history)  # no ghost, every run, position from 0
