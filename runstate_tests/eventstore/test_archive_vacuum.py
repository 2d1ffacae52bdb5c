"""After the archive, run_events gives its dead rows back: autovacuum is due, and VACUUM cleans the indexes.

1 % of 200 runs of 100 events is archived, as the daily job does; the archived rows then sit in 1.3 % of
the table's pages. Postgres's defaults left them there: autovacuum waited for 20 % of the table to be
dead, and VACUUM skipped the indexes ("index scan bypassed") because under 2 % of the pages held dead rows.
"""

from __future__ import annotations

import re
import time

import psycopg
import pytest

from runstate.eventstore import PostgresEventStore

RUNS = 200  # of 100 events: every 100th finished 100 days ago


def _settings(conn: psycopg.Connection) -> dict[str, str]:
    (options,) = conn.execute("SELECT reloptions FROM pg_class WHERE oid = 'run_events'::regclass").fetchone()
    return dict(option.split("=", 1) for option in options or [])


def _dead_rows_counted(conn: psycopg.Connection, at_least: int, deadline_s: float = 60) -> int:
    """n_dead_tup once the archiving backend has reported its deletes (as it exits)."""
    deadline = time.monotonic() + deadline_s
    while True:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        (dead,) = conn.execute(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'run_events'::regclass"
        ).fetchone()
        if dead >= at_least or time.monotonic() > deadline:
            return dead
        time.sleep(0.1)


@pytest.fixture
def archived(pg_database: str, pg_schema: str):
    """A store of 200 runs (written on the server, run after run, as appends lay them out), two of them
    finished 100 days ago and archived; autovacuum kept off the table so that the test's own VACUUM
    finds the dead rows."""
    store = PostgresEventStore(pg_database, schema=pg_schema)
    store.ensure_schema()
    with psycopg.connect(pg_database, autocommit=True, options=f"-c search_path={pg_schema}") as conn:
        conn.execute("ALTER TABLE run_events SET (autovacuum_enabled = off)")
        conn.execute(
            """INSERT INTO run_events (run_id, run_seq, step_id, event_type, event_data, idempotency_key,
                                       emitted_at, position)
               SELECT 'run-' || g / 100, g %% 100 + 1, 's' || g %% 100, 'StepStarted',
                      jsonb_build_object('i', g %% 100, 'host', 'worker-3'), sha256(int8send(g)), now(), g + 1
               FROM generate_series(0, %s - 1) AS g""",
            (RUNS * 100,),
        )
        conn.execute(
            """INSERT INTO run_streams (run_id, last_seq, event_count, completed_at)
               SELECT 'run-' || r, 100, 100, now() - CASE WHEN r %% 100 = 0 THEN interval '100 days' END
               FROM generate_series(0, %s - 1) AS r""",
            (RUNS,),
        )
        moved = store.archive(older_than_days=30)
        store.close()  # its sessions end and report their deletes to the statistics
        yield conn, moved


def test_autovacuum_is_due_after_one_archive_of_one_percent(archived):
    conn, moved = archived

    dead = _dead_rows_counted(conn, at_least=moved)
    settings = _settings(conn)
    threshold = float(settings.get("autovacuum_vacuum_threshold", 50))
    scale = float(settings.get("autovacuum_vacuum_scale_factor", 0.2))
    (rows,) = conn.execute("SELECT reltuples FROM pg_class WHERE oid = 'run_events'::regclass").fetchone()

    assert moved == 200 and dead >= moved
    # autovacuum's own rule (the daemon wakes once a minute; the test does not wait for it).
    assert dead > threshold + scale * max(rows, RUNS * 100)


def test_vacuum_after_the_archive_removes_the_dead_rows_from_every_index(archived):
    conn, _ = archived
    messages: list[str] = []
    conn.add_notice_handler(lambda notice: messages.append(notice.message_primary or ""))

    conn.execute("VACUUM (VERBOSE) run_events")

    report = next(m for m in messages if re.search(r'finished vacuuming "[^"]*\.run_events"', m))
    assert "index scan bypassed" not in report
    assert re.search(r"index scans: [1-9]", report)
    assert re.search(r"had 200 dead item identifiers removed", report)


def test_a_partitioned_run_events_has_the_settings_on_every_partition(pg_database, pg_schema):
    store = PostgresEventStore(pg_database, schema=pg_schema, partitions=3)
    store.ensure_schema()
    store.close()
    with psycopg.connect(pg_database) as conn:
        rows = conn.execute(
            "SELECT relid::text, (SELECT reloptions FROM pg_class WHERE oid = relid) FROM pg_partition_tree(%s)"
            " WHERE isleaf",
            (f"{pg_schema}.run_events",),
        ).fetchall()

    assert len(rows) == 3
    assert all({"vacuum_index_cleanup=on", "autovacuum_vacuum_scale_factor=0.005"} <= set(o) for _, o in rows)
