"""EventStore: the run state store, once, over a backend that supplies its statements and transactions.

The shape of eventsourcing's `PostgresApplicationRecorder(datastore)`: the store holds a StoreBackend
(backend.py: one per database, registered in `runstate.backends`) and does everything that does not
depend on the database. PostgresEventStore and SnowflakeEventStore are this class with their backend.

How an append goes, top to bottom: appender.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any, Self, TypeVar

from runstate.config import ARCHIVE_TARGETS, Settings
from runstate.eventstore import archive as archival
from runstate.eventstore.appender import Appender
from runstate.eventstore.backend import StoreBackend, Tx
from runstate.eventstore.contract import (
    DEFAULT_MAX_EVENT_BYTES,
    AppendResult,
    InvalidEvent,
    NewEvent,
    ProjectionReport,
    RunSnapshot,
    StoredEvent,
)
from runstate.eventstore.feed import check_poll_seconds, check_position, follow
from runstate.eventstore.hints import RunHints
from runstate.eventstore.lake_archive import LakeArchive, LakeReader
from runstate.eventstore.projector import Projector
from runstate.eventstore.resume import Resume
from runstate.eventstore.snapshots import DEFAULT_SNAPSHOT_INTERVAL, SnapshotMetrics, SnapshotPolicy

T = TypeVar("T")


class EventStore:
    """An append-only, idempotent log of workflow runs' events, with snapshots and projections, over
    `backend`; thread-safe when the backend is (both shipped ones are)."""

    # What this store can do beyond the contract (runstate.eventstore.feed: GAP_FREE_FEED).
    capabilities: frozenset[str] = frozenset()

    def __init__(
        self,
        backend: StoreBackend,
        *,
        snapshot_interval: int = DEFAULT_SNAPSHOT_INTERVAL,
        keep_snapshots: int = 3,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        large_snapshot_bytes: int = 100 * 1024,
        archive_to: str = Settings.archive_to,
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
        self.appender = Appender(
            backend,
            policy=self.policy,
            metrics=self.metrics,
            hints=self.hints,
            projector=self.projector,
            lake=self.lake,
            max_event_bytes=self.max_event_bytes,
        )

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
        unless the run is at that seq (or the batch is a pure retry). How: appender.py."""
        return self.appender.append_batch(run_id, events, state, expected_last_seq=expected_last_seq)

    def checkpoint(self, run_id: str, state: Any = None) -> int:
        """A snapshot at the run's latest run_seq now; returns that seq (0: the run has no events)."""
        return self.appender.checkpoint(run_id, state)

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
        ArchiveHeldBack naming the others once these are done. Then the backend packs the indexes that
        appends leave sparse, when they are due (Postgres: pg_indexes.py)."""
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
