"""`runstate events export` and `runstate sql` through click's CliRunner, on the worker's Spark session.

The CLI's session is the worker's shared one (getOrCreate), so the CLI is pointed at the same catalog
database and warehouse; its store is the test's schema in that database, its lake namespace the test's.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner, Result

from runstate.cli import main
from runstate.config import settings
from runstate.eventstore import EventType
from runstate.wal.changes import Change
from runstate.wal.dataset_tables import BlobLocation, merge_dataset, table_ident
from runstate_tests.support import lake
from runstate_tests.support.devserver import poll
from runstate_tests.support.events import ev
from runstate_tests.support.lake import append_randomly, exported_to_the_end, feed_from_start
from runstate_tests.support.procfs import command_line, kill_marked, processes_marked, thread_names

pytestmark = [pytest.mark.spark]
README = Path(__file__).resolve().parents[2] / "docs" / "ARCHITECTURE.md"  # moved from the README (issue 53)
RUNSTATE = str(Path(sys.executable).parent / "runstate")
# The root conftest's fixtures: a lake namespace of the test's own (history), a WAL, its feed and dataset ids.


@pytest.fixture
def store(pg_store):
    """The test's schema in the worker's database, where the catalog is."""
    return pg_store


@pytest.fixture
def cli(spark, spark_settings, pg_schema, store, history, monkeypatch) -> Iterator[CliRunner]:
    for name, value in {
        "RUNSTATE_PG_URL": spark_settings.pg_url,
        "RUNSTATE_SCHEMA": pg_schema,
        "RUNSTATE_EVENTSTORE": "postgres",
        "RUNSTATE_WAREHOUSE": str(spark_settings.warehouse_dir),
        "RUNSTATE_HISTORY_NAMESPACE": history.namespace,
        "RUNSTATE_HISTORY_BATCH_EVENTS": "10",
    }.items():
        monkeypatch.setenv(name, value)
    settings.cache_clear()
    yield CliRunner()
    settings.cache_clear()


def run(cli: CliRunner, *args: str) -> Result:
    return cli.invoke(main, list(args))


def test_export_once_then_to_the_end_then_nothing_and_sql_reads_it(spark, cli, store, history):
    append_randomly(store, random.Random(41), runs=4, appends=12)

    once = run(cli, "events", "export", "--once")
    rest = run(cli, "events", "export")
    again = run(cli, "events", "export")
    counted = run(
        cli,
        "sql",
        f"SELECT event_type, count(*) AS n FROM {history.namespace}.run_events GROUP BY event_type",
        "--format",
        "json",
    )
    statuses = run(cli, "sql", f"SELECT run_id, status FROM lake.{history.namespace}.runs ORDER BY run_id")

    feed = feed_from_start(store)
    assert once.exit_code == 0 and once.output.splitlines()[-1].startswith("10 event(s) exported to"), (
        once.output
    )
    assert rest.exit_code == 0 and f"{len(feed) - 10} event(s) exported" in rest.output, rest.output
    assert again.exit_code == 0 and again.output.startswith("nothing to export"), again.output
    assert counted.exit_code == 0, counted.output
    rows = [json.loads(line) for line in counted.output.splitlines()]
    assert {row["event_type"]: row["n"] for row in rows} == Counter(event.event_type for event in feed)
    runs = sorted({event.run_id for event in feed})
    assert statuses.output.splitlines() == [
        line.rstrip()
        for line in ["run_id  status", *(f"{run_id}  {store.project(run_id).status}" for run_id in runs)]
    ]


@pytest.mark.parametrize("batch_events", ["10", "100000"], ids=["in-the-commits", "in-the-runs-merge"])
def test_sigterm_stops_an_export_with_one_line_and_exit_1_and_the_next_export_finishes(
    spark, cli, store, history, batch_events, monkeypatch
):
    """A real SIGTERM to a `runstate events export` process right after its first commit: between or inside
    its commits (batches of 10), or inside its runs merge (one batch). It exits 1 saying so, never by the
    signal, with no JVM log of the cancelled job, and what it committed stands."""
    monkeypatch.setenv("RUNSTATE_HISTORY_BATCH_EVENTS", batch_events)
    append_randomly(store, random.Random(43), runs=5, appends=150)
    child = subprocess.Popen(
        [RUNSTATE, "events", "export"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    first = child.stdout.readline()
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=120)

    assert "committed to" in first, (first, err[-2000:])
    assert child.returncode == 1, (child.returncode, err[-2000:])
    assert "interrupted: terminated by SIGTERM" in err.splitlines(), err[-3000:]
    assert "Traceback" not in err and "Exception" not in err and " ERROR " not in err, err[-3000:]
    # The rest in one batch: at ten events a commit, as the stopped export took them, it was another dozen
    # Iceberg commits of that kind, 16 of the test's 40 CPU-s; where the next export starts is the same.
    monkeypatch.setenv("RUNSTATE_HISTORY_BATCH_EVENTS", "100000")
    settings.cache_clear()
    assert run(cli, "events", "export").exit_code == 0
    lake.assert_lake_equals_feed(spark, store, history)


def test_three_exports_racing_in_their_own_processes_all_succeed_and_write_every_event_once(
    spark, cli, store, history
):
    """Real concurrent writers: each commit or merge another export beat carries on from the winner's
    position (batches of 10: they collide often), so every export exits 0 and the lake equals the feed."""
    append_randomly(store, random.Random(45), runs=6, appends=50)
    exports = [
        subprocess.Popen(
            [RUNSTATE, "events", "export"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    answers = [child.communicate(timeout=600) for child in exports]

    for child, (_out, err) in zip(exports, answers, strict=True):
        assert child.returncode == 0, (child.returncode, err[-3000:])
        assert err == "", err[-3000:]  # no JVM notice of a refused commit either
    lake.assert_lake_equals_feed(spark, store, history)


@pytest.fixture
def process_mark(monkeypatch) -> Iterator[str]:
    """A mark in the environment of every process the test starts; whatever still holds it at the end,
    after a failure, is killed (a query of 10^13 rows would otherwise hold a core for hours)."""
    mark = f"runstate-test-{uuid.uuid4().hex}"
    monkeypatch.setenv("RUNSTATE_TEST_MARK", mark)
    yield mark
    kill_marked(mark)


def test_sigterm_while_the_jvm_starts_stops_the_command_and_leaves_no_jvm_behind(cli, process_mark):
    """Raised while PySpark waits for its JVM to start, the interrupt left a JVM running for good (PySpark
    deletes the folder the JVM was to report its port in): the signal waits until the session is up."""
    child = subprocess.Popen(
        [RUNSTATE, "sql", "SELECT 1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    poll(
        lambda: [pid for pid in processes_marked(process_mark) if "java" in command_line(pid)],
        timeout=120,
        every=0.05,
        what="the command's JVM starting",
    )
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=300)

    assert child.returncode == 1, (child.returncode, err[-2000:])
    assert "interrupted: terminated by SIGTERM" in err.splitlines() and "Traceback" not in err, err[-3000:]
    # The JVM ends once its Python is gone.
    poll(
        lambda: not processes_marked(process_mark),
        timeout=60,
        every=0.5,
        what="every process of the command gone",
    )


def _running_a_spark_task(jvms: list[int]) -> bool:
    """One of the JVMs runs a Spark task: its executor's task thread ("Executor task launch worker for
    task ...") exists."""
    return any(name.startswith("Executor task") for pid in jvms for name in thread_names(pid))


