"""Merging WAL datasets into their Iceberg tables on Spark, against moto's server and the `lake` catalog."""

from __future__ import annotations

import pytest

from runstate.wal import BlobIntegrityError, compact
from runstate.wal.changes import Change
from runstate.wal.dataset_tables import (
    MAINTENANCE_ENABLED_PROPERTY,
    VERSION_PROPERTY,
    VersionNotFound,
    merge_dataset,
    read_table,
    rebuild_dataset,
    table_ident,
)
from runstate.wal.dataset_tables.table import table_properties

pytestmark = pytest.mark.spark


def _seed(feed, dataset_id: str) -> int:
    feed.append(
        dataset_id, [Change.upsert("a", {"n": 1}), Change.upsert(7, [1, 2]), Change.upsert("b", None)]
    )
    feed.append(dataset_id, [Change.upsert("a", {"n": 2}), Change.delete("b"), Change.upsert("7", "seven")])
    return feed.flush(dataset_id)


def test_a_merge_brings_the_table_to_the_manifest_version(spark, feed, location, dataset_ids):
    dataset_id = dataset_ids("orders")
    version = _seed(feed, dataset_id)

    result = merge_dataset(spark, location, dataset_id)

    assert (result.from_version, result.version, result.blobs) == (0, version, 1)
    reader_version, reader_state = feed.reader(dataset_id).read()
    assert read_table(spark, dataset_id) == (reader_version, reader_state)
    assert reader_state == feed.fold(dataset_id, version) == {"a": {"n": 2}, 7: [1, 2], "7": "seven"}


def test_the_table_keeps_tombstones_and_the_live_rows_are_where_not_deleted(
    spark, feed, location, dataset_ids
):
    dataset_id = dataset_ids()
    version = _seed(feed, dataset_id)

    merge_dataset(spark, location, dataset_id)

    rows = {r.key: (r.value, r.wal_seq, r.deleted) for r in spark.table(table_ident(dataset_id)).collect()}
    assert rows['"b"'] == (None, 2, True)
    assert rows["#version"] == (None, version, True)
    live = spark.sql(f"SELECT key FROM {table_ident(dataset_id)} WHERE NOT deleted").collect()
    assert sorted(r.key for r in live) == ['"7"', '"a"', "7"]


def test_a_repeated_merge_writes_nothing(spark, feed, location, dataset_ids):
    dataset_id = dataset_ids()
    _seed(feed, dataset_id)
    merge_dataset(spark, location, dataset_id)
    snapshots = spark.sql(f"SELECT count(*) AS n FROM {table_ident(dataset_id)}.snapshots").first().n

    again = merge_dataset(spark, location, dataset_id)

    assert not again.merged and again.blobs == 0
    assert spark.sql(f"SELECT count(*) AS n FROM {table_ident(dataset_id)}.snapshots").first().n == snapshots


def test_later_merges_read_only_the_new_deltas_in_one_merge(spark, feed, location, dataset_ids):
    dataset_id = dataset_ids()
    first = _seed(feed, dataset_id)
    created = merge_dataset(spark, location, dataset_id)
    for n in range(3):  # three flushes: three deltas for the next merge
        feed.append(dataset_id, [Change.upsert(f"k{n}", n), Change.delete("a")])
        feed.flush(dataset_id)

    result = merge_dataset(spark, location, dataset_id)

    assert (result.from_version, result.blobs, result.full) == (first, 3, False)
    assert read_table(spark, dataset_id) == feed.reader(dataset_id).read()
    # The files each merge reports (what apply_deletes_sensor reads) are the table's, after its commit.
    ident = table_ident(dataset_id)
    counted = spark.sql(
        f"SELECT count_if(content = 0) AS data, count_if(content <> 0) AS deletes FROM {ident}.files"
    ).first()
    assert created.files.delete_files == 0 and result.files.delete_files >= 1  # a MERGE on read
    assert (result.files.data_files, result.files.delete_files) == (counted.data, counted.deletes)


def test_deltas_folded_by_compaction_are_read_from_the_snapshot(spark, wal, feed, location, dataset_ids):
    dataset_id = dataset_ids()
    _seed(feed, dataset_id)
    merge_dataset(spark, location, dataset_id)
    feed.append(dataset_id, [Change.delete(7), Change.upsert("c", 3)])
    feed.flush(dataset_id)
    compact(*wal.owners(), dataset_id, retention_days=30)

    result = merge_dataset(spark, location, dataset_id)

    assert result.full
    assert read_table(spark, dataset_id) == feed.reader(dataset_id).read()


def test_a_rebuild_repairs_a_table_that_drifted(spark, feed, location, dataset_ids):
    dataset_id = dataset_ids()
    _seed(feed, dataset_id)
    merge_dataset(spark, location, dataset_id)
    spark.sql(f"UPDATE {table_ident(dataset_id)} SET value = '\"wrong\"' WHERE key = '\"a\"'")
    spark.sql(
        f"INSERT INTO {table_ident(dataset_id)} VALUES ('\"stray\"', '1', 1, current_timestamp(), false)"
    )

    result = rebuild_dataset(spark, location, dataset_id)

    assert result.full
    assert read_table(spark, dataset_id) == feed.reader(dataset_id).read()


def test_a_blob_failing_its_checksum_fails_the_merge_naming_it_and_writes_nothing(
    spark, wal, feed, location, dataset_ids
):
    dataset_id = dataset_ids()
    _seed(feed, dataset_id)
    merge_dataset(spark, location, dataset_id)
    feed.append(dataset_id, [Change.upsert("z", 26)])
    feed.flush(dataset_id)
    delta = feed.reader(dataset_id).manifest().deltas[-1].key
    wal.s3.put_object(Bucket=wal.bucket, Key=delta, Body=b"not the bytes the manifest recorded")
    before = spark.sql(f"SELECT snapshot_id FROM {table_ident(dataset_id)}.snapshots").collect()

    with pytest.raises(BlobIntegrityError, match=f"blob {delta} checksum mismatch"):
        merge_dataset(spark, location, dataset_id)

    assert spark.sql(f"SELECT snapshot_id FROM {table_ident(dataset_id)}.snapshots").collect() == before
    assert "z" not in read_table(spark, dataset_id)[1]


def test_the_table_opts_in_to_maintenance_and_records_its_version(spark, feed, location, dataset_ids):
    dataset_id = dataset_ids()
    version = _seed(feed, dataset_id)

    merge_dataset(spark, location, dataset_id)

    properties = table_properties(spark, table_ident(dataset_id))
    assert properties[MAINTENANCE_ENABLED_PROPERTY] == "true"
    assert properties[VERSION_PROPERTY] == str(version)


def test_an_earlier_version_is_read_by_time_travel(spark, feed, location, dataset_ids):
    dataset_id = dataset_ids()
    first = _seed(feed, dataset_id)
    merge_dataset(spark, location, dataset_id)
    expected = feed.fold(dataset_id, first)
    feed.append(dataset_id, [Change.delete("a"), Change.upsert("new", 1)])
    second = feed.flush(dataset_id)
    merge_dataset(spark, location, dataset_id)

    assert read_table(spark, dataset_id, version=first) == (first, expected)
    assert read_table(spark, dataset_id, version=second) == feed.reader(dataset_id).read()
    with pytest.raises(VersionNotFound, match=f"nearest merged versions: {second} below, none above"):
        read_table(spark, dataset_id, version=second + 5)
