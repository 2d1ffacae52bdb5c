"""The `runstate` command. Every verb calls into the core or the Dagster shell."""

from __future__ import annotations

from typing import Any

import click

from runstate import logs
from runstate.cli import db, demo, dev, events, maintenance, services, wal
from runstate.config import ConfigError, load_env_file_into_environ, settings


def domain_errors() -> tuple[type[BaseException], ...]:
    """The error roots a verb may let escape: each becomes one line and exit code 1."""
    from runstate.datastore import InvalidSchemaName
    from runstate.eventstore import EventStoreError, InvalidEvent
    from runstate.maintenance.errors import MaintenanceError
    from runstate.migrations import MigrationError
    from runstate.services.state import ServiceError
    from runstate.wal.errors import WalError

    return (
        ConfigError,
        EventStoreError,
        InvalidEvent,
        WalError,
        MaintenanceError,
        ServiceError,
        MigrationError,
        InvalidSchemaName,
    )


class RunstateGroup(click.Group):
    """The one error mapper: a domain error is a message for the user, not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except domain_errors() as error:
            raise click.ClickException(one_line(error)) from None


def one_line(error: BaseException) -> str:
    """The message on a single line: a multi-line driver message must not look like a traceback."""
    return " ".join(str(error).split()) or type(error).__name__


LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]
LOG_FORMATS = ["text", "json"]


@click.group(cls=RunstateGroup)
@click.version_option(package_name="runstate")
@click.option(
    "--log-level",
    envvar="RUNSTATE_LOG_LEVEL",
    default="WARNING",
    show_default=True,
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
)
@click.option(
    "--log-format",
    envvar="RUNSTATE_LOG_FORMAT",
    default="text",
    show_default=True,
    type=click.Choice(LOG_FORMATS),
    help="json: one object per line, with the event's fields.",
)
def main(log_level: str, log_format: str) -> None:
    """runstate: run state store, dataset WAL to blobs, and Iceberg maintenance."""
    logs.configure(log_level, log_format)
    # boto3, the Snowflake connector and Dagster read the same endpoints and credentials as Settings.
    load_env_file_into_environ()
    settings.cache_clear()
    # Every verb checks the knobs before it starts: a bad value is one `Error:` line, whichever verb
    # (or Dagster run inside it) would have read it first.
    settings()


def _log_option_after_the_verb(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """`runstate events show X --log-level DEBUG` means what `runstate --log-level DEBUG events show X` does."""
    if value is None:
        return
    chosen = ctx.find_root().params  # the root's values, so a later option keeps what an earlier one set
    chosen[param.name] = value
    logs.configure(chosen.get("log_level", "WARNING"), chosen.get("log_format", "text"))


def accept_log_options_everywhere(command: click.Command) -> None:
    """Give every verb the root's --log-level and --log-format, so they may follow the verb too."""
    command.params += [
        click.Option(
            ["--log-level"],
            type=click.Choice(LOG_LEVELS, case_sensitive=False),
            expose_value=False,
            callback=_log_option_after_the_verb,
            help="As `runstate --log-level`.",
        ),
        click.Option(
            ["--log-format"],
            type=click.Choice(LOG_FORMATS),
            expose_value=False,
            callback=_log_option_after_the_verb,
            help="As `runstate --log-format`.",
        ),
    ]
    for sub in getattr(command, "commands", {}).values():
        accept_log_options_everywhere(sub)


for module in (services, db, events, wal, maintenance, demo, dev):
    for command in module.COMMANDS:
        accept_log_options_everywhere(command)
        main.add_command(command)


if __name__ == "__main__":
    main()
