"""The Postgres store's append: one pipelined flight in the common case, a locked transaction otherwise.

The common case (a batch of new keys, the run where this store last left it) is ONE statement
(sql/postgres/eventstore/005_one_statement_append.sql): it upserts the stream row (the run's row
lock) and inserts the batch after its last_seq. The client overlaps its own work with the server's:
- when the batch crosses a snapshot point, the insert leaves in pipeline mode and the client folds the
  run's projection (the store's hint, hints.py) and encodes the snapshot while the server inserts, then
  sends it behind the insert, between a BEGIN and a COMMIT of the same flight;
- a batch of HEAD_AHEAD_FROM events or more sends its first third ahead (it takes the stream row's
  lock) as soon as that third is validated, and the client validates and packs the rest while the
  server inserts it; an invalid event in the rest rolls the head back.
One round trip either way. The database checks every guess in the insert's statement. When one was
wrong (a key already stored: a retried append; an archived run; another writer moved the run; a
stale `expected_last_seq`) the transaction rolls back whole and the append runs the slow way: in a
transaction, lock the stream row, look up the stored keys when needed, insert, snapshot, commit. The
statements are named queries in sql/postgres/eventstore/append.sql.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import errors

from runstate import sqlfiles
from runstate.datastore import pipelined_transaction
from runstate.eventstore.contract import AppendResult, EventType, NewEvent, RunSnapshot
from runstate.eventstore.hints import RunHint, fold_new
from runstate.eventstore.pg_arrays import bytea_array
from runstate.eventstore.pg_sql import (
    GUESSED_WRONG_SQLSTATE,
    Stream,
    append_events_params,
    batch_params,
    head_params,
    key_bytes,
    key_text,
)
from runstate.eventstore.sequencing import assign_seqs, check_expected
from runstate.eventstore.snapshots import (
    KIND_PROJECTION,
    KIND_STATE,
    EncodedSnapshot,
    encode_snapshot,
)
from runstate.eventstore.validation import MAX_BATCH_EVENTS, ValidEvent, validate_batch

_sql = sqlfiles.named("postgres", "eventstore", "append.sql")


class KeyTaken(Exception):
    """An idempotency key of the batch is already stored: roll back, append with the probe."""


# A batch this long sends its first third ahead while the client validates the rest. The second
# statement costs the server about 200 us; the overlap hides about 9 us per event of the client's work.
HEAD_AHEAD_FROM = 32


@dataclass
class _Batch:
    """A batch as it is validated, part by part: its events, the distinct new ones in order, and for
    each event its 1-based place among them and whether it repeats a key earlier in the batch."""

    valid: list[ValidEvent] = field(default_factory=list)
    new: list[ValidEvent] = field(default_factory=list)
    places: list[tuple[int, bool]] = field(default_factory=list)
    _place_of: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, valid: list[ValidEvent]) -> _Batch:
        return cls().extended(valid)

    def extended(self, valid: list[ValidEvent]) -> _Batch:
        batch = _Batch(self.valid + valid, list(self.new), list(self.places), dict(self._place_of))
        for event in valid:
            place = batch._place_of.get(event.idempotency_key)
            if place is None:
                batch.new.append(event)
                place = batch._place_of[event.idempotency_key] = len(batch.new)
                batch.places.append((place, False))
            else:
                batch.places.append((place, True))
        return batch


@dataclass(frozen=True)
class _Flown:
    """What the one-flight append wrote, as the client computed it beside the server's inserts."""

    batch: _Batch
    before: int
    count_before: int
    projection: RunSnapshot | None  # the run's projection after the batch, if the hint had one before it
    snapshot: EncodedSnapshot | None


class _Refused(Exception):
    """The database refused a guess of the one-flight append (nothing was written): append `batch`
    the slow way."""

    def __init__(self, batch: _Batch):
        self.batch = batch


