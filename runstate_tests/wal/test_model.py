"""THE MODEL CHECK: a random workload with duplicate appends and injected faults, driven through
stream/sweep -> plan -> shard flushes (plus compactions and concurrent readers) until drained; then every
dataset's reader state must equal the plain fold of all its changes in SeqNo order.

Scale with RUNSTATE_WAL_MODEL_CHANGES (default 2000) and RUNSTATE_WAL_MODEL_SEED.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest

from runstate.wal import (
    BlobIntegrityError,
    BlobStore,
    Change,
    DatasetReader,
    WalProducer,
    WalTable,
    compact,
    plan_batches,
    read_stream,
    sweep_pending,
)
from runstate.wal.changes import fold
from runstate.wal.shards import flush_shard, plan_shards

from .faults import FAULT_ERRORS, Faults
from .helpers import wal_rows

CHANGES = int(os.environ.get("RUNSTATE_WAL_MODEL_CHANGES", "2000"))
SEED = int(os.environ.get("RUNSTATE_WAL_MODEL_SEED", "20261126"))
DATASETS = [f"ds{n:02d}" for n in range(20)]
APPEND_THREADS = 4
SHARDS = 3


def _random_value(rng: random.Random):
    return rng.choice(
        [
            rng.randint(-(10**12), 10**12),
            f"v{rng.random():.6f}",
            {"n": rng.randint(0, 9), "tags": [rng.choice("abc") for _ in range(rng.randint(0, 3))]},
            [rng.random(), None, True],
            None,
        ]
    )


def _workload(rng: random.Random) -> list[tuple[str, str, list[Change]]]:
    """(dataset, client token, changes) appends totalling CHANGES changes."""
    appends, total = [], 0
    while total < CHANGES:
        dataset_id = rng.choice(DATASETS)
        changes = []
        for _ in range(min(rng.randint(1, 12), CHANGES - total)):
            key = rng.choice([rng.randint(0, 30), f"k{rng.randint(0, 30)}"])
            changes.append(
                Change.delete(key) if rng.random() < 0.2 else Change.upsert(key, _random_value(rng))
            )
        appends.append((dataset_id, f"tok-{len(appends)}", changes))
        total += len(changes)
    return appends


class Model:
    """What was appended: seq -> changes per dataset, filled in as appends return."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_seq: dict[str, dict[int, list[Change]]] = defaultdict(dict)
        self.duplicates = 0

    def record(self, dataset_id: str, seq: int, changes: list[Change]) -> None:
        with self.lock:
            assert self.by_seq[dataset_id].setdefault(seq, changes) == changes, (
                f"{dataset_id} seq {seq} reused"
            )

    def fold_upto(self, dataset_id: str, version: int) -> dict:
        seqs = self.by_seq[dataset_id]
        return fold({}, (c for seq in sorted(seqs) if seq <= version for c in seqs[seq]))


