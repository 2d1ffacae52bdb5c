"""runstate.migrations: each file applied once per domain ledger, re-runnable, serialised across
processes, checked without migrating, and `db status` (test_legacy_ledger.py: older schemas)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from runstate import migrations, sqlfiles
from runstate.cli import main as runstate_main
from runstate.config import settings
from runstate.datastore import PostgresDatastore, SnowflakeDatastore
from runstate_tests.support.races import race_outcomes, racing_processes

# A migration that fails when applied twice (duplicate primary key), so a lost race shows.
COUNTED_MIGRATIONS = {
    "001_counter.sql": "CREATE TABLE counter (id INT PRIMARY KEY);\n",
    "002_count_once.sql": "INSERT INTO counter (id) VALUES (1);\n",
}


def _shipped(tmp_path: Path, monkeypatch, domain: str, files: dict[str, str]) -> Path:
    """A shipped-SQL root with one domain's files in place of the installed one; returns its folder."""
    folder = tmp_path / "sql" / "postgres" / domain
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    monkeypatch.setattr(sqlfiles, "root", lambda: tmp_path / "sql")
    return folder


@pytest.fixture
def counted_sql_root(tmp_path: Path, monkeypatch) -> Path:
    """A shipped-SQL root with one domain, `counted`, in place of the installed one."""
    _shipped(tmp_path, monkeypatch, "counted", COUNTED_MIGRATIONS)
    return tmp_path / "sql"


def _datastore(dsn: str, schema: str) -> PostgresDatastore:
    return PostgresDatastore(dsn, schema=schema)


def _upgrade(dsn: str, schema: str, domain: str) -> list[migrations.Migration]:
    store = _datastore(dsn, schema)
    try:
        return migrations.upgrade(store, domain)
    finally:
        store.close()


def _upgrade_in_process(dsn: str, schema: str, domain: str, sql_root: str | None, barrier, results) -> None:
    """Runs in a child process: wait for the other one, then upgrade at the same moment."""
    if sql_root:
        sqlfiles.root = lambda: Path(sql_root)
    barrier.wait(timeout=300)  # processes start slowly on a loaded machine
    try:
        applied = _upgrade(dsn, schema, domain)
        results.put(("ok", [m.version for m in applied]))
    except Exception as exc:  # report it to the parent, which fails the test with it
        results.put(("error", repr(exc)))


def _race(
    dsn: str, schema: str, domain: str, sql_root: Path | None, processes: int = 2
) -> list[tuple[str, object]]:
    context = racing_processes()
    barrier = context.Barrier(processes)
    results = context.Queue()
    workers = [
        context.Process(
            target=_upgrade_in_process,
            args=(dsn, schema, domain, str(sql_root) if sql_root else None, barrier, results),
        )
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    outcomes = race_outcomes(results, workers, len(workers))
    for worker in workers:
        worker.join(timeout=300)
        assert worker.exitcode == 0
    return outcomes


def _recorded(dsn: str, schema: str, table: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f'SELECT version FROM "{schema}".{table} ORDER BY version').fetchall()
    return [row[0] for row in rows]


def _tables(dsn: str, schema: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)).fetchall()
    return {row[0] for row in rows}


def test_upgrade_applies_every_file_once_and_a_second_run_does_nothing(fresh_database):
    every = [m.version for m in migrations.discover("postgres", "eventstore")]

    first = _upgrade(fresh_database, "runstate", "eventstore")
    second = _upgrade(fresh_database, "runstate", "eventstore")

    assert [m.version for m in first] == every
    assert second == []
    assert _recorded(fresh_database, "runstate", "eventstore_migrations") == every


def test_each_domain_creates_only_its_own_tables(fresh_database):
    _upgrade(fresh_database, "es_only", "eventstore")

    tables = _tables(fresh_database, "es_only")

    assert {"run_events", "run_streams", "eventstore_migrations"} <= tables
    assert not tables & {"jobs", "job_queue", "table_locks", "maintenance_migrations"}


def test_upgrade_all_migrates_every_domain_in_its_own_ledger(fresh_database):
    store = _datastore(fresh_database, "everything")
    try:
        applied = migrations.upgrade_all(store)
    finally:
        store.close()

    assert set(applied) == {"eventstore", "maintenance"}
    for domain, done in applied.items():
        shipped = [m.version for m in migrations.discover("postgres", domain)]
        assert [m.version for m in done] == shipped
        assert _recorded(fresh_database, "everything", f"{domain}_migrations") == shipped


