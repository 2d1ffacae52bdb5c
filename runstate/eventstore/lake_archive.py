"""Runs archived to the lake (RUNSTATE_ARCHIVE_TO=lake): their events leave Postgres once the run history
in the lake has every one of them, and are read back from there.

What a backend that `lake_archives` (Postgres) records per run: `lake_upto`, the run's last seq when it was
archived there, and `lake_events`, how many events the lake holds of it up to that seq. The invariant:
a run's events up to `lake_upto` are in the lake and in neither Postgres table; any appended later are
in Postgres as usual. So a read is the lake's part (seq <= lake_upto) followed by Postgres's part.

Why an archive refuses a run the lake does not have whole, rather than export it first: exporting needs a
Spark session (a JVM of its own, the `runstate_spark` pool), and the exporter is the lake's one writer
(two exports race and one is refused). The export runs every minute (run_history_sensor), so a run that
finished an archive age ago is in the lake unless the export is broken or the run was appended to in
the last minutes; such runs stay in Postgres, whole, and `ArchiveHeldBack` names them after the others
moved. The lake's position is a prefix of the feed: every event at or below it is in the lake, and the
feed never adds one below a position it returned, so a run whose events are all at or below it is whole
there for good.

The reader of the lake (`LakeReader`: `runstate.eventstore.lake.LakeRunReader`, pyiceberg, no JVM) is
built on first use by the factory the store was given, so a store that never meets such a run never
imports pyiceberg.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from datetime import datetime
from typing import Any, Protocol

from runstate.eventstore.backend import LakeRecord, StoreBackend, Tx
from runstate.eventstore.contract import EventStoreError, StoredEvent
from runstate.eventstore.validation import check_run_id

# Events read from the lake per scan when a whole run is read back (restore, an append's key lookup).
_LAKE_PAGE = 100_000
# Runs named in an ArchiveHeldBack message.
_NAMED = 5
# Runs read back from the lake and archived per transaction (at most the backend's batch): their events
# are in memory twice, Postgres's rows and the lake's, while the stream rows stay locked.
_VERIFY_BATCH_RUNS = 100


class LakeReader(Protocol):
    """What the store needs of the lake: `LakeRunReader`'s reads. `owner` is the store's name (`<database>.
    <schema>`): a table another store owns is refused; `owned_position` refuses one that records no owner."""

    owner: str | None

    def read_run(self, run_id: str, after_seq: int = 0, limit: int = 1000) -> list[StoredEvent]: ...

    def read_runs(
        self, run_ids: Sequence[str], first: datetime, last: datetime
    ) -> dict[str, list[StoredEvent]]: ...

    def position(self) -> int: ...

    def owned_position(self) -> int: ...


class ArchiveHeldBack(EventStoreError):
    """Runs old enough to archive stayed in Postgres because the lake does not have them whole yet
    (`held_back`: run_id, its highest position), or because what was read back from the lake differs from
    their rows or could not be read (`unverified`: run_id, why); the other runs were archived (`moved`
    events)."""

    def __init__(
        self,
        message: str,
        moved: int,
        held_back: list[tuple[str, int]],
        unverified: list[tuple[str, str]] | None = None,
    ):
        super().__init__(message)
        self.moved = moved
        self.held_back = held_back
        self.unverified = unverified or []


class LakeArchive:
    """The store's reads and moves of runs archived to the lake, over its backend and a lake reader."""

    def __init__(self, backend: StoreBackend, reader: Callable[[], LakeReader] | None) -> None:
        self.backend = backend
        self._factory = reader
        self._reader: LakeReader | None = None
        self._building = threading.Lock()  # the store is thread-safe: one reader, one catalog engine

    def reader(self, run_id: str | None = None, tx: Tx | None = None) -> LakeReader:
        with self._building:
            return self._reader_locked(run_id, tx)

    def _reader_locked(self, run_id: str | None, tx: Tx | None) -> LakeReader:
        if self._reader is None:
            if self._factory is None:
                whose = f"run {run_id!r} is archived in the lake, and " if run_id else ""
                raise EventStoreError(
                    f"{whose}this event store has no lake to read from (it is built with one by "
                    "runstate.wiring from the settings: RUNSTATE_ICEBERG_CATALOG=jdbc)"
                )
            reader = self._factory()
            # The lake's tables name the store they belong to: a reader refuses another store's.
            reader.owner = (
                self.backend.lake_owner(tx)
                if tx is not None
                else self.backend.run("read the store's name", self.backend.lake_owner, transactional=False)
            )
            self._reader = reader
        return self._reader

    def close(self) -> None:
        close = getattr(getattr(self._reader, "catalog", None), "close", None)
        if close is not None:
            close()
        self._reader = None

    # -- reads ------------------------------------------------------------------------------------

    def record(self, tx: Tx, run_id: str) -> LakeRecord | None:
        if not self.backend.lake_archives:
            return None
        return self.backend.lake_record(tx, run_id)

    def events(
        self, tx: Tx, run_id: str, after_seq: int, limit: int, upto: int | None = None
    ) -> list[StoredEvent]:
        """A page of the run's events, as the backend's fetch gives them: from the lake up to the run's
        lake_upto, then from the database (whose events of the run all come after lake_upto)."""
        if not self.backend.lake_archives:
            return self.backend.fetch(tx, run_id, after_seq, limit, upto)
        stored, record = self.backend.fetch_with_lake(tx, run_id, after_seq, limit, upto)
        if record is None or after_seq >= record.upto:
            return stored
        top = record.upto if upto is None else min(upto, record.upto)
        page = [e for e in self.reader(run_id, tx).read_run(run_id, after_seq, limit) if e.run_seq <= top]
        if after_seq == 0 and top == record.upto and len(page) < min(limit, record.events):
            raise self._missing(run_id, len(page), record)
        return page + stored[: limit - len(page)]

    def whole_run(self, tx: Tx, run_id: str, record: LakeRecord) -> list[StoredEvent]:
        """Every event the lake keeps of the run (seq <= upto); refused when it holds fewer than recorded."""
        reader, events = self.reader(run_id, tx), []
        while True:
            page = reader.read_run(run_id, events[-1].run_seq if events else 0, _LAKE_PAGE)
            events += [e for e in page if e.run_seq <= record.upto]
            if len(page) < _LAKE_PAGE or page[-1].run_seq >= record.upto:
                break
        if len(events) != record.events:
            raise self._missing(run_id, len(events), record)
        return events

    def keys(self, tx: Tx, run_id: str, keys: Sequence[str]) -> dict[str, int]:
        """{key: run_seq} of `keys` the lake keeps for the run (an append to a run archived there: its
        keys are known only to the lake)."""
        record = self.record(tx, run_id)
        if record is None:
            return {}
        wanted = set(keys)
        found = {e.idempotency_key: e.run_seq for e in self.whole_run(tx, run_id, record)}
        return {key: seq for key, seq in found.items() if key in wanted}

    @staticmethod
    def _missing(run_id: str, found: int, record: LakeRecord) -> EventStoreError:
        return EventStoreError(
            f"run {run_id!r} is archived in the lake with {record.events} event(s) up to seq {record.upto}, "
            f"but the lake holds {found}: is RUNSTATE_HISTORY_NAMESPACE the one it was archived with? "
            "Nothing was changed"
        )

    # -- moves ------------------------------------------------------------------------------------

    def archive(self, cutoff: datetime, batch_runs: int) -> int:
        """Drop the events of runs completed before `cutoff` from Postgres, those the lake has whole, a
        transaction per batch of runs; ArchiveHeldBack afterwards when some it has not.

        The lake's position only says which runs it should have whole. Before a run's rows are deleted
        they are read back from the lake and compared (count and checksum of every column), in the
        transaction that deletes them, with the rows and the run's stream locked: a run that differs, or
        whose events cannot be read, keeps its rows and is named; the others move."""
        if not self.backend.lake_archives:
            raise EventStoreError(
                f"RUNSTATE_ARCHIVE_TO=lake: the {self.backend.name} event store cannot archive to the lake: "
                "the lake is exported from a Postgres store only (its feed never skips an event that "
                "commits late); set RUNSTATE_ARCHIVE_TO=postgres"
            )
        reader = self.reader()
        position = reader.owned_position()
        limit = min(batch_runs, _VERIFY_BATCH_RUNS)
        total, after, unverified = 0, "", []
        while True:
            seen, moved, failed, after = self.backend.run(
                "archive to the lake",
                lambda tx, after=after: self._archive_batch(tx, reader, cutoff, limit, position, after),
            )
            total, unverified = total + moved, unverified + failed
            if seen < limit:
                break
        held = self.backend.run(
            "list runs held back",
            lambda tx: self.backend.lake_held_back(tx, cutoff, position),
            transactional=False,
        )
        if held or unverified:
            raise ArchiveHeldBack(
                _held_back_message(total, position, held, unverified), total, held, unverified
            )
        return total

    def _archive_batch(
        self, tx: Tx, reader: LakeReader, cutoff: datetime, limit: int, position: int, after: str
    ) -> tuple[int, int, list[tuple[str, str]], str]:
        """One transaction: (runs looked at, events moved, runs kept and why, the last run looked at)."""
        candidates = self.backend.lake_candidates(tx, cutoff, limit, position, after)
        if not candidates:
            return 0, 0, [], after
        rows = self.backend.lake_archive_rows(tx, [run_id for run_id, _ in candidates])
        lake = _read_back(reader, rows)
        verified, failed = [], []
        for run_id, upto in candidates:
            problem = _difference(rows[run_id], lake[run_id], upto)
            if problem is None:
                verified.append(run_id)
            else:
                failed.append((run_id, problem))
        moved = 0
        if verified:
            deleted = self.backend.drop_into_lake(tx, verified)
            for run_id in verified:
                if deleted.get(run_id, 0) != len(rows[run_id]):  # the locks make this impossible: say so
                    raise EventStoreError(
                        f"archive to the lake: run {run_id!r} had {len(rows[run_id])} row(s) read back from "
                        f"the lake, but {deleted.get(run_id, 0)} would leave Postgres; nothing of this batch "
                        "was archived"
                    )
            moved = sum(deleted.values())
        return len(candidates), moved, failed, candidates[-1][0]

    def restore(self, tx: Tx, run_id: str) -> int:
        """Inside the restore's transaction, the run's stream row locked: put the events the lake keeps of
        it back into run_events, exactly as they were, and clear its record; how many were read back (0:
        none kept there). One transaction: a restore killed halfway left nothing, and a repeat does it all."""
        check_run_id(run_id)
        record = self.record(tx, run_id)
        if record is None:
            return 0
        events = self.whole_run(tx, run_id, record)
        self.backend.restore_from_lake(tx, run_id, events)
        return len(events)


