"""runstate.wiring: every core object from the Settings, with one rule per setting and no dagster."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runstate import wiring
from runstate.config import Settings
from runstate.datastore import PostgresDatastore, SnowflakeDatastore
from runstate.eventstore import EventStoreError, PostgresEventStore

FAKESNOW = {
    "SNOWFLAKE_ACCOUNT": "acct",
    "SNOWFLAKE_USER": "me",
    "SNOWFLAKE_PASSWORD": "pw",
    "SNOWFLAKE_HOST": "127.0.0.1",
    "SNOWFLAKE_PORT": "8123",
    "SNOWFLAKE_PROTOCOL": "http",
    "SNOWFLAKE_SCHEMA": "events",
}


def _settings(**env: str) -> Settings:
    return Settings.from_env(
        {"RUNSTATE_PG_URL": "postgresql://u@127.0.0.1:1/db", "RUNSTATE_SCHEMA": "s1", **env}
    )


def test_snowflake_arguments_are_typed_and_bounded_from_the_settings():
    kwargs = wiring.snowflake_connect_kwargs(_settings(**FAKESNOW).snowflake)

    assert kwargs["port"] == 8123 and kwargs["account"] == "acct" and kwargs["password"] == "pw"
    assert kwargs["network_timeout"] == 1  # a local emulator's HTTP 500 must not be retried for ever
    assert kwargs["login_timeout"] == wiring.SNOWFLAKE_LOGIN_TIMEOUT_S
    assert "schema" not in kwargs and wiring.snowflake_schema(_settings(**FAKESNOW)) == "EVENTS"


def test_without_an_account_there_is_no_snowflake_datastore():
    s = _settings()

    assert wiring.snowflake_connect_kwargs(s.snowflake) is None
    assert wiring.snowflake_datastore(s) is None


def test_datastores_and_stores_follow_the_settings_and_connect_lazily():
    s = _settings(**FAKESNOW)

    pg, sf = wiring.postgres_datastore(s), wiring.snowflake_datastore(s)
    store = wiring.event_store(s)

    assert isinstance(pg, PostgresDatastore) and (pg.dsn, pg.schema) == (s.pg_url, "s1")
    assert isinstance(sf, SnowflakeDatastore) and sf.schema == "EVENTS"
    assert isinstance(store, PostgresEventStore) and store.schema == "s1"
    store.close()


def test_the_snowflake_event_store_without_an_account_is_a_clear_error():
    with pytest.raises(EventStoreError, match="needs SNOWFLAKE_ACCOUNT"):
        wiring.event_store(_settings(), "snowflake")


def test_building_the_core_objects_imports_no_dagster():
    code = (
        "import sys\n"
        "from runstate import wiring\n"
        "from runstate.config import Settings\n"
        "s = Settings.from_env({'RUNSTATE_AWS_ENDPOINT_URL': 'http://127.0.0.1:1'})\n"
        "wiring.event_store(s).close(); wiring.maintenance_store(s).close()\n"
        "wiring.wal_table(s); wiring.blob_store(s); wiring.postgres_datastore(s).close()\n"
        "assert not [m for m in sys.modules if m == 'dagster' or m.startswith('dagster.')], 'dagster'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)

    assert result.returncode == 0, result.stderr[-2000:]
