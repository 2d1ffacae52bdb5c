"""Postgres-only behaviour: hash partitioning, one statement per batch, a killed writer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from runstate.eventstore import EventStoreError, EventType, PostgresEventStore
from runstate_tests.support.events import ev


def test_hash_partitioned_run_events(pg_database, pg_schema):
    store = PostgresEventStore(pg_database, schema=pg_schema, partitions=4)
    store.ensure_schema()
    store.ensure_schema()
    for n in range(20):
        store.append_batch(f"run-{n}", [ev(f"run-{n}", EventType.RUN_STARTED), ev(f"run-{n}", "Tick", 1)])

    with psycopg.connect(pg_database) as conn:
        parts = conn.execute(
            "SELECT c.relname, (SELECT count(*) FROM pg_inherits) FROM pg_inherits i"
            " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s) ORDER BY 1",
            (f"{pg_schema}.run_events",),
        ).fetchall()
        used = conn.execute(f'SELECT count(DISTINCT tableoid) FROM "{pg_schema}".run_events').fetchone()[0]
    assert [p[0] for p in parts] == [f"run_events_p{i}" for i in range(4)]
    assert used > 1
    assert store.append(ev("run-3", EventType.RUN_STARTED)).idempotent
    assert [e.run_seq for e in store.fetch("run-3")] == [1, 2]
    store.close()


def index_names(dsn: str, table: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = %s::regclass", (table,)
        )
        return {name.rsplit(".", 1)[-1] for (name,) in rows}


@pytest.mark.parametrize("partitions", [0, 4])
def test_run_events_keeps_the_keys_the_feed_and_event_type_indexes_and_no_gin(
    pg_database, pg_schema, partitions
):
    """Migration 009 drops the seed's GIN on event_data (no query of runstate searches payloads), on a
    plain and on a hash-partitioned table alike; the unique keys, the feed's position and event_type stay."""
    store = PostgresEventStore(pg_database, schema=pg_schema, partitions=partitions)
    store.ensure_schema()
    store.close()
    assert index_names(pg_database, f"{pg_schema}.run_events") == {
        "run_events_pkey",
        "run_events_run_id_idempotency_key_key",
        "idx_run_events_event_type",
        "idx_run_events_position",
    }


def test_partitioning_cannot_be_switched_on_an_existing_table(pg_store, pg_database, pg_schema):
    with pytest.raises(EventStoreError, match="already exists with 0 hash partitions"):
        PostgresEventStore(pg_database, schema=pg_schema, partitions=4).ensure_schema()


def test_bad_schema_name_is_rejected(pg_database):
    with pytest.raises(ValueError):
        PostgresEventStore(pg_database, schema='x"; DROP TABLE y; --')


WRITER = """
import sys
from datetime import datetime, timezone
from runstate.eventstore import NewEvent, PostgresEventStore
store = PostgresEventStore(sys.argv[1], schema=sys.argv[2], snapshot_interval=7)
t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
for b in range(100000):
    events = [NewEvent("victim", "Tick", t0, idempotency_key=f"k{b}-{i}", data={"b": b}) for i in range(5)]
    store.append_batch("victim", events)
"""


def wait_until_backend_gone(dsn: str, application_name: str) -> None:
    """A killed client's COMMIT may still be running on the server; its backend ends only after it."""
    deadline = time.monotonic() + 30
    with psycopg.connect(dsn, autocommit=True) as conn:
        while conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
            (application_name,),
        ).fetchone()[0]:
            assert time.monotonic() < deadline, f"the backend of {application_name} is still there"
            time.sleep(0.05)


def test_killed_writer_leaves_a_consistent_log(pg_store, pg_database):
    writer_dsn = make_conninfo(pg_database, application_name="killed-writer")
    child = subprocess.Popen([sys.executable, "-c", WRITER, writer_dsn, pg_store.schema])
    try:
        deadline = time.monotonic() + 60
        while len(pg_store.fetch("victim", limit=300)) < 300:  # wait for real progress, then kill mid-stream
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    wait_until_backend_gone(pg_database, "killed-writer")

    events = pg_store.fetch("victim", limit=1_000_000)
    seqs = [e.run_seq for e in events]
    with psycopg.connect(pg_database) as conn:
        last_seq, count = conn.execute(
            f'SELECT last_seq, event_count FROM "{pg_store.schema}".run_streams WHERE run_id = %s',
            ("victim",),
        ).fetchone()
    assert seqs == list(range(1, len(seqs) + 1))
    assert len(seqs) % 5 == 0  # whole batches only
    assert (last_seq, count) == (len(seqs), len(seqs))
    batch = len(seqs) // 5  # the batch in flight when killed: retried, it lands whole and once
    retried = pg_store.append_batch(
        "victim", [ev("victim", "Tick", 0, key=f"k{b}-{i}") for b in (batch - 1, batch) for i in range(5)]
    )
    assert [r.idempotent for r in retried] == [True] * 5 + [False] * 5
    assert [r.run_seq for r in retried[5:]] == list(range(len(seqs) + 1, len(seqs) + 6))
    assert pg_store.resume("victim").run_snapshot("victim").last_event_seq == len(seqs) + 5
