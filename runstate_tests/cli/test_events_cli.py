"""`runstate events ...` through click's CliRunner against a real Postgres schema (and fakesnow for
migrate)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from runstate.cli import main
from runstate.cli.events_io import MAX_FILE_EVENTS
from runstate.config import settings
from runstate.eventstore import NewEvent, PostgresEventStore


def point_the_cli_at(monkeypatch: pytest.MonkeyPatch, pg_url: str, schema: str) -> Iterator[dict[str, str]]:
    """settings() is cached, so it is cleared around the test."""
    env = {"RUNSTATE_PG_URL": pg_url, "RUNSTATE_SCHEMA": schema, "RUNSTATE_EVENTSTORE": "postgres"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings.cache_clear()
    yield env
    settings.cache_clear()


@pytest.fixture
def cli_env(pg_database: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The CLI on the test's schema in the worker's database."""
    yield from point_the_cli_at(monkeypatch, pg_database, pg_schema)


@pytest.fixture
def own_database_env(migrated_database: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The CLI on a database of the test's own: the feed stops below the oldest transaction still open in
    its database, and the worker's shared one may hold a stray transaction of an earlier test."""
    yield from point_the_cli_at(monkeypatch, migrated_database, "runstate")


@pytest.fixture
def store(cli_env):
    with PostgresEventStore(cli_env["RUNSTATE_PG_URL"], schema=cli_env["RUNSTATE_SCHEMA"]) as store:
        store.ensure_schema()
        yield store


def run(*args: str) -> Result:
    return CliRunner().invoke(main, ["events", *args])


def test_append_then_show_prints_a_table(store):
    appended = run("append", "--run-id", "r1", "--type", "RunStarted")
    stepped = run(
        "append", "--run-id", "r1", "--type", "StepStarted", "--step", "load", "--data", '{"rows": 3}'
    )

    shown = run("show", "r1")

    assert appended.exit_code == 0 and "seq      1" in appended.output
    assert stepped.exit_code == 0 and "seq      2" in stepped.output
    lines = shown.output.splitlines()
    assert lines[0].split() == ["SEQ", "TYPE", "STEP", "EMITTED_AT", "DATA"]
    assert lines[2].split()[:3] == ["2", "StepStarted", "load"] and '{"rows":3}' in lines[2]


def test_append_a_jsonl_file_as_one_batch_and_duplicates_are_reported(store, tmp_path: Path):
    jsonl = tmp_path / "events.jsonl"
    jsonl.write_text(
        "\n".join(
            json.dumps(doc)
            for doc in (
                {"event_type": "RunStarted", "emitted_at": "2026-01-02T03:04:05+00:00"},
                {"event_type": "StepStarted", "step_id": "a"},
                {"run_id": "other", "event_type": "RunStarted"},
            )
        )
    )

    first = run("append", "--run-id", "r2", "--file", str(jsonl))
    again = run("append", "--run-id", "r2", "--file", str(jsonl))

    assert first.exit_code == 0, first.output
    assert first.output.count("appended") == 3
    assert again.output.count("duplicate") == 3
    assert [e.run_seq for e in store.fetch("r2")] == [1, 2]
    assert store.fetch("r2")[0].emitted_at == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert len(store.fetch("other")) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--run-id", "bad", "--type", ""], "event_type"),
        (["--run-id", "bad", "--type", "StepStarted", "--emitted-at", "2026-01-01T00:00:00"], "emitted_at"),
        (["--run-id", "bad", "--type", "StepStarted", "--emitted-at", "soon"], "emitted_at"),
        (["--run-id", "x" * 257, "--type", "RunStarted"], "run_id"),
        (["--run-id", "bad", "--type", "StepStarted", "--data", "{not json"], "--data is not JSON"),
        (["--run-id", "bad", "--step", "a"], "--type"),
        ([], "nothing to append"),
    ],
)
def test_bad_input_exits_non_zero_without_traceback_and_writes_nothing(store, args, message):
    result = run("append", *args)

    assert result.exit_code != 0
    assert message in result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)  # a click error, not an escaped exception
    assert store.run_ids() == []