def _read_back(reader: LakeReader, rows: dict[str, list[StoredEvent]]) -> dict[str, list[StoredEvent] | str]:
    """What the lake holds of each run with rows to delete, within the days of those rows (the lake's
    partitions), or why it could not be read: one read for the batch, and a read per run when that fails
    (one unreadable file must not keep the other runs back, and must name its run)."""
    found: dict[str, list[StoredEvent] | str] = {run_id: [] for run_id, events in rows.items() if not events}
    wanted = {run_id: events for run_id, events in rows.items() if events}
    if not wanted:
        return found
    try:
        lake = reader.read_runs(list(wanted), *_window(wanted.values()))
        return {**found, **{run_id: lake.get(run_id, []) for run_id in wanted}}
    except EventStoreError:
        pass
    for run_id, events in wanted.items():
        try:
            found[run_id] = reader.read_runs([run_id], *_window([events])).get(run_id, [])
        except EventStoreError as error:
            found[run_id] = f"its events could not be read back from the lake: {error}"
    return found


def _window(runs: Iterable[list[StoredEvent]]) -> tuple[datetime, datetime]:
    times = [event.emitted_at for events in runs for event in events]
    return min(times), max(times)


def _difference(mine: list[StoredEvent], lake: list[StoredEvent] | str, upto: int) -> str | None:
    """None when the lake holds exactly the rows about to leave Postgres (those after seq `upto`, up to
    which it keeps the run already), else what differs."""
    if isinstance(lake, str):
        return lake
    theirs = [event for event in lake if event.run_seq > upto]
    if len(theirs) == len(mine) and events_checksum(theirs) == events_checksum(mine):
        return None
    return (
        f"the lake holds {len(theirs)} of its event(s) after seq {upto} (checksum "
        f"{events_checksum(theirs)[:12]}), Postgres {len(mine)} (checksum {events_checksum(mine)[:12]})"
    )


