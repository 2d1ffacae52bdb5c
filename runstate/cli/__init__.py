"""The `runstate` command. Every verb calls into the core or the Dagster shell."""

from __future__ import annotations

import click

from runstate.cli import db, demo, dev, events, maintenance, services, wal


@click.group()
@click.version_option(package_name="runstate")
def main() -> None:
    """runstate: run state store, dataset WAL to blobs, and Iceberg maintenance."""


for module in (services, db, events, wal, maintenance, demo, dev):
    for command in module.COMMANDS:
        main.add_command(command)


if __name__ == "__main__":
    main()
