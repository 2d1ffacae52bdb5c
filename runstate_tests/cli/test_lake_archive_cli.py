"""`runstate events show|restore|archive` on runs archived to the lake whose files are gone (issue 51,
MEDIUM): one `Error:` line naming the run and the file, exit 1, nothing changed (tracebacks of 60-80 lines
before). Through click's CliRunner on the worker's Spark catalog, and once as a real process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result

from runstate.cli import main
from runstate.config import settings
from runstate.eventstore import EventType
from runstate.eventstore.lake import HistoryConfig
from runstate.eventstore.lake.reader import HistoryCatalog
from runstate_tests.support.events import ev
from runstate_tests.support.lake import exported_to_the_end

pytestmark = [pytest.mark.spark]
RUNSTATE = str(Path(sys.executable).parent / "runstate")


@pytest.fixture
def store(pg_store):
    """The test's schema in the worker's database, where the catalog is."""
    return pg_store


@pytest.fixture
def env(spark_settings, pg_schema, history) -> dict[str, str]:
    return {
        "RUNSTATE_PG_URL": spark_settings.pg_url,
        "RUNSTATE_SCHEMA": pg_schema,
        "RUNSTATE_EVENTSTORE": "postgres",
        "RUNSTATE_WAREHOUSE": str(spark_settings.warehouse_dir),
        "RUNSTATE_HISTORY_NAMESPACE": history.namespace,
        "RUNSTATE_ARCHIVE_TO": "lake",
    }


@pytest.fixture
def cli(env, monkeypatch) -> Iterator[CliRunner]:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings.cache_clear()
    yield CliRunner()
    settings.cache_clear()


def run(cli: CliRunner, *args: str) -> Result:
    return cli.invoke(main, list(args))


def finished_run(store: Any, run_id: str, day: int) -> None:
    start = day * 86_400
    store.append_batch(
        run_id,
        [ev(run_id, EventType.RUN_STARTED, start), ev(run_id, EventType.RUN_COMPLETED, start + 60)],
    )


def local(path: str) -> Path:
    return Path(path.removeprefix("file:").removeprefix("//"))


def data_file_of(spark: Any, history: HistoryConfig, run_id: str) -> Path:
    (row,) = spark.sql(
        f"SELECT DISTINCT _file FROM {history.events_table} WHERE run_id = '{run_id}'"
    ).collect()
    return local(row[0])


def postgres_state(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    """Every stream row and how many events each table holds of it: what "nothing changed" compares."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            f"SELECT s.run_id, s.lake_upto, s.lake_events, s.archived_at,"
            f" (SELECT count(*) FROM {schema}.run_events e WHERE e.run_id = s.run_id),"
            f" (SELECT count(*) FROM {schema}.run_events_archive a WHERE a.run_id = s.run_id)"
            f" FROM {schema}.run_streams s ORDER BY s.run_id"
        ).fetchall()


@pytest.fixture
def archived(spark, cli, store, history) -> Any:
    """old-a and old-b archived to the lake (each exported in a commit of its own), old-c exported only."""
    finished_run(store, "old-a", 0)
    exported_to_the_end(spark, store, history)
    finished_run(store, "old-b", 1)
    exported_to_the_end(spark, store, history)
    assert run(cli, "events", "archive", "--older-than-days", "30").exit_code == 0
    finished_run(store, "old-c", 2)
    exported_to_the_end(spark, store, history)
    return store


def one_error_line(result: Result, *parts: str) -> str:
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def test_a_missing_data_file_is_one_error_line_for_show_restore_and_archive(
    spark, cli, archived, history, spark_settings, pg_schema
):
    gone = data_file_of(spark, history, "old-a")
    kept = data_file_of(spark, history, "old-c")
    gone.unlink()
    kept.unlink()
    before = postgres_state(spark_settings.pg_url, pg_schema)

    show = run(cli, "events", "show", "old-a")
    restore = run(cli, "events", "restore", "old-a")
    archive = run(cli, "events", "archive", "--older-than-days", "30")

    one_error_line(show, "run 'old-a'", gone.name)
    one_error_line(restore, "run 'old-a'", gone.name)
    one_error_line(archive, "archived 0 event(s)", "run 'old-c'", kept.name)
    assert postgres_state(spark_settings.pg_url, pg_schema) == before
    assert run(cli, "events", "show", "old-b").exit_code == 0


def test_a_missing_metadata_file_is_one_error_line_for_show_restore_and_archive(
    cli, archived, history, spark_settings, pg_schema
):
    catalog = HistoryCatalog(spark_settings.pg_url, spark_settings.warehouse_dir)
    metadata = local(catalog.load(history.namespace, "run_events").metadata_location)
    catalog.close()
    metadata.unlink()
    before = postgres_state(spark_settings.pg_url, pg_schema)

    for args in (("show", "old-a"), ("restore", "old-a"), ("archive", "--older-than-days", "30")):
        one_error_line(run(cli, "events", *args), history.events_table, metadata.name)
    assert postgres_state(spark_settings.pg_url, pg_schema) == before


def test_a_real_process_prints_one_error_line_for_a_run_whose_file_is_gone(spark, archived, history, env):
    gone = data_file_of(spark, history, "old-b")
    gone.unlink()

    child = subprocess.run(
        [RUNSTATE, "events", "show", "old-b"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert child.returncode == 1, child.stderr
    assert child.stdout == "" and len(child.stderr.strip().splitlines()) == 1, child.stderr
    assert child.stderr.startswith("Error: run 'old-b'") and gone.name in child.stderr, child.stderr
