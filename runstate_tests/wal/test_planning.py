"""The one flush planner and the one merge planner, which the sensors and the commands both call."""

from __future__ import annotations

import pytest

from runstate.wal import Change, WalInputError, WalProducer, flush_dataset, read_stream
from runstate.wal.planning import flushed_version, plan_flush, plan_merges
from runstate.wal.shards import shard_of


def _append(wal, dataset_id: str, count: int) -> None:
    producer = WalProducer(wal.dynamodb, wal.table)
    for i in range(count):
        producer.append(dataset_id, [Change.upsert(i, i)])


def test_a_plan_groups_the_pending_rows_into_batches_and_the_batches_into_shards(wal):
    _append(wal, "orders", 5)
    _append(wal, "users", 2)

    plan = plan_flush(wal.wal_table(), max_batch_size=2, shards=4)

    assert [(b.dataset_id, b.seqs) for b in plan.batches] == [
        ("orders", (1, 2)),
        ("orders", (3, 4)),
        ("orders", (5,)),
        ("users", (1, 2)),
    ]
    assert {shard.shard: shard.datasets for shard in plan.shards} == (
        {shard_of("orders", 4): ["orders", "users"]}
        if shard_of("orders", 4) == shard_of("users", 4)
        else {shard_of("orders", 4): ["orders"], shard_of("users", 4): ["users"]}
    )
    assert plan.rows == 7 and plan.applied == {}


def test_a_plan_of_one_dataset_reads_its_rows_after_its_last_applied_seq(wal):
    _append(wal, "orders", 3)
    _append(wal, "users", 1)
    flush_dataset(*wal.owners(), "orders", [1, 2])

    plan = plan_flush(wal.wal_table(), max_batch_size=10, shards=2, dataset_id="orders")

    assert [(b.dataset_id, b.seqs) for b in plan.batches] == [("orders", (3,))]
    assert plan.applied == {"orders": 2}
    assert plan.shard(shard_of("orders", 2)).key == plan.shards[0].key


def test_a_plan_over_the_stream_drops_rows_applied_since_and_keeps_the_sweep(wal):
    _append(wal, "orders", 2)
    streamed, _ = read_stream(wal.streams, wal.wal_table(), None)
    flush_dataset(*wal.owners(), "orders", [1, 2])
    _append(wal, "users", 1)

    plan = plan_flush(wal.wal_table(), max_batch_size=10, shards=2, streamed=streamed)

    assert [(b.dataset_id, b.seqs) for b in plan.batches] == [("users", (1,))]
    assert plan.applied == {"orders": 2, "users": 0}


def test_the_sensor_and_a_command_plan_the_same_shard_key_for_the_same_rows(wal):
    _append(wal, "orders", 3)
    streamed, _ = read_stream(wal.streams, wal.wal_table(), None)

    sensor = plan_flush(wal.wal_table(), max_batch_size=10, shards=2, streamed=streamed)
    command = plan_flush(wal.wal_table(), max_batch_size=10, shards=2, dataset_id="orders")

    assert [shard.key for shard in sensor.shards] == [shard.key for shard in command.shards]


def test_a_bad_dataset_id_is_refused_before_the_table_is_read(wal):
    with pytest.raises(WalInputError):
        plan_flush(wal.wal_table(), max_batch_size=10, shards=2, dataset_id="bad id\n")


def test_merges_are_planned_for_moved_datasets_by_shard_leaving_held_shards_out():
    applied = {f"ds{i}": i + 1 for i in range(12)}
    requested = {"ds0": 1, "ds1": 1}  # ds0 is current; ds1 moved on
    held = {shard_of("ds2", 4)}

    due = plan_merges(applied, requested, 4, held=held)

    expected: dict[int, dict[str, int]] = {}
    for dataset_id, version in applied.items():
        if dataset_id != "ds0" and shard_of(dataset_id, 4) not in held:
            expected.setdefault(shard_of(dataset_id, 4), {})[dataset_id] = version
    assert due == expected and list(due) == sorted(due)


def test_a_dataset_behind_its_last_requested_merge_is_due_again():
    assert plan_merges({"orders": 2}, {"orders": 5}, 4) == {shard_of("orders", 4): {"orders": 2}}


def test_a_merge_by_name_needs_rows_and_a_flush(wal):
    table = wal.wal_table()
    with pytest.raises(WalInputError, match="unknown"):
        flushed_version(table, "orders")
    _append(wal, "orders", 2)
    with pytest.raises(WalInputError, match="nothing flushed yet"):
        flushed_version(table, "orders")
    flush_dataset(*wal.owners(), "orders", [1, 2])

    assert flushed_version(table, "orders") == 2
