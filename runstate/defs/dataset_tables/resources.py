"""What a merge takes from the WAL resource: where the blobs are (a BlobLocation), and the copy-on-write limit."""

from __future__ import annotations

from runstate.defs.wal.resources import WalResource, _plain
from runstate.wal.dataset_tables import BlobLocation


def copy_on_write_max_bytes(wal: WalResource) -> int:
    """The merges' copy-on-write limit (RUNSTATE_COPY_ON_WRITE_MAX_MB), in bytes."""
    return wal.dataset_table_copy_on_write_max_mb << 20


def blob_location(wal: WalResource) -> BlobLocation:
    """Shipped to every Spark task; credentials only when configured (else the executors' own chain)."""
    return BlobLocation(
        bucket=wal.bucket,
        prefix=wal.prefix,
        endpoint_url=wal.endpoint_url,
        region=wal.region,
        access_key_id=_plain(wal.aws_access_key_id),
        secret_access_key=_plain(wal.aws_secret_access_key),
    )
