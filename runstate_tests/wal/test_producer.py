"""WalProducer: validation (nothing written), gapless seqs, client-token dedupe, concurrent writers."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from runstate.wal import Change, WalInputError, WalProducer
from runstate.wal.producer import MAX_PAYLOAD_BYTES

from .faults import FAULT_ERRORS, Faults
from .helpers import item_count, wal_rows


@pytest.mark.parametrize(
    "dataset_id",
    ["", "-orders", "orders/x", "orders x", "o;drop", "#token#x", "a" * 64, "ünï", None, 7],
)
def test_bad_dataset_id_is_refused_and_nothing_written(wal, dataset_id):
    producer = WalProducer(wal.dynamodb, wal.table)

    with pytest.raises(WalInputError, match="dataset id"):
        producer.append(dataset_id, [Change.upsert("k", 1)])

    assert item_count(wal.dynamodb, wal.table) == 0


@pytest.mark.parametrize("key", [True, 1.5, None, b"k", ("a",), "", "k" * 1025, 2**63])
def test_bad_key_types_are_refused(key):
    with pytest.raises(WalInputError, match="key"):
        Change.upsert(key, 1)
    with pytest.raises(WalInputError, match="key"):
        Change.delete(key)


def test_unserialisable_value_is_refused():
    with pytest.raises(WalInputError, match="not JSON-serialisable"):
        Change.upsert("k", {1, 2})
    with pytest.raises(WalInputError, match="not JSON-serialisable"):
        Change.upsert("k", float("nan"))


@pytest.mark.parametrize(
    "changes, message",
    [
        ([], "non-empty list"),
        ("upsert", "non-empty list"),
        ([("upsert", "k", 1)], "not a Change"),
        ([Change("merge", "k", 1)], "unknown op"),
        ([Change("upsert", True, 1)], "key"),
    ],
)
def test_bad_changes_are_refused_and_nothing_written(wal, changes, message):
    with pytest.raises(WalInputError, match=message):
        WalProducer(wal.dynamodb, wal.table).append("orders", changes)

    assert item_count(wal.dynamodb, wal.table) == 0


def test_oversized_payload_is_refused_with_its_size_and_nothing_written(wal):
    big = "x" * MAX_PAYLOAD_BYTES

    with pytest.raises(WalInputError, match=r"dataset 'orders': payload of \d+ bytes exceeds"):
        WalProducer(wal.dynamodb, wal.table).append("orders", [Change.upsert("k", big)])

    assert item_count(wal.dynamodb, wal.table) == 0


def test_payload_just_under_the_limit_is_stored(wal):
    value = "x" * (MAX_PAYLOAD_BYTES - 40)

    seq = WalProducer(wal.dynamodb, wal.table).append("orders", [Change.upsert("k", value)])

    assert seq == 1


def test_bad_client_token_is_refused(wal):
    with pytest.raises(WalInputError, match="client token"):
        WalProducer(wal.dynamodb, wal.table).append("orders", [Change.upsert("k", 1)], client_token="a b")
    assert item_count(wal.dynamodb, wal.table) == 0


def test_seqs_are_gapless_per_dataset_and_rows_carry_the_payload_fields(wal):
    producer = WalProducer(wal.dynamodb, wal.table)

    seqs = [producer.append("orders", [Change.upsert(i, {"n": i})]) for i in range(3)]
    other = producer.append("users", [Change.delete("u1")])

    assert seqs == [1, 2, 3] and other == 1
    row = wal_rows(wal.dynamodb, wal.table, "orders")[0]
    assert row["StatusIdx"]["S"] == "Pending"
    assert row["Type"]["S"] == "DELTA"
    assert len(row["Checksum"]["S"]) == 64
    assert int(row["CreatedAt"]["N"]) > 0
    assert row["Payload"]["S"] == '[["upsert",0,{"n":0}]]'


def test_same_client_token_twice_writes_one_row(wal):
    producer = WalProducer(wal.dynamodb, wal.table)
    changes = [Change.upsert("k", 1)]

    first = producer.append("orders", changes, client_token="req-1")
    second = producer.append("orders", changes, client_token="req-1")

    assert first == second == 1
    assert len(wal_rows(wal.dynamodb, wal.table, "orders")) == 1


def test_same_client_token_with_other_changes_is_refused(wal):
    producer = WalProducer(wal.dynamodb, wal.table)
    producer.append("orders", [Change.upsert("k", 1)], client_token="req-1")

    with pytest.raises(WalInputError, match="already used for different changes"):
        producer.append("orders", [Change.upsert("k", 2)], client_token="req-1")

    assert len(wal_rows(wal.dynamodb, wal.table, "orders")) == 1


def test_retry_after_a_lost_response_writes_one_row(wal):
    """The row PutItem reaches the server but its response is lost: the retry must not write again."""
    client = wal.client("dynamodb")
    is_row = lambda params: not params.get("Item", {}).get("DatasetId", {}).get("S", "#").startswith("#")
    Faults(client, "PutItem", count=1, after=True, when=is_row)
    producer = WalProducer(client, wal.table)
    changes = [Change.upsert("k", 1)]

    with pytest.raises(FAULT_ERRORS, match="injected"):
        producer.append("orders", changes, client_token="req-1")
    seq = producer.append("orders", changes, client_token="req-1")

    assert seq == 1
    assert len(wal_rows(wal.dynamodb, wal.table, "orders")) == 1


def test_retry_after_a_failure_before_the_row_write_writes_one_row(wal):
    """The token is claimed, then the row put fails before reaching the server: the retry finishes it."""
    client = wal.client("dynamodb")
    is_row = lambda params: not params.get("Item", {}).get("DatasetId", {}).get("S", "#").startswith("#")
    Faults(client, "PutItem", count=1, when=is_row)
    producer = WalProducer(client, wal.table)
    WalProducer(wal.dynamodb, wal.table).append("orders", [Change.upsert("other", 0)])

    with pytest.raises(FAULT_ERRORS, match="injected"):
        producer.append("orders", [Change.upsert("k", 1)], client_token="req-1")
    WalProducer(wal.dynamodb, wal.table).append("orders", [Change.upsert("other", 2)])
    seq = producer.append("orders", [Change.upsert("k", 1)], client_token="req-1")

    assert seq == 3
    assert [r["Payload"]["S"] for r in wal_rows(wal.dynamodb, wal.table, "orders")][2] == '[["upsert","k",1]]'


def test_concurrent_appends_get_distinct_gapless_seqs(wal):
    per_thread, threads = 15, 6
    start = threading.Barrier(threads)

    def worker(n: int) -> list[int]:
        producer = WalProducer(wal.dynamodb, wal.table)
        start.wait()
        return [producer.append("orders", [Change.upsert(f"{n}-{i}", i)]) for i in range(per_thread)]

    with ThreadPoolExecutor(threads) as pool:
        seqs = [seq for result in pool.map(worker, range(threads)) for seq in result]

    assert sorted(seqs) == list(range(1, per_thread * threads + 1))
    assert len(wal_rows(wal.dynamodb, wal.table, "orders")) == per_thread * threads


def test_concurrent_retries_of_one_token_write_one_row(wal):
    threads = 6
    start = threading.Barrier(threads)

    def worker(_: int) -> int:
        producer = WalProducer(wal.dynamodb, wal.table)
        start.wait()
        return producer.append("orders", [Change.upsert("k", 1)], client_token="same")

    with ThreadPoolExecutor(threads) as pool:
        seqs = set(pool.map(worker, range(threads)))

    assert seqs == {1}
    assert len(wal_rows(wal.dynamodb, wal.table, "orders")) == 1


def test_a_writer_that_died_before_moving_the_seq_hint_leaves_no_gap_and_no_reuse(wal):
    """The row is written but the LastSeq hint update never happens (really failed on the client)."""
    client = wal.client("dynamodb")
    Faults(client, "UpdateItem", count=2)
    crippled = WalProducer(client, wal.table)

    first = crippled.append("orders", [Change.upsert("a", 1)])
    second = crippled.append("orders", [Change.upsert("b", 2)])
    third = WalProducer(wal.dynamodb, wal.table).append("orders", [Change.upsert("c", 3)])

    assert (first, second, third) == (1, 2, 3)
    assert [int(r["SeqNo"]["N"]) for r in wal_rows(wal.dynamodb, wal.table, "orders")] == [1, 2, 3]
