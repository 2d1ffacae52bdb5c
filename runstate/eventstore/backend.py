"""StoreBackend: what a backend supplies to the EventStore (store.py): its transactions and its statements.

The store holds one backend and does everything that does not depend on the database: validation,
sequencing, snapshots and their policy, projections, resume, retries of a whole append. A backend is
one module (postgres.py, snowflake.py) whose class implements the methods below, each one statement or
a few, over the connection or cursor (`tx`) its `run` hands to the store's work; its SQL lives in
`sql/<backend>/eventstore/`. A backend is registered by name in `runstate.backends`.

Three flags say how a backend's database behaves, and the store adapts its append to them:
- `enforces_keys`: the database refuses a second (run_id, idempotency_key) (Postgres: a unique index).
  Without it (Snowflake), the append looks every key up before it inserts.
- `confirms_commits`: a COMMIT may look like success when it failed (Snowflake's connector re-sends a
  COMMIT after a timeout, and a second COMMIT succeeds): the store reads the written keys back.
- `guesses`: the backend can append in one flight, its statement checking what the store guessed of the
  run (Postgres: runstate_check_append); `flight`, `insert_head` and `insert_guessed` then exist.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from runstate.eventstore.contract import ConcurrencyConflict, RunSnapshot, StoredEvent
from runstate.eventstore.snapshots import EncodedSnapshot, StoredSnapshot
from runstate.eventstore.validation import ValidEvent

log = logging.getLogger("runstate.eventstore")
T = TypeVar("T")
# How often a write whose commit could not be confirmed is made again (each time idempotent).
MAX_CONFIRMS = 80

# A transaction's handle as the backend gives it to the store's work: a connection, a cursor.
Tx = Any
# (run_seq, event) rows of one run, in seq order.
Rows = Sequence[tuple[int, ValidEvent]]


@dataclass(frozen=True)
class Stream:
    """The run's stream row, read under its lock."""

    last_seq: int
    event_count: int
    archived: bool


class LakeRecord(NamedTuple):
    """A run archived to the lake (lake_archive.py): its events up to seq `upto` are there, `events` of them."""

    upto: int
    events: int


@dataclass(frozen=True)
class IndexRebuild:
    """One index rebuilt by `compact_indexes`: the table's rows then, and the index's size before and after."""

    index: str
    rows: int
    bytes_before: int
    bytes_after: int


class Guess(NamedTuple):
    """What a one-flight append assumes of the run: the statement checks each assumption and refuses
    the append (GuessRefused, nothing written) when one is wrong."""

    expected_last_seq: int | None  # the caller's optimistic concurrency check, if any
    snapshot_every: int  # the snapshot interval, so the database can tell when a snapshot is due
    signal_waiting: bool  # the batch holds SignalWaiting (a snapshot is due at once)
    snapshot_seq: int | None  # the seq of the snapshot sent behind the insert, None when none is
    snapshot_count_before: int | None  # the run's event count that snapshot was made for


class GuessRefused(Exception):
    """The database refused a guess of a one-flight append (nothing was written)."""


class KeyTaken(Exception):
    """An insert found an idempotency key of the batch already stored (nothing was written): append again
    with every key looked up first."""


