"""`runstate wal append|tick|read|status`: the dataset WAL from the command line.

append, read and status build the core objects from the settings and never import dagster, so they
answer fast; tick, flush and merge are commands (`runstate.commands`): they evaluate the Dagster sensors
or execute runs in-process. Errors are WalErrors, which the CLI's one error mapper
prints as one line.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click

from runstate import wiring


def echo_json(document: Any) -> None:
    click.echo(json.dumps(document, sort_keys=True))


@click.group()
def wal() -> None:
    """The dataset WAL: append changes, drive the flush sensor, read datasets, show lag."""


@wal.command()
@click.option("--dataset", "dataset_id", required=True, help="Dataset id, e.g. orders.")
@click.option(
    "--upsert",
    "upserts",
    multiple=True,
    metavar="KEY=JSON",
    help="Set KEY (a string) to a JSON value, e.g. sku1='{\"qty\": 2}'.",
)
@click.option("--delete", "deletes", multiple=True, metavar="KEY", help="Delete KEY.")
@click.option(
    "--client-token", default=None, help="Idempotency token: a retried append with it writes one row."
)
def append(
    dataset_id: str, upserts: tuple[str, ...], deletes: tuple[str, ...], client_token: str | None
) -> None:
    """Append one WAL row of changes to a dataset; prints its SeqNo."""
    from runstate.wal import Change, WalProducer
    from runstate.wal.changes import parse_upsert

    if not upserts and not deletes:
        raise click.UsageError("give at least one --upsert KEY=JSON or --delete KEY")
    changes = [parse_upsert(text) for text in upserts] + [Change.delete(key) for key in deletes]
    seq = WalProducer.of(wiring.wal_table()).append(dataset_id, changes, client_token=client_token)
    click.echo(f"{dataset_id} seq {seq}")


@wal.command()
def tick() -> None:
    """Evaluate wal_sensor once and execute the flush runs it requests, in-process."""
    from runstate.commands.flush import tick_wal

    result = tick_wal()
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
    """Print a dataset's state (latest snapshot + deltas, checksums verified) as JSON.

    String keys are under "state", integer keys under "int_state" (JSON object keys are strings).
    """
    from runstate.wal import DatasetReader, state_document

    # The WAL table is asked only when the manifest is missing (a client costs a few tenths of a second).
    reader = DatasetReader.of(
        wiring.blob_store(),
        dataset_id,
        last_applied_seq=lambda: wiring.wal_table().meta(dataset_id).last_applied_seq,
    )
    version, state = reader.read()
    echo_json(state_document(dataset_id, version, state))


@wal.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def status(as_json: bool) -> None:
    """Per dataset: Pending row count, age of the oldest Pending row, last applied seq."""
    from runstate.wal import wal_status

    rows = wal_status(wiring.wal_table())
    if as_json:
        echo_json([dataclasses.asdict(row) for row in rows])
        return
    if not rows:
        click.echo("no datasets")
        return
    click.echo(f"{'dataset':<32} {'pending':>8} {'oldest_pending_s':>17} {'last_applied_seq':>17}")
    for row in rows:
        age = "-" if row.oldest_pending_age_s is None else f"{row.oldest_pending_age_s:.0f}"
        click.echo(f"{row.dataset_id:<32} {row.pending_count:>8} {age:>17} {row.last_applied_seq:>17}")


# The dataset tables' verbs (`wal merge`, `wal read --engine spark`) live in their own module.
from runstate.cli import dataset_tables  # noqa: E402

dataset_tables.install(wal)

# `wal flush`: flush now, in-process, fenced against live shard runs.
from runstate.cli import wal_flush  # noqa: E402

wal_flush.install(wal)
