"""What a merge takes from the WAL resource: where the blobs are (a BlobLocation), and the copy-on-write limit."""

from __future__ import annotations

from runstate.defs.wal.resources import WalResource
from runstate.wal.dataset_tables import BlobLocation


def copy_on_write_max_bytes(wal: WalResource) -> int:
    """The merges' copy-on-write limit (RUNSTATE_COPY_ON_WRITE_MAX_MB), in bytes."""
    return wal.dataset_table_copy_on_write_max_mb << 20


def blob_location(wal: WalResource) -> BlobLocation:
    """Shipped to every Spark task; credentials only when configured (else the executors' own chain)."""
    config = wal.config()
    return BlobLocation(
        bucket=config.bucket,
        prefix=config.prefix,
        endpoint_url=config.endpoint_url,
        region=config.region,
        access_key_id=config.aws_access_key_id or None,
        secret_access_key=config.aws_secret_access_key or None,
    )