def test_two_processes_upgrading_at_once_apply_each_file_exactly_once(fresh_database, counted_sql_root):
    for round_number in range(3):  # several rounds: one lucky interleaving proves little
        schema = f"race_{round_number}"

        outcomes = _race(fresh_database, schema, "counted", counted_sql_root)

        assert all(kind == "ok" for kind, _ in outcomes), outcomes
        assert sorted(v for _, applied in outcomes for v in applied) == ["001", "002"]
        with psycopg.connect(fresh_database) as conn:
            assert conn.execute(f"SELECT count(*) FROM {schema}.counter").fetchone()[0] == 1
        assert _recorded(fresh_database, schema, "counted_migrations") == ["001", "002"]


def test_the_real_migrations_survive_two_concurrent_processes(fresh_database):
    outcomes = _race(fresh_database, "runstate", "maintenance", None)

    assert all(kind == "ok" for kind, _ in outcomes), outcomes
    every = [m.version for m in migrations.discover("postgres", "maintenance")]
    assert sorted(v for _, applied in outcomes for v in applied) == every
    assert _recorded(fresh_database, "runstate", "maintenance_migrations") == every


def test_a_migration_edited_after_it_was_applied_is_refused(fresh_database, counted_sql_root):
    _upgrade(fresh_database, "edited", "counted")
    (counted_sql_root / "postgres" / "counted" / "002_count_once.sql").write_text(
        "INSERT INTO counter (id) VALUES (2);\n"
    )

    with pytest.raises(migrations.MigrationError, match="002_count_once.sql was edited after it was applied"):
        _upgrade(fresh_database, "edited", "counted")

    with psycopg.connect(fresh_database) as conn:
        assert conn.execute("SELECT array_agg(id) FROM edited.counter").fetchone()[0] == [1]


def test_a_badly_named_migration_file_is_refused(counted_sql_root):
    (counted_sql_root / "postgres" / "counted" / "1_Oops.sql").write_text("SELECT 1;\n")

    with pytest.raises(
        migrations.MigrationError, match="1_Oops.sql: migration files are named NNN_snake_name.sql"
    ):
        migrations.discover("postgres", "counted")


def test_a_query_file_beside_the_migrations_is_not_a_migration(counted_sql_root):
    (counted_sql_root / "postgres" / "counted" / "queries.sql").write_text("-- name: one\nSELECT 1;\n")

    assert [m.name for m in migrations.discover("postgres", "counted")] == ["counter", "count_once"]


def test_a_missing_migrations_folder_is_an_error_not_nothing_to_do(counted_sql_root, fresh_database):
    with pytest.raises(migrations.MigrationError, match="sql/postgres/nosuchdomain: no such folder"):
        _upgrade(fresh_database, "runstate", "nosuchdomain")


def test_sql_not_installed_at_all_is_an_error(monkeypatch, fresh_database):
    monkeypatch.setattr(sqlfiles, "PACKAGE", "runstate._no_such_sql")

    with pytest.raises(migrations.MigrationError, match="not installed"):
        _upgrade(fresh_database, "runstate", "eventstore")


@pytest.mark.parametrize("schema", ["bad;name", "drop table x", "a.b", "", 'q"uote'])
def test_an_unsafe_schema_name_is_refused_before_any_sql(fresh_database, schema):
    with pytest.raises(ValueError, match="schema name"):
        _upgrade(fresh_database, schema, "eventstore")

    with psycopg.connect(fresh_database) as conn:
        created = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname NOT LIKE 'pg_%%'"
            " AND nspname <> 'information_schema'"
            " AND nspname <> 'public'"
        ).fetchone()[0]
    assert created == 0


def test_require_current_passes_on_a_current_schema_and_names_what_is_missing(fresh_database):
    store = _datastore(fresh_database, "checked")
    try:
        with pytest.raises(migrations.SchemaNotCurrent, match="eventstore tables are not set up.*db upgrade"):
            migrations.require_current(store, "eventstore")
        migrations.upgrade(store, "eventstore")
        with psycopg.connect(fresh_database) as conn:
            conn.execute("DELETE FROM checked.eventstore_migrations WHERE version = '004'")

        with pytest.raises(migrations.SchemaNotCurrent, match="004_run_restore not applied.*db upgrade"):
            migrations.require_current(store, "eventstore")
        migrations.upgrade(store, "eventstore")
        migrations.require_current(store, "eventstore")
    finally:
        store.close()


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
    every = {d: migrations.discover("postgres", d) for d in migrations.domains("postgres")}
    count = sum(len(files) for files in every.values())

    before = runner.invoke(runstate_main, ["db", "status"])
    upgrade = runner.invoke(runstate_main, ["db", "upgrade", "--skip-aws"])
    after = runner.invoke(runstate_main, ["db", "status"])

    assert before.exit_code == 0 and upgrade.exit_code == 0 and after.exit_code == 0, upgrade.output
    assert before.output.count("PENDING") == count
    for domain, files in every.items():
        assert f"postgres clitest {domain}: applied {len(files)} migration(s)" in upgrade.output
    assert after.output.count("applied") == count and "PENDING" not in after.output
    for domain, files in every.items():
        for migration in files:
            assert f"{domain:<12} {migration.version}_{migration.name}" in after.output


