"""DatasetReader: consistent state, and a clear named error for any missing or corrupt blob."""

from __future__ import annotations

import pytest

from runstate.wal import BlobIntegrityError, Change, DatasetReader, WalProducer, flush_dataset
from runstate.wal.changes import fold


def _flushed(wal, dataset_id: str, batches: list[list[Change]]) -> list[Change]:
    producer = WalProducer(wal.dynamodb, wal.table)
    every = []
    for changes in batches:
        seq = producer.append(dataset_id, changes)
        flush_dataset(*wal.owners(), dataset_id, [seq])
        every.extend(changes)
    return every


def test_a_dataset_never_flushed_reads_empty_at_version_zero(wal):
    reader = DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders")

    assert reader.read() == (0, {})


def test_state_is_the_fold_of_every_delta_with_int_and_str_keys_distinct(wal):
    changes = _flushed(
        wal, "orders", [[Change.upsert(1, "int"), Change.upsert("1", "str")], [Change.delete(1)]]
    )

    version, state = DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders").read()

    assert (version, state) == (2, {"1": "str"}) == (2, fold({}, changes))


def test_rows_not_yet_flushed_are_not_visible(wal):
    _flushed(wal, "orders", [[Change.upsert("a", 1)]])
    WalProducer(wal.dynamodb, wal.table).append("orders", [Change.upsert("b", 2)])

    assert DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders").read() == (1, {"a": 1})


def test_a_corrupt_blob_raises_a_named_checksum_error(wal):
    _flushed(wal, "orders", [[Change.upsert("a", 1)], [Change.upsert("b", 2)]])
    reader = DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders")
    key = reader.manifest().deltas[1].key
    wal.s3.put_object(Bucket=wal.bucket, Key=key, Body=b"not the blob")

    with pytest.raises(BlobIntegrityError) as error:
        reader.state()

    assert str(error.value).startswith(f"dataset 'orders': blob {key} checksum mismatch (expected ")
    assert ", got " in str(error.value)


def test_a_missing_blob_raises_a_named_error(wal):
    _flushed(wal, "orders", [[Change.upsert("a", 1)]])
    reader = DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders")
    key = reader.manifest().deltas[0].key
    wal.s3.delete_object(Bucket=wal.bucket, Key=key)

    with pytest.raises(BlobIntegrityError, match=f"dataset 'orders': blob {key} is missing"):
        reader.state()


def test_a_corrupt_manifest_raises_a_named_error(wal):
    _flushed(wal, "orders", [[Change.upsert("a", 1)]])
    key = f"{wal.prefix}orders/manifest.json"
    wal.s3.put_object(Bucket=wal.bucket, Key=key, Body=b"{oops")

    with pytest.raises(BlobIntegrityError, match=f"dataset 'orders': manifest {key} is corrupt"):
        _ = DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders").version


def test_a_bad_dataset_id_is_refused(wal):
    with pytest.raises(ValueError, match="dataset id"):
        DatasetReader(wal.s3, wal.bucket, wal.prefix, "../etc")
