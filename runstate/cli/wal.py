"""`runstate wal append|tick|read|status`: the dataset WAL from the command line."""

from __future__ import annotations

import json
import dataclasses
from typing import Any

import click
from botocore.exceptions import BotoCoreError, ClientError

SENSOR_NAME = "wal_sensor"


def _resource():
    """Outside a run there is no Dagster config resolution: a plain resource; boto3 finds the credentials."""
    from runstate.defs.wal.resources import WalResource

    return WalResource()


def _aws_error(error: Exception, wal: Any) -> click.ClickException:
    """Turn an AWS failure into one line that names the table or bucket and where it was looked for."""
    code = error.response["Error"]["Code"] if isinstance(error, ClientError) else type(error).__name__
    where = wal.resolved_endpoint_url or "AWS"
    if code == "ResourceNotFoundException":
        return click.ClickException(
            f"WAL table {wal.table_name!r} not found at {where}; run `runstate services up` or `runstate db upgrade`"
        )
    if code in ("NoSuchBucket", "404"):
        return click.ClickException(f"blob bucket {wal.bucket_name!r} not found at {where}")
    return click.ClickException(f"AWS call to {where} failed: {error}")


def _parse_upsert(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise click.BadParameter(f"{text!r} is not KEY=JSON", param_hint="--upsert")
    try:
        return key, json.loads(raw)
    except ValueError:
        raise click.BadParameter(f"value of {key!r} is not JSON: {raw!r}", param_hint="--upsert") from None


@click.group()
def wal() -> None:
    """The dataset WAL: append changes, drive the flush sensor, read datasets, show lag."""


@wal.command()
@click.option("--dataset", "dataset_id", required=True, help="Dataset id, e.g. orders.")
@click.option("--upsert", "upserts", multiple=True, metavar="KEY=JSON", help='Set KEY to a JSON value, e.g. sku1=\'{"qty": 2}\'.')
@click.option("--delete", "deletes", multiple=True, metavar="KEY", help="Delete KEY.")
@click.option("--client-token", default=None, help="Idempotency token: a retried append with it writes one row.")
def append(dataset_id: str, upserts: tuple[str, ...], deletes: tuple[str, ...], client_token: str | None) -> None:
    """Append one WAL row of changes to a dataset; prints its SeqNo."""
    from runstate.wal import Change, WalInputError, WalProducer

    if not upserts and not deletes:
        raise click.UsageError("give at least one --upsert KEY=JSON or --delete KEY")
    resource = _resource()
    try:
        changes = [Change.upsert(*_parse_upsert(u)) for u in upserts] + [Change.delete(k) for k in deletes]
        seq = WalProducer(resource.dynamodb_client(), resource.table_name).append(dataset_id, changes, client_token=client_token)
    except WalInputError as error:
        raise click.ClickException(str(error)) from None
    except (ClientError, BotoCoreError) as error:
        raise _aws_error(error, resource) from None
    click.echo(f"{dataset_id} seq {seq}")


@wal.command()
def tick() -> None:
    """Evaluate wal_sensor once and execute the flush runs it requests, in-process."""
    from runstate.defs.ticking import tick_sensor

    resource = _resource()
    try:
        result = tick_sensor(SENSOR_NAME)
    except (ClientError, BotoCoreError) as error:
        raise _aws_error(error, resource) from None
    if result.skip_reason and not result.requested:
        click.echo(f"skipped: {result.skip_reason}")
    click.echo(
        f"requested {result.requested} run(s): {result.succeeded} succeeded, {result.failed} failed, "
        f"{len(result.skipped_run_keys)} already launched"
    )
    for run in result.results:
        if not run.success:
            click.echo(f"  run {run.run_id} FAILED", err=True)
    if result.failed:
        raise SystemExit(1)


@wal.command()
@click.option("--dataset", "dataset_id", required=True, help="Dataset id.")
def read(dataset_id: str) -> None:
    """Print a dataset's state (latest snapshot + deltas, checksums verified) as JSON."""
    from runstate.wal import DatasetReader, WalError, WalInputError
    from runstate.wal.changes import validate_dataset_id

    resource = _resource()
    try:
        validate_dataset_id(dataset_id)
        reader = DatasetReader(resource.s3_client(), resource.bucket_name, resource.blob_prefix, dataset_id)
        state = reader.state()
        version = reader.version
    except WalInputError as error:
        raise click.ClickException(str(error)) from None
    except WalError as error:
        raise click.ClickException(str(error)) from None
    except (ClientError, BotoCoreError) as error:
        raise _aws_error(error, resource) from None
    click.echo(json.dumps({"dataset": dataset_id, "version": version, "state": state}, sort_keys=True, default=str))


@wal.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def status(as_json: bool) -> None:
    """Per dataset: Pending row count, age of the oldest Pending row, last applied seq."""
    from runstate.wal import wal_status

    resource = _resource()
    try:
        rows = wal_status(resource.dynamodb_client(), resource.table_name)
    except (ClientError, BotoCoreError) as error:
        raise _aws_error(error, resource) from None
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(row) for row in rows], sort_keys=True))
        return
    if not rows:
        click.echo("no datasets")
        return
    click.echo(f"{'dataset':<32} {'pending':>8} {'oldest_pending_s':>17} {'last_applied_seq':>17}")
    for row in rows:
        age = "-" if row.oldest_pending_age_s is None else f"{row.oldest_pending_age_s:.0f}"
        click.echo(f"{row.dataset_id:<32} {row.pending_count:>8} {age:>17} {row.last_applied_seq:>17}")


COMMANDS = [wal]


# The dataset tables' verbs (`wal merge`, `wal read --engine spark`) live in their own module.
from runstate.cli import lake  # noqa: E402

lake.install(wal)
