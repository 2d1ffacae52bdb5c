"""The Postgres store's state snapshots: written inside the append transaction, and by checkpoint()."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg

from runstate import sqlfiles
from runstate.eventstore.contract import RunSnapshot, StoredEvent
from runstate.eventstore.pg_sql import snapshot_row_params
from runstate.eventstore.projection import READS_DATA, fold
from runstate.eventstore.rows import as_stored
from runstate.eventstore.snapshots import (
    KIND_PROJECTION,
    EncodedSnapshot,
    StoredSnapshot,
    canonical_json,
    choose_valid,
)
from runstate.eventstore.validation import ValidEvent

_sql = sqlfiles.named("postgres", "eventstore", "snapshots.sql")


class _PgSnapshots:
    """Mixin of PostgresEventStore: state snapshots."""

    def _store_snapshot(
        self,
        conn: psycopg.Connection,
        run_id: str,
        seq: int,
        kind: str,
        encoded: EncodedSnapshot,
        reason: str,
    ) -> bool:
        """One statement: the insert and the prune of all but the latest N. The append's pipeline sends it
        without waiting for its result, so it cannot tell whether one was already at `seq`: reports stored."""
        conn.execute(
            _sql("write_snapshot"),
            {
                "run_id": run_id,
                "seq": seq,
                **snapshot_row_params(kind, encoded, reason),
                "older": self.policy.keep - 1,
            },
        )
        return True

    def _snapshots(self, conn: psycopg.Connection, run_id: str) -> list[StoredSnapshot]:
        rows = conn.execute(_sql("snapshots"), (run_id,)).fetchall()
        return [_stored_snapshot(r) for r in rows]

    def _projection_in_tx(
        self,
        conn: psycopg.Connection,
        run_id: str,
        stored_upto: int,
        pending: Sequence[tuple[int, ValidEvent]],
    ) -> RunSnapshot:
        """The run's projection through the stored events up to `stored_upto` plus `pending` ones."""
        hint = self.hints.known(run_id)
        recalled = hint.projection if hint is not None else None
        if stored_upto == 0:  # a new run: nothing stored to start from (and no round trip to find that out)
            base = RunSnapshot.empty(run_id)
        elif recalled is not None and recalled.last_event_seq <= stored_upto:
            base = recalled
        else:
            base = self._latest_projection_base(conn, run_id, stored_upto)
        now = datetime.now(UTC)
        if base.last_event_seq != stored_upto:
            base = fold(base, self._fetch_run(conn, run_id, base.last_event_seq, upto=stored_upto))
        return fold(base, (_pending_for_fold(run_id, seq, ev, now) for seq, ev in pending))

    def _latest_projection_base(self, conn: psycopg.Connection, run_id: str, upto: int) -> RunSnapshot:
        rows = conn.execute(_sql("projection_snapshots_upto"), (run_id, upto)).fetchall()
        chosen = choose_valid(run_id, [_stored_snapshot(r) for r in rows], self.metrics)
        best = (
            RunSnapshot.from_dict(chosen.state)
            if chosen.kind == KIND_PROJECTION
            else RunSnapshot.empty(run_id)
        )
        row = conn.execute(_sql("stored_projection_upto"), (run_id, upto)).fetchone()
        if row is not None:
            projected = RunSnapshot.from_dict(row[0])
            if projected.last_event_seq > best.last_event_seq:
                best = projected
        return best

    def checkpoint(self, run_id: str, state: Any = None) -> int:
        """Manual snapshot at the run's latest run_seq; returns that seq (0: the run has no events)."""
        if state is not None:
            canonical_json(run_id, state)

        def work(conn: psycopg.Connection) -> tuple[int, RunSnapshot | None, EncodedSnapshot | None]:
            row = conn.execute(_sql("lock_last_seq"), (run_id,)).fetchone()
            if row is None or row[0] == 0:
                return 0, None, None
            made, encoded = self._write_snapshot(conn, run_id, row[0], state, "checkpoint", row[0])
            return row[0], made, encoded

        seq, _, encoded = self._run(f"checkpoint run {run_id!r}", work)
        if encoded is not None:
            self.metrics.record_written(encoded)
        return seq


def _stored_snapshot(row: Sequence[Any]) -> StoredSnapshot:
    return StoredSnapshot(row[0], row[1], row[2], row[3], bytes(row[4]), row[5])


def _pending_for_fold(run_id: str, seq: int, event: ValidEvent, now: datetime) -> StoredEvent:
    """The event as `fold` sees it; `data` is decoded only for the types whose handler reads it
    (JSON-decoding every event of a batch was a large part of an interval snapshot's cost)."""
    return as_stored(run_id, seq, event, now, payloads=event.event_type in READS_DATA)