def test_sigterm_to_the_process_group_stops_sql_with_one_line_and_exit_1(cli, process_mark):
    """What systemd and `timeout` do: SIGTERM to the whole process group, the Spark JVM included. The JVM
    then dies under the query, and py4j's calls failed with 40-80 lines of tracebacks: a failure after
    a stop signal is the stop's, one `interrupted:` line and exit 1, whatever the command was doing."""
    statement = "SELECT count(*) FROM range(100000000) a CROSS JOIN range(100000) b"
    child = subprocess.Popen(
        [RUNSTATE, "sql", statement],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    jvms = poll(
        lambda: [pid for pid in processes_marked(process_mark) if "java" in command_line(pid)],
        timeout=120,
        every=0.05,
        what="the command's JVM starting",
    )
    poll(lambda: _running_a_spark_task(jvms), timeout=300, every=0.05, what="the command's query running")
    os.killpg(child.pid, signal.SIGTERM)
    out, err = child.communicate(timeout=300)

    assert child.returncode == 1, (child.returncode, err[-2000:])
    assert "interrupted: terminated by SIGTERM" in err.splitlines(), err[-3000:]
    assert "Traceback" not in err and "Error" not in err, err[-3000:]
    poll(
        lambda: not processes_marked(process_mark),
        timeout=60,
        every=0.5,
        what="every process of the command gone",
    )


def test_a_statement_that_is_not_one_query_is_refused_before_anything_runs(spark, cli, store, history):
    append_randomly(store, random.Random(42), runs=2, appends=3)
    assert run(cli, "events", "export").exit_code == 0
    t = f"lake.{history.namespace}.run_events"
    snapshots = spark.table(f"{t}.snapshots").count()
    hostile = [
        f"INSERT INTO {t} SELECT * FROM {t}",
        f"DROP TABLE {t}",
        f"CALL lake.system.expire_snapshots(table => '{history.namespace}.run_events', retain_last => 1)",
        f"WITH x AS (SELECT * FROM {t}) INSERT INTO {t} SELECT * FROM x",
        f"FROM {t} INSERT INTO {t} SELECT *",
        f"SELECT 1; DROP TABLE {t}",
        "SET spark.sql.shuffle.partitions=1",
        f"CREATE TABLE lake.{history.namespace}.evil (a INT)",
        f"CREATE TABLE lake.{history.namespace}.evil AS SELECT * FROM {t}",
        f"DELETE FROM {t} WHERE true",
        f"UPDATE {t} SET event_type = 'x'",
        f"MERGE INTO {t} a USING {t} b ON a.position = b.position WHEN MATCHED THEN DELETE",
        f"ALTER TABLE {t} SET TBLPROPERTIES ('evil' = 'yes')",
        f"CACHE TABLE {t}",
        "CACHE TABLE evil AS SELECT 1",
        "EXPLAIN SELECT 1",
        "ADD JAR /tmp/evil.jar",
        "SELECT reflect('java.lang.System', 'exit', 1)",
        "SELECT * FROM (SELECT JAVA_METHOD('java.lang.System', 'exit', 1) AS x)",
        "WITH x AS (SELECT try_reflect('java.lang.System', 'exit', 1) AS y) SELECT * FROM x",
        "SELECT (SELECT max(`reflect`('java.lang.System', 'exit', 1)))",
        "",
        "SELEC 1",
    ]

    answers = {statement: run(cli, "sql", statement) for statement in hostile}

    for statement, answer in answers.items():
        lines = answer.output.strip().splitlines()
        assert answer.exit_code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), (
            statement,
            lines,
        )
        assert "nothing was run" in lines[0], (statement, lines)
    assert spark.table(f"{t}.snapshots").count() == snapshots
    assert [row.tableName for row in spark.sql(f"SHOW TABLES IN lake.{history.namespace}").collect()] == [
        "run_events",
        "runs",
    ]
    assert spark.conf.get("spark.sql.shuffle.partitions") == "4" and not spark.catalog.isCached(t)
    assert spark.sql("SELECT 1 AS alive").first().alive == 1  # the JVM was not stopped


