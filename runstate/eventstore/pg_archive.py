"""The Postgres store's archive (run_events_archive), restore, and import (migrations between stores)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import psycopg

from runstate import sqlfiles
from runstate.eventstore.contract import StoredEvent
from runstate.eventstore.pg_sql import batch_params
from runstate.eventstore.rows import validate_imported
from runstate.eventstore.sequencing import by_run, fresh_imports
from runstate.eventstore.validation import ValidEvent, check_run_id

_sql = sqlfiles.named("postgres", "eventstore", "archive.sql")


class _PgArchive:
    """Mixin of PostgresEventStore: archive, restore and import."""

    def archive(self, older_than_days: int, now: datetime | None = None, *, batch_runs: int = 500) -> int:
        """Move the events of runs finished more than N days ago to run_events_archive; fetch,
        project and resume still read them. A second call finds nothing left to move."""
        cutoff = self._archive_cutoff(older_than_days, now)

        def chunk(conn: psycopg.Connection) -> tuple[int, int]:
            runs = [
                r[0]
                for r in conn.execute(
                    _sql("archivable_runs"), {"cutoff": cutoff, "limit": batch_runs}
                ).fetchall()
            ]
            if not runs:
                return 0, 0
            moved = conn.execute(_sql("archive_events"), (runs,)).fetchone()[0]
            conn.execute(_sql("delete_snapshots_of_runs"), (runs,))
            conn.execute(_sql("mark_archived"), (runs,))
            return len(runs), moved

        return self._archive_chunks(chunk, batch_runs)

    def restore(self, run_id: str) -> int:
        """Move an archived run's events back to run_events; returns how many moved. A run with nothing
        archived is left exactly as it was (no restored_at: it stays archivable)."""
        check_run_id(run_id)

        def work(conn: psycopg.Connection) -> int:
            row = conn.execute(_sql("lock_stream_row"), (run_id,)).fetchone()
            if row is None:
                return 0
            moved = conn.execute(_sql("restore_events"), ([run_id],)).fetchone()[0]
            if moved:
                conn.execute(_sql("mark_restored"), (run_id,))
            return moved

        return self._run(f"restore run {run_id!r}", work)

    def import_events(self, events: Iterable[StoredEvent]) -> int:
        """Insert stored events keeping their run_seq (migration); already-present keys are skipped."""
        written = 0
        for run_id, run_events in by_run(events).items():
            valid = validate_imported(run_id, run_events, self.max_event_bytes)
            written += self._run(
                f"import into run {run_id!r}", lambda conn: self._import_tx(conn, run_id, valid)
            )
        return written

    def _import_tx(self, conn: psycopg.Connection, run_id: str, valid: list[tuple[int, ValidEvent]]) -> int:
        stream = self._lock_stream(conn, run_id)
        keys = self._existing_keys(conn, run_id, [v.idempotency_key for _, v in valid], stream)
        taken = {r[0] for r in conn.execute(_sql("taken_seqs"), (run_id, [s for s, _ in valid])).fetchall()}
        fresh = fresh_imports(run_id, valid, keys, taken)
        if fresh:
            top = max(stream.last_seq, max(seq for seq, _ in fresh))
            conn.execute(_sql("insert_imported"), batch_params(run_id, fresh, top))
        return len(fresh)
