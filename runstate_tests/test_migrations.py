"""Versioned migrations: each file applied once, re-runnable, serialised across processes, `db status`."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from runstate import migrations
from runstate.cli import main as runstate_main
from runstate.config import settings

# A migration that fails when applied twice (duplicate primary key), so a lost race shows.
COUNTED_MIGRATIONS = {
    "001_counter.sql": "CREATE TABLE counter (id INT PRIMARY KEY);\n",
    "002_count_once.sql": "INSERT INTO counter (id) VALUES (1);\n",
}


@pytest.fixture
def counted_sql_root(tmp_path: Path) -> Path:
    folder = tmp_path / "sql" / "postgres"
    folder.mkdir(parents=True)
    for name, text in COUNTED_MIGRATIONS.items():
        (folder / name).write_text(text)
    return tmp_path / "sql"


def _upgrade_in_process(dsn: str, schema: str, sql_root: str | None, barrier, results) -> None:
    """Runs in a child process: wait for the other one, then upgrade at the same moment."""
    if sql_root:
        migrations.SQL_ROOT = Path(sql_root)
    barrier.wait(timeout=300)  # spawned interpreters start slowly on a loaded machine
    try:
        applied = migrations.upgrade_postgres(dsn, schema)
        results.put(("ok", [m.version for m in applied]))
    except Exception as exc:  # report it to the parent, which fails the test with it
        results.put(("error", repr(exc)))


def _race(dsn: str, schema: str, sql_root: Path | None, processes: int = 2) -> list[tuple[str, object]]:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(processes)
    results = context.Queue()
    workers = [
        context.Process(
            target=_upgrade_in_process,
            args=(dsn, schema, str(sql_root) if sql_root else None, barrier, results),
        )
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join(timeout=300)
        assert worker.exitcode == 0
    return outcomes


def _recorded_versions(dsn: str, schema: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f'SELECT version FROM "{schema}".schema_migrations ORDER BY version').fetchall()
    return [row[0] for row in rows]


def test_upgrade_applies_every_file_once_and_a_second_run_does_nothing(fresh_database):
    every = [m.version for m in migrations.discover("postgres")]

    first = migrations.upgrade_postgres(fresh_database, "runstate")
    second = migrations.upgrade_postgres(fresh_database, "runstate")

    assert [m.version for m in first] == every
    assert second == []
    assert _recorded_versions(fresh_database, "runstate") == every


def test_two_processes_upgrading_at_once_apply_each_file_exactly_once(fresh_database, counted_sql_root):
    for round_number in range(3):  # several rounds: one lucky interleaving proves little
        schema = f"race_{round_number}"

        outcomes = _race(fresh_database, schema, counted_sql_root)

        assert all(kind == "ok" for kind, _ in outcomes), outcomes
        assert sorted(v for _, applied in outcomes for v in applied) == ["001", "002"]
        with psycopg.connect(fresh_database) as conn:
            assert conn.execute(f"SELECT count(*) FROM {schema}.counter").fetchone()[0] == 1
        assert _recorded_versions(fresh_database, schema) == ["001", "002"]


def test_the_real_migrations_survive_two_concurrent_processes(fresh_database):
    outcomes = _race(fresh_database, "runstate", None)

    assert all(kind == "ok" for kind, _ in outcomes), outcomes
    every = [m.version for m in migrations.discover("postgres")]
    assert sorted(v for _, applied in outcomes for v in applied) == every
    assert _recorded_versions(fresh_database, "runstate") == every


def test_a_migration_edited_after_it_was_applied_is_refused(fresh_database, counted_sql_root, monkeypatch):
    monkeypatch.setattr(migrations, "SQL_ROOT", counted_sql_root)
    migrations.upgrade_postgres(fresh_database, "edited")
    (counted_sql_root / "postgres" / "002_count_once.sql").write_text(
        "INSERT INTO counter (id) VALUES (2);\n"
    )

    with pytest.raises(migrations.MigrationError, match="002_count_once.sql was edited after it was applied"):
        migrations.upgrade_postgres(fresh_database, "edited")

    with psycopg.connect(fresh_database) as conn:
        assert conn.execute("SELECT array_agg(id) FROM edited.counter").fetchone()[0] == [1]


def test_a_badly_named_migration_file_is_refused(tmp_path, monkeypatch):
    (tmp_path / "postgres").mkdir()
    (tmp_path / "postgres" / "1_Oops.sql").write_text("SELECT 1;\n")
    monkeypatch.setattr(migrations, "SQL_ROOT", tmp_path)

    with pytest.raises(
        migrations.MigrationError, match="1_Oops.sql: migration files are named NNN_snake_name.sql"
    ):
        migrations.discover("postgres")


@pytest.mark.parametrize("schema", ["bad;name", "drop table x", "a.b", "", 'q"uote'])
def test_an_unsafe_schema_name_is_refused_before_any_sql(fresh_database, schema):
    with pytest.raises(ValueError, match="schema name"):
        migrations.upgrade_postgres(fresh_database, schema)

    with psycopg.connect(fresh_database) as conn:
        created = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname NOT LIKE 'pg_%%'"
            " AND nspname <> 'information_schema'"
            " AND nspname <> 'public'"
        ).fetchone()[0]
    assert created == 0


@pytest.fixture
def cli_env(fresh_database, monkeypatch):
    """The CLI's Settings are read once per process: point them at the test database and re-read."""
    monkeypatch.setenv("RUNSTATE_PG_URL", fresh_database)
    monkeypatch.setenv("RUNSTATE_SCHEMA", "clitest")
    settings.cache_clear()
    yield fresh_database
    settings.cache_clear()


