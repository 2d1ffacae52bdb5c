"""Dataset WAL to blobs: DynamoDB write-ahead log, flushed in batches to S3 snapshot/delta blobs.

Plain Python over boto3 clients passed in by the caller; never imports dagster. `WalTable` owns every
request to the DynamoDB table and `BlobStore` every request to the bucket.
"""

from runstate.wal.blobs import BlobRef, BlobStore, Manifest
from runstate.wal.compaction import (
    CompactionResult,
    compact,
    rebuild_snapshot,
)
from runstate.wal.errors import (
    BlobIntegrityError,
    WalContentionError,
    WalEncodingError,
    WalError,
    WalInputError,
    WalIntegrityError,
    WalServiceError,
)
from runstate.wal.flush import FlushResult, flush_dataset
from runstate.wal.layout import ensure_blob_bucket, ensure_wal_table
from runstate.wal.producer import Change, WalProducer
from runstate.wal.reader import DatasetReader, state_document
from runstate.wal.source import Batch, WalKey, last_applied_seqs, plan_batches, read_stream, sweep_pending
from runstate.wal.status import DatasetStatus, oldest_pending_age_s, wal_status
from runstate.wal.table import WalTable

__all__ = [
    "BlobIntegrityError",
    "BlobRef",
    "BlobStore",
    "Batch",
    "Change",
    "CompactionResult",
    "DatasetReader",
    "DatasetStatus",
    "FlushResult",
    "Manifest",
    "WalContentionError",
    "WalEncodingError",
    "WalError",
    "WalInputError",
    "WalIntegrityError",
    "WalKey",
    "WalProducer",
    "WalServiceError",
    "WalTable",
    "compact",
    "ensure_blob_bucket",
    "ensure_wal_table",
    "flush_dataset",
    "last_applied_seqs",
    "oldest_pending_age_s",
    "plan_batches",
    "read_stream",
    "rebuild_snapshot",
    "state_document",
    "sweep_pending",
    "wal_status",
]
