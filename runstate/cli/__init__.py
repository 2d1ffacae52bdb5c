"""The `runstate` command. Every verb calls into the core or the Dagster shell."""

from __future__ import annotations

import click

from runstate.cli import db, demo, dev, events, maintenance, services, wal
from runstate.config import load_env_file_into_environ, settings


@click.group()
@click.version_option(package_name="runstate")
def main() -> None:
    """runstate: run state store, dataset WAL to blobs, and Iceberg maintenance."""
    # boto3, the Snowflake connector and Dagster read the same endpoints and credentials as Settings.
    load_env_file_into_environ()
    settings.cache_clear()


for module in (services, db, events, wal, maintenance, demo, dev):
    for command in module.COMMANDS:
        main.add_command(command)


if __name__ == "__main__":
    main()
