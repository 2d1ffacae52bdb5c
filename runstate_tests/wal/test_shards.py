"""Flush shards: a stable dataset -> shard map, one plan per shard, and a shard flush in which one failing
dataset stops neither the others nor the flush."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from runstate.wal import Batch, Change, DatasetReader, WalInputError, WalProducer
from runstate.wal.changes import fold
from runstate.wal.shards import flush_shard, plan_shards, shard_of

from .faults import Faults
from .helpers import statuses


def test_a_dataset_maps_to_the_same_shard_in_every_process():
    here = [shard_of(f"ds{i}", 8) for i in range(50)]
    code = "from runstate.wal.shards import shard_of; print([shard_of(f'ds{i}', 8) for i in range(50)])"
    # Another interpreter with another hash seed: Python's hash() would differ, sha256 does not.
    other = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
    )

    assert str(here) == other.stdout.strip()


def test_datasets_spread_over_every_shard():
    counts = Counter(shard_of(f"dataset-{i}", 4) for i in range(1000))

    assert sorted(counts) == [0, 1, 2, 3] and min(counts.values()) > 200


def test_zero_shards_is_refused():
    with pytest.raises(WalInputError, match="at least 1"):
        shard_of("orders", 0)


def test_plan_shards_gives_one_plan_per_shard_with_work_and_a_stable_key():
    batches = [Batch(f"ds{i}", (1, 2)) for i in range(20)] + [Batch("ds0", (3,))]

    plans = plan_shards(batches, 3)

    assert [plan.shard for plan in plans] == sorted({shard_of(f"ds{i}", 3) for i in range(20)})
    assert sum(plan.rows for plan in plans) == 41
    assert all(shard_of(ds, 3) == plan.shard for plan in plans for ds in plan.datasets)
    assert [plan.key for plan in plans] == [plan.key for plan in plan_shards(list(reversed(batches)), 3)]
    [ds0_plan] = [plan for plan in plans if "ds0" in plan.datasets]
    assert [b.seqs for b in ds0_plan.batches if b.dataset_id == "ds0"] == [(1, 2), (3,)]  # seq order


def _append(wal, dataset_id: str, count: int) -> list[Change]:
    producer = WalProducer(wal.dynamodb, wal.table)
    changes = [Change.upsert(f"k{i}", {"ds": dataset_id, "i": i}) for i in range(count)]
    for change in changes:
        producer.append(dataset_id, [change])
    return changes


def test_a_shard_flush_applies_every_dataset_and_each_dataset_in_seq_order(wal):
    expected = {f"ds{i}": _append(wal, f"ds{i}", 7) for i in range(6)}
    batches = [Batch(ds, (1, 2, 3)) for ds in expected] + [Batch(ds, (4, 5, 6, 7)) for ds in expected]
    table, blobs = wal.owners()

    outcomes = flush_shard(table, blobs, batches, workers=3)

    assert [o.dataset_id for o in outcomes] == sorted(expected) and all(o.ok for o in outcomes)
    for outcome in outcomes:
        assert [(r.first_seq, r.last_seq) for r in outcome.results] == [(1, 3), (4, 7)]
        version, state = DatasetReader.of(blobs, outcome.dataset_id).read()
        assert (version, state) == (7, fold({}, expected[outcome.dataset_id]))


def test_one_dataset_failing_is_reported_and_the_others_are_flushed(wal):
    expected = {ds: _append(wal, ds, 3) for ds in ("good1", "bad", "good2")}
    s3 = wal.client("s3")
    # S3 refuses every delta of "bad" (a bad blob path, a throttled prefix...), nothing else.
    faults = Faults(s3, "PutObject", count=1000, when=lambda params: "/bad/" in params.get("Key", ""))
    table, blobs = wal.owners()
    blobs.client = s3

    outcomes = {
        o.dataset_id: o
        for o in flush_shard(
            table, blobs, [Batch(ds, (1, 2, 3)) for ds in expected], attempts=3, retry_delay_s=0.01
        )
    }

    assert not outcomes["bad"].ok and "injected" in outcomes["bad"].error and outcomes["bad"].attempts == 3
    assert faults.failed == 3
    assert set(statuses(wal.dynamodb, wal.table, "bad").values()) == {"Pending"}
    for ds in ("good1", "good2"):
        assert outcomes[ds].ok and outcomes[ds].applied == 3
        assert DatasetReader.of(blobs, ds).read() == (3, fold({}, expected[ds]))


def test_a_failed_batch_stops_the_later_batches_of_its_dataset(wal):
    _append(wal, "orders", 4)
    table, blobs = wal.owners()

    [outcome] = flush_shard(
        table,
        blobs,
        [Batch("orders", (1, 2)), Batch("orders", (9,)), Batch("orders", (10,))],
        retry_delay_s=0.01,
    )
    [again] = flush_shard(table, blobs, [Batch("orders", (3, 4))])

    assert not outcome.ok and "WAL row seq 5 is missing" in outcome.error
    assert [r.last_seq for r in outcome.results] == [2] and outcome.attempts == 1 + 3  # seq 10 never tried
    assert again.ok and DatasetReader.of(blobs, "orders").version == 4


def test_catch_up_takes_rows_appended_after_the_plan(wal):
    changes = _append(wal, "orders", 5)
    table, blobs = wal.owners()

    [outcome] = flush_shard(table, blobs, [Batch("orders", (1, 2))], catch_up_rows=2)

    assert outcome.ok and outcome.results[-1].last_seq == 4  # 2 planned + at most 2 more
    assert DatasetReader.of(blobs, "orders").read() == (4, fold({}, changes[:4]))


def test_a_bad_plan_is_reported_before_anything_is_read(wal):
    table, blobs = wal.owners()
    client = wal.client("dynamodb")
    table.client = client
    calls = Faults(client, "GetItem", count=0)

    outcomes = flush_shard(table, blobs, [Batch("../x", (1,)), Batch("orders", ())])

    assert [o.error for o in outcomes] == [
        "dataset id '../x' is invalid: it must match [A-Za-z0-9][A-Za-z0-9_.-]{0,62} "
        "(a letter or digit, then up to 62 letters, digits, '_', '.', '-')",
        "dataset 'orders': a flush needs at least one seq",
    ]
    assert calls.calls == 0
