"""Exporting the feed into the lake on the shared Spark session: what lands, what a repeat writes, and
what the conditional commit refuses."""

from __future__ import annotations

import random
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from runstate.eventstore import NewEvent, PostgresEventStore
from runstate.eventstore.lake import (
    EventsCommitted,
    FeedRefused,
    HistoryConflict,
    HistoryError,
    export,
    export_history,
    source,
)
from runstate.eventstore.lake.export import commit_events
from runstate.eventstore.lake.reader import HistoryCatalog, table_position
from runstate.eventstore.lake.source import next_range
from runstate.eventstore.lake.tables import ensure_tables, events_position
from runstate.eventstore.validation import EARLIEST_EMITTED_AT, LATEST_EMITTED_AT
from runstate_tests.support.lake import (
    SMALL_BATCHES,
    append_randomly,
    assert_lake_equals_feed,
    exported_to_the_end,
    feed_from_start,
    lake_events,
)

pytestmark = [pytest.mark.spark]


def snapshots(spark, ident: str) -> int:
    return spark.table(f"{ident}.snapshots").count()


def test_an_export_lands_every_event_once_and_a_repeat_writes_nothing(spark, own_store, history):
    append_randomly(own_store, random.Random(7), runs=6, appends=30)

    history = replace(history, batch_events=SMALL_BATCHES)
    steps = exported_to_the_end(spark, own_store, history)
    before = snapshots(spark, history.events_table), snapshots(spark, history.runs_table)
    again = list(export_history(spark, own_store, history))

    feed = assert_lake_equals_feed(spark, own_store, history)
    commits = [step for step in steps if type(step).__name__ == "EventsCommitted"]
    assert len(commits) >= 2 and sum(step.events for step in commits) == len(feed)
    assert commits[-1].position == feed[-1].position
    assert (
        again == []
        and (snapshots(spark, history.events_table), snapshots(spark, history.runs_table)) == before
    )


def test_a_later_export_of_new_runs_only_merges_them(spark, own_store, history):
    """The second merge looks for stored rows of its runs and finds none: every run is new."""
    append_randomly(own_store, random.Random(14), runs=2, appends=4)
    exported_to_the_end(spark, own_store, history)
    own_store.append(NewEvent(run_id="brand-new", event_type="RunStarted", emitted_at=datetime.now(UTC)))

    steps = exported_to_the_end(spark, own_store, history)

    assert [type(step).__name__ for step in steps] == ["EventsCommitted", "RunsMerged"]
    assert steps[-1].runs == 1
    assert_lake_equals_feed(spark, own_store, history)


def test_once_commits_one_batch(spark, own_store, history):
    append_randomly(own_store, random.Random(8), runs=3, appends=30)

    history = replace(history, batch_events=SMALL_BATCHES)
    steps = list(export_history(spark, own_store, history, once=True))

    assert [type(step).__name__ for step in steps] == ["EventsCommitted", "RunsMerged"]
    assert steps[0].events == history.batch_events
    assert len(lake_events(spark, history)) == history.batch_events


def test_a_stale_export_is_refused_at_its_commit_and_writes_nothing(spark, own_store, history):
    append_randomly(own_store, random.Random(9), runs=3, appends=5)
    ensure_tables(spark, history)
    snapshot_id, after = events_position(spark, history)
    batch = next_range(own_store, after, 1000)
    commit_events(spark, own_store, history, snapshot_id, batch)  # the export that won

    with pytest.raises(HistoryConflict, match="another export committed while this one ran"):
        commit_events(spark, own_store, history, snapshot_id, batch)  # one that read the same position

    assert lake_events(spark, history) == own_store.fetch_all(after, 1000)


