"""EventStore: the run state store, once, over a backend that supplies its statements and transactions.

The shape of eventsourcing's `PostgresApplicationRecorder(datastore)`: the store holds a StoreBackend
(backend.py: one per database, registered in `runstate.backends`) and does everything that does not
depend on the database. PostgresEventStore and SnowflakeEventStore are this class with their backend.

An append, top to bottom (append_batch):
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

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, Self, TypeVar

from runstate.config import ARCHIVE_TARGETS
from runstate.eventstore import archive as archival
from runstate.eventstore.backend import Guess, GuessRefused, KeyTaken, StoreBackend, Stream, Tx
from runstate.eventstore.contract import (
    DEFAULT_MAX_EVENT_BYTES,
    AppendResult,
    EventType,
    InvalidEvent,
    NewEvent,
    ProjectionReport,
    RunSnapshot,
    StoredEvent,
)
from runstate.eventstore.feed import check_poll_seconds, check_position, follow
from runstate.eventstore.hints import RunHint, RunHints, fold_new
from runstate.eventstore.lake_archive import LakeArchive, LakeReader
from runstate.eventstore.projector import Projector
from runstate.eventstore.resume import Resume
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

T = TypeVar("T")

# A batch this long sends its first third ahead while the client validates the rest. The second
# statement costs the server about 200 us; the overlap hides about 9 us per event of the client's work.
HEAD_AHEAD_FROM = 32


class EventStore:
    """An append-only, idempotent log of workflow runs' events, with snapshots and projections, over
    `backend`; thread-safe when the backend is (both shipped ones are)."""

    def __init__(
        self,
        backend: StoreBackend,
        *,
        snapshot_interval: int = 100,
        keep_snapshots: int = 3,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        large_snapshot_bytes: int = 100 * 1024,
        archive_to: str = "postgres",
        lake: Callable[[], LakeReader] | None = None,
    ):
        if int(max_event_bytes) < 1:
            raise ValueError(f"max_event_bytes must be positive, got {max_event_bytes!r}")
        if archive_to not in ARCHIVE_TARGETS:
            raise ValueError(f"archive_to must be one of {', '.join(ARCHIVE_TARGETS)}, got {archive_to!r}")
        self.backend = backend
        self.max_event_bytes = int(max_event_bytes)
        self.policy = SnapshotPolicy.of(snapshot_interval, keep_snapshots, large_snapshot_bytes)
        self.snapshot_interval = self.policy.interval
        self.metrics = SnapshotMetrics()
        # Where each run this store wrote stands, and its projection: the one-flight append's guesses,
        # and the base of the next snapshot's fold.
        self.hints = RunHints()
        # Where archive() moves old runs (RUNSTATE_ARCHIVE_TO); runs archived to the lake are read back
        # through `lake` (built on first use) whatever it says.
        self.archive_to = archive_to
        self.lake = LakeArchive(backend, lake)
        self.projector = Projector(backend, self.metrics, self.policy, fetch=self.lake.events)

    @property
    def schema(self) -> str:
        return self.backend.schema

    @property
    def datastore(self) -> Any:
        return self.backend.datastore

    def ensure_schema(self) -> None:
        """Apply the backend's migrations; idempotent and safe to race."""
        self.backend.ensure_schema()

    def close(self) -> None:
        self.lake.close()
        self.backend.close()

    def owning_datastore(self) -> Self:
        """This store, closing its datastore when it closes (for a datastore built for it alone)."""
        self.backend.owns_datastore = True
        return self

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- append -------------------------------------------------------------------------------

    def append(self, event: NewEvent, *, expected_last_seq: int | None = None) -> AppendResult:
        if not isinstance(event, NewEvent):
            raise InvalidEvent("event", f"expected a NewEvent, got {type(event).__name__}")
        return self.append_batch(event.run_id, [event], expected_last_seq=expected_last_seq)[0]

    def append_batch(
        self,
        run_id: str,
        events: Sequence[NewEvent],
        state: Any = None,
        *,
        expected_last_seq: int | None = None,
    ) -> list[AppendResult]:
        """Append atomically; duplicates (stored or within the batch) return the existing run_seq. When the
        run's event count crosses a multiple of `snapshot_interval`, a snapshot of `state` (None: the run's
        projection) is written in the same transaction. With `expected_last_seq`, ConcurrencyConflict
        unless the run is at that seq (or the batch is a pure retry)."""
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

    # -- reads --------------------------------------------------------------------------------

    def fetch(self, run_id: str, after_seq: int = 0, limit: int = 1000) -> list[StoredEvent]:
        """The run's events with run_seq > after_seq, live and archived, ascending, at most `limit`."""
        if int(limit) < 1:
            raise InvalidEvent("limit", f"must be >= 1, got {limit!r}")
        return self._read(
            f"fetch run {run_id!r}", lambda tx: self.lake.events(tx, run_id, int(after_seq), int(limit))
        )

    def fetch_all(self, after_position: int = 0, limit: int = 1000) -> list[StoredEvent]:
        """The feed: every run's events after `after_position`, in position order."""
        check_position(after_position, limit)
        return self._read("read the feed", lambda tx: self.backend.feed(tx, after_position, limit))

    def subscribe(
        self, after_position: int = 0, *, poll_seconds: float = 1.0, stop: Callable[[], bool] | None = None
    ) -> Iterator[StoredEvent]:
        """Follow the feed from `after_position` until `stop()` is true (for ever without it)."""
        check_position(after_position, 1)
        check_poll_seconds(poll_seconds)
        return self._follow(after_position, poll_seconds, stop)

    def _follow(
        self, after_position: int, poll_seconds: float, stop: Callable[[], bool] | None
    ) -> Iterator[StoredEvent]:
        with self.backend.feed_waiter() as wait:
            yield from follow(self.fetch_all, wait, after_position, poll_seconds, stop)

    def run_ids(self, after: str = "", limit: int = 1000) -> list[str]:
        """Run ids in order, after `after` (live and archived)."""
        return self._read("list runs", lambda tx: self.backend.run_ids(tx, after, limit))

    def max_seq(self, run_id: str) -> int:
        """The run's highest seq, archived events included (0 for an unknown run): a migration's resume point."""
        return self._read(f"max seq of run {run_id!r}", lambda tx: self.backend.max_seq(tx, run_id))

    def stale_runs(self, limit: int = 1000) -> list[str]:
        """Runs with events newer than their stored projection."""
        return [run_id for run_id, _, _ in self.stale_runs_with_start(limit)]

    def stale_runs_with_start(self, limit: int = 1000) -> list[tuple[str, datetime | None, int]]:
        """(run_id, start, last_seq) of the stale runs; the start is the RunStarted event's emitted_at,
        else the first event's."""
        return self._read("list stale runs", lambda tx: self.backend.stale_runs(tx, limit))

    def runs_started_between(self, start: datetime, end: datetime) -> list[str]:
        """Runs whose start falls in [start, end)."""
        return self._read("list runs by start", lambda tx: self.backend.runs_started_between(tx, start, end))

    def _read(self, what: str, work: Callable[[Tx], T]) -> T:
        return self.backend.run(what, work, transactional=False)

    # -- projections (projector.py) -------------------------------------------------------------

    def project(self, run_id: str) -> RunSnapshot:
        """Fold only the events above the stored watermark; optimistic on `version`."""
        return self.projector.project(run_id)

    def rebuild(self, run_id: str) -> RunSnapshot:
        """Replay every event from scratch and store the result (the version moves only on change)."""
        return self.projector.rebuild(run_id)

    def project_runs(self, run_ids: Iterable[str], *, rebuild: bool = False) -> ProjectionReport:
        """project (or rebuild) each run: a ProjectionReport (a run that fails is reported, not raised)."""
        return self.projector.project_runs(run_ids, rebuild=rebuild)

    def resume(self, run_id: str) -> Resume:
        """The latest valid state snapshot plus the events after it (older / full replay on corruption)."""
        return self.projector.resume(run_id)

    # -- archive, restore, import ----------------------------------------------------------------

    def archive(
        self, older_than_days: int, now: datetime | None = None, *, batch_runs: int | None = None
    ) -> int:
        """Move the events of runs finished more than `older_than_days` ago to the archive, a transaction
        per `batch_runs` runs (archive.py); fetch, project and resume still read them. With archive_to
        "lake", drop from the database the runs the lake has whole instead (lake_archive.py), and raise
        ArchiveHeldBack naming the others once these are done."""
        return archival.archive(
            self.backend,
            older_than_days,
            now,
            batch_runs or self.backend.archive_batch_runs,
            self.lake if self.archive_to == "lake" else None,
        )

    def restore(self, run_id: str) -> int:
        """Bring an archived run's events back (from the archive table, or the lake); returns how many."""
        return archival.restore(self.backend, run_id, self.lake)

    def import_events(self, events: Iterable[StoredEvent]) -> int:
        """Store events with their seqs (a migration's target side); idempotent per key."""
        return archival.import_events(self.backend, events, self.max_event_bytes, self.lake)


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
