"""`runstate dev`: the Dagster UI and daemon on 127.0.0.1, on the same services as the CLI and tests."""

from __future__ import annotations

import os
import sys

import click

from runstate.config import load_env_file_into_environ


@click.command()
@click.option("--port", type=int, default=3000, show_default=True, help="Port for the Dagster webserver.")
@click.option(
    "--no-services", is_flag=True, help="Do not run `services up` first (use the configured endpoints)."
)
def dev(port: int, no_services: bool) -> None:
    """Start `dagster dev` (webserver + daemon); stops cleanly on SIGINT or SIGTERM."""
    from runstate import services as svc  # here, not at import: the other verbs need no Postgres driver
    from runstate.commands.instance import limit_spark_pool_at
    from runstate.services.dev import run_dagster_dev

    if not no_services:
        report = svc.up(log=click.echo)
        click.echo(limit_spark_pool_at(report.env["DAGSTER_PG_URL"]))
    load_env_file_into_environ()
    sys.exit(run_dagster_dev(port, os.environ))