def test_a_bad_line_in_a_jsonl_file_rejects_the_whole_file(store, tmp_path: Path):
    jsonl = tmp_path / "events.jsonl"
    jsonl.write_text('{"event_type": "RunStarted"}\n{"event_type": "StepStarted", "colour": "red"}\n')

    result = run("append", "--run-id", "r3", "--file", str(jsonl))

    assert result.exit_code != 0
    assert "events.jsonl:2: unknown field(s) colour" in result.output
    assert store.fetch("r3") == []


def test_project_prints_the_snapshot_and_resume_the_replay_point(store):
    at = datetime.now(UTC)
    store.append_batch(
        "r4",
        [
            NewEvent("r4", "RunStarted", at),
            NewEvent("r4", "StepStarted", at, step_id="s"),
            NewEvent("r4", "StepCompleted", at, step_id="s"),
        ],
    )

    projected = run("project", "r4")
    resumed = run("resume", "r4")

    assert projected.exit_code == 0, projected.output
    doc = json.loads(projected.output)
    assert doc["status"] == "RUNNING" and doc["steps"]["s"]["status"] == "SUCCESS" and doc["version"] == 1
    assert resumed.exit_code == 0, resumed.output
    assert "snapshot at seq 0" in resumed.output and "3 event(s) to replay" in resumed.output


def test_archive_moves_completed_runs(store):
    old = datetime.now(UTC) - timedelta(days=10)
    store.append_batch("done", [NewEvent("done", "RunStarted", old), NewEvent("done", "RunCompleted", old)])
    store.append_batch("live", [NewEvent("live", "RunStarted", old)])

    result = run("archive", "--older-than-days", "5")
    negative = run("archive", "--older-than-days", "-1")

    assert result.exit_code == 0 and "archived 2 event(s)" in result.output
    assert len(store.fetch("done")) == 2 and len(store.fetch("live")) == 1  # archived runs stay readable
    assert negative.exit_code != 0


def test_restore_moves_an_archived_run_back(store):
    old = datetime.now(UTC) - timedelta(days=100)
    store.append_batch("done", [NewEvent("done", "RunStarted", old), NewEvent("done", "RunCompleted", old)])
    archived = run("archive")  # the default age: 90 days

    restored = run("restore", "done")
    again = run("restore", "done")

    assert "archived 2 event(s)" in archived.output and "90 day(s)" in archived.output
    assert restored.exit_code == 0 and "restored 2 event(s)" in restored.output
    assert "nothing archived" in again.output


def test_tail_prints_the_feed_across_runs(own_database_env: dict[str, str]):
    with PostgresEventStore(own_database_env["RUNSTATE_PG_URL"], schema="runstate") as store:
        store.ensure_schema()
        store.append(NewEvent("t1", "RunStarted", datetime.now(UTC)))
        store.append(NewEvent("t2", "RunStarted", datetime.now(UTC)))

    result = run("tail")
    after = run("tail", "--after", str(json.loads(result.output.splitlines()[0])["position"]))

    assert result.exit_code == 0, result.output
    assert [json.loads(line)["run_id"] for line in result.output.splitlines()] == ["t1", "t2"]
    assert [json.loads(line)["run_id"] for line in after.output.splitlines()] == ["t2"]


@pytest.mark.parametrize("value", ["nan", "inf", "0"])
def test_tail_follow_refuses_a_poll_interval_that_is_not_a_number_of_seconds(store, value):
    result = run("tail", "--follow", "--poll-seconds", value)

    assert result.exit_code == 2 and "--poll-seconds" in result.output, result.output


def test_restore_of_a_run_never_archived_keeps_it_archivable(store):
    old = datetime.now(UTC) - timedelta(days=100)
    store.append_batch("done", [NewEvent("done", "RunStarted", old), NewEvent("done", "RunCompleted", old)])

    restored = run("restore", "done")
    archived = run("archive")

    assert restored.exit_code == 0 and "nothing archived" in restored.output
    assert "archived 2 event(s)" in archived.output, archived.output


