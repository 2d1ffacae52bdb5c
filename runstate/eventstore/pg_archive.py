"""The Postgres store's archive (run_events_archive), restore, and import (migrations between stores)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import psycopg

from runstate.eventstore.contract import StoredEvent
from runstate.eventstore.pg_sql import EVENT_COLUMNS, INSERT_IMPORTED, batch_params
from runstate.eventstore.rows import validate_imported
from runstate.eventstore.validation import ValidEvent, check_run_id

# A restored run stays live for one archive age after its restore.
_ARCHIVABLE = (
    "SELECT run_id FROM run_streams WHERE completed_at < %(cutoff)s"
    " AND (archived_at IS NULL OR updated_at > archived_at)"
    " AND (restored_at IS NULL OR restored_at < %(cutoff)s)"
    " ORDER BY run_id LIMIT %(limit)s FOR UPDATE"
)
# DELETE ... RETURNING feeding the INSERT: an event is in exactly one of the two tables, at any time.
_MOVE = (
    f"WITH moved AS (DELETE FROM {{source}} WHERE run_id = ANY(%s) RETURNING {EVENT_COLUMNS}),"
    f" kept AS (INSERT INTO {{target}} ({EVENT_COLUMNS}) SELECT {EVENT_COLUMNS} FROM moved RETURNING 1)"
    " SELECT count(*) FROM kept"
)


class _PgArchive:
    """Mixin of PostgresEventStore: archive, restore and import."""

    def archive(self, older_than_days: int, now: datetime | None = None, *, batch_runs: int = 500) -> int:
        """Move the events of runs finished more than N days ago to run_events_archive; fetch,
        project and resume still read them. A second call finds nothing left to move."""
        cutoff = self._archive_cutoff(older_than_days, now)

        def chunk(conn: psycopg.Connection) -> tuple[int, int]:
            runs = [
                r[0] for r in conn.execute(_ARCHIVABLE, {"cutoff": cutoff, "limit": batch_runs}).fetchall()
            ]
            if not runs:
                return 0, 0
            moved = conn.execute(
                _MOVE.format(source="run_events", target="run_events_archive"), (runs,)
            ).fetchone()[0]
            conn.execute("DELETE FROM run_state_snapshots WHERE run_id = ANY(%s)", (runs,))
            conn.execute("UPDATE run_streams SET archived_at = now() WHERE run_id = ANY(%s)", (runs,))
            return len(runs), moved

        return self._archive_chunks(chunk, batch_runs)

    def restore(self, run_id: str) -> int:
        """Move an archived run's events back to run_events; returns how many moved. A run with nothing
        archived is left exactly as it was (no restored_at: it stays archivable)."""
        check_run_id(run_id)

        def work(conn: psycopg.Connection) -> int:
            row = conn.execute("SELECT 1 FROM run_streams WHERE run_id = %s FOR UPDATE", (run_id,)).fetchone()
            if row is None:
                return 0
            moved = conn.execute(
                _MOVE.format(source="run_events_archive", target="run_events"), ([run_id],)
            ).fetchone()[0]
            if moved:
                conn.execute(
                    "UPDATE run_streams SET archived_at = NULL, restored_at = now() WHERE run_id = %s",
                    (run_id,),
                )
            return moved

        return self._run(f"restore run {run_id!r}", work)

    def import_events(self, events: Iterable[StoredEvent]) -> int:
        """Insert stored events keeping their run_seq (migration); already-present keys are skipped."""
        written = 0
        for run_id, run_events in self._by_run(events).items():
            valid = validate_imported(run_id, run_events, self.max_event_bytes)
            written += self._run(
                f"import into run {run_id!r}", lambda conn: self._import_tx(conn, run_id, valid)
            )
        return written

    def _import_tx(self, conn: psycopg.Connection, run_id: str, valid: list[tuple[int, ValidEvent]]) -> int:
        stream = self._lock_stream(conn, run_id)
        keys = self._existing_keys(conn, run_id, [v.idempotency_key for _, v in valid], stream)
        taken = {
            r[0]
            for r in conn.execute(
                "SELECT run_seq FROM run_events WHERE run_id = %s AND run_seq = ANY(%s)",
                (run_id, [s for s, _ in valid]),
            ).fetchall()
        }
        fresh = self._fresh_imports(run_id, valid, keys, taken)
        if fresh:
            top = max(stream.last_seq, max(seq for seq, _ in fresh))
            conn.execute(INSERT_IMPORTED, batch_params(run_id, fresh, top))
        return len(fresh)