def test_a_query_of_an_unknown_table_is_one_error_line(cli):
    answer = run(cli, "sql", "SELECT * FROM lake.no_such_namespace.no_such_table")

    assert answer.exit_code == 1
    [line] = answer.output.strip().splitlines()
    assert line.startswith("Error: ") and "TABLE_OR_VIEW_NOT_FOUND" in line


def test_a_query_whose_spark_job_fails_is_one_error_line(spark, cli, store, history):
    """A job's failure comes from the JVM as it is (not one of PySpark's errors): one line, no trace."""
    append_randomly(store, random.Random(44), runs=2, appends=3)
    assert run(cli, "events", "export").exit_code == 0
    for row in spark.sql(f"SELECT DISTINCT _file FROM {history.events_table}").collect():
        Path(urlsplit(row._file).path).unlink()

    answer = run(cli, "sql", f"SELECT count(DISTINCT run_id) AS runs FROM {history.events_table}")

    assert answer.exit_code == 1, answer.output
    [line] = answer.output.strip().splitlines()
    assert line.startswith("Error: org.apache.spark.SparkException: ") and "\tat " not in line, line
    assert "Traceback" not in answer.output


def test_sql_serves_the_dataset_tables(spark, cli, wal, feed, dataset_ids):
    dataset_id = dataset_ids("orders")
    feed.append(dataset_id, [Change.upsert("a", {"qty": 1}), Change.upsert("b", 2), Change.delete("a")])
    feed.flush(dataset_id)
    merge_dataset(spark, BlobLocation(wal.bucket, wal.prefix, endpoint_url=wal.endpoint), dataset_id)

    answer = run(
        cli, "sql", f"SELECT key, value FROM {table_ident(dataset_id)} WHERE NOT deleted", "--format", "json"
    )

    assert answer.exit_code == 0, answer.output
    assert [json.loads(line) for line in answer.output.splitlines()] == [{"key": '"b"', "value": "2"}]


def test_export_from_a_snowflake_store_is_refused(cli, sf_store, snowflake_schema, monkeypatch):
    conn_kwargs, schema = snowflake_schema
    for key in ("account", "user", "password", "database", "host", "port", "protocol", "network_timeout"):
        monkeypatch.setenv(f"SNOWFLAKE_{key.upper()}", str(conn_kwargs[key]))
    monkeypatch.setenv("SNOWFLAKE_SCHEMA", schema)
    monkeypatch.setenv("RUNSTATE_EVENTSTORE", "snowflake")
    settings.cache_clear()

    answer = run(cli, "events", "export")

    assert answer.exit_code == 1
    [line] = answer.output.strip().splitlines()
    assert line.startswith("Error: the run history is exported from a Postgres event store only")


