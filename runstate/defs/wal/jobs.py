"""`flush_wal` (one batch of one dataset to a delta blob) and `compact_wal` (snapshots, trim, archive)."""

from typing import Optional

import dagster as dg
from pydantic import Field

from runstate.defs.wal.partitions import DATASET_TAG
from runstate.defs.wal.resources import WalResource
from runstate.wal import compact_dataset, flush_batch, wal_status

SNAPSHOTS_ASSET = dg.AssetKey("dataset_snapshots")
MAX_RETRY_WAIT_S = 300


def flush_retry_policy(max_retries: int = 7, delay: float = 2.0) -> dg.RetryPolicy:
    """Exponential backoff with jitter, refused if any wait could exceed 5 minutes.

    Dagster waits ((2**n) - 1) * delay +/- delay before retry n, so the longest wait is 2**max_retries * delay.
    """
    longest = (2**max_retries) * delay
    if longest > MAX_RETRY_WAIT_S:
        raise ValueError(f"flush retry policy could wait {longest:.0f} s > {MAX_RETRY_WAIT_S} s before a retry")
    return dg.RetryPolicy(max_retries=max_retries, delay=delay, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS)


# The production policy: up to 7 retries, waits of about 2, 6, 14, 30, 62, 126 and 254 s (~8 min in all).
FLUSH_RETRY_POLICY = flush_retry_policy()


class FlushConfig(dg.Config):
    """One planned batch: a dataset and the WAL seqs to apply, ascending."""

    dataset_id: str = Field(description="The dataset whose WAL rows are flushed.")
    seqs: list[int] = Field(description="SeqNos of the batch, as planned by wal_sensor.")


class CompactConfig(dg.Config):
    dataset_ids: list[str] = Field(default_factory=list, description="Datasets to compact; empty means every dataset.")
    retention_days: Optional[int] = Field(default=None, description="Applied rows older than this are trimmed; empty means the resource's.")


def build_flush_job(retry_policy: dg.RetryPolicy = FLUSH_RETRY_POLICY, name: str = "flush_wal") -> dg.JobDefinition:
    """The flush job; tests build one with a faster policy so a fault-then-recover run takes milliseconds."""

    @dg.op(name="flush_wal_batch", retry_policy=retry_policy)
    def flush_wal_batch(context: dg.OpExecutionContext, config: FlushConfig, wal: WalResource) -> None:
        """Apply one batch: blob first, then Applied marks, then LastAppliedSeq and the manifest (all idempotent)."""
        result = flush_batch(
            wal.dynamodb_client(),
            wal.s3_client(),
            table=wal.table_name,
            bucket=wal.bucket_name,
            prefix=wal.blob_prefix,
            dataset_id=config.dataset_id,
            seqs=config.seqs,
        )
        context.log.info(
            f"dataset {config.dataset_id!r}: applied {result.applied}, skipped {result.skipped} "
            f"(seqs {result.first_seq}..{result.last_seq}) -> {result.blob_key}"
        )
        if result.applied:
            context.log_event(
                dg.AssetMaterialization(
                    asset_key=SNAPSHOTS_ASSET,
                    partition=config.dataset_id,
                    metadata={
                        "rows": result.rows,
                        "applied": result.applied,
                        "skipped": result.skipped,
                        "first_seq": result.first_seq,
                        "last_seq": result.last_seq,
                        "blob_key": result.blob_key,
                        "blob_bytes": result.blob_bytes,
                    },
                )
            )

    @dg.job(name=name, description="Flush one planned WAL batch of one dataset to a delta blob and mark it Applied.")
    def flush_job() -> None:
        flush_wal_batch()

    return flush_job


flush_wal = build_flush_job()


@dg.op(retry_policy=FLUSH_RETRY_POLICY)
def compact_wal_datasets(context: dg.OpExecutionContext, config: CompactConfig, wal: WalResource) -> None:
    """Per dataset: a new snapshot from the old one plus its deltas, trim old Applied rows, archive old blobs."""
    dynamodb, s3 = wal.dynamodb_client(), wal.s3_client()
    dataset_ids = config.dataset_ids or [status.dataset_id for status in wal_status(dynamodb, wal.table_name)]
    retention_days = wal.retention_days if config.retention_days is None else config.retention_days
    for dataset_id in dataset_ids:
        result = compact_dataset(
            dynamodb,
            s3,
            table=wal.table_name,
            bucket=wal.bucket_name,
            prefix=wal.blob_prefix,
            dataset_id=dataset_id,
            retention_days=retention_days,
        )
        context.log.info(f"dataset {dataset_id!r}: {result}")
        snapshot_key = getattr(result, "snapshot_key", None)
        if snapshot_key:
            context.log_event(
                dg.AssetMaterialization(
                    asset_key=SNAPSHOTS_ASSET,
                    partition=dataset_id,
                    metadata={k: v for k, v in vars(result).items() if isinstance(v, (int, float, str)) and v is not None},
                )
            )


@dg.job(description="Compact datasets: new snapshot blobs, trim Applied WAL rows past retention, archive old blobs.")
def compact_wal() -> None:
    compact_wal_datasets()


def compaction_run_request(dataset_id: str, day: str) -> dg.RunRequest:
    """One compaction run per dataset per day, tagged like a flush so the two never overlap."""
    return dg.RunRequest(
        run_key=f"compact-{dataset_id}-{day}",
        run_config={"ops": {"compact_wal_datasets": {"config": {"dataset_ids": [dataset_id]}}}},
        tags={DATASET_TAG: dataset_id},
    )