@pytest.mark.slow
def test_random_workload_with_duplicates_and_faults_folds_to_the_same_state(wal):
    rng = random.Random(SEED)
    appends = _workload(rng)
    model = Model()
    appending_done = threading.Event()
    observations: list[tuple[str, int, dict]] = []
    started = time.monotonic()

    # Producer: lost responses and failed requests on a client of its own; the caller retries with its token.
    producer_client = wal.client("dynamodb")
    Faults(producer_client, "PutItem", rate=0.03, after=True, rng=random.Random(SEED + 1))
    Faults(producer_client, "PutItem", rate=0.02, rng=random.Random(SEED + 2))
    Faults(producer_client, "Query", rate=0.01, rng=random.Random(SEED + 3))
    producer = WalProducer(producer_client, wal.table)

    def append_all(part: list[tuple[str, str, list[Change]]]) -> None:
        local = random.Random(hash(part[0][1]) if part else 0)
        for dataset_id, token, changes in part:
            seq = _retry(lambda: producer.append(dataset_id, changes, client_token=token))
            model.record(dataset_id, seq, changes)
            if local.random() < 0.1:  # a duplicate signal: the same append retried later
                assert _retry(lambda: producer.append(dataset_id, changes, client_token=token)) == seq
                with model.lock:
                    model.duplicates += 1

    # Flusher (the sensor + flush runs) with faults on S3, DynamoDB and the stream.
    flush_ddb, flush_s3, streams = wal.client("dynamodb"), wal.client("s3"), wal.client("dynamodbstreams")
    flush_table, flush_blobs = WalTable(flush_ddb, wal.table), BlobStore(flush_s3, wal.bucket, wal.prefix)
    fault_rng = random.Random(SEED + 4)
    Faults(flush_s3, "PutObject", rate=0.05, rng=fault_rng)
    Faults(flush_s3, "PutObject", rate=0.03, after=True, rng=fault_rng)
    Faults(flush_s3, "GetObject", rate=0.02, rng=fault_rng)
    Faults(flush_ddb, "UpdateItem", rate=0.01, rng=fault_rng)
    Faults(flush_ddb, "UpdateItem", rate=0.01, after=True, rng=fault_rng)
    Faults(flush_ddb, "Query", rate=0.01, rng=fault_rng)
    Faults(streams, "GetRecords", rate=0.05, rng=fault_rng)
    stats = defaultdict(int)

    def flusher() -> None:
        cursor = None
        flush_rng = random.Random(SEED + 5)
        for round_no in range(10_000):
            drained_before = appending_done.is_set()
            try:
                stream_keys, new_cursor = read_stream(streams, flush_table, cursor)
                cursor = None if flush_rng.random() < 0.05 else new_cursor  # sometimes the cursor is lost
                keys = stream_keys + sweep_pending(flush_table)
            except FAULT_ERRORS:
                stats["tick_failures"] += 1
                continue
            batches = plan_batches(keys, max_batch_size=flush_rng.choice([5, 50, 500]))
            plans = plan_shards(batches, SHARDS)
            flush_rng.shuffle(plans)  # shard runs may execute in any order
            for plan in plans:  # one shard run: its datasets in parallel, one try each (faults stay faults)
                for outcome in flush_shard(flush_table, flush_blobs, plan.batches, workers=4, attempts=1):
                    stats["flushes" if outcome.ok else "flush_failures"] += 1
            if round_no % 3 != 2:  # two rounds in three: at 2,000 changes a run has only a handful
                dataset_id = flush_rng.choice(DATASETS)
                try:
                    compact(flush_table, flush_blobs, dataset_id, retention_days=0)
                    stats["compactions"] += 1
                except FAULT_ERRORS:
                    stats["compaction_failures"] += 1
            if drained_before and not keys and _all_visible(wal, model):
                return
            if not drained_before:
                time.sleep(
                    0.5
                )  # the flush timer while the producers write (not an assertion, nothing waits on it)
        raise AssertionError("the WAL did not drain")

    def reader_loop() -> None:
        read_rng = random.Random(SEED + 6)
        while not appending_done.is_set():
            dataset_id = read_rng.choice(DATASETS)
            observations.append(
                (dataset_id, *DatasetReader(wal.s3, wal.bucket, wal.prefix, dataset_id).read())
            )
            time.sleep(0.5)  # a consumer polling; each read fetches and verifies every blob of the dataset

    parts = [appends[i::APPEND_THREADS] for i in range(APPEND_THREADS)]
    with ThreadPoolExecutor(APPEND_THREADS + 2) as pool:
        flushing = pool.submit(flusher)
        reading = pool.submit(reader_loop)
        for future in [pool.submit(append_all, part) for part in parts]:
            future.result()
        appending_done.set()
        appended_after = time.monotonic() - started
        reading.result()
        flushing.result()

    # Every dataset: version = last seq, state = the fold of all its changes in seq order.
    for dataset_id in DATASETS:
        expected_version = max(model.by_seq[dataset_id], default=0)
        assert sorted(model.by_seq[dataset_id]) == list(range(1, expected_version + 1)), dataset_id
        reader = DatasetReader(wal.s3, wal.bucket, wal.prefix, dataset_id)
        assert reader.read() == (expected_version, model.fold_upto(dataset_id, expected_version)), dataset_id
        rows = wal_rows(wal.dynamodb, wal.table, dataset_id)
        assert all(r["StatusIdx"]["S"].startswith("Applied#") for r in rows), dataset_id
        tokens = [r["ClientToken"]["S"] for r in rows if "ClientToken" in r]
        assert len(tokens) == len(set(tokens)), f"{dataset_id}: a token was written twice"
    assert sum(len(seqs) for seqs in model.by_seq.values()) == len(appends)
    # What readers saw mid-run was always a consistent prefix.
    for dataset_id, version, state in observations:
        assert state == model.fold_upto(dataset_id, version), (dataset_id, version)
    # Faults really happened, and compaction then archiving keeps every state.
    assert stats["flush_failures"] > 0 and stats["flushes"] > 0
    later = datetime.now(UTC) + timedelta(hours=2)
    for dataset_id in DATASETS:
        compact(*wal.owners(), dataset_id, retention_days=0, now=later)
        expected_version = max(model.by_seq[dataset_id], default=0)
        assert DatasetReader(wal.s3, wal.bucket, wal.prefix, dataset_id).read() == (
            expected_version,
            model.fold_upto(dataset_id, expected_version),
        )
    elapsed = time.monotonic() - started
    print(
        f"model check: {CHANGES} changes, {len(appends)} appends, {model.duplicates} duplicate appends, "
        f"{len(observations)} mid-run reads, stats {dict(stats)}, appends done at {appended_after:.1f}s, "
        f"total {elapsed:.1f}s"
    )


def _retry(call):
    for _ in range(100):
        try:
            return call()
        except FAULT_ERRORS:
            continue
    raise AssertionError("an append kept failing")


def _all_visible(wal, model: Model) -> bool:
    try:
        with model.lock:
            targets = {ds: max(seqs, default=0) for ds, seqs in model.by_seq.items()}
        return all(
            DatasetReader(wal.s3, wal.bucket, wal.prefix, ds).version >= version
            for ds, version in targets.items()
        )
    except BlobIntegrityError:
        return False