def _snowflake_store(kwargs: dict, schema: str) -> SnowflakeDatastore:
    return SnowflakeDatastore(kwargs, schema=schema, pool_size=1)


def test_concurrent_snowflake_upgrades_apply_each_file_once(snowflake_schema):
    from concurrent.futures import ThreadPoolExecutor

    kwargs, schema = snowflake_schema
    barrier = threading.Barrier(4)

    def upgrade() -> int:
        store = _snowflake_store(kwargs, schema)
        barrier.wait()
        try:
            return len(migrations.upgrade(store, "eventstore"))
        finally:
            store.close()

    with ThreadPoolExecutor(4) as pool:
        applied = list(pool.map(lambda _: upgrade(), range(4)))

    assert sorted(applied) == [0, 0, 0, len(migrations.discover("snowflake", "eventstore"))]
    statuses = migrations.status(_snowflake_store(kwargs, schema), "eventstore")
    assert all(row.applied for row in statuses)


def test_a_held_snowflake_lock_gives_a_clear_error(snowflake_schema):
    import snowflake.connector

    kwargs, schema = snowflake_schema
    conn = snowflake.connector.connect(**kwargs)
    conn.cursor().execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    conn.cursor().execute(f"CREATE TABLE {schema}.{migrations.SNOWFLAKE_LOCK_TABLE} (TAKEN_AT TIMESTAMP_TZ)")

    with pytest.raises(migrations.MigrationError, match="lock is held.*DROP TABLE"):
        migrations.upgrade(_snowflake_store(kwargs, schema), "eventstore", lock_timeout_s=1)


def test_snowflake_require_current_says_to_upgrade_until_the_schema_is_upgraded(snowflake_schema):
    kwargs, schema = snowflake_schema
    store = _snowflake_store(kwargs, schema)
    try:
        with pytest.raises(migrations.SchemaNotCurrent, match="not set up; run `runstate db upgrade`"):
            migrations.require_current(store, "eventstore")
        migrations.upgrade(store, "eventstore")

        migrations.require_current(store, "eventstore")
    finally:
        store.close()


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


BATCHED_MIGRATIONS = {
    "001_rows.sql": "CREATE TABLE src (id INT PRIMARY KEY);\nINSERT INTO src SELECT generate_series(1, 25);\n",
    "002_move_rows.sql": (
        "CREATE TABLE IF NOT EXISTS dst (id INT PRIMARY KEY);\n"
        "-- migrate: repeat\n"
        "-- ten rows a batch\n"
        "WITH moved AS (DELETE FROM src WHERE id IN (SELECT id FROM src ORDER BY id LIMIT 10) RETURNING id),\n"
        "     kept AS (INSERT INTO dst SELECT id FROM moved RETURNING 1)\n"
        "SELECT count(*) FROM kept;\n"
        "-- migrate: finally\n"
        "DROP TABLE src;\n"
    ),
    "003_after.sql": "CREATE TABLE after_the_move (id INT);\n",
}


@pytest.fixture
def batched_sql_root(tmp_path: Path, monkeypatch) -> Path:
    return _shipped(tmp_path, monkeypatch, "batched", BATCHED_MIGRATIONS)


def test_a_batched_migration_commits_each_batch_then_records_itself(fresh_database, batched_sql_root):
    applied = _upgrade(fresh_database, "moving", "batched")

    assert [m.version for m in applied] == ["001", "002", "003"]
    assert _recorded(fresh_database, "moving", "batched_migrations") == ["001", "002", "003"]
    assert _tables(fresh_database, "moving") >= {"dst", "after_the_move"} and "src" not in _tables(
        fresh_database, "moving"
    )
    with psycopg.connect(fresh_database) as conn:
        # 10 + 10 + 5 rows, each batch committed by a transaction of its own.
        assert conn.execute("SELECT count(*), count(DISTINCT xmin::text) FROM moving.dst").fetchone() == (
            25,
            3,
        )


@pytest.mark.parametrize(
    "text",
    [
        "SELECT 1;\n-- migrate: finally\nSELECT 1;\n-- migrate: repeat\nSELECT 0;\n",
        "SELECT 1;\n-- migrate: repeat\n-- only a comment\n",
        "SELECT 1;\n-- migrate: repeat\nSELECT 0;\n-- migrate: finally\n",
    ],
)
def test_a_batched_migration_in_the_wrong_shape_is_refused_and_nothing_is_applied(
    fresh_database, batched_sql_root, text
):
    (batched_sql_root / "002_move_rows.sql").write_text(text)

    with pytest.raises(migrations.MigrationError, match="002_move_rows.sql: each `-- migrate: repeat`"):
        _upgrade(fresh_database, "moving", "batched")

    assert "src" not in _tables(fresh_database, "moving")
