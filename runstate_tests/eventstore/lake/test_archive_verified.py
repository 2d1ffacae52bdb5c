"""An archive to the lake reads each run back from the lake before it deletes the run's rows (issue 51, HIGH
4), and a lake table belongs to one store (HIGH 5). The lake is damaged for real: a data file deleted or
truncated, a manifest or the table's metadata file deleted, a payload rewritten; two stores live in two
schemas of one database."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from runstate.config import Settings
from runstate.eventstore import ArchiveHeldBack, EventStoreError, EventType, PostgresEventStore
from runstate.eventstore.lake import HistoryConfig, export_history
from runstate.eventstore.lake.errors import ForeignHistory
from runstate.eventstore.lake.reader import HistoryCatalog
from runstate.eventstore.lake.tables import OWNER_PROPERTY
from runstate.eventstore.lake_archive import lake_reader_factory
from runstate_tests.support.events import T0, ev
from runstate_tests.support.lake import exported_to_the_end, feed_from_start, lake_events
from runstate_tests.support.spark import drop_iceberg_table

pytestmark = [pytest.mark.spark]
NOW = T0 + timedelta(days=30)


def make_store(dsn: str, spark_settings: Any, namespace: str, schema: str = "runstate") -> PostgresEventStore:
    lake = lake_reader_factory(spark_settings.pg_url, spark_settings.warehouse_dir, namespace)
    store = PostgresEventStore(dsn, schema=schema, snapshot_interval=2, archive_to="lake", lake=lake)
    store.ensure_schema()
    return store


def finished_run(store: PostgresEventStore, run_id: str, day: int = 0) -> None:
    start = day * 86_400
    store.append_batch(
        run_id,
        [
            ev(run_id, EventType.RUN_STARTED, start, data={"by": run_id}),
            ev(run_id, EventType.STEP_STARTED, start + 1, step_id="extract"),
            ev(run_id, EventType.STEP_COMPLETED, start + 2, step_id="extract", data={"rows": 7}),
            ev(run_id, EventType.RUN_COMPLETED, start + 60),
        ],
    )


def rows_in_postgres(dsn: str, run_id: str, schema: str = "runstate") -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            f"SELECT (SELECT count(*) FROM {schema}.run_events WHERE run_id = %(r)s)"
            f" + (SELECT count(*) FROM {schema}.run_events_archive WHERE run_id = %(r)s)",
            {"r": run_id},
        ).fetchone()[0]


@pytest.fixture
def two_runs(spark, migrated_database, spark_settings, history) -> Iterator[PostgresEventStore]:
    """old-a and old-b, each exported in a commit of its own (their rows in files and manifests of their
    own), on days of their own."""
    store = make_store(migrated_database, spark_settings, history.namespace)
    finished_run(store, "old-a")
    exported_to_the_end(spark, store, history)
    finished_run(store, "old-b", day=1)
    exported_to_the_end(spark, store, history)
    yield store
    store.close()


def local(path: str) -> Path:
    return Path(path.removeprefix("file:").removeprefix("//"))


def data_files_of(spark: Any, history: HistoryConfig, run_id: str) -> set[Path]:
    rows = spark.sql(f"SELECT DISTINCT _file FROM {history.events_table} WHERE run_id = '{run_id}'").collect()
    return {local(row[0]) for row in rows}


def manifests_of(spark_settings: Any, history: HistoryConfig, files: set[Path]) -> set[Path]:
    catalog = HistoryCatalog(spark_settings.pg_url, spark_settings.warehouse_dir)
    table = catalog.load(history.namespace, "run_events")
    found = {
        local(manifest.manifest_path)
        for manifest in table.current_snapshot().manifests(table.io)
        if any(local(e.data_file.file_path) in files for e in manifest.fetch_manifest_entry(table.io))
    }
    catalog.close()
    return found


def assert_only_old_b_moved(store: PostgresEventStore, dsn: str, before: list[Any], raised: Any) -> None:
    assert raised.value.moved == 4 and [run_id for run_id, _ in raised.value.unverified] == ["old-a"]
    assert rows_in_postgres(dsn, "old-a") == 4 and rows_in_postgres(dsn, "old-b") == 0
    assert store.fetch("old-a") == before


def test_a_run_whose_data_file_is_gone_keeps_its_rows_and_is_named_and_the_others_move(
    spark, two_runs, history, migrated_database
):
    before = two_runs.fetch("old-a")
    (gone,) = data_files_of(spark, history, "old-a")
    assert gone not in data_files_of(spark, history, "old-b")
    gone.unlink()

    with pytest.raises(
        ArchiveHeldBack, match=rf"run 'old-a': its events could not be read.*{gone.name}"
    ) as held:
        two_runs.archive(7, now=NOW)

    assert_only_old_b_moved(two_runs, migrated_database, before, held)
    assert "archived 4 event(s) to the lake" in str(held.value)


def test_a_truncated_data_file_keeps_the_run_in_postgres(spark, two_runs, history, migrated_database):
    before = two_runs.fetch("old-a")
    (damaged,) = data_files_of(spark, history, "old-a")
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])

    with pytest.raises(ArchiveHeldBack, match=r"run 'old-a': its events could not be read") as held:
        two_runs.archive(7, now=NOW)

    assert_only_old_b_moved(two_runs, migrated_database, before, held)


def test_a_missing_manifest_keeps_the_run_whose_files_it_lists(
    spark, spark_settings, two_runs, history, migrated_database
):
    before = two_runs.fetch("old-a")
    (manifest,) = manifests_of(spark_settings, history, data_files_of(spark, history, "old-a"))
    manifest.unlink()

    with pytest.raises(ArchiveHeldBack, match=rf"run 'old-a': .*{manifest.name}") as held:
        two_runs.archive(7, now=NOW)

    assert_only_old_b_moved(two_runs, migrated_database, before, held)


def test_a_missing_table_metadata_file_archives_nothing_and_names_it(
    spark, spark_settings, two_runs, history, migrated_database
):
    before = {run_id: two_runs.fetch(run_id) for run_id in ("old-a", "old-b")}
    catalog = HistoryCatalog(spark_settings.pg_url, spark_settings.warehouse_dir)
    metadata = local(catalog.load(history.namespace, "run_events").metadata_location)
    catalog.close()
    metadata.unlink()

    with pytest.raises(EventStoreError, match=rf"{history.events_table}.*{metadata.name}"):
        two_runs.archive(7, now=NOW)

    for run_id, events in before.items():
        assert rows_in_postgres(migrated_database, run_id) == 4 and two_runs.fetch(run_id) == events


def test_a_payload_the_lake_holds_differently_keeps_the_run_and_says_so(
    spark, two_runs, history, migrated_database
):
    before = two_runs.fetch("old-a")
    spark.sql(
        f"UPDATE {history.events_table} SET event_data = '{{\"rows\": 8}}' WHERE run_id = 'old-a' AND run_seq = 3"
    )

    with pytest.raises(
        ArchiveHeldBack, match=r"run 'old-a': the lake holds 4 of its event\(s\).*checksum"
    ) as held:
        two_runs.archive(7, now=NOW)

    assert_only_old_b_moved(two_runs, migrated_database, before, held)


@pytest.fixture
def schema_histories(spark, spark_settings) -> Iterator[tuple[HistoryConfig, HistoryConfig]]:
    """The run histories of the default schema and of schema `b`, as the settings name them (no
    RUNSTATE_HISTORY_NAMESPACE), dropped before and after: the worker's catalog is this test's alone."""
    configs = tuple(
        HistoryConfig.from_settings(Settings.from_env({"RUNSTATE_SCHEMA": schema}))
        for schema in ("runstate", "b")
    )

    def drop() -> None:
        for config in configs:
            for table in ("run_events", "runs"):
                drop_iceberg_table(spark, spark_settings.warehouse_dir, config.namespace, table)
            spark.sql(f"DROP NAMESPACE IF EXISTS lake.{config.namespace}")

    drop()
    yield configs
    drop()


def test_two_stores_in_one_database_each_export_their_own_events_into_their_own_table(
    spark, migrated_database, spark_settings, schema_histories
):
    history, other_history = schema_histories
    first = make_store(migrated_database, spark_settings, history.namespace)
    second = make_store(migrated_database, spark_settings, other_history.namespace, schema="b")
    finished_run(first, "old-a")
    finished_run(second, "old-b")
    finished_run(second, "old-c", day=1)

    exported_to_the_end(spark, first, history)
    exported_to_the_end(spark, second, other_history)

    assert (history.namespace, other_history.namespace) == ("runstate", "b")
    assert lake_events(spark, history) == feed_from_start(first)
    assert lake_events(spark, other_history) == feed_from_start(second)
    assert second.archive(7, now=NOW) == 8 and first.archive(7, now=NOW) == 4
    assert rows_in_postgres(migrated_database, "old-b", "b") == 0 and len(second.fetch("old-b")) == 4
    first.close()
    second.close()


def test_a_store_pointed_at_another_stores_table_is_refused_and_deletes_nothing(
    spark, migrated_database, spark_settings, history
):
    owner = make_store(migrated_database, spark_settings, history.namespace)
    finished_run(owner, "old-a")
    exported_to_the_end(spark, owner, history)
    stranger = make_store(migrated_database, spark_settings, history.namespace, schema="b")
    finished_run(stranger, "old-b")
    finished_run(stranger, "old-a")  # the same run id in the other store

    with pytest.raises(ForeignHistory, match=r"belongs to the event store '.*\.runstate'.*'.*\.b'"):
        list(export_history(spark, stranger, history))
    with pytest.raises(ForeignHistory, match="belongs to the event store"):
        stranger.archive(7, now=NOW)

    assert (
        rows_in_postgres(migrated_database, "old-a", "b") == 4
        and rows_in_postgres(migrated_database, "old-b", "b") == 4
    )
    assert lake_events(spark, history) == feed_from_start(owner)
    owner.close()
    stranger.close()


def test_a_table_made_before_owners_is_claimed_by_the_next_export_and_archived_only_then(
    spark, migrated_database, spark_settings, history
):
    store = make_store(migrated_database, spark_settings, history.namespace)
    finished_run(store, "old-a")
    exported_to_the_end(spark, store, history)
    for table in (history.events_table, history.runs_table):
        spark.sql(f"ALTER TABLE {table} UNSET TBLPROPERTIES ('{OWNER_PROPERTY}')")

    with pytest.raises(ForeignHistory, match="names no event store as its owner"):
        store.archive(7, now=NOW)
    assert rows_in_postgres(migrated_database, "old-a") == 4

    list(export_history(spark, store, history))
    other = make_store(migrated_database, spark_settings, history.namespace, schema="b")
    with pytest.raises(ForeignHistory):
        list(export_history(spark, other, history))
    assert store.archive(7, now=NOW) == 4 and rows_in_postgres(migrated_database, "old-a") == 0
    other.close()
    store.close()
