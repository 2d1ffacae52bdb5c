"""Migration 006 on a database made by main before it (d5f55a9): text idempotency keys become bytes.

The old deployment is rebuilt as main left it: files 001-005 applied and recorded with the checksums main
shipped, and events written in main's format (64-character hex keys, explicit keys of every shape, an
archived run). `runstate db upgrade` is then killed with SIGKILL after it committed the batches of
run_events and while it waits for run_events_archive, and run again: it carries on from its cursor, and
the store reads every event back as it was, and knows every old key when it is appended again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from runstate import migrations
from runstate.datastore import PostgresDatastore
from runstate.eventstore import NewEvent, PostgresEventStore, StoredEvent
from runstate.eventstore.pg_sql import key_bytes, key_text

# sha256 of the files as main (d5f55a9) shipped them: what its ledgers hold.
MAIN_FILES = {
    "001": "8b06492b3f493cde095fd93b24c22d80cf5d64edfce9f00747d138db0d82e4ce",
    "002": "8a4cae726b6b866a87b671d4d2bd764af185f47bf098d845fe33fe7f69312536",
    "003": "fb5136e7b4110c3c9fbf465f38fc8d21720161b957202dbe01f0dbe5ed2c0d67",
    "004": "0f8ef80ff20f01f82ed3f686b6218242a1ac9827e9f8211e77853aeb7d4552b0",
    "005": "96cc025e4fa58eb058b32de977180e8de9776e40dbb7ce4e547c9a36b0dc72e4",
}
RUNS = 350  # of 100 events; run-100 .. run-199 archived: 25,000 live rows, three batches of the upgrade
# Keys a caller may have given, beside the default SHA-256 hex: short, 32 bytes of text (ASCII, and 16
# two-byte characters), 64 hex digits in upper case, 64 in lower case, and other lengths and scripts.
ODD_KEYS = [
    "a1",
    "k" * 32,
    "ü" * 16,
    "AB" * 32,
    "0f" * 32,
    "x" * 31,
    "y" * 33,
    "ключ-🔑",
    "0f" * 31 + "g0",
]


def test_main_shipped_the_files_this_test_rebuilds_its_database_from():
    files = migrations.discover("postgres", "eventstore")

    assert {m.version: m.checksum for m in files if m.version in MAIN_FILES} == MAIN_FILES


def _deploy_as_main(dsn: str, schema: str, partitions: int = 0) -> None:
    """The schema and rows main's store left: files 001-005 recorded, events with text keys."""
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE SCHEMA {schema}")
        cur.execute(f"SET LOCAL search_path TO {schema}, public")
        cur.execute("SELECT set_config('runstate.event_partitions', %s, true)", (str(partitions),))
        cur.execute(
            "CREATE TABLE eventstore_migrations (version TEXT PRIMARY KEY, name TEXT NOT NULL,"
            " checksum TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        for migration in migrations.discover("postgres", "eventstore"):
            if migration.version in MAIN_FILES:
                cur.execute(migration.text)
                cur.execute(
                    "INSERT INTO eventstore_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                    (migration.version, migration.name, MAIN_FILES[migration.version]),
                )
        _write_events_as_main(cur)


def _write_events_as_main(cur: psycopg.Cursor) -> None:
    """Runs of 100 events with default keys (the SHA-256 hex of their parts), one run of odd keys, and
    archived runs; positions as 002_event_feed.sql numbered events that predate the feed."""
    events = """
      SELECT 'run-' || (g / 100) AS run_id, g %% 100 + 1 AS run_seq, 'step-' || (g %% 7) AS step_id,
             CASE WHEN g %% 100 = 0 THEN 'RunStarted' ELSE 'StepStarted' END AS event_type,
             jsonb_build_object('i', g, 'host', 'worker-3') AS event_data,
             encode(sha256(convert_to('run-' || (g / 100) || '|step-' || (g %% 7) || '|0|' || g, 'UTF8')), 'hex')
               AS idempotency_key,
             timestamptz '2026-01-01' + g * interval '1 second' AS emitted_at, g + 1 AS position
        FROM generate_series(0, %s - 1) AS g"""
    columns = "run_id, run_seq, step_id, event_type, event_data, idempotency_key, emitted_at, position"
    cur.execute(
        f"INSERT INTO run_events ({columns}) SELECT * FROM ({events}) e WHERE run_id NOT LIKE 'run-1__'",
        (RUNS * 100,),
    )
    cur.execute(
        f"INSERT INTO run_events_archive ({columns}, event_id, persisted_at, archived_at)"
        f" SELECT *, gen_random_uuid(), now(), now() FROM ({events}) e WHERE run_id LIKE 'run-1__'",
        (RUNS * 100,),
    )
    cur.execute(
        f"INSERT INTO run_events ({columns})"
        " SELECT 'odd-keys', n, NULL, 'Note', NULL, key, timestamptz '2026-02-01', 1000000 + n"
        " FROM unnest(%s::text[]) WITH ORDINALITY AS k(key, n)",
        (ODD_KEYS,),
    )
    cur.execute(
        "INSERT INTO run_streams (run_id, last_seq, event_count, first_event_at, archived_at)"
        " SELECT run_id, max(run_seq), count(*), min(emitted_at), CASE WHEN bool_or(archived) THEN now() END"
        " FROM (SELECT run_id, run_seq, emitted_at, false AS archived FROM run_events"
        "       UNION ALL SELECT run_id, run_seq, emitted_at, true FROM run_events_archive) e GROUP BY run_id"
    )


def _old_events(dsn: str, schema: str) -> list[tuple]:
    """Every event as main's tables hold it, in feed order."""
    fields = (
        "run_id, run_seq, event_id::text, idempotency_key, event_type, event_data, position, persisted_at"
    )
    with psycopg.connect(dsn, options=f"-c search_path={schema}") as conn:
        return conn.execute(
            f"SELECT {fields} FROM run_events UNION ALL SELECT {fields} FROM run_events_archive ORDER BY position"
        ).fetchall()


def _as_old_row(e: StoredEvent) -> tuple:
    return (
        e.run_id,
        e.run_seq,
        e.event_id,
        e.idempotency_key,
        e.event_type,
        e.data,
        e.position,
        e.persisted_at,
    )


def _whole_feed(store: PostgresEventStore) -> list[StoredEvent]:
    got: list[StoredEvent] = []
    while page := store.fetch_all(got[-1].position if got else 0, limit=5000):
        got.extend(page)
    return got


def _upgrade_in_a_shell(dsn: str, schema: str) -> subprocess.Popen:
    runstate = str(Path(sys.executable).parent / "runstate")
    env = {**os.environ, "RUNSTATE_PG_URL": dsn, "RUNSTATE_SCHEMA": schema}
    return subprocess.Popen(
        [runstate, "db", "upgrade", "--skip-aws"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def _waiting_for_a_lock(conn: psycopg.Connection, upgrade: subprocess.Popen, deadline_s: float = 120) -> int:
    """The backend of the upgrade once it waits for a lock (the test holds it), by polling the server."""
    deadline = time.monotonic() + deadline_s
    while True:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            " AND query LIKE '%rekey_progress%'"
        ).fetchone()
        if row:
            return row[0]
        assert upgrade.poll() is None, f"the upgrade ended first: {upgrade.communicate()[1].decode()[-2000:]}"
        assert time.monotonic() < deadline, "the upgrade never reached the archive's batches"
        time.sleep(0.05)


def _rows(dsn: str, query: str) -> Any:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query).fetchall()


def test_a_killed_upgrade_resumes_after_its_last_batch_and_every_event_reads_back(fresh_database):
    dsn, schema = fresh_database, "old"
    _deploy_as_main(dsn, schema)
    before = _old_events(dsn, schema)
    live = _rows(dsn, "SELECT count(*) FROM old.run_events")[0][0]

    with psycopg.connect(dsn) as holder:
        holder.execute("LOCK TABLE old.run_events_archive IN ACCESS EXCLUSIVE MODE")
        upgrade = _upgrade_in_a_shell(dsn, schema)
        with psycopg.connect(dsn, autocommit=True) as watcher:
            _waiting_for_a_lock(watcher, upgrade)
        upgrade.send_signal(signal.SIGKILL)
        upgrade.wait(timeout=60)
        # What the killed upgrade left, read before the lock is let go: its batches of run_events are in.
        copied = _rows(dsn, "SELECT count(*) FROM old.run_events_rekeyed")[0][0]
        cursors = dict(_rows(dsn, "SELECT from_table, run_id FROM old.rekey_progress"))
    store = PostgresDatastore(dsn, schema=schema)
    try:
        with pytest.raises(migrations.SchemaNotCurrent, match="006_binary_idempotency_keys.* not applied"):
            migrations.require_current(store, "eventstore")
    finally:
        store.close()

    again = _upgrade_in_a_shell(dsn, schema)
    out, err = again.communicate(timeout=300)

    assert upgrade.returncode == -signal.SIGKILL
    assert (copied, cursors["run_events_archive"]) == (live, "")
    assert again.returncode == 0, err.decode()
    assert "+ 006_binary_idempotency_keys" in out.decode()
    events = PostgresEventStore(dsn, schema=schema)
    try:
        events.ensure_schema()  # current: nothing to do
        assert [_as_old_row(e) for e in _whole_feed(events)] == before
        _assert_every_old_key_is_known(events, before)
    finally:
        events.close()
    assert _rows(dsn, "SELECT to_regclass('old.rekey_progress'), to_regclass('old.run_events_rekeyed')") == [
        (None, None)
    ]


def test_runs_archived_and_restored_while_the_upgrade_copies_are_in_exactly_one_table_after_it(
    fresh_database,
):
    """The upgrade's batches hold no lock between them: an archive and a restore of the previous release
    move runs after (or before) their rows were copied, and an appender adds events behind the cursor."""
    dsn, schema = fresh_database, "moving"
    _deploy_as_main(dsn, schema)
    move = (
        "WITH moved AS (DELETE FROM moving.{src} WHERE run_id = %s RETURNING *)"
        " INSERT INTO moving.{dst} ({cols}) SELECT {cols} FROM moved"
    )
    cols = (
        "run_id, run_seq, event_id, step_id, event_type, event_data, idempotency_key, emitted_at,"
        " persisted_at, position"
    )

    with psycopg.connect(dsn) as holder:
        holder.execute("LOCK TABLE moving.run_events_archive IN ACCESS EXCLUSIVE MODE")
        upgrade = _upgrade_in_a_shell(dsn, schema)
        with psycopg.connect(dsn, autocommit=True) as watcher:
            _waiting_for_a_lock(watcher, upgrade)
        upgrade.send_signal(signal.SIGKILL)
        upgrade.wait(timeout=60)
    with psycopg.connect(dsn) as writer:  # what the old release did before the upgrade ran again
        writer.execute(move.format(src="run_events", dst="run_events_archive", cols=cols), ("run-7",))
        writer.execute(move.format(src="run_events_archive", dst="run_events", cols=cols), ("run-150",))
        writer.execute(
            f"INSERT INTO moving.run_events ({cols}) SELECT 'late', 1, gen_random_uuid(), NULL, 'Note', NULL,"
            " 'late-key', now(), now(), 9000000"
        )
    before = _old_events(dsn, schema)

    again = _upgrade_in_a_shell(dsn, schema)
    _, err = again.communicate(timeout=300)

    assert again.returncode == 0, err.decode()
    events = PostgresEventStore(dsn, schema=schema)
    try:
        assert [_as_old_row(e) for e in _whole_feed(events)] == before
    finally:
        events.close()
    placed = "SELECT run_id, count(*) FROM moving.{} WHERE run_id IN ('run-7', 'run-150', 'late') GROUP BY 1"
    assert dict(_rows(dsn, placed.format("run_events"))) == {"run-150": 100, "late": 1}
    assert dict(_rows(dsn, placed.format("run_events_archive"))) == {"run-7": 100}


def _assert_every_old_key_is_known(store: PostgresEventStore, before: list[tuple]) -> None:
    """Appended again, an old event is a duplicate at its old seq: the keys the upgrade converted in SQL
    equal the ones the store converts in Python (live, and archived, which the store probes)."""
    odd = [row for row in before if row[0] == "odd-keys"]
    archived = next(row for row in before if row[0] == "run-100")
    live = next(row for row in before if row[0] == "run-7")
    for run_id, run_seq, _, key, event_type, *_ in [*odd, archived, live]:
        again = NewEvent(
            run_id=run_id, event_type=event_type, emitted_at=datetime.now(UTC), idempotency_key=key
        )
        result = store.append_batch(run_id, [again])[0]
        assert (result.run_seq, result.idempotent) == (run_seq, True), key


def test_a_partitioned_table_stays_partitioned_as_it_was(fresh_database):
    _deploy_as_main(fresh_database, "parted", partitions=3)
    before = _old_events(fresh_database, "parted")

    store = PostgresEventStore(fresh_database, schema="parted", partitions=3)
    try:
        store.ensure_schema()  # checks that run_events still has its 3 partitions

        assert [_as_old_row(e) for e in _whole_feed(store)] == before
    finally:
        store.close()


KEYS = [*ODD_KEYS, "0" * 64, "f" * 64, "é" * 16 + "x", "é" * 15 + "xx"]


@pytest.mark.parametrize("key", KEYS)
def test_a_stored_key_reads_back_as_the_key_and_only_a_hex_key_takes_32_bytes(key):
    stored = key_bytes(key)

    assert key_text(stored) == key
    assert (len(stored) == 32) == (len(key) == 64 and set(key) <= set("0123456789abcdef"))


def test_no_two_keys_are_stored_alike():
    assert len({key_bytes(key) for key in KEYS}) == len(KEYS)
