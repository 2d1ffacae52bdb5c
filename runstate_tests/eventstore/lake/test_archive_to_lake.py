"""Archived runs (issue 41): archive, then fetch, project and resume, then restore, row for row as before,
with RUNSTATE_ARCHIVE_TO=postgres (run_events_archive) and =lake (dropped from Postgres once the lake has
them, read back with LakeRunReader)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from runstate.eventstore import ArchiveHeldBack, EventStoreError, EventType, PostgresEventStore
from runstate.eventstore.lake import HistoryConfig
from runstate.eventstore.lake_archive import lake_reader_factory
from runstate_tests.support.events import T0, ev
from runstate_tests.support.lake import exported_to_the_end

pytestmark = [pytest.mark.spark]
NOW = T0 + timedelta(days=30)
OLD = ("old-a", "old-b")


def make_store(dsn: str, spark_settings: Any, namespace: str, archive_to: str) -> PostgresEventStore:
    lake = lake_reader_factory(spark_settings.pg_url, spark_settings.warehouse_dir, namespace)
    store = PostgresEventStore(dsn, schema="runstate", snapshot_interval=2, archive_to=archive_to, lake=lake)
    store.ensure_schema()
    return store


@pytest.fixture(params=["postgres", "lake"])
def archive_to(request) -> str:
    return request.param


@pytest.fixture
def store(migrated_database, spark_settings, history, archive_to) -> Iterator[PostgresEventStore]:
    """A store in a database of the test's own (its feed waits on no other test's transaction), archiving
    to `archive_to`, whose lake is the test's namespace in the worker's catalog."""
    store = make_store(migrated_database, spark_settings, history.namespace, archive_to)
    yield store
    store.close()


def append_runs(store: PostgresEventStore) -> None:
    """Two finished runs of a few events each (state snapshots among them) and one still running."""
    for run_id in OLD:
        store.append_batch(
            run_id,
            [
                ev(run_id, EventType.RUN_STARTED, data={"by": run_id}),
                ev(run_id, EventType.STEP_STARTED, 1, step_id="extract"),
                ev(run_id, EventType.STEP_COMPLETED, 2, step_id="extract", data={"rows": 7}),
            ],
        )
        store.append(ev(run_id, EventType.RUN_COMPLETED, 60))
    store.append(ev("live", EventType.RUN_STARTED))


def rows_in_postgres(dsn: str, run_id: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT (SELECT count(*) FROM runstate.run_events WHERE run_id = %(r)s)"
            " + (SELECT count(*) FROM runstate.run_events_archive WHERE run_id = %(r)s)",
            {"r": run_id},
        ).fetchone()[0]


def live_rows(dsn: str, run_id: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT count(*) FROM runstate.run_events WHERE run_id = %s", (run_id,)
        ).fetchone()[0]


def test_archive_then_read_then_restore_gives_every_row_back(
    spark, store, history, migrated_database, archive_to
):
    append_runs(store)
    exported_to_the_end(spark, store, history)
    before = {run_id: store.fetch(run_id) for run_id in OLD}
    projected = {run_id: store.rebuild(run_id).to_dict() for run_id in OLD}

    moved = store.archive(7, now=NOW)

    assert moved == 8
    assert [rows_in_postgres(migrated_database, r) for r in OLD] == (
        [0, 0] if archive_to == "lake" else [4, 4]
    )
    for run_id in OLD:
        assert store.fetch(run_id) == before[run_id]
        assert store.fetch(run_id, after_seq=1, limit=2) == before[run_id][1:3]
        assert store.rebuild(run_id).to_dict() == projected[run_id]
        assert store.project(run_id).to_dict() == projected[run_id]
        resumed = store.resume(run_id)
        assert resumed.events == before[run_id] and resumed.run_snapshot(run_id).status == "COMPLETED"
        assert store.max_seq(run_id) == 4
    assert len(store.fetch("live")) == 1

    restored = store.restore("old-a")
    again = store.restore("old-a")

    assert (restored, again) == (4, 0)
    assert live_rows(migrated_database, "old-a") == 4
    assert store.fetch("old-a") == before["old-a"]
    assert store.fetch("old-b") == before["old-b"]  # still archived
    assert store.archive(7, now=NOW) == 0  # a restored run stays live for one archive age


def test_an_append_to_a_run_archived_to_the_lake_knows_its_keys_and_reads_on(
    spark, migrated_database, spark_settings, history
):
    store = make_store(migrated_database, spark_settings, history.namespace, "lake")
    append_runs(store)
    exported_to_the_end(spark, store, history)
    before = store.fetch("old-a")
    store.archive(7, now=NOW)

    retried = store.append(ev("old-a", EventType.RUN_COMPLETED, 60))
    late = store.append(ev("old-a", "Note", 90, key="late-note"))

    assert retried.idempotent and retried.run_seq == 4
    assert late.run_seq == 5 and not late.idempotent
    after = store.fetch("old-a")
    assert after[:4] == before and after[4].idempotency_key == "late-note"
    assert store.fetch("old-a", after_seq=3, limit=5) == after[3:]
    assert store.restore("old-a") == 4 and store.fetch("old-a") == after
    store.close()


def test_a_run_the_lake_lacks_stays_in_postgres_and_is_named(
    spark, migrated_database, spark_settings, history
):
    store = make_store(migrated_database, spark_settings, history.namespace, "lake")
    append_runs(store)
    exported_to_the_end(spark, store, history)
    store.append(ev("old-b", "Note", 70, key="after-the-export"))  # old-b's newest event is not in the lake

    with pytest.raises(
        ArchiveHeldBack, match=r"archived 4 event\(s\) to the lake; 1 run\(s\) stay.*'old-b'"
    ) as held:
        store.archive(7, now=NOW)

    assert held.value.moved == 4 and [run_id for run_id, _ in held.value.held_back] == ["old-b"]
    assert rows_in_postgres(migrated_database, "old-a") == 0 and live_rows(migrated_database, "old-b") == 5
    exported_to_the_end(spark, store, history)
    assert store.archive(7, now=NOW) == 5 and rows_in_postgres(migrated_database, "old-b") == 0
    store.close()


def test_a_restore_killed_halfway_left_nothing_and_a_repeat_does_it_all(
    spark, migrated_database, spark_settings, history, monkeypatch
):
    store = make_store(migrated_database, spark_settings, history.namespace, "lake")
    append_runs(store)
    exported_to_the_end(spark, store, history)
    before = store.fetch("old-a")
    store.archive(7, now=NOW)
    insert = store.backend.restore_from_lake

    def killed(tx: Any, run_id: str, events: Any) -> int:
        insert(tx, run_id, events)  # the rows went in, then the process died before the commit
        raise EventStoreError("killed")

    monkeypatch.setattr(store.backend, "restore_from_lake", killed)
    with pytest.raises(EventStoreError, match="killed"):
        store.restore("old-a")
    monkeypatch.undo()

    assert rows_in_postgres(migrated_database, "old-a") == 0 and store.fetch("old-a") == before
    assert store.restore("old-a") == 4 and store.restore("old-a") == 0
    assert store.fetch("old-a") == before and live_rows(migrated_database, "old-a") == 4
    store.close()


def test_a_lake_that_lacks_an_archived_run_is_refused_and_nothing_changes(
    spark, migrated_database, spark_settings, history
):
    store = make_store(migrated_database, spark_settings, history.namespace, "lake")
    append_runs(store)
    exported_to_the_end(spark, store, history)
    store.archive(7, now=NOW)
    elsewhere = make_store(
        migrated_database, spark_settings, HistoryConfig(namespace="no_such_ns").namespace, "lake"
    )

    with pytest.raises(EventStoreError, match=r"archived in the lake with 4 event\(s\).*the lake holds 0"):
        elsewhere.fetch("old-a")
    with pytest.raises(EventStoreError, match="the lake holds 0"):
        elsewhere.restore("old-a")

    assert rows_in_postgres(migrated_database, "old-a") == 0 and len(store.fetch("old-a")) == 4
    elsewhere.close()
    store.close()


def test_a_store_that_cannot_reach_the_lake_says_so(migrated_database):
    store = PostgresEventStore(migrated_database, schema="runstate", archive_to="lake")  # no lake given
    store.ensure_schema()

    with pytest.raises(EventStoreError, match="no lake to read from"):
        store.archive(7, now=NOW)
    store.close()


def test_archive_to_must_be_postgres_or_lake(migrated_database):
    with pytest.raises(ValueError, match="archive_to must be one of postgres, lake, got 's3'"):
        PostgresEventStore(migrated_database, archive_to="s3")