class _PgAppend:
    """Mixin of PostgresEventStore: append_batch's storage part."""

    def _append_events(
        self, run_id: str, events: list[NewEvent], state: Any, expected_last_seq: int | None
    ) -> list[AppendResult]:
        hint = self.hints.get(run_id)
        # A head sent ahead commits the append to one flight, which can make a due projection snapshot
        # only from the hint's projection.
        if not HEAD_AHEAD_FROM <= len(events) <= MAX_BATCH_EVENTS or (
            state is None and hint.projection is None
        ):
            return super()._append_events(run_id, events, state, expected_last_seq)
        split = len(events) // 3
        head = _Batch.of(validate_batch(run_id, events[:split], max_event_bytes=self.max_event_bytes))
        rest = (events[split:], split)
        return self._append_in_one_flight(run_id, head, rest, state, expected_last_seq, hint)

    def _append_valid(
        self, run_id: str, valid: list[ValidEvent], state: Any, expected_last_seq: int | None
    ) -> list[AppendResult]:
        batch, hint = _Batch.of(valid), self.hints.get(run_id)
        if self._snapshot_reason(hint, batch) and state is None and hint.projection is None:
            return self._locked_append(run_id, valid, state, expected_last_seq)
        return self._append_in_one_flight(run_id, batch, None, state, expected_last_seq, hint)

    def _snapshot_reason(self, hint: RunHint, batch: _Batch) -> str | None:
        """Why the batch writes a snapshot if the run stands where the hint says, or None."""
        count = hint.event_count
        return self.policy.reason(count, count + len(batch.new), (e.event_type for e in batch.new))

    def _append_in_one_flight(
        self,
        run_id: str,
        head: _Batch,
        rest: tuple[list[NewEvent], int] | None,
        state: Any,
        expected: int | None,
        hint: RunHint,
    ) -> list[AppendResult]:
        try:
            done = self._run(
                f"append to run {run_id!r}",
                lambda conn: self._flight(conn, run_id, head, rest, state, expected, hint),
                transactional=False,
            )
        except _Refused as refused:
            return self._locked_append(run_id, refused.batch.valid, state, expected)
        if done.snapshot is not None:
            self.metrics.record_written(done.snapshot)
        rows = list(enumerate(done.batch.new, done.before + 1))
        self.hints.after_append(run_id, done.before, done.count_before, rows, done.projection)
        return [
            AppendResult(done.before + place, idempotent=dup, persisted=not dup)
            for place, dup in done.batch.places
        ]

    def _flight(
        self,
        conn: psycopg.Connection,
        run_id: str,
        batch: _Batch,
        rest: tuple[list[NewEvent], int] | None,
        state: Any,
        expected: int | None,
        hint: RunHint,
    ) -> _Flown:
        """One round trip. With `rest`, `batch` is the head: it leaves first, taking the run's stream
        row lock, and the rest is validated while the server inserts it (an invalid event rolls the head
        back). Then the insert of the rest, which updates the stream row and checks the client's
        guesses; the fold and the snapshot are computed while the server inserts. _Refused when the
        database refused a guess or found a key already stored (nothing was written)."""
        ahead = len(batch.new) if rest is not None else 0
        reason = None if rest is not None else self._snapshot_reason(hint, batch)
        # Two statements must commit together, and roll back together if the client fails between
        # them; a lone statement is its own transaction, and faster without pipeline mode.
        one_flight = rest is not None or reason is not None
        complete = rest is None
        encoded = projection = None
        try:
            with pipelined_transaction(conn) if one_flight else nullcontext():
                if rest is not None:
                    conn.execute(_sql("insert_head"), head_params(run_id, batch.new), prepare=True)
                    events, first_index = rest
                    more = validate_batch(
                        run_id, events, max_event_bytes=self.max_event_bytes, first_index=first_index
                    )
                    batch, complete = batch.extended(more), True
                    reason = self._snapshot_reason(hint, batch)
                params = self._append_params(run_id, batch, ahead, expected, hint, reason)
                cursor = conn.execute(_sql("append_events"), params, prepare=True)
                if hint.projection is not None:
                    projection = fold_new(hint.projection, list(enumerate(batch.new, hint.last_seq + 1)))
                if reason is not None:
                    seq = hint.last_seq + len(batch.new)
                    kind = KIND_STATE if state is not None else KIND_PROJECTION
                    # A projection snapshot comes here only when the hint has the run's projection.
                    doc = state if state is not None else projection.to_dict()
                    encoded = encode_snapshot(run_id, seq, doc, self.policy)
                    self._store_snapshot(conn, run_id, seq, kind, encoded, reason)
        except psycopg.Error as exc:
            refused = isinstance(exc, errors.UniqueViolation) or exc.sqlstate == GUESSED_WRONG_SQLSTATE
            if refused and complete:
                raise _Refused(batch) from exc
            raise
        before, count_before = cursor.fetchone()
        return _Flown(batch, before, count_before, projection, encoded)

    def _append_params(
        self,
        run_id: str,
        batch: _Batch,
        ahead: int,
        expected: int | None,
        hint: RunHint,
        reason: str | None,
    ) -> dict[str, Any]:
        params = append_events_params(run_id, batch.new, ahead)
        params.update(
            expected=expected,
            every=self.policy.interval,
            signal_waiting=any(e.event_type == EventType.SIGNAL_WAITING for e in batch.new),
            snapshot_seq=hint.last_seq + len(batch.new) if reason else None,
            snapshot_count_before=hint.event_count if reason else None,
        )
        return params

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
        params = {"keys": bytea_array([key_bytes(key) for key in keys]), "run_id": run_id}
        return {key_text(key): seq for key, seq in conn.execute(query, params).fetchall()}
