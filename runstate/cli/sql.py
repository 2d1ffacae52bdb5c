"""`runstate sql "SELECT ..."`: one read-only Spark SQL query on the `lake` catalog.

The run history (`lake.runstate.run_events`, `lake.runstate.runs`), the dataset tables
(`lake.datasets.*`) and every other table of the catalog, with Iceberg's metadata tables and time
travel. Only a query runs. A statement whose first word starts no query is refused before Spark starts
(a typo or a DELETE costs no JVM). Then Spark's own parser reads the statement, and anything whose plan
holds a command or a statement (INSERT, MERGE, DELETE, CALL, CREATE, DROP, SET, CACHE, EXPLAIN, ...
however it is wrapped, `WITH x AS (...) INSERT` included), more than one statement, or a call of a
function that reaches into the JVM (reflect, java_method, try_reflect) is refused with one `Error:` line
before anything runs.
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

FORMATS = ("table", "json")
# Plan nodes that are not queries: Spark's commands (DDL, DML, SET, CACHE, EXPLAIN, ...) and parsed
# statements (INSERT, and the Iceberg extensions' CALL).
STATEMENT_CLASSES = (
    "org.apache.spark.sql.catalyst.plans.logical.Command",
    "org.apache.spark.sql.catalyst.plans.logical.ParsedStatement",
)
UNRESOLVED_FUNCTION = "org.apache.spark.sql.catalyst.analysis.UnresolvedFunction"
SUBQUERY = "org.apache.spark.sql.catalyst.expressions.SubqueryExpression"
# Functions that call Java methods by name: a "query" could stop the JVM or change its state with them.
JVM_FUNCTIONS = frozenset({"reflect", "java_method", "try_reflect"})
# The words a query can start with (Spark's FROM-first form included); any other first word is refused
# before Spark starts.
QUERY_FIRST_WORDS = frozenset({"SELECT", "WITH", "VALUES", "TABLE", "FROM"})


class QueryRefused(click.ClickException):
    """The statement is not one read-only query: nothing was run."""


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
    starts with a comment or a parenthesis is left to Spark's parser (check_read_only), which decides."""
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


def check_read_only(spark: Any, statement: str) -> None:
    """QueryRefused unless `statement` parses as exactly one query that calls no JVM function."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    parser = spark._jsparkSession.sessionState().sqlParser()
    try:
        plan = parser.parsePlan(statement)
    except (PySparkException, Py4JJavaError) as error:  # PySpark makes the parser's errors its own
        raise QueryRefused(f"not one Spark SQL statement: {_message(error)}; nothing was run") from None
    kinds = _JvmClasses(spark, parser)
    for node in _plan_nodes(plan):
        if kinds.is_statement(node):
            kind = node.getClass().getSimpleName().rstrip("$")
            raise QueryRefused(
                f"only a query may run here (SELECT, WITH ... SELECT, VALUES, TABLE), not {_words(kind)} "
                f"(Spark's {kind}); nothing was run"
            )
        for name in kinds.function_names(node):
            if name in JVM_FUNCTIONS:
                raise QueryRefused(
                    f"the function {name}() calls into the JVM and is refused; nothing was run"
                )


class _JvmClasses:
    def __init__(self, spark: Any, parser: Any) -> None:
        jvm, loader = spark.sparkContext._jvm, parser.getClass().getClassLoader()
        self._load = lambda name: jvm.java.lang.Class.forName(name, False, loader)
        self.statements = [self._load(name) for name in STATEMENT_CLASSES]
        self.function, self.subquery = self._load(UNRESOLVED_FUNCTION), self._load(SUBQUERY)

    def is_statement(self, node: Any) -> bool:
        return any(kind.isAssignableFrom(node.getClass()) for kind in self.statements)

    def function_names(self, node: Any) -> list[str]:
        """The functions a plan node calls, its subqueries' included (lower case)."""
        names, pending = [], list(_seq(node.expressions()))
        while pending:
            expression = pending.pop()
            if self.function.isInstance(expression):
                names.append(str(_seq(expression.nameParts())[-1]).lower())
            if self.subquery.isInstance(expression):
                for inner in _plan_nodes(expression.plan()):
                    names += self.function_names(inner)
            pending += _seq(expression.children())
        return names


def _words(kind: str) -> str:
    """InsertIntoStatement -> INSERT INTO, DropTable -> DROP TABLE: what the statement says."""
    words = re.findall(r"[A-Z][a-z]*", kind)
    while len(words) > 1 and words[-1] in ("Statement", "Command"):
        words.pop()
    return " ".join(words).upper()


def _message(error: BaseException) -> str:
    """The first line of Spark's message: not the plan an analysis error prints after it, nor the JVM
    stack trace (a failed job's error comes from the JVM as it is: `Py4JJavaError`)."""
    from runstate.cli import one_line

    text = str(getattr(error, "java_exception", error)).strip()
    return one_line(text.splitlines()[0] if text else "")[:1000]


def _seq(scala_seq: Any) -> list[Any]:
    return [scala_seq.apply(i) for i in range(scala_seq.size())]


def _plan_nodes(plan: Any) -> list[Any]:
    """The node and every node under it: children and inner children (a WITH's definitions)."""
    found, pending = [], [plan]
    while pending:
        node = pending.pop()
        found.append(node)
        pending += _seq(node.children()) + _seq(node.innerChildren())
    return found


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

    json prints one object per row (JSON lines); table prints aligned columns."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    from runstate.cli import stop_if_signalled
    from runstate.cli.events_io import format_table
    from runstate.spark_interrupts import spark_jobs_cancelled_on_interrupt

    refuse_what_starts_no_query(statement)  # before a JVM starts for nothing
    spark = lake_session()
    check_read_only(spark, statement)
    with spark_jobs_cancelled_on_interrupt(spark, silent_once_cancelled=True):
        try:
            frame = spark.sql(statement)
            rows = frame.limit(limit + 1).collect()
        except (PySparkException, Py4JJavaError) as error:
            stop_if_signalled()  # a query cancelled by Ctrl-C or SIGTERM is no query error
            raise click.ClickException(_message(error)) from None
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
