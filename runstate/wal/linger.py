"""A flush run that lingers: after its planned batches it keeps flushing its shard's new rows.

Through the daemon, most of a row's wait is the start of a new run worker (a process that loads the
code location), not the flush. A run that, once its plan is flushed, polls the Pending index for its
own shard's rows and flushes them at once saves that start for every row that arrives while it is
alive. It ends after `idle_s` without new work, or once `budget_s` has passed since it began, so the
number of runs stays one per shard at a time and every run still ends.

The shard's one-run-at-a-time rule is what makes this safe: a lingering run is the shard's only
flush, and it only takes datasets of its own shard. A dataset that failed in the run is left to the
next planned run (no hot retry loop). On DynamoDB the Pending index is eventually consistent, so a row
just applied may still be listed for a moment; the flush skips it, and only rows actually applied
count as work that extends the linger.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from runstate.wal.errors import WalInputError
from runstate.wal.shards import DatasetOutcome, shard_of
from runstate.wal.source import Batch, WalKey, plan_batches
from runstate.wal.table import WalTable

FlushBatches = Callable[[Iterable[Batch]], list[DatasetOutcome]]


@dataclass(frozen=True)
class Linger:
    """How long a shard run stays for new rows: `idle_s` without work ends it, `budget_s` caps it."""

    idle_s: float
    budget_s: float
    poll_s: float = 1.0

    def __post_init__(self) -> None:
        if self.idle_s < 0 or self.budget_s < 0 or self.poll_s <= 0:
            raise WalInputError(
                f"linger needs idle_s >= 0, budget_s >= 0 and poll_s > 0, got {self.idle_s}, "
                f"{self.budget_s}, {self.poll_s}"
            )


def shard_pending(
    table: WalTable, shard: int, shards: int, skip: set[str], limit: int = 10_000
) -> list[WalKey]:
    """The Pending rows of one shard's datasets, leaving out the datasets in `skip`."""
    return [
        WalKey(row.dataset_id, row.seq)
        for row in table.pending(limit)
        if row.dataset_id not in skip and shard_of(row.dataset_id, shards) == shard
    ]


def linger_rounds(
    table: WalTable,
    flush: FlushBatches,
    *,
    shard: int,
    shards: int,
    linger: Linger,
    max_batch_size: int,
    failed: Iterable[str] = (),
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[list[DatasetOutcome]]:
    """Poll the shard's Pending rows and flush them; yields each round's outcomes until idle or over budget.

    `failed` names datasets that already failed in this run: they (and any that fail here) are skipped.
    """
    skip = set(failed)
    started = last_work = clock()
    while clock() - started < linger.budget_s and clock() - last_work < linger.idle_s:
        sleep(linger.poll_s)
        keys = shard_pending(table, shard, shards, skip)
        if not keys:
            continue
        outcomes = flush(plan_batches(keys, max_batch_size=max_batch_size))
        skip.update(outcome.dataset_id for outcome in outcomes if not outcome.ok)
        if any(outcome.applied for outcome in outcomes):
            last_work = clock()
        yield outcomes
