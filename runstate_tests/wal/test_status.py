"""wal_status and oldest_pending_age_s."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from runstate.wal import Change, DatasetStatus, WalProducer, flush_dataset, oldest_pending_age_s, wal_status

NOW = datetime(2026, 11, 26, 1, 0, tzinfo=UTC)


def test_status_shows_pending_count_oldest_age_and_last_applied_per_dataset(wal):
    producer = WalProducer(wal.dynamodb, wal.table)
    for minutes in (90, 30, 10):
        producer.append("orders", [Change.upsert("k", minutes)], now=NOW - timedelta(minutes=minutes))
    producer.append("users", [Change.upsert("u", 1)], now=NOW - timedelta(minutes=5))
    flush_dataset(*wal.owners(), "orders", [1])

    status = wal_status(wal.wal_table(), now=NOW)

    assert status == [
        DatasetStatus("orders", pending_count=2, oldest_pending_age_s=1800.0, last_applied_seq=1, last_seq=3),
        DatasetStatus("users", pending_count=1, oldest_pending_age_s=300.0, last_applied_seq=0, last_seq=1),
    ]


def test_oldest_pending_age_is_over_all_datasets_and_none_when_drained(wal):
    producer = WalProducer(wal.dynamodb, wal.table)
    producer.append("a", [Change.upsert("k", 1)], now=NOW - timedelta(hours=2))
    producer.append("b", [Change.upsert("k", 1)], now=NOW - timedelta(minutes=1))

    assert oldest_pending_age_s(wal.wal_table(), now=NOW) == 7200.0
    for dataset_id in ("a", "b"):
        flush_dataset(*wal.owners(), dataset_id, [1])
    assert oldest_pending_age_s(wal.wal_table(), now=NOW) is None


def test_status_of_an_empty_table_is_empty(wal):
    assert wal_status(wal.wal_table()) == []
