"""EventStore: the event store's contract, once, with the backend-independent half of it.

Both backends (PostgresEventStore, SnowflakeEventStore) subclass it, and one contract test suite runs
against each. It holds what does not touch SQL (validation, the snapshot policy and metrics, the
projection loop and its retry, resume, the recent-projection cache); a backend supplies its SQL and
its transaction through the abstract methods: the public reads and writes below, and the storage hooks
(`_run`, a retried transaction; the reads the projection needs; the append itself).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from runstate.eventstore.contract import (
    AppendResult,
    ConcurrencyConflict,
    EventStoreError,
    InvalidEvent,
    NewEvent,
    ProjectionReport,
    RunSnapshot,
    StoredEvent,
)
from runstate.eventstore.projection import fold
from runstate.eventstore.resume import Resume
from runstate.eventstore.snapshots import (
    COMPRESS_OVER_BYTES,
    KIND_PROJECTION,
    KIND_STATE,
    EncodedSnapshot,
    SnapshotMetrics,
    SnapshotPolicy,
    StoredSnapshot,
    canonical_json,
    choose_valid,
    encode_snapshot,
)
from runstate.eventstore.validation import ValidEvent, check_run_id, validate_batch

log = logging.getLogger("runstate.eventstore")

_PAGE = 10_000
_MAX_PROJECTION_ATTEMPTS = 20
_RECENT_RUNS = 4096

_S = TypeVar("_S", bound="EventStore")


class EventStore(ABC):
    """An append-only, idempotent log of workflow runs' events, with snapshots and projections.

    Implemented here: append, append_batch, project, rebuild, project_runs, resume. A backend implements
    the abstract methods below."""

    max_event_bytes: int
    policy: SnapshotPolicy
    snapshot_interval: int
    metrics: SnapshotMetrics

    def _init_policy(
        self, *, max_event_bytes: int, snapshot_interval: int, keep_snapshots: int, large_snapshot_bytes: int
    ) -> None:
        self.max_event_bytes = int(max_event_bytes)
        self.policy = SnapshotPolicy(
            interval=int(snapshot_interval),
            keep=int(keep_snapshots),
            warn_bytes=large_snapshot_bytes,
            compress_over=min(COMPRESS_OVER_BYTES, large_snapshot_bytes),
        )
        self.snapshot_interval = self.policy.interval
        self.metrics = SnapshotMetrics()

    # -- the storage hooks ---------------------------------------------------------------------

    @abstractmethod
    def _run(self, what: str, work: Callable[[Any], Any], *, transactional: bool = True) -> Any:
        """Run `work(conn)` (in one transaction when transactional), retrying races; driver errors
        leave as EventStoreError."""

    @abstractmethod
    def _fetch(
        self, conn: Any, run_id: str, after_seq: int, limit: int, upto: int | None = None
    ) -> list[StoredEvent]:
        """A page of the run's events (live and archived) with after_seq < run_seq <= upto."""

    @abstractmethod
    def _stored_projection(self, conn: Any, run_id: str) -> RunSnapshot | None: ...

    @abstractmethod
    def _save_projection(self, conn: Any, run_id: str, snap: RunSnapshot, stored: RunSnapshot | None) -> bool:
        """Compare-and-set on version; False when another projector won."""

    @abstractmethod
    def _projection_in_tx(
        self, conn: Any, run_id: str, stored_upto: int, pending: Sequence[tuple[int, ValidEvent]]
    ) -> RunSnapshot:
        """The run's projection through its stored events up to `stored_upto` plus `pending` ones."""

    @abstractmethod
    def _store_snapshot(
        self, conn: Any, run_id: str, seq: int, kind: str, encoded: EncodedSnapshot, reason: str
    ) -> bool:
        """Insert the snapshot at `seq` and keep only the latest N; False when one was already there."""

    def _write_snapshot(
        self,
        conn: Any,
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
            kind, projection = KIND_PROJECTION, self._projection_in_tx(conn, run_id, stored_upto, pending)
            encoded = encode_snapshot(run_id, seq, projection.to_dict(), self.policy)
        stored = self._store_snapshot(conn, run_id, seq, kind, encoded, reason)
        return projection, encoded if stored else None

    @abstractmethod
    def _append_valid(
        self, run_id: str, valid: list[ValidEvent], state: Any, expected_last_seq: int | None
    ) -> list[AppendResult]:
        """Write a validated, non-empty batch in one transaction (see `append_batch`)."""

    # -- the contract's backend half -----------------------------------------------------------

    @abstractmethod
    def ensure_schema(self) -> None:
        """Apply the backend's migrations; idempotent and safe to race."""

    @abstractmethod
    def fetch(self, run_id: str, after_seq: int = 0, limit: int = 1000) -> list[StoredEvent]:
        """The run's events after `after_seq`, live and archived, in seq order."""

    @abstractmethod
    def fetch_all(self, after_position: int = 0, limit: int = 1000) -> list[StoredEvent]:
        """The feed: every run's events after `after_position`, in position order."""

    @abstractmethod
    def subscribe(
        self, after_position: int = 0, *, poll_seconds: float = 1.0, stop: Callable[[], bool] | None = None
    ) -> Iterator[StoredEvent]:
        """Follow the feed from `after_position` until `stop()` is true."""

    @abstractmethod
    def checkpoint(self, run_id: str, state: Any = None) -> int:
        """Write a snapshot at the run's last seq now; returns that seq."""

    @abstractmethod
    def archive(self, older_than_days: int, now: datetime | None = None) -> int:
        """Move the events of runs finished more than `older_than_days` ago to the archive."""

    @abstractmethod
    def restore(self, run_id: str) -> int:
        """Bring an archived run's events back; returns how many."""

    @abstractmethod
    def import_events(self, events: Iterable[StoredEvent]) -> int:
        """Store events with their seqs (a migration's target side); idempotent per key."""

    @abstractmethod
    def run_ids(self, after: str = "", limit: int = 1000) -> list[str]:
        """Run ids in order, after `after` (live and archived)."""

    @abstractmethod
    def max_seq(self, run_id: str) -> int:
        """The run's highest seq, archived events included (0 for an unknown run)."""

    @abstractmethod
    def stale_runs(self, limit: int = 1000) -> list[str]:
        """Runs whose stored projection is behind their events."""

    @abstractmethod
    def stale_runs_with_start(self, limit: int = 1000) -> list[tuple[str, datetime | None, int]]:
        """stale_runs with each run's start and event count."""

    @abstractmethod
    def runs_started_between(self, start: datetime, end: datetime) -> list[str]:
        """Runs whose start falls in [start, end)."""

    @abstractmethod
    def close(self) -> None: ...

    def _init_recent(self) -> None:
        # The last projection snapshot this store committed per run: the next interval snapshot
        # folds only the new batch onto it instead of re-reading and decoding from the database.
        self._recent: OrderedDict[str, RunSnapshot] = OrderedDict()
        self._recent_lock = threading.Lock()

    def _remember(self, snapshot: RunSnapshot | None) -> None:
        if snapshot is None:
            return
        with self._recent_lock:
            self._recent[snapshot.run_id] = snapshot
            self._recent.move_to_end(snapshot.run_id)
            while len(self._recent) > _RECENT_RUNS:
                self._recent.popitem(last=False)

    def _recalled(self, run_id: str) -> RunSnapshot | None:
        with self._recent_lock:
            return self._recent.get(run_id)

    def __enter__(self: _S) -> _S:
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
        """Append atomically; duplicates (stored or within the batch) return the existing run_seq.
        With `expected_last_seq`, ConcurrencyConflict unless the run is at that seq (or a pure retry)."""
        check_run_id(run_id)
        if state is not None:
            canonical_json(run_id, state)  # bad state is bad input: reject before any write
        if expected_last_seq is not None and (
            not isinstance(expected_last_seq, int)
            or isinstance(expected_last_seq, bool)
            or expected_last_seq < 0
        ):
            raise InvalidEvent(
                "expected_last_seq",
                f"must be a non-negative integer, got {expected_last_seq!r}",
                run_id=run_id,
            )
        return self._append_events(run_id, list(events), state, expected_last_seq)

    def _append_events(
        self, run_id: str, events: list[NewEvent], state: Any, expected_last_seq: int | None
    ) -> list[AppendResult]:
        """Validate the whole batch, then write it (a backend may overlap the two: Postgres)."""
        valid = validate_batch(run_id, events, max_event_bytes=self.max_event_bytes)
        if not valid:
            return []
        return self._append_valid(run_id, valid, state, expected_last_seq)

    # -- reads --------------------------------------------------------------------------------

    def _fetch_run(
        self, conn: Any, run_id: str, after_seq: int, upto: int | None = None
    ) -> list[StoredEvent]:
        events: list[StoredEvent] = []
        while True:
            page = self._fetch(conn, run_id, after_seq, _PAGE, upto)
            events.extend(page)
            if len(page) < _PAGE:
                return events
            after_seq = page[-1].run_seq

    # -- projection ---------------------------------------------------------------------------

    def project(self, run_id: str) -> RunSnapshot:
        """Fold only the events above the stored watermark; optimistic on `version`."""
        return self._project(run_id)[0]

    def rebuild(self, run_id: str) -> RunSnapshot:
        """Replay every event from scratch and store the result (the version moves only on change)."""
        return self._rebuild(run_id)[0]

    def project_runs(self, run_ids: Iterable[str], *, rebuild: bool = False) -> ProjectionReport:
        """project (or rebuild) each run; counts for the Dagster asset's metadata. A run that cannot
        be projected (an unreadable event, say) is reported in `failed` and the others carry on."""
        runs = changed = applied = 0
        failed: list[tuple[str, str]] = []
        for run_id in run_ids:
            try:
                _, moved, folded = self._rebuild(run_id) if rebuild else self._project(run_id)
            except EventStoreError as exc:
                log.warning("run %r: projection failed, skipped: %s", run_id, exc)
                failed.append((run_id, str(exc)))
                continue
            runs, changed, applied = runs + 1, changed + moved, applied + folded
        return ProjectionReport(
            runs_projected=runs, runs_changed=changed, events_applied=applied, failed=tuple(failed)
        )

    def _project(self, run_id: str) -> tuple[RunSnapshot, bool, int]:
        return self._until_saved("project", self._project_once, run_id)

    def _rebuild(self, run_id: str) -> tuple[RunSnapshot, bool, int]:
        return self._until_saved("rebuild", self._rebuild_once, run_id)

    def _until_saved(
        self,
        what: str,
        attempt: Callable[[Any, str], tuple[RunSnapshot, bool, int] | None],
        run_id: str,
    ) -> tuple[RunSnapshot, bool, int]:
        """Retry a compare-and-set projection step on a fresh read until it wins (both backends)."""
        for tries in range(_MAX_PROJECTION_ATTEMPTS):
            done = self._run(
                f"{what} run {run_id!r}", lambda conn: attempt(conn, run_id), transactional=False
            )
            if done is not None:
                return done
            time.sleep(min(0.2, 0.002 * 2**tries) * random.random())  # another projector won: let it finish
        raise ConcurrencyConflict(f"{what} run {run_id!r}: the stored snapshot kept changing")

    def _project_once(self, conn: Any, run_id: str) -> tuple[RunSnapshot, bool, int] | None:
        """One optimistic projection attempt; None when another projector moved the version."""
        stored = self._stored_projection(conn, run_id)
        base = stored or RunSnapshot.empty(run_id)
        events = self._fetch_run(conn, run_id, base.last_event_seq)
        if not events:
            return base, False, 0
        updated = fold(base, events)
        if not self._save_projection(conn, run_id, updated, stored):
            return None
        return updated.with_version(base.version + 1), True, len(events)

    def _rebuild_once(self, conn: Any, run_id: str) -> tuple[RunSnapshot, bool, int] | None:
        """One optimistic rebuild attempt; None when another projector moved the version."""
        stored = self._stored_projection(conn, run_id)
        events = self._fetch_run(conn, run_id, 0)
        fresh = fold(RunSnapshot.empty(run_id), events)
        if fresh.last_event_seq == 0 and stored is None:
            return fresh, False, 0
        if stored is not None and stored.same_state(fresh):
            return stored, False, len(events)
        if not self._save_projection(conn, run_id, fresh, stored):
            return None
        return fresh.with_version((stored.version if stored else 0) + 1), True, len(events)

    @abstractmethod
    def _snapshots(self, conn: Any, run_id: str) -> list[StoredSnapshot]:
        """The run's state snapshots, newest first."""

    def resume(self, run_id: str) -> Resume:
        """The latest valid state snapshot plus the events after it (older / full replay on corruption)."""
        started = time.perf_counter()

        def work(conn: Any) -> Resume:
            chosen = choose_valid(run_id, self._snapshots(conn, run_id), self.metrics)
            events = self._fetch_run(conn, run_id, chosen.seq)
            return Resume(chosen.state, chosen.seq, events, chosen.kind, chosen.fallbacks)

        return self._record_resume(
            run_id, self._run(f"resume run {run_id!r}", work, transactional=False), started
        )

    def _record_resume(self, run_id: str, result: Resume, started: float) -> Resume:
        """Count the resume (and a missing snapshot when the full replay was long) in the metrics."""
        if result.snapshot_seq == 0 and not result.fallbacks and len(result.events) >= self.policy.interval:
            self.metrics.record_missing(run_id, len(result.events), self.policy.interval)
        self.metrics.record_resume(result.snapshot_seq, len(result.events), time.perf_counter() - started)
        return result

    # -- archival and import ------------------------------------------------------------------

    @staticmethod
    def _archive_cutoff(older_than_days: int, now: datetime | None) -> datetime:
        if not isinstance(older_than_days, int) or older_than_days < 0:
            raise InvalidEvent("older_than_days", f"must be a non-negative integer, got {older_than_days!r}")
        now = now or datetime.now(UTC)
        if now.tzinfo is None:
            raise InvalidEvent("now", "must be timezone-aware")
        return now - timedelta(days=older_than_days)

    def _archive_chunks(self, chunk: Callable[[Any], tuple[int, int]], batch_runs: int) -> int:
        """Run `chunk` (one transaction: returns runs, events moved) until a chunk is not full."""
        total = 0
        while True:
            runs, moved = self._run("archive", chunk)
            total += moved
            if runs < batch_runs:
                return total
