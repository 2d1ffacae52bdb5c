"""Planning, the one place that decides what a flush or a merge takes: for the sensors and for the commands.

Flush: pending keys -> batches -> shard plans. `wal_sensor` plans from the stream and the Pending sweep;
`runstate wal flush` plans from the sweep (or one dataset's rows, read from the table rather than the
lagging index). Both call `plan_flush`, so a shard's plan, and its key, is the same whoever asks.

Merge: the datasets whose LastAppliedSeq moved since their last requested merge, grouped by merge shard.
`dataset_tables_sensor` and `runstate wal merge --dataset X` both call `plan_merges`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from runstate.wal.changes import validate_dataset_id
from runstate.wal.errors import WalInputError
from runstate.wal.shards import ShardPlan, plan_shards, shard_of
from runstate.wal.source import Batch, WalKey, plan_batches
from runstate.wal.table import WalTable


@dataclass(frozen=True)
class FlushPlan:
    """What a flush takes now: the batches, grouped into shard plans (shards without work left out)."""

    batches: tuple[Batch, ...]
    shards: tuple[ShardPlan, ...]
    # LastAppliedSeq per dataset, when the plan read the meta rows (a plan over the stream does).
    applied: Mapping[str, int] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(len(batch.seqs) for batch in self.batches)

    @property
    def datasets(self) -> set[str]:
        return {batch.dataset_id for batch in self.batches}

    def shard(self, shard: int) -> ShardPlan | None:
        """The plan of one shard, or None when it has no work."""
        return next((plan for plan in self.shards if plan.shard == shard), None)


def pending_keys(
    table: WalTable, dataset_id: str | None = None, streamed: Iterable[WalKey] | None = None
) -> tuple[list[WalKey], dict[str, int]]:
    """The rows to flush, and the LastAppliedSeqs read on the way (empty when none were read).

    - one dataset: its rows after its LastAppliedSeq, read from the table (consistent), not the index;
    - every dataset: the Pending sweep, plus the `streamed` keys newer than their dataset's LastAppliedSeq.
      The sweep is what makes a lost cursor, a trimmed stream or a failed run harmless; swept rows are
      kept even below LastAppliedSeq (a crash leftover that a flush repairs).
    """
    if dataset_id is not None:
        validate_dataset_id(dataset_id)
        applied = table.meta(dataset_id).last_applied_seq
        keys = [WalKey(dataset_id, seq) for seq in range(applied + 1, table.max_seq(dataset_id) + 1)]
        return keys, {dataset_id: applied}
    swept = [WalKey(row.dataset_id, row.seq) for row in table.pending()]
    if streamed is None:
        return swept, {}
    # One query of the meta rows: every dataset's LastAppliedSeq, and the full list of datasets.
    applied_seqs = {dataset: meta.last_applied_seq for dataset, meta in table.metas().items()}
    fresh = [key for key in streamed if key.seq_no > applied_seqs.get(key.dataset_id, 0)]
    return [*fresh, *swept], applied_seqs


def plan_flush(
    table: WalTable,
    *,
    max_batch_size: int,
    shards: int,
    dataset_id: str | None = None,
    streamed: Iterable[WalKey] | None = None,
) -> FlushPlan:
    """Pending keys -> batches -> shard plans: the one flush planner (see `pending_keys` for the keys)."""
    keys, applied = pending_keys(table, dataset_id, streamed)
    batches = plan_batches(keys, max_batch_size=max_batch_size)
    return FlushPlan(tuple(batches), tuple(plan_shards(batches, shards)), applied)


def plan_merges(
    applied: Mapping[str, int],
    requested: Mapping[str, int],
    shards: int,
    held: Collection[int] = (),
) -> dict[int, dict[str, int]]:
    """Merge shard -> {dataset: version to merge to}: every dataset whose LastAppliedSeq differs from the
    version its last merge was requested for, in a shard that is not `held`.

    LastAppliedSeq only grows, unless the WAL started over (moto keeps it in memory): a dataset behind
    its last request is due too, and its merge reports the table ahead of its blobs."""
    due: dict[int, dict[str, int]] = {}
    for dataset_id, version in applied.items():
        shard = shard_of(dataset_id, shards)
        if version != requested.get(dataset_id, 0) and shard not in held:
            due.setdefault(shard, {})[dataset_id] = version
    return dict(sorted(due.items()))


def flushed_version(table: WalTable, dataset_id: str) -> int:
    """A dataset's LastAppliedSeq, for a merge asked for by name: refused (WalInputError) when the
    dataset has no rows or nothing flushed yet. Consistent reads, unlike the list of datasets."""
    validate_dataset_id(dataset_id)
    if table.max_seq(dataset_id) == 0:
        raise WalInputError(f"dataset {dataset_id!r} is unknown: it has no WAL rows")
    version = table.meta(dataset_id).last_applied_seq
    if version == 0:
        raise WalInputError(f"dataset {dataset_id!r} has nothing flushed yet; run `runstate wal tick` first")
    return version
