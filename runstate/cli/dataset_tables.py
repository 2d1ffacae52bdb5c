"""`runstate wal merge` and `runstate wal read --engine spark`: the dataset tables from the command line.

`install(wal)` adds `merge` to the `wal` group and gives its `read` an `--engine` (blobs, the default,
or spark) and a `--version` (spark only: Iceberg time travel). Both engines print the same JSON.
"""

from __future__ import annotations

import json
from typing import Any

import click

ENGINES = ("blobs", "spark")


def _merge_instance() -> Any:
    from runstate.defs.ticking import default_instance

    return default_instance()


@click.command()
@click.option(
    "--dataset",
    "dataset_id",
    default=None,
    help="Merge only this dataset (default: every dataset "
    "flushed since its last merge, as dataset_tables_sensor would).",
)
@click.option(
    "--rebuild", is_flag=True, help="With --dataset: rebuild the table from the snapshot and every delta."
)
def merge(dataset_id: str | None, rebuild: bool) -> None:
    """Bring dataset tables up to their datasets' versions on Spark, in-process (as `wal tick` flushes)."""
    from runstate.defs.dataset_tables.jobs import MERGE_OP
    from runstate.defs.ticking import default_defs, tick_sensor

    if rebuild and dataset_id is None:
        raise click.UsageError("--rebuild needs --dataset")
    if dataset_id is None:
        result = _tick(tick_sensor)
        if result.skip_reason and not result.requested:
            click.echo(f"skipped: {result.skip_reason}")
        runs = result.results
    else:
        runs = [_merge_one(default_defs(), dataset_id, rebuild)]
    for run in runs:
        for line in _dataset_lines(run, MERGE_OP):
            click.echo(line)
    failed = [run for run in runs if not run.success]
    click.echo(f"{len(runs)} merge run(s): {len(runs) - len(failed)} succeeded, {len(failed)} failed")
    for run in failed:
        click.echo(f"  run {run.run_id} FAILED: {_failure(run)}", err=True)
    if failed:
        raise SystemExit(1)


def _tick(tick_sensor: Any) -> Any:
    """The sensor's tick; a WAL table it cannot read is one error line, not a traceback."""
    from botocore.exceptions import BotoCoreError, ClientError
    from dagster import DagsterUserCodeExecutionError

    from runstate.wal.dataset_tables import DatasetTableError

    try:
        return tick_sensor("dataset_tables_sensor")
    except DagsterUserCodeExecutionError as error:
        cause = error.user_exception
        if isinstance(cause, (ClientError, BotoCoreError)):
            raise DatasetTableError(f"dataset_tables_sensor could not read the WAL table: {cause}") from None
        raise
    except (ClientError, BotoCoreError) as error:
        raise DatasetTableError(f"dataset_tables_sensor could not read the WAL table: {error}") from None


def _dataset_lines(run: Any, node: str) -> list[str]:
    """One line per dataset the run merged (materialized) or found current (observed), in dataset order;
    a dataset merged by an earlier attempt of a retried step keeps its merge line."""
    lines: dict[str, str] = {}
    for observation in run.asset_observations_for_node(node):
        metadata = observation.metadata
        lines[observation.partition] = (
            f"{observation.partition}: {metadata['table'].value} at version {metadata['version'].value} "
            "(already current)"
        )
    for materialization in run.asset_materializations_for_node(node):
        metadata = materialization.metadata
        lines[materialization.partition] = (
            f"{materialization.partition}: {metadata['table'].value} at version {metadata['version'].value}"
        )
    return [lines[dataset_id] for dataset_id in sorted(lines)]


def _merge_one(defs: Any, dataset_id: str, rebuild: bool) -> Any:
    from runstate import wiring
    from runstate.defs.dataset_tables.jobs import MERGE_JOB, MERGE_OP
    from runstate.defs.dataset_tables.sensors import MERGE_SHARDS
    from runstate.defs.tags import MERGE_SHARD_TAG
    from runstate.defs.ticking import execute_run
    from runstate.wal import WalInputError
    from runstate.wal.shards import shard_of

    shard = shard_of(dataset_id, MERGE_SHARDS)  # validates the id before anything runs
    table = wiring.wal_table()
    if table.max_seq(dataset_id) == 0:  # consistent reads, unlike the list of datasets
        raise WalInputError(f"dataset {dataset_id!r} is unknown: it has no WAL rows")
    if table.meta(dataset_id).last_applied_seq == 0:
        raise WalInputError(f"dataset {dataset_id!r} has nothing flushed yet; run `runstate wal tick` first")
    return execute_run(
        defs.resolve_job_def(MERGE_JOB),
        _merge_instance(),
        run_config={"ops": {MERGE_OP: {"config": {"dataset_ids": [dataset_id], "rebuild": rebuild}}}},
        tags={MERGE_SHARD_TAG: str(shard)},
    )


def _failure(run: Any) -> str:
    """What failed: the op's own description (which names each dataset's error), else the innermost
    error (Dagster reports a step that used up its retries as "Exceeded max_retries", the cause inside)."""
    for event in run.all_events:
        if not event.is_step_failure:
            continue
        data = event.step_failure_data
        if data.user_failure_data and data.user_failure_data.description:
            return " ".join(data.user_failure_data.description.split())
        error = data.error
        while error is not None and error.cause is not None:
            error = error.cause
        if error is not None:
            return " ".join(error.message.split())
    return "see the run's logs"


def read_with_spark(dataset_id: str, version: int | None) -> dict[str, Any]:
    """The table's live rows (or its snapshot at `version`) as the blob reader's JSON document."""
    from pyspark.errors import PySparkException

    from runstate import wiring
    from runstate.spark import SparkSetupError
    from runstate.wal import state_document
    from runstate.wal.changes import validate_dataset_id
    from runstate.wal.dataset_tables import DatasetTableError, read_table

    validate_dataset_id(dataset_id)  # before a JVM is started for nothing
    try:
        spark = wiring.spark_session()
    except (SparkSetupError, PySparkException) as error:
        raise DatasetTableError(f"Spark could not start: {' '.join(str(error).split())}") from None
    spark.sparkContext.setLogLevel("ERROR")
    reached, state = read_table(spark, dataset_id, version)
    return state_document(dataset_id, reached, state)


def install(wal: click.Group) -> None:
    """Add `merge`, and wrap the blob reader's `read` so it also takes --engine and --version."""
    blob_read = wal.commands["read"]

    @click.pass_context
    def read(ctx: click.Context, engine: str, version: int | None, **options: Any) -> None:
        if engine == "blobs":
            if version is not None:
                raise click.UsageError("--version needs --engine spark (Iceberg time travel)")
            ctx.invoke(blob_read, **options)
            return
        click.echo(json.dumps(read_with_spark(options["dataset_id"], version), sort_keys=True))

    params = [
        *blob_read.params,
        click.Option(
            ["--engine"],
            type=click.Choice(ENGINES),
            default="blobs",
            show_default=True,
            help="blobs: snapshot + deltas from S3; spark: the Iceberg table lake.datasets.<name>.",
        ),
        click.Option(
            ["--version"],
            type=click.IntRange(min=0),
            default=None,
            help="With --engine spark: the table as a merge left it at this version (time travel).",
        ),
    ]
    wal.add_command(click.Command("read", callback=read, params=params, help=blob_read.help))
    wal.add_command(merge)
