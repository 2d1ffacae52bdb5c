"""Compaction and the snapshot rebuild: same reader state, in-flight readers unharmed, safe trimming."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from runstate.wal import (
    BlobIntegrityError,
    Change,
    DatasetReader,
    WalProducer,
    compact,
    flush_dataset,
    rebuild_snapshot,
)
from runstate.wal.changes import fold

from .helpers import object_keys, statuses

NOW = datetime(2026, 11, 26, 1, 0, tzinfo=UTC)


def _history(wal, dataset_id: str, flushes: int, per_flush: int = 3, created=NOW) -> list[Change]:
    producer = WalProducer(wal.dynamodb, wal.table)
    every: list[Change] = []
    for f in range(flushes):
        seqs = []
        for i in range(per_flush):
            n = f * per_flush + i
            changes = [Change.upsert(f"k{n % 5}", n)] if n % 4 else [Change.delete(f"k{(n + 2) % 5}")]
            seqs.append(producer.append(dataset_id, changes, now=created))
            every.extend(changes)
        flush_dataset(*wal.owners(), dataset_id, seqs, now=created)
    return every


def _compact(wal, dataset_id="orders", now=NOW, **kwargs):
    kwargs.setdefault("retention_days", 7)
    return compact(*wal.owners(), dataset_id, now=now, **kwargs)


def test_compaction_keeps_the_reader_state_identical(wal):
    changes = _history(wal, "orders", flushes=4)
    reader = DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders")
    before = reader.read()

    result = _compact(wal)

    assert before == (12, fold({}, changes))
    assert reader.read() == before
    manifest = reader.manifest()
    assert manifest.deltas == () and manifest.snapshot.key == result.snapshot_key
    assert (result.version, result.deltas_folded) == (12, 4)


def test_flushes_after_a_compaction_build_on_the_snapshot(wal):
    changes = _history(wal, "orders", flushes=2)
    _compact(wal)
    changes += _history_more(wal, "orders")

    assert DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders").read() == (8, fold({}, changes))


def _history_more(wal, dataset_id):
    producer = WalProducer(wal.dynamodb, wal.table)
    changes = [Change.upsert("k0", "after"), Change.delete("k1")]
    seqs = [producer.append(dataset_id, [change]) for change in changes]
    flush_dataset(*wal.owners(), dataset_id, seqs)
    return changes


def test_a_reader_holding_the_old_manifest_still_reads_after_the_switch(wal):
    changes = _history(wal, "orders", flushes=3)
    reader = DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders")
    held = reader.manifest()  # a reader mid-read: it has the manifest, not yet the blobs

    _compact(wal)
    _compact(wal, now=NOW + timedelta(minutes=10))  # a second run within the grace period

    assert reader.state_at(held) == fold({}, changes)


def test_old_blobs_are_archived_only_after_the_grace_period(wal):
    _history(wal, "orders", flushes=2)
    reader = DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders")
    held = reader.manifest()
    old_keys = [ref.key for ref in held.deltas]

    first = _compact(wal)
    later = _compact(wal, now=NOW + timedelta(hours=2))

    assert first.blobs_archived == 0 and later.blobs_archived == 2
    keys = object_keys(wal.s3, wal.bucket)
    assert not set(old_keys) & set(keys)
    assert {key.replace("orders/", "orders/archive/") for key in old_keys} <= set(keys)
    assert reader.manifest().retired == ()
    # A read slower than the grace period fails loudly, naming the blob; never a stale state.
    with pytest.raises(BlobIntegrityError, match="is missing"):
        reader.state_at(held)


def test_trimming_removes_only_old_applied_rows_covered_by_the_snapshot(wal):
    old = NOW - timedelta(days=30)
    _history(wal, "orders", flushes=2, created=old)
    WalProducer(wal.dynamodb, wal.table).append("orders", [Change.upsert("p", 1)], now=old)

    result = _compact(wal, retention_days=7)

    # 1..6 are old, applied and in the snapshot; 7 is Pending and is kept.
    assert result.rows_trimmed == 6
    assert statuses(wal.dynamodb, wal.table, "orders") == {7: "Pending"}


def test_seqs_continue_after_every_row_is_trimmed(wal):
    old = NOW - timedelta(days=30)
    _history(wal, "orders", flushes=1, created=old)

    result = _compact(wal, retention_days=7)
    seq = WalProducer(wal.dynamodb, wal.table).append("orders", [Change.upsert("new", 1)])

    assert result.rows_trimmed == 3
    assert statuses(wal.dynamodb, wal.table, "orders") == {4: "Pending"}
    assert seq == 4


def test_rebuild_from_the_wal_repairs_a_corrupt_delta(wal):
    changes = _history(wal, "orders", flushes=3)
    reader = DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders")
    wal.s3.put_object(Bucket=wal.bucket, Key=reader.manifest().deltas[1].key, Body=b"garbage")
    with pytest.raises(BlobIntegrityError):
        reader.state()

    result = rebuild_snapshot(*wal.owners(), "orders", now=NOW)

    assert (result.version, result.deltas_folded) == (9, 3)
    assert reader.read() == (9, fold({}, changes))


def test_rebuild_after_trimming_starts_from_the_snapshot(wal):
    old = NOW - timedelta(days=30)
    changes = _history(wal, "orders", flushes=2, created=old)
    _compact(wal, retention_days=7)
    changes += _history_more(wal, "orders")

    rebuild_snapshot(*wal.owners(), "orders", now=NOW)

    assert DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders").read() == (8, fold({}, changes))


def test_compacting_an_empty_dataset_does_nothing(wal):
    result = _compact(wal, dataset_id="nothing")

    assert (result.version, result.snapshot_key, result.rows_trimmed) == (0, None, 0)
    assert object_keys(wal.s3, wal.bucket) == []


def test_negative_retention_is_refused(wal):
    with pytest.raises(ValueError, match="retention_days"):
        _compact(wal, retention_days=-1)
