"""The Postgres store's append: one pipelined flight in the common case, a locked transaction otherwise.

The common case (a batch of new keys, the run where this store last left it) is ONE statement
(sql/postgres/eventstore/005_one_statement_append.sql): it upserts the stream row (the run's row
lock) and inserts the batch after its last_seq. It leaves in pipeline mode, so the client does the
rest of its work while the server inserts: it folds the run's projection (the store's hint, hints.py)
and, when the batch crosses a snapshot point, encodes the snapshot and sends it behind the insert in
the same transaction. One round trip either way. The database checks every guess in the insert's
statement. When one was wrong (a key already stored: a retried append; an archived run; another
writer moved the run; a stale `expected_last_seq`) the transaction rolls back whole and the append
runs the slow way: in a transaction, lock the stream row, look up the stored keys when needed,
insert, snapshot, commit. The statements are named queries in sql/postgres/eventstore/append.sql.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors
from psycopg.pq import TransactionStatus

from runstate import sqlfiles
from runstate.eventstore.contract import AppendResult, EventType, RunSnapshot
from runstate.eventstore.hints import RunHint, fold_new
from runstate.eventstore.pg_sql import (
    GUESSED_WRONG_SQLSTATE,
    Stream,
    batch_params,
    one_statement_params,
)
from runstate.eventstore.sequencing import assign_seqs, check_expected
from runstate.eventstore.snapshots import (
    KIND_PROJECTION,
    KIND_STATE,
    EncodedSnapshot,
    encode_snapshot,
)
from runstate.eventstore.validation import ValidEvent

_sql = sqlfiles.named("postgres", "eventstore", "append.sql")


class KeyTaken(Exception):
    """An idempotency key of the batch is already stored: roll back, append with the probe."""


class GuessedWrong(Exception):
    """The one-statement append's check refused a guess (RSK02): append the slow way."""


@dataclass(frozen=True)
class _Pipelined:
    """What the one-statement append wrote, as the client computed it beside the server's insert."""

    before: int
    count_before: int
    projection: RunSnapshot | None  # the run's projection after the batch, if the hint had one before it
    snapshot: EncodedSnapshot | None


class _PgAppend:
    """Mixin of PostgresEventStore: append_batch's storage part."""

    def _append_valid(
        self, run_id: str, valid: list[ValidEvent], state: Any, expected_last_seq: int | None
    ) -> list[AppendResult]:
        new, places = _dedupe(valid)
        hint = self.hints.get(run_id)
        reason = self.policy.reason(
            hint.event_count, hint.event_count + len(new), (e.event_type for e in new)
        )
        # Without the run's projection the pipeline cannot make a due projection snapshot.
        if reason is None or state is not None or hint.projection is not None:
            try:
                done = self._run(
                    f"append to run {run_id!r}",
                    lambda conn: self._pipelined(conn, run_id, new, state, expected_last_seq, hint, reason),
                    transactional=False,
                )
            except (GuessedWrong, KeyTaken):
                pass
            else:
                if done.snapshot is not None:
                    self.metrics.record_written(done.snapshot)
                rows = list(enumerate(new, done.before + 1))
                self.hints.after_append(run_id, done.before, done.count_before, rows, done.projection)
                return [
                    AppendResult(done.before + place, idempotent=dup, persisted=not dup)
                    for place, dup in places
                ]
        return self._locked_append(run_id, valid, state, expected_last_seq)

    def _pipelined(
        self,
        conn: psycopg.Connection,
        run_id: str,
        new: list[ValidEvent],
        state: Any,
        expected: int | None,
        hint: RunHint,
        reason: str | None,
    ) -> _Pipelined:
        """The insert leaves first; the fold and the snapshot are computed while the server inserts.
        GuessedWrong or KeyTaken when the database refused a guess (nothing was written)."""
        snapshot_seq = hint.last_seq + len(new) if reason else None
        params = one_statement_params(run_id, new)
        params.update(
            expected=expected,
            every=self.policy.interval,
            signal_waiting=any(e.event_type == EventType.SIGNAL_WAITING for e in new),
            snapshot_seq=snapshot_seq,
            snapshot_count_before=hint.event_count if reason else None,
        )
        encoded = projection = None
        try:
            # A snapshot makes two statements, which must commit together (and roll back together if the
            # client fails between them); a lone statement is its own transaction, and faster without
            # pipeline mode.
            with _one_flight_transaction(conn) if snapshot_seq is not None else nullcontext():
                cursor = conn.execute(_sql("append_events"), params, prepare=True)
                if hint.projection is not None:
                    projection = fold_new(hint.projection, list(enumerate(new, hint.last_seq + 1)))
                if reason and snapshot_seq is not None:
                    kind = KIND_STATE if state is not None else KIND_PROJECTION
                    # _append_valid comes here for a projection snapshot only with the hint's projection.
                    doc = state if state is not None else projection.to_dict()
                    encoded = encode_snapshot(run_id, snapshot_seq, doc, self.policy)
                    self._store_snapshot(conn, run_id, snapshot_seq, kind, encoded, reason)
        except errors.UniqueViolation as exc:
            raise KeyTaken() from exc
        except psycopg.Error as exc:
            if exc.sqlstate == GUESSED_WRONG_SQLSTATE:
                raise GuessedWrong() from exc
            raise
        before, count_before = cursor.fetchone()
        return _Pipelined(before, count_before, projection, encoded)

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


@contextmanager
def _one_flight_transaction(conn: psycopg.Connection) -> Iterator[None]:
    """The block's statements between a BEGIN and a COMMIT, in pipeline mode: they leave as the block
    sends them, and the client waits once, when the block ends. Any error, the server's or the
    block's, rolls them back. (psycopg's own transaction() syncs at its edges in pipeline mode: three
    more round trips.)"""
    try:
        with conn.pipeline():
            conn.execute("BEGIN")
            try:
                yield
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
    except BaseException:
        if conn.info.transaction_status != TransactionStatus.IDLE:
            conn.rollback()  # a server error left the transaction open and failed
        raise


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