@pytest.mark.parametrize("once", [False, True], ids=["to-the-end", "once"])
def test_an_export_beaten_to_a_commit_carries_on_from_the_winners_position(
    spark, own_store, history, monkeypatch, once
):
    """Another export commits the very batch this one read the feed for: this one's commit is refused, and
    it goes on from the position the winner reached (`--once` stops there, with the conflict)."""
    append_randomly(own_store, random.Random(16), runs=3, appends=30)
    history = replace(history, batch_events=SMALL_BATCHES)
    raced = []

    def beaten(feed, after, limit):
        batch = next_range(feed, after, limit)
        if batch is not None and not raced:  # the other export commits first, from the same position
            raced.append(batch)
            snapshot_id, _ = events_position(spark, history)
            commit_events(spark, feed, history, snapshot_id, batch)
        return batch

    ensure_tables(spark, history)
    monkeypatch.setattr(export, "next_range", beaten)
    if once:
        with pytest.raises(HistoryConflict):
            list(export_history(spark, own_store, history, once=True))
        assert lake_events(spark, history) == own_store.fetch_all(0, history.batch_events)
        return
    steps = list(export_history(spark, own_store, history))

    commits = [step for step in steps if isinstance(step, EventsCommitted)]
    assert commits and commits[0].from_position == raced[0].upto  # not the batch the winner committed
    assert_lake_equals_feed(spark, own_store, history)


def _first_batch(spark, store, history, rng: random.Random):
    """Events in the store and the lake's tables made: the lake's snapshot and the feed's first batch."""
    append_randomly(store, rng, runs=2, appends=3)
    ensure_tables(spark, history)
    snapshot_id, after = events_position(spark, history)
    return snapshot_id, next_range(store, after, 1000)


def test_a_batch_read_that_postgres_holds_up_fails_within_the_timeout_and_writes_nothing(
    spark, own_store, history, monkeypatch
):
    snapshot_id, batch = _first_batch(spark, own_store, history, random.Random(15))
    monkeypatch.setattr(source, "JDBC_QUERY_TIMEOUT_S", 2)

    with psycopg.connect(own_store.datastore.conninfo) as blocker:
        blocker.execute("LOCK TABLE run_events IN ACCESS EXCLUSIVE MODE")
        began = time.monotonic()
        with pytest.raises(HistoryError, match="append to .*run_events failed.*canceling statement"):
            commit_events(spark, own_store, history, snapshot_id, batch)
        waited = time.monotonic() - began

    assert waited < 60 and lake_events(spark, history) == []


def test_a_jdbc_driver_spark_cannot_load_is_named_with_how_to_install_it(
    spark, own_store, history, monkeypatch
):
    # A machine without the Postgres JDBC jar: Spark's JDBC source fails to load the driver class.
    snapshot_id, batch = _first_batch(spark, own_store, history, random.Random(16))
    monkeypatch.setattr(source, "JDBC_DRIVER", "org.example.NoSuchDriver")

    with pytest.raises(HistoryError) as refused:
        commit_events(spark, own_store, history, snapshot_id, batch)

    assert "cannot load the Postgres JDBC driver (org.example.NoSuchDriver)" in str(refused.value)
    assert "libpostgresql-jdbc-java" in str(refused.value) and "RUNSTATE_JDBC_JAR" in str(refused.value)
    assert lake_events(spark, history) == []


def test_a_compaction_between_read_and_commit_does_not_refuse_the_export(spark, own_store, history):
    append_randomly(own_store, random.Random(10), runs=3, appends=6)
    exported_to_the_end(spark, own_store, history)
    snapshot_id, after = events_position(spark, history)
    spark.sql(
        f"CALL lake.system.rewrite_data_files(table => '{history.namespace}.run_events', "
        "options => map('min-input-files', '1', 'rewrite-all', 'true'))"
    ).collect()
    append_randomly(own_store, random.Random(11), runs=3, appends=3)

    commit_events(spark, own_store, history, snapshot_id, next_range(own_store, after, 1000))

    assert lake_events(spark, history) == feed_from_start(own_store)


