"""The Postgres store's append: one statement in the common case, a locked transaction otherwise.

The common case (a batch of new keys, the run where this store last left it) is ONE statement in
autocommit, so one round trip (sql/postgres/eventstore/005_one_statement_append.sql): it upserts the stream
row (the run's row lock), inserts the batch after its last_seq, and writes the snapshot computed
from the store's hint of the run (hints.py) when the batch crosses a snapshot point. The database
checks every guess in that statement. When one was wrong (a key already stored: a retried append;
an archived run; another writer moved the run; a stale `expected_last_seq`) the statement rolls
back whole and the append runs the slow way: in a transaction, lock the stream row, look up the
stored keys when needed, insert, snapshot, commit. The statements are named queries in
sql/postgres/eventstore/append.sql.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors

from runstate import sqlfiles
from runstate.eventstore.contract import AppendResult, EventType, RunSnapshot
from runstate.eventstore.hints import RunHint, fold_new
from runstate.eventstore.pg_sql import (
    GUESSED_WRONG_SQLSTATE,
    Stream,
    batch_params,
    one_statement_params,
    snapshot_row_params,
)
from runstate.eventstore.sequencing import assign_seqs, check_expected
from runstate.eventstore.snapshots import (
    KIND_PROJECTION,
    KIND_STATE,
    EncodedSnapshot,
    SnapshotPolicy,
    encode_snapshot,
)
from runstate.eventstore.validation import ValidEvent

_sql = sqlfiles.named("postgres", "eventstore", "append.sql")


class KeyTaken(Exception):
    """An idempotency key of the batch is already stored: roll back, append with the probe."""


class GuessedWrong(Exception):
    """The one-statement append's check refused a guess (RSK02): append the slow way."""


@dataclass(frozen=True)
class _Snapshot:
    seq: int
    count_before: int
    kind: str
    reason: str
    encoded: EncodedSnapshot
    projection: RunSnapshot | None


class _PgAppend:
    """Mixin of PostgresEventStore: append_batch's storage part."""

    def _append_valid(
        self, run_id: str, valid: list[ValidEvent], state: Any, expected_last_seq: int | None
    ) -> list[AppendResult]:
        new, places = _dedupe(valid)
        what = f"append to run {run_id!r}"
        snapshot = self._guess_snapshot(run_id, new, state)
        if snapshot is not False:
            try:
                before, count_before = self._run(
                    what,
                    lambda conn: _one_statement(conn, run_id, new, expected_last_seq, snapshot, self.policy),
                    transactional=False,
                )
            except (GuessedWrong, KeyTaken):
                pass
            else:
                self._committed(run_id, before, count_before, new, snapshot)
                return [
                    AppendResult(before + place, idempotent=dup, persisted=not dup) for place, dup in places
                ]
        return self._locked_append(run_id, valid, state, expected_last_seq)

    def _guess_snapshot(self, run_id: str, new: list[ValidEvent], state: Any) -> _Snapshot | None | bool:
        """The snapshot this batch writes if the run stands where the hint says (None: no snapshot is
        due; False: one is due but the hint lacks the projection to make it: append the slow way)."""
        hint: RunHint = self.hints.get(run_id)
        reason = self.policy.reason(
            hint.event_count, hint.event_count + len(new), (e.event_type for e in new)
        )
        if reason is None:
            return None
        seq = hint.last_seq + len(new)
        if state is not None:
            encoded = encode_snapshot(run_id, seq, state, self.policy)
            return _Snapshot(seq, hint.event_count, KIND_STATE, reason, encoded, None)
        if hint.projection is None:
            return False
        projection = fold_new(hint.projection, list(enumerate(new, hint.last_seq + 1)))
        encoded = encode_snapshot(run_id, seq, projection.to_dict(), self.policy)
        return _Snapshot(seq, hint.event_count, KIND_PROJECTION, reason, encoded, projection)

    def _committed(
        self, run_id: str, before: int, count_before: int, new: list[ValidEvent], snapshot: _Snapshot | None
    ) -> None:
        if snapshot is not None:
            self.metrics.record_written(snapshot.encoded)
        rows = list(enumerate(new, before + 1))
        self.hints.after_append(run_id, before, count_before, rows, snapshot.projection if snapshot else None)

    # -- the slow way -------------------------------------------------------------------------

    def _locked_append(
        self, run_id: str, valid: list[ValidEvent], state: Any, expected_last_seq: int | None
    ) -> list[AppendResult]:
        written: list[tuple[RunSnapshot | None, EncodedSnapshot | None]] = []
        outcome: list[tuple[Stream, list[tuple[int, ValidEvent]]]] = []

        def work(conn: psycopg.Connection, probe: bool) -> list[AppendResult]:
            written.clear()
            outcome.clear()
            return self._append_tx(conn, run_id, valid, state, expected_last_seq, written, outcome, probe)

        what = f"append to run {run_id!r}"
        try:
            results = self._run(what, lambda conn: work(conn, False), pipeline=True)
        except KeyTaken:  # a retried batch: the rollback undid everything, look the stored keys up first
            results = self._run(what, lambda conn: work(conn, True), pipeline=True)
        projection = None  # once the transaction committed: what it wrote
        for projection, encoded in written:  # noqa: B007  (at most one snapshot per append)
            if encoded is not None:
                self.metrics.record_written(encoded)
        for stream, new in outcome:
            self.hints.after_append(run_id, stream.last_seq, stream.event_count, new, projection)
        return results

    def _lock_stream(self, conn: psycopg.Connection, run_id: str) -> Stream:
        # The upsert takes the row lock that serialises this run's writers (and only them).
        row = conn.execute(_sql("lock_stream"), (run_id,)).fetchone()
        return Stream(row[0], row[1], row[2])

    def _append_tx(
        self,
        conn: psycopg.Connection,
        run_id: str,
        valid: list[ValidEvent],
        state: Any,
        expected: int | None,
        written: list[tuple[RunSnapshot | None, EncodedSnapshot | None]],
        outcome: list[tuple[Stream, list[tuple[int, ValidEvent]]]] | None = None,
        probe: bool = False,
    ) -> list[AppendResult]:
        stream = self._lock_stream(conn, run_id)
        # Archived keys live in run_events_archive, which the insert's ON CONFLICT cannot see: probe those.
        known: dict[str, int] = {}
        stale = expected is not None and stream.last_seq != expected
        if probe or stream.archived or stale:
            known = self._existing_keys(conn, run_id, sorted({v.idempotency_key for v in valid}), stream)
        check_expected(run_id, valid, known, stream.last_seq, expected)
        results, new, next_seq = assign_seqs(valid, known, stream.last_seq)
        if not new:
            return results
        reason = self.policy.reason(
            stream.event_count, stream.event_count + len(new), (e.event_type for _, e in new)
        )
        # A stored key makes the insert raise RSK01 (only possible without the probe: the stream row
        # lock keeps racing writers out of this run), which rolls everything back.
        conn.execute(_sql("insert_new"), batch_params(run_id, new, next_seq))
        if reason:
            written.append(self._write_snapshot(conn, run_id, next_seq, state, reason, stream.last_seq, new))
        if outcome is not None:
            outcome.append((stream, new))
        return results

    def _existing_keys(
        self, conn: psycopg.Connection, run_id: str, keys: list[str], stream: Stream
    ) -> dict[str, int]:
        if stream.event_count == 0 and not stream.archived:
            return {}
        # Archived keys are in run_events_archive too (the insert's ON CONFLICT cannot see it).
        query = _sql("existing_keys_with_archive" if stream.archived else "existing_keys")
        return dict(conn.execute(query, {"keys": keys, "run_id": run_id}).fetchall())