def test_db_status_lists_pending_then_applied(cli_env):
    runner = CliRunner()
    every = migrations.discover("postgres")

    before = runner.invoke(runstate_main, ["db", "status"])
    upgrade = runner.invoke(runstate_main, ["db", "upgrade", "--skip-aws"])
    after = runner.invoke(runstate_main, ["db", "status"])

    assert before.exit_code == 0 and upgrade.exit_code == 0 and after.exit_code == 0, upgrade.output
    assert before.output.count("PENDING") == len(every)
    assert f"postgres clitest: applied {len(every)} migration(s)" in upgrade.output
    assert after.output.count("applied") == len(every) and "PENDING" not in after.output
    for migration in every:
        assert f"{migration.version}_{migration.name}" in after.output


def _snowflake_connection(kwargs: dict):
    import snowflake.connector

    return snowflake.connector.connect(**kwargs)


def test_concurrent_snowflake_upgrades_apply_each_file_once(snowflake_schema):
    from concurrent.futures import ThreadPoolExecutor

    kwargs, schema = snowflake_schema
    barrier = threading.Barrier(4)

    def upgrade() -> int:
        conn = _snowflake_connection(kwargs)
        barrier.wait()
        try:
            return len(migrations.upgrade_snowflake(conn, schema))
        finally:
            conn.close()

    with ThreadPoolExecutor(4) as pool:
        applied = list(pool.map(lambda _: upgrade(), range(4)))

    assert sorted(applied) == [0, 0, 0, len(migrations.discover("snowflake"))]
    statuses = migrations.status_snowflake(_snowflake_connection(kwargs), schema)
    assert all(row.applied for row in statuses)


def test_a_held_snowflake_lock_gives_a_clear_error(snowflake_schema):
    kwargs, schema = snowflake_schema
    conn = _snowflake_connection(kwargs)
    conn.cursor().execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    conn.cursor().execute(f"CREATE TABLE {schema}.{migrations.SNOWFLAKE_LOCK_TABLE} (TAKEN_AT TIMESTAMP_TZ)")

    with pytest.raises(migrations.MigrationError, match="lock is held.*DROP TABLE"):
        migrations.upgrade_snowflake(conn, schema, lock_timeout_s=1)


def _db_status_in_a_shell(**env: str) -> subprocess.CompletedProcess:
    """`runstate db status` as a user runs it: its own process, so a traceback would show on stderr."""
    runstate = str(Path(sys.executable).parent / "runstate")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SNOWFLAKE_")}
    return subprocess.run(
        [runstate, "db", "status"], env={**clean, **env}, capture_output=True, text=True, timeout=300
    )


def _one_error_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("Error: "), result.stderr[
        -2000:
    ]
    return lines[0]


def test_db_status_with_an_unreachable_snowflake_says_so_in_one_line(fresh_database):
    result = _db_status_in_a_shell(
        RUNSTATE_PG_URL=fresh_database,
        RUNSTATE_EVENTSTORE="snowflake",
        SNOWFLAKE_ACCOUNT="fakesnow",
        SNOWFLAKE_USER="fake",
        SNOWFLAKE_PASSWORD="snow",
        SNOWFLAKE_HOST="127.0.0.1",
        SNOWFLAKE_PORT="1",
        SNOWFLAKE_PROTOCOL="http",
    )

    assert "snowflake 127.0.0.1:1: cannot connect" in _one_error_line(result)


def test_db_status_with_an_unreachable_postgres_says_so_in_one_line():
    result = _db_status_in_a_shell(RUNSTATE_PG_URL="postgresql://postgres:secret@127.0.0.1:1/runstate")

    line = _one_error_line(result)
    assert "postgres postgresql://postgres:***@127.0.0.1:1/runstate" in line and "secret" not in line


def test_db_status_with_an_unsafe_schema_says_so_in_one_line(fresh_database):
    result = _db_status_in_a_shell(RUNSTATE_PG_URL=fresh_database, RUNSTATE_SCHEMA="x;drop")

    assert "schema name 'x;drop' must match" in _one_error_line(result)
