"""Keeping run_events' run-keyed b-trees packed: each rebuilt, concurrently, once the table has grown.

An append puts a run's new keys at the end of that run's range in the primary key `(run_id, run_seq)` and
in the unique `(run_id, idempotency_key)`: in the middle of each index, where a full page splits in two
halves. The left half takes no more keys once its runs end, so both indexes settle near half full:
pgstatindex gave 54 and 57 % leaf density (67.9 and 108.9 bytes an event) on 0.3M events, against 90 %
(40.2 and 67.9) after a REINDEX. Pages of finished runs stay packed after a rebuild, so rebuilding each
index whenever the table has grown by REBUILD_GROWTH since its last build keeps most of it packed, at a
cost proportional to the table (the rebuilds' sizes form a geometric series).

`REINDEX INDEX CONCURRENTLY` lets appends and reads go on (it takes no lock that they wait for). A rebuild
killed midway leaves an invalid copy (`<index>_ccnew`) that every write still maintains; the next
compaction drops it before anything else. The archive runs the compaction (archive.py) after its batches.
"""

from __future__ import annotations

import logging

import psycopg
from psycopg import sql

from runstate import sqlfiles
from runstate.datastore import PostgresDatastore
from runstate.eventstore.backend import IndexRebuild

log = logging.getLogger("runstate.eventstore")

_queries = sqlfiles.named("postgres", "eventstore", "indexes.sql")

RUN_KEYED_INDEXES = ("run_events_pkey", "run_events_run_id_idempotency_key_key")
# Rebuild an index once the table holds this much more than at its last build (0.25: a quarter more)...
REBUILD_GROWTH = 0.25
# ...and only from this many rows: below it, a rebuild saves too little to be worth a pass.
REBUILD_FROM_ROWS = 100_000


def compact_run_keyed_indexes(
    datastore: PostgresDatastore, *, growth: float = REBUILD_GROWTH, from_rows: int = REBUILD_FROM_ROWS
) -> list[IndexRebuild]:
    """Drop what a killed rebuild left, then rebuild each run-keyed index that is due; returns what it
    rebuilt. Does nothing while another compaction of the schema runs."""
    # REINDEX CONCURRENTLY cannot run inside a transaction: a connection of its own, in autocommit. Its
    # session holds the advisory lock until it closes, killed or not.
    with datastore.connect() as conn:
        if not conn.execute(_queries("try_lock")).fetchone()[0]:
            return []
        for (leftover,) in conn.execute(_queries("leftovers")).fetchall():
            log.warning("dropping %s, left invalid by an interrupted index rebuild", leftover)
            conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(leftover)))
        rows = conn.execute(_queries("live_rows")).fetchone()[0]
        rebuilt = (_rebuild_if_due(conn, index, rows, growth, from_rows) for index in RUN_KEYED_INDEXES)
        return [done for done in rebuilt if done is not None]


def _rebuild_if_due(
    conn: psycopg.Connection, index: str, rows: int, growth: float, from_rows: int
) -> IndexRebuild | None:
    built = conn.execute(_queries("rows_at_build"), (index,)).fetchone()
    if rows < from_rows or (built is not None and rows < built[0] * (1 + growth)):
        return None
    before = _index_bytes(conn, index)
    conn.execute(sql.SQL("REINDEX INDEX CONCURRENTLY {}").format(sql.Identifier(index)))
    conn.execute(_queries("record_build"), (index, rows))
    return IndexRebuild(index, rows, before, _index_bytes(conn, index))


def _index_bytes(conn: psycopg.Connection, index: str) -> int:
    return conn.execute(_queries("index_bytes"), {"index": index}).fetchone()[0]
