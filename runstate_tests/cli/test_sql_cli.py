"""`runstate sql` refuses, before any JVM starts, a statement whose first word starts no query."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from runstate.cli import main
from runstate.cli.sql import QueryRefused, refuse_what_starts_no_query
from runstate.config import settings


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
