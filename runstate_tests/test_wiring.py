"""runstate.wiring: every core object from its domain's config (parsed once from the Settings), with one
rule per setting and no dagster."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from runstate import wiring
from runstate.config import Settings
from runstate.datastore import PostgresDatastore, SnowflakeDatastore
from runstate.eventstore import EventStoreError, PostgresEventStore
from runstate.eventstore.config import SNOWFLAKE_LOGIN_TIMEOUT_S, EventStoreConfig
from runstate.eventstore.lake import HistoryConfig
from runstate.maintenance.config import MaintenanceConfig
from runstate.spark import SparkSettings
from runstate.wal.config import WalConfig

FAKESNOW = {
    "SNOWFLAKE_ACCOUNT": "acct",
    "SNOWFLAKE_USER": "me",
    # Long enough not to turn up by chance in a temporary folder's name of the repr below ("pw" did).
    "SNOWFLAKE_PASSWORD": "Sn0wfl4ke-Pa55word",
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
    config = EventStoreConfig.from_settings(_settings(**FAKESNOW))
    kwargs = config.snowflake.connect_kwargs()

    assert (
        kwargs["port"] == 8123
        and kwargs["account"] == "acct"
        and kwargs["password"] == FAKESNOW["SNOWFLAKE_PASSWORD"]
    )
    assert kwargs["network_timeout"] == 1  # a local emulator's HTTP 500 must not be retried for ever
    assert kwargs["login_timeout"] == SNOWFLAKE_LOGIN_TIMEOUT_S
    assert "schema" not in kwargs and config.snowflake_schema == "EVENTS"
    assert FAKESNOW["SNOWFLAKE_PASSWORD"] not in repr(config)  # a config may be logged; its secrets are not


def test_without_an_account_there_is_no_snowflake_datastore():
    config = EventStoreConfig.from_settings(_settings())

    assert config.snowflake is None
    assert wiring.snowflake_datastore(config) is None


def test_datastores_and_stores_follow_the_config_and_connect_lazily():
    config = EventStoreConfig.from_settings(_settings(**FAKESNOW))

    pg, sf = wiring.postgres_datastore(config), wiring.snowflake_datastore(config)
    store = wiring.event_store(config)

    assert isinstance(pg, PostgresDatastore) and (pg.dsn, pg.schema) == (config.pg_url, "s1")
    assert isinstance(sf, SnowflakeDatastore) and sf.schema == "EVENTS"
    assert isinstance(store, PostgresEventStore) and store.schema == "s1"
    assert sf.connect_kwargs == config.snowflake.connect_kwargs()
    store.close()


def test_the_snowflake_event_store_without_an_account_is_a_clear_error():
    with pytest.raises(EventStoreError, match="needs SNOWFLAKE_ACCOUNT"):
        wiring.event_store(EventStoreConfig.from_settings(_settings()), "snowflake")


def test_the_default_settings_give_each_domain_its_config_s_defaults():
    """Each default is written once: a setting's in Settings, and each config's default is the setting's."""
    defaults = Settings(dagster_pg_url="unused", warehouse_dir=Path("unused"))

    # The lake's warehouse is RUNSTATE_WAREHOUSE, a derived setting (no default in Settings), as Spark's is.
    assert (
        dataclasses.replace(EventStoreConfig.from_settings(defaults), lake_warehouse=None)
        == EventStoreConfig()
    )
    assert WalConfig.from_settings(defaults) == WalConfig()
    assert MaintenanceConfig.from_settings(defaults) == MaintenanceConfig()
    assert HistoryConfig.from_settings(defaults) == HistoryConfig()
    spark = SparkSettings.from_settings(defaults)
    assert (spark.master, spark.catalog_kind) == (SparkSettings().master, SparkSettings().catalog_kind)


def test_building_the_core_objects_imports_no_dagster():
    code = (
        "import sys\n"
        "from runstate import wiring\n"
        "from runstate.config import Settings\n"
        "s = Settings.from_env({'RUNSTATE_AWS_ENDPOINT_URL': 'http://127.0.0.1:1'})\n"
        "from runstate.eventstore.config import EventStoreConfig\n"
        "from runstate.maintenance.config import MaintenanceConfig\n"
        "from runstate.wal.config import WalConfig\n"
        "events, wal = EventStoreConfig.from_settings(s), WalConfig.from_settings(s)\n"
        "wiring.event_store(events).close(); wiring.maintenance_store(MaintenanceConfig.from_settings(s)).close()\n"
        "wiring.wal_table(wal); wiring.blob_store(wal); wiring.postgres_datastore(events).close()\n"
        "import runstate.spark, runstate.spark_interrupts\n"
        "assert not [m for m in sys.modules if m == 'dagster' or m.startswith('dagster.')], 'dagster'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)

    assert result.returncode == 0, result.stderr[-2000:]
