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


class LingerPlans:
    """The linger loop as an iterator of work: each item is the batches of one round, which the caller
    flushes and then hands back through `record`, so the loop knows what was applied and what failed.

        plans = LingerPlans(table, shard=0, shards=2, linger=linger, max_batch_size=500)
        for batches in plans:
            plans.record(flush(batches))

    It polls the shard's Pending rows every `poll_s`, and ends after `idle_s` without a row applied or
    `budget_s` after it began. `failed` names datasets that already failed in this run: they (and any
    that fail here) are skipped.
    """

    def __init__(
        self,
        table: WalTable,
        *,
        shard: int,
        shards: int,
        linger: Linger,
        max_batch_size: int,
        failed: Iterable[str] = (),
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._table, self._shard, self._shards = table, shard, shards
        self._linger, self._max_batch_size = linger, max_batch_size
        self._skip = set(failed)
        self._clock, self._sleep = clock, sleep
        self._started = self._last_work = clock()

    def __iter__(self) -> Iterator[list[Batch]]:
        while self._clock() - self._started < self._linger.budget_s and (
            self._clock() - self._last_work < self._linger.idle_s
        ):
            self._sleep(self._linger.poll_s)
            keys = shard_pending(self._table, self._shard, self._shards, self._skip)
            if keys:
                yield plan_batches(keys, max_batch_size=self._max_batch_size)

    def record(self, outcomes: list[DatasetOutcome]) -> None:
        """What flushing the last round did: its failed datasets are skipped from now on, and a row
        applied restarts the idle time."""
        self._skip.update(outcome.dataset_id for outcome in outcomes if not outcome.ok)
        if any(outcome.applied for outcome in outcomes):
            self._last_work = self._clock()
