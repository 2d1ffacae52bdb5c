"""The Postgres store's reads: a run's events (live or archived), projections, resume, and run lists."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import psycopg

from runstate import sqlfiles
from runstate.eventstore.contract import (
    InvalidEvent,
    RunSnapshot,
    StoredEvent,
)
from runstate.eventstore.pg_feed import _PgFeed
from runstate.eventstore.pg_sql import stored_event

_NO_UPPER_BOUND = 2**62


_sql = sqlfiles.named("postgres", "eventstore", "reads.sql")


class _PgReads(_PgFeed):
    """Mixin of PostgresEventStore: reads and projection."""

    def fetch(self, run_id: str, after_seq: int = 0, limit: int = 1000) -> list[StoredEvent]:
        """Events with run_seq > after_seq, ascending, at most `limit` (the watermark pattern)."""
        if int(limit) < 1:
            raise InvalidEvent("limit", f"must be >= 1, got {limit!r}")
        return self._run(
            f"fetch run {run_id!r}",
            lambda conn: self._fetch(conn, run_id, int(after_seq), int(limit)),
            transactional=False,
        )

    def _fetch(
        self, conn: psycopg.Connection, run_id: str, after_seq: int, limit: int, upto: int | None = None
    ) -> list[StoredEvent]:
        params = {
            "run_id": run_id,
            "after": after_seq,
            "limit": limit,
            "upto": _NO_UPPER_BOUND if upto is None else upto,
        }
        rows = conn.execute(_sql("fetch_run"), params, binary=True).fetchall()
        return [stored_event(row) for row in rows]

    def _rows(self, what: str, query: str, params: tuple) -> list[tuple]:
        return self._run(what, lambda conn: conn.execute(query, params).fetchall(), transactional=False)

    def run_ids(self, after: str = "", limit: int = 1000) -> list[str]:
        rows = self._rows("list runs", _sql("run_ids"), (after, limit))
        return [r[0] for r in rows]

    def max_seq(self, run_id: str) -> int:
        """The highest run_seq stored for the run, live or archived (0 when none): the migration's
        resume point."""
        rows = self._rows(f"max seq of run {run_id!r}", _sql("max_seq"), (run_id, run_id))
        return rows[0][0] or 0

    def stale_runs(self, limit: int = 1000) -> list[str]:
        """Runs with events newer than their stored projection."""
        return [run_id for run_id, _, _ in self.stale_runs_with_start(limit)]

    def stale_runs_with_start(self, limit: int = 1000) -> list[tuple[str, datetime | None, int]]:
        """(run_id, start, last_seq) of runs with events newer than their stored projection; the start
        is the RunStarted event's emitted_at, else the first event's."""
        return [(r[0], r[1], r[2]) for r in self._rows("list stale runs", _sql("stale_runs"), (limit,))]

    def runs_started_between(self, start: datetime, end: datetime) -> list[str]:
        rows = self._rows("list runs by start", _sql("runs_started_between"), (start, end))
        return [r[0] for r in rows]

    # -- projection ---------------------------------------------------------------------------

    def _stored_projection(self, conn: psycopg.Connection, run_id: str) -> RunSnapshot | None:
        row = conn.execute(_sql("stored_projection"), (run_id,)).fetchone()
        return RunSnapshot.from_dict(row[0], version=row[1]) if row else None

    def _save_projection(
        self, conn: psycopg.Connection, run_id: str, snap: RunSnapshot, stored: RunSnapshot | None
    ) -> bool:
        """Compare-and-set on version; False when another projector won (the caller re-reads)."""
        params: dict[str, Any] = {
            "run_id": run_id,
            "status": snap.status,
            "seq": snap.last_event_seq,
            "data": json.dumps(snap.to_dict()),
            "started": snap.started_at,
            "completed": snap.completed_at,
        }
        if stored is None:
            return conn.execute(_sql("insert_projection"), params).rowcount == 1
        return conn.execute(_sql("update_projection"), {**params, "version": stored.version}).rowcount == 1
