"""Flush: turn a dataset's pending WAL rows into one delta blob, publish it, and mark the rows Applied.

Order of the steps, and why each crash point is safe (re-running gives the same final state):
1. Read the manifest (version V) and re-read WAL rows V+1..last with consistent reads; rows <= V are
   already applied and skipped. Verify every row's checksum; a mismatch or a missing seq raises
   WalIntegrityError naming the dataset and seq, before anything is written.
2. Encode the rows as a deterministic Parquet delta and PutObject it to a deterministic key
   (`delta/{V+1}-{last}`) with ChecksumAlgorithm SHA256. A crash here leaves at most an unreferenced
   object that the re-run overwrites with the very same bytes.
3. Append the delta to the manifest with a conditional put (IfMatch). This is the commit point: the
   reader sees rows V+1..last from now on. If the manifest moved (another flush, a compaction), start
   again from step 1 with the new version.
4. Mark the rows Applied#YYYY-MM with conditional UpdateItems (StatusIdx = Pending), in parallel threads
   (DynamoDB has no batch UpdateItem). This comes after the commit point, deliberately unlike the seed's
   order, so "Applied" always means "visible to readers". A crash here leaves rows <= V still Pending: the
   sweep finds them and the next flush, finding them below V, only marks them.
5. Advance LastAppliedSeq, monotonic and conditional (never moves back).
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from runstate.wal import layout as t
from runstate.wal.blobs import BlobRef, BlobStore, Manifest
from runstate.wal.changes import Change, decode_changes, sha256_hex, validate_dataset_id
from runstate.wal.errors import WalContentionError, WalInputError, WalIntegrityError
from runstate.wal.table import WalTable

MAX_MANIFEST_ATTEMPTS = 20
# Up to this many rows, one BatchGetItem per 100 (O(rows)); beyond, a Query (1 MB pages).
SMALL_RANGE = 200
DEFAULT_MARK_WORKERS = 16


@dataclass(frozen=True)
class FlushResult:
    """What one flush did. `rows` WAL rows (`changes` changes) went into the delta `blob_key` covering
    first_seq..last_seq; `applied` rows were marked Applied by this call, `skipped` of the batch's seqs were
    already applied. A flush that found nothing new has rows == 0 and blob_key None."""

    dataset_id: str
    rows: int
    applied: int
    skipped: int
    first_seq: int
    last_seq: int
    blob_key: str | None
    blob_bytes: int
    changes: int = 0
    version: int = 0


@dataclass(frozen=True)
class WalRow:
    """A WAL row as read back from DynamoDB, checksum verified."""

    dataset_id: str
    seq: int
    status: str
    created_at: int
    checksum: str
    changes: list[Change]


def flush_dataset(
    table: WalTable,
    blobs: BlobStore,
    dataset_id: str,
    seqs: Iterable[int],
    *,
    now: datetime | None = None,
    max_workers: int | None = None,
) -> FlushResult:
    """Apply every pending row of `dataset_id` up to max(seqs) (see the module doc for the steps)."""
    validate_dataset_id(dataset_id)
    batch = sorted(set(validate_seqs(dataset_id, seqs)))
    now = now or datetime.now(UTC)
    last_applied_before = table.meta(dataset_id).last_applied_seq
    target = batch[-1]
    written: BlobRef | None = None
    for _ in range(MAX_MANIFEST_ATTEMPTS):
        manifest = blobs.read_manifest(dataset_id)
        version_before = manifest.version
        if target <= manifest.version:
            break
        rows = read_rows(table, dataset_id, manifest.version + 1, target)
        ref = blobs.put_delta(dataset_id, [(row.seq, row.changes) for row in rows])
        manifest = manifest.with_delta(ref)
        if blobs.write_manifest(manifest, manifest.etag):
            written = ref
            break
    else:
        raise WalContentionError(
            f"dataset {dataset_id!r}: manifest kept moving; gave up after {MAX_MANIFEST_ATTEMPTS} tries"
        )
    upto = min(target, manifest.version)
    to_mark = [
        seq
        for seq in sorted(set(batch) | set(range(last_applied_before + 1, upto + 1)))
        if seq <= manifest.version
    ]
    marked = mark_applied(table, dataset_id, to_mark, manifest, now, max_workers=max_workers)
    table.advance_last_applied(dataset_id, upto)
    return FlushResult(
        dataset_id=dataset_id,
        rows=(written.last_seq - written.first_seq + 1) if written else 0,
        applied=marked,
        skipped=sum(1 for seq in batch if seq <= version_before),
        first_seq=written.first_seq if written else batch[0],
        last_seq=written.last_seq if written else batch[-1],
        blob_key=written.key if written else None,
        blob_bytes=written.bytes if written else 0,
        changes=written.rows if written else 0,
        version=manifest.version,
    )


def validate_seqs(dataset_id: str, seqs: Iterable[int]) -> list[int]:
    """The seqs as a list, or WalInputError unless they are one or more positive integers."""
    values = list(seqs)
    if not values:
        raise WalInputError(f"dataset {dataset_id!r}: a flush needs at least one seq")
    for seq in values:
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
            raise WalInputError(f"dataset {dataset_id!r}: seq {seq!r} is not a positive integer")
    return values


def read_rows(table: WalTable, dataset_id: str, first_seq: int, last_seq: int) -> list[WalRow]:
    """WAL rows first..last (consistent reads), checksums verified, every seq present."""
    if last_seq - first_seq < SMALL_RANGE:
        items = table.get_rows(dataset_id, range(first_seq, last_seq + 1))
    else:
        items = table.query_rows(dataset_id, first_seq, last_seq)
    rows = [_verified_row(dataset_id, item) for item in items]
    present = {row.seq for row in rows}
    for seq in range(first_seq, last_seq + 1):
        if seq not in present:
            raise WalIntegrityError(
                f"dataset {dataset_id!r}: WAL row seq {seq} is missing (needed to apply {first_seq}..{last_seq})"
            )
    return rows


def _verified_row(dataset_id: str, item: dict[str, Any]) -> WalRow:
    seq = int(item[t.SEQ_NO]["N"])
    payload = item.get(t.PAYLOAD, {}).get("S")
    expected = item.get(t.CHECKSUM, {}).get("S")
    if payload is None or expected is None:
        raise WalIntegrityError(f"dataset {dataset_id!r}: WAL row seq {seq} has no payload or checksum")
    actual = sha256_hex(payload.encode("utf-8"))
    if actual != expected:
        raise WalIntegrityError(
            f"dataset {dataset_id!r}: WAL row seq {seq} checksum mismatch "
            f"(expected {expected[:12]}.., got {actual[:12]}..)"
        )
    return WalRow(
        dataset_id,
        seq,
        item[t.STATUS_IDX]["S"],
        int(item[t.CREATED_AT]["N"]),
        expected,
        decode_changes(payload),
    )


def mark_applied(
    table: WalTable,
    dataset_id: str,
    seqs: list[int],
    manifest: Manifest,
    now: datetime,
    *,
    max_workers: int | None = None,
) -> int:
    """Mark the rows Applied#YYYY-MM (only if still Pending), in parallel; returns how many changed."""
    if not seqs:
        return 0
    status = t.applied_status(now.year, now.month)
    applied_at = int(now.timestamp())
    workers = max(1, min(len(seqs), max_workers or DEFAULT_MARK_WORKERS))

    def mark(seq: int) -> bool:
        ref = manifest.blob_for_seq(seq)
        return table.mark_applied(dataset_id, seq, status, ref.key if ref else "", applied_at)

    if workers == 1:
        return sum(mark(seq) for seq in seqs)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="wal-mark") as pool:
        return sum(pool.map(mark, seqs))