class StoreBackend(ABC):
    """One database's transactions and statements for the EventStore."""

    name: str
    enforces_keys: bool = True
    confirms_commits: bool = False
    guesses: bool = False
    archive_batch_runs: int = 500  # runs archived per transaction
    # The backend can drop archived runs from its tables once the lake has them (lake_archive.py).
    lake_archives: bool = False

    def __init__(self, datastore: Any, *, owns_datastore: bool = False):
        self.datastore = datastore
        self.schema: str = datastore.schema
        self.owns_datastore = owns_datastore  # close the datastore with the store
        self.closed = False

    # -- transactions -----------------------------------------------------------------------------

    @abstractmethod
    def run(
        self, what: str, work: Callable[[Tx], T], *, transactional: bool = True, pipeline: bool = False
    ) -> T:
        """`work(tx)` in one transaction (or autocommit when not transactional), retried whole on a race
        or a transient failure; any other driver error leaves as an EventStoreError naming `what`.
        `pipeline`: the statements may leave without waiting for each other (a backend may ignore it)."""

    def run_confirmed(
        self,
        what: str,
        run_id: str,
        work: Callable[[Tx], T],
        written_keys: Callable[[T], dict[str, int]],
        *,
        pipeline: bool = False,
    ) -> T:
        """`work` in a transaction; where commits can be lost (`confirms_commits`), repeated (`work` is
        idempotent) until the keys it wrote, {key: run_seq}, read back."""
        for _ in range(MAX_CONFIRMS):
            result = self.run(what, work, pipeline=pipeline)
            expected = written_keys(result)
            if not self.confirms_commits or not expected:
                return result
            stored = self.run(
                f"verify {what}",
                lambda tx: self.existing_keys(tx, run_id, sorted(expected), archived=False),
                transactional=False,
            )
            if stored == expected:
                return result
            log.warning("%s: not visible after COMMIT; retrying", what)
        raise ConcurrencyConflict(f"{what}: commit could not be confirmed")

    @abstractmethod
    def ensure_schema(self) -> None:
        """Apply the backend's migrations; idempotent and safe to race."""

    def close(self) -> None:
        """Refuse further work (`run` raises); close the datastore when the backend owns it."""
        self.closed = True
        if self.owns_datastore:
            self.datastore.close()

    # -- a run's stream ---------------------------------------------------------------------------

    def open_stream(self, run_id: str) -> Any:
        """What the backend needs before a write transaction on the run, passed back to insert_new and
        insert_imported (Snowflake: the stream row made, a feed position taken). Postgres: nothing."""
        return None

    @abstractmethod
    def lock_stream(self, tx: Tx, run_id: str) -> Stream:
        """Lock the run's stream row (made when missing): the run's writers serialise on it."""

    @abstractmethod
    def find_stream(self, tx: Tx, run_id: str) -> Stream | None:
        """lock_stream for a run that may not exist: None, and nothing made, when it does not."""

    @abstractmethod
    def existing_keys(self, tx: Tx, run_id: str, keys: Sequence[str], *, archived: bool) -> dict[str, int]:
        """{key: run_seq} of the keys stored for the run (archived events too when `archived`)."""

    @abstractmethod
    def insert_new(self, tx: Tx, run_id: str, stream: Stream, new: Rows, ticket: Any) -> None:
        """Insert new events after `stream` and advance the stream row to the last of them. KeyTaken
        when a key was stored after all (possible only where the store did not look the keys up)."""

    # -- a one-flight append (backends that guess) ------------------------------------------------

    def flight(self, tx: Tx, *, together: bool) -> AbstractContextManager[None]:
        """The block's statements as one round trip: in one transaction when `together`, else the one
        statement as its own. A refused guess leaves the block as GuessRefused, with nothing written."""
        raise NotImplementedError(f"backend {self.name!r} does not append in one flight")

    def insert_head(self, tx: Tx, run_id: str, head: Sequence[ValidEvent]) -> None:
        """The first events of a batch, sent while the store validates the rest: takes the stream lock."""
        raise NotImplementedError(f"backend {self.name!r} does not append in one flight")

    def insert_guessed(
        self, tx: Tx, run_id: str, new: Sequence[ValidEvent], sent_ahead: int, guess: Guess
    ) -> Callable[[], tuple[int, int]]:
        """Insert the batch's `new` events but the `sent_ahead` ones, after the run's last seq, advance
        the stream and check `guess`. Returns a reader of (last_seq, event_count) as they were before
        the batch, to call once the flight has ended."""
        raise NotImplementedError(f"backend {self.name!r} does not append in one flight")

    # -- snapshots and projections ----------------------------------------------------------------

    @abstractmethod
    def write_snapshot(
        self, tx: Tx, run_id: str, seq: int, kind: str, encoded: EncodedSnapshot, reason: str, keep: int
    ) -> bool:
        """Insert the snapshot at `seq` unless one is there, and keep only the latest `keep`. True when
        written (a backend that cannot tell without a round trip reports True)."""

    @abstractmethod
    def snapshots(
        self, tx: Tx, run_id: str, *, upto: int | None = None, kind: str | None = None
    ) -> list[StoredSnapshot]:
        """The run's state snapshots, newest first; at most `upto`, of `kind` only, when given."""

    @abstractmethod
    def stored_projection(self, tx: Tx, run_id: str) -> RunSnapshot | None:
        """The projector's stored RunSnapshot of the run, with its version."""

    @abstractmethod
    def save_projection(self, tx: Tx, run_id: str, snap: RunSnapshot, stored: RunSnapshot | None) -> bool:
        """Insert (stored None) or compare-and-set on `stored.version`; False when another projector won."""

    # -- reads --------------------------------------------------------------------------------------

    @abstractmethod
    def fetch(
        self, tx: Tx, run_id: str, after_seq: int, limit: int, upto: int | None = None
    ) -> list[StoredEvent]:
        """A page of the run's events (live and archived) with after_seq < run_seq <= upto, in seq order."""

    @abstractmethod
    def feed(self, tx: Tx, after_position: int, limit: int) -> list[StoredEvent]:
        """A page of every run's events after `after_position`, in position order."""

    def feed_waiter(self) -> AbstractContextManager[Callable[[float], None]]:
        """A wait(seconds) for a feed subscriber, which may return early when events commit (Postgres:
        LISTEN). By default, a plain sleep: subscribers poll."""
        return nullcontext(time.sleep)

    @abstractmethod
    def run_ids(self, tx: Tx, after: str, limit: int) -> list[str]: ...

    @abstractmethod
    def max_seq(self, tx: Tx, run_id: str) -> int:
        """The run's highest seq, archived events included (0 for an unknown run)."""

    @abstractmethod
    def stale_runs(self, tx: Tx, limit: int) -> list[tuple[str, datetime | None, int]]:
        """(run_id, start, last_seq) of runs with events newer than their stored projection, by run_id;
        archived runs left out. The start is the RunStarted event's emitted_at, else the first event's."""

    @abstractmethod
    def runs_started_between(self, tx: Tx, start: datetime, end: datetime) -> list[str]: ...

    # -- archive and import -------------------------------------------------------------------------

    @abstractmethod
    def archive_runs(self, tx: Tx, cutoff: datetime, limit: int) -> tuple[int, int]:
        """Move the events of up to `limit` runs completed before `cutoff` to the archive, drop their
        snapshots and mark their streams archived: (runs, events moved)."""

    def compact_indexes(self) -> list[IndexRebuild]:
        """Pack the backend's own indexes again where appends left them sparse, when due (after the
        archive); what was rebuilt. A backend that keeps no indexes of its own has nothing to do."""
        return []

    @abstractmethod
    def unarchive(self, tx: Tx, run_id: str) -> int:
        """Move the locked run's archived events back and, when any moved, mark it restored."""

    @abstractmethod
    def taken_seqs(self, tx: Tx, run_id: str, seqs: Sequence[int]) -> set[int]:
        """Which of `seqs` the run's live events hold."""

    @abstractmethod
    def insert_imported(
        self, tx: Tx, run_id: str, stream: Stream, rows: Rows, stamps: Mapping[int, datetime], ticket: Any
    ) -> None:
        """Insert events with their own seqs (and their persisted_at, where the backend keeps it) and
        advance the stream row past them."""

    # -- runs archived to the lake (backends that `lake_archives`; lake_archive.py) ------------------

    def lake_record(self, tx: Tx, run_id: str) -> LakeRecord | None:
        """What the lake keeps of the run, or None when nothing."""
        return None

    def fetch_with_lake(
        self, tx: Tx, run_id: str, after_seq: int, limit: int, upto: int | None = None
    ) -> tuple[list[StoredEvent], LakeRecord | None]:
        """fetch and lake_record together (a backend may answer both in one round trip)."""
        return self.fetch(tx, run_id, after_seq, limit, upto), self.lake_record(tx, run_id)

    def lake_owner(self, tx: Tx) -> str:
        """The store's name as the lake's tables record their owner: `<database>.<schema>`."""
        raise NotImplementedError(f"backend {self.name!r} does not archive to the lake")

    def lake_candidates(
        self, tx: Tx, cutoff: datetime, limit: int, position: int, after: str
    ) -> list[tuple[str, int]]:
        """Up to `limit` runs after `after` (run_id order) completed before `cutoff` whose every event is at
        or below feed `position`, their stream rows locked: (run_id, the seq the lake keeps it up to, 0)."""
        raise NotImplementedError(f"backend {self.name!r} does not archive to the lake")

    def lake_archive_rows(self, tx: Tx, run_ids: Sequence[str]) -> dict[str, list[StoredEvent]]:
        """Every event the database holds of `run_ids` (both tables), locked, in seq order per run."""
        raise NotImplementedError(f"backend {self.name!r} does not archive to the lake")

    def drop_into_lake(self, tx: Tx, run_ids: Sequence[str]) -> dict[str, int]:
        """The runs' events leave both tables, their snapshots go, and each records its LakeRecord: how
        many rows of each run were deleted."""
        raise NotImplementedError(f"backend {self.name!r} does not archive to the lake")

    def lake_held_back(self, tx: Tx, cutoff: datetime, position: int) -> list[tuple[str, int]]:
        """(run_id, highest position) of the runs old enough to archive with events above `position`."""
        raise NotImplementedError(f"backend {self.name!r} does not archive to the lake")

    def restore_from_lake(self, tx: Tx, run_id: str, events: Sequence[StoredEvent]) -> int:
        """Insert the locked run's events read back from the lake exactly as they were (rows already there
        stay) and clear its LakeRecord, marking it restored; how many rows were inserted."""
        raise NotImplementedError(f"backend {self.name!r} does not archive to the lake")
