"""`runstate sql "SELECT ..."`: one read-only Spark SQL query on the `lake` catalog.

The run history (`lake.runstate.run_events`, `lake.runstate.runs`), the dataset tables
(`lake.datasets.*`) and every other table of the catalog, with Iceberg's metadata tables and time
travel. Only a query runs. A statement whose first word starts no query is refused before Spark starts
(a typo or a DELETE costs no JVM). Then runstate.cli.sql_guard decides, on Spark's parsed and analysed
plans, with allow lists: a query of the lake's Iceberg tables, made of SELECT's operators and Spark's
built-in functions (reflect and java_method left out), runs; anything else is refused with one `Error:`
line before anything runs.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import signal
import threading
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import click

from runstate.cli.sql_guard import QueryRefused, first_line, read_only_query

FORMATS = ("table", "json")
# The words a query can start with (Spark's FROM-first form included); any other first word is refused
# before Spark starts.
QUERY_FIRST_WORDS = frozenset({"SELECT", "WITH", "VALUES", "TABLE", "FROM"})
__all__ = ["QueryRefused", "lake_session", "refuse_what_starts_no_query", "sql"]


def lake_session() -> Any:
    """The deployment's Spark session (RUNSTATE_SPARK_*), its current catalog `lake`; one error line if
    Spark cannot start."""
    from pyspark.errors import PySparkException

    from runstate import wiring
    from runstate.cli import one_line, stop_the_command
    from runstate.spark import SparkSetupError

    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:  # Ctrl-C while the JVM starts: as SIGTERM, not a JVM left running (stop_the_command)
        signal.signal(signal.SIGINT, stop_the_command)
    try:
        spark = wiring.spark_session()
    except (SparkSetupError, PySparkException) as error:
        raise click.ClickException(f"Spark could not start: {one_line(error)}") from None
    spark.sparkContext.setLogLevel("ERROR")
    spark.catalog.setCurrentCatalog("lake")
    if main_thread:
        # The session put PySpark's own Ctrl-C handler in place: it calls the JVM from inside the handler
        # and raises inside the py4j call in flight, which breaks it into tracebacks.
        signal.signal(signal.SIGINT, stop_the_command)
    return spark


def refuse_what_starts_no_query(statement: str) -> None:
    """QueryRefused, without Spark, when the statement is empty or its first word starts no query; one that
    starts with a comment or a parenthesis is left to Spark's parser (sql_guard), which decides."""
    text = statement.strip().rstrip(";").strip()
    if not text:
        raise QueryRefused("the statement is empty: give one query; nothing was run")
    word = re.match(r"[A-Za-z_]+", text)
    if word and word.group().upper() not in QUERY_FIRST_WORDS:
        first = word.group().upper()
        close = difflib.get_close_matches(first, sorted(QUERY_FIRST_WORDS), n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise QueryRefused(
            f"only a query may run here (SELECT, WITH ... SELECT, VALUES, TABLE), not one that starts "
            f"with {first}{hint}; nothing was run"
        )


def _plain(value: Any) -> Any:
    """A collected value as JSON: timestamps in UTC ISO 8601, structs as objects, decimals as text."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()  # PySpark gives naive local times
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return value.hex()
    if hasattr(value, "asDict"):
        return {key: _plain(item) for key, item in value.asDict().items()}
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    plain = _plain(value)
    return plain if isinstance(plain, str) else json.dumps(plain, sort_keys=True)


@click.command()
@click.argument("statement")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    help="Print at most this many rows.",
)
def sql(statement: str, fmt: str, limit: int) -> None:
    """Run one read-only Spark SQL query on the lake catalog (run history, dataset tables, ...).

    Only the lake's Iceberg tables (their metadata tables and time travel too) and Spark's built-in
    functions, except reflect and java_method; anything else is refused before it runs (docs/OPERATIONS.md,
    "What `runstate sql` can read"). json prints one object per row (JSON lines), so it refuses a result
    with two columns of one name (give them distinct aliases); table prints aligned columns."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    from runstate.cli import stop_if_signalled
    from runstate.cli.events_io import format_table
    from runstate.spark_interrupts import spark_jobs_cancelled_on_interrupt

    refuse_what_starts_no_query(statement)  # before a JVM starts for nothing
    spark = lake_session()
    with spark_jobs_cancelled_on_interrupt(spark, silent_once_cancelled=True):
        try:
            frame = read_only_query(spark, statement)
            if fmt == "json":
                refuse_repeated_names(frame.columns)
            rows = frame.limit(limit + 1).collect()
        except (PySparkException, Py4JJavaError) as error:
            stop_if_signalled()  # a query cancelled by Ctrl-C or SIGTERM is no query error
            raise click.ClickException(first_line(error)) from None
    columns = frame.columns
    if fmt == "json":
        for row in rows[:limit]:
            click.echo(json.dumps(dict(zip(columns, _plain(list(row)))), sort_keys=False))
    else:
        click.echo(
            format_table(tuple(columns), [tuple(_cell(value) for value in row) for row in rows[:limit]])
        )
    if len(rows) > limit:
        click.echo(f"(the first {limit} rows; --limit N for more)", err=True)


def refuse_repeated_names(columns: list[str]) -> None:
    """QueryRefused when two columns share a name: a JSON object keeps only the last of them."""
    repeated = sorted({name for name in columns if columns.count(name) > 1})
    if repeated:
        names = ", ".join(repeated)
        raise QueryRefused(
            f"--format json needs distinct column names, and the result has more than one column named "
            f"{names}: give them distinct aliases (SELECT ... AS {repeated[0]}_2), or use --format table; "
            "nothing was run"
        )
