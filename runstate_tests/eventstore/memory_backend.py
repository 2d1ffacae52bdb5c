"""A third event store backend, in memory, made the way a backend is added: this module and one registry
entry (MEMORY, registered by the tests that use it). It proves that the EventStore needs nothing of a
backend but StoreBackend's statements and transactions: the contract suite runs on it beside Postgres
and Snowflake (runstate_tests/eventstore/conftest.py), except what needs SQL or a second process.

The "database" is a set of tables per schema, shared by every store of this process. A transaction holds
one lock and works on the tables in place; a failing one puts back a copy taken when it began. With one
lock, writers are serial and every commit's positions come after the last commit's, so the feed is exact.
It keeps no schema (`migrations` None) and enforces keys as a unique index does (KeyTaken).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from runstate.backends import Backend
from runstate.eventstore import EventStore, EventStoreError, RunSnapshot, StoredEvent
from runstate.eventstore.backend import KeyTaken, Rows, StoreBackend, Stream
from runstate.eventstore.config import EventStoreConfig
from runstate.eventstore.contract import TERMINAL_EVENT_TYPES, EventType
from runstate.eventstore.rows import as_stored
from runstate.eventstore.snapshots import EncodedSnapshot, StoredSnapshot

T = TypeVar("T")

MEMORY = Backend(
    name="memory",
    datastore=f"{__name__}:memory_datastore",
    event_store=f"{__name__}:open_store",
    migrations=None,
)


@dataclass(frozen=True)
class _StreamRow:
    last_seq: int = 0
    event_count: int = 0
    first_event_at: datetime | None = None
    started_at: datetime | None = None
    completed_at: datetime | None = None
    updated: int = 0  # logical clocks: the order of updates and archivals, as Postgres's now() gives it
    archived: int | None = None
    restored_at: datetime | None = None


@dataclass
class _Tables:
    streams: dict[str, _StreamRow] = field(default_factory=dict)
    events: dict[str, dict[int, StoredEvent]] = field(default_factory=dict)
    archive: dict[str, dict[int, StoredEvent]] = field(default_factory=dict)
    snapshots: dict[str, dict[int, StoredSnapshot]] = field(default_factory=dict)
    projections: dict[str, tuple[dict, int]] = field(default_factory=dict)
    clock: int = 0

    def copy(self) -> _Tables:
        """Rows are immutable: copying the dicts is a full copy."""
        nested = {
            name: {run_id: dict(rows) for run_id, rows in getattr(self, name).items()}
            for name in ("events", "archive", "snapshots")
        }
        return _Tables(dict(self.streams), **nested, projections=dict(self.projections), clock=self.clock)

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def run_events(self, run_id: str) -> list[StoredEvent]:
        """Live and archived, in seq order."""
        both = {**self.archive.get(run_id, {}), **self.events.get(run_id, {})}
        return [both[seq] for seq in sorted(both)]


class MemoryDatastore:
    """One schema's tables and the lock its transactions take."""

    backend = "memory"

    def __init__(self, name: str = "memory", *, schema: str = "memory"):
        self.schema = schema
        self.lock = threading.RLock()
        self.tables = _Tables()

    def close(self) -> None:
        """The tables live as long as the process, as a database outlives its connections."""


_SCHEMAS: dict[str, MemoryDatastore] = {}


def memory_datastore(config: EventStoreConfig, **options: Any) -> MemoryDatastore:
    """The process's tables of the config's schema (RUNSTATE_SCHEMA, as Postgres's)."""
    return _SCHEMAS.setdefault(config.pg_schema, MemoryDatastore(schema=config.pg_schema))


def open_store(datastore: MemoryDatastore, **options: Any) -> EventStore:
    return EventStore(MemoryBackend(datastore), **options)


