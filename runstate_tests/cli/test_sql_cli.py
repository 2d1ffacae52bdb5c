"""`runstate sql`: a statement whose first word starts no query is refused before any JVM starts; the real
command refuses what its allow lists do not name (runstate_tests/cli/test_sql_guard.py checks them
in-process), prints one `Error:` line for a failed job or an unreachable master, and never drops a column."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from runstate.cli import main
from runstate.cli.sql import QueryRefused, refuse_what_starts_no_query
from runstate.config import settings
from runstate.spark import SparkSetupError, check_master_answers

RUNSTATE = str(Path(sys.executable).parent / "runstate")


@pytest.mark.parametrize(
    ("statement", "message"),
    [
        ("", "the statement is empty"),
        ("  ; ", "the statement is empty"),
        ("DELETE FROM lake.runstate.runs", "not one that starts with DELETE"),
        ("drop table lake.runstate.runs", "not one that starts with DROP"),
        ("SELEC 1", "not one that starts with SELEC (did you mean SELECT?)"),
        ("\n  insert into t values (1)", "not one that starts with INSERT"),
    ],
)
def test_a_statement_that_starts_no_query_is_refused_without_spark(statement, message):
    with pytest.raises(QueryRefused, match=re.escape(message)):
        refuse_what_starts_no_query(statement)


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT 1",
        "with x as (select 1) select * from x",
        "VALUES (1)",
        "TABLE lake.runstate.runs",
        "FROM lake.runstate.runs SELECT *",
        "(SELECT 1)",
        "-- a comment first\nSELECT 1",
        "/* DELETE */ SELECT 1",
    ],
)
def test_what_may_be_a_query_is_left_to_sparks_parser(statement):
    refuse_what_starts_no_query(statement)


def test_the_cli_refuses_it_before_spark_could_start(monkeypatch):
    """A master Spark cannot use: had the command started a JVM, it would say "Spark could not start"."""
    monkeypatch.setenv("RUNSTATE_SPARK_MASTER", "no-such-master")
    settings.cache_clear()
    try:
        answer = CliRunner().invoke(main, ["sql", "DELETE FROM lake.runstate.runs"])
    finally:
        settings.cache_clear()

    assert answer.exit_code == 1
    assert answer.output.strip().splitlines() == [
        "Error: only a query may run here (SELECT, WITH ... SELECT, VALUES, TABLE), not one that starts with "
        "DELETE; nothing was run"
    ]


# The tests below need Spark (or, for the master's check, a store): the fixtures give the CLI the worker's
# catalog database and warehouse, so its session is the worker's shared one (getOrCreate).
@pytest.fixture
def store(pg_store):
    return pg_store


@pytest.fixture
def lake_cli(spark_settings, monkeypatch) -> Iterator[CliRunner]:
    monkeypatch.setenv("RUNSTATE_PG_URL", spark_settings.pg_url)
    monkeypatch.setenv("RUNSTATE_WAREHOUSE", str(spark_settings.warehouse_dir))
    settings.cache_clear()
    yield CliRunner()
    settings.cache_clear()


@pytest.mark.spark
def test_the_real_cli_refuses_a_script_transformation_with_one_line_and_runs_nothing(lake_cli, tmp_path):
    """The probe's first finding, through the installed command in its own process (and its own JVM)."""
    mark = tmp_path / "ran"
    statement = f"SELECT TRANSFORM(a) USING 'id; touch {mark}' AS (out) FROM VALUES (1) t(a)"

    child = subprocess.run([RUNSTATE, "sql", statement], capture_output=True, text=True, timeout=600)

    assert child.returncode == 1, (child.returncode, child.stderr[-3000:])
    assert child.stdout == ""
    [line] = child.stderr.splitlines()
    assert (
        line.startswith("Error: the query's plan holds ScriptTransformation ") and "nothing was run" in line
    )
    assert not mark.exists()


@pytest.mark.spark
def test_a_failed_task_prints_one_error_line_and_no_jvm_stack_trace(spark, lake_cli, capfd):
    """The JVM writes its log to this process's stderr (file descriptor 2), which capfd reads."""
    capfd.readouterr()

    answer = lake_cli.invoke(main, ["sql", "SELECT assert_true(id < 0) FROM range(3)"])

    jvm_err = capfd.readouterr().err
    assert answer.exit_code == 1
    [line] = answer.output.strip().splitlines()
    assert line.startswith("Error: org.apache.spark.SparkException: Job aborted") and "is not true!" in line
    assert "\tat " not in jvm_err and "Exception in task" not in jvm_err and "aborting job" not in jvm_err, (
        jvm_err[-3000:]
    )


@pytest.mark.spark
def test_json_refuses_two_columns_of_one_name_and_table_prints_both(spark, lake_cli):
    statement = "SELECT 1 AS a, 2 AS a, 3 AS b"

    as_json = lake_cli.invoke(main, ["sql", statement, "--format", "json"])
    as_table = lake_cli.invoke(main, ["sql", statement])

    assert as_json.exit_code == 1
    assert as_json.output.strip().splitlines() == [
        "Error: --format json needs distinct column names, and the result has more than one column named a: "
        "give them distinct aliases (SELECT ... AS a_2), or use --format table; nothing was run"
    ]
    assert as_table.exit_code == 0 and as_table.output.splitlines() == ["a  a  b", "1  2  3"]


def test_the_help_says_what_json_does_with_repeated_names():
    answer = CliRunner().invoke(main, ["sql", "--help"])

    assert "distinct aliases" in " ".join(answer.output.split())


@pytest.mark.parametrize("args", [["sql", "SELECT 1"], ["events", "export"]])
def test_an_unreachable_spark_master_is_one_error_line_at_once(
    store, pg_database, pg_schema, args, monkeypatch
):
    """Spark itself would retry for over a minute, then print a py4j traceback."""
    monkeypatch.setenv("RUNSTATE_PG_URL", pg_database)
    monkeypatch.setenv("RUNSTATE_SCHEMA", pg_schema)
    monkeypatch.setenv("RUNSTATE_EVENTSTORE", "postgres")
    monkeypatch.setenv("RUNSTATE_SPARK_MASTER", f"spark://127.0.0.1:{closed_port()}")
    settings.cache_clear()
    started = time.monotonic()
    try:
        answer = CliRunner().invoke(main, args)
    finally:
        settings.cache_clear()

    assert time.monotonic() - started < 30
    assert answer.exit_code == 1, answer.output
    [line] = answer.output.strip().splitlines()
    assert line.startswith("Error: Spark could not start: the Spark master spark://127.0.0.1:") and (
        "does not answer" in line
    )


def test_a_standalone_master_that_answers_passes_the_check_and_one_of_several_is_enough():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        check_master_answers(f"spark://127.0.0.1:{port}")
        check_master_answers(f"spark://127.0.0.1:{closed_port()},127.0.0.1:{port}")
    check_master_answers("local[2]")  # not a standalone master: Spark's own business
    with pytest.raises(SparkSetupError, match="does not answer"):
        check_master_answers(f"spark://127.0.0.1:{closed_port()}")


def closed_port() -> int:
    """A loopback port nothing listens on (it was free a moment ago)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
