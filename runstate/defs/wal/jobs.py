"""`flush_wal` (one shard's planned batches to delta blobs) and `compact_wal` (snapshots, trim, archive)."""

import json
from collections.abc import Callable, Iterable

import dagster as dg
from pydantic import Field

from runstate.defs.runs.beating import beating
from runstate.defs.runs.heartbeat import ensure_alive
from runstate.defs.runs.interrupts import ends_run_when_interrupted
from runstate.defs.tags import HISTORY_CAN_WAIT_TAGS, PRIORITY_TAG, REPLANNED_BY_SENSOR_TAGS, WAL_SHARD_TAG
from runstate.defs.wal.resources import WalResource
from runstate.wal import Batch, compact, wal_status
from runstate.wal.codec import warm_up
from runstate.wal.holding import ShardRounds, ShardTerm
from runstate.wal.lease import ShardLease
from runstate.wal.linger import Linger, LingerPlans
from runstate.wal.shards import DatasetOutcome, flush_shard

SNAPSHOTS_ASSET = dg.AssetKey("dataset_snapshots")
MAX_RETRY_WAIT_S = 300


def flush_retry_policy(max_retries: int = 7, delay: float = 2.0) -> dg.RetryPolicy:
    """Exponential backoff with jitter, refused if any wait could exceed 5 minutes.

    Dagster waits ((2**n) - 1) * delay +/- delay before retry n, so the longest wait is 2**max_retries * delay.
    """
    longest = (2**max_retries) * delay
    if longest > MAX_RETRY_WAIT_S:
        raise ValueError(
            f"flush retry policy could wait {longest:.0f} s > {MAX_RETRY_WAIT_S} s before a retry"
        )
    return dg.RetryPolicy(
        max_retries=max_retries, delay=delay, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS
    )


# For failures of the run as a whole (a dataset's own failures are retried and reported inside the run):
# up to 7 retries, waits of about 2, 6, 14, 30, 62, 126 and 254 s (~8 min in all).
FLUSH_RETRY_POLICY = flush_retry_policy()


class BatchConfig(dg.Config):
    """One planned batch: a dataset and the WAL seqs to apply, ascending."""

    dataset_id: str = Field(description="The dataset whose WAL rows are flushed.")
    seqs: list[int] = Field(description="SeqNos of the batch, as planned by wal_sensor.")


class ShardFlushConfig(dg.Config):
    """One shard's plan, as wal_sensor made it."""

    shard: int = Field(ge=0, description="The flush shard (runstate/wal_shard tag) the datasets map to.")
    batches: list[BatchConfig] = Field(description="The shard's planned batches, in (dataset, seq) order.")
    hold: bool = Field(
        default=False,
        description="Always-on: hold the shard's lease, poll and flush it until flush_run_budget_s, then "
        "hand it to the successor wal_sensor requests.",
    )


class CompactConfig(dg.Config):
    dataset_ids: list[str] = Field(
        default_factory=list, description="Datasets to compact; empty means every dataset."
    )
    retention_days: int | None = Field(
        default=None, description="Applied rows older than this are trimmed; empty means the resource's."
    )


def snapshot_materialization(outcome: DatasetOutcome) -> dg.AssetMaterialization:
    """The dataset_snapshots partition's record of what one shard run applied to it."""
    results = outcome.results
    blobs = [result for result in results if result.blob_key]
    return dg.AssetMaterialization(
        asset_key=SNAPSHOTS_ASSET,
        partition=outcome.dataset_id,
        metadata={
            "rows": sum(result.rows for result in results),
            "applied": outcome.applied,
            "skipped": sum(result.skipped for result in results),
            "first_seq": results[0].first_seq,
            "last_seq": results[-1].last_seq,
            "blob_key": blobs[-1].blob_key if blobs else "",
            "blobs": len(blobs),
            "blob_bytes": sum(result.blob_bytes for result in results),
            "version": results[-1].version,
            "flush_s": round(outcome.seconds, 3),
            "attempts": outcome.attempts,
        },
    )


def report(context: dg.OpExecutionContext, outcomes: list[DatasetOutcome]) -> None:
    for outcome in outcomes:
        if outcome.applied:
            context.log_event(snapshot_materialization(outcome))
        if not outcome.ok:
            # Its rows stay Pending: the next wal_sensor tick plans the dataset again.
            context.log.error(f"dataset {outcome.dataset_id!r} not flushed: {outcome.error}")


def shard_metadata(shard: int, outcomes: list[DatasetOutcome]) -> dict[str, object]:
    """The run's figures over its plan and every linger round (a dataset flushed twice counts once)."""
    datasets = {outcome.dataset_id for outcome in outcomes}
    failed = {outcome.dataset_id: outcome.error for outcome in outcomes if not outcome.ok}
    return {
        "shard": shard,
        "datasets": len(datasets),
        "flushed": len(datasets - set(failed)),
        "failed": len(failed),
        "rows_applied": sum(outcome.applied for outcome in outcomes),
        "slowest_dataset_s": round(max((outcome.seconds for outcome in outcomes), default=0.0), 3),
        "failures": dg.MetadataValue.json(failed),
    }


