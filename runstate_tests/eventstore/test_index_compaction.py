"""The archive packs run_events' run-keyed b-trees again once the table has grown (pg_indexes.py): their
sizes, a rebuild killed midway, writers beside a rebuild, and a hash-partitioned table."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from runstate.eventstore import EventType, PostgresEventStore
from runstate.eventstore.pg_indexes import REBUILD_FROM_ROWS, RUN_KEYED_INDEXES, compact_run_keyed_indexes
from runstate_tests.support.events import ev


def connect(dsn: str, schema: str) -> psycopg.Connection:
    return psycopg.connect(dsn, autocommit=True, options=f"-c search_path={schema}")


def fill_runs(dsn: str, schema: str, runs: int, first: int = 0, per_run: int = 100) -> None:
    """`runs` runs of `per_run` events, inserted on the server as concurrent runs append them: batches of 10
    events, the runs taking turns in a shuffled order, so that each run's keys land in the middle of the
    run-keyed indexes, away from its last batch's."""
    with connect(dsn, schema) as conn:
        conn.execute(
            "INSERT INTO run_events (run_id, run_seq, event_type, idempotency_key, emitted_at, position)"
            " SELECT 'run-' || md5(r::text), s, 'StepCompleted', decode(md5(r || ':' || s) || md5(s || '/' || r),"
            " 'hex'), now(), (pg_current_xact_id()::text::bigint << 20) + row_number() OVER ()"
            " FROM generate_series(%s::int, %s::int) r, generate_series(1, %s) s"
            " ORDER BY (s - 1) / 10, md5(r || '/'), s",
            (first, first + runs - 1, per_run),
        )
        # The INSERT's counts reach pg_stat_user_tables when this backend flushes them, which it may put
        # off (up to 10 s, or until it closes) under load. Flushed after the ANALYZE they would be added to
        # the live rows it counted: n_live_tup doubled, and a compaction due that is not. Flush them first.
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("ANALYZE run_events")


def sizes(dsn: str, schema: str) -> dict[str, int]:
    with connect(dsn, schema) as conn:
        return {
            index: conn.execute("SELECT pg_relation_size(to_regclass(%s))", (index,)).fetchone()[0]
            for index in RUN_KEYED_INDEXES
        }


def builds(dsn: str, schema: str) -> dict[str, tuple[int, object]]:
    with connect(dsn, schema) as conn:
        rows = conn.execute("SELECT index_name, rows_at_build, built_at FROM index_builds").fetchall()
    return {name: (rows_at_build, built_at) for name, rows_at_build, built_at in rows}


def invalid_indexes(dsn: str, schema: str) -> list[str]:
    with connect(dsn, schema) as conn:
        return [
            name
            for (name,) in conn.execute(
                "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND NOT i.indisvalid",
                (schema,),
            )
        ]


def test_the_archive_packs_the_run_keyed_indexes_once_the_table_has_grown(pg_store, pg_database, pg_schema):
    runs = REBUILD_FROM_ROWS // 100 + 100
    fill_runs(pg_database, pg_schema, runs)
    before = sizes(pg_database, pg_schema)

    pg_store.archive(older_than_days=30)

    after = sizes(pg_database, pg_schema)
    first = builds(pg_database, pg_schema)
    assert set(first) == set(RUN_KEYED_INDEXES)
    # Sparse pages packed to the b-tree's 90 %: here 0.82 and 0.72 of the sizes (sizes, not timings).
    assert all(after[index] < before[index] for index in RUN_KEYED_INDEXES), (before, after)
    assert sum(after.values()) < 0.85 * sum(before.values()), (before, after)
    assert all(first[index][0] >= runs * 100 for index in RUN_KEYED_INDEXES)

    pg_store.archive(older_than_days=30)  # the table has not grown: nothing is rebuilt
    assert builds(pg_database, pg_schema) == first

    fill_runs(pg_database, pg_schema, runs // 3, first=runs)  # a third more rows: due again
    pg_store.archive(older_than_days=30)
    again = builds(pg_database, pg_schema)
    assert all(again[index][0] > first[index][0] for index in RUN_KEYED_INDEXES)
    assert pg_store.append(ev("after", EventType.RUN_STARTED)).run_seq == 1


def test_a_killed_rebuild_leaves_nothing_behind_and_writers_never_wait(pg_store, pg_database, pg_schema):
    fill_runs(pg_database, pg_schema, 50)
    pg_store.append(ev("kept", EventType.RUN_STARTED))
    failed: list[BaseException] = []

    def compact() -> None:
        try:
            compact_run_keyed_indexes(pg_store.datastore, from_rows=1)
        except psycopg.Error as exc:
            failed.append(exc)

    # An open transaction that has written to run_events holds the rebuild in its wait for writers, with
    # its new copy of the index already in the catalog.
    with connect(pg_database, pg_schema) as blocker, connect(pg_database, pg_schema) as admin:
        blocker.execute("BEGIN")
        blocker.execute("DELETE FROM run_events WHERE run_id = 'kept'")
        rebuild = threading.Thread(target=compact)
        rebuild.start()
        pid = wait_for_waiting_reindex(admin)
        assert any(name.endswith("_ccnew") for name in invalid_indexes(pg_database, pg_schema))
        # Appends go on beside the rebuild (its lock does not stop writers).
        assert pg_store.append(ev("beside", EventType.RUN_STARTED)).run_seq == 1
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        rebuild.join(timeout=60)
        blocker.execute("ROLLBACK")
    assert failed and not rebuild.is_alive()
    assert invalid_indexes(pg_database, pg_schema)  # the interrupted copy is still there

    rebuilt = compact_run_keyed_indexes(pg_store.datastore, from_rows=1)

    assert [r.index for r in rebuilt] == list(RUN_KEYED_INDEXES)
    assert invalid_indexes(pg_database, pg_schema) == []
    # The rebuilt unique index still holds each key once: the same append again is a duplicate.
    assert pg_store.append(ev("kept", EventType.RUN_STARTED)).idempotent
    assert [e.run_seq for e in pg_store.fetch("beside")] == [1]


def wait_for_waiting_reindex(admin: psycopg.Connection, timeout_s: float = 60) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND query LIKE 'REINDEX INDEX CONCURRENTLY%%' AND wait_event_type = 'Lock'"
        ).fetchone()
        if row:
            return row[0]
        time.sleep(0.05)
    pytest.fail("the rebuild never waited for the open writer")


def test_a_hash_partitioned_table_is_packed_partition_by_partition(pg_database, pg_schema):
    store = PostgresEventStore(pg_database, schema=pg_schema, partitions=4)
    store.ensure_schema()
    fill_runs(pg_database, pg_schema, 40)
    try:
        rebuilt = compact_run_keyed_indexes(store.datastore, from_rows=1)
        assert [r.index for r in rebuilt] == list(RUN_KEYED_INDEXES)
        assert all(r.rows >= 4000 and r.bytes_after > 0 for r in rebuilt)
        assert compact_run_keyed_indexes(store.datastore, from_rows=1) == []  # not grown since
        assert invalid_indexes(pg_database, pg_schema) == []
        assert store.append(ev("p", EventType.RUN_STARTED)).run_seq == 1
    finally:
        store.close()
