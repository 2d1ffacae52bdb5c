"""Dataset-table fixtures: the blob location of the test's WAL. The WAL, the feed and dataset ids of the
test's own (their tables dropped afterwards) are the root conftest's fixtures."""

from __future__ import annotations

import pytest

from runstate.wal.dataset_tables import BlobLocation


@pytest.fixture
def location(wal) -> BlobLocation:
    return BlobLocation(bucket=wal.bucket, prefix=wal.prefix, endpoint_url=wal.endpoint)
