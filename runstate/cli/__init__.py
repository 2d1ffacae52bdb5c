"""The `runstate` command. Every verb calls into the core or the Dagster shell."""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any, NoReturn

import click

from runstate import logs
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


# Each verb's module is imported when the verb is called (or listed by --help), not at start: `runstate wal
# read` imports boto3, never psycopg, the Snowflake connector or Dagster, and starts in half the time.
VERBS = {
    "db": "runstate.cli.db:db",
    "demo": "runstate.cli.demo:demo",
    "dev": "runstate.cli.dev:dev",
    "events": "runstate.cli.events:events",
    "health": "runstate.cli.maintenance:health",
    "maintenance": "runstate.cli.maintenance:maintenance",
    "services": "runstate.cli.services:services",
    "sql": "runstate.cli.sql:sql",
    "wal": "runstate.cli.wal:wal",
}


class RunstateGroup(click.Group):
    """The one error mapper: a domain error is a message for the user, not a traceback.

    `lazy_verbs` (name -> "module:attribute") are loaded on first use, and take the root's log options.
    """

    def __init__(self, *args: Any, lazy_verbs: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_verbs = lazy_verbs or {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_verbs})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy_verbs and cmd_name not in self.commands:
            module, attribute = self.lazy_verbs[cmd_name].split(":")
            command = getattr(importlib.import_module(module), attribute)
            accept_log_options_everywhere(command)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        errors = domain_errors()  # imported before the verb runs: a stop signal then raises in the verb
        try:
            try:
                return super().invoke(ctx)
            except Exception as error:
                if not isinstance(error, click.exceptions.Exit):
                    # A failure after a stop signal is the stop's doing: SIGTERM to the process group
                    # (systemd, `timeout`) stops the Spark JVM too, and py4j's calls then fail.
                    stop_if_signalled()
                raise
        except errors as error:
            raise click.ClickException(one_line(error)) from None
        except KeyboardInterrupt as interrupt:
            # Ctrl-C stops every verb; one that ran a Dagster run says which (RunInterrupted), and click
            # then prints "Aborted!" and exits 1.
            if str(interrupt):
                click.echo(f"interrupted: {interrupt}", err=True)
            raise


def one_line(error: BaseException) -> str:
    """The message on a single line: a multi-line driver message must not look like a traceback."""
    return " ".join(str(error).split()) or type(error).__name__


LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]
LOG_FORMATS = ["text", "json"]
# How soon a stop signal that came during PySpark's or py4j's code is sent again (stop_the_command).
SPARK_CALL_RETRY_S = 0.1
# Code that a stop signal must not interrupt half-way: py4j's calls, and PySpark's own code (its JVM's
# start, its Arrow collect) around them.
_SPARK_MODULES = ("py4j.", "pyspark.")
_stop_signal: int | None = None  # the stop signal that came, raised or still to be
_stop_raised = False


@click.group(cls=RunstateGroup, lazy_verbs=VERBS)
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


def entry() -> NoReturn:
    """The console script: click's exit status, then an exit that skips native static destructors.

    Python's own shutdown runs first (other threads joined, atexit handlers, streams flushed). Then
    `os._exit` ends the process without the C++ teardown of the extension modules: pyarrow's
    destructors at that point raced a native thread still alive and aborted the process (SIGABRT,
    "terminate called without an active exception") after a correct answer, a few runs in a hundred
    with every pyarrow wheel and allocator tried. A command's status is 0, 1 or 2, never a signal: SIGTERM
    stops a command as Ctrl-C does.
    """
    signal.signal(signal.SIGTERM, stop_the_command)
    for logger in (logging.getLogger(), logging.getLogger("py4j")):
        logger.addFilter(_silent_spark_after_a_stop)
    try:
        main()
        status = 0
    except SystemExit as exit_:
        status = _status_of(exit_.code)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):  # the command has ended: nothing more to stop
            signal.signal(signum, signal.SIG_IGN)
        _python_shutdown()
    os._exit(status)


def stop_the_command(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (and Ctrl-C under a Spark session) stops a command as Ctrl-C does: a KeyboardInterrupt, its
    cleanups run, one `interrupted:` line, exit 1.

    Raised inside PySpark or a py4j call, the interrupt would break things half-way: the JVM connection
    into py4j's tracebacks, or a JVM being started into one that outlives the command (PySpark deletes the
    folder it was to report its port in, and it waits for ever). There the signal is sent again a moment
    later instead, until the main thread is back in runstate's code (meanwhile each delivery cancels the
    Spark job in flight: runstate.spark_interrupts), or until the command sees the cancelled job's error
    and calls `stop_if_signalled`. One interrupt only: a signal after it changes nothing."""
    global _stop_signal
    if _stop_raised:
        return
    _stop_signal = signum
    if _in_spark_call(frame):
        threading.Timer(SPARK_CALL_RETRY_S, os.kill, (os.getpid(), signum)).start()
        return
    _raise_stop(signum)


def stop_if_signalled() -> None:
    """The interrupt of the stop signal, if one came: for a command whose Spark job just failed, cancelled
    by that signal. Raised even when the interrupt was raised once already: PySpark's Arrow collect asks
    the JVM for the job's result in a `finally`, whose cancellation error replaces the interrupt that came
    while it read the rows."""
    if _stop_signal is not None:
        _raise_stop(_stop_signal)


def _raise_stop(signum: int) -> NoReturn:
    global _stop_raised
    _stop_raised = True
    raise KeyboardInterrupt("terminated by SIGTERM" if signum == signal.SIGTERM else "")


def _silent_spark_after_a_stop(record: logging.LogRecord) -> bool:
    """Drops what py4j and PySpark log once a stop signal came: SIGTERM to the process group stops the
    JVM too, and py4j logs the broken connection ("Exception while sending command." and a traceback) on
    the root logger before the command sees the stop. That failure is the stop's, said in one line."""
    if _stop_signal is None:
        return True
    return not any(f"{os.sep}{package}{os.sep}" in record.pathname for package in ("py4j", "pyspark"))


def _in_spark_call(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith(_SPARK_MODULES):
            return True
        frame = frame.f_back
    return False


def _status_of(code: object) -> int:
    """What the interpreter would exit with for SystemExit(code)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _python_shutdown() -> None:
    # The interpreter's own order: threading's exit hooks first (concurrent.futures' tells idle pool
    # workers to stop; pyiceberg keeps such a pool, and joining its workers before that hung the
    # command for ever after a correct answer), then the non-daemon threads joined, then atexit.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing left to tell
            pass


if __name__ == "__main__":
    entry()
