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

import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol

from runstate.eventstore.backend import LakeRecord, StoreBackend, Tx
from runstate.eventstore.contract import EventStoreError, StoredEvent
from runstate.eventstore.validation import check_run_id

# Events read from the lake per scan when a whole run is read back (restore, an append's key lookup).
_LAKE_PAGE = 100_000
# Runs named in an ArchiveHeldBack message.
_NAMED = 5


class LakeReader(Protocol):
    """What the store needs of the lake: `LakeRunReader`'s reads."""

    def read_run(self, run_id: str, after_seq: int = 0, limit: int = 1000) -> list[StoredEvent]: ...

    def position(self) -> int: ...


class ArchiveHeldBack(EventStoreError):
    """Runs old enough to archive stayed in Postgres because the lake does not have them whole yet; the
    other runs were archived (`moved` events)."""

    def __init__(self, message: str, moved: int, held_back: list[tuple[str, int]]):
        super().__init__(message)
        self.moved = moved
        self.held_back = held_back


class LakeArchive:
    """The store's reads and moves of runs archived to the lake, over its backend and a lake reader."""

    def __init__(self, backend: StoreBackend, reader: Callable[[], LakeReader] | None) -> None:
        self.backend = backend
        self._factory = reader
        self._reader: LakeReader | None = None
        self._building = threading.Lock()  # the store is thread-safe: one reader, one catalog engine

    def reader(self, run_id: str | None = None) -> LakeReader:
        with self._building:
            return self._reader_locked(run_id)

    def _reader_locked(self, run_id: str | None) -> LakeReader:
        if self._reader is None:
            if self._factory is None:
                whose = f"run {run_id!r} is archived in the lake, and " if run_id else ""
                raise EventStoreError(
                    f"{whose}this event store has no lake to read from (it is built with one by "
                    "runstate.wiring from the settings: RUNSTATE_ICEBERG_CATALOG=jdbc)"
                )
            self._reader = self._factory()
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
        page = [e for e in self.reader(run_id).read_run(run_id, after_seq, limit) if e.run_seq <= top]
        if after_seq == 0 and top == record.upto and len(page) < min(limit, record.events):
            raise self._missing(run_id, len(page), record)
        return page + stored[: limit - len(page)]

    def whole_run(self, tx: Tx, run_id: str, record: LakeRecord) -> list[StoredEvent]:
        """Every event the lake keeps of the run (seq <= upto); refused when it holds fewer than recorded."""
        reader, events = self.reader(run_id), []
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
        transaction per `batch_runs` runs; ArchiveHeldBack afterwards when some it has not."""
        if not self.backend.lake_archives:
            raise EventStoreError(
                f"RUNSTATE_ARCHIVE_TO=lake: the {self.backend.name} event store cannot archive to the lake: "
                "the lake is exported from a Postgres store only (its feed never skips an event that "
                "commits late); set RUNSTATE_ARCHIVE_TO=postgres"
            )
        position = self.reader().position()
        total = 0
        while True:
            runs, moved = self.backend.run(
                "archive to the lake",
                lambda tx: self.backend.archive_runs_to_lake(tx, cutoff, batch_runs, position),
            )
            total += moved
            if runs < batch_runs:
                break
        held = self.backend.run(
            "list runs held back",
            lambda tx: self.backend.lake_held_back(tx, cutoff, position),
            transactional=False,
        )
        if held:
            named = ", ".join(f"{run_id!r} (up to position {top})" for run_id, top in held[:_NAMED])
            more = f" and {len(held) - _NAMED} more" if len(held) > _NAMED else ""
            raise ArchiveHeldBack(
                f"archived {total} event(s) to the lake; {len(held)} run(s) stay in Postgres because the "
                f"lake has reached feed position {position} only: {named}{more}. Export first "
                "(`runstate events export`, or let run_history_sensor catch up), then archive again",
                total,
                held,
            )
        return total

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


def lake_reader_factory(pg_url: str, warehouse_dir: Any, namespace: str) -> Callable[[], LakeReader]:
    """A factory of the LakeRunReader on the JDBC catalog of `pg_url`'s database (pyiceberg, imported on use)."""

    def build() -> LakeReader:
        from runstate.eventstore.lake.reader import HistoryCatalog, LakeRunReader

        return LakeRunReader(HistoryCatalog(pg_url, warehouse_dir), namespace)

    return build