class MemoryBackend(StoreBackend):
    name = "memory"
    enforces_keys = True
    confirms_commits = False
    guesses = False

    def run(
        self, what: str, work: Callable[[_Tables], T], *, transactional: bool = True, pipeline: bool = False
    ) -> T:
        with self.datastore.lock:
            if self.closed:
                raise EventStoreError("the event store is closed")
            tables = self.datastore.tables
            if not transactional:
                return work(tables)
            before = tables.copy()
            try:
                return work(tables)
            except BaseException:
                self.datastore.tables = before
                raise

    def ensure_schema(self) -> None:
        """Nothing to create."""

    # -- a run's stream -------------------------------------------------------------------------

    def lock_stream(self, tx: _Tables, run_id: str) -> Stream:
        row = tx.streams.setdefault(run_id, _StreamRow())
        return Stream(row.last_seq, row.event_count, row.archived is not None)

    def find_stream(self, tx: _Tables, run_id: str) -> Stream | None:
        return self.lock_stream(tx, run_id) if run_id in tx.streams else None

    def existing_keys(
        self, tx: _Tables, run_id: str, keys: Sequence[str], *, archived: bool
    ) -> dict[str, int]:
        wanted = set(keys)
        tables = [tx.events, tx.archive] if archived else [tx.events]
        return {
            e.idempotency_key: e.run_seq
            for table in tables
            for e in table.get(run_id, {}).values()
            if e.idempotency_key in wanted
        }

    def insert_new(self, tx: _Tables, run_id: str, stream: Stream, new: Rows, ticket: Any) -> None:
        if self.existing_keys(tx, run_id, [e.idempotency_key for _, e in new], archived=False):
            raise KeyTaken()  # as a unique index on (run_id, idempotency_key) would
        self._insert(tx, run_id, new, {})

    def _insert(self, tx: _Tables, run_id: str, rows: Rows, stamps: Mapping[int, datetime]) -> None:
        now = datetime.now(UTC)
        live = tx.events.setdefault(run_id, {})
        for seq, event in rows:
            stored = as_stored(run_id, seq, event, stamps.get(seq) or now)
            live[seq] = dataclasses.replace(stored, position=tx.tick())
        events = [e for _, e in rows]
        row = tx.streams[run_id]
        tx.streams[run_id] = dataclasses.replace(
            row,
            last_seq=max(row.last_seq, max(seq for seq, _ in rows)),
            event_count=row.event_count + len(rows),
            first_event_at=row.first_event_at or events[0].emitted_at,
            started_at=row.started_at or _first(events, {EventType.RUN_STARTED}),
            completed_at=row.completed_at or _first(events, TERMINAL_EVENT_TYPES),
            updated=tx.tick(),
        )

    # -- snapshots and projections ------------------------------------------------------------------

    def write_snapshot(
        self, tx: _Tables, run_id: str, seq: int, kind: str, encoded: EncodedSnapshot, reason: str, keep: int
    ) -> bool:
        held = tx.snapshots.setdefault(run_id, {})
        if seq in held:
            return False
        held[seq] = StoredSnapshot(run_id, seq, kind, encoded.encoding, encoded.payload, encoded.checksum)
        for old in sorted(held, reverse=True)[keep:]:
            del held[old]
        return True

    def snapshots(
        self, tx: _Tables, run_id: str, *, upto: int | None = None, kind: str | None = None
    ) -> list[StoredSnapshot]:
        held = tx.snapshots.get(run_id, {})
        return [
            held[seq]
            for seq in sorted(held, reverse=True)
            if (upto is None or seq <= upto) and (kind is None or held[seq].kind == kind)
        ]

    def stored_projection(self, tx: _Tables, run_id: str) -> RunSnapshot | None:
        if run_id not in tx.projections:
            return None
        doc, version = tx.projections[run_id]
        return RunSnapshot.from_dict(doc, version=version)

    def save_projection(
        self, tx: _Tables, run_id: str, snap: RunSnapshot, stored: RunSnapshot | None
    ) -> bool:
        current = tx.projections.get(run_id)
        if (current is None) != (stored is None) or (current and stored and current[1] != stored.version):
            return False  # another projector won
        tx.projections[run_id] = (snap.to_dict(), stored.version + 1 if stored else 1)
        return True

    # -- reads --------------------------------------------------------------------------------------

    def fetch(
        self, tx: _Tables, run_id: str, after_seq: int, limit: int, upto: int | None = None
    ) -> list[StoredEvent]:
        found = [
            e for e in tx.run_events(run_id) if after_seq < e.run_seq and (upto is None or e.run_seq <= upto)
        ]
        return found[:limit]

    def feed(self, tx: _Tables, after_position: int, limit: int) -> list[StoredEvent]:
        every = [e for table in (tx.events, tx.archive) for run in table.values() for e in run.values()]
        return sorted((e for e in every if e.position > after_position), key=lambda e: e.position)[:limit]

    def run_ids(self, tx: _Tables, after: str, limit: int) -> list[str]:
        return sorted(run_id for run_id in tx.streams if run_id > after)[:limit]

    def max_seq(self, tx: _Tables, run_id: str) -> int:
        return max((e.run_seq for e in tx.run_events(run_id)), default=0)

    def stale_runs(self, tx: _Tables, limit: int) -> list[tuple[str, datetime | None, int]]:
        stale = []
        for run_id in sorted(tx.streams):
            row = tx.streams[run_id]
            projected = tx.projections.get(run_id, ({"lastEventSeq": 0}, 0))[0]["lastEventSeq"]
            if row.last_seq > projected and (row.archived is None or row.updated > row.archived):
                stale.append((run_id, row.started_at or row.first_event_at, row.last_seq))
        return stale[:limit]

    def runs_started_between(self, tx: _Tables, start: datetime, end: datetime) -> list[str]:
        return sorted(
            run_id
            for run_id, row in tx.streams.items()
            if (row.started_at or row.first_event_at)
            and start <= (row.started_at or row.first_event_at) < end
        )

    # -- archive and import -------------------------------------------------------------------------

    def archive_runs(self, tx: _Tables, cutoff: datetime, limit: int) -> tuple[int, int]:
        runs = [
            run_id
            for run_id, row in sorted(tx.streams.items())
            if row.completed_at is not None
            and row.completed_at < cutoff
            and (row.archived is None or row.updated > row.archived)
            and (row.restored_at is None or row.restored_at < cutoff)
        ][:limit]
        moved = 0
        for run_id in runs:
            live = tx.events.pop(run_id, {})
            tx.archive.setdefault(run_id, {}).update(live)
            moved += len(live)
            tx.snapshots.pop(run_id, None)
            tx.streams[run_id] = dataclasses.replace(tx.streams[run_id], archived=tx.tick())
        return len(runs), moved

    def unarchive(self, tx: _Tables, run_id: str) -> int:
        archived = tx.archive.pop(run_id, {})
        if archived:
            tx.events.setdefault(run_id, {}).update(archived)
            tx.streams[run_id] = dataclasses.replace(
                tx.streams[run_id], archived=None, restored_at=datetime.now(UTC)
            )
        return len(archived)

    def taken_seqs(self, tx: _Tables, run_id: str, seqs: Sequence[int]) -> set[int]:
        return set(seqs) & set(tx.events.get(run_id, {}))

    def insert_imported(
        self,
        tx: _Tables,
        run_id: str,
        stream: Stream,
        rows: Rows,
        stamps: Mapping[int, datetime],
        ticket: Any,
    ) -> None:
        self._insert(tx, run_id, rows, stamps)


def _first(events: Sequence[Any], types: Any) -> datetime | None:
    return next((e.emitted_at for e in events if e.event_type in types), None)