def test_a_jsonl_file_with_a_bad_later_run_writes_nothing(store, tmp_path: Path):
    """Issue 15 #1: runs earlier in the file were committed before a later run's bad event."""
    jsonl = tmp_path / "m.jsonl"
    jsonl.write_text(
        "\n".join(
            [
                '{"run_id":"f1","event_type":"A"}',
                '{"run_id":"f1","event_type":"B"}',
                '{"run_id":"f2","event_type":"C","emitted_at":"2026-01-01T00:00:00"}',
            ]
        )
    )

    result = run("append", "--file", str(jsonl))

    assert result.exit_code == 1
    assert "emitted_at" in result.output and "nothing written" in result.output
    assert store.run_ids() == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data", "[" * 5000 + "]" * 5000], "nested more than"),
        (["--data", "[" * 200 + "]" * 200], "nested more than"),
        (["--emitted-at", "0001-01-01T00:00:00+01:00"], "storable range"),
        (["--emitted-at", "9999-12-31T23:59:59-01:00"], "storable range"),
    ],
)
def test_hostile_values_get_one_line_and_write_nothing(store, args, message):
    result = run("append", "--run-id", "h", "--type", "X", *args)

    assert result.exit_code == 1 and message in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert store.run_ids() == []


def test_a_file_of_more_events_than_a_file_holds_is_refused_before_anything_is_written(store, tmp_path: Path):
    """Issue 42.13: 300,000 events (29 MB) peaked at 777 MB; the batch limit let a file hold 1,048,575."""
    jsonl = tmp_path / "big.jsonl"
    line = '{"event_type": "StepCompleted", "data": {"rows": 1}}\n'
    jsonl.write_text(line * (MAX_FILE_EVENTS + 1))

    result = run("append", "--run-id", "big", "--file", str(jsonl))

    assert result.exit_code == 1
    assert result.output.strip() == (
        f"Error: {jsonl}: a file holds at most {MAX_FILE_EVENTS:,} events (each run's are appended in one "
        "transaction, from memory): split it; nothing written"
    )
    assert store.run_ids() == []


TOO_BIG = "99999999999999999999"  # past bigint: a missing SQL function and "bigint out of range" before


@pytest.mark.parametrize(
    "args",
    [
        ["append", "--run-id", "r", "--type", "X", "--expected-last-seq", TOO_BIG],
        ["append", "--run-id", "r", "--type", "X", "--expected-last-seq", str(1 << 63)],
        ["tail", "--limit", TOO_BIG],
        ["tail", "--after", TOO_BIG],
        ["show", "r", "--limit", TOO_BIG],
        ["show", "r", "--limit", "-5"],
        ["show", "r", "--after", TOO_BIG],
        ["show", "r", "--after", "-5"],
        ["archive", "--older-than-days", TOO_BIG],
        ["migrate", "--batch-size", TOO_BIG],
    ],
    ids=" ".join,
)
def test_a_number_out_of_its_range_is_a_usage_error_and_writes_nothing(store, args):
    result = run(*args)
    option = next(arg for arg in args if arg.startswith("--") and arg not in ("--run-id", "--type"))

    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output and "Traceback" not in result.output
    assert store.run_ids() == []


def test_the_largest_seq_is_a_concurrency_conflict_not_a_driver_error(store):
    result = run("append", "--run-id", "r", "--type", "X", "--expected-last-seq", str((1 << 63) - 1))

    assert result.exit_code == 1
    assert (
        result.output.strip() == f"Error: run 'r': expected last seq {(1 << 63) - 1}, but the run is at seq 0"
    )
    assert store.run_ids() == []


def test_a_run_id_with_an_ansi_escape_is_refused_without_echoing_it(store):
    result = run("append", "--run-id", "evil\x1b[2J", "--type", "X")

    assert result.exit_code == 1 and "run_id" in result.output and "\x1b" not in result.output
    assert store.run_ids() == []