def test_the_readmes_example_queries_run(spark, cli, store, history):
    section = README.read_text().split("\n## Run history in the lake\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    append_randomly(store, random.Random(43), runs=3, appends=6)
    assert run(cli, "events", "export").exit_code == 0

    answers = [run(cli, *argv) for argv in _readme_commands(block, history.namespace)]

    assert len(answers) == 2
    assert all(answer.exit_code == 0 for answer in answers), [answer.output for answer in answers]


def _readme_commands(block: str, namespace: str) -> list[list[str]]:
    """Each `runstate ...` command of a README code block, as argv, on the test's namespace."""
    words = shlex.split(block.replace("runstate.", f"{namespace}."))
    commands: list[list[str]] = []
    for word in words:
        if word == "runstate":
            commands.append([])
        else:
            commands[-1].append(word)
    return commands


def _archivable_runs(store) -> None:
    """Two runs finished long ago (their events at the fixtures' T0, in 2026's first days)."""
    for run_id in ("old-a", "old-b"):
        store.append_batch(
            run_id,
            [
                ev(run_id, EventType.RUN_STARTED, data={"by": run_id}),
                ev(run_id, EventType.STEP_STARTED, 1, step_id="extract"),
                ev(run_id, EventType.STEP_COMPLETED, 2, step_id="extract", data={"rows": 7}),
                ev(run_id, EventType.RUN_COMPLETED, 60),
            ],
        )


@pytest.mark.parametrize("target", ["postgres", "lake"])
def test_archive_then_show_project_resume_then_restore_through_the_cli(
    spark, cli, store, history, monkeypatch, target
):
    monkeypatch.setenv("RUNSTATE_ARCHIVE_TO", target)
    settings.cache_clear()
    _archivable_runs(store)
    exported = run(cli, "events", "export")
    exported_to_the_end(spark, store, history)  # the feed of the worker's database may have held back
    shown = run(cli, "events", "show", "old-a", "--json")
    projected = run(cli, "events", "project", "old-a")

    archived = run(cli, "events", "archive", "--older-than-days", "30")
    kept = _rows_of(store, "old-a")
    shown_archived = run(cli, "events", "show", "old-a", "--json")
    projected_archived = run(cli, "events", "project", "old-a")
    resumed = run(cli, "events", "resume", "old-a")
    restored = run(cli, "events", "restore", "old-a")
    again = run(cli, "events", "restore", "old-a")
    shown_restored = run(cli, "events", "show", "old-a", "--json")

    where = " to the lake" if target == "lake" else ""
    assert exported.exit_code == 0, exported.output
    assert archived.exit_code == 0 and archived.output.startswith(f"archived 8 event(s){where} of runs"), (
        archived.output
    )
    assert len(shown.output.splitlines()) == 4
    assert shown_archived.output == shown.output and shown_restored.output == shown.output
    assert projected_archived.output == projected.output and '"status": "COMPLETED"' in projected.output
    assert "4 event(s) to replay" in resumed.output and "status COMPLETED" in resumed.output, resumed.output
    assert restored.output.strip() == "run 'old-a': restored 4 event(s)"
    assert again.output.strip() == "run 'old-a': nothing archived"
    # (run_events, run_events_archive): the lake's runs leave Postgres; all come back to run_events
    assert kept == ((0, 0) if target == "lake" else (0, 4))
    assert _rows_of(store, "old-a") == (4, 0)


def _rows_of(store, run_id: str) -> tuple[int, int]:
    with store.datastore.connection() as conn:
        return conn.execute(
            "SELECT (SELECT count(*) FROM run_events WHERE run_id = %(r)s),"
            " (SELECT count(*) FROM run_events_archive WHERE run_id = %(r)s)",
            {"r": run_id},
        ).fetchone()


def test_archive_to_the_lake_from_a_snowflake_store_is_refused(cli, sf_store, snowflake_schema, monkeypatch):
    conn_kwargs, schema = snowflake_schema
    for key in ("account", "user", "password", "database", "host", "port", "protocol", "network_timeout"):
        monkeypatch.setenv(f"SNOWFLAKE_{key.upper()}", str(conn_kwargs[key]))
    monkeypatch.setenv("SNOWFLAKE_SCHEMA", schema)
    monkeypatch.setenv("RUNSTATE_EVENTSTORE", "snowflake")
    monkeypatch.setenv("RUNSTATE_ARCHIVE_TO", "lake")
    settings.cache_clear()

    answer = run(cli, "events", "archive")

    assert answer.exit_code == 1
    [line] = answer.output.strip().splitlines()
    assert line.startswith(
        "Error: RUNSTATE_ARCHIVE_TO=lake: the snowflake event store cannot archive to the lake"
    )
