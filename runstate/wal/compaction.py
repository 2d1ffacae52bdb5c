"""Compaction: fold deltas into a new snapshot, retire and archive old blobs, trim old Applied WAL rows.

Safety for readers in the middle of a read: switching the manifest never deletes anything. The blobs
it stops referencing are listed in the manifest's `retired` list with the time they were retired, and
only a later compaction, once `grace_seconds` (default 1 h) have passed since then, copies them to
`{prefix}{dataset}/archive/...` and deletes the originals. A reader that loaded the previous manifest
therefore finds every blob it needs for at least the grace period; a read slower than that fails with
BlobIntegrityError naming the missing blob (never a silent stale state).

WAL rows are trimmed only when Applied, older than `retention_days`, AND covered by the snapshot (and
never above the producer's LastSeq hint, the slots a writer may probe), so
`rebuild_snapshot` can always rebuild from the snapshot plus the remaining rows. Client-token
rows are kept, so a retry of an old append still returns its original seq.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from runstate.wal.blobs import BlobStore, Manifest, RetiredBlob
from runstate.wal.changes import Key, fold, validate_dataset_id
from runstate.wal.errors import WalContentionError, WalInputError, WalIntegrityError
from runstate.wal.flush import read_rows
from runstate.wal.reader import DatasetReader
from runstate.wal.table import WalTable

DEFAULT_GRACE_SECONDS = 3600.0
MAX_ATTEMPTS = 20


@dataclass(frozen=True)
class CompactionResult:
    dataset_id: str
    version: int
    snapshot_key: str | None
    snapshot_bytes: int
    deltas_folded: int
    rows_trimmed: int
    blobs_archived: int
    keys: int = 0


def compact(
    table: WalTable,
    blobs: BlobStore,
    dataset_id: str,
    *,
    retention_days: float,
    now: datetime | None = None,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
) -> CompactionResult:
    """New snapshot from the previous snapshot + deltas (manifest switched atomically), then archive
    blobs retired more than `grace_seconds` ago, then trim Applied rows older than `retention_days`."""
    validate_dataset_id(dataset_id)
    if retention_days < 0 or grace_seconds < 0:
        raise WalInputError(f"dataset {dataset_id!r}: retention_days and grace_seconds must be >= 0")
    now = now or datetime.now(UTC)
    reader = DatasetReader.of(blobs, dataset_id)
    folded = 0
    for _ in range(MAX_ATTEMPTS):
        manifest = reader.manifest()
        if not manifest.deltas:
            break
        if _switch_to_snapshot(blobs, manifest, reader.state_at(manifest), now):
            folded = len(manifest.deltas)
            break
    else:
        raise WalContentionError(f"dataset {dataset_id!r}: manifest kept moving during compaction")
    archived = archive_retired(blobs, dataset_id, now=now, grace_seconds=grace_seconds)
    manifest = reader.manifest()
    trimmed = 0
    if manifest.snapshot is not None:
        cutoff = now - timedelta(days=retention_days)
        # Never above the producer's seq hint: a writer probes every slot above it.
        up_to = min(manifest.snapshot.last_seq, table.meta(dataset_id).last_seq)
        trimmed = trim_applied_rows(table, dataset_id, up_to, cutoff)
    snapshot = manifest.snapshot
    return CompactionResult(
        dataset_id=dataset_id,
        version=manifest.version,
        snapshot_key=snapshot.key if snapshot else None,
        snapshot_bytes=snapshot.bytes if snapshot else 0,
        deltas_folded=folded,
        rows_trimmed=trimmed,
        blobs_archived=archived,
        keys=snapshot.rows if snapshot else 0,
    )


def rebuild_snapshot(
    table: WalTable, blobs: BlobStore, dataset_id: str, *, now: datetime | None = None
) -> CompactionResult:
    """Rebuild the snapshot at the manifest's version from the WAL rows in DynamoDB (not from the deltas).

    Starts from nothing when the WAL still holds seq 1, else from the current snapshot (trimmed rows are
    always covered by it). The rebuilt snapshot replaces the manifest's snapshot and deltas; this is how
    a corrupt or lost delta blob is repaired.
    """
    validate_dataset_id(dataset_id)
    now = now or datetime.now(UTC)
    reader = DatasetReader.of(blobs, dataset_id)
    for _ in range(MAX_ATTEMPTS):
        manifest = reader.manifest()
        if manifest.version == 0:
            return CompactionResult(dataset_id, 0, None, 0, 0, 0, 0)
        base_version, state = _rebuild_base(table, reader, manifest)
        if base_version < manifest.version:
            rows = read_rows(table, dataset_id, base_version + 1, manifest.version)
            state = fold(state, (change for row in rows for change in row.changes))
        if _switch_to_snapshot(blobs, manifest, state, now):
            snapshot = reader.manifest().snapshot
            assert snapshot is not None
            return CompactionResult(
                dataset_id,
                snapshot.last_seq,
                snapshot.key,
                snapshot.bytes,
                len(manifest.deltas),
                0,
                0,
                keys=snapshot.rows,
            )
    raise WalContentionError(f"dataset {dataset_id!r}: manifest kept moving during the rebuild")


def _rebuild_base(table: WalTable, reader: DatasetReader, manifest: Manifest) -> tuple[int, dict[Key, Any]]:
    lowest = table.lowest_seq(reader.dataset_id)
    if lowest == 1:
        return 0, {}
    snapshot = manifest.snapshot
    if (
        snapshot is None
        or lowest is not None
        and lowest > snapshot.last_seq + 1
        or (lowest is None and snapshot.last_seq < manifest.version)
    ):
        raise WalIntegrityError(
            f"dataset {reader.dataset_id!r}: WAL history is trimmed below seq {lowest} and no snapshot covers it"
        )
    only_snapshot = replace(manifest, version=snapshot.last_seq, deltas=())
    return snapshot.last_seq, reader.state_at(only_snapshot)


def _switch_to_snapshot(blobs: BlobStore, manifest: Manifest, state: dict[Key, Any], now: datetime) -> bool:
    """Write the snapshot blob, then replace the manifest (conditional) retiring the blobs it replaces."""
    ref = blobs.put_snapshot(manifest.dataset_id, manifest.version, state)
    retired_at = now.timestamp()
    newly_retired = tuple(
        RetiredBlob(old.key, old.sha256, retired_at) for old in manifest.blobs() if old.key != ref.key
    )
    new = Manifest(manifest.dataset_id, manifest.version, ref, (), manifest.retired + newly_retired)
    return blobs.write_manifest(new, manifest.etag)


def archive_retired(blobs: BlobStore, dataset_id: str, *, now: datetime, grace_seconds: float) -> int:
    """Move retired blobs older than the grace period to archive/, then drop them from the manifest."""
    manifest = blobs.read_manifest(dataset_id)
    live = {ref.key for ref in manifest.blobs()}
    due = [blob for blob in manifest.retired if blob.retired_at + grace_seconds <= now.timestamp()]
    for blob in due:
        if blob.key not in live:
            blobs.archive(dataset_id, blob.key)
    done = {blob.key for blob in due}
    for _ in range(MAX_ATTEMPTS):
        if not done & {blob.key for blob in manifest.retired}:
            break
        remaining = tuple(blob for blob in manifest.retired if blob.key not in done)
        if blobs.write_manifest(replace(manifest, retired=remaining), manifest.etag):
            break
        manifest = blobs.read_manifest(dataset_id)
    return len(due)


def trim_applied_rows(
    table: WalTable, dataset_id: str, up_to_seq: int, created_before: datetime, max_workers: int = 8
) -> int:
    """Delete Applied WAL rows with seq <= up_to_seq created before the cutoff; returns how many."""
    seqs = table.applied_seqs(dataset_id, up_to_seq, int(created_before.timestamp()))
    if not seqs:
        return 0
    with ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="wal-trim") as pool:
        return sum(pool.map(lambda seq: table.delete_applied(dataset_id, seq), seqs))
