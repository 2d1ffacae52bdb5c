"""flush_dataset: happy path, idempotency, deterministic blobs, the gap rule, and recovery from real faults."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from runstate.wal import (
    BlobStore,
    Change,
    DatasetReader,
    WalIntegrityError,
    WalProducer,
    WalTable,
    flush_dataset,
    sweep_pending,
)
from runstate.wal.blobs import delta_key
from runstate.wal.changes import fold
from runstate.wal.codec import decode_delta, encode_delta
from runstate.wal.source import last_applied_seqs

from .faults import FAULT_ERRORS, Faults
from .helpers import object_keys, statuses, wal_rows

NOW = datetime(2026, 11, 26, 1, 0, tzinfo=UTC)


def _append(wal, dataset_id: str, count: int, start: int = 0) -> list[Change]:
    producer = WalProducer(wal.dynamodb, wal.table)
    changes = []
    for i in range(start, start + count):
        change = [Change.upsert(f"k{i % 4}", {"i": i})] if i % 3 else [Change.delete(f"k{(i + 1) % 4}")]
        producer.append(dataset_id, change)
        changes.extend(change)
    return changes


def _flush(wal, dataset_id: str, seqs, dynamodb=None, s3=None, **kwargs):
    return flush_dataset(
        WalTable(dynamodb or wal.dynamodb, wal.table),
        BlobStore(s3 or wal.s3, wal.bucket, wal.prefix),
        dataset_id,
        seqs,
        now=NOW,
        **kwargs,
    )


def test_three_appends_give_one_blob_with_three_rows_and_three_applied(wal):
    changes = _append(wal, "orders", 3)

    result = _flush(wal, "orders", [1, 2, 3])

    assert (result.rows, result.applied, result.skipped) == (3, 3, 0)
    assert (result.first_seq, result.last_seq) == (1, 3)
    assert result.blob_key == delta_key(wal.prefix, "orders", 1, 3)
    blob = wal.s3.get_object(Bucket=wal.bucket, Key=result.blob_key)["Body"].read()
    assert result.blob_bytes == len(blob)
    assert sorted({seq for seq, _ in decode_delta(blob)}) == [1, 2, 3]
    assert set(statuses(wal.dynamodb, wal.table, "orders").values()) == {"Applied#2026-11"}
    assert all(r["BlobKey"]["S"] == result.blob_key for r in wal_rows(wal.dynamodb, wal.table, "orders"))
    assert last_applied_seqs(wal.wal_table()) == {"orders": 3}
    assert DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders").read() == (3, fold({}, changes))


def test_the_put_uses_a_sha256_checksum(wal):
    _append(wal, "orders", 1)

    result = _flush(wal, "orders", [1])

    head = wal.s3.head_object(Bucket=wal.bucket, Key=result.blob_key, ChecksumMode="ENABLED")
    assert head.get("ChecksumSHA256")


def test_a_second_flush_of_the_same_batch_changes_nothing(wal):
    _append(wal, "orders", 3)
    _flush(wal, "orders", [1, 2, 3])
    objects = object_keys(wal.s3, wal.bucket)
    manifest = DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders").manifest()

    again = _flush(wal, "orders", [1, 2, 3])

    assert (again.rows, again.applied, again.skipped, again.blob_key) == (0, 0, 3, None)
    assert object_keys(wal.s3, wal.bucket) == objects
    assert DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders").manifest() == manifest


def test_delta_encoding_is_deterministic():
    rows = [(2, [Change.delete("a")]), (1, [Change.upsert("a", {"x": [1, 2]}), Change.upsert(7, None)])]

    first, count = encode_delta(rows)
    second, _ = encode_delta(list(reversed(rows)))

    assert first == second and count == 3
    assert [(seq, c.op, c.key) for seq, c in decode_delta(first)] == [
        (1, "upsert", "a"),
        (1, "upsert", 7),
        (2, "delete", "a"),
    ]


def test_a_late_batch_finds_its_rows_applied_by_the_later_one(wal):
    changes = _append(wal, "orders", 6)

    later = _flush(wal, "orders", [4, 5, 6])
    earlier = _flush(wal, "orders", [1, 2, 3])

    # The gap rule: the later batch applied 1..6 itself, so the reader never saw 4..6 without 1..3.
    assert (later.first_seq, later.last_seq, later.rows) == (1, 6, 6)
    assert (earlier.rows, earlier.skipped) == (0, 3)
    assert DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders").read() == (6, fold({}, changes))


def test_a_batch_missing_a_seq_still_applies_the_contiguous_range(wal):
    _append(wal, "orders", 4)

    result = _flush(wal, "orders", [1, 2, 4])

    assert (result.first_seq, result.last_seq, result.applied) == (1, 4, 4)


def test_put_failing_twice_then_succeeding_applies_everything_once(wal):
    changes = _append(wal, "orders", 5)
    s3 = wal.client("s3")
    fault = Faults(s3, "PutObject", count=2)

    for _ in range(2):
        with pytest.raises(FAULT_ERRORS, match="injected"):
            _flush(wal, "orders", [1, 2, 3, 4, 5], s3=s3)
        assert set(statuses(wal.dynamodb, wal.table, "orders").values()) == {"Pending"}
    result = _flush(wal, "orders", [1, 2, 3, 4, 5], s3=s3)

    assert fault.failed == 2
    assert (result.rows, result.applied) == (5, 5)
    assert set(statuses(wal.dynamodb, wal.table, "orders").values()) == {"Applied#2026-11"}
    assert DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders").read() == (5, fold({}, changes))


def test_failure_midway_through_the_applied_updates_is_repaired_by_a_rerun(wal):
    changes = _append(wal, "orders", 12)
    dynamodb = wal.client("dynamodb")
    is_row_mark = lambda params: params.get("Key", {}).get("SeqNo", {}).get("N") != "0"
    Faults(dynamodb, "UpdateItem", count=3, skip=5, when=is_row_mark)

    with pytest.raises(FAULT_ERRORS, match="injected"):
        _flush(wal, "orders", list(range(1, 13)), dynamodb=dynamodb, max_workers=1)
    half = statuses(wal.dynamodb, wal.table, "orders")
    # Committed to the manifest (readers see it), some rows still Pending, LastAppliedSeq not advanced.
    assert DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders").version == 12
    assert "Pending" in half.values() and "Applied#2026-11" in half.values()
    assert last_applied_seqs(wal.wal_table()) == {"orders": 0}

    pending = [key.seq_no for key in sweep_pending(wal.wal_table())]
    rerun = _flush(wal, "orders", pending)

    assert rerun.rows == 0 and rerun.applied == len(pending) == 12 - 5
    assert set(statuses(wal.dynamodb, wal.table, "orders").values()) == {"Applied#2026-11"}
    assert last_applied_seqs(wal.wal_table()) == {"orders": 12}
    assert DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders").read() == (12, fold({}, changes))


def test_failure_after_the_manifest_put_is_repaired_by_a_rerun(wal):
    changes = _append(wal, "orders", 3)
    s3 = wal.client("s3")
    is_manifest = lambda params: params.get("Key", "").endswith("manifest.json")
    Faults(s3, "PutObject", count=1, after=True, when=is_manifest)

    with pytest.raises(FAULT_ERRORS, match="injected"):
        _flush(wal, "orders", [1, 2, 3], s3=s3)
    rerun = _flush(wal, "orders", [1, 2, 3], s3=s3)

    assert (rerun.rows, rerun.applied) == (0, 3)
    assert DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders").read() == (3, fold({}, changes))


def test_a_tampered_row_is_named_and_nothing_is_written(wal):
    _append(wal, "orders", 3)
    wal.dynamodb.update_item(
        TableName=wal.table,
        Key={"DatasetId": {"S": "orders"}, "SeqNo": {"N": "2"}},
        UpdateExpression="SET Payload = :p",
        ExpressionAttributeValues={":p": {"S": '[["upsert","k1",666]]'}},
    )

    with pytest.raises(
        WalIntegrityError, match=r"dataset 'orders': WAL row seq 2 checksum mismatch \(expected"
    ):
        _flush(wal, "orders", [1, 2, 3])

    assert object_keys(wal.s3, wal.bucket) == []
    assert set(statuses(wal.dynamodb, wal.table, "orders").values()) == {"Pending"}


def test_seqs_beyond_the_log_are_refused_and_nothing_is_written(wal):
    _append(wal, "orders", 2)

    with pytest.raises(WalIntegrityError, match="dataset 'orders': WAL row seq 3 is missing"):
        _flush(wal, "orders", [3])

    assert object_keys(wal.s3, wal.bucket) == []


@pytest.mark.parametrize("seqs", [[], [0], [-1], ["1"], [True]])
def test_bad_seqs_are_refused(wal, seqs):
    with pytest.raises(ValueError, match="orders"):
        _flush(wal, "orders", seqs)


@pytest.mark.parametrize("small_range", [0, 1000], ids=["query", "batch-get"])
def test_both_read_paths_give_the_same_blob_and_catch_a_missing_seq(wal, monkeypatch, small_range):
    import runstate.wal.flush as flush_module

    monkeypatch.setattr(flush_module, "SMALL_RANGE", small_range)
    changes = _append(wal, "orders", 5)

    with pytest.raises(WalIntegrityError, match="seq 6 is missing"):
        _flush(wal, "orders", [6])
    result = _flush(wal, "orders", [5])

    assert result.blob_bytes == len(
        encode_delta((seq, [change]) for seq, change in enumerate(changes, start=1))[0]
    )
    assert DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders").read() == (5, fold({}, changes))