def hold_shard(
    context: dg.OpExecutionContext,
    shard: int,
    planned: list[Batch],
    wal: WalResource,
    flush: Callable[[list[Batch]], list[DatasetOutcome]],
) -> list[DatasetOutcome]:
    """The always-on run: hold the shard's lease and flush its rows as they come, until it hands over."""
    table = wal.wal_table()
    rounds = ShardRounds(
        ShardLease(table, shard, wal.flush_shards, ttl_s=wal.flush_lease_ttl_s),
        table,
        holder=context.run_id,
        shard=shard,
        shards=wal.flush_shards,
        term=ShardTerm(
            budget_s=wal.flush_run_budget_s,
            handover_wait_s=wal.flush_handover_wait_s,
            poll_s=wal.flush_poll_s,
        ),
        max_batch_size=wal.max_batch_size,
        initial=planned,
    )
    outcomes: list[DatasetOutcome] = []
    warm_up()
    try:
        for batches in rounds:
            more = flush(batches)
            rounds.record(more)
            outcomes += more
    finally:
        rounds.stop()  # an interrupt or an error lets the lease go: the next run takes it at once
    context.log.info(rounds.ended)
    return outcomes


def build_flush_job(
    retry_policy: dg.RetryPolicy = FLUSH_RETRY_POLICY, name: str = "flush_wal"
) -> dg.JobDefinition:
    """The flush job; tests build one with a faster policy so a fault-then-recover run takes milliseconds."""

    @dg.op(name="flush_wal_shard", retry_policy=retry_policy)
    @ends_run_when_interrupted
    def flush_wal_shard(
        context: dg.OpExecutionContext, config: ShardFlushConfig, wal: WalResource
    ) -> dg.Output:
        """Flush the shard's batches (datasets in parallel, each in seq order; failures reported per
        dataset), then, with the resource's flush_linger_s, the shard's new rows until none come.

        Before each round and before reporting it, the run's fence: a run declared dead while its process
        was paused stops here (`runstate.defs.runs.heartbeat`)."""
        table, blobs = wal.wal_table(), wal.blob_store()

        def flush(batches: Iterable[Batch]) -> list[DatasetOutcome]:
            ensure_alive(context)
            outcomes = flush_shard(
                table,
                blobs,
                batches,
                workers=wal.flush_workers,
                attempts=wal.flush_attempts,
                retry_delay_s=wal.flush_retry_delay_s,
                catch_up_rows=wal.max_batch_size,
            )
            ensure_alive(context)
            report(context, outcomes)
            return outcomes

        planned = [Batch(batch.dataset_id, tuple(batch.seqs)) for batch in config.batches]
        if config.hold:
            outcomes = hold_shard(context, config.shard, planned, wal, flush)
        else:
            outcomes = flush(planned)
        if wal.flush_linger_s > 0 and not config.hold:
            plans = LingerPlans(
                table,
                shard=config.shard,
                shards=wal.flush_shards,
                linger=Linger(idle_s=wal.flush_linger_s, budget_s=wal.flush_run_budget_s),
                max_batch_size=wal.max_batch_size,
                failed=[outcome.dataset_id for outcome in outcomes if not outcome.ok],
            )
            for batches in plans:
                more = flush(batches)
                plans.record(more)
                outcomes += more
        ensure_alive(context)
        metadata = shard_metadata(config.shard, outcomes)
        context.log.info(
            f"shard {config.shard}: {json.dumps({k: v for k, v in metadata.items() if k != 'failures'})}"
        )
        return dg.Output(metadata["flushed"], metadata=metadata)

    # One op: running it in the run worker itself saves a second process (and code-location load) per run.
    @dg.job(
        name=name,
        executor_def=beating(dg.in_process_executor),  # beats: its shard is held while it lives
        # Freshness first: the queue starts a flush before a waiting Spark run.
        tags={PRIORITY_TAG: "10", **REPLANNED_BY_SENSOR_TAGS, **HISTORY_CAN_WAIT_TAGS},
        description="Flush one shard's planned WAL batches to delta blobs and mark them Applied.",
    )
    def flush_job() -> None:
        flush_wal_shard()

    return flush_job


flush_wal = build_flush_job()


@dg.op(retry_policy=FLUSH_RETRY_POLICY)
@ends_run_when_interrupted
def compact_wal_datasets(context: dg.OpExecutionContext, config: CompactConfig, wal: WalResource) -> None:
    """Per dataset: a new snapshot from the old one plus its deltas, trim old Applied rows, archive old blobs."""
    table, blobs = wal.wal_table(), wal.blob_store()
    dataset_ids = config.dataset_ids or [status.dataset_id for status in wal_status(table)]
    retention_days = wal.retention_days if config.retention_days is None else config.retention_days
    for dataset_id in dataset_ids:
        result = compact(table, blobs, dataset_id, retention_days=retention_days)
        context.log.info(f"dataset {dataset_id!r}: {result}")
        if result.snapshot_key:
            metadata = {k: v for k, v in vars(result).items() if isinstance(v, (int, float, str))}
            context.log_event(
                dg.AssetMaterialization(SNAPSHOTS_ASSET, partition=dataset_id, metadata=metadata)
            )


@dg.job(
    description="Compact datasets: new snapshot blobs, trim Applied WAL rows past retention, archive old blobs."
)
def compact_wal() -> None:
    compact_wal_datasets()


def compaction_run_request(shard: int, dataset_ids: list[str], day: str) -> dg.RunRequest:
    """One compaction run per flush shard per day, tagged with the shard so it never overlaps its flushes."""
    return dg.RunRequest(
        run_key=f"compact-shard{shard}-{day}",
        run_config={"ops": {"compact_wal_datasets": {"config": {"dataset_ids": sorted(dataset_ids)}}}},
        tags={WAL_SHARD_TAG: str(shard)},
    )
