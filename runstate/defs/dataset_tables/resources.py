"""Where a merge finds the blobs: the WAL resource's bucket, prefix and endpoint as a BlobLocation."""

from __future__ import annotations

from runstate.defs.wal.resources import WalResource, _plain
from runstate.wal.dataset_tables import BlobLocation


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
