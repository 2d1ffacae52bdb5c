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
    # A small table is merged copy-on-write: the files it reports are the table's, and no delete file.
    assert (created.files.delete_files, result.files.delete_files) == (0, 0)
    assert _files(spark, dataset_id) == (result.files.data_files, 0, result.files.bytes)


def _files(spark, dataset_id: str) -> tuple[int, int, int]:
    """(data files, delete files, bytes of both) from the table's `.files`."""
    row = spark.sql(
        "SELECT count_if(content = 0) AS data, count_if(content <> 0) AS deletes, sum(file_size_in_bytes) AS b "
        f"FROM {table_ident(dataset_id)}.files"
    ).first()
    return row.data, row.deletes, row.b


def test_a_table_over_the_copy_on_write_limit_is_merged_on_read_until_it_is_small_again(
    spark, feed, location, dataset_ids
):
    dataset_id = dataset_ids()
    _seed(feed, dataset_id)
    ident = table_ident(dataset_id)
    created = merge_dataset(spark, location, dataset_id)
    limit = 1000  # bytes: the table's files are over it from the first merge on
    assert created.files.bytes > limit
    modes = []
    for n in range(2):
        feed.append(dataset_id, [Change.upsert("a", n), Change.upsert(f"new{n}", n)])
        feed.flush(dataset_id)
        result = merge_dataset(spark, location, dataset_id, copy_on_write_max_bytes=limit)
        modes.append(table_properties(spark, ident)["write.merge.mode"])

    assert table_properties(spark, ident)["write.update.mode"] == "merge-on-read"
    assert modes == ["merge-on-read", "merge-on-read"]  # the first merge's commit set the second's mode
    assert result.files.delete_files >= 1  # the second merge updated "a" on read: a delete file
    assert _files(spark, dataset_id) == (
        result.files.data_files,
        result.files.delete_files,
        result.files.bytes,
    )
    assert read_table(spark, dataset_id) == feed.reader(dataset_id).read()

    feed.append(dataset_id, [Change.upsert("a", "small again")])
    feed.flush(dataset_id)
    merge_dataset(spark, location, dataset_id, copy_on_write_max_bytes=1 << 20)
    assert table_properties(spark, ident)["write.merge.mode"] == "copy-on-write"


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
