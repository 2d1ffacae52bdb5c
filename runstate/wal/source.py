"""Where flush work comes from: the table's stream (tailed per shard), the Pending index sweep, and batching.

Gap rule (a consumer never sees a gap): SeqNos are gapless per dataset (the producer claims each slot
only once every lower one is taken), and a flush always applies the contiguous range from the dataset's
manifest version + 1 up to the batch's last seq, reading any lower pending rows itself. So a batch never
waits for another, a batch that runs late finds its rows already applied and is a no-op, and the
manifest only ever grows by contiguous ranges. `plan_batches` is a pure function; pass `applied=`
(from `last_applied_seqs`) to drop keys that are already applied (old stream records), so no run is
requested for them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from runstate.wal import layout as t
from runstate.wal.changes import DATASET_ID_PATTERN
from runstate.wal.table import WalTable

DEFAULT_MAX_BATCH_SIZE = 500
# DynamoDB Streams may answer empty pages before reaching the records of a shard: follow a few of them.
MAX_EMPTY_PAGES = 3
# Errors meaning "this shard position is gone": restart the shard at TRIM_HORIZON; the sweep covers the rest.
LOST_POSITION_ERRORS = ("TrimmedDataAccessException", "ExpiredIteratorException", "ResourceNotFoundException")


@dataclass(frozen=True, order=True)
class WalKey:
    """The primary key of one WAL row."""

    dataset_id: str
    seq_no: int


@dataclass(frozen=True)
class Batch:
    """A run's worth of one dataset's WAL rows, in SeqNo order."""

    dataset_id: str
    seqs: tuple[int, ...]

    @property
    def first_seq(self) -> int:
        return self.seqs[0]

    @property
    def last_seq(self) -> int:
        return self.seqs[-1]

    @property
    def run_key(self) -> str:
        """Deterministic: the same dataset and seq range always give the same key.

        A flush applies everything up to last_seq, so (dataset, first, last) identifies the work; a short
        digest of the exact seqs tells apart two plans of the same range that saw different rows.
        """
        digest = hashlib.sha256(",".join(map(str, self.seqs)).encode()).hexdigest()[:8]
        return f"wal-{self.dataset_id}-{self.first_seq}-{self.last_seq}-{digest}"


def plan_batches(
    keys: Iterable[WalKey],
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    applied: Mapping[str, int] | None = None,
) -> list[Batch]:
    """Dedupe by (dataset, SeqNo), drop seqs <= applied[dataset], group by dataset, sort, split at max size."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
    by_dataset: dict[str, set[int]] = {}
    for key in keys:
        if applied is not None and key.seq_no <= applied.get(key.dataset_id, 0):
            continue
        by_dataset.setdefault(key.dataset_id, set()).add(key.seq_no)
    batches = []
    for dataset_id in sorted(by_dataset):
        seqs = sorted(by_dataset[dataset_id])
        for start in range(0, len(seqs), max_batch_size):
            batches.append(Batch(dataset_id, tuple(seqs[start : start + max_batch_size])))
    return batches


def sweep_pending(table: WalTable, limit: int = 10_000) -> list[WalKey]:
    """Up to `limit` Pending rows, oldest first, from the Pending index (eventually consistent)."""
    return [WalKey(row.dataset_id, row.seq) for row in table.pending(limit)]


def last_applied_seqs(table: WalTable, dataset_ids: Iterable[str] | None = None) -> dict[str, int]:
    """LastAppliedSeq per dataset (from the meta rows); every dataset when `dataset_ids` is None."""
    wanted = None if dataset_ids is None else set(dataset_ids)
    metas = table.metas()
    return {ds: meta.last_applied_seq for ds, meta in metas.items() if wanted is None or ds in wanted}


