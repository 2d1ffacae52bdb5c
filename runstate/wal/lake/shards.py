"""Which merge run a dataset belongs to: a stable hash of its id into a fixed number of shards."""

from __future__ import annotations

import hashlib

from runstate.wal.changes import validate_dataset_id


def merge_shard(dataset_id: str, shards: int) -> int:
    """The same shard for the same id on every machine and Python (unlike hash(), which is salted)."""
    if shards < 1:
        raise ValueError(f"the number of merge shards must be at least 1, got {shards}")
    digest = hashlib.sha256(validate_dataset_id(dataset_id).encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards
