"""`runstate wal merge` and `runstate wal read --engine spark`: the dataset tables from the command line.

`merge` is the command `runstate.commands.merge.merge_now`; this verb prints what it did.
`install(wal)` adds `merge` to the `wal` group and gives its `read` an `--engine` (blobs, the default,
or spark) and a `--version` (spark only: Iceberg time travel). Both engines print the same JSON.
"""

from __future__ import annotations

import json
from typing import Any

import click

ENGINES = ("blobs", "spark")


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
    from runstate.commands.merge import merge_now

    if rebuild and dataset_id is None:
        raise click.UsageError("--rebuild needs --dataset")
    report = merge_now(dataset_id, rebuild)
    if report.skip_reason:
        click.echo(f"skipped: {report.skip_reason}")
    for run in report.runs:
        for line in run.lines:
            click.echo(line)
    failed = report.failed
    click.echo(
        f"{len(report.runs)} merge run(s): {len(report.runs) - len(failed)} succeeded, {len(failed)} failed"
    )
    for run in failed:
        click.echo(f"  run {run.run_id} FAILED: {run.failure}", err=True)
    if failed:
        raise SystemExit(1)


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
