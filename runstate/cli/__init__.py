"""The `runstate` command. Every verb calls into the core or the Dagster shell."""

from __future__ import annotations

import click

from runstate import logs
from runstate.cli import db, demo, dev, events, maintenance, services, wal
from runstate.config import load_env_file_into_environ, settings


@click.group()
@click.version_option(package_name="runstate")
@click.option("--log-level", envvar="RUNSTATE_LOG_LEVEL", default="WARNING", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.option("--log-format", envvar="RUNSTATE_LOG_FORMAT", default="text", show_default=True,
              type=click.Choice(["text", "json"]), help="json: one object per line, with the event's fields.")
def main(log_level: str, log_format: str) -> None:
    """runstate: run state store, dataset WAL to blobs, and Iceberg maintenance."""
    logs.configure(log_level, log_format)
    # boto3, the Snowflake connector and Dagster read the same endpoints and credentials as Settings.
    load_env_file_into_environ()
    settings.cache_clear()


for module in (services, db, events, wal, maintenance, demo, dev):
    for command in module.COMMANDS:
        main.add_command(command)


if __name__ == "__main__":
    main()