def _dedupe(valid: list[ValidEvent]) -> tuple[list[ValidEvent], list[tuple[int, bool]]]:
    """The batch's distinct keys in order, and for each event (its 1-based place among them, whether
    it repeats a key earlier in the batch)."""
    new: list[ValidEvent] = []
    place_of: dict[str, int] = {}
    places: list[tuple[int, bool]] = []
    for event in valid:
        place = place_of.get(event.idempotency_key)
        if place is None:
            new.append(event)
            place = place_of[event.idempotency_key] = len(new)
            places.append((place, False))
        else:
            places.append((place, True))
    return new, places


def _snapshot_params(snapshot: _Snapshot | None) -> dict[str, Any]:
    """The statement's snapshot parameters: all NULL when the batch carries none (its snapshot CTEs then
    touch nothing)."""
    if snapshot is None:
        return {"snapshot_seq": None, "snapshot_count_before": None, **snapshot_row_params()}
    return {
        "snapshot_seq": snapshot.seq,
        "snapshot_count_before": snapshot.count_before,
        **snapshot_row_params(snapshot.kind, snapshot.encoded, snapshot.reason),
    }


def _one_statement(
    conn: psycopg.Connection,
    run_id: str,
    new: list[ValidEvent],
    expected: int | None,
    snapshot: _Snapshot | None,
    policy: SnapshotPolicy,
) -> tuple[int, int]:
    """(the run's last_seq and event count before the batch), or GuessedWrong / KeyTaken."""
    params = one_statement_params(run_id, new)
    params.update(
        expected=expected,
        every=policy.interval,
        signal_waiting=any(e.event_type == EventType.SIGNAL_WAITING for e in new),
        older=policy.keep - 1,
        **_snapshot_params(snapshot),
    )
    try:
        row = conn.execute(_sql("append_one_statement"), params, prepare=True).fetchone()
    except errors.UniqueViolation as exc:
        raise KeyTaken() from exc
    except psycopg.Error as exc:
        if exc.sqlstate == GUESSED_WRONG_SQLSTATE:
            raise GuessedWrong() from exc
        raise
    return row[0], row[1]
