"""Flush shards: a bounded number of flush runs, whatever the number of datasets.

Each dataset maps to one of S shards by a stable hash of its id, so it always lands in the same shard;
with one flush run per shard at a time, a dataset never has two flushes at once. A shard run flushes
every planned batch of its datasets: datasets in parallel on a bounded thread pool, each dataset's
batches in seq order. One dataset failing (a bad blob, a throttled write) is retried a few times and
then reported; it stops neither the other datasets nor the run, and its rows stay Pending, so the
next plan picks it up again.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from runstate.wal.blobs import BlobStore
from runstate.wal.changes import validate_dataset_id
from runstate.wal.clients import MAX_POOL_CONNECTIONS
from runstate.wal.errors import WalError, WalInputError
from runstate.wal.flush import FlushResult, flush_dataset, validate_seqs
from runstate.wal.source import Batch
from runstate.wal.table import WalTable

DEFAULT_DATASET_WORKERS = 8
DEFAULT_ATTEMPTS = 3
log = logging.getLogger(__name__)


def shard_of(dataset_id: str, shards: int) -> int:
    """The dataset's shard in 0..shards-1: stable across processes, hosts and Python versions (unlike
    hash(), which is salted). Flush shards and merge shards both use it."""
    if shards < 1:
        raise WalInputError(f"the number of shards must be at least 1, got {shards}")
    digest = hashlib.sha256(validate_dataset_id(dataset_id).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % shards


@dataclass(frozen=True)
class ShardPlan:
    """One shard's planned work: its datasets' batches, in (dataset, seq) order."""

    shard: int
    batches: tuple[Batch, ...]

    @property
    def datasets(self) -> list[str]:
        return sorted({batch.dataset_id for batch in self.batches})

    @property
    def rows(self) -> int:
        return sum(len(batch.seqs) for batch in self.batches)

    @property
    def key(self) -> str:
        """Deterministic: the same shard and batches always give the same key (a run's identity)."""
        joined = "|".join(batch.run_key for batch in self.batches)
        return f"wal-shard{self.shard}-{hashlib.sha256(joined.encode()).hexdigest()[:16]}"


def plan_shards(batches: Iterable[Batch], shards: int) -> list[ShardPlan]:
    """Group batches by their dataset's shard; shards without work are left out."""
    by_shard: dict[int, list[Batch]] = {}
    for batch in batches:
        by_shard.setdefault(shard_of(batch.dataset_id, shards), []).append(batch)
    return [
        ShardPlan(shard, tuple(sorted(found, key=lambda b: (b.dataset_id, b.first_seq))))
        for shard, found in sorted(by_shard.items())
    ]


@dataclass
class DatasetOutcome:
    """What a shard run did for one dataset: its flushes, or the error it gave up on."""

    dataset_id: str
    results: list[FlushResult] = field(default_factory=list)
    error: str | None = None
    attempts: int = 0
    seconds: float = 0.0

    @property
    def applied(self) -> int:
        return sum(result.applied for result in self.results)

    @property
    def ok(self) -> bool:
        return self.error is None


def flush_shard(
    table: WalTable,
    blobs: BlobStore,
    batches: Iterable[Batch],
    *,
    workers: int = DEFAULT_DATASET_WORKERS,
    attempts: int = DEFAULT_ATTEMPTS,
    retry_delay_s: float = 1.0,
    catch_up_rows: int = 0,
) -> list[DatasetOutcome]:
    """Flush every batch: datasets in parallel, each dataset's batches in seq order. Never raises for one
    dataset's failure: each dataset gets a DatasetOutcome, in dataset order.

    With `catch_up_rows`, a dataset's last batch also takes rows appended since it was planned (up to
    that many more), so a row appended while the run was queued does not wait for the next run.
    """
    by_dataset: dict[str, list[Batch]] = {}
    for batch in sorted(batches, key=lambda b: (b.dataset_id, b.seqs)):
        by_dataset.setdefault(batch.dataset_id, []).append(batch)
    if not by_dataset:
        return []
    pool_size = max(1, min(workers, len(by_dataset)))
    # Each dataset marks its rows from threads of its own: share the client's connections between them.
    mark_workers = max(1, MAX_POOL_CONNECTIONS // pool_size)

    def flush_one(dataset_id: str) -> DatasetOutcome:
        outcome = DatasetOutcome(dataset_id)
        started = time.monotonic()
        planned = by_dataset[dataset_id]
        try:  # a bad plan (from a hand-written run config, say) is reported before anything is read
            validate_plan(dataset_id, planned)
        except WalInputError as error:
            outcome.error = str(error)
            return outcome
        for position, batch in enumerate(planned):
            seqs = list(batch.seqs)
            if catch_up_rows and position == len(planned) - 1:
                seqs += _rows_since(table, dataset_id, batch.last_seq, catch_up_rows)
            if not _flush_with_retries(table, blobs, outcome, seqs, attempts, retry_delay_s, mark_workers):
                break  # later batches need this one first; they come back with the next plan
        outcome.seconds = time.monotonic() - started
        return outcome

    with ThreadPoolExecutor(max_workers=pool_size, thread_name_prefix="wal-shard") as pool:
        return list(pool.map(flush_one, sorted(by_dataset)))


def validate_plan(dataset_id: str, batches: list[Batch]) -> None:
    validate_dataset_id(dataset_id)
    for batch in batches:
        validate_seqs(dataset_id, batch.seqs)


def _rows_since(table: WalTable, dataset_id: str, last_planned: int, limit: int) -> list[int]:
    try:
        current = table.max_seq(dataset_id)
    except WalError as error:  # the planned rows are still worth flushing
        log.warning("dataset %r: no catch-up past seq %d (%s)", dataset_id, last_planned, error)
        return []
    return list(range(last_planned + 1, min(current, last_planned + limit) + 1))


def _flush_with_retries(
    table: WalTable,
    blobs: BlobStore,
    outcome: DatasetOutcome,
    seqs: list[int],
    attempts: int,
    retry_delay_s: float,
    mark_workers: int,
) -> bool:
    for attempt in range(1, attempts + 1):
        outcome.attempts += 1
        try:
            outcome.results.append(
                flush_dataset(table, blobs, outcome.dataset_id, seqs, max_workers=mark_workers)
            )
            outcome.error = None
            return True
        except WalInputError as error:  # a bad plan does not get better by retrying
            outcome.error = str(error)
            return False
        except WalError as error:
            outcome.error = str(error)
            log.warning(
                "dataset %r: flush attempt %d of %d failed: %s", outcome.dataset_id, attempt, attempts, error
            )
            if attempt < attempts:
                time.sleep(retry_delay_s * 2 ** (attempt - 1))
    return False