def events_checksum(events: Iterable[StoredEvent]) -> str:
    """SHA-256 over every column of the events in (run_id, run_seq) order, payloads in canonical JSON."""
    digest = hashlib.sha256()
    for event in sorted(events, key=lambda e: (e.run_id, e.run_seq)):
        line = json.dumps(asdict(event), sort_keys=True, separators=(",", ":"), default=_canonical)
        digest.update(line.encode() + b"\n")
    return digest.hexdigest()


def _canonical(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not a column of an event")


def _held_back_message(
    total: int, position: int, held: list[tuple[str, int]], unverified: list[tuple[str, str]]
) -> str:
    parts = [f"archived {total} event(s) to the lake"]
    if held:
        named = ", ".join(f"{run_id!r} (up to position {top})" for run_id, top in held[:_NAMED])
        more = f" and {len(held) - _NAMED} more" if len(held) > _NAMED else ""
        parts.append(
            f"{len(held)} run(s) stay in Postgres because the lake has reached feed position {position} "
            f"only: {named}{more}. Export first (`runstate events export`, or let run_history_sensor catch "
            "up), then archive again"
        )
    if unverified:
        named = "; ".join(f"run {run_id!r}: {why}" for run_id, why in unverified[:_NAMED])
        more = f"; and {len(unverified) - _NAMED} more" if len(unverified) > _NAMED else ""
        parts.append(
            f"{len(unverified)} run(s) stay in Postgres, rows untouched, because what the lake holds of them "
            f"was not what Postgres holds: {named}{more}"
        )
    return "; ".join(parts)


def lake_reader_factory(pg_url: str, warehouse_dir: Any, namespace: str) -> Callable[[], LakeReader]:
    """A factory of the LakeRunReader on the JDBC catalog of `pg_url`'s database (pyiceberg, imported on use)."""

    def build() -> LakeReader:
        from runstate.eventstore.lake.reader import HistoryCatalog, LakeRunReader

        return LakeRunReader(HistoryCatalog(pg_url, warehouse_dir), namespace)

    return build
