"""`merge_dataset_tables`: one run merges a shard's datasets into their tables, on one Spark session."""

import dagster as dg
from pydantic import Field

from runstate.defs.dataset_tables.resources import blob_location, copy_on_write_max_bytes
from runstate.defs.runs.heartbeat import ensure_alive
from runstate.defs.runs.interrupts import ends_run_when_interrupted
from runstate.defs.spark import SparkResource, ends_spark_session
from runstate.defs.tags import REPLANNED_BY_SENSOR_TAGS, SPARK_JOB_TAGS, SPARK_POOL
from runstate.defs.wal.resources import WalResource
from runstate.spark_interrupts import spark_jobs_cancelled_on_interrupt
from runstate.wal import BlobIntegrityError, WalError, WalInputError
from runstate.wal.dataset_tables import MergeResult, merge_dataset

TABLES_ASSET = dg.AssetKey("dataset_tables")
MERGE_JOB = "merge_dataset_tables"
MERGE_OP = "merge_datasets"
PERMANENT_ERRORS = (BlobIntegrityError, WalInputError)
COMMITTED_EARLIER = "an earlier run, which committed this merge but stopped before it recorded it"


class MergeConfig(dg.Config):
    dataset_ids: list[str] = Field(
        description="Datasets whose tables are brought up to their manifest version."
    )
    rebuild: bool = Field(
        default=False, description="Read the snapshot and every delta instead of the new deltas."
    )


def merge_metadata(result: MergeResult) -> dict[str, object]:
    """What a dataset table's materialization records: the version reached, how it got there, and the
    files the table holds now (the maintenance service's `apply_deletes_sensor` reads `delete_files`)."""
    metadata: dict[str, object] = {
        "version": result.version,
        "from_version": result.from_version,
        "blobs_read": result.blobs,
        "full_read": result.full,
        "rows_written": result.rows_written,
        "table": result.table,
        "seconds": round(result.seconds, 3),
    }
    if result.files is not None:
        metadata.update(data_files=result.files.data_files, delete_files=result.files.delete_files)
    return metadata


def recorded_version(instance: dg.DagsterInstance, dataset_id: str) -> int | None:
    """The version of the partition's latest materialization (None: it has none)."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=TABLES_ASSET, asset_partitions=[dataset_id]), limit=1
    ).records
    materialization = records[0].asset_materialization if records else None
    if materialization is None:
        return None
    metadata = materialization.metadata
    if "versions" in metadata:  # a rebuild of several partitions in one run (assets.py)
        value = (metadata["versions"].value or {}).get(dataset_id)
    else:
        value = metadata["version"].value if "version" in metadata else None
    return value if isinstance(value, int) else None


def _unrecorded(instance: dg.DagsterInstance, result: MergeResult) -> bool:
    """Whether a table found current got there by a merge whose run never recorded it: a run killed
    after its commit, before its materialization (its partition would read missing, or behind, forever)."""
    if result.version <= 0:  # no table, or nothing merged into it yet
        return False
    recorded = recorded_version(instance, result.dataset_id)
    return recorded is None or recorded < result.version


@dg.op(
    name=MERGE_OP,
    pool=SPARK_POOL,
    retry_policy=dg.RetryPolicy(max_retries=2, delay=5, backoff=dg.Backoff.EXPONENTIAL),
)
@ends_run_when_interrupted
@ends_spark_session
def merge_datasets(
    context: dg.OpExecutionContext, config: MergeConfig, wal: WalResource, spark: SparkResource
) -> None:
    """Merge each dataset in turn; one dataset's failure does not stop the others, but fails the run.

    A merged table is a materialization of its partition; a table that was already current is an
    observation, so whoever reads the run (the CLI) sees every dataset it was asked for, unless no
    materialization of its partition records that version: then the merge was committed by a run that
    stopped before it recorded it, and this run records it (a materialization, `committed_by` saying so).

    Before each merge and before reporting it, the run's fence (a run declared dead stops here); a
    SIGTERM cancels the Spark job in flight, so the run fails and records its end at once."""
    session, location, s3 = spark.get_session(), blob_location(wal), wal.s3_client()
    limit = copy_on_write_max_bytes(wal)
    failures: dict[str, WalError] = {}
    with spark_jobs_cancelled_on_interrupt(session) as interrupt:
        for dataset_id in config.dataset_ids:
            ensure_alive(context)
            try:
                result = merge_dataset(
                    session,
                    location,
                    dataset_id,
                    rebuild=config.rebuild,
                    s3=s3,
                    copy_on_write_max_bytes=limit,
                )
            except WalError as error:
                interrupt.check()  # a job cancelled by the signal is no dataset's failure
                context.log.error(str(error))
                failures[dataset_id] = error
                continue
            ensure_alive(context)
            context.log.info(
                f"dataset {dataset_id!r}: {result.table} {result.from_version} -> {result.version}"
            )
            metadata = merge_metadata(result)
            if not result.merged and _unrecorded(context.instance, result):
                metadata["committed_by"] = COMMITTED_EARLIER
            if result.merged or "committed_by" in metadata:
                context.log_event(
                    dg.AssetMaterialization(TABLES_ASSET, partition=dataset_id, metadata=metadata)
                )
            else:
                context.log_event(dg.AssetObservation(TABLES_ASSET, partition=dataset_id, metadata=metadata))
    if failures:
        raise dg.Failure(
            description=f"{len(failures)} of {len(config.dataset_ids)} dataset merge(s) failed: "
            + "; ".join(map(str, failures.values())),
            metadata={dataset_id: str(error) for dataset_id, error in failures.items()},
            # A missing or corrupt blob, or bad input, is the same a few seconds later: no retry.
            allow_retries=not all(isinstance(e, PERMANENT_ERRORS) for e in failures.values()),
        )


@dg.job(
    name=MERGE_JOB,
    tags={**SPARK_JOB_TAGS, **REPLANNED_BY_SENSOR_TAGS},
    description="Bring a shard of dataset tables up to their datasets' manifest versions on Spark.",
)
def merge_dataset_tables() -> None:
    merge_datasets()
