"""Dataset WAL to blobs: DynamoDB write-ahead log, flushed in batches to S3 snapshot/delta blobs.

Plain Python over boto3 clients passed in by the caller; never imports dagster.
"""

from runstate.wal.blobs import BlobIntegrityError, Manifest, BlobRef
from runstate.wal.compaction import CompactionResult, compact_dataset, rebuild_snapshot_from_wal
from runstate.wal.errors import WalError, WalInputError, WalIntegrityError, WalContentionError
from runstate.wal.flush import FlushResult, flush_batch
from runstate.wal.producer import Change, WalProducer
from runstate.wal.reader import DatasetReader
from runstate.wal.source import Batch, WalKey, last_applied_seqs, plan_batches, read_stream, sweep_pending
from runstate.wal.status import DatasetStatus, oldest_pending_age_s, wal_status
from runstate.wal.tables import ensure_blob_bucket, ensure_wal_table

__all__ = [
    "BlobIntegrityError",
    "BlobRef",
    "Batch",
    "Change",
    "CompactionResult",
    "DatasetReader",
    "DatasetStatus",
    "FlushResult",
    "Manifest",
    "WalContentionError",
    "WalError",
    "WalInputError",
    "WalIntegrityError",
    "WalKey",
    "WalProducer",
    "compact_dataset",
    "ensure_blob_bucket",
    "ensure_wal_table",
    "flush_batch",
    "last_applied_seqs",
    "oldest_pending_age_s",
    "plan_batches",
    "read_stream",
    "rebuild_snapshot_from_wal",
    "sweep_pending",
    "wal_status",
]
