"""`runstate events export [--once]`: export the feed into the run history in the lake now, in-process.

The same command a `run_history` run executes (`runstate.eventstore.lake.export_history`), on a Spark
session of this process: every event after the table's position, a batch per Iceberg commit, then the
runs merged; each commit is printed as it lands. Safe beside the sensor's runs: a commit another export
beat is refused whole, and this export carries on from where that one got (with --once, it stops with one
`Error:` line).
"""

from __future__ import annotations

import click


@click.command("export")
@click.option("--once", is_flag=True, help="Commit one batch only (default: export until the feed's end).")
def export(once: bool) -> None:
    """Export the run state store's feed into lake.<ns>.run_events and .runs (Postgres stores only)."""
    from runstate.cli import stop_if_signalled
    from runstate.cli.events_io import open_store
    from runstate.cli.sql import lake_session
    from runstate.config import settings
    from runstate.eventstore.lake import ExportTally, HistoryConfig, HistoryError, check_feed, export_history
    from runstate.spark_interrupts import spark_jobs_cancelled_on_interrupt

    history = HistoryConfig.from_settings(settings())
    with open_store() as store:
        check_feed(store)  # before a JVM starts for nothing
        tally = ExportTally()
        spark = lake_session()
        with spark_jobs_cancelled_on_interrupt(spark, silent_once_cancelled=True):
            try:
                for step in export_history(spark, store, history, once=once):
                    click.echo(step.describe())
                    tally.add(step)
            except HistoryError:
                stop_if_signalled()  # a commit cancelled by Ctrl-C or SIGTERM wrote nothing: no failure of it
                raise
    if tally.commits:
        click.echo(f"{tally.events} event(s) exported to {history.events_table} in {tally.commits} commit(s)")
    elif not tally.runs_merged:  # a merge folds at least one run
        click.echo(
            f"nothing to export: {history.events_table} and {history.runs_table} have every event of the feed"
        )