def read_stream(
    streams_client: Any,
    table: WalTable,
    cursor: Mapping[str, Any] | None,
    limit: int = 10_000,
) -> tuple[list[WalKey], dict[str, Any]]:
    """New Pending WAL rows from the table's stream, and the new cursor (a JSON-able dict).

    The cursor is {"stream_arn": ..., "shards": {shard_id: last sequence number read | None},
    "done": [closed shards fully read]}. A new stream (table re-created), a new shard, a trimmed or
    expired position all restart at TRIM_HORIZON: reading a record twice is harmless (plan_batches
    dedupes, a flush of applied rows is a no-op) and rows older than the stream's retention are found
    by `sweep_pending`.
    """
    stream_arn = table.stream_arn()
    if not stream_arn:
        return [], {"stream_arn": None, "shards": {}, "done": []}
    if not cursor or cursor.get("stream_arn") != stream_arn:
        cursor = {"stream_arn": stream_arn, "shards": {}, "done": []}
    positions: dict[str, str | None] = dict(cursor.get("shards", {}))
    done: set[str] = set(cursor.get("done", []))
    shards = _list_shards(streams_client, stream_arn)
    live_ids = {shard["ShardId"] for shard in shards}
    keys: list[WalKey] = []
    # Parents before children, so a dataset's records come roughly in order (order is not required).
    for shard in _parents_first(shards):
        shard_id = shard["ShardId"]
        if shard_id in done or len(keys) >= limit:
            continue
        records, position, closed = _read_shard(
            streams_client, stream_arn, shard_id, positions.get(shard_id), limit - len(keys)
        )
        keys.extend(records)
        positions[shard_id] = position
        if closed:
            done.add(shard_id)
    # Forget shards the stream no longer lists (trimmed away after 24 h).
    new_cursor = {
        "stream_arn": stream_arn,
        "shards": {shard_id: pos for shard_id, pos in positions.items() if shard_id in live_ids},
        "done": sorted(done & live_ids),
    }
    return keys, new_cursor


def _list_shards(streams_client: Any, stream_arn: str) -> list[dict[str, Any]]:
    shards: list[dict[str, Any]] = []
    request: dict[str, Any] = {"StreamArn": stream_arn}
    while True:
        description = streams_client.describe_stream(**request)["StreamDescription"]
        shards.extend(description.get("Shards", []))
        last = description.get("LastEvaluatedShardId")
        if not last:
            return shards
        request["ExclusiveStartShardId"] = last


def _parents_first(shards: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ids = {shard["ShardId"] for shard in shards}

    def depth(shard: dict[str, Any]) -> int:
        level, parent = 0, shard.get("ParentShardId")
        by_id = {s["ShardId"]: s for s in shards}
        while parent in ids and level < len(shards):
            level, parent = level + 1, by_id[parent].get("ParentShardId")
        return level

    return sorted(shards, key=lambda shard: (depth(shard), shard["ShardId"]))


def _read_shard(
    streams_client: Any, stream_arn: str, shard_id: str, position: str | None, limit: int
) -> tuple[list[WalKey], str | None, bool]:
    """Read one shard from `position` until it is caught up or `limit` records; (keys, position, closed)."""
    iterator = _shard_iterator(streams_client, stream_arn, shard_id, position)
    keys: list[WalKey] = []
    read = empty_pages = 0
    while iterator and read < limit and empty_pages < MAX_EMPTY_PAGES:
        try:
            page = streams_client.get_records(ShardIterator=iterator, Limit=min(1000, limit - read))
        except ClientError as error:
            if error.response["Error"]["Code"] not in LOST_POSITION_ERRORS:
                raise
            # The position expired or was trimmed mid-read: next tick restarts the shard at TRIM_HORIZON.
            return keys, None, False
        records = page.get("Records", [])
        for record in records:
            position = record["dynamodb"]["SequenceNumber"]
            key = _pending_key(record)
            if key is not None:
                keys.append(key)
        read += len(records)
        iterator = page.get("NextShardIterator")
        empty_pages = 0 if records else empty_pages + 1
    return keys, position, iterator is None


def _shard_iterator(streams_client: Any, stream_arn: str, shard_id: str, position: str | None) -> str | None:
    args: dict[str, Any] = {"StreamArn": stream_arn, "ShardId": shard_id}
    if position:
        args.update(ShardIteratorType="AFTER_SEQUENCE_NUMBER", SequenceNumber=position)
    else:
        args.update(ShardIteratorType="TRIM_HORIZON")
    try:
        return streams_client.get_shard_iterator(**args)["ShardIterator"]
    except ClientError as error:
        if error.response["Error"]["Code"] not in LOST_POSITION_ERRORS or not position:
            raise
        args = {"StreamArn": stream_arn, "ShardId": shard_id, "ShardIteratorType": "TRIM_HORIZON"}
        return streams_client.get_shard_iterator(**args)["ShardIterator"]


def _pending_key(record: Mapping[str, Any]) -> WalKey | None:
    """Only inserts of Pending WAL rows are work; meta, token rows and Applied updates are not."""
    image = record.get("dynamodb", {}).get("NewImage")
    if not image or image.get(t.STATUS_IDX, {}).get("S") != t.PENDING:
        return None
    dataset_id = image[t.DATASET_ID]["S"]
    seq = int(image[t.SEQ_NO]["N"])
    if seq < 1 or not DATASET_ID_PATTERN.fullmatch(dataset_id):
        return None
    return WalKey(dataset_id, seq)


def _wal_key(item: Mapping[str, Any]) -> WalKey:
    return WalKey(item[t.DATASET_ID]["S"], int(item[t.SEQ_NO]["N"]))
