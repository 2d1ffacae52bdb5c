"""Whole runs moved: to the archive and back (archive, restore), and in from another store (import).

The EventStore's archive(), restore() and import_events() are these, over its backend. An event is in
exactly one of the live table and the archive at any time; `fetch`, `project` and `resume` read both.
With RUNSTATE_ARCHIVE_TO=lake the archive drops runs the lake has whole from Postgres instead, and the
restore brings them back from there (lake_archive.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from runstate.eventstore.backend import StoreBackend, Tx
from runstate.eventstore.contract import InvalidEvent, StoredEvent
from runstate.eventstore.lake_archive import LakeArchive
from runstate.eventstore.rows import validate_imported
from runstate.eventstore.sequencing import by_run, fresh_imports
from runstate.eventstore.validation import check_run_id

log = logging.getLogger("runstate.eventstore")


def archive(
    backend: StoreBackend,
    older_than_days: int,
    now: datetime | None,
    batch_runs: int,
    lake: LakeArchive | None = None,
) -> int:
    """Move the events of runs finished more than `older_than_days` before `now` to the archive (or, with
    `lake`, drop those the lake has whole), one transaction per `batch_runs` runs; returns how many events
    moved. A second call moves nothing."""
    if not isinstance(older_than_days, int) or older_than_days < 0:
        raise InvalidEvent("older_than_days", f"must be a non-negative integer, got {older_than_days!r}")
    now = now or datetime.now(UTC)
    if now.tzinfo is None:
        raise InvalidEvent("now", "must be timezone-aware")
    cutoff = now - timedelta(days=older_than_days)
    total = (
        lake.archive(cutoff, batch_runs)
        if lake is not None
        else _archive_batches(backend, cutoff, batch_runs)
    )
    # The daily archive is the store's housekeeping: pack the indexes that appends leave sparse, when due.
    for rebuilt in backend.compact_indexes():
        log.info(
            "archive: rebuilt %s (%d to %d bytes)", rebuilt.index, rebuilt.bytes_before, rebuilt.bytes_after
        )
    return total


def _archive_batches(backend: StoreBackend, cutoff: datetime, batch_runs: int) -> int:
    total = 0
    while True:
        runs, moved = backend.run("archive", lambda tx: backend.archive_runs(tx, cutoff, batch_runs))
        total += moved
        if runs < batch_runs:
            return total


def restore(backend: StoreBackend, run_id: str, lake: LakeArchive) -> int:
    """Move an archived run's events back under its stream lock (from the archive table, and from the lake
    what it keeps of the run), in one transaction; returns how many moved. A run with nothing archived is
    left exactly as it was (it stays archivable)."""
    check_run_id(run_id)

    def work(tx: Tx) -> int:
        if backend.find_stream(tx, run_id) is None:
            return 0
        return lake.restore(tx, run_id) + backend.unarchive(tx, run_id)

    return backend.run(f"restore run {run_id!r}", work)


def import_events(
    backend: StoreBackend, events: Iterable[StoredEvent], max_event_bytes: int, lake: LakeArchive
) -> int:
    """Store events from another store with their run_seq, a transaction per run; keys already present
    (in the lake too, for a run archived there) are skipped, a key or a seq stored differently is an
    EventStoreError. Returns how many were written."""
    return sum(
        _import_run(backend, run_id, run_events, max_event_bytes, lake)
        for run_id, run_events in by_run(events).items()
    )


def _import_run(
    backend: StoreBackend, run_id: str, events: list[StoredEvent], max_event_bytes: int, lake: LakeArchive
) -> int:
    valid = validate_imported(run_id, events, max_event_bytes)
    stamps = {e.run_seq: e.persisted_at for e in events}
    keys = {v.idempotency_key: seq for seq, v in valid}
    ticket = backend.open_stream(run_id)

    def work(tx: Tx) -> int:
        stream = backend.lock_stream(tx, run_id)
        stored: dict[str, int] = {}
        if stream.event_count or stream.archived:
            stored = backend.existing_keys(tx, run_id, list(keys), archived=stream.archived)
        if stream.archived:
            stored.update(lake.keys(tx, run_id, list(keys)))
        taken = backend.taken_seqs(tx, run_id, [seq for seq, _ in valid])
        fresh = fresh_imports(run_id, valid, stored, taken)
        if fresh:
            backend.insert_imported(tx, run_id, stream, fresh, stamps, ticket)
        return len(fresh)

    return backend.run_confirmed(f"import into run {run_id!r}", run_id, work, lambda _: keys)
