"""The Snowflake store's append transaction: the stream row lock, key probes, the MERGE of a batch,
feed positions and the stream row's advance (see snowflake.py for the whole protocol). The statements
are named queries in sql/snowflake/eventstore/append.sql."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from runstate import sqlfiles
from runstate.eventstore.contract import (
    TERMINAL_EVENT_TYPES,
    AppendResult,
    EventType,
    RunSnapshot,
)
from runstate.eventstore.sequencing import assign_seqs, check_expected
from runstate.eventstore.sf_sql import Retry, chunks, iso, values_rows
from runstate.eventstore.snapshots import EncodedSnapshot
from runstate.eventstore.validation import ValidEvent

log = logging.getLogger("runstate.eventstore.snowflake")
_BATCH_ROWS = 1000


_sql = sqlfiles.named("snowflake", "eventstore", "append.sql")


class _SfAppend:
    """Mixin of SnowflakeEventStore: the append transaction."""

    def _create_stream(self, run_id: str) -> None:
        """Make sure the run's stream row exists, in its own statement before the append transaction:
        a racing creator then fails here (and is retried), never at the append's COMMIT."""

        def work(cur: Any) -> None:
            if not self._stream_exists(cur, run_id):
                cur.execute(_sql("create_stream"), (run_id,))

        self._run(f"create stream for run {run_id!r}", work, transactional=False)

    def _stream_exists(self, cur: Any, run_id: str) -> bool:
        cur.execute(_sql("stream_exists"), (run_id,))
        return bool(cur.fetchone()[0])

    def _committed(self, run_id: str, valid: list[ValidEvent], results: list[AppendResult]) -> bool:
        expected = {v.idempotency_key: r.run_seq for v, r in zip(valid, results) if r.persisted}

        def work(cur: Any) -> dict[str, int]:
            return self._existing_keys(cur, run_id, sorted(expected), archived=False)

        return self._run("verify append", work, transactional=False) == expected

    def _lock_stream(self, cur: Any, run_id: str) -> tuple[int, int, bool]:
        # Writing the run's stream row is what serialises this run's appenders (see module doc).
        # The row exists (_create_stream). This no-op UPDATE is the write that serialises the run's
        # appenders: Snowflake holds the table's DML lock to COMMIT; DuckDB (fakesnow) fails the
        # second concurrent writer of the row at once, before anything else happens.
        cur.execute(_sql("touch_stream"), (run_id,))
        if cur.rowcount != 1:
            raise Retry(f"run {run_id!r}: stream row missing")
        cur.execute(_sql("read_stream"), (run_id,))
        rows = cur.fetchall()
        if len(rows) != 1:
            raise Retry(f"run {run_id!r}: {len(rows)} stream rows")
        return int(rows[0][0]), int(rows[0][1]), bool(rows[0][2])

    def _existing_keys(self, cur: Any, run_id: str, keys: list[str], archived: bool) -> dict[str, int]:
        found: dict[str, int] = {}
        queries = ["existing_keys", "existing_archived_keys"] if archived else ["existing_keys"]
        for name in queries:
            for chunk in chunks(keys, _BATCH_ROWS):
                cur.execute(_sql(name), (run_id, tuple(chunk)))
                found.update({row[0]: int(row[1]) for row in cur.fetchall()})
        return found

    def _append_tx(
        self,
        cur: Any,
        run_id: str,
        valid: list[ValidEvent],
        state: Any,
        written: list[tuple[RunSnapshot | None, EncodedSnapshot | None]],
        expected: int | None,
        position_base: int,
    ) -> list[AppendResult]:
        last_seq, count, archived = self._lock_stream(cur, run_id)
        keys = sorted({v.idempotency_key for v in valid})
        known = self._existing_keys(cur, run_id, keys, archived) if (count or archived) else {}
        check_expected(run_id, valid, known, last_seq, expected)
        results, new, next_seq = assign_seqs(valid, known, last_seq)
        if not new:
            return results
        inserted = self._merge_events(cur, run_id, new, None, position_base)
        if inserted != len(new):
            raise Retry(
                f"run {run_id!r}: merged {inserted} of {len(new)} rows"
            )  # a concurrent writer slipped in
        self._advance_stream(cur, run_id, next_seq, count + len(new), [e for _, e in new])
        reason = self.policy.reason(count, count + len(new), (e.event_type for _, e in new))
        if reason:
            written.append(self._write_snapshot(cur, run_id, next_seq, state, reason, last_seq, new))
        return results

    def _merge_events(
        self,
        cur: Any,
        run_id: str,
        rows: Sequence[tuple[int, ValidEvent]],
        persisted_at: Sequence[datetime | None] | None,
        position_base: int,
    ) -> int:
        total = 0
        for start in range(0, len(rows), _BATCH_ROWS):
            chunk = rows[start : start + _BATCH_ROWS]
            params: list[Any] = []
            for offset, (seq, e) in enumerate(chunk):
                stamp = persisted_at[start + offset] if persisted_at else None
                params += [
                    run_id,
                    seq,
                    e.event_id,
                    e.step_id,
                    e.engine_attempt_id,
                    e.logical_attempt_id,
                    e.plan_version,
                    e.event_type,
                    e.data_json,
                    e.idempotency_key,
                    e.caused_by_signal_id,
                    e.parent_event_id,
                    e.emitted_at.isoformat(),
                    stamp.isoformat() if stamp else None,
                    e.adapter_version,
                    e.engine_run_ref_json,
                    position_base + start + offset + 1,
                ]
            # The same effect either way; insert_new_events where MERGE cannot run in a transaction.
            # Only the count of placeholder groups is composed here (see values_rows); values are bound.
            statement = _sql("merge_events" if self._merge_usable() else "insert_new_events")
            cur.execute(statement.replace("{rows}", values_rows(len(chunk))), params)
            total += cur.rowcount or 0
        return total

    def _position_base(self) -> int:
        """A feed token for one append, shifted: its events take the 2**20 positions above it."""

        def work(cur: Any) -> int:
            cur.execute(_sql("next_position"))
            return int(cur.fetchone()[0]) << 20

        return self._run("take a feed position", work, transactional=False)

    def _advance_stream(
        self, cur: Any, run_id: str, last_seq: int, count: int, events: Sequence[ValidEvent]
    ) -> None:
        started = next((e.emitted_at for e in events if e.event_type == EventType.RUN_STARTED), None)
        completed = next((e.emitted_at for e in events if e.event_type in TERMINAL_EVENT_TYPES), None)
        cur.execute(
            _sql("advance_stream"),
            (last_seq, count, events[0].emitted_at.isoformat(), iso(started), iso(completed), run_id),
        )
