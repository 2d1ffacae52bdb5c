"""A page of the feed, or of a long run, reads that page and no more, at a million events.

The store's own queries run under EXPLAIN ANALYZE and the test counts the rows their scans of run_events
and run_events_archive returned: a count, not a timing. Before the feed's horizon became a scalar, a page
read every event after its cursor (1,000,000 rows for a page at the start of a 1M-event table), and a page
of a 100,000-event run read the rest of the run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from runstate import sqlfiles
from runstate.eventstore import PostgresEventStore
from runstate_tests.support.databases import create_database, drop_database, unique

pytestmark = pytest.mark.slow

feed_sql = sqlfiles.named("postgres", "eventstore", "feed.sql")
reads_sql = sqlfiles.named("postgres", "eventstore", "reads.sql")

RUNS = 9_000  # of 100 events, 1 % of them archived
LONG_RUN = 100_000  # one run this long
TOTAL = RUNS * 100 + LONG_RUN
PAGE = 1_000


@pytest.fixture(scope="module")
def million() -> Iterator[tuple[PostgresEventStore, str]]:
    """A store with 1M events, filled on the server: every 100th run archived, the long run at the end."""
    name = unique("rs_scale")
    dsn = create_database(name)
    store = PostgresEventStore(dsn, schema="scale")
    store.ensure_schema()
    with (
        psycopg.connect(dsn, autocommit=True, options="-c search_path=scale") as conn,
        indexes_built_after(conn, ["run_events", "run_events_archive"]),
    ):
        conn.execute(
            """INSERT INTO run_events (run_id, run_seq, event_type, idempotency_key, emitted_at, position)
               SELECT 'run-' || lpad((g / 100)::text, 5, '0'), g %% 100 + 1, 'Tick',
                      convert_to((g %% 100)::text, 'UTF8'), '2026-01-01', g + 1
               FROM generate_series(0, %s - 1) AS g WHERE (g / 100) %% 100 <> 0""",
            (RUNS * 100,),
        )
        conn.execute(
            """INSERT INTO run_events_archive (run_id, run_seq, event_id, event_type, idempotency_key,
                                               emitted_at, persisted_at, position)
               SELECT 'run-' || lpad((g / 100)::text, 5, '0'), g %% 100 + 1, gen_random_uuid(), 'Tick',
                      convert_to((g %% 100)::text, 'UTF8'), '2026-01-01', now(), g + 1
               FROM generate_series(0, %s - 1) AS g WHERE (g / 100) %% 100 = 0""",
            (RUNS * 100,),
        )
        conn.execute(
            """INSERT INTO run_events (run_id, run_seq, event_type, idempotency_key, emitted_at, position)
               SELECT 'long', g, 'Tick', convert_to(g::text, 'UTF8'), '2026-01-01', %s + g
               FROM generate_series(1, %s) AS g""",
            (RUNS * 100, LONG_RUN),
        )
    with psycopg.connect(dsn, autocommit=True, options="-c search_path=scale") as conn:
        conn.execute("ANALYZE run_events, run_events_archive")
    yield store, dsn
    store.close()
    drop_database(name)


@contextmanager
def indexes_built_after(conn: psycopg.Connection, tables: list[str]) -> Iterator[None]:
    """Drop the tables' keys and indexes for the block and make them again from their own definitions:
    a bulk insert and then the builds take a third of the time of an insert that maintains five indexes."""
    tables_param = (tables,)
    keys = conn.execute(
        "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = ANY(%s::regclass[]) AND contype IN ('p', 'u')",
        tables_param,
    ).fetchall()
    indexes = conn.execute(
        "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index"
        " WHERE indrelid = ANY(%s::regclass[]) AND NOT EXISTS"
        " (SELECT 1 FROM pg_constraint c WHERE c.conindid = indexrelid)",
        tables_param,
    ).fetchall()
    for table, name, _ in keys:
        conn.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
    for name, _ in indexes:
        conn.execute(f"DROP INDEX {name}")
    yield
    for table, name, definition in keys:
        conn.execute(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
    for _, definition in indexes:
        conn.execute(definition)


def rows_read(conn: psycopg.Connection, query: str, params: dict[str, Any]) -> int:
    """The rows that the query's scans of the event tables returned, by EXPLAIN ANALYZE."""
    plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query, params).fetchone()[0][0]["Plan"]

    def walk(node: dict[str, Any]) -> int:
        here = node["Actual Rows"] * node["Actual Loops"] if node.get("Relation Name") else 0
        return here + sum(walk(child) for child in node.get("Plans", []))

    return walk(plan)


@pytest.fixture(params=["custom", "generic"])
def conn(
    request: pytest.FixtureRequest, million: tuple[PostgresEventStore, str]
) -> Iterator[psycopg.Connection]:
    """A connection in the store's schema; `generic` plans as a prepared statement does after 5 runs."""
    _, dsn = million
    mode = "force_custom_plan" if request.param == "custom" else "force_generic_plan"
    with psycopg.connect(
        dsn, autocommit=True, options=f"-c search_path=scale -c plan_cache_mode={mode}"
    ) as c:
        yield c


@pytest.mark.parametrize("after", [0, TOTAL // 2, TOTAL - PAGE // 2])
def test_a_feed_page_reads_about_one_page_of_rows_at_a_million_events(million, conn, after):
    store, _ = million
    other_xids = conn.execute(feed_sql("other_databases_xids")).fetchone()[0]
    params = {"after": after, "limit": PAGE, "other_xids": other_xids}

    read = rows_read(conn, feed_sql("feed"), params)
    page = store.fetch_all(after, limit=PAGE)

    assert [e.position for e in page] == list(range(after + 1, min(after + PAGE, TOTAL) + 1))
    assert read <= len(page) + 2  # each table's scan stops one row past the page (or at its end)


# fetch_run serves the projector; fetch_run_with_lake serves fetch (the run's lake record rides along).
@pytest.mark.parametrize("query", ["fetch_run", "fetch_run_with_lake"])
@pytest.mark.parametrize("after", [0, LONG_RUN // 2, LONG_RUN - PAGE // 2])
def test_a_page_of_a_100000_event_run_reads_about_one_page_of_rows(million, conn, after, query):
    store, _ = million
    params = {"run_id": "long", "after": after, "limit": PAGE, "upto": 2**62}

    read = rows_read(conn, reads_sql(query), params)
    page = store.fetch("long", after_seq=after, limit=PAGE)

    assert [e.run_seq for e in page] == list(range(after + 1, min(after + PAGE, LONG_RUN) + 1))
    assert read <= len(page) + 2
