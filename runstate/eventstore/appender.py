"""Appender: how the store appends events and writes snapshots, in one place.

An append, top to bottom (Appender.append_batch):
1. Check the arguments; validate the batch (validation.py). Nothing is written for a bad event.
2. A backend that `guesses` (Postgres) appends in ONE round trip when it can: the store guesses where the
   run stands from what it last saw of it (its RunHints, hints.py), and the backend's statement inserts
   the batch after the run's last seq and checks every guess. When the batch crosses a snapshot point,
   the store folds the run's projection and encodes the snapshot while the server inserts, and sends it
   behind, in the same transaction. A batch of HEAD_AHEAD_FROM events or more sends its first third ahead
   as soon as that third is validated, and validates the rest while the server inserts it (an invalid
   event rolls the head back). A refused guess (a retried batch, an archived run, another writer, a
   stale `expected_last_seq`) wrote nothing, and the append goes on the locked way.
3. The locked way, in one transaction: lock the run's stream row, look up the stored keys when needed
   (a backend that does not enforce keys: always), check `expected_last_seq`, number the new events
   (sequencing.py), insert them and advance the stream, write the snapshot when one is due. A backend
   whose commits can be lost (`confirms_commits`) has the written keys read back, and the transaction
   repeated until they are there.
4. Once committed: count the snapshot, remember where the run stands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from runstate.eventstore.backend import Guess, GuessRefused, KeyTaken, StoreBackend, Stream, Tx
from runstate.eventstore.contract import AppendResult, EventType, NewEvent, RunSnapshot
from runstate.eventstore.hints import RunHint, RunHints, fold_new
from runstate.eventstore.lake_archive import LakeArchive
from runstate.eventstore.projector import Projector
from runstate.eventstore.sequencing import Batch, assign_seqs, check_expected
from runstate.eventstore.snapshots import (
    KIND_PROJECTION,
    KIND_STATE,
    EncodedSnapshot,
    SnapshotMetrics,
    SnapshotPolicy,
    canonical_json,
    encode_snapshot,
)
from runstate.eventstore.validation import (
    MAX_BATCH_EVENTS,
    ValidEvent,
    check_expected_last_seq,
    check_run_id,
    validate_batch,
)

# A batch this long sends its first third ahead while the client validates the rest. The second
# statement costs the server about 200 us; the overlap hides about 9 us per event of the client's work.
HEAD_AHEAD_FROM = 32


class Appender:
    """The store's write side over `backend`: appends and snapshots. It shares with the EventStore that
    holds it the run hints (where each run it wrote stands), the snapshot policy and metrics, the
    projector (a projection snapshot's fold) and the lake archive (keys of runs archived there)."""

    def __init__(
        self,
        backend: StoreBackend,
        *,
        policy: SnapshotPolicy,
        metrics: SnapshotMetrics,
        hints: RunHints,
        projector: Projector,
        lake: LakeArchive,
        max_event_bytes: int,
    ):
        self.backend = backend
        self.policy = policy
        self.metrics = metrics
        self.hints = hints
        self.projector = projector
        self.lake = lake
        self.max_event_bytes = max_event_bytes

    def append_batch(
        self,
        run_id: str,
        events: Sequence[NewEvent],
        state: Any = None,
        *,
        expected_last_seq: int | None = None,
    ) -> list[AppendResult]:
        """EventStore.append_batch, as the module docs tell it."""
        check_run_id(run_id)
        if state is not None:
            canonical_json(run_id, state)  # bad state is bad input: reject before any write
        check_expected_last_seq(run_id, expected_last_seq)
        events = list(events)
        hint = self.hints.get(run_id)
        # A head sent ahead commits the append to one flight, which can make a due projection snapshot
        # only from the hint's projection.
        if (
            self.backend.guesses
            and HEAD_AHEAD_FROM <= len(events) <= MAX_BATCH_EVENTS
            and (state is not None or hint.projection is not None)
        ):
            split = len(events) // 3
            head = Batch.of(validate_batch(run_id, events[:split], max_event_bytes=self.max_event_bytes))
            return self._append_in_one_flight(
                run_id, head, (events[split:], split), state, expected_last_seq, hint
            )
        valid = validate_batch(run_id, events, max_event_bytes=self.max_event_bytes)
        if not valid:
            return []
        batch = Batch.of(valid)
        if not self.backend.guesses or (
            self._snapshot_reason(hint, batch) and state is None and hint.projection is None
        ):
            return self._append_locked(run_id, valid, state, expected_last_seq)
        return self._append_in_one_flight(run_id, batch, None, state, expected_last_seq, hint)

    def _snapshot_reason(self, hint: RunHint, batch: Batch) -> str | None:
        """Why the batch writes a snapshot if the run stands where the hint says, or None."""
        count = hint.event_count
        return self.policy.reason(count, count + len(batch.new), (e.event_type for e in batch.new))

    def _append_in_one_flight(
        self,
        run_id: str,
        head: Batch,
        rest: tuple[list[NewEvent], int] | None,
        state: Any,
        expected: int | None,
        hint: RunHint,
    ) -> list[AppendResult]:
        try:
            done = self.backend.run(
                f"append to run {run_id!r}",
                lambda tx: self._flight(tx, run_id, head, rest, state, expected, hint),
                transactional=False,
            )
        except _Refused as refused:
            return self._append_locked(run_id, refused.batch.valid, state, expected)
        return self._committed(run_id, done)

    def _flight(
        self,
        tx: Tx,
        run_id: str,
        batch: Batch,
        rest: tuple[list[NewEvent], int] | None,
        state: Any,
        expected: int | None,
        hint: RunHint,
    ) -> _Wrote:
        """One round trip. With `rest`, `batch` is the head: it leaves first, taking the run's stream row
        lock, and the rest is validated while the server inserts it. Then the insert of the rest, which
        checks the guesses; the fold and the snapshot are computed while the server inserts."""
        ahead = len(batch.new) if rest is not None else 0
        reason = None if rest is not None else self._snapshot_reason(hint, batch)
        encoded = projection = None
        try:
            # Two statements must commit together, and roll back together if the client fails between
            # them; a lone statement is its own transaction, and faster so.
            with self.backend.flight(tx, together=rest is not None or reason is not None):
                if rest is not None:
                    self.backend.insert_head(tx, run_id, batch.new)
                    events, first_index = rest
                    more = validate_batch(
                        run_id, events, max_event_bytes=self.max_event_bytes, first_index=first_index
                    )
                    batch, rest = batch.extended(more), None
                    reason = self._snapshot_reason(hint, batch)
                guess = Guess(
                    expected_last_seq=expected,
                    snapshot_every=self.policy.interval,
                    signal_waiting=any(e.event_type == EventType.SIGNAL_WAITING for e in batch.new),
                    snapshot_seq=hint.last_seq + len(batch.new) if reason else None,
                    snapshot_count_before=hint.event_count if reason else None,
                )
                stood = self.backend.insert_guessed(tx, run_id, batch.new, ahead, guess)
                if hint.projection is not None:
                    projection = fold_new(hint.projection, list(enumerate(batch.new, hint.last_seq + 1)))
                if reason is not None:
                    seq = hint.last_seq + len(batch.new)
                    kind = KIND_STATE if state is not None else KIND_PROJECTION
                    # A projection snapshot comes here only when the hint has the run's projection.
                    doc = state if state is not None else projection.to_dict()
                    encoded = encode_snapshot(run_id, seq, doc, self.policy)
                    self.backend.write_snapshot(tx, run_id, seq, kind, encoded, reason, self.policy.keep)
        except GuessRefused as exc:
            if rest is not None:  # cannot be: the head's statement reports no earlier than the next one
                raise
            raise _Refused(batch) from exc
        before, count_before = stood()
        new = list(enumerate(batch.new, before + 1))
        return _Wrote(batch.results(before), Stream(before, count_before, False), new, projection, encoded)

    def _append_locked(
        self, run_id: str, valid: list[ValidEvent], state: Any, expected: int | None
    ) -> list[AppendResult]:
        """The append in a transaction that holds the run's stream row lock (see the module docs)."""
        ticket = self.backend.open_stream(run_id)
        what = f"append to run {run_id!r}"

        def persisted(done: _Wrote) -> dict[str, int]:
            return {v.idempotency_key: r.run_seq for v, r in zip(valid, done.results) if r.persisted}

        def attempt(probe: bool) -> _Wrote:
            work = partial(self._append_tx, run_id=run_id, valid=valid, state=state, expected=expected,
                           ticket=ticket, probe=probe)  # fmt: skip
            return self.backend.run_confirmed(what, run_id, work, persisted, pipeline=True)

        try:
            done = attempt(probe=not self.backend.enforces_keys)
        except KeyTaken:  # a retried batch: the rollback undid everything, look the stored keys up first
            done = attempt(probe=True)
        return self._committed(run_id, done)

    def _committed(self, run_id: str, done: _Wrote) -> list[AppendResult]:
        """Once the append committed: count its snapshot, remember where the run stands."""
        if done.snapshot is not None:
            self.metrics.record_written(done.snapshot)
        if done.stream is not None:
            self.hints.after_append(
                run_id, done.stream.last_seq, done.stream.event_count, done.new, done.projection
            )
        return done.results

    def _append_tx(
        self,
        tx: Tx,
        *,
        run_id: str,
        valid: list[ValidEvent],
        state: Any,
        expected: int | None,
        ticket: Any,
        probe: bool,
    ) -> _Wrote:
        stream = self.backend.lock_stream(tx, run_id)
        # Look the stored keys up when asked to (probe), when the insert cannot see them (an archived run's
        # are in the archive), or when a stale expected_last_seq may be a pure retry; an empty run has none.
        stale = expected is not None and stream.last_seq != expected
        known: dict[str, int] = {}
        if (probe or stream.archived or stale) and (stream.event_count or stream.archived):
            keys = sorted({v.idempotency_key for v in valid})
            known = self.backend.existing_keys(tx, run_id, keys, archived=stream.archived)
            if stream.archived:  # archived to the lake: its keys are known there only
                known.update(self.lake.keys(tx, run_id, keys))
        check_expected(run_id, valid, known, stream.last_seq, expected)
        results, new, next_seq = assign_seqs(valid, known, stream.last_seq)
        if not new:
            return _Wrote(results)
        self.backend.insert_new(tx, run_id, stream, new, ticket)
        count = stream.event_count
        reason = self.policy.reason(count, count + len(new), (e.event_type for _, e in new))
        if not reason:
            return _Wrote(results, stream, new)
        projection, encoded = self._write_snapshot(tx, run_id, next_seq, state, reason, stream.last_seq, new)
        return _Wrote(results, stream, new, projection, encoded)

    # -- snapshots ------------------------------------------------------------------------------

    def _write_snapshot(
        self,
        tx: Tx,
        run_id: str,
        seq: int,
        state: Any,
        reason: str,
        stored_upto: int,
        pending: Sequence[tuple[int, ValidEvent]] = (),
    ) -> tuple[RunSnapshot | None, EncodedSnapshot | None]:
        """Write the snapshot at `seq`: `state` when given, else the run's projection at `seq`. Returns the
        projection (when that is what was written, to remember once committed) and the encoded snapshot
        (None when one was already stored at `seq`); the caller counts it once the transaction committed."""
        if state is not None:
            kind, projection, encoded = KIND_STATE, None, encode_snapshot(run_id, seq, state, self.policy)
        else:
            hint = self.hints.known(run_id)
            recalled = hint.projection if hint is not None else None
            projection = self.projector.projection_at(tx, run_id, stored_upto, pending, recalled)
            kind = KIND_PROJECTION
            encoded = encode_snapshot(run_id, seq, projection.to_dict(), self.policy)
        stored = self.backend.write_snapshot(tx, run_id, seq, kind, encoded, reason, self.policy.keep)
        return projection, encoded if stored else None

    def checkpoint(self, run_id: str, state: Any = None) -> int:
        """A snapshot at the run's latest run_seq now; returns that seq (0: the run has no events)."""
        if state is not None:
            canonical_json(run_id, state)

        def work(tx: Tx) -> tuple[int, EncodedSnapshot | None]:
            stream = self.backend.find_stream(tx, run_id)
            if stream is None or stream.last_seq == 0:
                return 0, None
            seq = stream.last_seq
            return seq, self._write_snapshot(tx, run_id, seq, state, "checkpoint", seq)[1]

        seq, encoded = self.backend.run(f"checkpoint run {run_id!r}", work)
        if encoded is not None:
            self.metrics.record_written(encoded)
        return seq


@dataclass(frozen=True)
class _Wrote:
    """What an append's transaction wrote: the results, and when it wrote events, where the run stood
    before them, the new rows, and the snapshot (with the run's projection after them, when known)."""

    results: list[AppendResult]
    stream: Stream | None = None
    new: list[tuple[int, ValidEvent]] = field(default_factory=list)
    projection: RunSnapshot | None = None
    snapshot: EncodedSnapshot | None = None


class _Refused(Exception):
    """The database refused a guess of the one-flight append (nothing was written): append `batch`
    the locked way."""

    def __init__(self, batch: Batch):
        self.batch = batch
