"""The Snowflake store's reads: a run's events (live or archived), projections, resume, run lists, feed."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any

from runstate import sqlfiles
from runstate.eventstore.contract import InvalidEvent, RunSnapshot, StoredEvent
from runstate.eventstore.feed import check_poll_seconds, check_position, follow
from runstate.eventstore.sf_sql import from_json, iso, row_to_event

_sql = sqlfiles.named("snowflake", "eventstore", "reads.sql")


class _SfReads:
    """Mixin of SnowflakeEventStore: reads and projection."""

    def fetch(self, run_id: str, after_seq: int = 0, limit: int = 1000) -> list[StoredEvent]:
        if int(limit) < 1:
            raise InvalidEvent("limit", f"must be >= 1, got {limit!r}")
        return self._run(
            "fetch", lambda cur: self._fetch(cur, run_id, int(after_seq), int(limit)), transactional=False
        )

    def _fetch(
        self, cur: Any, run_id: str, after_seq: int, limit: int, upto: int | None = None
    ) -> list[StoredEvent]:
        # An archived run is read from RUN_EVENTS_ARCHIVE too: the bounds go once for each table.
        if upto is None:
            name, bounds = "fetch_run", [run_id, after_seq]
        else:
            name, bounds = "fetch_run_upto", [run_id, after_seq, upto]
        cur.execute(_sql(name), [*bounds, *bounds, limit])
        return [row_to_event(row) for row in cur.fetchall()]

    def fetch_all(self, after_position: int = 0, limit: int = 1000) -> list[StoredEvent]:
        """Every event with POSITION > after_position, in position order (see the module docs of
        snowflake.py for when that order is commit order)."""
        check_position(after_position, limit)
        rows = self._query(_sql("feed"), (after_position, after_position, limit))
        return [row_to_event(row) for row in rows]

    def subscribe(
        self, after_position: int = 0, *, poll_seconds: float = 1.0, stop: Callable[[], bool] | None = None
    ) -> Iterator[StoredEvent]:
        """Follow the feed by polling every `poll_seconds` (Snowflake has no LISTEN)."""
        check_poll_seconds(poll_seconds)
        return follow(self.fetch_all, time.sleep, after_position, poll_seconds, stop)

    def _query(self, sql: str, params: Sequence[Any]) -> list[tuple]:
        def work(cur: Any) -> list[tuple]:
            cur.execute(sql, params)
            return cur.fetchall()

        return self._run("query", work, transactional=False)

    def run_ids(self, after: str = "", limit: int = 1000) -> list[str]:
        rows = self._query(_sql("run_ids"), (after, limit))
        return [r[0] for r in rows]

    def stale_runs(self, limit: int = 1000) -> list[str]:
        rows = self._query(_sql("stale_runs"), (limit,))
        return [r[0] for r in rows]

    def stale_runs_with_start(self, limit: int = 1000) -> list[tuple[str, datetime | None, int]]:
        """(run_id, start, last_seq) of runs with events newer than their stored projection."""
        rows = self._query(_sql("stale_runs_with_start"), (limit,))
        return [(r[0], r[1] if r[2] else None, int(r[3])) for r in rows]

    def runs_started_between(self, start: datetime, end: datetime) -> list[str]:
        rows = self._query(_sql("runs_started_between"), (start.isoformat(), end.isoformat()))
        return [r[0] for r in rows]

    def max_seq(self, run_id: str) -> int:
        """The highest run_seq stored for the run, live or archived (0 when none): the migration's
        resume point."""
        rows = self._query(_sql("max_seq"), (run_id, run_id))
        return int(rows[0][0] or 0)

    # -- projection ---------------------------------------------------------------------------

    def _stored_projection(self, cur: Any, run_id: str) -> RunSnapshot | None:
        cur.execute(_sql("stored_projection"), (run_id,))
        row = cur.fetchone()
        return RunSnapshot.from_dict(from_json(row[0]), version=int(row[1])) if row else None

    def _save_projection(self, cur: Any, run_id: str, snap: RunSnapshot, stored: RunSnapshot | None) -> bool:
        data = json.dumps(snap.to_dict())
        if stored is None:
            # Outside a transaction, so MERGE runs on fakesnow too; the PK makes a racing insert fail there.
            cur.execute(
                _sql("insert_projection"),
                (
                    run_id,
                    snap.status,
                    snap.last_event_seq,
                    data,
                    iso(snap.started_at),
                    iso(snap.completed_at),
                ),
            )
            return cur.rowcount == 1
        cur.execute(
            _sql("update_projection"),
            (
                snap.status,
                snap.last_event_seq,
                data,
                iso(snap.started_at),
                iso(snap.completed_at),
                stored.version + 1,
                run_id,
                stored.version,
            ),
        )
        return cur.rowcount == 1
