"""Stream tailing with a cursor, the Pending sweep, and batch planning."""

from __future__ import annotations

import json

import pytest

from runstate.wal import (
    Batch,
    Change,
    WalKey,
    WalProducer,
    flush_dataset,
    plan_batches,
    read_stream,
    sweep_pending,
)
from runstate.wal.source import last_applied_seqs


def _append(wal, dataset_id: str, count: int) -> None:
    producer = WalProducer(wal.dynamodb, wal.table)
    for i in range(count):
        producer.append(dataset_id, [Change.upsert(i, i)])


def test_stream_returns_new_pending_rows_and_the_cursor_resumes_after_them(wal):
    _append(wal, "orders", 3)

    keys, cursor = read_stream(wal.streams, wal.wal_table(), None)
    _append(wal, "users", 2)
    more, cursor2 = read_stream(wal.streams, wal.wal_table(), json.loads(json.dumps(cursor)))
    nothing, _ = read_stream(wal.streams, wal.wal_table(), cursor2)

    assert keys == [WalKey("orders", 1), WalKey("orders", 2), WalKey("orders", 3)]
    assert more == [WalKey("users", 1), WalKey("users", 2)]
    assert nothing == []


def test_stream_skips_meta_token_and_applied_records(wal):
    WalProducer(wal.dynamodb, wal.table).append("orders", [Change.upsert("k", 1)], client_token="t1")
    keys, cursor = read_stream(wal.streams, wal.wal_table(), None)
    flush_dataset(*wal.owners(), "orders", [1])

    after_flush, _ = read_stream(wal.streams, wal.wal_table(), cursor)

    assert keys == [WalKey("orders", 1)]
    assert after_flush == []


def test_stream_limit_is_respected_and_the_rest_comes_next_time(wal):
    _append(wal, "orders", 5)

    first, cursor = read_stream(wal.streams, wal.wal_table(), None, limit=2)
    rest, _ = read_stream(wal.streams, wal.wal_table(), cursor)

    assert len(first) <= 2
    assert sorted(set(first + rest)) == [WalKey("orders", i) for i in range(1, 6)]


def test_a_lost_or_foreign_cursor_restarts_from_trim_horizon(wal):
    _append(wal, "orders", 2)
    _, cursor = read_stream(wal.streams, wal.wal_table(), None)

    lost, _ = read_stream(wal.streams, wal.wal_table(), None)
    foreign, _ = read_stream(wal.streams, wal.wal_table(), {**cursor, "stream_arn": "arn:other"})

    assert lost == foreign == [WalKey("orders", 1), WalKey("orders", 2)]


def test_replayed_stream_keys_of_applied_rows_plan_no_batch(wal):
    _append(wal, "orders", 3)
    flush_dataset(*wal.owners(), "orders", [3])

    replayed, _ = read_stream(wal.streams, wal.wal_table(), None)
    batches = plan_batches(replayed, applied=last_applied_seqs(wal.wal_table()))

    assert len(replayed) == 3
    assert batches == []


def test_sweep_finds_pending_rows_oldest_first_and_not_applied_ones(wal):
    _append(wal, "orders", 3)
    _append(wal, "users", 1)
    flush_dataset(*wal.owners(), "users", [1])

    keys = sweep_pending(wal.wal_table())

    assert sorted(keys) == [WalKey("orders", 1), WalKey("orders", 2), WalKey("orders", 3)]
    assert len(sweep_pending(wal.wal_table(), limit=2)) == 2


def test_plan_dedupes_groups_by_dataset_and_orders_by_seq():
    keys = [WalKey("b", 2), WalKey("a", 3), WalKey("b", 1), WalKey("a", 1), WalKey("a", 3), WalKey("b", 2)]

    batches = plan_batches(keys)

    assert batches == [Batch("a", (1, 3)), Batch("b", (1, 2))]
    assert (batches[0].first_seq, batches[0].last_seq) == (1, 3)


def test_plan_splits_1200_rows_into_three_batches_of_at_most_500():
    keys = [WalKey("orders", seq) for seq in range(1200, 0, -1)]

    batches = plan_batches(keys, max_batch_size=500)

    assert [len(b.seqs) for b in batches] == [500, 500, 200]
    assert [(b.first_seq, b.last_seq) for b in batches] == [(1, 500), (501, 1000), (1001, 1200)]


def test_run_keys_are_deterministic_and_distinct():
    first = plan_batches([WalKey("orders", s) for s in range(1, 11)], max_batch_size=5)
    again = plan_batches([WalKey("orders", s) for s in reversed(range(1, 11))] * 2, max_batch_size=5)

    assert [b.run_key for b in first] == [b.run_key for b in again]
    assert len({b.run_key for b in first}) == 2
    assert first[0].run_key.startswith("wal-orders-1-5-")


def test_plan_refuses_a_non_positive_batch_size():
    with pytest.raises(ValueError, match="max_batch_size"):
        plan_batches([WalKey("a", 1)], max_batch_size=0)
