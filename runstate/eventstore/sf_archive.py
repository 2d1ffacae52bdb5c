"""The Snowflake store's archive (RUN_EVENTS_ARCHIVE), restore, and import (migrations between stores)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from runstate import sqlfiles
from runstate.eventstore.contract import ConcurrencyConflict, StoredEvent
from runstate.eventstore.rows import validate_imported
from runstate.eventstore.sequencing import by_run, fresh_imports
from runstate.eventstore.sf_sql import Retry, chunks
from runstate.eventstore.validation import ValidEvent, check_run_id

log = logging.getLogger("runstate.eventstore.snowflake")
_MAX_ATTEMPTS = 80


_sql = sqlfiles.named("snowflake", "eventstore", "archive.sql")


class _SfArchive:
    """Mixin of SnowflakeEventStore: archive, restore and import."""

    def archive(self, older_than_days: int, now: datetime | None = None, *, batch_runs: int = 200) -> int:
        """Move events of runs finished > N days ago into RUN_EVENTS_ARCHIVE, a transaction per chunk."""
        cutoff = self._archive_cutoff(older_than_days, now).isoformat()

        def chunk(cur: Any) -> tuple[int, int]:
            cur.execute(_sql("archivable_runs"), (cutoff, cutoff, batch_runs))
            runs = tuple(r[0] for r in cur.fetchall())
            if not runs:
                return 0, 0
            # Touch the stream rows first: appenders to these runs now conflict with us, not interleave.
            cur.execute(_sql("mark_archived"), (runs,))
            cur.execute(_sql("copy_to_archive"), (runs,))
            cur.execute(_sql("delete_archived_events"), (runs,))
            moved = cur.rowcount or 0
            cur.execute(_sql("delete_snapshots_of_runs"), (runs,))
            return len(runs), moved

        return self._archive_chunks(chunk, batch_runs)

    def restore(self, run_id: str) -> int:
        """Move an archived run's events back to RUN_EVENTS; returns how many moved. A run with nothing
        archived is left exactly as it was (no RESTORED_AT: it stays archivable)."""
        check_run_id(run_id)
        self._merge_usable()

        def work(cur: Any) -> int:
            if not self._stream_exists(cur, run_id):
                return 0
            self._lock_stream(cur, run_id)
            cur.execute(_sql("copy_from_archive"), (run_id,))
            moved = cur.rowcount or 0
            if not moved:
                return 0
            cur.execute(_sql("delete_restored_events"), (run_id,))
            cur.execute(_sql("mark_restored"), (run_id,))
            return moved

        return self._run(f"restore run {run_id!r}", work)

    def import_events(self, events: Iterable[StoredEvent]) -> int:
        """Insert stored events keeping run_seq and persisted_at; keys already present are skipped."""
        runs = by_run(events)
        written = 0
        if runs:
            self._merge_usable()
        for run_id, run_events in runs.items():
            valid = validate_imported(run_id, run_events, self.max_event_bytes)
            stamps = {e.run_seq: e.persisted_at for e in run_events}
            self._create_stream(run_id)
            expected = {v.idempotency_key: seq for seq, v in valid}
            base = self._position_base()
            for _ in range(_MAX_ATTEMPTS):
                written += self._run(
                    f"import into run {run_id!r}",
                    lambda cur: self._import_tx(cur, run_id, valid, stamps, base),
                )
                found = self._run(
                    "verify import",
                    lambda cur: self._existing_keys(cur, run_id, sorted(expected), False),
                    transactional=False,
                )
                if found == expected:
                    break
                log.warning("run %r: import not visible after COMMIT; retrying", run_id)
            else:
                raise ConcurrencyConflict(f"import into run {run_id!r}: commit could not be confirmed")
        return written

    def _import_tx(
        self,
        cur: Any,
        run_id: str,
        valid: list[tuple[int, ValidEvent]],
        stamps: dict[int, datetime],
        base: int,
    ) -> int:
        last_seq, count, archived = self._lock_stream(cur, run_id)
        keys = self._existing_keys(cur, run_id, [v.idempotency_key for _, v in valid], archived)
        taken: set[int] = set()
        for chunk in chunks([s for s, _ in valid], 1000):
            cur.execute(_sql("taken_seqs"), (run_id, tuple(chunk)))
            taken.update(int(r[0]) for r in cur.fetchall())
        fresh = fresh_imports(run_id, valid, keys, taken)
        if not fresh:
            return 0
        inserted = self._merge_events(cur, run_id, fresh, [stamps.get(s) for s, _ in fresh], base)
        if inserted != len(fresh):
            raise Retry(f"run {run_id!r}: merged {inserted} of {len(fresh)} imported rows")
        self._advance_stream(
            cur, run_id, max(last_seq, max(s for s, _ in fresh)), count + len(fresh), [e for _, e in fresh]
        )
        return len(fresh)
