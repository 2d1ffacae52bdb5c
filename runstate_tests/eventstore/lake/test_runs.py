"""The runs table: the store's projection of each run, merged inside Spark so a row only ever moves forward."""

from __future__ import annotations

import itertools
import random
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from runstate.eventstore import CANONICAL_EVENT_TYPES, EventType, NewEvent, StoredEvent
from runstate.eventstore.lake import RunsMerged, export_history
from runstate.eventstore.lake.tables import POSITION_PROPERTY, created_days, record_runs_position
from runstate.eventstore.projection import _HANDLERS as projection_handlers
from runstate.sqlfiles import queries
from runstate_tests.support.lake import (
    STEPS,
    T0,
    append_randomly,
    assert_lake_equals_feed,
    expected_runs,
    exported_to_the_end,
    feed_from_start,
    lake_runs,
    random_batch,
)

# The runs table's layouts before today's: without created_at (before 2026-11-29), then with the
# projection as JSON (before 2026-12-01).
_LAYOUT_1128 = (
    "run_id STRING, status STRING, started_at TIMESTAMP, completed_at TIMESTAMP, first_event_at TIMESTAMP, "
    "last_event_at TIMESTAMP, duration_s DOUBLE, event_count BIGINT, failed_steps ARRAY<STRING>, "
    "last_seq BIGINT, last_position BIGINT, snapshot STRING",
    "",
    "'ghost', 'RUNNING', NULL, NULL, current_timestamp(), current_timestamp(), 0.0D, 1L, array(), 1L, 1L, '{}'",
)
_LAYOUT_1129 = (
    _LAYOUT_1128[0].replace("run_id STRING,", "run_id STRING, created_at TIMESTAMP,"),
    "PARTITIONED BY (days(created_at))",
    _LAYOUT_1128[2].replace("'ghost',", "'ghost', current_timestamp(),"),
)


def imported(
    run_id: str, seq: int, event_type: str, at: datetime = T0, step_id: str | None = None
) -> StoredEvent:
    """An event with its own seq, as a migration imports it (at a feed position of its import's)."""
    event = NewEvent(
        run_id=run_id,
        event_type=event_type,
        emitted_at=at + timedelta(seconds=seq),
        step_id=step_id,
        idempotency_key=uuid.uuid4().hex,  # the default key is the event's content: a repeat
    )
    return StoredEvent(**{**event.__dict__, "run_seq": seq, "persisted_at": at})


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


def test_the_merge_names_every_event_type_the_projection_folds_into_a_column_of_runs():
    """A new event type with a handler in projection.py must be taught to runs.sql too."""
    text = queries("spark", "eventstore", "runs.sql")["merged_rows"]
    folded = set(projection_handlers) - {EventType.ARTIFACT_EMITTED}  # artifacts are in no column of runs

    assert {event_type for event_type in folded if f"'{event_type}'" not in text} == set()


@pytest.mark.spark
def test_an_event_committed_below_its_runs_last_seq_gives_the_projections_row(spark, own_store, history):
    own_store.import_events([imported("gappy", 1, "RunStarted"), imported("gappy", 3, "RunCompleted")])
    exported_to_the_end(spark, own_store, history)
    own_store.import_events([imported("gappy", 2, "SignalWaiting")])  # seq 2, at a position after seq 3's

    exported_to_the_end(spark, own_store, history)

    row = lake_runs(spark, history)["gappy"]
    assert (row["status"], row["event_count"], row["last_seq"]) == ("COMPLETED", 3, 3)
    assert_lake_equals_feed(spark, own_store, history)


@pytest.mark.spark
def test_runs_equal_the_projection_for_every_sequence_of_up_to_three_event_types(spark, own_store, history):
    """Every sequence of 1 to 3 event types (the canonical ones and an unknown one), each run's later events
    committed first for half of the runs and merged in two exports: each status rule, the step rules and
    the combination of a stored row with events older by seq."""
    types = sorted(CANONICAL_EVENT_TYPES) + ["CustomNote"]
    sequences = [kinds for length in (1, 2, 3) for kinds in itertools.product(types, repeat=length)]
    runs = [
        [imported(f"seq-{n}", seq, kind, step_id=STEPS[(n + seq) % 2]) for seq, kind in enumerate(kinds, 1)]
        for n, kinds in enumerate(sequences)
    ]
    crossed = [run for n, run in enumerate(runs) if n % 2 and len(run) > 1]
    own_store.import_events([event for run in runs if run not in crossed for event in run])
    own_store.import_events([event for run in crossed for event in run[1:]])
    exported_to_the_end(spark, own_store, history)

    own_store.import_events([run[0] for run in crossed])  # each below its run's stored last seq
    exported_to_the_end(spark, own_store, history)

    assert_lake_equals_feed(spark, own_store, history)


