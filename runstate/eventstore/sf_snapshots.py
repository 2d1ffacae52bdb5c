"""The Snowflake store's state snapshots: written inside the append transaction, and by checkpoint()."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from runstate import sqlfiles
from runstate.eventstore.contract import RunSnapshot
from runstate.eventstore.projection import fold
from runstate.eventstore.rows import as_stored
from runstate.eventstore.sf_sql import b64
from runstate.eventstore.snapshots import (
    KIND_PROJECTION,
    EncodedSnapshot,
    StoredSnapshot,
    canonical_json,
    choose_valid,
)
from runstate.eventstore.validation import ValidEvent

# _snapshots' optional bounds, (upto given, kind given), to the named query that has them.
_SNAPSHOTS_QUERY = {
    (False, False): "snapshots",
    (True, False): "snapshots_upto",
    (False, True): "snapshots_of_kind",
    (True, True): "snapshots_upto_of_kind",
}


_sql = sqlfiles.named("snowflake", "eventstore", "snapshots.sql")


class _SfSnapshots:
    """Mixin of SnowflakeEventStore: state snapshots."""

    def _store_snapshot(
        self, cur: Any, run_id: str, seq: int, kind: str, encoded: EncodedSnapshot, reason: str
    ) -> bool:
        cur.execute(
            _sql("insert_snapshot"),
            (
                run_id,
                seq,
                kind,
                encoded.encoding,
                base64.b64encode(encoded.payload).decode("ascii"),
                encoded.checksum,
                encoded.raw_bytes,
                encoded.stored_bytes,
                reason,
                run_id,
                seq,
            ),
        )
        inserted = cur.rowcount
        cur.execute(_sql("snapshot_seqs"), (run_id,))
        seqs = [int(r[0]) for r in cur.fetchall()]
        if len(seqs) > self.policy.keep:
            cur.execute(_sql("prune_snapshots"), (run_id, seqs[self.policy.keep - 1]))
        return bool(inserted)

    def _snapshots(
        self, cur: Any, run_id: str, *, upto: int | None = None, kind: str | None = None
    ) -> list[StoredSnapshot]:
        params: list[Any] = [run_id]
        if upto is not None:
            params.append(upto)
        if kind is not None:
            params.append(kind)
        cur.execute(_sql(_SNAPSHOTS_QUERY[upto is not None, kind is not None]), params)
        return [StoredSnapshot(r[0], int(r[1]), r[2], r[3], b64(r[4]), r[5]) for r in cur.fetchall()]

    def _projection_in_tx(
        self, cur: Any, run_id: str, stored_upto: int, pending: Sequence[tuple[int, ValidEvent]]
    ) -> RunSnapshot:
        now = datetime.now(UTC)
        recalled = self._recalled(run_id)
        if recalled is not None and recalled.last_event_seq <= stored_upto:
            events = (
                self._fetch_run(cur, run_id, recalled.last_event_seq, upto=stored_upto)
                if recalled.last_event_seq < stored_upto
                else []
            )
            return fold(fold(recalled, events), (as_stored(run_id, seq, ev, now) for seq, ev in pending))
        chosen = choose_valid(
            run_id, self._snapshots(cur, run_id, upto=stored_upto, kind=KIND_PROJECTION), self.metrics
        )
        base = (
            RunSnapshot.from_dict(chosen.state)
            if chosen.kind == KIND_PROJECTION
            else RunSnapshot.empty(run_id)
        )
        stored = self._stored_projection(cur, run_id)
        if stored is not None and base.last_event_seq < stored.last_event_seq <= stored_upto:
            base = stored
        events = self._fetch_run(cur, run_id, base.last_event_seq, upto=stored_upto)
        now = datetime.now(UTC)
        return fold(fold(base, events), (as_stored(run_id, seq, ev, now) for seq, ev in pending))

    def checkpoint(self, run_id: str, state: Any = None) -> int:
        if state is not None:
            canonical_json(run_id, state)
        self._merge_usable()

        def work(cur: Any) -> tuple[int, tuple[RunSnapshot | None, EncodedSnapshot | None]]:
            if not self._stream_exists(cur, run_id):
                return 0, (None, None)
            last_seq, _, _ = self._lock_stream(cur, run_id)
            if last_seq == 0:
                return 0, (None, None)
            return last_seq, self._write_snapshot(cur, run_id, last_seq, state, "checkpoint", last_seq)

        seq, (made, encoded) = self._run(f"checkpoint run {run_id!r}", work)
        if encoded is not None:
            self.metrics.record_written(encoded)
        self._remember(made)
        return seq
