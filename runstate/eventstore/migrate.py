"""Copy run events from one store to another (Postgres -> Snowflake).

Resumable and idempotent: per run, copying restarts after the target's highest run_seq, each batch
goes through `target.import_events` (which keeps run_seq, skips keys already present and is atomic
per run), and a finished run is verified by row count and a sha256 over its events on both sides.
Interrupt it anywhere and run it again: it picks up where it stopped and never writes twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC

from runstate.eventstore.contract import MigrationReport, StoredEvent
from runstate.eventstore.store import EventStore

log = logging.getLogger("runstate.eventstore.migrate")


def migrate_events(
    source: EventStore,
    target: EventStore,
    *,
    batch_size: int = 1000,
    progress: Callable[[int], None] | None = None,
    run_ids: Iterable[str] | None = None,
) -> MigrationReport:
    """Copy every run's events (or those of `run_ids`); `progress(n)` after each batch of n events."""
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
    runs = read = written = 0
    mismatches: list[str] = []
    for run_id in run_ids if run_ids is not None else iter_run_ids(source):
        runs += 1
        after_seq = target.max_seq(run_id)
        while True:
            batch = source.fetch(run_id, after_seq=after_seq, limit=batch_size)
            if not batch:
                break
            written += target.import_events(batch)
            read += len(batch)
            after_seq = batch[-1].run_seq
            if progress is not None:
                progress(len(batch))
        mismatches.extend(verify_run(source, target, run_id))
    report = MigrationReport(
        runs=runs,
        events_read=read,
        events_written=written,
        events_skipped=read - written,
        verified=not mismatches,
        mismatches=mismatches,
    )
    log.info(
        "migrated %d runs: %d events read, %d written, verified=%s", runs, read, written, report.verified
    )
    return report


def verify_migration(
    source: EventStore, target: EventStore, run_ids: Iterable[str] | None = None
) -> list[str]:
    """Every mismatch between the two stores, per run (empty when they agree)."""
    problems: list[str] = []
    for run_id in run_ids if run_ids is not None else iter_run_ids(source):
        problems.extend(verify_run(source, target, run_id))
    return problems


def verify_run(source: EventStore, target: EventStore, run_id: str) -> list[str]:
    src_count, src_digest = run_digest(source, run_id)
    dst_count, dst_digest = run_digest(target, run_id)
    if src_count != dst_count:
        return [f"run {run_id!r}: {src_count} events in the source, {dst_count} in the target"]
    if src_digest != dst_digest:
        return [f"run {run_id!r}: checksum mismatch (source {src_digest[:12]}.., target {dst_digest[:12]}..)"]
    return []


def run_digest(store: EventStore, run_id: str, page: int = 5000) -> tuple[int, str]:
    """(event count, sha256 over the run's events in run_seq order) as the store returns them."""
    digest = hashlib.sha256()
    count = 0
    for event in iter_events(store, run_id, page):
        digest.update(_canonical(event))
        count += 1
    return count, digest.hexdigest()


def iter_events(store: EventStore, run_id: str, page: int = 5000) -> Iterator[StoredEvent]:
    after = 0
    while True:
        batch = store.fetch(run_id, after_seq=after, limit=page)
        yield from batch
        if len(batch) < page:
            return
        after = batch[-1].run_seq


def iter_run_ids(store: EventStore, page: int = 1000) -> Iterator[str]:
    after = ""
    while True:
        batch = store.run_ids(after=after, limit=page)
        yield from batch
        if len(batch) < page:
            return
        after = batch[-1]


def _canonical(event: StoredEvent) -> bytes:
    # Everything the event says, in a backend-neutral form (UTC instants, sorted-key JSON).
    return (
        json.dumps(
            [
                event.run_id,
                event.run_seq,
                event.event_id,
                event.event_type,
                event.idempotency_key,
                event.step_id,
                event.engine_attempt_id,
                event.logical_attempt_id,
                event.plan_version,
                event.caused_by_signal_id,
                event.parent_event_id,
                event.adapter_version,
                event.emitted_at.astimezone(UTC).isoformat(),
                event.data,
                event.engine_run_ref,
            ],
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        ).encode("utf-8")
        + b"\n"
    )