def test_project_all_reports_an_unreadable_run_and_projects_the_rest(store, cli_env):
    import psycopg

    for run_id in ("good", "poisoned"):
        store.append(NewEvent(run_id, "RunStarted", datetime.now(UTC)))
    with psycopg.connect(cli_env["RUNSTATE_PG_URL"], autocommit=True) as conn:
        conn.execute(
            f'UPDATE "{cli_env["RUNSTATE_SCHEMA"]}".run_events SET emitted_at = %s::timestamptz'
            " WHERE run_id = 'poisoned'",
            ("0001-01-01 00:00:00+01:00",),
        )

    result = run("project", "--all", "--no-progress")

    assert result.exit_code == 1
    assert json.loads(result.stdout)["runs_projected"] == 1 and json.loads(result.stdout)["runs_failed"] == 1
    assert "'poisoned': not projected" in result.stderr
    assert store.project("good").status == "RUNNING"


def test_migrate_copies_postgres_to_snowflake_with_a_progress_bar(store, snowflake_schema, monkeypatch):
    conn_kwargs, schema = snowflake_schema
    for key in ("account", "user", "password", "database", "host", "port", "protocol", "network_timeout"):
        monkeypatch.setenv(f"SNOWFLAKE_{key.upper()}", str(conn_kwargs[key]))
    monkeypatch.setenv("SNOWFLAKE_SCHEMA", schema)
    settings.cache_clear()
    at = datetime.now(UTC)
    for run_id in ("m1", "m2"):
        store.append_batch(
            run_id, [NewEvent(run_id, "RunStarted", at), NewEvent(run_id, "StepStarted", at, step_id="s")]
        )
    upgraded = CliRunner().invoke(main, ["db", "upgrade", "--skip-aws"])  # the target's schema too

    first = run("migrate", "--batch-size", "3")
    again = run("migrate", "--batch-size", "3")

    assert upgraded.exit_code == 0 and "snowflake" in upgraded.output, upgraded.output
    assert first.exit_code == 0, first.output
    assert "written 4" in first.output and "verified yes" in first.output
    assert "migrate" in first.stderr  # the tqdm bar
    assert again.exit_code == 0 and "written 0" in again.output and "verified yes" in again.output


def test_an_unknown_backend_setting_is_a_clear_error(cli_env, monkeypatch):
    monkeypatch.setenv("RUNSTATE_EVENTSTORE", "mysql")
    settings.cache_clear()

    result = run("show", "r1")

    assert result.exit_code != 0
    assert "RUNSTATE_EVENTSTORE must be one of" in result.output and "Traceback" not in result.output


def test_an_unreachable_database_is_a_clear_error(cli_env, monkeypatch):
    monkeypatch.setenv("RUNSTATE_PG_URL", "postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=2")
    settings.cache_clear()

    result = run("append", "--run-id", "r1", "--type", "RunStarted")

    assert result.exit_code == 1
    assert "127.0.0.1" in result.output and "Traceback" not in result.output


def test_project_all_backfills_every_stale_run_then_finds_nothing(store):
    for run_id in ("b1", "b2"):
        assert run("append", "--run-id", run_id, "--type", "RunStarted").exit_code == 0

    first = run("project", "--all", "--no-progress")
    second = run("project", "--all", "--no-progress")
    rebuilt = run("project", "--all", "--rebuild", "--no-progress")

    assert first.exit_code == 0, first.output
    assert json.loads(first.output)["runs_projected"] == 2
    assert json.loads(second.output)["runs_projected"] == 0
    assert json.loads(rebuilt.output) == {"events_applied": 2, "runs_changed": 0, "runs_projected": 2}


def test_project_needs_a_run_or_all(store):
    result = run("project")

    assert result.exit_code == 2 and "RUN_ID or --all" in result.output


@pytest.mark.parametrize("verb", [("archive",), ("restore", "r1"), ("show", "r1")])
def test_a_bad_archive_target_is_one_error_line_naming_the_variable(cli_env, monkeypatch, verb):
    monkeypatch.setenv("RUNSTATE_ARCHIVE_TO", "s3")
    settings.cache_clear()

    answer = run(*verb)

    assert answer.exit_code == 1
    assert answer.output.strip().splitlines() == [
        "Error: RUNSTATE_ARCHIVE_TO must be one of postgres, lake, got 's3'"
    ]
