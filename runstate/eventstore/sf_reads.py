"""The Snowflake store's reads: a run's events (live or archived), projections, resume, run lists, feed."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any

from runstate.eventstore.contract import InvalidEvent, RunSnapshot, StoredEvent
from runstate.eventstore.feed import check_poll_seconds, check_position, follow
from runstate.eventstore.sf_sql import COLUMNS, from_json, iso, row_to_event


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
        # An archived run is read from RUN_EVENTS_ARCHIVE (an event is in exactly one of the two tables).
        bounds = " WHERE RUN_ID = %s AND RUN_SEQ > %s" + (" AND RUN_SEQ <= %s" if upto is not None else "")
        params: list[Any] = [run_id, after_seq] + ([upto] if upto is not None else [])
        query = (
            f"SELECT {COLUMNS} FROM {self._t('RUN_EVENTS')}{bounds}"
            f" UNION ALL SELECT {COLUMNS} FROM {self._t('RUN_EVENTS_ARCHIVE')}{bounds}"
            " ORDER BY RUN_SEQ LIMIT %s"
        )
        cur.execute(query, params + params + [limit])
        return [row_to_event(row) for row in cur.fetchall()]

    def fetch_all(self, after_position: int = 0, limit: int = 1000) -> list[StoredEvent]:
        """Every event with POSITION > after_position, in position order (see the module docs of
        snowflake.py for when that order is commit order)."""
        check_position(after_position, limit)
        query = (
            f"SELECT * FROM (SELECT {COLUMNS} FROM {self._t('RUN_EVENTS')} WHERE POSITION > %s"
            f" UNION ALL SELECT {COLUMNS} FROM {self._t('RUN_EVENTS_ARCHIVE')} WHERE POSITION > %s)"
            " ORDER BY POSITION LIMIT %s"
        )
        return [row_to_event(row) for row in self._query(query, (after_position, after_position, limit))]

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
        rows = self._query(
            f"SELECT RUN_ID FROM {self._t('RUN_STREAMS')} WHERE RUN_ID > %s ORDER BY RUN_ID LIMIT %s",
            (after, limit),
        )
        return [r[0] for r in rows]

    def stale_runs(self, limit: int = 1000) -> list[str]:
        rows = self._query(
            f"SELECT s.RUN_ID FROM {self._t('RUN_STREAMS')} s LEFT JOIN {self._t('RUN_SNAPSHOTS')} p"
            " ON p.RUN_ID = s.RUN_ID WHERE s.LAST_SEQ > COALESCE(p.LAST_EVENT_SEQ, 0)"
            " AND (s.ARCHIVED_AT IS NULL OR s.UPDATED_AT > s.ARCHIVED_AT) ORDER BY s.RUN_ID LIMIT %s",
            (limit,),
        )
        return [r[0] for r in rows]

    def stale_runs_with_start(self, limit: int = 1000) -> list[tuple[str, datetime | None, int]]:
        """(run_id, start, last_seq) of runs with events newer than their stored projection."""
        rows = self._query(
            # HAS_START is tested in SQL: fakesnow returns NULL TIMESTAMP_TZ values as 1970-01-01.
            f"SELECT s.RUN_ID, COALESCE(s.STARTED_AT, s.FIRST_EVENT_AT),"
            " COALESCE(s.STARTED_AT, s.FIRST_EVENT_AT) IS NOT NULL, s.LAST_SEQ"
            f" FROM {self._t('RUN_STREAMS')} s LEFT JOIN {self._t('RUN_SNAPSHOTS')} p"
            " ON p.RUN_ID = s.RUN_ID WHERE s.LAST_SEQ > COALESCE(p.LAST_EVENT_SEQ, 0)"
            " AND (s.ARCHIVED_AT IS NULL OR s.UPDATED_AT > s.ARCHIVED_AT) ORDER BY s.RUN_ID LIMIT %s",
            (limit,),
        )
        return [(r[0], r[1] if r[2] else None, int(r[3])) for r in rows]

    def runs_started_between(self, start: datetime, end: datetime) -> list[str]:
        rows = self._query(
            f"SELECT RUN_ID FROM {self._t('RUN_STREAMS')}"
            " WHERE COALESCE(STARTED_AT, FIRST_EVENT_AT) >= %s::TIMESTAMP_TZ"
            " AND COALESCE(STARTED_AT, FIRST_EVENT_AT) < %s::TIMESTAMP_TZ ORDER BY RUN_ID",
            (start.isoformat(), end.isoformat()),
        )
        return [r[0] for r in rows]

    def max_seq(self, run_id: str) -> int:
        """The highest run_seq stored for the run, live or archived (0 when none): the migration's
        resume point."""
        rows = self._query(
            f"SELECT GREATEST(COALESCE((SELECT MAX(RUN_SEQ) FROM {self._t('RUN_EVENTS')} WHERE RUN_ID = %s), 0),"
            f" COALESCE((SELECT MAX(RUN_SEQ) FROM {self._t('RUN_EVENTS_ARCHIVE')} WHERE RUN_ID = %s), 0))",
            (run_id, run_id),
        )
        return int(rows[0][0] or 0)

    # -- projection ---------------------------------------------------------------------------

    def _stored_projection(self, cur: Any, run_id: str) -> RunSnapshot | None:
        cur.execute(
            f"SELECT SNAPSHOT_DATA, VERSION FROM {self._t('RUN_SNAPSHOTS')} WHERE RUN_ID = %s", (run_id,)
        )
        row = cur.fetchone()
        return RunSnapshot.from_dict(from_json(row[0]), version=int(row[1])) if row else None

    def _save_projection(self, cur: Any, run_id: str, snap: RunSnapshot, stored: RunSnapshot | None) -> bool:
        data = json.dumps(snap.to_dict())
        if stored is None:
            # Outside a transaction, so MERGE runs on fakesnow too; the PK makes a racing insert fail there.
            cur.execute(
                f"MERGE INTO {self._t('RUN_SNAPSHOTS')} t USING (SELECT %s AS"
                " RUN_ID, %s AS STATUS, %s AS LAST_EVENT_SEQ,"
                " PARSE_JSON(%s) AS SNAPSHOT_DATA, %s::TIMESTAMP_TZ AS"
                " STARTED_AT, %s::TIMESTAMP_TZ AS COMPLETED_AT) s"
                " ON t.RUN_ID = s.RUN_ID WHEN NOT MATCHED THEN INSERT"
                " (RUN_ID, STATUS, LAST_EVENT_SEQ, SNAPSHOT_DATA, STARTED_AT, COMPLETED_AT, VERSION)"
                " VALUES (s.RUN_ID, s.STATUS, s.LAST_EVENT_SEQ,"
                " s.SNAPSHOT_DATA, s.STARTED_AT, s.COMPLETED_AT, 1)",
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
            f"UPDATE {self._t('RUN_SNAPSHOTS')} SET STATUS = %s,"
            " LAST_EVENT_SEQ = %s, SNAPSHOT_DATA = PARSE_JSON(%s),"
            " STARTED_AT = %s::TIMESTAMP_TZ, COMPLETED_AT ="
            " %s::TIMESTAMP_TZ, PROJECTED_AT = CURRENT_TIMESTAMP(),"
            " VERSION = %s WHERE RUN_ID = %s AND VERSION = %s",
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
