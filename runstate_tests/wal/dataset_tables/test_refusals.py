"""What a merge refuses, and how a rebuild recovers, on Spark: a table that belongs to another dataset,
a table ahead of its dataset's blobs (the WAL started over), a dataset without a manifest."""

from __future__ import annotations

import pytest

from runstate.wal import BlobIntegrityError
from runstate.wal.changes import Change
from runstate.wal.dataset_tables import (
    DATASET_PROPERTY,
    DatasetTableError,
    merge_dataset,
    read_table,
    rebuild_dataset,
    table_ident,
)
from runstate.wal.dataset_tables.table import table_exists

pytestmark = pytest.mark.spark


def _snapshot_ids(spark, dataset_id: str) -> list[int]:
    return [
        row.snapshot_id
        for row in spark.sql(f"SELECT snapshot_id FROM {table_ident(dataset_id)}.snapshots").collect()
    ]


def _start_over(wal, dataset_id: str) -> None:
    """What a moto restart does to a dataset: its WAL rows, meta row and blobs are gone."""
    from runstate.wal import layout as t

    items = wal.dynamodb.query(
        TableName=wal.table,
        KeyConditionExpression="#ds = :ds",
        ExpressionAttributeNames={"#ds": t.DATASET_ID},
        ExpressionAttributeValues={":ds": {"S": dataset_id}},
        ConsistentRead=True,
    )["Items"]
    for item in items:
        wal.dynamodb.delete_item(
            TableName=wal.table, Key={t.DATASET_ID: item[t.DATASET_ID], t.SEQ_NO: item[t.SEQ_NO]}
        )
    listed = wal.s3.list_objects_v2(Bucket=wal.bucket, Prefix=f"{wal.prefix}{dataset_id}/")
    for obj in listed.get("Contents", []):
        wal.s3.delete_object(Bucket=wal.bucket, Key=obj["Key"])


def test_a_merge_into_a_table_that_belongs_to_another_dataset_is_refused_and_writes_nothing(
    spark, feed, location, dataset_ids
):
    dataset_id = dataset_ids()
    feed.append(dataset_id, [Change.upsert("a", 1)])
    feed.flush(dataset_id)
    merge_dataset(spark, location, dataset_id)
    # Two ids whose names collide (a 32-bit hash can): the table records the id that created it.
    spark.sql(f"ALTER TABLE {table_ident(dataset_id)} SET TBLPROPERTIES ('{DATASET_PROPERTY}'='Other')")
    feed.append(dataset_id, [Change.upsert("b", 2)])
    feed.flush(dataset_id)
    before = _snapshot_ids(spark, dataset_id)

    with pytest.raises(DatasetTableError, match="belongs to dataset 'Other'"):
        merge_dataset(spark, location, dataset_id)
    with pytest.raises(DatasetTableError, match="belongs to dataset 'Other'"):
        read_table(spark, dataset_id)
    assert _snapshot_ids(spark, dataset_id) == before


def test_a_table_ahead_of_its_datasets_blobs_is_reported_not_merged(spark, wal, feed, location, dataset_ids):
    dataset_id = dataset_ids()
    for i in range(5):
        feed.append(dataset_id, [Change.upsert(f"old{i}", i)])
    feed.flush(dataset_id)
    merge_dataset(spark, location, dataset_id)
    _start_over(wal, dataset_id)
    feed.append(dataset_id, [Change.upsert("new", 1)])
    feed.flush(dataset_id)

    with pytest.raises(DatasetTableError, match=r"at version 5, ahead of .*\(version 1\).*--rebuild"):
        merge_dataset(spark, location, dataset_id)


def test_a_rebuild_after_the_wal_started_over_makes_the_table_equal_to_the_blobs(
    spark, wal, feed, location, dataset_ids
):
    dataset_id = dataset_ids()
    for i in range(9):
        feed.append(dataset_id, [Change.upsert(f"old{i}", i)])
    feed.append(dataset_id, [Change.delete("old0"), Change.upsert("kept", "old")])
    feed.append(dataset_id, [Change.delete("gone")])
    feed.flush(dataset_id)
    merge_dataset(spark, location, dataset_id)
    _start_over(wal, dataset_id)
    feed.append(dataset_id, [Change.upsert("kept", "new"), Change.upsert("b", 2)])
    feed.append(dataset_id, [Change.upsert("c", 3)])
    feed.flush(dataset_id)

    result = rebuild_dataset(spark, location, dataset_id)

    assert result.version == 2
    assert (
        read_table(spark, dataset_id)
        == feed.reader(dataset_id).read()
        == (2, {"kept": "new", "b": 2, "c": 3})
    )
    # A key deleted at seq 11 in the old WAL is a tombstone no newer than the rebuild: the new WAL's
    # seq 3 brings it back.
    feed.append(dataset_id, [Change.upsert("gone", "back"), Change.upsert("old0", 0)])
    feed.flush(dataset_id)
    merge_dataset(spark, location, dataset_id)
    assert read_table(spark, dataset_id) == feed.reader(dataset_id).read()
    assert read_table(spark, dataset_id)[1]["gone"] == "back"


def test_a_dataset_without_a_manifest_gets_no_table(spark, wal, location, dataset_ids):
    dataset_id = dataset_ids("nosuch")

    result = merge_dataset(spark, location, dataset_id)

    assert (result.version, result.merged) == (0, False)
    assert not table_exists(spark, dataset_id)


def test_a_table_whose_manifest_was_lost_is_reported_not_merged(spark, wal, feed, location, dataset_ids):
    dataset_id = dataset_ids()
    feed.append(dataset_id, [Change.upsert("a", 1)])
    feed.flush(dataset_id)
    merge_dataset(spark, location, dataset_id)
    wal.s3.delete_object(Bucket=wal.bucket, Key=f"{wal.prefix}{dataset_id}/manifest.json")

    with pytest.raises(DatasetTableError, match=r"at version 1, ahead of .*\(version 0\)"):
        merge_dataset(spark, location, dataset_id)


def test_a_rebuild_with_a_missing_blob_names_the_blob(spark, wal, feed, location, dataset_ids):
    dataset_id = dataset_ids()
    feed.append(dataset_id, [Change.upsert("a", 1)])
    feed.flush(dataset_id)
    delta = feed.reader(dataset_id).manifest().deltas[-1].key
    wal.s3.delete_object(Bucket=wal.bucket, Key=delta)

    with pytest.raises(BlobIntegrityError, match=f"blob {delta} is missing"):
        rebuild_dataset(spark, location, dataset_id)
