"""Crashes for real: a flush process SIGKILLed at chosen points, and writers racing on one dataset."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from runstate.wal import Change, DatasetReader, WalProducer, compact, flush_dataset
from runstate.wal.changes import fold
from runstate.wal.source import last_applied_seqs

from .helpers import object_keys, statuses

# Runs flush_dataset in a child process that SIGKILLs itself right after the N-th call of an operation
# reached the server: the process really dies mid-flush, with no cleanup of any kind.
KILLER = textwrap.dedent(
    """
    import os, signal, sys, boto3
    from runstate.wal import BlobStore, WalTable, flush_dataset
    endpoint, table, bucket, prefix, dataset, operation, nth, last = sys.argv[1:]
    service = "s3" if operation == "PutObject" else "dynamodb"
    clients = {s: boto3.client(s, endpoint_url=endpoint, region_name="us-east-1") for s in ("s3", "dynamodb")}
    calls = {"n": 0}
    def die(**_):
        calls["n"] += 1
        if calls["n"] == int(nth):
            os.kill(os.getpid(), signal.SIGKILL)
    clients[service].meta.events.register(f"after-call.{service}.{operation}", die)
    flush_dataset(WalTable(clients["dynamodb"], table), BlobStore(clients["s3"], bucket, prefix),
                  dataset, range(1, int(last) + 1), max_workers=1)
    """
)


def _append(wal, dataset_id: str, count: int) -> list[Change]:
    producer = WalProducer(wal.dynamodb, wal.table)
    changes = [Change.upsert(f"k{i % 3}", i) if i % 4 else Change.delete(f"k{i % 3}") for i in range(count)]
    for change in changes:
        producer.append(dataset_id, [change])
    return changes


@pytest.mark.parametrize(
    "operation, nth, committed",
    [
        ("PutObject", 1, False),  # after the delta put, before the manifest
        ("PutObject", 2, True),  # after the manifest put, before any Applied mark
        ("UpdateItem", 4, True),  # after 4 of 10 Applied marks
    ],
)
def test_a_flush_killed_midway_is_completed_by_the_next_one(wal, operation, nth, committed):
    changes = _append(wal, "orders", 10)

    child = subprocess.run(
        [
            sys.executable,
            "-c",
            KILLER,
            wal.endpoint,
            wal.table,
            wal.bucket,
            wal.prefix,
            "orders",
            operation,
            str(nth),
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert child.returncode == -signal.SIGKILL, child.stderr
    reader = DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders")
    assert reader.version == (10 if committed else 0)
    result = flush_dataset(*wal.owners(), "orders", range(1, 11))
    applied_by_child = nth if operation == "UpdateItem" else 0
    assert result.applied == 10 - applied_by_child
    assert all(
        status.startswith("Applied#") for status in statuses(wal.dynamodb, wal.table, "orders").values()
    )
    assert last_applied_seqs(wal.wal_table()) == {"orders": 10}
    assert reader.read() == (10, fold({}, changes))
    assert [k for k in object_keys(wal.s3, wal.bucket) if "/delta/" in k] == [
        f"{wal.prefix}orders/delta/{1:020d}-{10:020d}.parquet"
    ]


def test_concurrent_flushes_of_one_dataset_apply_each_row_once(wal):
    changes = _append(wal, "orders", 30)
    start = threading.Barrier(4)

    def flush(last: int):
        start.wait()
        return flush_dataset(*wal.owners(), "orders", range(1, last + 1))

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(flush, [10, 20, 25, 30]))

    assert sum(r.applied for r in results) == 30
    manifest = DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders").manifest()
    covered = [seq for ref in manifest.deltas for seq in range(ref.first_seq, ref.last_seq + 1)]
    assert covered == list(range(1, 31))
    assert DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders").read() == (30, fold({}, changes))


def test_compaction_racing_flushes_loses_nothing(wal):
    producer = WalProducer(wal.dynamodb, wal.table)
    changes: list[Change] = []
    stop = threading.Event()

    def compact_repeatedly() -> int:
        runs = 0
        while not stop.is_set():
            compact(*wal.owners(), "orders", retention_days=0)
            runs += 1
        return runs

    with ThreadPoolExecutor(1) as pool:
        compactions = pool.submit(compact_repeatedly)
        for i in range(15):
            change = Change.upsert(f"k{i % 4}", i)
            seq = producer.append("orders", [change])
            changes.append(change)
            flush_dataset(*wal.owners(), "orders", [seq])
        stop.set()
        assert compactions.result() > 0

    assert DatasetReader(wal.s3, wal.bucket, wal.prefix, "orders").read() == (15, fold({}, changes))
