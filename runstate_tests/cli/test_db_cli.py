"""Only `runstate db upgrade` (and `services up`) migrate: every other verb checks the schema and says
to upgrade when it is behind, and a migration in progress never blocks it."""

from __future__ import annotations

import psycopg
import pytest
from click.testing import CliRunner, Result

from runstate import migrations
from runstate.cli import main
from runstate.config import settings
from runstate.datastore import PostgresDatastore, SnowflakeDatastore


@pytest.fixture
def cli_env(fresh_database: str, monkeypatch: pytest.MonkeyPatch) -> str:
    for key, value in {"RUNSTATE_PG_URL": fresh_database, "RUNSTATE_SCHEMA": "behind"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("RUNSTATE_EVENTSTORE", "postgres")
    settings.cache_clear()
    yield fresh_database
    settings.cache_clear()


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _schemas(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [row[0] for row in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname = 'behind'")]


@pytest.mark.parametrize(
    "verb",
    [
        ("events", "append", "--run-id", "r1", "--type", "RunStarted"),
        ("events", "show", "r1"),
        ("maintenance", "status"),
    ],
)
def test_a_verb_on_a_schema_never_upgraded_says_to_run_db_upgrade_and_creates_nothing(cli_env, verb):
    result = run(*verb)

    assert result.exit_code == 1, result.output
    assert "tables are not set up; run `runstate db upgrade`" in result.output
    assert _schemas(cli_env) == []


def test_a_verb_on_a_schema_behind_names_the_missing_migration(cli_env):
    run("db", "upgrade", "--skip-aws")
    with psycopg.connect(cli_env) as conn:
        conn.execute("DELETE FROM behind.eventstore_migrations WHERE version = '004'")

    result = run("events", "append", "--run-id", "r1", "--type", "RunStarted")

    assert result.exit_code == 1
    assert "eventstore migration(s) 004_run_restore not applied; run `runstate db upgrade`" in result.output


def test_an_append_does_not_wait_for_a_migration_in_progress(cli_env):
    run("db", "upgrade", "--skip-aws")
    store = PostgresDatastore(cli_env, schema="behind")
    # Another process upgrading holds the schema's migration lock for as long as it runs.
    with psycopg.connect(cli_env) as upgrading, upgrading.transaction():
        upgrading.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key("behind"),))

        result = run("events", "append", "--run-id", "r1", "--type", "RunStarted")
        again = run("db", "upgrade", "--skip-aws")  # nothing pending: no lock needed either

    store.close()
    assert result.exit_code == 0 and "seq      1" in result.output, result.output
    assert again.exit_code == 0 and again.output.count("applied 0 migration(s)") == 2


def _lock_key(schema: str) -> int:
    from runstate.migrations.postgres import _lock_key

    return _lock_key(schema)


def test_snowflake_appends_never_touch_the_migration_lock(cli_env, snowflake_settings):
    kwargs, schema = snowflake_settings
    store = SnowflakeDatastore(kwargs, schema=schema, pool_size=1)
    migrations.upgrade(store, "eventstore")
    with store.cursor() as cur:  # an upgrade in progress holds the lock table
        cur.execute(f"CREATE TABLE {schema}.{migrations.SNOWFLAKE_LOCK_TABLE} (TAKEN_AT TIMESTAMP_TZ)")

    results = [run("events", "append", "--run-id", f"r{i}", "--type", "RunStarted") for i in range(3)]

    store.close()
    assert [r.exit_code for r in results] == [0, 0, 0], [r.output for r in results]