@pytest.mark.spark
def test_runs_equal_the_projection_whatever_order_their_events_commit_in(spark, own_store, history):
    """Longer runs whose events are imported in shuffled chunks of seqs, so feed positions cross seqs, with
    exports in between: merges combine stored rows with events both older and newer by seq."""
    rng = random.Random(11)
    types = sorted(CANONICAL_EVENT_TYPES) + ["CustomNote"]
    chunks = []
    for n in range(8):
        run = [
            imported(f"shuffled-{n}", seq, rng.choice(types), step_id=rng.choice(STEPS))
            for seq in range(1, rng.randint(6, 30))
        ]
        cuts = sorted(rng.sample(range(1, len(run)), k=4))
        chunks += [run[a:b] for a, b in zip([0, *cuts], [*cuts, len(run)], strict=True)]
    rng.shuffle(chunks)

    for n, chunk in enumerate(chunks):
        own_store.import_events(chunk)
        if n % 10 == 9:
            exported_to_the_end(spark, own_store, history)
    exported_to_the_end(spark, own_store, history)

    assert_lake_equals_feed(spark, own_store, history)


@pytest.mark.spark
def test_a_range_merged_again_adds_nothing_to_the_rows_that_have_it(spark, own_store, history):
    """The runs table's position is a property set after the merge's commit: a merge that died between the
    two leaves it behind, and the next merge's range then holds events that some rows already have."""
    append_randomly(own_store, random.Random(3), runs=4, appends=10)
    exported_to_the_end(spark, own_store, history)
    behind = feed_from_start(own_store)[5].position
    record_runs_position(spark, history, behind)
    append_randomly(own_store, random.Random(4), runs=6, appends=5)

    steps = exported_to_the_end(spark, own_store, history)

    assert [step.from_position for step in steps if isinstance(step, RunsMerged)] == [behind]
    assert_lake_equals_feed(spark, own_store, history)


@pytest.mark.spark
def test_a_merge_reads_only_the_run_events_of_its_range(spark, own_store, history):
    """With every data file of run_events gone from disk but the new batch's, a merge of a new event of a
    run the table has still merges: it never opened them (Iceberg skips files by their positions)."""
    append_randomly(own_store, random.Random(6), runs=4, appends=12)
    exported_to_the_end(spark, own_store, history)
    old_files = [
        row._file for row in spark.sql(f"SELECT DISTINCT _file FROM {history.events_table}").collect()
    ]
    for path in old_files:
        Path(urlsplit(path).path).unlink()
    own_store.append_batch("run-01", random_batch(random.Random(1), "run-01", 500))

    steps = list(export_history(spark, own_store, history))

    assert [type(step).__name__ for step in steps] == ["EventsCommitted", "RunsMerged"]
    assert (
        lake_runs(spark, history)["run-01"] == expected_runs(own_store, feed_from_start(own_store))["run-01"]
    )


@pytest.mark.spark
def test_a_merge_opens_only_the_partitions_of_the_runs_it_touches(
    spark, own_store, migrated_database, history
):
    """The runs of two years ago are in partitions of their own; with their data files gone from disk, an
    export that touches only today's runs still merges, so it never opened those files."""
    append_randomly(own_store, random.Random(5), runs=6, appends=20)
    old = ("run-00", "run-01")
    with psycopg.connect(migrated_database, autocommit=True) as conn:
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
    assert lake_runs(spark, history, "created_at >= current_timestamp() - INTERVAL 1 DAY") == recent


@pytest.mark.spark
@pytest.mark.parametrize("layout", [_LAYOUT_1128, _LAYOUT_1129], ids=["no-created-at", "snapshot-json"])
def test_a_runs_table_of_an_older_layout_is_replaced_and_filled_again(spark, own_store, history, layout):
    """The next export replaces a runs table of an older layout with an empty one of today's and merges every
    exported event into it again."""
    columns, partitions, ghost = layout
    append_randomly(own_store, random.Random(8), runs=5, appends=15)
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS lake.{history.namespace}")
    spark.sql(
        f"CREATE TABLE {history.runs_table} ({columns}) USING iceberg {partitions} "
        f"TBLPROPERTIES ('{POSITION_PROPERTY}'='999999999999999')"
    )
    spark.sql(f"INSERT INTO {history.runs_table} SELECT {ghost}")

    exported_to_the_end(spark, own_store, history)

    assert_lake_equals_feed(spark, own_store, history)  # no ghost, every run, position from 0
