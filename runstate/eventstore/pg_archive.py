"""The Postgres event store's statements for archiving and importing runs (sql/postgres/eventstore/archive.sql).

The archive moves finished runs' events to the archive table and back; the lake archive drops a run's
events once the run history's tables hold them whole, and restores them from there (lake_archive.py
decides which, archive.py drives both); an import stores another store's events under their run_seq.
PostgresBackend takes these methods from PostgresArchiveStatements; StoreBackend declares them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg

from runstate import sqlfiles
from runstate.eventstore.backend import LakeRecord, Rows, Stream
from runstate.eventstore.contract import StoredEvent
from runstate.eventstore.pg_sql import batch_params, restored_params, stored_event

_archive = sqlfiles.named("postgres", "eventstore", "archive.sql")


class PostgresArchiveStatements:
    """Archive, lake archive and import statements of PostgresBackend (`conn` is the transaction's)."""

    def archive_runs(self, conn: psycopg.Connection, cutoff: datetime, limit: int) -> tuple[int, int]:
        rows = conn.execute(_archive("archivable_runs"), {"cutoff": cutoff, "limit": limit}).fetchall()
        runs = [r[0] for r in rows]
        if not runs:
            return 0, 0
        moved = conn.execute(_archive("archive_events"), (runs,)).fetchone()[0]
        conn.execute(_archive("delete_snapshots_of_runs"), (runs,))
        conn.execute(_archive("mark_archived"), (runs,))
        return len(runs), moved

    def unarchive(self, conn: psycopg.Connection, run_id: str) -> int:
        moved = conn.execute(_archive("restore_events"), ([run_id],)).fetchone()[0]
        if moved:
            conn.execute(_archive("mark_restored"), (run_id,))
        return moved

    def lake_record(self, conn: psycopg.Connection, run_id: str) -> LakeRecord | None:
        row = conn.execute(_archive("lake_record"), (run_id,)).fetchone()
        return LakeRecord(int(row[0]), int(row[1])) if row and row[0] is not None else None

    def lake_candidates(
        self, conn: psycopg.Connection, cutoff: datetime, limit: int, position: int, after: str
    ) -> list[tuple[str, int]]:
        params = {"cutoff": cutoff, "limit": limit, "position": position, "after": after}
        return [(r[0], int(r[1])) for r in conn.execute(_archive("lake_archivable_runs"), params).fetchall()]

    def lake_archive_rows(
        self, conn: psycopg.Connection, run_ids: Sequence[str]
    ) -> dict[str, list[StoredEvent]]:
        rows = conn.execute(_archive("lake_archive_rows"), {"runs": list(run_ids)}, binary=True).fetchall()
        found: dict[str, list[StoredEvent]] = {run_id: [] for run_id in run_ids}
        for row in rows:
            found[row[0]].append(stored_event(row))
        return found

    def drop_into_lake(self, conn: psycopg.Connection, run_ids: Sequence[str]) -> dict[str, int]:
        rows = conn.execute(_archive("drop_into_lake"), {"runs": list(run_ids)}).fetchall()
        conn.execute(_archive("delete_snapshots_of_runs"), (list(run_ids),))
        return {run_id: int(n) for run_id, n in rows}

    def lake_held_back(
        self, conn: psycopg.Connection, cutoff: datetime, position: int
    ) -> list[tuple[str, int]]:
        rows = conn.execute(_archive("lake_held_back_runs"), {"cutoff": cutoff, "position": position})
        return [(r[0], int(r[1])) for r in rows.fetchall()]

    def restore_from_lake(self, conn: psycopg.Connection, run_id: str, events: Sequence[StoredEvent]) -> int:
        inserted = 0
        if events:
            inserted = conn.execute(
                _archive("restore_from_lake"), restored_params(run_id, events)
            ).fetchone()[0]
        conn.execute(_archive("mark_restored_from_lake"), (run_id,))
        return inserted

    def taken_seqs(self, conn: psycopg.Connection, run_id: str, seqs: Sequence[int]) -> set[int]:
        return {r[0] for r in conn.execute(_archive("taken_seqs"), (run_id, list(seqs))).fetchall()}

    def insert_imported(
        self,
        conn: psycopg.Connection,
        run_id: str,
        stream: Stream,
        rows: Rows,
        stamps: Mapping[int, datetime],
        ticket: Any,
    ) -> None:
        """persisted_at is this insert's (the events are persisted here now); a key a racing writer
        inserted meanwhile is a unique violation, and the transaction is retried."""
        top = max(stream.last_seq, max(seq for seq, _ in rows))
        conn.execute(_archive("insert_imported"), batch_params(run_id, rows, top))