def test_the_position_outlives_compaction_and_expiry_of_the_export_snapshots(
    spark, spark_settings, own_store, history
):
    append_randomly(own_store, random.Random(12), runs=4, appends=20)
    exported_to_the_end(spark, own_store, history)
    reached = feed_from_start(own_store)[-1].position
    table = f"{history.namespace}.run_events"
    spark.sql(
        f"CALL lake.system.rewrite_data_files(table => '{table}', "
        "options => map('min-input-files', '1', 'rewrite-all', 'true'))"
    )
    now = datetime.now(UTC) + timedelta(seconds=1)
    spark.sql(
        f"CALL lake.system.expire_snapshots(table => '{table}', older_than => TIMESTAMP '{now:%Y-%m-%d %H:%M:%S}', "
        "retain_last => 1)"
    ).collect()
    assert [
        row.operation for row in spark.sql(f"SELECT operation FROM lake.{table}.snapshots").collect()
    ] == ["replace"]

    catalog = HistoryCatalog.from_spark_settings(spark_settings)
    try:
        pyiceberg_position = table_position(catalog.load(history.namespace, "run_events"))
    finally:
        catalog.close()
    assert events_position(spark, history)[1] == pyiceberg_position == reached
    append_randomly(own_store, random.Random(13), runs=4, appends=5)
    exported_to_the_end(spark, own_store, history)
    assert_lake_equals_feed(spark, own_store, history)


def test_timestamps_at_both_ends_of_what_the_store_keeps_round_trip(spark, own_store, history):
    for when in (EARLIEST_EMITTED_AT, LATEST_EMITTED_AT):
        own_store.append(NewEvent(run_id=f"edge-{when.year}", event_type="RunStarted", emitted_at=when))

    exported_to_the_end(spark, own_store, history)

    assert_lake_equals_feed(spark, own_store, history)


def test_every_kind_of_key_payload_and_archived_event_round_trips(spark, own_store, history):
    """The JDBC read converts on the server: the key bytes back to the API's text (a hex key, a text key
    of exactly 32 bytes, which carries a marker byte, any other text), jsonb to its text, UUIDs to text;
    and it reads archived events as well as live ones."""
    keys = ("ab" * 32, "k" * 32, "é-ключ-" + "x" * 20, "short")
    for index, key in enumerate(keys):
        own_store.append(
            NewEvent(
                run_id="keys",
                event_type="StepFailed",
                step_id="s",
                emitted_at=datetime(2026, 3, 1, tzinfo=UTC) + timedelta(seconds=index),
                data={"error": {"text": "naïve ✓", "n": [1, 2.5, None, True]}, "k": index},
                idempotency_key=key,
                engine_run_ref={"dagster_run": "abc"},
                caused_by_signal_id=None if index else "00000000-0000-4000-8000-000000000001",
            )
        )
    own_store.append(
        NewEvent(run_id="old", event_type="RunStarted", emitted_at=datetime(2020, 1, 1, tzinfo=UTC))
    )
    own_store.append(
        NewEvent(run_id="old", event_type="RunCompleted", emitted_at=datetime(2020, 1, 2, tzinfo=UTC))
    )
    assert own_store.archive(0, now=datetime.now(UTC) + timedelta(days=1)) == 2  # the events of "old"

    exported_to_the_end(spark, own_store, history)

    lake = assert_lake_equals_feed(spark, own_store, history)
    assert [event.idempotency_key for event in lake if event.run_id == "keys"] == list(keys)
    assert {event.run_id for event in lake} == {"keys", "old"}


def test_a_hash_partitioned_store_exports_every_event_once(spark, fresh_database, history):
    """feed_bound and the JDBC ranges read each partition's position index (the store's partitions=N)."""
    store = PostgresEventStore(fresh_database, schema="runstate", partitions=4)
    store.ensure_schema()
    try:
        append_randomly(store, random.Random(16), runs=8, appends=25)
        exported_to_the_end(spark, store, replace(history, batch_events=SMALL_BATCHES))
        assert_lake_equals_feed(spark, store, history)
    finally:
        store.close()


def test_a_snowflake_store_is_refused_before_anything_is_created(spark, sf_store, history):
    with pytest.raises(FeedRefused, match="Snowflake feed has no commit-ordered high-water mark"):
        list(export_history(spark, sf_store, history))

    assert not spark.catalog.tableExists(history.events_table)
